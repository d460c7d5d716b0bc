"""The searchers in order, within a time budget, and which of their plans wins.

:func:`run_searchers` runs the beam search (:mod:`autosched.search.beam`, any size), then CP-SAT
(:mod:`autosched.search.cpsat`, graphs of at most ``SolverOptions.cpsat_max_tasks`` tasks, or
``method="cpsat"``) hinted by the beam's best, then scores the seed plans (:mod:`autosched.search.seeds`). Each
returns a :class:`~autosched.search.found.Found`; the simulator ranks their plans the same way (period, then
depth, latency and worker threads) and the best is returned, with every searcher's best among the candidates to
verify. The budget is split by ``SolverOptions``' ``beam_share`` (CP-SAT follows) or ``beam_only_share``, and
``cpsat_share``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Optional, Sequence

from swpipe_core.plan import PipelinePlan

from autosched.search.beam import beam_search, reduce_depth
from autosched.search.bounds import recurrence_bound
from autosched.search.cpsat import solve_cpsat
from autosched.search.found import Found
from autosched.search.options import SolverOptions
from autosched.search.problem import Problem
from autosched.search.report import fmt_ms
from autosched.search.scoring import sim_scorer
from autosched.search.seeds import Seed, best_seed, check_seeds

__all__ = ["run_searchers"]


def run_searchers(problem: Problem, solver: SolverOptions, seeds: Optional[Sequence[Seed]], budget_s: float,
                  started: float) -> Found:
    """The beam search, CP-SAT and the seeds within ``budget_s`` seconds from ``started``; the best plan found.

    Parameters
    ----------
    problem : Problem
    solver : SolverOptions
        ``method`` and ``cpsat_max_tasks`` say whether CP-SAT runs; the shares split the budget; the searchers'
        settings; ``num_iterations`` simulated iterations score the plans.
    seeds : list of PipelinePlan (or of (label, plan)), optional
        Known plans scored beside the search's own.
    budget_s : float
        The searchers' budget, seconds.
    started : float
        When the budget began (``time.perf_counter()``).

    Returns
    -------
    Found
        The best plan, scored by the simulator with ``solver.num_iterations`` iterations; its ``pool`` the
        candidates to verify (CP-SAT's, the beam's, its deeper one, the seeds), its ``tried`` what each searcher
        tried.

    Examples
    --------
    >>> import time
    >>> from swpipe import Constraints, CostModel, SolverOptions, TaskCost
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    >>> problem = make_problem((["Load", "Step"], [("Step", "Load")]), costs, Constraints(max_depth=2))
    >>> found = run_searchers(problem, SolverOptions(), None, budget_s=10, started=time.perf_counter())
    >>> found.method, found.status, round(found.period * 1e3, 3), [label for label, _ in found.pool]
    ('cpsat', 'OPTIMAL', 3.0, ['cpsat', 'beam', 'beam (deeper)'])
    """
    scorer = sim_scorer(problem, solver.num_iterations)
    use_cpsat = solver.method == "cpsat" or (solver.method == "auto" and len(problem.names) <= solver.cpsat_max_tasks)
    beam = beam_search(problem, width=solver.beam_width, rounds=solver.beam_rounds, seed=solver.seed,
                       time_limit_s=budget_s * (solver.beam_share if use_cpsat else solver.beam_only_share),
                       progress=solver.progress)
    # the beam's best, scored by the final scorer, at the shallowest depth that keeps its period
    best = beam.candidate
    best.period, best.latency = scorer(best.plan)
    best, _ = reduce_depth(problem, best, scorer, recurrence_bound(problem))
    found = dataclasses.replace(beam, plan=best.plan, period=best.period, latency=best.latency, scorer=scorer,
                                timetable=best.timetable(), candidate=best,
                                pool=[("beam", best.plan), ("beam (deeper)", beam.plan)])
    if use_cpsat:
        left_s = max(1.0, budget_s * solver.cpsat_share - (time.perf_counter() - started))
        upper = best.ii if best.ii else int(math.ceil(best.period / problem.unit_s))
        exact = solve_cpsat(problem, time_limit_s=left_s, num_workers=solver.num_workers, seed=solver.seed,
                            hint=best, upper=upper, scorer=scorer)
        found = _with_cpsat(problem, found, exact)
    seed_plans, seed_notes = check_seeds(seeds, problem)
    return best_seed(seed_plans, dataclasses.replace(found, notes=found.notes + seed_notes), problem.unit_s)


def _rank(problem: Problem, plan: PipelinePlan, period: float, latency: float) -> tuple:
    """How the beam ranks a simulated plan: period, depth, latency, then worker threads."""
    workers = len(plan.thread_groups) - (plan.caller_group in plan.thread_groups)
    unit = problem.unit_s
    return (round(period / unit, 3), plan.pipeline_depth, round(latency / unit, 3), workers)


def _with_cpsat(problem: Problem, found: Found, exact: Found) -> Found:
    """``found`` (the beam's) with CP-SAT's result: its plan when it ranks at least as well, its status and bound.

    ``OPTIMAL`` only when the simulated plan reaches CP-SAT's proven model period (the model approximates what the
    simulator runs); otherwise ``FEASIBLE``. Without a CP-SAT plan, ``HEURISTIC``.
    """
    got = dataclasses.replace(found, tried={**found.tried, "CP-SAT solves": len(exact.solves)},
                              solver_time=exact.solver_time, bound=exact.bound, solves=exact.solves,
                              notes=list(found.notes), status="HEURISTIC")
    if exact.plan is None:
        return got
    got = dataclasses.replace(got, pool=[("cpsat", exact.plan)] + got.pool, model_period=exact.model_period,
                              model_optimal=exact.model_optimal, status=exact.status)
    if _rank(problem, exact.plan, exact.period, exact.latency) <= _rank(problem, got.plan, got.period, got.latency):
        got = dataclasses.replace(got, plan=exact.plan, period=exact.period, latency=exact.latency, method="cpsat",
                                  timetable=exact.timetable, depth_proven=exact.depth_proven)
    elif round(exact.period / problem.unit_s, 3) > round(got.period / problem.unit_s, 3):
        got.notes.append(f"CP-SAT's plan simulates at {fmt_ms(exact.period)}, the beam's at {fmt_ms(got.period)}: "
                         f"the model approximates {problem.device} semantics")
    else:
        got.notes.append("CP-SAT's plan ties on period; the beam's needs less depth or latency")
    if got.status == "OPTIMAL" and got.period > exact.model_period * (1 + 1e-6) + problem.unit_s:
        got.status = "FEASIBLE"
    return got
