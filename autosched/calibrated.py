"""A calibrated cost model: the machine's measured costs folded into what the simulator already models.

:mod:`swpipe_core.calibrate` measures what the engine and the machine add to
the tasks' own costs. The simulator is not rewritten for it; the calibration
is folded into its existing inputs:

* **exactly modelled** (the simulator's own semantics, new inputs):

  - per task: ``task_s`` added to every task's host time (it is spent on the
    task's thread, serialised with the task);
  - per cross-thread dependency: a wake-up
    (:attr:`~swpipe_core.calibrate.MachineCalibration.wake_up_s`: ``dep_s``,
    or the plan's measured wait for a core after a wake-up, ``wake_s``, where
    larger) added to the host time of the waiting task, once per dependency
    whose producer is on another thread group in the given plan (the wake-up
    happens on the waiting thread);
  - per period: ``period_s`` as the simulator's ``period_overhead_s``
    (main-thread time per enqueued period, serialised with the barrier);
  - per wake-up of an idle worker by the enqueue: the plan's measured
    ``wake_s``, where measured, as the simulator's ``wake_overhead_s``;
  - GIL: a task whose measured GIL share is ``>= gil_threshold`` gets the
    resource tag ``"gil"``: GIL tasks run one at a time, whatever thread;
  - cores: the cost model's core pool (``CostModel.cores``) is the measured
    ``cores_free`` rounded to the nearest integer, at least 1
    (:func:`autosched.taskmodel.core_capacity`): at most that many host parts
    run at once, on CPU and on CUDA (docs/semantics.md); a task whose measured
    CPU share (``MachineCalibration.cpu``) is below ``cpu_threshold`` (it
    sleeps or blocks) gets the tag ``"nocore"`` and takes no core.

* **approximated**:

  - a task holding the GIL for part of its time is either all-GIL or
    GIL-free (rounded at ``gil_threshold``); the simulator has no split
    tasks. Exact for pure-Python (share ~1) and GIL-free tasks (sleep,
    most torch kernels, share ~0). ``simulate_calibrated(..., gil="shared")``
    serialises only the held share instead, in the mean field below: while
    the shares of the parts running at once sum to more than one, the parts
    holding the GIL are slowed by that sum (no jump at a threshold). Below
    full use it adds one wait per contended take-back: every torch call a task
    makes from Python (``MachineCalibration.calls``) takes the GIL back when its
    op returns, and while other threads hold the GIL for a share ``rho`` of the
    time that take-back waits for a wake-up, costed at the measured
    cross-thread wake-up (``wake_up_s``, as above); a task making ``c`` calls per
    second of its own work then runs ``1 + c * rho * wake_up_s`` times slower while
    it overlaps them (no free constant: ``c``, ``rho`` and the wake-up are all
    measured);
  - the GIL tag applies on CPU only (on CUDA the simulator holds resources
    during the device part);
  - cores: a fractional ``cores_free`` becomes a whole pool (1.71 is 2
    cores, 1.2 is 1), and a host part keeps its core until it ends (the OS
    time-slices); the main thread's per-period time takes no core; a task
    on a CPU for part of its time takes a core for all of it or for none
    (rounded at ``cpu_threshold``), like the GIL tag;
    :func:`parallelism_note` still says in one line when threads must share
    a core;
  - the per-dependency cost is averaged over hand-offs (the second worker's
    wake-up per period is counted in it) and taken under the load at
    calibration time;
  - shared cores (``simulate_calibrated(..., sharing=True)``): the OS shares
    ``cores_free`` cores' worth of CPU among the host parts running at once,
    so ``n`` of them each run ``max(1, n / cores_free)`` times slower (processor
    sharing). The simulator's durations are fixed when a part starts, so this
    is a mean field: simulate, take each task's time-averaged slowdown over
    the simulated overlaps, stretch its host time by it, simulate again, a
    few times (the pool is then ``ceil(cores_free)``, the most that overlap).

Without a plan (the search scores many plans with one cost model),
:func:`calibrated_costs` folds the per-task cost, the GIL tags and the core
pool only; the plan-dependent part is folded by :func:`simulate_calibrated`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Optional

from swpipe_core.plan import PipelinePlan

from .costs import CostModel, TaskCost
from .taskmodel import NOCORE, core_capacity

__all__ = ["calibrated_costs", "searched_costs", "simulate_calibrated", "serial_iteration_s", "parallelism_note",
           "format_profile"]


def _calibration(costs: CostModel, calibration: Any) -> Any:
    cal = calibration if calibration is not None else getattr(costs, "machine_calibration", None)
    if cal is None:
        raise ValueError("no machine calibration: pass calibration=swpipe_core.calibrate.calibrate(...) or use a "
                         "cost model with a machine_calibration section (TaskProfiler.profile(..., calibrate=True))")
    return cal


def _cross_deps(plan: PipelinePlan) -> Dict[str, int]:
    """Per task, how many of its dependencies are produced on another thread group."""
    out = {n: 0 for n in plan.task_names}
    edges = [(t, d) for t, d in plan.intra_edges()] + [(t, d) for t, d, _ in plan.inter_edges()]
    for t, d in set(edges):
        if plan.sched(t).thread_group != plan.sched(d).thread_group:
            out[t] += 1
    return out


def calibrated_costs(costs: CostModel, plan: Optional[PipelinePlan] = None, calibration: Any = None, *,
                     gil_threshold: float = 0.5, device: str = "cpu", core_pool: bool = True,
                     cpu_threshold: float = 0.5) -> CostModel:
    """The cost model with the machine's engine costs, GIL tags and core pool folded in.

    Parameters
    ----------
    costs : CostModel
        The tasks' own costs (e.g. ``CostModel.from_profile``).
    plan : PipelinePlan, optional
        Fold the per-dependency cost for this plan's thread groups too.
    calibration : MachineCalibration, optional
        Default: ``costs.machine_calibration``.
    gil_threshold : float
        GIL share from which a task is tagged ``"gil"``.
    device : {"cpu", "cuda"}
        GIL tags are added on CPU only.
    core_pool : bool
        Set ``cores`` to :func:`~autosched.taskmodel.core_capacity` of the measured
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
    >>> from swpipe_core.calibrate import MachineCalibration
    >>> from swpipe_core.plan import TaskSchedule
    >>> cal = MachineCalibration(task_s=1e-5, dep_s=2e-5, gil={"B": 0.9})
    >>> costs = CostModel({"A": TaskCost(1e-3), "B": TaskCost(2e-3)})
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(1, thread_group="y")},
    ...                     intra_iter_deps=[("B", "A")])
    >>> got = calibrated_costs(costs, plan, cal)
    >>> round(got["A"].host_s, 6), round(got["B"].host_s, 6), got["B"].resources, got.cores
    (0.00101, 0.00203, ('gil',), 1)
    >>> calibrated_costs(costs, calibration=MachineCalibration(cores_free=1.71, cpu_count=2)).cores
    2
    >>> calibrated_costs(costs, calibration=MachineCalibration(cpu={"A": 0.02, "B": 0.97}))["A"].resources
    ('nocore',)
    """
    cal = _calibration(costs, calibration)
    cross = _cross_deps(plan) if plan is not None else {}
    tasks = {}
    for name, c in costs.tasks.items():
        extra = cal.task_s + cross.get(name, 0) * cal.wake_up_s
        res = tuple(c.resources)
        if device == "cpu" and cal.gil.get(name, 0.0) >= gil_threshold and "gil" not in res:
            res = res + ("gil",)
        if core_pool and cal.cpu.get(name, 1.0) < cpu_threshold and NOCORE not in res:
            res = res + (NOCORE,)
        tasks[name] = dataclasses.replace(c, host_s=c.host_s + extra, resources=res)  # bytes kept
    how = "engine costs per task" + (" and per cross-thread dependency" if plan is not None else "") + ", GIL tags"
    cores = core_capacity(cal.cores_free) if core_pool else costs.cores
    if core_pool:
        off = sum(NOCORE in t.resources for t in tasks.values())
        how += f", {cores} free core(s)" + (f" ({off} task(s) off the CPU)" if off else "")
    # the calibration is now in the numbers: the folded model carries none, so nothing folds it twice
    return dataclasses.replace(costs, tasks=tasks, notes=f"{costs.notes}; calibrated: {how}".lstrip("; "),
                               machine_calibration=None, cores=cores)


def searched_costs(costs: CostModel, device: str = "cpu") -> CostModel:
    """The costs ``auto_schedule(..., calibrated=True)`` searches with: the calibration folded in, plan-free.

    A model without a ``machine_calibration`` is returned as it is.

    Examples
    --------
    >>> from swpipe_core.calibrate import MachineCalibration
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


def simulate_calibrated(plan: PipelinePlan, costs: CostModel, calibration: Any = None, *,
                        num_iterations: int = 50, device: str = "cpu", gil_threshold: float = 0.5,
                        core_pool: bool = True, sharing: bool = False, gil: str = "tag") -> Any:
    """Simulate a plan with the calibration folded in (per task, per dependency, per period, GIL, core pool).

    Parameters
    ----------
    plan : PipelinePlan
    costs : CostModel
        The tasks' own costs (without engine costs: they are added here).
    calibration : MachineCalibration, optional
        The costs' own when omitted. Its ``wake_s``, where measured, is each cross-thread
        wake-up (where above ``dep_s``) and an idle worker's wake-up at each enqueue.
    num_iterations : int
    device : {"cpu", "cuda"}
    gil_threshold, core_pool
        As in :func:`calibrated_costs`.
    sharing : bool
        Model the free cores as shared (module docstring): host parts that
        overlap slow each other down once more of them run than ``cores_free``.
    gil : {"tag", "shared"}
        ``"tag"``: a task whose GIL share is ``>= gil_threshold`` holds the
        GIL for all its host time (the simulator's ``"gil"`` resource).
        ``"shared"`` (CPU; implies ``sharing``): no tags; only each task's
        measured GIL-held share is serialised, in the mean field: while the
        shares of the host parts running at once sum to ``G > 1``, the parts
        that hold the GIL run ``G`` times slower; and a part whose task makes
        torch calls waits at each take-back while the other parts hold the
        GIL (module docstring).

    Returns
    -------
    SimResult

    Examples
    --------
    >>> from swpipe_core.calibrate import MachineCalibration
    >>> from swpipe_core.plan import TaskSchedule
    >>> cal = MachineCalibration(task_s=1e-4, period_s=5e-4)
    >>> plan = PipelinePlan({"A": TaskSchedule(0)})
    >>> round(simulate_calibrated(plan, CostModel({"A": TaskCost(1e-3)}), cal).period * 1e3, 6)
    1.6

    Two GIL-free 1 ms tasks on two threads share the one core measured free:

    >>> two = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="y")})
    >>> one_core = MachineCalibration(cores_free=1.1, cpu_count=2)
    >>> costs = CostModel({"A": TaskCost(1e-3), "B": TaskCost(1e-3)})
    >>> round(simulate_calibrated(two, costs, one_core).period * 1e3, 6)
    2.0
    >>> round(simulate_calibrated(two, costs, one_core, core_pool=False).period * 1e3, 6)
    1.0

    With 1.5 cores free and shared, the two run together, each at three quarters speed:

    >>> round(simulate_calibrated(two, costs, MachineCalibration(cores_free=1.5, cpu_count=2), sharing=True).period
    ...       * 1e3, 3)
    1.333

    Each holding the GIL for three quarters of its time: tagged, one waits for the other; shared, the
    GIL's 1.5 seconds of demand per second stretch both by 1.5:

    >>> held = MachineCalibration(cores_free=2.0, cpu_count=2, gil={"A": 0.75, "B": 0.75})
    >>> [round(simulate_calibrated(two, costs, held, gil=how).period * 1e3, 3) for how in ("tag", "shared")]
    [2.0, 1.5]

    ``A`` makes 10 torch calls a run (10 000 per second of its work) beside ``B``, pure Python: each of its
    take-backs waits one 20 us wake-up, so ``A`` runs 1.2 times slower while ``B`` runs, and ends after
    1 + 1/6 ms:

    >>> beside = MachineCalibration(cores_free=2.0, cpu_count=2, gil={"A": 0.0, "B": 1.0}, calls={"A": 10})
    >>> round(simulate_calibrated(two, costs, dataclasses.replace(beside, dep_s=2e-5), gil="shared").period * 1e3, 2)
    1.17
    """
    from .simulate import simulate

    if gil not in ("tag", "shared"):
        raise ValueError(f"gil must be 'tag' or 'shared', got {gil!r}")
    cal = _calibration(costs, calibration)
    shared_gil = gil == "shared" and device == "cpu"
    sharing = sharing or shared_gil
    folded = calibrated_costs(costs, plan, cal, gil_threshold=math.inf if shared_gil else gil_threshold,
                              device=device, core_pool=core_pool)
    if sharing and device == "cpu":
        folded = dataclasses.replace(folded, cores=max(1, math.ceil(cal.cores_free - 1e-9)))
    wake = cal.wake_s or 0.0  # an idle worker's wake-up at the enqueue: charged only where the plan's run measured it
    sim = simulate(plan, folded, num_iterations=num_iterations, device=device, period_overhead_s=cal.period_s,
                   wake_overhead_s=wake)
    if not (sharing and device == "cpu"):
        return sim
    take_backs = _take_backs_per_second(costs, cal) if shared_gil else {}
    for _ in range(_SHARING_ROUNDS):
        slow = _sharing_slowdown(sim.events, folded, cal.cores_free, cal.gil if shared_gil else None,
                                 take_backs, cal.wake_up_s)
        stretched = {n: dataclasses.replace(c, host_s=c.host_s * slow.get(n, 1.0)) for n, c in folded.tasks.items()}
        sim = simulate(plan, dataclasses.replace(folded, tasks=stretched), num_iterations=num_iterations,
                       device=device, period_overhead_s=cal.period_s, wake_overhead_s=wake)
    return sim


_SHARING_ROUNDS = 4  # mean-field rounds: the slowdowns settle within a few percent by then on DLRM plans


def _take_backs_per_second(costs: CostModel, cal: Any) -> Dict[str, float]:
    """Per task, the torch calls it makes (GIL take-backs) per second of its own host time."""
    return {name: cal.calls[name] / costs[name].host_s for name in costs.tasks
            if cal.calls.get(name, 0.0) > 0 and costs[name].host_s > 0}


def _sharing_slowdown(events: Any, costs: CostModel, cores_free: float,
                      gil: Optional[Dict[str, float]] = None, take_backs: Optional[Dict[str, float]] = None,
                      wake_s: float = 0.0) -> Dict[str, float]:
    """Per task, how much longer its host parts take when ``n`` running parts share ``cores_free`` cores.

    A part running for ``d`` seconds at rate ``min(1, cores_free / n(t))``
    does ``w = integral of the rate`` seconds of work, so a task is
    ``d / w`` slower than alone (summed over its parts). With ``gil`` (task
    -> GIL-held share), a part that holds the GIL also runs at most at
    ``1 / G(t)``, ``G`` the sum of the shares of the parts running (the
    GIL does at most one second of held work per second); a task off the CPU
    still holds its share (it is counted, but takes no core). With
    ``take_backs`` (task -> torch calls per second of its own work, ``c``), a
    part also runs ``1 + c * rho * wake_s`` times slower, ``rho`` the GIL
    shares of the other parts running (at most 1): each take-back finds the
    GIL held with that probability and waits one wake-up. The events
    are the last simulation's; the factor applies to the unstretched costs,
    so the rounds converge instead of compounding.
    """
    gil = gil or {}
    take_backs = take_backs or {}
    parts = [e for e in events if e.kind == "host" and e.end > e.start
             and (NOCORE not in costs[e.task].resources or gil.get(e.task, 0.0) > 0)]
    edges = sorted({t for e in parts for t in (e.start, e.end)})
    if len(edges) < 2:
        return {}
    running = [0] * (len(edges) - 1)  # parts on a core in each segment between consecutive edges
    held = [0.0] * (len(edges) - 1)  # the GIL shares of the parts running in each segment
    index = {t: k for k, t in enumerate(edges)}
    for e in parts:
        on_core = NOCORE not in costs[e.task].resources
        for k in range(index[e.start], index[e.end]):
            running[k] += on_core
            held[k] += gil.get(e.task, 0.0)
    work: Dict[str, float] = {}
    took: Dict[str, float] = {}
    for e in parts:
        a, b = index[e.start], index[e.end]
        core = NOCORE not in costs[e.task].resources
        holds = gil.get(e.task, 0.0) > 0
        waits = take_backs.get(e.task, 0.0) * wake_s  # seconds lost per second of work, if the GIL is always held
        work[e.task] = work.get(e.task, 0.0) + sum(
            (edges[k + 1] - edges[k]) * min(min(1.0, cores_free / running[k]) if core else 1.0,
                                            1.0 / held[k] if holds and held[k] > 1.0 else 1.0)
            / (1.0 + waits * min(1.0, max(0.0, held[k] - gil.get(e.task, 0.0))))
            for k in range(a, b))
        took[e.task] = took.get(e.task, 0.0) + (e.end - e.start)
    return {task: took[task] / work[task] for task in work if work[task] > 0}


def serial_iteration_s(costs: CostModel, calibration: Any = None) -> float:
    """The serial iteration the model predicts: the tasks' times plus the engine's serial costs.

    This is what the profiler's baseline measures (``run_one_serial_iter``),
    so ``serial_iteration_s(CostModel.from_profile(result))`` should match
    ``result.baseline_s``.

    Examples
    --------
    >>> from swpipe_core.calibrate import MachineCalibration
    >>> cal = MachineCalibration(serial_task_s=1e-5, serial_iter_s=3e-5)
    >>> round(serial_iteration_s(CostModel({"A": TaskCost(1e-3), "B": TaskCost(2e-3)}), cal) * 1e6, 3)
    3050.0
    """
    cal = _calibration(costs, calibration)
    return sum(c.cpu_s for c in costs.tasks.values()) + len(costs.tasks) * cal.serial_task_s + cal.serial_iter_s


def parallelism_note(plan: PipelinePlan, costs: CostModel, calibration: Any = None) -> Optional[str]:
    """One line when the measured free cores (or the GIL) cannot run this plan's threads in parallel, else None.

    Examples
    --------
    >>> from swpipe_core.calibrate import MachineCalibration
    >>> from swpipe_core.plan import TaskSchedule
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="y")})
    >>> print(parallelism_note(plan, CostModel({"A": TaskCost(1e-3), "B": TaskCost(1e-3)}),
    ...                        MachineCalibration(cores_free=1.1, cpu_count=2)))
    the machine is the limit: 2 thread groups but 1.10 of 2 cores free now (measured); threads will share a core
    """
    cal = _calibration(costs, calibration)
    groups = plan.thread_groups
    gil = [n for n in plan.task_names if cal.gil.get(n, 0.0) >= 0.5]
    if len(groups) > 1 and core_capacity(cal.cores_free) < 2:
        return (f"the machine is the limit: {len(groups)} thread groups but {cal.cores_free:.2f} of {cal.cpu_count} "
                "cores free now (measured); threads will share a core")
    if len(groups) > 1 and gil and len(gil) == len(plan.task_names):
        return "the machine is the limit: every task holds the GIL (measured), so threads cannot overlap them"
    return None


def format_profile(result: Any, costs: Optional[CostModel] = None) -> str:
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
    >>> from swpipe_core.profiler import ProfileResult
    >>> from swpipe_core.calibrate import MachineCalibration
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
