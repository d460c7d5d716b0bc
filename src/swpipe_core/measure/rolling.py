"""Costs measured while the job runs: per task, a bounded window of recent durations and their robust statistics.

A cost model measured once, ahead of the run, falls wherever the machine's
load happened to be then: on a shared machine one snapshot taken on a load
spike decides every prediction made from it. :class:`RollingCosts` keeps
measuring while the job trains. It is an :meth:`SWPipeline.instrument
<swpipe_core.engine.pipeline.SWPipeline.instrument>` wrapper (``with
pipe.instrument(rolling):``) that times every task execution on the task's
own thread and keeps, per task, the last ``window`` durations with the time
each was taken. Anything else that runs can feed it too (:meth:`RollingCosts.add`;
:class:`autosched.pp.rolling.RollingStepCosts` does, for PyTorch's pipelining
runtime).

What a sample is:

* ``"host"``: the wall time of the task's call on its thread (what the engine
  adds around the task, its dependency waits and signals, is not in it; what
  tasks running at once cost each other is);
* ``"device"`` (a device with a queue, ``device.is_async``): the span on the
  task's stream between an event recorded just before the task and one just
  after. The events are resolved lazily: each execution of a task, and every
  read, asks (``query``) whether earlier events have completed and only then
  reads their elapsed time; nothing here ever waits for the device. The span
  is the device's own work when the stream is backed up (a device-bound run);
  on an idle stream it also holds the gaps in which the stream waited for the
  host to launch (the profiler's spin kernel, which removes them, would delay
  the job).

Reads (:meth:`RollingCosts.stats`) give per task a :class:`WindowStats`: the
median (one spike does not move it), the quartiles and the median absolute
deviation (the spread), the sample count and the age of the newest and the
oldest sample. :meth:`autosched.model.costs.CostModel.refreshed` turns them into a
cost model.

The wrapper is called from several threads at once: one lock guards the
windows, held for a few appends per task execution.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

__all__ = ["RollingCosts", "WindowStats", "KINDS", "relative_iqr"]

KINDS = ("host", "device")
_RESOLVE_PER_CALL = 4  # completed device samples read per task execution: bounds the hot path's work


@dataclass(frozen=True)
class WindowStats:
    """One task's recent durations of one kind, summarised.

    Attributes
    ----------
    task : str
    kind : str
        ``"host"`` or ``"device"``.
    samples : int
        Durations in the window now (at most the window's size; fewer when
        older ones passed ``max_age_s``).
    recorded : int
        Durations recorded since the window was made or cleared, also those no
        longer in it.
    median_s, q1_s, q3_s, min_s, max_s : float
        Of the window's durations (quartiles inclusive: one sample is its own
        quartiles).
    mad_s : float
        The median absolute deviation from ``median_s``.
    age_s : float
        How long ago the newest sample was taken.
    span_s : float
        How long ago the oldest sample in the window was taken.

    Examples
    --------
    >>> s = WindowStats("Fwd", "host", 4, 10, 2.0, 1.5, 3.0, 0.5, 1.0, 9.0, 0.1, 4.0)
    >>> s.iqr_s, s.spread
    (1.5, 0.75)
    """

    task: str
    kind: str
    samples: int
    recorded: int
    median_s: float
    q1_s: float
    q3_s: float
    mad_s: float
    min_s: float
    max_s: float
    age_s: float
    span_s: float

    @property
    def iqr_s(self) -> float:
        """The interquartile range, ``q3_s - q1_s``."""
        return self.q3_s - self.q1_s

    @property
    def spread(self) -> float:
        """The interquartile range over the median (0 for a median of 0): how noisy the cost is."""
        return self.iqr_s / self.median_s if self.median_s > 0 else 0.0


def relative_iqr(values: Sequence[float]) -> float:
    """How noisy a set of durations is: the interquartile range over the median (0 for fewer than two values or a
    median of 0). The one spread statistic of a window's cost and of a layer's profiled time.

    Examples
    --------
    >>> relative_iqr([2.0, 4.0, 4.0, 6.0])  # quartiles 3.5 and 4.5, median 4
    0.25
    >>> relative_iqr([2.0])
    0.0
    """
    if len(values) < 2:
        return 0.0
    median = statistics.median(values)
    if median <= 0:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / median


def _summarise(task: str, kind: str, samples: List[Tuple[float, float]], recorded: int, now: float) -> WindowStats:
    durations = sorted(d for _, d in samples)
    median = statistics.median(durations)
    if len(durations) > 1:
        q1, _, q3 = statistics.quantiles(durations, n=4, method="inclusive")
    else:
        q1 = q3 = durations[0]
    mad = statistics.median(abs(d - median) for d in durations)
    taken = [at for at, _ in samples]
    return WindowStats(task, kind, len(durations), recorded, median, q1, q3, mad, durations[0], durations[-1],
                       max(0.0, now - max(taken)), max(0.0, now - min(taken)))


def _device_of(device: Any) -> Any:
    """The device whose events time the tasks, or ``None`` (no device queue: host time only)."""
    if device is None:
        return None
    streams = getattr(device, "streams", None)
    if streams is not None:  # an SWPipeline: its own device
        device = streams.dev
    from swpipe_core.engine.device import as_device

    dev = as_device(device)
    return dev if dev.is_async else None


class RollingCosts:
    """Per task, the last ``window`` durations of its executions, kept while the job runs.

    Parameters
    ----------
    window : int
        Durations kept per task and kind (the oldest drops out), ``>= 1``.
    device : SWPipeline, device or None
        Time each task on this device's streams too (``"device"`` samples):
        pass the pipeline (``RollingCosts(device=pipe)``) or its device. ``None``
        or a device without a queue (the CPU): host time only.
    max_age_s : float, optional
        Reads leave out samples taken longer ago than this (``None``: every
        sample in the window counts).
    clock : callable
        Seconds, monotonic: times the tasks and stamps the samples
        (``time.perf_counter``; tests pass a fake one).

    Raises
    ------
    OptionError
        ``window`` not an integer ``>= 1``, ``max_age_s`` not a number ``> 0``
        or ``clock`` not callable (``.field``, ``.value``).

    Examples
    --------
    >>> from swpipe import SWPipeline, PipelinePlan, PipelineTask, TaskSchedule
    >>> plan = PipelinePlan({PipelineTask("Load", lambda ctx: None): TaskSchedule(0, thread_group="io"),
    ...                      PipelineTask("Step", lambda ctx: None): TaskSchedule(1)},
    ...                     intra_iter_deps=[("Step", "Load")])
    >>> pipe = SWPipeline(plan, device="cpu")
    >>> rolling = RollingCosts(window=8)
    >>> with pipe.instrument(rolling):
    ...     _ = pipe.run(range(20))
    >>> stats = rolling.stats()
    >>> sorted(stats), stats["Step"].samples, stats["Step"].recorded
    (['Load', 'Step'], 8, 20)
    >>> pipe.close()

    Durations can be added by hand; a spike does not move the median:

    >>> r = RollingCosts(window=5)
    >>> for d in (1.0, 1.1, 0.9, 50.0, 1.0):
    ...     r.add("Fwd", d)
    >>> r.stats()["Fwd"].median_s
    1.0
    """

    def __init__(self, window: int = 64, device: Any = None, max_age_s: Optional[float] = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        from swpipe_core.engine.options import OptionError

        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise OptionError("RollingCosts", "window", window, expected="an integer >= 1 (durations kept per task)")
        if max_age_s is not None and (isinstance(max_age_s, bool) or not isinstance(max_age_s, (int, float))
                                      or not max_age_s > 0 or not math.isfinite(max_age_s)):
            raise OptionError("RollingCosts", "max_age_s", max_age_s, expected="a number of seconds > 0, or None")
        if not callable(clock):
            raise OptionError("RollingCosts", "clock", clock, expected="a callable returning seconds")
        self.window = window
        self.max_age_s = max_age_s
        self.clock = clock
        self._dev = _device_of(device)
        self._lock = threading.Lock()
        self._samples: Dict[Tuple[str, str], Deque[Tuple[float, float]]] = {}  # (task, kind) -> (taken at, seconds)
        self._recorded: Dict[Tuple[str, str], int] = {}
        self._pending: Dict[str, Deque[Tuple[Any, Any, float]]] = {}  # task -> (start, end, taken at), recorded order
        self._free_events: List[Any] = []

    # -- recording --------------------------------------------------------------------------------------------------

    def __call__(self, run_task: Callable[[Any, Any], None], task: Any, ctx: Any) -> None:
        """The instrument wrapper: run the task once, timed (``SWPipeline.instrument``)."""
        clock, dev = self.clock, self._dev
        if dev is None:
            t0 = clock()
            run_task(task, ctx)
            t1 = clock()
            with self._lock:
                self._append(task.name, "host", t1 - t0, t1)
            return
        stream = dev.current_stream()
        start = self._event()
        dev.record(start, stream)
        t0 = clock()
        run_task(task, ctx)
        t1 = clock()
        end = self._event()
        dev.record(end, stream)
        name = task.name
        with self._lock:
            self._append(name, "host", t1 - t0, t1)
            pending = self._pending.setdefault(name, deque())
            pending.append((start, end, t1))
            self._resolve(name, pending, _RESOLVE_PER_CALL)

    def add(self, task: str, seconds: float, kind: str = "host", at: Optional[float] = None) -> None:
        """Record one duration of ``task`` by hand (another runtime's timing, a test's injected value).

        Parameters
        ----------
        task : str
        seconds : float
            The duration, a finite number ``>= 0``.
        kind : {"host", "device"}
        at : float, optional
            When it was taken, on :attr:`clock` (default: now).

        Raises
        ------
        ValueError
            A duration that is not a finite number ``>= 0`` or an unknown kind.
        """
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or seconds < 0:
            raise ValueError(f"RollingCosts.add({task!r}): seconds is {seconds!r}; give a finite duration >= 0")
        if kind not in KINDS:
            raise ValueError(f"RollingCosts.add({task!r}): kind is {kind!r}; use one of {KINDS}")
        with self._lock:
            self._append(task, kind, float(seconds), self.clock() if at is None else float(at))

    def _append(self, task: str, kind: str, seconds: float, at: float) -> None:
        key = (task, kind)
        window = self._samples.get(key)
        if window is None:
            window = self._samples[key] = deque(maxlen=self.window)
        window.append((at, seconds))
        self._recorded[key] = self._recorded.get(key, 0) + 1

    def _event(self) -> Any:
        with self._lock:
            if self._free_events:
                return self._free_events.pop()
        return self._dev.event(timing=True)

    def _resolve(self, task: str, pending: Deque[Tuple[Any, Any, float]], limit: Optional[int]) -> None:
        """Read the completed device spans at the head of ``task``'s queue (lock held; ``query`` only, never a wait)."""
        dev = self._dev
        done = 0
        while pending and (limit is None or done < limit) and dev.query(pending[0][1]):
            start, end, at = pending.popleft()
            self._append(task, "device", max(0.0, dev.elapsed_s(start, end)), at)
            self._free_events.extend((start, end))
            done += 1
        while len(pending) > 2 * self.window:  # never read (no execution since): the oldest would not be kept anyway
            pending.popleft()

    def resolve(self) -> int:
        """Read every device span whose events have completed (no waiting); the number still in flight.

        Reads (:meth:`stats`) call it. After ``pipe.streams.synchronize(timeout)``
        every span of the run is read.
        """
        if self._dev is None:
            return 0
        with self._lock:
            for task, pending in self._pending.items():
                self._resolve(task, pending, None)
            return sum(len(p) for p in self._pending.values())

    def clear(self) -> None:
        """Forget every sample (and the device spans in flight)."""
        with self._lock:
            self._samples.clear()
            self._recorded.clear()
            self._pending.clear()

    # -- reading ----------------------------------------------------------------------------------------------------

    def stats(self, kind: str = "host") -> Dict[str, WindowStats]:
        """Per task with samples in the window, its :class:`WindowStats` of ``kind``, in the order first recorded.

        Parameters
        ----------
        kind : {"host", "device"}

        Returns
        -------
        dict
            ``{task: WindowStats}``; a task whose samples are all older than
            ``max_age_s`` is left out.

        Raises
        ------
        ValueError
            An unknown kind.
        """
        if kind not in KINDS:
            raise ValueError(f"RollingCosts.stats: kind is {kind!r}; use one of {KINDS}")
        if kind == "device":
            self.resolve()
        with self._lock:
            now = self.clock()
            kept = {task: list(window) for (task, k), window in self._samples.items() if k == kind}
            recorded = {task: self._recorded[(task, k)] for (task, k) in self._samples if k == kind}
        out = {}
        for task, samples in kept.items():
            if self.max_age_s is not None:
                samples = [(at, d) for at, d in samples if now - at <= self.max_age_s]
            if samples:
                out[task] = _summarise(task, kind, samples, recorded[task], now)
        return out

    @property
    def times_device(self) -> bool:
        """Whether device spans are recorded (a device with a queue was given)."""
        return self._dev is not None

    def report(self) -> str:
        """One line per task and kind: median, spread, samples and age.

        Examples
        --------
        >>> r = RollingCosts(clock=lambda: 10.0)
        >>> r.add("Fwd", 0.002, at=9.0)
        >>> print(r.report())
        task  kind    median ms  IQR ms  spread  samples  recorded  age s  span s
        Fwd   host        2.000   0.000      0%        1         1    1.0     1.0
        """
        rows = [s for kind in KINDS for s in self.stats(kind).values()]
        width = max([4, *(len(s.task) for s in rows)])
        lines = [f"{'task':<{width}}  kind    median ms  IQR ms  spread  samples  recorded  age s  span s"]
        for s in rows:
            lines.append(f"{s.task:<{width}}  {s.kind:<6}{s.median_s * 1e3:>11.3f}{s.iqr_s * 1e3:>8.3f}"
                         f"{s.spread:>8.0%}{s.samples:>9}{s.recorded:>10}{s.age_s:>7.1f}{s.span_s:>8.1f}")
        return "\n".join(lines)
