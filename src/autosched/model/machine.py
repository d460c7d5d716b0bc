"""The machine model: a machine calibration folded into what the simulator already models.

:mod:`swpipe_core.measure.calibrate` measures what the engine and the machine add to
the tasks' own costs. The simulator is not rewritten for it; the calibration
is folded into its existing inputs, and every figure of one ``auto_schedule``
call (the search's ranking, the report, the verification's predictions)
comes from this one model (docs/semantics.md, "The machine model"):

* per task: ``task_s`` added to every task's host time (spent on the task's
  thread, serialised with the task);
* per hand-off: ``dep_s`` added to the host time of the waiting task, once
  per dependency whose producer is on another thread group of the plan (the
  wake-up happens on the waiting thread);
* per period: ``period_s`` as the simulator's ``period_overhead_s``
  (main-thread time per enqueued period, serialised with the barrier);
* free cores: the cost model's core pool (``CostModel.cores``) is the
  measured ``cores_free`` rounded to the nearest integer, at least 1
  (:func:`autosched.model.taskmodel.core_capacity`): at most that many host parts
  run at once, on CPU and on CUDA; a task whose measured CPU share
  (``MachineCalibration.cpu``) is below ``cpu_threshold`` (it sleeps or
  blocks) gets the tag ``"nocore"`` and takes no core.

Approximated: a fractional ``cores_free`` becomes a whole pool (1.71 is 2
cores, 1.2 is 1) and a host part keeps its core until it ends (the OS
time-slices); the main thread's per-period time takes no core; a task on a
CPU for part of its time takes a core for all of it or for none (rounded at
``cpu_threshold``); the per-hand-off cost is averaged over hand-offs and
taken under the load at calibration time. :func:`parallelism_note` says in
one line when threads must share a core.

Left out: the interpreter lock (GIL) and the scheduler's wake-up latency.
Both depend on the host; measured side by side on the demo's DLRM plans,
modelling them (GIL tags, a mean-field shared lock, per-plan wake-ups) did
not bring the predictions nearer the measurements (docs/results.md, "The
machine model"). A task tagged ``"gil"`` by hand still holds the
simulator's GIL resource.

Without a plan (the search scores many plans with one cost model),
:func:`calibrated_costs` folds the per-task cost and the core pool
(:func:`searched_costs`); :func:`autosched.model.simulate.simulate` adds the
plan's hand-offs (:func:`with_handoffs`) and the per-period time when it
simulates a plan: one model, whoever simulates. This module holds the fold
and imports no simulator (the simulator imports it).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Dict, Optional

from swpipe_core.plan import PipelinePlan

from autosched.model.costs import CostModel, TaskCost  # noqa: F401 - TaskCost: the examples use it
from autosched.model.taskmodel import NOCORE, core_capacity

if TYPE_CHECKING:  # for the annotations only (the engine's measuring modules are imported where they are used)
    from swpipe_core.measure.calibrate import MachineCalibration
    from swpipe_core.measure.result import ProfileResult


__all__ = ["calibrated_costs", "searched_costs", "with_handoffs", "serial_iteration_s", "parallelism_note",
           "format_profile"]


def _calibration(costs: CostModel, calibration: Optional[MachineCalibration]) -> MachineCalibration:
    cal = calibration if calibration is not None else getattr(costs, "machine_calibration", None)
    if cal is None:
        raise ValueError("no machine calibration: pass calibration=swpipe_core.measure.calibrate.calibrate(...) or "
                         "use a cost model with a machine_calibration section "
                         "(TaskProfiler(pipe, calibrate=True).profile(batch))")
    return cal


def _cross_deps(plan: PipelinePlan) -> Dict[str, int]:
    """Per task, how many of its dependencies are produced on another thread group."""
    out = {n: 0 for n in plan.task_names}
    edges = [(t, d) for t, d in plan.intra_edges()] + [(t, d) for t, d, _ in plan.inter_edges()]
    for t, d in set(edges):
        if plan.sched(t).thread_group != plan.sched(d).thread_group:
            out[t] += 1
    return out


def calibrated_costs(costs: CostModel, plan: Optional[PipelinePlan] = None,
                     calibration: Optional[MachineCalibration] = None, *, device: str = "cpu",
                     core_pool: bool = True, cpu_threshold: float = 0.5) -> CostModel:
    """The cost model with the machine's engine costs and core pool folded in.

    Parameters
    ----------
    costs : CostModel
        The tasks' own costs (e.g. ``CostModel.from_profile``).
    plan : PipelinePlan, optional
        Fold the per-hand-off cost for this plan's thread groups too (:func:`with_handoffs`).
    calibration : MachineCalibration, optional
        Default: ``costs.machine_calibration``.
    device : {"cpu", "cuda"}
        The same fold on both (kept for the callers that pass it).
    core_pool : bool
        Set ``cores`` to :func:`~autosched.model.taskmodel.core_capacity` of the measured
        ``cores_free`` (on either device) and tag ``"nocore"`` the tasks measured off
        the CPU; False keeps ``costs.cores`` and the tags as they are.
    cpu_threshold : float
        CPU share (``MachineCalibration.cpu``) below which a task is tagged ``"nocore"``.

    Returns
    -------
    CostModel
        The folded model. It carries no ``machine_calibration`` (its numbers
        hold it), so ``auto_schedule`` or a second fold does not add it again.

    Raises
    ------
    ValueError
        No calibration given or attached.

    Examples
    --------
    >>> from swpipe_core.measure.calibrate import MachineCalibration   # the measured machine: advanced, not public
    >>> from swpipe import TaskSchedule
    >>> cal = MachineCalibration(task_s=1e-5, dep_s=2e-5)
    >>> costs = CostModel({"A": TaskCost(1e-3), "B": TaskCost(2e-3)})
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(1, thread_group="y")},
    ...                     intra_iter_deps=[("B", "A")])
    >>> got = calibrated_costs(costs, plan, cal)
    >>> round(got["A"].host_s, 6), round(got["B"].host_s, 6), got["B"].resources, got.cores
    (0.00101, 0.00203, (), 1)
    >>> calibrated_costs(costs, calibration=MachineCalibration(cores_free=1.71, cpu_count=2)).cores
    2
    >>> calibrated_costs(costs, calibration=MachineCalibration(cpu={"A": 0.02, "B": 0.97}))["A"].resources
    ('nocore',)
    """
    cal = _calibration(costs, calibration)
    tasks = {}
    for name, c in costs.tasks.items():
        res = tuple(c.resources)
        if core_pool and cal.cpu.get(name, 1.0) < cpu_threshold and NOCORE not in res:
            res = res + (NOCORE,)
        tasks[name] = dataclasses.replace(c, host_s=c.host_s + cal.task_s, resources=res)  # bytes kept
    how = "engine costs per task"
    cores = core_capacity(cal.cores_free) if core_pool else costs.cores
    if core_pool:
        off = sum(NOCORE in t.resources for t in tasks.values())
        how += f", {cores} free core(s)" + (f" ({off} task(s) off the CPU)" if off else "")
    # the calibration is now in the numbers: the folded model carries none, so nothing folds it twice
    folded = dataclasses.replace(costs, tasks=tasks, notes=f"{costs.notes}; calibrated: {how}".lstrip("; "),
                                 machine_calibration=None, cores=cores)
    return folded if plan is None else with_handoffs(folded, plan, cal.dep_s)


def with_handoffs(costs: CostModel, plan: PipelinePlan, handoff_s: float) -> CostModel:
    """``costs`` with ``handoff_s`` added to a task's host time per dependency it waits for across threads.

    The plan-dependent term of the machine model: a hand-off wakes the waiting
    thread, which pays for it. ``handoff_s = 0`` returns ``costs`` as it is.

    Examples
    --------
    >>> from swpipe import TaskSchedule
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(1, thread_group="y")},
    ...                     intra_iter_deps=[("B", "A")])
    >>> got = with_handoffs(CostModel({"A": TaskCost(1e-3), "B": TaskCost(2e-3)}), plan, 5e-5)
    >>> round(got["A"].host_s * 1e3, 6), round(got["B"].host_s * 1e3, 6)
    (1.0, 2.05)
    """
    if not handoff_s:
        return costs
    cross = _cross_deps(plan)
    tasks = {name: dataclasses.replace(c, host_s=c.host_s + cross.get(name, 0) * handoff_s) if cross.get(name)
             else c for name, c in costs.tasks.items()}
    return dataclasses.replace(costs, tasks=tasks)


def searched_costs(costs: CostModel, device: str = "cpu") -> CostModel:
    """The costs ``auto_schedule(..., calibrated=True)`` searches with: the calibration folded in, plan-free.

    A model without a ``machine_calibration`` is returned as it is.

    Examples
    --------
    >>> from swpipe_core.measure.calibrate import MachineCalibration   # the measured machine: advanced, not public
    >>> costs = CostModel({"A": TaskCost(1e-3)}, machine_calibration=MachineCalibration(task_s=1e-5))
    >>> round(searched_costs(costs)["A"].host_s * 1e3, 6), searched_costs(costs).machine_calibration is None
    (1.01, True)
    >>> plain = CostModel({"A": TaskCost(1e-3)})
    >>> searched_costs(plain) is plain
    True
    """
    if costs.machine_calibration is None:
        return costs
    return calibrated_costs(costs, None, device=device)


def serial_iteration_s(costs: CostModel, calibration: Optional[MachineCalibration] = None) -> float:
    """The serial iteration the model predicts: the tasks' times plus the engine's serial costs.

    This is what the profiler's baseline measures (``run_one_serial_iter``),
    so ``serial_iteration_s(CostModel.from_profile(result))`` should match
    ``result.baseline_s``.

    Examples
    --------
    >>> from swpipe_core.measure.calibrate import MachineCalibration   # the measured machine: advanced, not public
    >>> cal = MachineCalibration(serial_task_s=1e-5, serial_iter_s=3e-5)
    >>> round(serial_iteration_s(CostModel({"A": TaskCost(1e-3), "B": TaskCost(2e-3)}), cal) * 1e6, 3)
    3050.0
    """
    cal = _calibration(costs, calibration)
    return sum(c.cpu_s for c in costs.tasks.values()) + len(costs.tasks) * cal.serial_task_s + cal.serial_iter_s


def parallelism_note(plan: PipelinePlan, costs: CostModel,
                     calibration: Optional[MachineCalibration] = None) -> Optional[str]:
    """One line when the measured free cores cannot run this plan's threads in parallel, else None.

    Examples
    --------
    >>> from swpipe_core.measure.calibrate import MachineCalibration   # the measured machine: advanced, not public
    >>> from swpipe import TaskSchedule
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="y")})
    >>> print(parallelism_note(plan, CostModel({"A": TaskCost(1e-3), "B": TaskCost(1e-3)}),
    ...                        MachineCalibration(cores_free=1.1, cpu_count=2)))
    the machine is the limit: 2 thread groups but 1.10 of 2 cores free now (measured); threads will share a core
    """
    cal = _calibration(costs, calibration)
    groups = plan.thread_groups
    if len(groups) > 1 and core_capacity(cal.cores_free) < 2:
        return (f"the machine is the limit: {len(groups)} thread groups but {cal.cores_free:.2f} of {cal.cpu_count} "
                "cores free now (measured); threads will share a core")
    return None


def format_profile(result: ProfileResult, costs: Optional[CostModel] = None) -> str:
    """The profile as the model sees it: host, device and exposed time per task, and the model's serial sum.

    The last lines compare the model's serial iteration (:func:`serial_iteration_s`:
    task times plus the engine's measured serial costs) with the measured
    baseline, so profile and cost model can be seen to agree.

    Parameters
    ----------
    result : ProfileResult
    costs : CostModel, optional
        Default ``CostModel.from_profile(result)``.

    Returns
    -------
    str

    Examples
    --------
    >>> from swpipe import ProfileResult
    >>> from swpipe_core.measure.calibrate import MachineCalibration   # the measured machine: advanced, not public
    >>> cal = MachineCalibration(serial_task_s=5e-5, serial_iter_s=1e-4).to_dict()
    >>> r = ProfileResult(0.0032, {"A": 0.001, "B": 0.002}, host_s={"A": 0.001, "B": 0.002},
    ...                   meta={"machine_calibration": cal})
    >>> print(format_profile(r).splitlines()[-1])
    model serial iteration 3.200 ms (tasks 3.000 + engine 0.200) vs measured 3.200 ms: -0.0%
    """
    costs = costs if costs is not None else CostModel.from_profile(result)
    width = max([8, *(len(n) for n in costs.tasks)])
    lines = [f"  {'task':<{width}} {'host':>9} {'device':>9} {'exposed':>9}"]
    for name, c in costs.tasks.items():
        exposed = result.exposed_s.get(name)
        exp = "-" if exposed is None else f"{exposed * 1e3:.3f}"
        lines.append(f"  {name:<{width}} {c.host_s * 1e3:>9.3f} {c.device_s * 1e3:>9.3f} {exp:>9}")
    tasks = sum(c.cpu_s for c in costs.tasks.values())
    base = result.baseline_s
    if getattr(costs, "machine_calibration", None) is None:
        lines.append(f"model serial iteration {tasks * 1e3:.3f} ms (tasks only; no machine calibration) vs measured "
                     f"{base * 1e3:.3f} ms: {100 * (tasks / base - 1):+.1f}%" if base > 0 else "")
        return "\n".join(lines)
    total = serial_iteration_s(costs)
    err = 100 * (total / base - 1) if base > 0 else 0.0  # printed with its sign, rounding may show -0.0
    lines.append(f"model serial iteration {total * 1e3:.3f} ms (tasks {tasks * 1e3:.3f} + engine "
                 f"{(total - tasks) * 1e3:.3f}) vs measured {base * 1e3:.3f} ms: {err:+.1f}%")
    return "\n".join(lines)
