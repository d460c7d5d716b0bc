"""How the searchers score: a plan by the simulator, a candidate by its timetable then its simulation.

:func:`sim_scorer` scores a plan (simulated period and latency, the call's machine model);
:class:`Evaluator` turns a :class:`~autosched.search.found.Candidate` into a
:class:`~autosched.search.found.Scored` (the stages its modulo timetable derives and, once
simulated, its plan and figures): derives, simulates and caches (counting what was
tried); :func:`prune` keeps the best fire order per thread map, stream map and stages, ranked by
:func:`rank_key` (simulated candidates first, by period, depth, latency, worker threads).
"""

from __future__ import annotations

import logging
import math
from typing import Dict, List, Optional, Tuple

from swpipe_core.plan import PipelinePlan, ref_name, stream_name

from autosched.search.found import Candidate, Scored, Scorer
from autosched.search.modulo import derive_timetable, inline_label
from autosched.search.plans import build_plan
from autosched.search.problem import Problem

__all__ = ["Evaluator", "sim_scorer", "prune", "rank_key"]

log = logging.getLogger(__name__)


def sim_scorer(problem: Problem, num_iterations: int = 40) -> Scorer:
    """Score a plan by the simulator: ``(period_s, latency_s)`` (see :func:`autosched.model.simulate.simulate`).

    Parameters
    ----------
    problem : Problem
        Gives the cost model, the device and the per-period engine time (:meth:`Problem.simulate`).
    num_iterations : int
        Iterations simulated per plan (more while the run is not steady).

    Returns
    -------
    callable
        ``plan -> (period, latency)``.

    Examples
    --------
    >>> from swpipe import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> from swpipe import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2), time_unit_s=1e-3)
    >>> from autosched.search.plans import build_plan   # the searchers' plan builder, not public
    >>> score = sim_scorer(p, 20)
    >>> [round(x * 1e3, 6) for x in score(build_plan(p, {"A": 0, "B": 0}, {"A": "x", "B": "x"}))]
    [5.0, 5.0]
    """
    def score(plan: PipelinePlan) -> Tuple[float, float]:
        res = problem.simulate(plan, num_iterations)
        return float(res.period_s), float(res.latency)

    return score


class Evaluator:
    """Derives stages for candidates (cheap), simulates the promising ones, counts what was tried."""

    def __init__(self, problem: Problem, scorer: Scorer, rec: int) -> None:
        self.problem, self.scorer, self.rec = problem, scorer, rec
        # what was tried, as the report counts it (SearchRun.tried)
        self.counts = {"candidates": 0, "unique": 0, "simulated": 0, "stage_enumerated": 0}
        self.seen: Dict[tuple, Optional[Scored]] = {}
        self.sim_cache: Dict[tuple, Tuple[float, float]] = {}

    @staticmethod
    def plan_key(plan: PipelinePlan) -> tuple:
        return tuple((ref_name(k), s.stage, s.thread_group, stream_name(s.stream)) for k, s in plan.schedule.items()) + (
            tuple(ref_name(r) for r in plan.enqueue_order or ()), plan.caller_group)

    def score_plan(self, plan: PipelinePlan) -> Optional[Tuple[float, float]]:
        key = self.plan_key(plan)
        if key not in self.sim_cache:
            try:
                # the simulator validates the plan first
                self.sim_cache[key] = self.scorer(plan)
                self.counts["simulated"] += 1
            except Exception as exc:  # a plan the simulator rejects is just not a candidate
                log.debug("candidate rejected: %s", exc)
                self.sim_cache[key] = (math.inf, math.inf)
        got = self.sim_cache[key]
        return None if math.isinf(got[0]) else got

    def derive(self, cand: Candidate, max_depth: Optional[int] = None) -> Optional[Scored]:
        """Stages from the modulo list scheduler; not simulated yet."""
        self.counts["candidates"] += 1
        key = cand.key() + (max_depth,)
        if key in self.seen:
            return self.seen[key]
        self.counts["unique"] += 1
        tol = 1e-3 if len(self.problem.names) <= 50 else 3e-3
        tt = derive_timetable(self.problem, cand, self.rec, max_depth, rel_tol=tol, near=cand.near)
        if tt is None:
            self.seen[key] = None
            return None
        span = max(tt.start[t] + self.problem.dur(t) for t in self.problem.names) - min(tt.start.values())
        sc = Scored(cand, tt.ii, tt.stage, tt.offset, span)
        self.seen[key] = sc
        return sc

    def simulate(self, sc: Scored) -> bool:
        """Build the candidate's plan and score it by the simulator; False if it is rejected."""
        if sc.simulated:
            return True
        if sc.plan is None:
            names, cand = self.problem.names, sc.cand
            group = dict(zip(names, cand.group))
            stream = dict(zip(names, cand.stream))
            sc.plan = build_plan(self.problem, sc.stage, group, stream, cand.priority, sc.offset or None,
                                 inline=inline_label(self.problem, names, cand.group, cand.inline),
                                 handoff=cand.handoff)
        got = self.score_plan(sc.plan)
        if got is None:
            return False
        sc.period, sc.latency = got
        return True

    def evaluate(self, cand: Candidate, max_depth: Optional[int] = None) -> Optional[Scored]:
        """Derive and simulate."""
        sc = self.derive(cand, max_depth)
        return sc if sc is not None and self.simulate(sc) else None

    def reread(self, sc: Scored, cand: Candidate) -> Optional[Scored]:
        """``sc``'s stages and offsets read as ``cand`` (another caller's thread or hand-off), simulated."""
        got = Scored(cand, sc.ii, dict(sc.stage), dict(sc.offset), sc.span)
        return got if self.simulate(got) else None

    def with_stages(self, cand: Candidate, stage: Dict[str, int]) -> Optional[Scored]:
        self.counts["stage_enumerated"] += 1
        sc = Scored(cand, 0, dict(stage), {})
        return sc if self.simulate(sc) else None


def prune(problem: Problem, scored: List[Scored]) -> List[Scored]:
    """DOMINANCE_PRUNE: per (thread map, stream map, stages) keep the best fire order.

    Parameters
    ----------
    problem : Problem
    scored : list of Scored

    Returns
    -------
    list of Scored
        The survivors, best first (:func:`rank_key`).
    """
    best: Dict[tuple, Scored] = {}
    for s in scored:
        k = (s.cand.group, tuple(stream_name(x) for x in s.cand.stream), tuple(sorted(s.stage.items())))
        if k not in best or rank_key(problem, s) < rank_key(problem, best[k]):
            best[k] = s
    return sorted(best.values(), key=lambda s: rank_key(problem, s))


def rank_key(problem: Problem, s: Scored) -> tuple:
    """Simulated candidates by their simulated rank, ahead of unsimulated ones ranked by timetable.

    Parameters
    ----------
    problem : Problem
        Its time unit rounds the simulated figures.
    s : Scored

    Returns
    -------
    tuple
        Smaller is better.
    """
    return (0,) + s.rank(problem.unit_s) if s.simulated else (1,) + s.proxy_rank()
