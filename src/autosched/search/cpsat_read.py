"""Reading a CP-SAT solution: its choices (stages, offsets, groups, streams, the inline slot), then as a plan.

:func:`solution_values` reads the variables of :class:`autosched.search.cpsat_model.CpsatModel`;
:func:`plan_of` reads the solutions of the best period as plans, each with every group on a
worker and with each group that fits the main thread's window inline, and keeps the one the
simulator ranks best.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan

from autosched.search.cpsat_model import CpsatModel
from autosched.search.found import Scorer
from autosched.search.plans import build_plan
from autosched.search.problem import Problem

__all__ = ["solution_values", "plan_of"]

log = logging.getLogger(__name__)


def solution_values(mod: CpsatModel, value: Callable[[Any], int]) -> Dict[str, Any]:
    """A solution's choices (``value`` reads a variable: the solver's, or a solution callback's).

    Parameters
    ----------
    mod : CpsatModel
    value : callable
        ``variable -> value``.

    Returns
    -------
    dict
        ``stage``, ``offset``, ``group`` and ``stream`` per task, and the ``inline`` slot (or None).
    """
    names = list(mod.stage)
    stage = {t: int(value(mod.stage[t])) for t in names}
    offset = {t: int(value(mod.offset[t])) for t in names}
    group = {t: next(mod.slots[j] for j in range(len(mod.slots)) if value(mod.in_group[t, j])) for t in names}
    stream = {t: next(mod.streams[k] for (tt, k), v in mod.in_stream.items() if tt == t and value(v))
              for t in names}
    used = set(group.values())
    inline = next((mod.slots[j] for j, v in mod.inline.items() if value(v) and mod.slots[j] in used), None)
    return {"stage": stage, "offset": offset, "group": group, "stream": stream, "inline": inline}


def plan_of(problem: Problem, sols: Sequence[dict], ii: int,
            scorer: Optional[Scorer]) -> Tuple[PipelinePlan, dict, float, float]:
    """The best simulated reading of the solutions at ``ii``: ``(plan, its solution, its period, its latency)``.

    ``sols`` are the refined solution (fewest stages, shortest iteration in
    the model), the refinement's last solutions before it, and the solution
    it refined, in that order: the simulator keeps the refinement unless
    one found on the way runs faster (the model approximates what the
    simulator runs: on a tie the earlier in ``sols`` wins). Each solution is read with every group on a
    worker, and with any one group on the caller's thread whose tasks fit
    the main thread's window (the model's constraint, with the window at
    the first task's start): the solved inline slot is one of these. The
    scorer ranks the readings by period, then depth and latency, then a
    group inline (it starts no worker), the busiest (as a hand-written
    loop). The model's timetable is one that the simulator's tasks, each
    started as soon as it can, need not follow where they share a core
    pool or a lock, and on CUDA the model approximates the streams. When
    the simulator rejects the readings, the model's own reading is returned,
    unscored (``inf``).
    """
    def simulated(p: PipelinePlan) -> Tuple[float, float]:
        res = problem.simulate(p)
        return float(res.period_s), float(res.latency)

    def readings(sol: dict) -> List[Tuple[Any, PipelinePlan]]:
        def plan(inline: Any) -> PipelinePlan:
            return build_plan(problem, sol["stage"], sol["group"], sol["stream"], None, sol["offset"], inline=inline)

        if problem.caller_group is None or problem.forced_caller is not None:
            return [(sol["inline"], plan(sol["inline"]))]
        offset, group = sol["offset"], sol["group"]
        window = min(offset.values()) + ii - problem.period_units()
        frozen = {group[t] for t in problem.frozen_group}  # groups frozen under another name keep their worker
        fits = [g for g in sorted(set(group.values()), key=str) if g not in frozen
                and max(offset[t] + problem.dur(t) for t in group if group[t] == g) <= window]
        return [(g, plan(g)) for g in fits] + [(None, plan(None))]

    score = scorer or simulated
    u = problem.unit_s
    ranked = []
    try:
        seen = set()
        for k, sol in enumerate(sols):
            key = repr(sorted((t, sol["stage"][t], sol["offset"][t], str(sol["group"][t]), str(sol["stream"][t]))
                              for t in sol["stage"])) + repr(sol["inline"])
            if key in seen:
                continue
            seen.add(key)
            work = {g: sum(problem.dur(t) for t in sol["group"] if sol["group"][t] == g) for g in sol["group"].values()}
            for g, p in readings(sol):
                period, latency = score(p)
                rank = (round(period / u, 3), p.pipeline_depth, round(latency / u, 3), g is None, -work.get(g, 0),
                        g != sol["inline"], k)
                ranked.append((rank, p, sol, period, latency))
    except Exception as exc:  # noqa: BLE001 - costs the simulator cannot take: keep the model's reading
        log.debug("CP-SAT plan not simulated: %s", exc)
        sol = sols[0]
        return build_plan(problem, sol["stage"], sol["group"], sol["stream"], None, sol["offset"],
                          inline=sol["inline"]), sol, math.inf, math.inf
    _, plan, sol, period, latency = min(ranked, key=lambda r: r[0])
    return plan, sol, period, latency
