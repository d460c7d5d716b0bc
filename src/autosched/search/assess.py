"""The chosen plan assessed: simulated, bounded, and explained, as a :class:`SearchReport`.

The searchers (:mod:`autosched.search.searchers`) say which plan; :func:`assess` says how good it is: its
simulated period and latency, the best lower bound (analytic, the CP-SAT model's, or CP-SAT's
proof) and what is proven about the plan (``status``), why its depth is what it is (a quick search one
iteration shallower), the serial plan's period, the what-ifs (halving the largest task on what binds it) and,
with memory figures, the predicted peak and the least memory any plan needs. :func:`rejudge` redoes the
plan's figures when the verification on the engine chose another plan.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import List, Optional, Tuple

from swpipe_core.plan import PipelinePlan
from swpipe_core.validate import validate

from autosched.model.graph import task_graph
from autosched.model.memory import min_memory
from autosched.model.simulate import SimResult, simulate_folded
from autosched.model.taskmodel import TaskParts
from autosched.search.beam import beam_search
from autosched.search.bounds import lower_bounds
from autosched.search.cpsat import model_lower_bound
from autosched.search.found import Found
from autosched.search.options import SolverOptions
from autosched.search.problem import Problem
from autosched.search.report import Reasons, SearchReport, SearchRun, fmt_ms
from autosched.search.scoring import sim_scorer

__all__ = ["assess", "rejudge"]

log = logging.getLogger(__name__)


def _serial_period(problem: Problem, plan: PipelinePlan) -> float:
    """The serial plan's period in the call's model (the tasks one after the other, plus the engine's time)."""
    from autosched.verify.candidates import serial_plan

    try:
        return float(problem.simulate(serial_plan(plan)).period_s)
    except Exception:  # noqa: BLE001 - a plan outside the simulator's rules: the sum of the tasks
        return sum(problem.host[n] + problem.dev[n] for n in problem.names)


def _tasks_on(problem: Problem, plan: PipelinePlan, resource: str) -> List[str]:
    """Tasks that use a simulator resource name (``thread:<g>``, ``stream:<s>``, ``comm:<c>``, ``pcie``)."""
    return [n for n in problem.names if resource in _holds(problem.parts(n, plan.sched(n).thread_group, plan.sched(n).stream))]


def _holds(parts: TaskParts) -> Tuple[str, ...]:
    return parts.host_holds + parts.device_holds


def _what_ifs(problem: Problem, plan: PipelinePlan, sim: SimResult, num_iterations: int) -> List[Tuple[str, float]]:
    """Simulated effect (same plan) of halving the largest task on what binds it."""
    if not hasattr(problem.costs, "scaled"):
        return []
    util = dict(sim.utilisation)
    resource = max(util, key=lambda k: (util[k], k)) if util else ""
    on = _tasks_on(problem, plan, resource) if util and util[resource] >= 0.999 else []
    where = f"the largest task on {resource}"
    if not on:
        on = sorted({step[0] for step in sim.critical_cycle.steps})
        where = "the largest task on the critical cycle"
    if not on:
        return []
    task = max(on, key=lambda n: (problem.host[n] + problem.dev[n], n))
    try:
        res = simulate_folded(plan, problem.costs.scaled(task, 0.5), problem.calibration, num_iterations,
                              problem.device)
    except Exception as exc:  # what-if is advice, never a failure of the search
        log.debug("what-if failed: %s", exc)
        return []
    return [(f"halving {task} ({where})", float(res.period_s))]


def _lower_bound(problem: Problem, model_lb_s: float, proven_s: Optional[float]) -> Tuple[float, str]:
    """The best lower bound: autosched.search.bounds', the model's, or CP-SAT's proof, with what sets it."""
    value, why = model_lb_s, "resource, recurrence and depth-limited critical path bounds of the model"
    graph = task_graph(list(problem.names), list(problem.intra), list(problem.inter))
    b = lower_bounds(graph, problem.costs, max_threads=problem.max_threads, max_depth=problem.max_depth,
                     device=problem.device)
    if float(b.value) >= value * (1 - 1e-9):
        value, why = max(value, float(b.value)), str(b.binding)
    if proven_s is not None and proven_s > value * (1 + 1e-9):
        value, why = proven_s, f"CP-SAT proof: every shorter period is infeasible (analytic bounds give {fmt_ms(value)})"
    return value, why


def _depth_reason(problem: Problem, solver: SolverOptions, depth: int, period: float, depth_proven: bool,
                  budget_s: float) -> str:
    """Why this depth: the best period a quick search finds with one iteration fewer in flight."""
    if depth == 1:
        return "one iteration in flight already reaches this period (least memory)"
    proven = "; CP-SAT proved no shallower plan reaches this period" if depth_proven else ""
    try:
        shallow = problem.remade(max_depth=depth - 1)  # the same machine model, one iteration fewer in flight
        got = beam_search(shallow, width=4, rounds=4, time_limit_s=budget_s, seed=solver.seed)
        p = sim_scorer(shallow, solver.num_iterations)(got.plan)[0]
    except (ValueError, RuntimeError) as exc:
        return f"depth {depth - 1} admits no plan ({exc})"
    if p <= period * (1 + 1e-9):
        return f"depth {depth - 1} reaches the same period in a quick search{proven}"
    return f"the best plan found with {depth - 1} in flight runs at {fmt_ms(p)} (+{100 * (p / period - 1):.1f}%){proven}"


def assess(problem: Problem, solver: SolverOptions, found: Found, started: float) -> SearchReport:
    """Simulate the chosen plan, bound it, say what is proven and why it is what it is.

    Parameters
    ----------
    problem : Problem
        The problem searched: its machine model simulates the plan; made again one iteration shallower, a quick
        search says why the depth is what it is.
    solver : SolverOptions
        Its simulated iterations score the plan; its time budget bounds the quick search.
    found : Found
        What the searchers found (:func:`autosched.search.searchers.run_searchers`), repaired.
    started : float
        ``time.perf_counter()`` when the search began (the report's search time, the budget left).

    Returns
    -------
    SearchReport
        ``status`` is ``OPTIMAL`` also when the plan's simulated period reaches the lower bound, whatever found
        it: no plan in the space is faster.
    """
    plan = found.plan
    validate(plan)
    sim = problem.simulate(plan, solver.num_iterations)
    period, latency = float(sim.period_s), float(sim.latency)
    bound, bound_why = _lower_bound(problem, model_lower_bound(problem) * problem.unit_s, found.bound)
    unit = problem.unit_s
    status = "OPTIMAL" if round(period / unit, 3) <= round(bound / unit, 3) else found.status
    remaining = solver.time_limit_s - (time.perf_counter() - started)
    depth_reason = _depth_reason(problem, solver, plan.pipeline_depth, period, found.depth_proven,
                                 budget_s=max(0.5, min(3.0, 0.1 * solver.time_limit_s, remaining)))
    baseline = None
    if problem.base_plan is not None:
        try:
            baseline = found.scorer(problem.base_plan)[0]
        except Exception as exc:  # an input plan outside the engine's rules has no baseline
            found.notes.append(f"input plan could not be simulated as given: {exc}")
    why = Reasons(bound_why, depth_reason, problem.max_depth, dict(sim.utilisation),
                  _what_ifs(problem, plan, sim, solver.num_iterations))
    run = SearchRun(time.perf_counter() - started, found.tried, found.model_period, found.model_optimal,
                    found.bound, found.solver_time)
    report = SearchReport(plan=plan, period_s=period, latency_s=latency, lower_bound_s=min(bound, period),
                          binding=str(sim.binding), status=status, method=found.method, device=problem.device,
                          serial_period_s=_serial_period(problem, plan), why=why, search=run,
                          baseline_period_s=baseline, notes=problem.notes + found.notes)
    if getattr(problem.costs, "has_bytes", False):
        report.peak_bytes = sim.memory.peak_bytes
        report.min_memory_bytes = min_memory(list(problem.names), list(problem.intra), problem.costs,
                                             device=problem.device).value
    return report


def rejudge(report: SearchReport, plan: PipelinePlan, problem: Problem, num_iterations: int) -> SearchReport:
    """The report's figures for another plan the verification chose (simulated in the same model).

    Parameters
    ----------
    report : SearchReport
        The search's report.
    plan : PipelinePlan
        The plan measured fastest.
    problem : Problem
        The problem searched (or refitted): its model simulates ``plan``.
    num_iterations : int
        Simulated iterations.

    Returns
    -------
    SearchReport
        A copy: ``plan``, its simulated period, latency, binding and utilisation, ``method`` ending ``+verify``,
        the depth's reason "chosen by measurement", no what-ifs.
    """
    sim = problem.simulate(plan, num_iterations)
    why = dataclasses.replace(report.why, depth_reason="chosen by measurement on the engine (verify), not by the "
                              "simulator", utilisation=dict(sim.utilisation), what_if=[])
    return dataclasses.replace(report, plan=plan, period_s=float(sim.period_s), latency_s=float(sim.latency),
                               binding=str(sim.binding), method=f"{report.method}+verify", why=why)
