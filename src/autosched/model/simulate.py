"""Discrete-event simulation of the engine's execution contract.

The contract (periods and stages, the main thread with its caller group and
device-lag bound, FIFO thread groups, Phase 1 waits, the sequencer, streams
and events, what ``host_s``/``device_s``/resources mean) is written once in
docs/semantics.md; this module runs it with one heap of timed events and
integers for every (task, iteration).

The result has every (task, iteration) on its thread and stream
(:class:`~swpipe_core.measure.trace.TimelineEvent`), the steady-state period, each
iteration's latency (from its batch entering the pipeline to its completion),
utilisation and idle time per resource, what made each task wait, and the
critical cycle: the chain of binding waits that repeats every iteration in
steady state. The simulation is deterministic. A run too short to show the
steady state (a queue that grows slowly binds only after many iterations) is
lengthened until its period reaches the busiest resource's load, which no
steady state beats.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan
from swpipe_core.measure.trace import TimelineEvent, to_chrome_trace, write_chrome_trace
from swpipe_core.validate import validate

from autosched.model.costs import CostModel, as_cost_model
from autosched.model.machine import searched_costs, with_handoffs
from autosched.model.memory import MemoryPrediction, predict_memory
from autosched.model._simcore import Simulator
from autosched.model._simevents import SimDeadlock, Stall
from autosched.model._simplan import SimPlan, sim_plan
from autosched.model.taskmodel import CORES
from autosched.results import PeakBytes

if TYPE_CHECKING:  # for the annotations only: pandas is imported in to_dataframe()
    import pandas

    from swpipe_core.measure.calibrate import MachineCalibration

__all__ = ["simulate", "SimResult", "Stall", "CriticalCycle", "SimDeadlock"]

_MIN_WINDOW = 8  # iterations in the steady-state window before the run is lengthened
_LOAD_RTOL = 1e-9  # a period this much (relative) below the busiest resource's load is rounding, not a transient
_MAX_TASK_ITERATIONS = 200_000


@dataclass(frozen=True)
class CriticalCycle:
    """The chain of binding waits that repeats in steady state.

    ``steps`` run forward in time: ``(task, part, iteration, via)`` where ``via`` is
    the kind of wait that let the *next* step start (``"thread:<g>"``: the thread
    was busy, or, for a task handed off late, the main thread running group ``<g>``,
    ``"stream:<s>"``, ``"dep:<t>"``, ``"event:<t>"``, ``"submit"``,
    ``"barrier"``, ``"sequencer"``, ``"comm:<c>"``,
    ``"pcie"``, ``"cores"``). The chain spans
    ``iterations`` iterations in ``seconds``; ``ratio = seconds / iterations``.
    """

    steps: Tuple[Tuple[str, str, int, str], ...]
    iterations: int
    seconds: float

    @property
    def ratio(self) -> float:
        """Seconds per iteration along the cycle."""
        return self.seconds / self.iterations if self.iterations else math.inf

    @property
    def kinds(self) -> Tuple[str, ...]:
        """The kinds of wait along the cycle."""
        return tuple(s[3] for s in self.steps)

    def __str__(self) -> str:
        if not self.steps:
            return "(no cycle)"
        base = self.steps[-1][2]

        def node(task: str, part: str, it: int) -> str:
            off = f"{it - base:+d}" if it != base else ""
            return f"{task}{'' if part == 'host' else '@dev'}[i{off}]"

        parts = [f"{node(task, part, it)} -{via}->" for task, part, it, via in self.steps]
        first = self.steps[0]
        parts.append(node(first[0], first[1], first[2] + self.iterations))
        return " ".join(parts) + f" (repeats every {self.iterations} iteration(s), {self.ratio * 1e3:.3f} ms/iter)"


@dataclass
class SimResult:
    """What :func:`simulate` predicts for a plan.

    Attributes
    ----------
    period_s : float
        Steady-state seconds per iteration (``period``, the name before, still reads it and warns).
    latency : float
        Mean steady-state seconds from an iteration's batch entering the pipeline
        (its first period enqueued) to its completion (CPU signals, and on CUDA
        device completion). On a device-bound CUDA plan the host runs ahead (the
        engine waits CPU signals only), so this grows with the iteration index.
    latencies : list of float
        Per iteration.
    completion, entry : list of float
        Per iteration: completion time and entry time.
    events : list of TimelineEvent
        Every host part on its thread group, and (CUDA) every device part with
        device time on its stream.
    utilisation : dict
        ``{resource: busy fraction}`` in steady state (busy time per iteration over the
        period), resources named ``"thread:<group>"``, ``"stream:<name>"`` (CUDA),
        ``"comm:<name>"``, ``"pcie"``, ``"sequencer"`` (host time of globally
        ordered tasks, which hold the turn while they run) and, when the cost model's
        core pool has fewer cores than the plan has threads (else it never makes a
        part wait), ``"cores"`` (the host time that takes a core over ``cores`` x
        the period).
    idle : dict
        ``{resource: idle seconds per iteration}`` over the same window.
    stalls : list of Stall
        Every wait of every task instance (positive waits only).
    critical_cycle : CriticalCycle
        The repeating chain of binding waits.
    binding : str
        The saturated resource (``"thread:<g>"``, ``"stream:<s>"``, ``"comm:<c>"``,
        ``"pcie"``, ``"sequencer"``, ``"cores"``), else the critical cycle:
        ``"progress barrier (depth d): ..."`` if it passes the retire barrier,
        ``"recurrence: ..."`` if it is made of data dependencies only, else
        ``"cycle: ..."`` (dependencies chained with FIFO or resource order).
    window : (int, int)
        First and last iteration of the steady-state window.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> from swpipe import CostModel, TaskCost
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(0, thread_group="a")})
    >>> r = simulate(plan, CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002)}), num_iterations=20)
    >>> print(r.summary())
    simulated 20 iterations on cpu: period 3.000 ms/iter, latency 3.000 ms
    binding: thread:a
    utilisation: thread:a 100%
    largest waits per iteration: B on fifo:a 1.000 ms
    >>> [(t, part, cause, round(sec, 9)) for t, part, cause, sec in r.stall_summary(top=1)]
    [('B', 'host', 'fifo:a', 0.001)]
    >>> sorted({e["name"] for e in r.to_chrome_trace()["traceEvents"] if e["ph"] == "M"})
    ['process_name', 'thread_name', 'thread_sort_index']
    >>> len(r.to_dataframe()) == 2 * r.num_iterations
    True
    """

    plan: PipelinePlan
    costs: CostModel
    device: str
    num_iterations: int
    period_s: float
    latency: float
    latencies: List[float]
    completion: List[float]
    entry: List[float]
    events: List[TimelineEvent]
    utilisation: Dict[str, float]
    idle: Dict[str, float]
    stalls: List[Stall]
    critical_cycle: CriticalCycle
    binding: str
    window: Tuple[int, int]

    @property
    def period(self) -> float:
        """Deprecated: :attr:`period_s` (times are named ``*_s``); warns with ``FutureWarning``."""
        warnings.warn("SimResult.period is renamed SimResult.period_s (times are named *_s); read .period_s",
                      FutureWarning, stacklevel=2)
        return self.period_s

    @property
    def memory(self) -> MemoryPrediction:
        """Predicted live bytes over the run (:func:`autosched.model.memory.predict_memory`; needs the costs' bytes)."""
        return predict_memory(self)

    @property
    def peak_bytes(self) -> float:
        """Most bytes in flight at any instant (``memory.peak_bytes``)."""
        return self.memory.peak_bytes

    @property
    def peak_bytes_by(self) -> PeakBytes:
        """:attr:`peak_bytes` as the verbs' one memory type: ``{"process": bytes}`` (a plan's memory model counts
        what each iteration keeps, whichever thread holds it; :class:`autosched.results.PeakBytes`)."""
        return PeakBytes({"process": self.peak_bytes}, "process")

    @property
    def mean_bytes(self) -> float:
        """Time-weighted mean bytes in flight in steady state (``memory.mean_bytes``)."""
        return self.memory.mean_bytes

    @property
    def latency_growth(self) -> float:
        """Seconds per iteration by which latency grows over the window (> 0: the host runs ahead of the device)."""
        w0, w1 = self.window
        return (self.latencies[w1] - self.latencies[w0]) / (w1 - w0) if w1 > w0 else 0.0

    @property
    def makespan(self) -> float:
        """Seconds until the last iteration completed: one step's time when ``simulate(..., lengthen=False)``
        ran exactly that step's iterations (GPipe's micro-batches)."""
        return max(self.completion) if self.completion else 0.0

    def stall_summary(self, top: Optional[int] = None) -> List[Tuple[str, str, str, float]]:
        """Mean wait per steady-state iteration by ``(task, part, cause)``, largest first.

        Parameters
        ----------
        top : int, optional
            Keep only the largest ``top`` entries.

        Returns
        -------
        list of (task, part, cause, seconds per iteration)
        """
        w0, w1 = self.window
        span = max(1, w1 - w0 + 1)
        acc: Dict[Tuple[str, str, str], float] = {}
        for s in self.stalls:
            if w0 <= s.iteration <= w1:
                key = (s.task, s.part, s.cause)
                acc[key] = acc.get(key, 0.0) + s.seconds
        rows = sorted(((k[0], k[1], k[2], v / span) for k, v in acc.items()), key=lambda r: (-r[3], r[:3]))
        return rows[:top] if top is not None else rows

    def to_chrome_trace(self, name: str = "swpipe-sim") -> Dict[str, Any]:
        """The simulated timeline as Chrome/Perfetto trace JSON (same format as measured runs)."""
        return to_chrome_trace(self.events, name=name)

    def write_chrome_trace(self, path: str, name: str = "swpipe-sim") -> str:
        """Write :meth:`to_chrome_trace` to ``path`` (open in https://ui.perfetto.dev)."""
        return write_chrome_trace(self.events, path, name=name)

    def summary(self) -> str:
        """A few readable lines: period, latency, binding, utilisation, top stalls; the costs' freshness when refreshed."""
        growth = self.latency_growth
        ahead = (f" (host runs ahead of the device: latency grows {growth * 1e3:.3f} ms per iteration)"
                 if growth > 1e-6 * max(self.period_s, 1e-12) else "")
        lines = [
            f"simulated {self.num_iterations} iterations on {self.device}: period {self.period_s * 1e3:.3f} ms/iter, "
            f"latency {self.latency * 1e3:.3f} ms{ahead}",
            f"binding: {self.binding}",
            "utilisation: " + ", ".join(f"{k} {v:.0%}" for k, v in
                                        sorted(self.utilisation.items(), key=lambda kv: -kv[1])),
        ]
        top = self.stall_summary(top=5)
        if top:
            lines.append("largest waits per iteration: " + ", ".join(
                f"{t}{'' if p == 'host' else '@dev'} on {c} {s * 1e3:.3f} ms" for t, p, c, s in top))
        if self.costs.freshness is not None:  # costs measured while the job ran: how old and how noisy
            lines.append(self.costs.freshness.summary())
        return "\n".join(lines)

    def to_dataframe(self) -> pandas.DataFrame:
        """The events as a pandas DataFrame (pandas imported here)."""
        import pandas as pd

        return pd.DataFrame([e.__dict__ for e in self.events])


# -- measuring the result -----------------------------------------------------------------------------------------


def _window(completion: Sequence[float], cut: float, depth: int) -> Tuple[int, int]:
    """The iterations measured for the steady state.

    The run is identical to one with endless data until the first period that
    misses a batch would be enqueued (time ``cut``). The window ends with the
    last iteration such that it and every earlier one completed by then (on CUDA
    the device may lag the host by up to ``max_device_lag`` iterations) and skips
    the first quarter as warm-up.
    """
    w1 = -1
    for i, c in enumerate(completion):
        # an iteration completing exactly at the cut may have won a tie (a zero-cost task ahead of the
        # missing batch's work in a FIFO) that endless data would not give it: leave it out
        if c >= cut:
            break
        w1 = i
    w0 = max(w1 // 4, min(depth, w1 - 2), 0)
    return w0, max(w1, w0)


def _steady_period(completion: Sequence[float], w0: int, w1: int) -> float:
    """Seconds per iteration in steady state: exact when the tail of the window is periodic.

    Completion times of a pipeline settle into ``c[i + k] = c[i] + k * period`` for
    some cyclicity ``k``; the smallest ``k`` for which the last half of the window
    fits gives the period exactly, else the window's average is used.
    """
    c = completion
    span = w1 - w0
    if span <= 0:  # no clean window (cut by the end of the run): the whole run's average
        return (c[-1] - c[0]) / (len(c) - 1) if len(c) > 1 else c[0]
    mid = w0 + span // 2
    for k in range(1, min(8, (w1 - mid) // 2) + 1):
        ref = c[mid + k] - c[mid]
        tol = 1e-9 * max(1.0, abs(ref)) + 1e-12
        if all(abs((c[i + k] - c[i]) - ref) <= tol for i in range(mid, w1 - k + 1)):
            return ref / k
    return (c[w1] - c[w0]) / span


def _critical_cycle(sim: Simulator, start_op: int) -> CriticalCycle:
    """Follow binding predecessors back from ``start_op`` until a (task, part) repeats at an earlier iteration."""
    ops, names = sim.ops, sim.plan.names
    n, N = sim.n, sim.plan.tasks * sim.n
    seen: Dict[Tuple[int, int], int] = {}
    path: List[Tuple[int, str]] = []  # (op, kind of wait that let it start)
    op = start_op
    limit = 2 * N + 2
    while op >= 0 and len(path) < limit:
        part = 1 if op >= N else 0
        inst = op - N if part else op
        k, i = divmod(inst, n)
        key = (k, part)
        if key in seen:
            j = seen[key]
            i0 = divmod((path[j][0] - N if path[j][0] >= N else path[j][0]), n)[1]
            if i0 > i:
                seg = path[j:]  # from the later visit back to just before this one
                end_later = ops.dev_end[path[j][0] - N] if path[j][0] >= N else ops.host_end[path[j][0]]
                end_earlier = ops.dev_end[inst] if part else ops.host_end[inst]
                steps = []
                # forward in time: this (earlier) op, then seg reversed up to the later op
                chain = [(op, ops.pred_kind[op])] + list(reversed(seg[1:]))
                for (o, _), nxt in zip(chain, chain[1:] + [path[j]]):
                    pp = 1 if o >= N else 0
                    kk, ii = divmod(o - N if pp else o, n)
                    steps.append((names[kk], "device" if pp else "host", ii, ops.pred_kind[nxt[0]]))
                return CriticalCycle(tuple(steps), i0 - i, end_later - end_earlier)
        seen[key] = len(path)
        path.append((op, ops.pred_kind[op]))
        op = ops.pred_op[op]
    return CriticalCycle((), 0, 0.0)


def simulate(plan: PipelinePlan, costs: CostModel, num_iterations: int = 50, device: str = "cpu", *,
             task_overhead_s: float = 0.0, period_overhead_s: float = 0.0,
             max_device_lag: Optional[int] = None, lengthen: bool = True) -> SimResult:
    """Simulate a plan with a cost model under the engine's execution semantics.

    This is the model ``auto_schedule`` searches with: for the plan it returns, ``report.period_s ==
    simulate(plan, costs).period_s``. A cost model that carries a machine calibration
    (``CostModel.machine_calibration``: ``TaskProfiler.profile(calibrate=True)``) is simulated with it folded
    in (docs/semantics.md, "The machine model"): the engine's cost per task and per hand-off across threads,
    its time per period, and the free cores as the core pool. To simulate the costs as given, pass a model
    without it (``dataclasses.replace(costs, machine_calibration=None)``).

    Parameters
    ----------
    plan : PipelinePlan
        Validated first (:func:`swpipe_core.validate.validate`); may be unbound.
    costs : CostModel
        Must cost every task of the plan. Its ``cores`` (the core pool,
        :mod:`autosched.model.taskmodel`) caps how many host parts run at once; ``None``
        is unlimited. Its ``machine_calibration``, when set, is folded in (see above).
    num_iterations : int
        Iterations to run (>= 2). The period is measured on the iterations that
        complete before the run stops admitting full periods, after a warm-up
        quarter. The run is doubled, up to 16 times its length (and at most
        200,000 task-iterations), while fewer than 8 such iterations remain (on
        CUDA the device can lag the host by many iterations) or while the period
        is below the busiest resource's work per iteration (a queue that grows
        slowly has not bound yet: the run has not reached steady state).
    device : {"cpu", "cuda"}
        ``"cpu"``: all of a task's cost is host time. ``"cuda"``: ``host_s`` on the
        thread, ``device_s`` on the stream.
    task_overhead_s : float
        Engine overhead added to every task's host part (queue hand-off, signals), on top of the calibration's.
    period_overhead_s : float
        Main-thread time per enqueued period, on top of the calibration's.
    max_device_lag : int, optional
        CUDA: after retiring iteration ``r`` the main thread waits for the device
        work of iteration ``r - max_device_lag`` before enqueueing the next period,
        as the engine does. ``None`` (the engine's default) is the pipeline depth.
        No effect on CPU.
    lengthen : bool
        ``False`` runs exactly ``num_iterations`` (>= 1) iterations, as a finite
        run of that many batches does (one GPipe step of that many micro-batches:
        its ``makespan`` and timeline); the period is read from that run as it is.

    Returns
    -------
    SimResult
        Its ``costs`` are the costs simulated (the calibration folded in, when there was one).

    Raises
    ------
    swpipe_core.validate.PlanError
        If the plan breaks a rule (see docs/semantics.md).
    autosched.model.costs.CostModelError
        If a task has no cost.
    ValueError
        For ``num_iterations < 2``, an unknown device or a bad overhead / lag.
    SimDeadlock
        If the simulated run stops making progress (a validated plan never does).

    Examples
    --------
    Two tasks on two threads overlap across iterations (period = the longer);
    on one thread they add up:

    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> from swpipe import CostModel, TaskCost
    >>> costs = CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002)})
    >>> two = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
    ...                    intra_iter_deps=[("B", "A")])
    >>> r = simulate(two, costs)
    >>> round(r.period_s * 1e3, 6), r.binding
    (2.0, 'thread:b')
    >>> one = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, intra_iter_deps=[("B", "A")])
    >>> round(simulate(one, costs).period_s * 1e3, 6)
    3.0

    With one free core (``CostModel.cores``) the two threads take turns on it:

    >>> r = simulate(two, CostModel(costs.tasks, cores=1))
    >>> round(r.period_s * 1e3, 6), r.binding
    (3.0, 'cores')

    A machine calibration in the costs is folded in: here 0.1 ms of engine time per task and 0.5 ms per period
    (``MachineCalibration`` is the engine's measurement of the machine, not a name of ``swpipe``):

    >>> from swpipe_core.measure.calibrate import MachineCalibration   # the measured machine: advanced, not public
    >>> calibrated = CostModel({"A": TaskCost(0.001)}, machine_calibration=MachineCalibration(task_s=1e-4, period_s=5e-4))
    >>> round(simulate(PipelinePlan({"A": TaskSchedule(0)}), calibrated).period_s * 1e3, 6)
    1.6
    """
    costs = as_cost_model(costs)
    calibration = costs.machine_calibration
    if calibration is not None:
        costs = searched_costs(costs, device)
    return simulate_folded(plan, costs, calibration, num_iterations, device, task_overhead_s=task_overhead_s,
                           period_overhead_s=period_overhead_s, max_device_lag=max_device_lag, lengthen=lengthen)


def simulate_folded(plan: PipelinePlan, costs: CostModel, calibration: Optional[MachineCalibration],
                    num_iterations: int = 50, device: str = "cpu", *, task_overhead_s: float = 0.0,
                    period_overhead_s: float = 0.0, max_device_lag: Optional[int] = None,
                    lengthen: bool = True) -> SimResult:
    """The one simulation behind :func:`simulate`: ``costs`` with the calibration folded in already (plan-free,
    :func:`autosched.model.machine.searched_costs`), the calibration's per-hand-off and per-period engine time
    added here for this plan.

    A search folds its costs once and simulates many plans with them
    (:meth:`autosched.search.problem.Problem.simulate`); :func:`simulate` folds
    a calibrated cost model and comes here, so both are one model.

    Parameters
    ----------
    plan, num_iterations, device, task_overhead_s, period_overhead_s, max_device_lag, lengthen
        As for :func:`simulate`.
    costs : CostModel
        Folded already (its own ``machine_calibration`` is not read).
    calibration : MachineCalibration or None
        Its ``dep_s`` per cross-thread dependency and ``period_s`` per period; None adds nothing.

    Returns
    -------
    SimResult

    Examples
    --------
    >>> from swpipe import CostModel, PipelinePlan, TaskCost, TaskSchedule
    >>> from swpipe_core.measure.calibrate import MachineCalibration   # the measured machine: advanced, not public
    >>> plan = PipelinePlan({"A": TaskSchedule(0)})
    >>> round(simulate_folded(plan, CostModel({"A": TaskCost(1e-3)}), MachineCalibration(period_s=5e-4)).period_s
    ...       * 1e3, 6)
    1.5
    """
    costs = as_cost_model(costs)
    cuda, lag = _check_args(plan, costs, num_iterations, device, task_overhead_s, period_overhead_s, max_device_lag,
                            1 if not lengthen else 2)
    if calibration is not None:
        costs = with_handoffs(costs, plan, calibration.dep_s)
        period_overhead_s = period_overhead_s + calibration.period_s
    tables = sim_plan(plan, costs, cuda=cuda, task_overhead_s=float(task_overhead_s),
                      period_overhead_s=float(period_overhead_s), max_device_lag=lag)
    sim, completion, last_op, window, period = _run_until_steady(tables, num_iterations, lengthen)
    return _read_result(plan, costs, sim, completion, last_op, window, period)


def _check_args(plan: PipelinePlan, costs: CostModel, num_iterations: int, device: str, task_overhead_s: float,
                period_overhead_s: float, max_device_lag: Optional[int], least: int = 2) -> Tuple[bool, int]:
    """Validate the inputs of :func:`simulate` (a user may pass anything); return (CUDA?, device lag in iterations)."""
    validate(plan)
    costs.check(plan)
    if not isinstance(num_iterations, int) or num_iterations < least:
        raise ValueError(f"num_iterations={num_iterations!r}: the period needs at least 2 iterations"
                         if least == 2 else f"num_iterations={num_iterations!r}: give at least 1 iteration")
    dev = str(device)
    if dev not in ("cpu",) and not dev.startswith("cuda"):
        raise ValueError(f"device={device!r}: use 'cpu' (all time on the host) or 'cuda' (host + device streams)")
    for name, value in (("task_overhead_s", task_overhead_s), ("period_overhead_s", period_overhead_s)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name}={value!r}: use a time >= 0 in seconds")
    if max_device_lag is None:
        max_device_lag = plan.pipeline_depth
    if isinstance(max_device_lag, bool) or not isinstance(max_device_lag, int) or max_device_lag < 0:
        raise ValueError(f"max_device_lag={max_device_lag!r}: use None (the pipeline depth) or an int >= 0")
    return dev.startswith("cuda"), max_device_lag


def _run_until_steady(plan: SimPlan, iterations: int,
                      lengthen: bool = True) -> Tuple[Simulator, List[float], List[int], Tuple[int, int], float]:
    """Run the simulation, doubling its length until the window shows the steady state (unless not ``lengthen``).

    Returns the last run, each iteration's completion time and op, the window and the period.
    """
    tasks = max(1, plan.tasks)
    # the window needs depth + lag iterations of lead-in (the device may lag that far) and _MIN_WINDOW more
    need = min(_MAX_TASK_ITERATIONS // tasks, plan.depth + (plan.max_device_lag if plan.cuda else 0) + 2 * _MIN_WINDOW)
    n = max(iterations, min(need, 16 * iterations)) if lengthen else iterations
    cap = max(n, min(16 * n, _MAX_TASK_ITERATIONS // tasks)) if lengthen else n
    while True:
        sim = Simulator(plan, n)
        sim.run()
        completion, last_op = _completion(sim)
        w0, w1 = _window(completion, sim.main.cut, plan.depth)
        period = _steady_period(completion, w0, w1)
        # A queue that grows by a little every iteration binds only after many of them; until then the
        # window shows a faster transient. No steady state beats the busiest resource, so keep going.
        steady = w1 - w0 >= _MIN_WINDOW and period >= plan.busiest_load() * (1.0 - _LOAD_RTOL)
        if steady or n >= cap:
            return sim, completion, last_op, (w0, w1), period
        n = min(cap, 2 * n)


def _completion(sim: Simulator) -> Tuple[List[float], List[int]]:
    """Each iteration's completion time (CPU signals, and on CUDA device events) and the op that ended it."""
    its = sim.iterations
    completion = list(its.cpu_done)
    last_op = list(its.retire_op)
    if sim.plan.cuda:
        for i, t in enumerate(its.dev_done_t):
            if t > completion[i]:
                completion[i], last_op[i] = t, its.dev_done_op[i]
    return completion, last_op


def _read_result(plan: PipelinePlan, costs: CostModel, sim: Simulator, completion: List[float], last_op: List[int],
                 window: Tuple[int, int], period: float) -> SimResult:
    """Turn a finished run into a :class:`SimResult`: events, utilisation, critical cycle, binding."""
    w0, w1 = window
    n = sim.n
    entry = sim.iterations.entry
    latencies = [completion[i] - entry[i] for i in range(n)]
    win = latencies[w0:w1 + 1]
    events, busy = _events_and_busy(sim, w0, w1)
    # per-iteration busy time over the window / period: independent of where the window's edges fall
    count = w1 - w0 + 1
    utilisation = {name: (b / count) / period if period > 0 else 0.0 for name, b in sorted(busy.items())}
    idle = {name: max(0.0, period - b / count) for name, b in sorted(busy.items())}
    cycle = _critical_cycle(sim, last_op[w1])
    return SimResult(plan=plan, costs=costs, device="cuda" if sim.plan.cuda else "cpu", num_iterations=n,
                     period_s=period, latency=sum(win) / len(win), latencies=latencies, completion=completion,
                     entry=list(entry), events=events, utilisation=utilisation, idle=idle, stalls=sim.ops.stalls,
                     critical_cycle=cycle, binding=_binding(utilisation, cycle, sim.plan), window=(w0, w1))


def _events_and_busy(sim: Simulator, w0: int, w1: int) -> Tuple[List[TimelineEvent], Dict[str, float]]:
    """Every simulated part as a TimelineEvent, and each resource's busy seconds over the window."""
    plan, n = sim.plan, sim.n
    names, cuda, pool = plan.names, plan.cuda, plan.pool_size
    events: List[TimelineEvent] = []
    busy: Dict[str, float] = {label: 0.0 for label in plan.thread_labels}
    if cuda:
        busy.update({label: 0.0 for label in plan.stream_labels})
    busy.update({r: 0.0 for r in plan.res_names})
    if any(plan.ordered):
        busy["sequencer"] = 0.0
    if pool:  # the core pool: busy per core, so that its utilisation and idle time read like a thread's
        busy[CORES] = 0.0

    def charge(name: str, iteration: int, seconds: float) -> None:
        if w0 <= iteration <= w1:
            busy[name] += seconds

    for inst, start, end in sim.ops.host_events:
        k, i = divmod(inst, n)
        group = plan.thread[k]
        events.append(TimelineEvent(names[k], i, plan.group_names[group], plan.stream_names[plan.stream[k]],
                                    start, end, "host"))
        charge(plan.thread_labels[group], i, end - start)
        if plan.ordered[k]:
            charge("sequencer", i, end - start)
        if pool and plan.takes_core[k]:
            charge(CORES, i, (end - start) / pool)
        if not cuda:
            for r in plan.res[k]:
                charge(plan.res_names[r], i, end - start)
    for inst, start, end in sim.ops.device_events:
        k, i = divmod(inst, n)
        stream = plan.stream[k]
        events.append(TimelineEvent(names[k], i, plan.group_names[plan.thread[k]], plan.stream_names[stream],
                                    start, end, "device"))
        charge(plan.stream_labels[stream], i, end - start)
        for r in plan.res[k]:
            charge(plan.res_names[r], i, end - start)
    events.sort(key=lambda e: (e.start, e.kind, e.thread_group if e.kind == "host" else e.stream))
    return events, busy


def _binding(utilisation: Dict[str, float], cycle: CriticalCycle, plan: SimPlan) -> str:
    """The saturated resource, else a description of the critical cycle."""
    top = max(utilisation.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0.0))
    if top[1] >= 1.0 - 1e-6:
        return top[0]
    if "barrier" in cycle.kinds:
        return f"progress barrier (depth {plan.depth}): {cycle}"
    if "device-lag" in cycle.kinds:
        return f"device lag (max_device_lag {plan.max_device_lag}): {cycle}"
    if all(k.startswith(("dep:", "event:", "submit")) for k in cycle.kinds):
        return f"recurrence: {cycle}"
    return f"cycle: {cycle}"
