"""Calibrate the machine: what the engine itself costs here, how many cores are free now, which tasks hold the GIL.

A cost model of the user's tasks alone mispredicts small tasks and shared
cores: the engine spends time per task, per hand-off between threads and per
period, two threads on a loaded machine may not run at once, and Python
tasks serialise on the GIL. :func:`calibrate` measures these with the engine
on this machine, now:

* **engine costs** (no-op tasks, each plan run for ``iterations`` periods,
  median of ``repeats`` interleaved rounds; thread groups are worker threads,
  ``caller_group=None``):

  - ``task_s``, ``period_s``: one worker group, depth 1, with 1 and with
    ``k`` tasks: ``period(k) = period_s + k * task_s``;
  - ``dep_s``: a chain of ``k`` tasks alternating between two groups minus
    the same chain on one group, over its ``k - 1`` cross-thread hand-offs
    (the second worker's wake-up per period is counted in them);
  - ``serial_task_s``, ``serial_iter_s``: the same for
    ``run_one_serial_iter`` (what the profiler's baseline times);

* **cores free** (:func:`measure_cores`): ``hashlib`` work that releases the
  GIL, alone and on one thread per usable CPU at once;
  ``cores_free = threads * alone / together``;
* **GIL fraction per task** (:func:`measure_gil`, needs a pipeline and a
  batch): the part of a task's host time outside the torch calls it makes
  and on a CPU. Every torch call from Python releases the GIL while its op
  runs (and ``loss.backward()`` while the autograd engine runs), so the time
  inside torch ops (``torch.profiler``, in serial iterations, looking through
  ``record_function`` ranges) is GIL-free; so is sleeping or waiting (the
  thread is off the CPU). Per run, ``outside = (wall - ops) / wall`` and
  ``on_cpu = thread CPU time / wall``; ``gil = min(outside, on_cpu)``, with
  the median ``outside`` and the largest ``on_cpu`` over the iterations (as
  for the CPU share below), clipped to 0..1. Sleep and torch kernels
  read near 0, pure Python near 1. The profiler's own few microseconds per
  op read as held (a task of many tiny ops reads up to about 0.2 high), and
  CPU-bound work outside torch that releases the GIL (``hashlib``, some
  NumPy) reads as held;
* **torch calls per task** (the same profiler pass, :func:`measure_gil_and_calls`):
  the torch ops a task calls directly from Python per run (ops nested in
  another op, or in ``loss.backward()``'s autograd engine, are not counted).
  Each one takes the GIL back when its op returns, and beside a thread that
  holds the GIL that take-back waits (:mod:`autosched.calibrated`);
* **CPU share per task** (:func:`measure_cpu`, needs a pipeline and a
  batch): over serial iterations, the task's thread CPU time
  (``time.thread_time``) over its wall time, the largest over the iterations
  (a thread descheduled by other processes only ever reads lower), clipped to
  0..1. Sleep and blocking waits read near 0, Python and CPU kernels near 1:
  whether the task needs a core of the machine while it runs;
* **wait for a core per wake-up** (``calibrate(pipe, batch, wake_batches=...)``
  only, :func:`swpipe_core.schedstat.measure_wake_s`): over one pipelined run
  of the pipeline's plan, its threads' run delay per time on a CPU. It belongs
  to that plan rather than to the machine (13-79 us on one 2-core VM).

The result (:class:`MachineCalibration`) is plain data with a versioned JSON
form; cost models carry it as their ``machine_calibration`` section and
:mod:`autosched.calibrated` folds it into what the simulator uses.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["MachineCalibration", "calibrate", "measure_engine_costs", "measure_cores", "measure_gil",
           "measure_gil_and_calls", "measure_cpu", "CALIBRATION_VERSION"]

CALIBRATION_VERSION = 1
_FLOAT_FIELDS = ("task_s", "dep_s", "period_s", "serial_task_s", "serial_iter_s", "cores_free")


@dataclass
class MachineCalibration:
    """What the machine adds to the tasks' own costs (seconds), measured with the engine.

    Parameters
    ----------
    task_s : float
        Engine cost per task on a worker thread (queue, signals, bookkeeping).
    dep_s : float
        Extra cost per dependency that crosses thread groups (a wake-up).
    period_s : float
        Cost per period on the main thread (enqueue, retire, the barrier's wake-up).
    serial_task_s, serial_iter_s : float
        Per task and per iteration of a serial iteration (``run_one_serial_iter``).
    cores_free : float
        Parallelism available now (1.0 = one core's worth).
    cpu_count : int
        Usable CPUs (affinity).
    gil : dict
        ``{task: fraction of its host time that holds the GIL}``.
    cpu : dict
        ``{task: fraction of its host time on a CPU}`` (:func:`measure_cpu`; near 0
        for a task that sleeps or blocks). Written only when measured, so files
        without it read as before.
    calls : dict
        ``{task: torch calls per run made from Python}``
        (:func:`measure_gil_and_calls`): the times it takes the GIL back. Written
        only when measured, like ``cpu``.
    wake_s : float, optional
        A plan's threads' wait for a core after each wake-up, measured over a
        pipelined run of that plan (:func:`swpipe_core.schedstat.measure_wake_s`);
        :attr:`wake_up_s` uses it where it exceeds ``dep_s``. Written only when measured.
    load : float, optional
        1-minute load average when measured.
    measured, machine, notes : str

    Examples
    --------
    >>> c = MachineCalibration(task_s=2e-5, dep_s=3e-5, period_s=5e-5, gil={"Fwd": 0.2})
    >>> MachineCalibration.from_dict(c.to_dict()) == c
    True
    >>> c.to_dict()["version"]
    1
    """

    task_s: float = 0.0
    dep_s: float = 0.0
    period_s: float = 0.0
    serial_task_s: float = 0.0
    serial_iter_s: float = 0.0
    cores_free: float = 1.0
    cpu_count: int = 1
    gil: Dict[str, float] = field(default_factory=dict)
    cpu: Dict[str, float] = field(default_factory=dict)
    calls: Dict[str, float] = field(default_factory=dict)
    wake_s: Optional[float] = None
    load: Optional[float] = None
    measured: str = ""
    machine: str = ""
    notes: str = ""

    def to_dict(self) -> Dict[str, Any]:
        """The JSON form: ``{"version": 1, ...fields}`` (``cpu``, ``calls`` and ``wake_s`` only when measured)."""
        doc = {"version": CALIBRATION_VERSION, **asdict(self)}
        for optional in ("cpu", "calls", "wake_s"):
            if doc[optional] is None or doc[optional] == {}:
                del doc[optional]
        return doc

    @property
    def wake_up_s(self) -> float:
        """What one cross-thread wake-up costs: ``dep_s``, or the plan's measured ``wake_s`` where larger.

        ``dep_s`` is measured in a tight loop whose threads never idle; a plan
        whose threads idle in turn waits longer for a core when woken.

        Examples
        --------
        >>> MachineCalibration(dep_s=1.5e-5).wake_up_s, MachineCalibration(dep_s=1.5e-5, wake_s=9e-5).wake_up_s
        (1.5e-05, 9e-05)
        """
        return self.dep_s if self.wake_s is None else max(self.dep_s, self.wake_s)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str = "machine_calibration") -> "MachineCalibration":
        """Read the JSON form, checking the version and every number.

        Raises
        ------
        ValueError
            Unknown version or field, or a negative / non-numeric value.

        Examples
        --------
        >>> MachineCalibration.from_dict({"version": 9})
        Traceback (most recent call last):
        ...
        ValueError: machine_calibration.version: version 9 is not supported (this swpipe reads 1). Fix: re-run calibrate()
        """
        if not isinstance(doc, Mapping):
            raise ValueError(f"{where}: is {type(doc).__name__}, not an object. Fix: write the output of "
                             "MachineCalibration.to_dict()")
        if doc.get("version") != CALIBRATION_VERSION:
            raise ValueError(f"{where}.version: version {doc.get('version')!r} is not supported (this swpipe reads "
                             f"{CALIBRATION_VERSION}). Fix: re-run calibrate()")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(doc) - known - {"version"})
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}. Fix: the section has only {sorted(known)}")
        values = {k: v for k, v in doc.items() if k != "version"}
        for k in _FLOAT_FIELDS:
            v = values.get(k, 0.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"{where}.{k}: {v!r} is not a time/number >= 0. Fix: re-run calibrate()")
        for key in ("gil", "cpu"):
            shares = values.get(key, {})
            if not isinstance(shares, Mapping) or any(isinstance(g, bool) or not isinstance(g, (int, float))
                                                      or not 0 <= g <= 1 for g in shares.values()):
                raise ValueError(f"{where}.{key}: {shares!r} is not a map of task -> fraction in 0..1. "
                                 "Fix: re-run calibrate()")
            values[key] = {str(k): float(v) for k, v in shares.items()}
        calls = values.get("calls", {})
        if not isinstance(calls, Mapping) or any(isinstance(n, bool) or not isinstance(n, (int, float)) or not n >= 0
                                                 for n in calls.values()):
            raise ValueError(f"{where}.calls: {calls!r} is not a map of task -> torch calls per run >= 0. "
                             "Fix: re-run calibrate()")
        values["calls"] = {str(k): float(v) for k, v in calls.items()}
        wake = values.get("wake_s")
        if wake is not None and (isinstance(wake, bool) or not isinstance(wake, (int, float)) or not wake >= 0):
            raise ValueError(f"{where}.wake_s: {wake!r} is not a time >= 0 (or null). Fix: re-run measure_wake_s()")
        return cls(**values)

    def summary(self) -> str:
        """One line per measured quantity, in microseconds.

        Examples
        --------
        >>> print(MachineCalibration(task_s=2e-5, cores_free=1.6, cpu_count=2).summary().splitlines()[0])
        engine: 20.0 us/task, 0.0 us/cross-thread dependency, 0.0 us/period; serial 0.0 us/task + 0.0 us/iteration
        """
        lines = [f"engine: {self.task_s * 1e6:.1f} us/task, {self.dep_s * 1e6:.1f} us/cross-thread dependency, "
                 f"{self.period_s * 1e6:.1f} us/period; serial {self.serial_task_s * 1e6:.1f} us/task + "
                 f"{self.serial_iter_s * 1e6:.1f} us/iteration",
                 f"cores free: {self.cores_free:.2f} of {self.cpu_count}"
                 + ("" if self.load is None else f" (load average {self.load:.2f})")]
        if self.gil:
            lines.append("GIL held: " + ", ".join(f"{k} {v:.0%}" for k, v in self.gil.items()))
        if self.cpu:
            lines.append("on a CPU: " + ", ".join(f"{k} {v:.0%}" for k, v in self.cpu.items()))
        if self.calls:
            lines.append("torch calls per run: " + ", ".join(f"{k} {v:g}" for k, v in self.calls.items()))
        if self.wake_s is not None:
            lines.append(f"wait for a core per wake-up in the plan's run: {self.wake_s * 1e6:.1f} us")
        return "\n".join(lines)


# --------------------------------------------------------------------------- engine costs


def _noop(ctx: Any) -> None:
    return None


def _plan(groups: List[str], chain: bool) -> Any:
    from .plan import PipelinePlan, PipelineTask, TaskSchedule

    tasks = [PipelineTask(f"t{k}", _noop) for k in range(len(groups))]
    sched = {t: TaskSchedule(0, thread_group=g) for t, g in zip(tasks, groups)}
    deps = [(tasks[k], tasks[k - 1]) for k in range(1, len(tasks))] if chain else []
    return PipelinePlan(sched, deps, caller_group=None)


def _pipelined(plan: Any, iterations: int) -> float:
    from .engine import SWPipeline

    with SWPipeline(plan, device="cpu") as pipe:
        return pipe.run(range(iterations)) / iterations


def _serial(plan: Any, iterations: int) -> float:
    from .engine import SWPipeline

    pipe = SWPipeline(plan, device="cpu")
    t0 = time.perf_counter()
    for i in range(iterations):
        pipe.run_one_serial_iter(i, iter_idx=i)
    return (time.perf_counter() - t0) / iterations


def measure_engine_costs(iterations: int = 200, repeats: int = 5, k: int = 8) -> Dict[str, float]:
    """The engine's fixed costs on this machine (seconds), from no-op task plans.

    The plans are measured in interleaved rounds (a burst of load hits one
    sample of each plan, not every sample of one), after one warm-up round;
    each plan's time is the median over the rounds.

    Parameters
    ----------
    iterations : int
        Periods per run.
    repeats : int
        Rounds (median).
    k : int
        Tasks in the larger plans (>= 2).

    Returns
    -------
    dict
        ``task_s``, ``dep_s``, ``period_s``, ``serial_task_s``, ``serial_iter_s`` (each >= 0).

    Examples
    --------
    >>> got = measure_engine_costs(iterations=20, repeats=1, k=4)
    >>> sorted(got), all(v >= 0 for v in got.values())
    (['dep_s', 'period_s', 'serial_iter_s', 'serial_task_s', 'task_s'], True)
    """
    if k < 2 or iterations < 2 or repeats < 1:
        raise ValueError(f"need k >= 2, iterations >= 2, repeats >= 1; got k={k}, iterations={iterations}, "
                         f"repeats={repeats}")
    runs = {
        "one": (_pipelined, _plan(["w"], False)),
        "many": (_pipelined, _plan(["w"] * k, False)),
        "same": (_pipelined, _plan(["w"] * k, True)),
        "cross": (_pipelined, _plan(["a", "b"] * (k // 2) + ["a"] * (k % 2), True)),
        "s_one": (_serial, _plan(["w"], False)),
        "s_many": (_serial, _plan(["w"] * k, False)),
    }
    got: Dict[str, List[float]] = {key: [] for key in runs}
    for r in range(repeats + 1):
        for key, (fn, plan) in runs.items():
            t = fn(plan, iterations)
            if r:  # round 0 warms up (threads, first-call costs)
                got[key].append(t)
    m = {key: statistics.median(v) for key, v in got.items()}
    task = max(0.0, (m["many"] - m["one"]) / (k - 1))
    s_task = max(0.0, (m["s_many"] - m["s_one"]) / (k - 1))
    return {"task_s": task, "period_s": max(0.0, m["one"] - task),
            "dep_s": max(0.0, (m["cross"] - m["same"]) / (k - 1)),
            "serial_task_s": s_task, "serial_iter_s": max(0.0, m["s_one"] - s_task)}


# --------------------------------------------------------------------------- cores


def _hash_work(units: int, payload: bytes) -> None:
    for _ in range(units):
        hashlib.sha256(payload).digest()  # releases the GIL for large buffers


def measure_cores(units: int = 40, payload_kib: int = 256, threads: Optional[int] = None) -> Tuple[float, int]:
    """Parallelism available now: ``threads x time alone / time together`` of GIL-free work.

    Parameters
    ----------
    units : int
        Hash calls per thread.
    payload_kib : int
        Bytes hashed per call (KiB).
    threads : int, optional
        Threads at once (default: the usable CPUs).

    Returns
    -------
    (float, int)
        Cores free (1.0 .. threads) and the usable CPU count.

    Examples
    --------
    >>> free, cpus = measure_cores(units=4, payload_kib=64)
    >>> 1.0 <= free <= max(cpus, 1), cpus >= 1
    (True, True)
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    n = threads or cpus
    payload = b"\x5a" * (payload_kib * 1024)
    _hash_work(2, payload)
    t0 = time.perf_counter()
    _hash_work(units, payload)
    alone = time.perf_counter() - t0
    workers = [threading.Thread(target=_hash_work, args=(units, payload), name=f"swpipe-calibrate-{i}")
               for i in range(n)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    together = time.perf_counter() - t0
    return min(float(n), max(1.0, n * alone / together if together > 0 else 1.0)), cpus


# --------------------------------------------------------------------------- GIL


_TASK_RANGE = "swpipe.calibrate.task"


def _op_seconds(event: Any) -> float:
    """Seconds of torch ops directly under a profiler range; ``record_function`` ranges in it hold Python, so
    their own ops count, not their span."""
    return sum(_op_seconds(child) if child.is_user_annotation else child.time_range.elapsed_us() * 1e-6
               for child in event.cpu_children)


def _op_calls(event: Any) -> int:
    """Torch ops directly under a profiler range (looking through ``record_function`` ranges, as
    :func:`_op_seconds`): the calls made from Python, each of which takes the GIL back."""
    return sum(_op_calls(child) if child.is_user_annotation else 1 for child in event.cpu_children)


def measure_gil(pipe: Any, batch: Any, num_iterations: int = 5) -> Dict[str, float]:
    """Per task, the fraction of its host time that holds the GIL: :func:`measure_gil_and_calls`'s shares.

    Parameters
    ----------
    pipe, batch, num_iterations
        As for :func:`measure_gil_and_calls` (it raises the same errors).

    Returns
    -------
    dict
        ``{task: fraction in 0..1}``.

    Examples
    --------
    >>> from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
    >>> from swpipe_core.engine import SWPipeline
    >>> plan = PipelinePlan({PipelineTask("Sleep", lambda ctx: time.sleep(0.004)): TaskSchedule()})
    >>> measure_gil(SWPipeline(plan, device="cpu"), 0, num_iterations=3)["Sleep"] < 0.5
    True
    """
    return measure_gil_and_calls(pipe, batch, num_iterations)[0]


def measure_gil_and_calls(pipe: Any, batch: Any, num_iterations: int = 5
                          ) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Per task, the fraction of its host time that holds the GIL, and the torch calls it makes per run.

    Serial iterations (``pipe.run_one_serial_iter``) under ``torch.profiler``:
    per task, its wall and thread CPU time and the torch ops it calls
    directly; the share is the host time outside those ops and on a CPU, the
    calls are how many there are (module docstring).

    Parameters
    ----------
    pipe : SWPipeline
        Bound, idle (no iterations in flight), no shortcut enabled.
    batch : Any
        A representative batch.
    num_iterations : int
        Serial iterations (medians over them).

    Returns
    -------
    (dict, dict)
        ``{task: fraction in 0..1}`` and ``{task: median torch calls per run}``.

    Raises
    ------
    RuntimeError
        A torch profiler is already recording (profilers do not nest).

    Examples
    --------
    >>> import torch
    >>> from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
    >>> from swpipe_core.engine import SWPipeline
    >>> def spin(ctx):
    ...     t = time.perf_counter()
    ...     while time.perf_counter() - t < 0.004:
    ...         pass
    >>> a = torch.randn(256, 256)
    >>> plan = PipelinePlan({PipelineTask("Sleep", lambda ctx: time.sleep(0.004)): TaskSchedule(),
    ...                      PipelineTask("Spin", spin): TaskSchedule(),
    ...                      PipelineTask("MatMul", lambda ctx: [a @ a for _ in range(20)]): TaskSchedule()})
    >>> gil, calls = measure_gil_and_calls(SWPipeline(plan, device="cpu"), 0, num_iterations=3)
    >>> gil["Sleep"] < 0.5 < gil["Spin"], gil["MatMul"] < 0.5
    (True, True)
    >>> calls["MatMul"], calls["Spin"]
    (20.0, 0.0)
    """
    import torch

    from .engine_serial import _profiler_active

    if _profiler_active():
        raise RuntimeError("measure_gil: a torch profiler is already recording, and it times the tasks' torch ops "
                           "with its own. Fix: calibrate (or profile with calibrate=True) outside "
                           "torch.profiler.profile")
    runs: List[Tuple[str, float, float]] = []  # (task, wall, thread CPU) of each profiled range, by its number

    def ranged(original: Callable[[Any, Any], None], task: Any, ctx: Any) -> None:
        k = len(runs)
        runs.append((task.name, 0.0, 0.0))
        c0, t0 = time.thread_time(), time.perf_counter()
        with torch.profiler.record_function(f"{_TASK_RANGE}/{k}"):
            original(task, ctx)
        runs[k] = (task.name, time.perf_counter() - t0, time.thread_time() - c0)

    with pipe.instrument(ranged), \
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i in range(num_iterations):
            pipe.run_one_serial_iter(batch, iter_idx=i)
    outside: Dict[str, List[float]] = {}  # per run, the share of the task's wall time outside torch ops
    on_cpu: Dict[str, List[float]] = {}
    calls: Dict[str, List[int]] = {}
    for event in prof.events():
        if event.name.startswith(_TASK_RANGE + "/"):
            name, wall, cpu = runs[int(event.name.rsplit("/", 1)[1])]
            calls.setdefault(name, []).append(_op_calls(event))
            if wall > 0:
                outside.setdefault(name, []).append((wall - _op_seconds(event)) / wall)
                on_cpu.setdefault(name, []).append(cpu / wall)
    shares = {name: max(0.0, min(statistics.median(v), _largest_cpu_share(on_cpu[name]))) for name, v in outside.items()}
    return shares, {name: float(statistics.median(v)) for name, v in calls.items()}


def measure_cpu(pipe: Any, batch: Any, num_iterations: int = 5) -> Dict[str, float]:
    """Per task, the fraction of its host time on a CPU: thread CPU time over wall time.

    Serial iterations (``pipe.run_one_serial_iter``); the largest share per
    task over them (module docstring). A task that sleeps, waits on I/O or
    blocks in a call reads near 0 and needs no core while it runs; Python and
    CPU kernels read near 1.

    Parameters
    ----------
    pipe : SWPipeline
        Bound, idle (no iterations in flight), no shortcut enabled.
    batch : Any
        A representative batch.
    num_iterations : int
        Serial iterations (the largest share per task counts).

    Returns
    -------
    dict
        ``{task: fraction in 0..1}``.

    Examples
    --------
    A task that waits reads near 0:

    >>> from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
    >>> from swpipe_core.engine import SWPipeline
    >>> waits = PipelinePlan({PipelineTask("Wait", lambda ctx: threading.Event().wait(0.004)): TaskSchedule()})
    >>> measure_cpu(SWPipeline(waits, device="cpu"), 0, num_iterations=3)["Wait"] < 0.5
    True
    """
    shares: Dict[str, List[float]] = {}

    def timed(original: Callable[[Any, Any], None], task: Any, ctx: Any) -> None:
        c0, t0 = time.thread_time(), time.perf_counter()
        original(task, ctx)
        c1, t1 = time.thread_time(), time.perf_counter()
        shares.setdefault(task.name, []).append((c1 - c0) / (t1 - t0) if t1 > t0 else 1.0)

    with pipe.instrument(timed):
        for i in range(num_iterations):
            pipe.run_one_serial_iter(batch, iter_idx=i)
    return {name: _largest_cpu_share(v) for name, v in shares.items()}


def _largest_cpu_share(shares: List[float]) -> float:
    """A task's CPU share from its runs' (thread CPU time / wall time): the largest, since other processes only
    ever take the CPU away from the task's thread; clipped to 0..1."""
    return min(1.0, max(0.0, max(shares)))


# --------------------------------------------------------------------------- all together


def calibrate(pipe: Any = None, batch: Any = None, *, iterations: int = 200, repeats: int = 5,
              gil_iterations: int = 5, wake_batches: Optional[Sequence[Any]] = None,
              state: Any = None) -> MachineCalibration:
    """Measure the machine: engine costs, cores free now and (given a pipeline and a batch) each task's GIL and CPU use.

    Parameters
    ----------
    pipe : SWPipeline, optional
        The user's pipeline (bound, idle); without it the GIL and CPU sections are empty.
    batch : Any, optional
        A representative batch for ``pipe``.
    iterations, repeats : int
        For :func:`measure_engine_costs`.
    gil_iterations : int
        For :func:`measure_gil_and_calls` and :func:`measure_cpu`.
    wake_batches : sequence, optional
        With ``pipe``: batches for one pipelined run of its plan, over which
        :func:`swpipe_core.schedstat.measure_wake_s` measures ``wake_s`` (the
        plan's threads' wait for a core per wake-up). It belongs to that plan:
        simulate that plan with it. Without them ``wake_s`` is not measured.
    state : modules, optimizers, or a list of them, optional
        What ``pipe``'s tasks train: restored exactly after the measurement
        runs them (:func:`swpipe_core.state.measured_on`); without it a
        ``RuntimeWarning`` says how many steps ran on the model.

    Returns
    -------
    MachineCalibration

    Examples
    --------
    >>> cal = calibrate(iterations=20, repeats=1)
    >>> cal.cores_free >= 1.0, cal.gil, cal.measured != ""
    (True, {}, True)
    """
    import platform

    engine = measure_engine_costs(iterations=iterations, repeats=repeats)
    free, cpus = measure_cores()
    gil, calls, cpu, wake = {}, {}, {}, None
    if pipe is not None:
        from .state import measured_on

        with measured_on(pipe, state, "calibrate"):
            gil, calls = measure_gil_and_calls(pipe, batch, gil_iterations)
            cpu = measure_cpu(pipe, batch, gil_iterations)
            if wake_batches is not None:
                from .schedstat import measure_wake_s

                wake = measure_wake_s(pipe, wake_batches)
    try:
        load: Optional[float] = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return MachineCalibration(
        cores_free=free, cpu_count=cpus, gil=gil, cpu=cpu, calls=calls, wake_s=wake, load=load,
        measured=datetime.datetime.now().isoformat(timespec="seconds"),
        machine=f"{cpus}-CPU {platform.machine()}, Python {platform.python_version()}",
        notes=f"swpipe_core.calibrate: no-op plans x {iterations} periods, median of {repeats}", **engine)
