"""``auto_schedule``: the best PipelinePlan for a task graph and a cost model, and why it is best (the entry point).

The search space is stage x thread group x stream x enqueue order, and the
group run inline on the caller's thread with where its hand-offs go (see
:mod:`autosched.search.problem`). Two searchers cover it:

* :mod:`autosched.search.beam` — beam search with stages derived by modulo list
  scheduling, scored by the simulator; any size;
* :mod:`autosched.search.cpsat` — the exact joint CP-SAT model, for graphs up to
  ``SolverOptions.cpsat_max_tasks`` tasks, hinted by the beam's best plan; it
  proves the minimum period of its model (``OPTIMAL``) or reports the gap.

Whatever the searchers say, the returned plan is the one with the best
*simulated* period (the simulator models the engine: progress barrier, FIFO
thread queues, sequencer, the caller's group and its hand-offs), it passes
``validate`` and never deadlocks. It carries the caller's group the search
chose (``caller_group``; None when every group has a worker) and the
enqueue order that places its hand-offs. When
the input is a plan (e.g. a hand-written TorchRec pipeline) that plan, as
given, is a candidate too, so the result is never worse than it.

The entry point checks the inputs' types and normalises them (the defaults of the options are made here, once), puts the user's state back after the tasks ran,
and dispatches: a search over inferred dependencies (:mod:`autosched.search.inferred`), a search
under a memory cap (:mod:`autosched.search.memcap`), or one plan search
(:mod:`autosched.search.core`); the first two call the core search in turn, never this module.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan

from autosched.model.costs import as_cost_model
from autosched.search.core import search_plan
from autosched.search.inferred import auto_schedule_inferred
from autosched.search.memcap import schedule_under_cap
from autosched.search.options import Constraints, OptionError, SolverOptions
from autosched.search.report import SearchReport

__all__ = ["auto_schedule"]


def auto_schedule(tasks_or_graph: Any, costs: Any, constraints: Optional[Constraints] = None, *,
                  solver: Optional[SolverOptions] = None, seeds: Optional[Sequence[Any]] = None, verify: Any = None,
                  batches: Optional[Sequence[Any]] = None, deps: Optional[str] = None,
                  state: Any = None, calibrated: bool = True) -> Tuple[PipelinePlan, SearchReport]:
    """Search the best plan: stages, thread groups, streams and enqueue order, jointly.

    Parameters
    ----------
    tasks_or_graph : networkx.DiGraph, PipelinePlan or tuple
        A task graph from ``autosched.model.graph.task_graph(tasks, intra, inter)``
        (edges ``dep -> task`` with ``distance`` 0 or N); a plan (its tasks and
        dependencies, its schedule as a starting point and a baseline, its
        ``caller_group`` the name a group run on the caller's thread takes, or
        None: every group on a worker); or
        ``(tasks, intra_deps[, inter_deps])`` with ``(task, dep)`` /
        ``(task, dep, N)`` pairs. ``PipelineTask`` objects keep their
        functions, so the returned plan runs as is.
    costs : CostModel
        A cost for every task (``host_s``, ``device_s``, ``comm:``/``pcie`` tags).
    constraints : Constraints, optional
        What the plan may be: depth, threads, streams, frozen choices, device, memory cap
        (default ``Constraints()``).
    solver : SolverOptions, optional
        How the search runs: time budget, seed, method, searchers' settings
        (default ``SolverOptions()``).
    seeds : list of PipelinePlan (or of (label, plan)), optional
        Known plans over the same tasks and dependencies (e.g. TorchRec's),
        scored beside the search's own and verified with them
        (:mod:`autosched.search.seeds`).
    verify : None, bool, int or autosched.verify.loop.VerifyOptions
        Run the top candidates, the input plan and the serial plan on the
        engine in interleaved rounds and return the one measured fastest
        (:mod:`autosched.verify.loop`); ``None`` (default): on when the tasks are
        runnable and ``batches`` are given; an int is the number of rounds.
    batches : sequence, optional
        Batches for the verification runs (and, with ``deps="infer"``, for
        recording the tasks' dataflow): with them the candidates are measured
        on the engine and every figure the report gives is the measured one.
        The tasks really run on them: pass ``state`` to have the model put
        back afterwards (the report counts the iterations either way).
    deps : {None, "infer"}
        ``"infer"``: ignore declared dependencies and infer them from a run of
        the bound tasks on ``batches`` (``state`` names the model's tensors);
        the report's notes list the inferred edges the plan honours
        (:mod:`autosched.search.inferred`).
    state : modules, optimizers, or a list of them, optional
        What the tasks train. With ``batches``, restored exactly after the
        call ran the tasks (parameters, buffers, gradients, optimizer state,
        random generators: :func:`swpipe_core.measure.state.restore_state`); without
        it a ``RuntimeWarning`` says how many iterations trained the model.
        With ``deps="infer"`` also the tensors the recorder names
        (:func:`swpipe_core.dataflow.record_dataflow`). With ``batches`` on
        CUDA, one serial iteration says which tasks free gradients others
        make, and the plan keeps each freer on its makers' stream
        (:mod:`autosched.search.gradstreams`).
    calibrated : bool
        When ``costs`` carries a machine calibration
        (``TaskProfiler.profile(calibrate=True)``, or ``machine_calibration=``),
        search with the machine model folded in (:mod:`autosched.model.machine`,
        docs/semantics.md "The machine model"): the engine's cost per task,
        per hand-off and per period, and the free cores as a core pool (the
        tasks measured off the CPU take none). It is one model for the whole
        call: the searchers' simulator scores, the report's figures and the
        verification's predictions all come from it
        (:meth:`autosched.search.problem.Problem.simulate`). False: the tasks'
        costs as given.

    Returns
    -------
    (PipelinePlan, SearchReport)
        The plan (validated; ``enqueue_order`` set, with the hand-offs the
        search placed; ``caller_group`` the group it runs on the caller's
        thread, None when every group has a worker: docs/semantics.md, "The
        caller's group") and the report.

    Raises
    ------
    TypeError
        ``constraints``, ``solver`` or ``verify`` of another type (the message names the argument and the type
        it takes).
    CostModelError
        A task has no cost.
    ValueError
        Bad input (dependency cycle, unknown task in constraints, impossible caps, ``batches`` with
        tasks that have no function).
    RuntimeError
        No plan satisfies the constraints.

    Examples
    --------
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    >>> plan, report = auto_schedule((["Load", "Step"], [("Step", "Load")]), costs,
    ...                              Constraints(max_depth=2, max_threads=2), solver=SolverOptions(time_limit_s=10))
    >>> plan.stage("Load"), plan.stage("Step"), round(report.period_s * 1e3, 3), report.status
    (0, 1, 3.0, 'OPTIMAL')

    A machine measured with one free core runs the two tasks one after the other, whatever the plan:

    >>> from swpipe_core.measure.calibrate import MachineCalibration
    >>> one_core = CostModel(costs.tasks, machine_calibration=MachineCalibration(cores_free=1.0, cpu_count=2))
    >>> plan, report = auto_schedule((["Load", "Step"], [("Step", "Load")]), one_core,
    ...                              Constraints(max_depth=2, max_threads=2), solver=SolverOptions(time_limit_s=10))
    >>> round(report.period_s * 1e3, 3), report.notes[0]
    (5.0, 'searched with the machine calibration folded in: engine costs per task, per hand-off and per period, 1 free core(s)')
    """
    _check_types(constraints, solver, verify)
    snapshot = None
    if state is not None and batches is not None:
        from swpipe_core.measure.state import snapshot_state  # torch: imported only when there is state

        snapshot = snapshot_state(state)
    try:
        plan, report = _dispatch(tasks_or_graph, costs, constraints, solver, seeds=seeds, verify=verify,
                                 batches=batches, deps=deps, state=state, calibrated=calibrated)
    finally:
        if snapshot is not None:
            from swpipe_core.measure.state import restore_state

            restore_state(state, snapshot)
    ran = _iterations_run(report, batches if deps == "infer" else None)
    report = dataclasses.replace(report, iterations_run=ran, state_restored=snapshot is not None)
    if ran and snapshot is None:
        warnings.warn(f"auto_schedule ran your tasks {ran} iterations on batches=: they trained your model (pass "
                      "state=[model, optimizer] to have it restored)", RuntimeWarning, stacklevel=2)
    return plan, report


def _iterations_run(report: SearchReport, recorded: Optional[Sequence[Any]]) -> int:
    """Iterations of the user's tasks a call ran: every verification table's runs, and a dataflow recording."""
    n = len(recorded) if isinstance(recorded, Sequence) else 0
    table = report.verify
    while table is not None:
        n += table.iterations_run
        table = table.earlier
    return n


def _check_types(constraints: Any, solver: Any, verify: Any) -> None:
    """A ``TypeError`` naming the argument and the type it takes, for options of another type."""
    from autosched.verify.loop import VerifyOptions

    homes = {Constraints: "constraints", SolverOptions: "solver", VerifyOptions: "verify"}
    for argument, value, expected in (("constraints", constraints, Constraints), ("solver", solver, SolverOptions)):
        if value is not None and not isinstance(value, expected):
            hint = f"; pass a {type(value).__name__} as {homes[type(value)]}=" if type(value) in homes else ""
            raise OptionError(f"auto_schedule({argument}=...): expected a {expected.__name__} or None, got "
                              f"{type(value).__name__} {value!r}{hint}", owner="auto_schedule", fields=[argument],
                              value=value, expected=expected.__name__, home=homes.get(type(value), ""))
    if verify is not None and not isinstance(verify, (bool, int, VerifyOptions)):
        raise OptionError(f"auto_schedule(verify=...): expected None, True/False, a number of rounds or a "
                          f"VerifyOptions, got {type(verify).__name__} {verify!r}", owner="auto_schedule",
                          fields=["verify"], value=verify, expected="VerifyOptions")


def _dispatch(tasks_or_graph: Any, costs: Any, constraints: Optional[Constraints], solver: Optional[SolverOptions],
              *, seeds: Any, verify: Any, batches: Optional[Sequence[Any]], deps: Optional[str], state: Any,
              calibrated: bool) -> Tuple[PipelinePlan, SearchReport]:
    """:func:`auto_schedule` without the type checks and the snapshot of the user's state around it."""
    if deps is not None and deps != "infer":
        raise ValueError(f"deps must be None or 'infer', got {deps!r}")
    # the options' defaults, made here once: everything below takes both
    c = constraints if constraints is not None else Constraints()
    s = solver if solver is not None else SolverOptions()
    costs = as_cost_model(costs)
    if not calibrated and costs.machine_calibration is not None:
        costs = dataclasses.replace(costs, machine_calibration=None)
    if c.max_memory_bytes is not None and (seeds or verify or batches is not None):
        raise ValueError("max_memory_bytes: the search under a memory cap ranks plans by the simulator only; "
                         "seeds, verify and batches are not supported with it yet - drop them, or drop the cap "
                         "and check the report's peak_bytes")
    if deps == "infer":  # observed dependencies: record, infer, then search
        return auto_schedule_inferred(tasks_or_graph, costs, c, s, batches=batches, state=state, seeds=seeds,
                                      verify=verify)
    if c.max_memory_bytes is not None:  # one search per depth cap (each folds the calibration), the fastest that fits
        return schedule_under_cap(tasks_or_graph, costs, c, s)
    return search_plan(tasks_or_graph, costs, c, s, seeds=seeds, verify=verify, batches=batches, state=state)
