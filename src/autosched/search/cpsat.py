"""CP-SAT over the joint space: the smallest period ``II`` whose model (:mod:`autosched.search.cpsat_model`) is feasible.

Each solve follows the OR-Tools pattern in three blocks: build the model of one period
(:func:`autosched.search.cpsat_model.build_model`), solve it (:func:`_solve`), read the solution
(:func:`autosched.search.cpsat_read.solution_values`).

The outer loop searches ``II`` from a lower bound upward (first the bound, then
bisection up to a known feasible ``II``). A proven-infeasible ``II`` proves
every smaller one infeasible (the constraints only loosen as ``II`` grows), so
``OPTIMAL`` means: no plan in the space reaches a smaller period in this model.
At the best period a last solve minimises the depth, then the iteration's
length. The solution, and the one it refined, are read as plans with each
group whose tasks fit the main thread's window on the caller's thread (the
solved inline slot among them), or with none; the simulator ranks these
readings, a group inline winning a tie (it starts no worker;
:func:`autosched.search.cpsat_read.plan_of`).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Dict, List, Optional, Tuple

from swpipe_core.plan import stream_name

from autosched.model.taskmodel import resource_loads
from autosched.search.bounds import critical_path_units, recurrence_bound
from autosched.search.cpsat_model import CpsatModel, build_model, hint_from
from autosched.search.cpsat_read import plan_of, solution_values
from autosched.search.found import Found, Scored, Scorer, Timetable
from autosched.search.problem import Problem

__all__ = ["solve_cpsat", "model_lower_bound"]

log = logging.getLogger(__name__)


def model_lower_bound(problem: Problem) -> int:
    """A period no plan can beat, in time units (resources, recurrences, depth-limited critical path, the main thread's
    engine time per period).

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> from swpipe import Constraints
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> c = NS(tasks={n: NS(host_s=0.003, device_s=0.0, resources=()) for n in "ABC"})
    >>> p = make_problem((list("ABC"), [("B", "A"), ("C", "B")]), c, Constraints(max_threads=2, max_depth=3), time_unit_s=1e-3)
    >>> model_lower_bound(p)   # 9 units of work on 2 threads
    5
    >>> c.cores = 1
    >>> model_lower_bound(p)   # 9 units of work on 1 core
    9
    """
    names = problem.names
    threads = min(problem.max_threads, len(names))
    bounds = [1, recurrence_bound(problem), problem.period_units(), max((problem.dur(n) for n in names), default=0),
              -(-sum(problem.dur(n) for n in names) // max(1, threads)),
              -(-critical_path_units(problem) // problem.max_depth)]
    # shared resources (sequencer, comm:, pcie, the core pool) hold the same whatever the thread and stream choice
    loads = resource_loads((problem.parts(n, "", None, units=True) for n in names), problem.cores)
    shared = {k: v for k, v in loads.items() if not k.startswith(("thread:", "stream:"))}
    bounds += [math.ceil(v) for v in shared.values()]  # the pool's load (work per core) is fractional
    if problem.cuda:
        streams = {stream_name(s) for n in names for s in problem.stream_choices[n]}
        bounds.append(-(-sum(problem.ddur(n) for n in names) // max(1, len(streams))))
        bounds.append(max((problem.ddur(n) for n in names), default=0))
        pinned: Dict[str, int] = {}
        for n in names:
            if len(problem.stream_choices[n]) == 1:
                key = stream_name(problem.stream_choices[n][0])
                pinned[key] = pinned.get(key, 0) + problem.ddur(n)
        bounds += list(pinned.values())
    return max(bounds)


def _solve(mod: CpsatModel, time_limit_s: float, num_workers: int, seed: int) -> Tuple[str, Any, float]:
    """Solve one model: ``(status name, the solver, its wall time)``; with ``mod.solutions`` a list, every solution found is appended."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, time_limit_s)
    solver.parameters.num_workers = max(1, num_workers)
    solver.parameters.random_seed = seed
    # CP-SAT would otherwise install its own SIGINT handler and leave SIGINT at
    # SIG_DFL afterwards: a later Ctrl-C would kill the process instead of
    # raising KeyboardInterrupt (which the engine turns into a clean stop).
    solver.parameters.catch_sigint_signal = False
    if mod.solutions is None:
        code = solver.Solve(mod.model)
    else:
        class Collect(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(self) -> None:
                mod.solutions.append(solution_values(mod, self.Value))

        code = solver.Solve(mod.model, Collect())
    return solver.StatusName(code), solver, solver.WallTime()


_READ_SOLUTIONS = 6  # of the refinement's solutions, the last ones the simulator ranks


def solve_cpsat(problem: Problem, *, time_limit_s: float = 30.0, num_workers: int = 2, seed: int = 0,
                hint: Optional[Scored] = None, upper: Optional[int] = None, scorer: Optional[Scorer] = None) -> Found:
    """Minimise the period over the joint space with CP-SAT (outer loop over ``II``).

    The smallest feasible period found: the analytic bound, else ``upper`` (or a gallop up from the bound), then
    bisection between them; at that period a last solve minimises the depth, then the iteration's length.

    Parameters
    ----------
    problem : Problem
    time_limit_s : float
        Total budget over all solves.
    num_workers : int
        CP-SAT worker threads.
    seed : int
        CP-SAT random seed.
    hint : Scored, optional
        A beam-search candidate (``Found.candidate``): its stages, offsets and groups seed each solve.
    upper : int, optional
        A period (time units) known to be reachable, e.g. the beam's.
    scorer : callable, optional
        ``plan -> (period_s, latency_s)`` (default: the simulator,
        :meth:`Problem.simulate`): it ranks the readings of the solution's
        caller's thread, and the refined solution against the one it refined
        (:func:`autosched.search.cpsat_read.plan_of`), and scores the plan.

    Returns
    -------
    Found
        ``method="cpsat"``; ``status`` ``OPTIMAL`` (the model's minimum period is proven), ``FEASIBLE`` (a plan
        was found, optimality not proven in time) or ``UNKNOWN`` (no plan in time, ``plan`` None). With a plan:
        its simulated ``period`` and ``latency``, the solution's ``timetable`` (``ii`` is the model's period in
        time units, ``model_period`` in seconds), ``depth_proven``; always ``bound`` (the largest period proven to
        be a lower bound, seconds), ``solves`` (each period tried and its status) and ``solver_time``.

    Examples
    --------
    Two 2 ms tasks in a chain, two threads, depth up to 2: pipelining them gives a 2 ms period.

    >>> from types import SimpleNamespace as NS
    >>> from swpipe import Constraints
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> c = NS(tasks={n: NS(host_s=0.002, device_s=0.0, resources=()) for n in "AB"})
    >>> p = make_problem((["A", "B"], [("B", "A")]), c, Constraints(max_depth=2, max_threads=2), time_unit_s=1e-3)
    >>> r = solve_cpsat(p, time_limit_s=10)
    >>> r.status, r.timetable.ii, sorted(r.timetable.stage.items()), r.plan.stage("B")
    ('OPTIMAL', 2, [('A', 0), ('B', 1)], 1)
    """
    periods = _PeriodSearch(problem, time_limit_s, num_workers, seed, hint)
    lower = model_lower_bound(problem)
    periods.proven = lower
    best: Optional[Tuple[int, dict]] = None
    got = periods.attempt(lower)
    if got is not None:
        best = (lower, got)
    lo = lower + 1
    if best is None and upper is not None and upper >= lo:
        got = periods.attempt(upper)
        best = (upper, got) if got is not None else None
    step = max(1, lo // 8)
    while best is None and time.perf_counter() < periods.deadline:  # gallop upward from the bound
        got = periods.attempt(lo + step)
        if got is not None:
            best = (lo + step, got)
        else:
            lo, step = lo + step + 1, step * 2
    while best is not None and lo < best[0] and time.perf_counter() < periods.deadline:  # bisection
        mid = (lo + best[0]) // 2
        got = periods.attempt(mid)
        if got is not None:
            best = (mid, got)
        else:
            lo = mid + 1
    return _found(problem, periods, best, scorer)


def _found(problem: Problem, periods: "_PeriodSearch", best: Optional[Tuple[int, dict]],
           scorer: Optional[Scorer]) -> Found:
    """The outer loop's result: the best period refined (fewest stages, shortest iteration) and read as a plan."""
    if best is None:
        return Found(None, method="cpsat", scorer=scorer, status="UNKNOWN", bound=periods.bound_s(None),
                     solver_time=periods.solve_time, solves=periods.tried, tried={"CP-SAT solves": len(periods.tried)})
    ii, solution = best
    refined = periods.attempt(ii, optimise=True)
    tried = periods.tried
    refine_status = tried[-1][1] if tried and tried[-1][0] == ii else ""
    # the refinement's last solutions (the last one first), then the solution it refined
    solutions = (([refined] if refined is not None else []) + periods.improving[::-1][:_READ_SOLUTIONS]
                 + [solution])
    plan, solution, period, latency = plan_of(problem, solutions, ii, scorer)
    start = {t: ii * solution["stage"][t] + solution["offset"][t] for t in solution["stage"]}
    return Found(plan, period, latency, "cpsat", scorer, status="OPTIMAL" if periods.proven >= ii else "FEASIBLE",
                 timetable=Timetable(ii, start, solution["stage"], solution["offset"]),
                 model_period=ii * problem.unit_s, model_optimal=periods.proven >= ii, bound=periods.bound_s(ii),
                 depth_proven=refine_status == "OPTIMAL",
                 solver_time=periods.solve_time, solves=tried, tried={"CP-SAT solves": len(tried)},
                 pool=[("cpsat", plan)])


class _PeriodSearch:
    """The outer loop over ``II``: one model per period tried, within the budget, the proofs and solutions kept.

    ``proven`` is the largest period proven to be a lower bound (every smaller one infeasible, or below the
    analytic bound), ``tried`` each ``(II, status)``, ``improving`` the refinement's solutions in the order found.
    """

    def __init__(self, problem: Problem, time_limit_s: float, num_workers: int, seed: int,
                 hint: Optional[Scored]) -> None:
        self.problem, self.time_limit_s, self.num_workers, self.seed, self.hint = (
            problem, time_limit_s, num_workers, seed, hint)
        self.deadline = time.perf_counter() + time_limit_s
        self.proven = 0
        self.tried: List[Tuple[int, str]] = []
        self.solve_time = 0.0
        self.improving: List[dict] = []
        self.found_any = False

    def bound_s(self, ii: Optional[int]) -> float:
        """A lower bound on the real-valued period, in seconds: the largest period proven (at most ``ii``).

        An infeasible integer ``II = b - 1`` proves every period up to ``(b - 1)``
        units impossible; a fractional period just above it is not excluded, so
        the bound is ``(b - 1)`` units then, and ``b`` units when it is the
        analytic bound itself.
        """
        bound = self.proven if ii is None else min(self.proven, ii)
        proved = any(status == "INFEASIBLE" and tried == bound - 1 for tried, status in self.tried)
        return (bound - 1 if proved else bound) * self.problem.unit_s

    def attempt(self, ii: int, optimise: bool = False) -> Optional[dict]:
        """Build, solve and read the model of period ``ii`` (``optimise``: fewest stages, then shortest iteration)."""
        left = self.deadline - time.perf_counter()
        if optimise:
            # depth and latency at the best period are a refinement: a bounded share of the budget
            left = max(0.5, min(left, 0.2 * self.time_limit_s))
        elif left <= 0.05:
            return None
        elif not self.found_any:
            # until a plan is in hand, no single period may eat the whole budget
            left = min(left, max(1.0, 0.25 * self.time_limit_s))
        model = build_model(self.problem, ii, hint_from(self.problem, self.hint, ii), optimise)
        if optimise:
            model.solutions = self.improving
        status, solver, wall = _solve(model, left, self.num_workers, self.seed)
        self.solve_time += wall
        self.tried.append((ii, status))
        log.debug("II=%d: %s in %.2fs", ii, status, wall)
        if status in ("OPTIMAL", "FEASIBLE"):
            self.found_any = True
            return solution_values(model, solver.Value)
        if status == "INFEASIBLE":
            self.proven = max(self.proven, ii + 1)
        return None
