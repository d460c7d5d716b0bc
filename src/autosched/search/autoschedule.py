"""``auto_schedule``: the best PipelinePlan for a task graph and a cost model, and why it is best, step by step.

One function holds the search's steps in order: build the problem (the machine model folded into the costs once),
run the searchers (:mod:`autosched.search.searchers`: beam search, CP-SAT on small graphs, the seed plans), repair
and judge the plan (:mod:`autosched.search.gradstreams`, :mod:`autosched.search.assess`), and verify it on the
engine (:mod:`autosched.verify.loop`; when the measurements move the core pool, :func:`refit_round` searches once
more). A memory cap searches once per depth cap (:mod:`autosched.search.memcap`), each an ``auto_schedule`` of its
own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from swpipe_core.order import enqueue_order
from swpipe_core.plan import PipelinePlan

from autosched._fields import OptionError
from autosched.model.costs import CostModel, as_cost_model
from autosched.search.assess import assess
from autosched.search.gradstreams import frozen_overrides, guard_found, record_for, repair_plan
from autosched.search.options import Constraints, SolverOptions, naming_homes
from autosched.search.problem import GraphInput, Problem, searched_problem
from autosched.search.report import SearchReport, fmt_ms
from autosched.search.searchers import run_searchers
from autosched.search.seeds import Seed
from autosched.verify import loop as verify_loop

if TYPE_CHECKING:  # annotations only: the recorder (torch) is imported where it runs
    from swpipe_core.dataflow import InferredDeps
    from swpipe_core.dataflow.grads import GradTraffic

__all__ = ["auto_schedule", "refit_round"]

#: what ``verify=`` takes: None (on with ``batches``), a bool, a number of rounds, or ``VerifyOptions``
Verify = Union[None, bool, int, verify_loop.VerifyOptions]


@naming_homes
def auto_schedule(tasks_or_graph: Union[GraphInput, "InferredDeps"], costs: CostModel,
                  constraints: Optional[Constraints] = None, solver: Optional[SolverOptions] = None, *,
                  seeds: Optional[Sequence[Seed]] = None, verify: Verify = None,
                  batches: Optional[Sequence[Any]] = None, state: Any = None) -> Tuple[PipelinePlan, SearchReport]:
    """Search the best plan: stages, thread groups, streams and enqueue order, jointly.

    The search space is stage x thread group x stream x enqueue order, and the group run inline on the caller's
    thread with where its hand-offs go. Two searchers cover it: beam search with stages derived by modulo list
    scheduling, scored by the simulator (any size), and the exact joint CP-SAT model (graphs up to
    ``SolverOptions.cpsat_max_tasks`` tasks, hinted by the beam's best), which proves the minimum period of its
    model or reports the gap. Whatever the searchers say, the plan returned is the one with the best *simulated*
    period (the simulator models the engine), it passes ``validate`` and never deadlocks; when the input is a
    plan, that plan as given is a candidate too, so the result is never worse than it in the model. With
    ``batches``, the candidates are measured on the engine and the one measured fastest is returned.

    Parameters
    ----------
    tasks_or_graph : networkx.DiGraph, PipelinePlan, tuple or InferredDeps
        A task graph from ``autosched.model.graph.task_graph(tasks, intra, inter)`` (edges ``dep -> task`` with
        ``distance`` 0 or N); a plan (its tasks and dependencies, its schedule as a starting point and a baseline,
        its ``caller_group`` the name a group run on the caller's thread takes, or None: every group on a
        worker); ``(tasks, intra_deps[, inter_deps])`` with ``(task, dep)`` / ``(task, dep, N)`` pairs; or what
        :func:`swpipe.infer_plan` returns: the dependencies recorded from a run of the tasks, the report's notes
        then list each inferred edge the plan honours (``report.inferred`` holds them). ``PipelineTask`` objects
        keep their functions, so the returned plan runs as is.
    costs : CostModel
        A cost for every task (``host_s``, ``device_s``, ``comm:``/``pcie`` tags). When it carries a machine
        calibration (``TaskProfiler(pipe, calibrate=True)``, or ``machine_calibration=``), the search folds it
        in (docs/semantics.md, "The machine model"): the engine's cost per task, per hand-off and per period,
        and the free cores as a core pool. It is one model for the whole call: the searchers' scores, the
        report's figures and the verification's predictions. To search with the costs as given, pass a model
        without it (``dataclasses.replace(costs, machine_calibration=None)``).
    constraints : Constraints, optional
        What the plan may be: depth, threads, streams, frozen choices, device, memory cap (default
        ``Constraints()``).
    solver : SolverOptions, optional
        How the search runs: time budget and its split, seed, method, searchers' settings (default
        ``SolverOptions()``).
    seeds : list of PipelinePlan (or of (label, plan)), optional
        Known plans over the same tasks and dependencies (e.g. TorchRec's), scored beside the search's own and
        verified with them (:mod:`autosched.search.seeds`).
    verify : None, bool, int or VerifyOptions
        Run the top candidates, the input plan and the serial plan on the engine in interleaved rounds and
        return the one measured fastest (:mod:`autosched.verify.loop`); ``None`` (default): on when the tasks
        are runnable and ``batches`` are given; an int is the number of rounds.
    batches : sequence, optional
        Batches for the verification runs: with them the candidates are measured on the engine, and
        ``report.measured_period_s`` is the chosen plan's measured period (``report.verify`` the table of every
        plan measured); ``report.period_s`` stays the model's. The tasks really run on them: pass ``state`` to
        have the model put back afterwards (the report counts the iterations either way).
    state : modules, optimizers, or a list of them, optional
        What the tasks train. With ``batches``, restored exactly after the call ran the tasks (parameters,
        buffers, gradients, optimizer state, random generators: :func:`swpipe_core.measure.state.restore_state`);
        without it a ``RuntimeWarning`` says how many iterations trained the model. With ``batches`` on CUDA,
        one serial iteration says which tasks free gradients others make, and the plan keeps each freer on its
        makers' stream (:mod:`autosched.search.gradstreams`).

    Returns
    -------
    (PipelinePlan, SearchReport)
        The plan (validated; ``enqueue_order`` set, with the hand-offs the search placed; ``caller_group`` the
        group it runs on the caller's thread, None when every group has a worker: docs/semantics.md, "The
        caller's group") and the report.

    Raises
    ------
    OptionError
        A keyword ``auto_schedule`` does not take: ``.field`` names it, ``.home`` the options class it belongs to
        and ``.argument`` the argument that takes that class (``max_depth=2`` belongs to ``Constraints``, passed
        as ``constraints=``); or ``constraints``, ``solver`` or ``verify`` of another type. An ``OptionError`` is
        a ``TypeError``.
    CostModelError
        A task has no cost.
    ValueError
        Bad input (dependency cycle, unknown task in constraints, impossible caps, ``batches`` with tasks that
        have no function).
    RuntimeError
        No plan satisfies the constraints.

    Examples
    --------
    >>> from swpipe import Constraints, CostModel, SolverOptions, TaskCost
    >>> costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    >>> plan, report = auto_schedule((["Load", "Step"], [("Step", "Load")]), costs,
    ...                              Constraints(max_depth=2, max_threads=2), solver=SolverOptions(time_limit_s=10))
    >>> plan.stage("Load"), plan.stage("Step"), round(report.period_s * 1e3, 3), report.status
    (0, 1, 3.0, 'OPTIMAL')

    A machine measured with one free core runs the two tasks one after the other, whatever the plan
    (``MachineCalibration`` is the engine's measurement of the machine, ``swpipe_core.measure.calibrate``:
    ``TaskProfiler(pipe, calibrate=True)`` makes one; not a name of ``swpipe``):

    >>> from swpipe_core.measure.calibrate import MachineCalibration   # the measured machine: advanced, not public
    >>> one_core = CostModel(costs.tasks, machine_calibration=MachineCalibration(cores_free=1.0, cpu_count=2))
    >>> plan, report = auto_schedule((["Load", "Step"], [("Step", "Load")]), one_core,
    ...                              Constraints(max_depth=2, max_threads=2), solver=SolverOptions(time_limit_s=10))
    >>> round(report.period_s * 1e3, 3), report.notes[0]
    (5.0, 'searched with the machine calibration folded in: engine costs per task, per hand-off and per period, 1 free core(s)')

    An option given to ``auto_schedule`` itself names its home:

    >>> auto_schedule((["Load", "Step"], [("Step", "Load")]), costs, max_depth=2)
    Traceback (most recent call last):
    ...
    swpipe_core.engine.options.OptionError: auto_schedule(max_depth=2): max_depth is a plan constraint; pass auto_schedule(..., constraints=Constraints(max_depth=2))
    """
    constraints, solver = _checked(constraints, solver, verify, seeds, batches)
    costs = as_cost_model(costs)
    graph, inferred = _graph_of(tasks_or_graph)
    if constraints.max_memory_bytes is not None:  # one search per depth cap, the fastest plan that fits
        from autosched.search.memcap import cap_search, fastest_under_cap

        under = cap_search(graph, costs, constraints, solver)
        searched = [auto_schedule(graph, costs, under.constraints_at(d), under.solver) for d in under.depths]
        return _finished(fastest_under_cap(under, searched, costs, solver.num_iterations), inferred, 0, False)
    started = time.perf_counter()
    with _restoring(state, batches) as restored:
        # 1. the problem: tasks, dependencies, what may be chosen, the costs with the machine model folded in
        problem = searched_problem(graph, costs, constraints, solver)
        # 2. the searchers: beam search, then CP-SAT on small graphs (hinted by the beam), then the seed plans
        found = run_searchers(problem, solver, seeds, solver.time_limit_s, started)
        # 3. repair and judge: each gradient freer on its makers' stream (CUDA), then the plan simulated, bounded,
        #    explained (every figure of the report is of the repaired plan)
        traffic, unchecked = record_for(found.plan, constraints, state, batches)
        repaired = guard_found(found, traffic)
        repaired.notes.extend(unchecked + frozen_overrides(constraints, found.plan, repaired.plan))
        report = assess(problem, solver, repaired, started)
        # 4. verify: the candidates measured on the engine, the fastest kept; the core pool refitted to the
        #    measurements and, if it moved, one more search measured beside the choice
        if verify_loop.wanted(verify, problem, batches):
            _, report = verify_loop.verify_search(report, repaired.pool, problem, batches, verify,
                                                  solver.num_iterations)
            report = refit_round(problem, solver, seeds, report, batches, verify, traffic)
        if traffic is not None and repair_plan(report.plan, traffic)[0] is not report.plan:
            report.notes.append("the plan measured fastest (a known plan, kept as given) frees gradients on another "
                                "stream than the one that made them: run it with SWPipeline(plan, state=[model, "
                                "optimizer]) so the engine keeps them alive")
    return _finished((report.plan, report), inferred, _iterations_run(report), restored[0])


def refit_round(problem: Problem, solver: SolverOptions, seeds: Optional[Sequence[Seed]], report: SearchReport,
                batches: Sequence[Any], verify: Verify, grads: Optional["GradTraffic"] = None) -> SearchReport:
    """Refit the core pool to the measurements (:mod:`autosched.verify.refit`) and, if it moved, search once more.

    The new search's plan is measured against the verified choice (and the serial plan) in fresh interleaved
    rounds and returned only if measured faster; either way the report's verification table says what happened.

    Parameters
    ----------
    problem : Problem
        The problem of the first search (its costs and machine calibration); made again with the refitted pool.
    solver : SolverOptions
        The new search takes half of ``time_limit_s``.
    seeds, batches, verify
        As for :func:`auto_schedule`.
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
    from autosched.verify.candidates import plan_key
    from autosched.verify.refit import fit_core_pool

    table = report.verify
    fit = fit_core_pool(table, problem.costs, solver.num_iterations, problem.device, problem.calibration)
    if fit is None:
        return report
    table.notes.append(f"refit: {fit.describe()}")
    if not fit.changed:
        return report
    started = time.perf_counter()
    refitted = problem.remade(fit.applied_to(problem.costs))
    # a second look, hinted by what is known: half the first search's time
    found = guard_found(run_searchers(refitted, solver, seeds, solver.time_limit_s / 2, started), grads)
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
    if found.period >= chosen_s - refitted.unit_s:
        table.notes.append(f"refit: with {fit.cores} core(s) the search's best plan simulates at "
                           f"{fmt_ms(found.period)}, no faster than {chosen.label} ({fmt_ms(chosen_s)}); the choice "
                           "stands")
        return report
    return verify_loop.measure_refit(report, chosen, found.plan, refitted, batches, verify, solver.num_iterations)


def _checked(constraints: Optional[Constraints], solver: Optional[SolverOptions], verify: Verify,
             seeds: Optional[Sequence[Seed]], batches: Optional[Sequence[Any]]) -> Tuple[Constraints, SolverOptions]:
    """The options, their defaults made here once; an :class:`OptionError` naming the argument for another type."""
    homes = {Constraints: "constraints", SolverOptions: "solver", verify_loop.VerifyOptions: "verify"}
    for argument, value, expected in (("constraints", constraints, Constraints), ("solver", solver, SolverOptions)):
        if value is not None and not isinstance(value, expected):
            hint = f"; pass a {type(value).__name__} as {homes[type(value)]}=" if type(value) in homes else ""
            raise OptionError("auto_schedule", argument, value, home=expected.__name__, argument=argument,
                              expected=f"a {expected.__name__} or None",
                              message=f"auto_schedule({argument}=...): expected a {expected.__name__} or None, got "
                                      f"{type(value).__name__} {value!r}{hint}")
    if verify is not None and not isinstance(verify, (bool, int, verify_loop.VerifyOptions)):
        raise OptionError("auto_schedule", "verify", verify, home="VerifyOptions", argument="verify",
                          expected="None, True/False, a number of rounds or a VerifyOptions",
                          message=f"auto_schedule(verify=...): expected None, True/False, a number of rounds or a "
                                  f"VerifyOptions, got {type(verify).__name__} {verify!r}")
    constraints = constraints if constraints is not None else Constraints()
    if constraints.max_memory_bytes is not None and (seeds or verify or batches is not None):
        raise ValueError("max_memory_bytes: the search under a memory cap ranks plans by the simulator only; "
                         "seeds, verify and batches are not supported with it yet - drop them, or drop the cap "
                         "and check the report's peak_bytes")
    return constraints, solver if solver is not None else SolverOptions()


def _graph_of(tasks_or_graph: Union[GraphInput, "InferredDeps"]) -> Tuple[GraphInput, Optional["InferredDeps"]]:
    """The graph to search, and the recorded dependencies when the input is :func:`swpipe.infer_plan`'s result."""
    infer = sys.modules.get("swpipe_core.dataflow.infer")  # an InferredDeps exists only once its module is loaded
    if infer is not None and isinstance(tasks_or_graph, infer.InferredDeps):
        inferred = tasks_or_graph
        return (inferred.plan.tasks, inferred.intra, inferred.inter), inferred
    return tasks_or_graph, None


@contextlib.contextmanager
def _restoring(state: Any, batches: Optional[Sequence[Any]]) -> Iterator[List[bool]]:
    """``state`` snapshot before the block and restored after it, when the tasks will run (``batches``); yields
    ``[restored]``, true once it was."""
    restored = [False]
    if state is None or batches is None:
        yield restored
        return
    from swpipe_core.measure.state import restore_state, snapshot_state  # torch: imported only when there is state

    snapshot = snapshot_state(state)
    try:
        yield restored
    finally:
        restore_state(state, snapshot)
        restored[0] = True


def _iterations_run(report: SearchReport) -> int:
    """Iterations of the user's tasks the call ran: every verification table's runs."""
    n, table = 0, report.verify
    while table is not None:
        n += table.iterations_run
        table = table.earlier
    return n


def _finished(result: Tuple[PipelinePlan, SearchReport], inferred: Optional["InferredDeps"], ran: int,
              restored: bool) -> Tuple[PipelinePlan, SearchReport]:
    """The plan with its enqueue order written out (a seed or the serial plan may leave it to the engine), and the
    report with what the call ran and, for inferred dependencies, which of them the plan honours."""
    plan, report = result
    if plan.enqueue_order is None:
        plan = plan.replace(enqueue_order=enqueue_order(plan), pipeline_depth=plan.pipeline_depth)
    notes = list(report.notes)
    if inferred is not None:
        declared = set(plan.intra_edges()) | set(plan.inter_edges())
        kinds: Dict[Tuple[str, ...], str] = {}
        for hazard in inferred.hazards:
            kinds.setdefault(hazard.edge, f"{hazard.kind} {hazard.what(2)}")
        for edge in inferred.intra + inferred.inter:
            honoured = "honoured" if edge in declared else "NOT declared by the plan"
            notes.append(f"inferred {edge!r} {honoured} ({kinds.get(edge, 'implied')})")
        notes += [f"dataflow: {n}" for n in inferred.notes]
    report = dataclasses.replace(report, plan=plan, notes=notes, iterations_run=ran, state_restored=restored,
                                 inferred=inferred)
    if ran and not restored:
        warnings.warn(f"auto_schedule ran your tasks {ran} iterations on batches=: they trained your model (pass "
                      "state=[model, optimizer] to have it restored)", RuntimeWarning,
                      stacklevel=4)  # the caller of auto_schedule (past naming_homes' wrapper)
    return plan, report
