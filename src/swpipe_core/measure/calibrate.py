"""Calibrate the machine: what the engine itself costs here, and how many cores are free now.

A cost model of the user's tasks alone mispredicts small tasks and shared
cores: the engine spends time per task, per hand-off between threads and per
period, and two threads on a loaded machine may not run at once.
:func:`calibrate` measures these with the engine on this machine, now:

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
* **CPU share per task** (:func:`measure_cpu`, needs a pipeline and a
  batch): over serial iterations, the task's thread CPU time
  (``time.thread_time``) over its wall time, the largest over the iterations
  (a thread descheduled by other processes only ever reads lower), clipped to
  0..1. Sleep and blocking waits read near 0, Python and CPU kernels near 1:
  whether the task needs a core of the machine while it runs.

These are the general machine model (docs/semantics.md, "The machine
model"): they hold on any host. Interpreter-lock shares, torch-call
take-backs and scheduler wake-ups are not measured: on the demo's DLRM they
did not bring the predictions nearer the measurements (docs/results.md, "The
machine model"). A section written by an earlier version with them
(``gil``, ``calls``, ``wake_s``) still reads; they are ignored.

The result (:class:`MachineCalibration`) is plain data with a versioned JSON
form; cost models carry it as their ``machine_calibration`` section and
:mod:`autosched.model.machine` folds it into what the simulator uses.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

__all__ = ["MachineCalibration", "calibrate", "measure_engine_costs", "measure_cores", "measure_cpu",
           "CALIBRATION_VERSION"]

CALIBRATION_VERSION = 1
_FLOAT_FIELDS = ("task_s", "dep_s", "period_s", "serial_task_s", "serial_iter_s", "cores_free")
_RETIRED_FIELDS = ("gil", "calls", "wake_s")  # written by earlier versions (a host-lock model): read and ignored


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
    cpu : dict
        ``{task: fraction of its host time on a CPU}`` (:func:`measure_cpu`; near 0
        for a task that sleeps or blocks). Written only when measured, so files
        without it read as before.
    load : float, optional
        1-minute load average when measured.
    measured, machine, notes : str

    Examples
    --------
    >>> c = MachineCalibration(task_s=2e-5, dep_s=3e-5, period_s=5e-5, cpu={"Fwd": 0.9})
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
    cpu: Dict[str, float] = field(default_factory=dict)
    load: Optional[float] = None
    measured: str = ""
    machine: str = ""
    notes: str = ""

    def to_dict(self) -> Dict[str, Any]:
        """The JSON form: ``{"version": 1, ...fields}`` (``cpu`` only when measured)."""
        doc = {"version": CALIBRATION_VERSION, **asdict(self)}
        if not doc["cpu"]:
            del doc["cpu"]
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str = "machine_calibration") -> "MachineCalibration":
        """Read the JSON form, checking the version and every number.

        The fields of an earlier host-lock model (``gil``, ``calls``, ``wake_s``)
        are read and ignored, so files written by earlier versions still load.

        Raises
        ------
        ValueError
            Unknown version or field, or a negative / non-numeric value.

        Examples
        --------
        >>> MachineCalibration.from_dict({"version": 1, "task_s": 2e-5, "gil": {"A": 0.9}}).task_s
        2e-05
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
        unknown = sorted(set(doc) - known - {"version", *_RETIRED_FIELDS})
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}. Fix: the section has only {sorted(known)}")
        values = {k: v for k, v in doc.items() if k != "version" and k not in _RETIRED_FIELDS}
        for k in _FLOAT_FIELDS:
            v = values.get(k, 0.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"{where}.{k}: {v!r} is not a time/number >= 0. Fix: re-run calibrate()")
        shares = values.get("cpu", {})
        if not isinstance(shares, Mapping) or any(isinstance(g, bool) or not isinstance(g, (int, float))
                                                  or not 0 <= g <= 1 for g in shares.values()):
            raise ValueError(f"{where}.cpu: {shares!r} is not a map of task -> fraction in 0..1. "
                             "Fix: re-run calibrate()")
        values["cpu"] = {str(k): float(v) for k, v in shares.items()}
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
        if self.cpu:
            lines.append("on a CPU: " + ", ".join(f"{k} {v:.0%}" for k, v in self.cpu.items()))
        return "\n".join(lines)


# --------------------------------------------------------------------------- engine costs


def _noop(ctx: Any) -> None:
    return None


def _plan(groups: List[str], chain: bool) -> Any:
    from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule

    tasks = [PipelineTask(f"t{k}", _noop) for k in range(len(groups))]
    sched = {t: TaskSchedule(0, thread_group=g) for t, g in zip(tasks, groups)}
    deps = [(tasks[k], tasks[k - 1]) for k in range(1, len(tasks))] if chain else []
    return PipelinePlan(sched, deps, caller_group=None)


def _pipelined(plan: Any, iterations: int) -> float:
    from swpipe_core.engine.pipeline import SWPipeline

    with SWPipeline(plan, device="cpu") as pipe:
        return pipe.run(range(iterations)) / iterations


def _serial(plan: Any, iterations: int) -> float:
    from swpipe_core.engine.pipeline import SWPipeline

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

    >>> from swpipe import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
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
              cpu_iterations: int = 5, state: Any = None) -> MachineCalibration:
    """Measure the machine: engine costs, cores free now and (given a pipeline and a batch) each task's CPU share.

    Parameters
    ----------
    pipe : SWPipeline, optional
        The user's pipeline (bound, idle); without it the CPU section is empty.
    batch : Any, optional
        A representative batch for ``pipe``.
    iterations, repeats : int
        For :func:`measure_engine_costs`.
    cpu_iterations : int
        Serial iterations for :func:`measure_cpu`.
    state : modules, optimizers, or a list of them, optional
        What ``pipe``'s tasks train: restored exactly after the measurement
        runs them (:func:`swpipe_core.measure.measured.measured_on`); without it a
        ``RuntimeWarning`` says how many steps ran on the model.

    Returns
    -------
    MachineCalibration

    Examples
    --------
    >>> cal = calibrate(iterations=20, repeats=1)
    >>> cal.cores_free >= 1.0, cal.cpu, cal.measured != ""
    (True, {}, True)
    """
    import platform

    engine = measure_engine_costs(iterations=iterations, repeats=repeats)
    free, cpus = measure_cores()
    cpu: Dict[str, float] = {}
    if pipe is not None:
        from swpipe_core.measure.measured import measured_on

        with measured_on(pipe, state, "calibrate"):
            cpu = measure_cpu(pipe, batch, cpu_iterations)
    try:
        load: Optional[float] = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return MachineCalibration(
        cores_free=free, cpu_count=cpus, cpu=cpu, load=load,
        measured=datetime.datetime.now().isoformat(timespec="seconds"),
        machine=f"{cpus}-CPU {platform.machine()}, Python {platform.python_version()}",
        notes=f"swpipe_core.measure.calibrate: no-op plans x {iterations} periods, median of {repeats}", **engine)
