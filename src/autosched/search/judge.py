"""Phase 3 of the search, the judgement: the chosen plan simulated, bounded, and explained.

The searchers (:mod:`autosched.search.phases`) say which plan; this says how good it is: its
simulated period and latency, the best lower bound (analytic, the CP-SAT model's, or CP-SAT's
proof), why its depth is what it is (a quick search one iteration shallower), the serial plan's
period, the what-ifs (halving the largest task on what binds it) and, with memory figures, the
predicted peak and the least memory any plan needs. It builds the :class:`SearchReport`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, List, Optional, Tuple

from swpipe_core.plan import PipelinePlan
from swpipe_core.validate import validate

from autosched.model.graph import task_graph
from autosched.model.machine import simulate_folded
from autosched.model.memory import min_memory
from autosched.search.beam import beam_search
from autosched.search.bounds import lower_bounds
from autosched.search.cpsat import model_lower_bound
from autosched.search.options import Constraints, SolverOptions
from autosched.search.phases import Found
from autosched.search.problem import Problem, make_problem
from autosched.search.report import SearchReport, fmt_ms
from autosched.search.scoring import sim_scorer

__all__ = ["judge"]

log = logging.getLogger(__name__)


def _serial_period(problem: Problem, plan: PipelinePlan) -> float:
    """The serial plan's period in the call's model (the tasks one after the other, plus the engine's time)."""
    from autosched.verify.candidates import serial_plan

    try:
        return float(problem.simulate(serial_plan(plan)).period)
    except Exception:  # noqa: BLE001 - a plan outside the simulator's rules: the sum of the tasks
        return sum(problem.host[n] + problem.dev[n] for n in problem.names)


def _tasks_on(problem: Problem, plan: PipelinePlan, resource: str) -> List[str]:
    """Tasks that use a simulator resource name (``thread:<g>``, ``stream:<s>``, ``comm:<c>``, ``pcie``)."""
    return [n for n in problem.names if resource in _holds(problem.parts(n, plan.sched(n).thread_group, plan.sched(n).stream))]


def _holds(parts: Any) -> Tuple[str, ...]:
    return parts.host_holds + parts.device_holds


def _what_ifs(problem: Problem, plan: PipelinePlan, sim: Any, num_iterations: int) -> List[Tuple[str, float]]:
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
        res = simulate_folded(plan, problem.costs.scaled(task, 0.5), problem.calibration,
                              num_iterations=num_iterations, device=problem.device)
    except Exception as exc:  # what-if is advice, never a failure of the search
        log.debug("what-if failed: %s", exc)
        return []
    return [(f"halving {task} ({where})", float(res.period))]


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


def _depth_reason(tasks_or_graph: Any, costs: Any, c: Constraints, s: SolverOptions, depth: int, period: float,
                  depth_proven: bool, budget_s: float, calibration: Any = None) -> str:
    """Why this depth: the best period a quick search finds with one iteration fewer in flight."""
    if depth == 1:
        return "one iteration in flight already reaches this period (least memory)"
    proven = "; CP-SAT proved no shallower plan reaches this period" if depth_proven else ""
    try:
        shallow = make_problem(tasks_or_graph, costs, dataclasses.replace(c, max_depth=depth - 1),
                               time_unit_s=s.time_unit_s)
        shallow.calibration = calibration  # the same machine model
        got = beam_search(shallow, width=4, rounds=4, time_limit_s=budget_s, seed=s.seed).best
        p = sim_scorer(shallow, s.num_iterations)(got.plan)[0]
    except (ValueError, RuntimeError) as exc:
        return f"depth {depth - 1} admits no plan ({exc})"
    if p <= period * (1 + 1e-9):
        return f"depth {depth - 1} reaches the same period in a quick search{proven}"
    return f"the best plan found with {depth - 1} in flight runs at {fmt_ms(p)} (+{100 * (p / period - 1):.1f}%){proven}"


def judge(tasks_or_graph: Any, costs: Any, problem: Problem, c: Constraints, s: SolverOptions, found: Found,
          t0: float) -> SearchReport:
    """Phase 3: simulate the chosen plan, bound it, and say why it is what it is.

    Parameters
    ----------
    tasks_or_graph, costs
        The search's input (a quick search of one depth less says why the depth is what it is).
    problem : Problem
        The problem searched (its machine model simulates the plan).
    c : Constraints
    s : SolverOptions
        Its simulated iterations score the plan; its time budget bounds the quick search.
    found : Found
        What the searchers found (:mod:`autosched.search.phases`).
    t0 : float
        ``time.perf_counter()`` when the search began (the report's search time, the budget left).

    Returns
    -------
    SearchReport
    """
    plan = found.plan
    validate(plan)
    sim = problem.simulate(plan, s.num_iterations)
    period, latency = float(sim.period), float(sim.latency)
    lb, bound_why = _lower_bound(problem, model_lower_bound(problem) * problem.unit_s, found.proven)
    lb = min(lb, period)
    remaining = s.time_limit_s - (time.perf_counter() - t0)
    depth_reason = _depth_reason(tasks_or_graph, costs, c, s, plan.pipeline_depth, period, found.depth_proven,
                                 budget_s=max(0.5, min(3.0, 0.1 * s.time_limit_s, remaining)),
                                 calibration=problem.calibration)
    baseline = None
    if problem.base_plan is not None:
        try:
            baseline = found.scorer(problem.base_plan)[0]
        except Exception as exc:  # an input plan outside the engine's rules has no baseline
            found.notes.append(f"input plan could not be simulated as given: {exc}")
    report = SearchReport(
        plan=plan, period_s=period, latency_s=latency, lower_bound_s=lb,
        gap_pct=100.0 * (period / lb - 1.0) if lb > 0 else 0.0, binding=str(sim.binding),
        bound_binding=bound_why, depth=plan.pipeline_depth, max_depth=problem.max_depth,
        depth_reason=depth_reason, threads=len(plan.thread_groups),
        method=found.method, status=found.status, model_period_s=found.model_period, proven_bound_s=found.proven,
        solver_time_s=found.solver_time, search_time_s=time.perf_counter() - t0, tried=found.tried,
        device=problem.device, serial_period_s=_serial_period(problem, plan), baseline_period_s=baseline,
        utilisation=dict(sim.utilisation), what_if=_what_ifs(problem, plan, sim, s.num_iterations), notes=found.notes,
    )
    if getattr(problem.costs, "has_bytes", False):
        report.peak_bytes = sim.memory.peak_bytes
        report.min_memory_bytes = min_memory(list(problem.names), list(problem.intra), problem.costs,
                                             device=problem.device).value
    return report
