"""The search's phases, each adding to what was found: beam search (1), CP-SAT (2), seed plans (2b).

:func:`run_searchers` runs them in order within a time budget: the beam first (30 % of it when
CP-SAT follows, else 85 %), then CP-SAT up to 70 % (graphs of at most ``cpsat_max_tasks`` tasks,
or ``method="cpsat"``), then the seeds. :class:`Found` carries the chosen plan, its simulated
figures, how it was found and the candidates for verification.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan

from autosched.search.beam import beam_search, reduce_depth
from autosched.search.bounds import recurrence_bound
from autosched.search.cpsat import solve_cpsat
from autosched.search.options import SolverOptions
from autosched.search.problem import Problem
from autosched.search.report import fmt_ms
from autosched.search.scoring import sim_scorer
from autosched.search.seeds import best_seed, check_seeds

__all__ = ["Found", "run_searchers", "search_beam", "search_cpsat", "search_seeds"]


def run_searchers(problem: Problem, s: SolverOptions, seeds: Optional[Sequence[Any]], budget_s: float,
                  t0: float) -> "Found":
    """Phases 1, 2 and 2b within ``budget_s`` seconds from ``t0`` (``time.perf_counter()``).

    Parameters
    ----------
    problem : Problem
    s : SolverOptions
        ``method`` and ``cpsat_max_tasks`` say whether CP-SAT runs.
    seeds : list of PipelinePlan (or of (label, plan)), optional
        Known plans scored beside the search's own.
    budget_s : float
        The searchers' budget: the beam takes 30 % of it when CP-SAT follows (else 85 %),
        CP-SAT what is left of 70 % (at least a second).
    t0 : float
        When the budget began.

    Returns
    -------
    Found
    """
    use_cpsat = s.method == "cpsat" or (s.method == "auto" and len(problem.names) <= s.cpsat_max_tasks)
    found = search_beam(problem, s, budget_s * (0.3 if use_cpsat else 0.85))
    if use_cpsat:
        search_cpsat(problem, s, found, left_s=max(1.0, budget_s * 0.7 - (time.perf_counter() - t0)))
    search_seeds(problem, found, seeds)
    return found


@dataclass
class Found:
    """What the searchers found so far: the chosen plan, its simulated figures and how it was found."""

    plan: PipelinePlan
    period: float
    latency: float
    method: str
    best: Any                                   # the beam's best Scored (hints CP-SAT)
    scorer: Any
    tried: Dict[str, int]
    status: str = "HEURISTIC"
    model_period: Optional[float] = None
    proven: Optional[float] = None
    solver_time: float = 0.0
    depth_proven: bool = False
    notes: List[str] = field(default_factory=list)
    pool: List[Tuple[str, Any]] = field(default_factory=list)  # (label, plan) candidates for verification


def search_beam(problem: Problem, s: SolverOptions, budget_s: float) -> Found:
    """Phase 1: beam search (any size), then the shallowest depth that keeps its period.

    Parameters
    ----------
    problem : Problem
    s : SolverOptions
        Beam width, rounds, seed, progress bar and the simulated iterations of the score.
    budget_s : float
        The beam's wall-clock budget.

    Returns
    -------
    Found
        The beam's best plan (and the deeper one it reduced), its scorer and counts.
    """
    scorer = sim_scorer(problem, s.num_iterations)
    beam = beam_search(problem, width=s.beam_width, rounds=s.beam_rounds, time_limit_s=budget_s, seed=s.seed,
                       progress=s.progress)
    best = beam.best
    best.period, best.latency = scorer(best.plan)
    best, _ = reduce_depth(problem, best, scorer, recurrence_bound(problem))
    bc = beam.counts
    tried = {"beam candidates": bc["candidates"], "beam distinct": bc["unique"], "beam simulated": bc["simulated"],
             "beam stage vectors tried": bc["stage_enumerated"], "beam rounds": bc["rounds"]}
    found = Found(best.plan, best.period, best.latency, "beam", best, scorer, tried)
    found.pool = [("beam", best.plan), ("beam (deeper)", beam.best.plan)]
    return found


def search_cpsat(problem: Problem, s: SolverOptions, found: Found, left_s: float) -> None:
    """Phase 2 (small graphs): CP-SAT, exact in its model, hinted by the beam; the simulator has the last word.

    Parameters
    ----------
    problem : Problem
    s : SolverOptions
        CP-SAT's workers and seed.
    found : Found
        The beam's result; updated in place (CP-SAT's plan when it ranks at least as well, its status and bound).
    left_s : float
        CP-SAT's wall-clock budget.
    """
    best = found.best
    upper = best.ii if best.ii else int(math.ceil(best.period / problem.unit_s))
    res = solve_cpsat(problem, time_limit_s=left_s, num_workers=s.num_workers, seed=s.seed, hint=best, upper=upper,
                      scorer=found.scorer)
    found.tried["CP-SAT solves"] = len(res.tried)
    found.solver_time, found.proven = res.solve_time_s, res.bound_s
    if res.plan is not None:
        found.pool.insert(0, ("cpsat", res.plan))
        found.model_period = res.period_s
        cp_period, cp_latency = found.scorer(res.plan)

        def rank(plan: PipelinePlan, period: float, latency: float) -> tuple:  # as the beam ranks (worker threads last)
            workers = len(plan.thread_groups) - (plan.caller_group in plan.thread_groups)
            return (round(period / problem.unit_s, 3), plan.pipeline_depth, round(latency / problem.unit_s, 3), workers)

        if rank(res.plan, cp_period, cp_latency) <= rank(found.plan, found.period, found.latency):
            found.plan, found.period, found.latency, found.method = res.plan, cp_period, cp_latency, "cpsat"
            found.depth_proven = res.refined == "OPTIMAL"
        elif round(cp_period / problem.unit_s, 3) > round(found.period / problem.unit_s, 3):
            found.notes.append(f"CP-SAT's plan simulates at {fmt_ms(cp_period)}, the beam's at {fmt_ms(found.period)}: "
                               f"the model approximates {problem.device} semantics")
        else:
            found.notes.append("CP-SAT's plan ties on period; the beam's needs less depth or latency")
    found.status = res.status if res.plan is not None else "HEURISTIC"
    if found.status == "OPTIMAL" and found.period > res.period_s * (1 + 1e-6) + problem.unit_s:
        found.status = "FEASIBLE"


def search_seeds(problem: Problem, found: Found, seeds: Optional[Sequence[Any]]) -> None:
    """Phase 2b: seed plans (:mod:`autosched.search.seeds`), scored by the same simulator and verified alongside.

    Parameters
    ----------
    problem : Problem
    found : Found
        Updated in place: a seed that simulates faster becomes the plan; every seed joins the pool.
    seeds : list of PipelinePlan (or of (label, plan)), optional
    """
    seed_plans, seed_notes = check_seeds(seeds, problem)
    found.notes += seed_notes
    found.plan, found.period, found.latency, found.method = best_seed(
        seed_plans, found.scorer, (found.plan, found.period, found.latency, found.method), problem.unit_s,
        found.notes)
    found.pool += seed_plans
