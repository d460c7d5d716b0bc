"""One plan search for a task graph, a cost model, constraints and solver options: the phases in order, and the report.

This is :func:`autosched.search.entry.auto_schedule` for one graph, its costs as given and no memory
cap; the entry point normalises the inputs and sends a search with inferred dependencies
(:mod:`autosched.search.inferred`) or under a memory cap (:mod:`autosched.search.memcap`) to its
module, which calls :func:`search_plan` in turn. The phases: fold the machine calibration into the
costs (one machine model for the call, :mod:`autosched.model.machine`), search (beam, CP-SAT, seeds:
:mod:`autosched.search.phases`), judge (:mod:`autosched.search.judge`), verify the candidates on the
engine (:mod:`autosched.verify.loop`) and, when the measurements move the core pool, search once more
(:func:`refit_round`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Optional, Sequence, Tuple

from swpipe_core.order import enqueue_order
from swpipe_core.plan import PipelinePlan

from autosched.search.gradstreams import frozen_overrides, guard_found, record_for, repair_plan
from autosched.search.judge import judge
from autosched.search.options import Constraints, SolverOptions
from autosched.search.phases import run_searchers
from autosched.search.problem import Problem, make_problem
from autosched.search.report import SearchReport, fmt_ms

__all__ = ["search_plan", "refit_round"]


def search_plan(tasks_or_graph: Any, costs: Any, c: Constraints, s: SolverOptions, *,
                seeds: Optional[Sequence[Any]] = None, verify: Any = None,
                batches: Optional[Sequence[Any]] = None, state: Any = None) -> Tuple[PipelinePlan, SearchReport]:
    """Search the best plan for one graph (``c.max_memory_bytes`` is not looked at).

    Parameters
    ----------
    tasks_or_graph, seeds, verify, batches, state
        As for :func:`autosched.search.entry.auto_schedule` (on CUDA, ``state`` and ``batches`` let the search
        keep gradient frees on their makers' stream: :mod:`autosched.search.gradstreams`).
    costs : CostModel
        A cost model; its machine calibration, if any, is folded in.
    c : Constraints
        What the plan may be.
    s : SolverOptions
        How the search runs.

    Returns
    -------
    (PipelinePlan, SearchReport)
        The plan with its enqueue order written out, and the report.

    Examples
    --------
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    >>> plan, report = search_plan((["Load", "Step"], [("Step", "Load")]), costs,
    ...                            Constraints(max_depth=2), SolverOptions(time_limit_s=10))
    >>> plan.stage("Step"), round(report.period_s * 1e3, 3)
    (1, 3.0)
    """
    # the machine model of this call (autosched.model.machine): the calibration folded into the costs once; the problem
    # keeps it for the per-hand-off and per-period terms, so every simulation below (search, report, verification)
    # is of one model
    calibration, folded_note = costs.machine_calibration, None
    if calibration is not None:
        from autosched.model.machine import searched_costs

        costs = searched_costs(costs, device=c.device)
        folded_note = ("searched with the machine calibration folded in: engine costs per task, per hand-off and per "
                       "period" + costs.notes.rpartition("calibrated: engine costs per task")[2])
    t0 = time.perf_counter()
    problem = make_problem(tasks_or_graph, costs, c, time_unit_s=s.time_unit_s)
    problem.calibration = calibration
    # budget: beam 30% then CP-SAT up to 70% (its depth refinement may add a fifth of that), or beam 85%;
    # the depth explanation takes at most 10%
    found = run_searchers(problem, s, seeds, s.time_limit_s, t0)
    if folded_note is not None:
        found.notes.insert(0, folded_note)
    # before the judgement and the verification, so every figure of the report is of the repaired plan
    traffic, unchecked = record_for(found.plan, c, state, batches)
    chosen = found.plan
    found = guard_found(found, traffic)
    found.notes.extend(unchecked + frozen_overrides(c, chosen, found.plan))
    report = judge(tasks_or_graph, costs, problem, c, s, found, t0)
    # phase 4, verify in the loop (autosched.verify.loop): measured on the engine, the fastest wins
    from autosched.verify import loop as verify_mod

    if verify_mod.wanted(verify, problem, batches):
        plan, report = verify_mod.verify_search(report, found.pool, problem, batches, verify, s.num_iterations)
        report = refit_round(tasks_or_graph, problem, c, s, seeds, report, batches, verify, grads=traffic)
    if traffic is not None and repair_plan(report.plan, traffic)[0] is not report.plan:
        report.notes.append("the plan measured fastest (a known plan, kept as given) frees gradients on another "
                            "stream than the one that made them: run it with SWPipeline(plan, state=[model, "
                            "optimizer]) so the engine keeps them alive")
    return _with_enqueue_order(report)


def refit_round(tasks_or_graph: Any, problem: Problem, c: Constraints, s: SolverOptions,
                seeds: Optional[Sequence[Any]], report: SearchReport, batches: Sequence[Any],
                verify: Any, grads: Any = None) -> SearchReport:
    """Phase 5: refit the core pool to the measurements (:mod:`autosched.verify.refit`) and, if it moved, search once more.

    The new search's plan is measured against the verified choice (and the
    serial plan) in fresh interleaved rounds and returned only if measured
    faster; either way the report's verification table says what happened.

    Parameters
    ----------
    tasks_or_graph, seeds, batches, verify
        As for :func:`search_plan`.
    problem : Problem
        The problem of the first search (its costs and machine calibration).
    c : Constraints
    s : SolverOptions
    report : SearchReport
        The verified report (``report.verify`` holds the measurements).
    grads : GradTraffic, optional
        The gradient traffic the first search was repaired for (:mod:`autosched.search.gradstreams`); the new
        search's plan is repaired the same way.

    Returns
    -------
    SearchReport
        ``report`` (its table's notes say why the choice stands), or the refit round's.
    """
    from autosched.verify import loop as verify_mod
    from autosched.verify.candidates import plan_key
    from autosched.verify.refit import fit_core_pool

    table = report.verify
    fit = fit_core_pool(table, problem.costs, s.num_iterations, problem.device, problem.calibration)
    if fit is None:
        return report
    table.notes.append(f"refit: {fit.describe()}")
    if not fit.changed:
        return report
    t0 = time.perf_counter()
    refit_problem = make_problem(tasks_or_graph, fit.applied_to(problem.costs), c, time_unit_s=s.time_unit_s)
    refit_problem.calibration = problem.calibration
    # a second look, hinted by what is known: half the first search's time
    found = guard_found(run_searchers(refit_problem, s, seeds, s.time_limit_s / 2, t0), grads)
    measured = {plan_key(r.plan): r.label for r in table.rows if r.plan is not None}
    if plan_key(found.plan) in measured:
        table.notes.append(f"refit: the search with {fit.cores} core(s) picks a plan already measured "
                           f"({measured[plan_key(found.plan)]}); the choice stands")
        return report
    chosen = table.choose()
    try:
        chosen_s = float(found.scorer(chosen.plan)[0])
    except Exception:  # noqa: BLE001 - a measured plan the simulator rejects: let the measurement decide
        chosen_s = math.inf
    if found.period >= chosen_s - refit_problem.unit_s:
        table.notes.append(f"refit: with {fit.cores} core(s) the search's best plan simulates at {fmt_ms(found.period)}, "
                           f"no faster than {chosen.label} ({fmt_ms(chosen_s)}); the choice stands")
        return report
    return verify_mod.measure_refit(report, chosen, found.plan, refit_problem, batches, verify, s.num_iterations)


def _with_enqueue_order(report: SearchReport) -> Tuple[PipelinePlan, SearchReport]:
    """The report's plan with its enqueue order written out (a seed or the serial plan may leave it to the engine)."""
    plan = report.plan
    if plan.enqueue_order is None:
        plan = plan.replace(enqueue_order=enqueue_order(plan), pipeline_depth=plan.pipeline_depth)
        report = dataclasses.replace(report, plan=plan)
    return plan, report
