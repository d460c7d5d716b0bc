"""Per-task exposed time, measured on the real training step by shortcutting.

``exposed(T) = max(0, baseline - median(serial iteration with T shortcut))``:
how much one serial iteration speeds up when task ``T`` is replaced by a
replay of its cached output (:mod:`swpipe_core.engine.shortcut`). A task that
overlaps others (device work hidden behind host work) exposes less than it
takes; the exposed times are what an auto-scheduler has to hide.

:class:`TaskProfiler` runs the measurement (timed rounds of serial
iterations, then per-task host/device times and bytes); the result, its
report and its file are :class:`~swpipe_core.measure.result.ProfileResult`.
This module imports only the standard library at import time (torch when a
profile runs, tqdm when a progress bar is asked for), so ``import
swpipe_core`` stays light.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import statistics
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from swpipe_core.engine.lifetime import TrainState
from swpipe_core.engine.options import OptionError, keywords_checked
from swpipe_core.measure.allocator import minor_faults
from swpipe_core.measure.result import ProfileResult

if TYPE_CHECKING:
    import torch

    from swpipe_core.engine.dispatch import RunTask
    from swpipe_core.engine.pipeline import SWPipeline
    from swpipe_core.plan import IterContext, PipelineTask

__all__ = ["TaskProfiler"]

_log = logging.getLogger(__name__)

_CPU_DEVICE_NOTE = "not measured on CPU: there is no device queue, all of a task's time is host time (host_s)"


class TaskProfiler:
    """Measure each task's exposed time on a :class:`~swpipe_core.engine.pipeline.SWPipeline`.

    Shortcuts one task at a time and times serial iterations
    (``pipe.run_one_serial_iter``); ``exposed(T) = max(0, baseline - median
    shortcut time)``. Optionally also times each task's host (CPU) time and,
    on CUDA, its device time with CUDA events. The profiler holds how the
    rounds are taken by default; a :meth:`profile` call may give its own
    counts (``profile(batch, num_warmup=5, num_measure=20, num_rounds=5)``),
    which override the profiler's for that call.

    Parameters
    ----------
    pipeline : SWPipeline
        A pipeline whose plan is bound to task functions. It must have no
        shortcut enabled when :meth:`profile` starts.
    num_warmup : int
        Serial iterations before anything is timed (``>= 0``), unless a call
        gives its own.
    num_measure : int
        Iterations per timed round (``>= 1``); also the iterations that time
        each task and measure its memory. A call may give its own.
    num_rounds : int
        Timed rounds of the baseline and of each shortcut task (``>= 1``). A
        call may give its own.
    interleave : bool
        Take the rounds interleaved (a baseline round, then one round per
        task, repeated) rather than phased (all baseline rounds first, then
        each task's rounds; ``interleave=False``). Slow drift in machine load
        (other processes, clocks) then shifts baseline and shortcut rounds
        alike instead of biasing every exposed time; the price is one
        untimed caching iteration per task per round instead of per task.
    progress : bool
        Show a tqdm bar over (1 + tasks) x rounds (the 1 is the baseline).
    calibrate : bool
        Each profile also measures the machine
        (:func:`swpipe_core.measure.calibrate.calibrate`: engine costs, cores
        free, each task's CPU share) into ``meta["machine_calibration"]``;
        ``CostModel.from_profile`` keeps it.

    Raises
    ------
    OptionError
        A count out of range (a ``ValueError`` and a ``TypeError``), or an option of another call
        (``strict=`` is the pipeline's): its ``home`` and ``fix`` say where it goes.

    Examples
    --------
    >>> import time
    >>> from swpipe import SWPipeline, TaskProfiler, PipelinePlan, PipelineTask, TaskSchedule
    >>> plan = PipelinePlan(schedule={
    ...     PipelineTask("Load", lambda ctx: setattr(ctx, "x", ctx.batch)): TaskSchedule(),
    ...     PipelineTask("Work", lambda ctx: time.sleep(0.002)): TaskSchedule()},
    ...     intra_iter_deps=[("Work", "Load")])
    >>> with SWPipeline(plan, device="cpu") as pipe:
    ...     result = TaskProfiler(pipe, num_warmup=1, num_measure=2, num_rounds=1).profile(1)
    >>> sorted(result.exposed_s), result.baseline_s > 0, result.device_s
    (['Load', 'Work'], True, None)
    """

    @keywords_checked("TaskProfiler")
    def __init__(self, pipeline: "SWPipeline", *, num_warmup: int = 3, num_measure: int = 10, num_rounds: int = 3,
                 interleave: bool = True, progress: bool = False, calibrate: bool = False) -> None:
        _check_counts("TaskProfiler", num_warmup=num_warmup, num_measure=num_measure, num_rounds=num_rounds)
        self.pipe = pipeline
        self.num_warmup, self.num_measure, self.num_rounds = num_warmup, num_measure, num_rounds
        self.interleave = bool(interleave)
        self.progress = bool(progress)
        self.calibrate = bool(calibrate)

    def _counts(self, given_to: str, num_warmup: Optional[int], num_measure: Optional[int],
                num_rounds: Optional[int]) -> Tuple[int, int, int]:
        """The counts of one call: each one given to the call, else the profiler's (checked like the profiler's)."""
        counts = {"num_warmup": self.num_warmup if num_warmup is None else num_warmup,
                  "num_measure": self.num_measure if num_measure is None else num_measure,
                  "num_rounds": self.num_rounds if num_rounds is None else num_rounds}
        _check_counts(given_to, **counts)
        return counts["num_warmup"], counts["num_measure"], counts["num_rounds"]

    @keywords_checked("TaskProfiler.profile")
    def profile(self, batch: Any, num_warmup: Optional[int] = None, num_measure: Optional[int] = None,
                num_rounds: Optional[int] = None, skip_tasks: Optional[Iterable[str]] = None, *,
                task_times: bool = True, memory: Optional[bool] = None, state: TrainState = None) -> ProfileResult:
        """Four phases: warmup, baseline, per-task shortcut, exposed time.

        (1) ``num_warmup`` serial iterations. (2) Baseline: ``num_rounds``
        rounds of ``num_measure`` serial iterations, median of the per-round
        means. (3) For each task not in ``skip_tasks``: shortcut it, run one
        caching iteration (untimed), then time rounds; disable it (dropping
        its cache). (4) ``exposed = max(0, baseline - median)``. By default
        the rounds of (2) and (3) are interleaved (the profiler's
        ``interleave``). Each round synchronises the device exactly twice on
        CUDA (before and after its iterations) and never on CPU. With
        ``task_times``, a last phase wraps each task execution to record host
        time (and device time with CUDA events on CUDA) over ``num_measure``
        iterations. With the profiler's ``calibrate``, the machine is measured
        last.

        Parameters
        ----------
        batch : Any
            A representative batch; every iteration runs on it.
        num_warmup, num_measure, num_rounds : int, optional
            The counts of this call (the API reference's ``profile(batch, num_warmup=5, num_measure=20,
            num_rounds=5)``, positional too); each one not given is the profiler's (``TaskProfiler(pipe,
            num_measure=...)``, by default 3, 10 and 3). ``meta`` records the counts used.
        skip_tasks : iterable of str, optional
            Tasks not to shortcut (those that cannot be shortcut on their own,
            e.g. a backward whose loss another task consumes).
        task_times : bool
            Also record per-task host (and on CUDA device) time.
        memory : bool, optional
            Default: as ``task_times``. Also record per-task bytes added to and freed from the context
            (and on CUDA allocated and freed on the device) over
            ``num_measure`` serial iterations
            (:func:`swpipe_core.measure.memory.measure_task_memory`), in
            :attr:`ProfileResult.memory`.
        state : modules, optimizers, or a list of them, optional
            What the tasks train. The profile runs the training step many
            times on ``batch``; with ``state`` the model, its gradients, the
            optimizer's state and torch's random generators are restored
            exactly afterwards (:func:`swpipe_core.measure.measured.measured_on`).
            Without it the model keeps those steps and a ``RuntimeWarning``
            says how many; ``meta["task_runs"]`` (how often each task ran) and
            the report say it either way.

        Returns
        -------
        ProfileResult

        Raises
        ------
        ValueError
            Unknown task names in ``skip_tasks`` (valid names listed), or
            shortcuts already enabled on the pipeline.
        OptionError
            A count out of range (``given_to`` is ``"TaskProfiler.profile"``), or an option of another call
            (``calibrate=`` is the profiler's: ``TaskProfiler(pipe, calibrate=True)``).

        Examples
        --------
        >>> from swpipe import SWPipeline, TaskProfiler, PipelinePlan, PipelineTask, TaskSchedule
        >>> plan = PipelinePlan({PipelineTask("Work", lambda ctx: sum(range(100))): TaskSchedule()})
        >>> with SWPipeline(plan, device="cpu") as pipe:
        ...     profiler = TaskProfiler(pipe)
        ...     result = profiler.profile(0, num_warmup=0, num_measure=2, num_rounds=1)
        ...     positional = profiler.profile(0, 1, 3, 2, None, task_times=False)
        >>> [result.meta[k] for k in ("num_warmup", "num_measure", "num_rounds")]
        [0, 2, 1]
        >>> [positional.meta[k] for k in ("num_warmup", "num_measure", "num_rounds")]
        [1, 3, 2]
        """
        from swpipe_core.measure.measured import measured_on

        counts = self._counts("TaskProfiler.profile", num_warmup, num_measure, num_rounds)
        with measured_on(self.pipe, state, "TaskProfiler.profile") as ran:
            result = self._profile(batch, skip_tasks, counts, task_times=task_times, memory=memory)
        result.meta["task_runs"] = dict(ran.runs)
        result.meta["state_restored"] = ran.restored
        return result

    def _profile(self, batch: Any, skip_tasks: Optional[Iterable[str]], counts: Tuple[int, int, int], *,
                 task_times: bool, memory: Optional[bool]) -> ProfileResult:
        pipe = self.pipe
        num_warmup, num_measure, num_rounds = counts
        import torch

        skip, targets = _targets(pipe, skip_tasks)
        device = torch.device(pipe.device)
        sync = _device_sync(pipe)
        counter = itertools.count()
        wall0 = time.perf_counter()

        # (1) warmup, (2) baseline rounds, (3) shortcut rounds per task
        rounds = _Rounds(pipe, batch, num_measure, counter, sync,
                         _progress_bar((1 + len(targets)) * num_rounds, enabled=self.progress))
        baseline_rounds, shortcut_rounds = rounds.measure(targets, num_warmup, num_rounds, self.interleave)
        baseline = statistics.median(baseline_rounds)
        _log.debug("baseline %.3f ms (rounds %s)", baseline * 1e3, baseline_rounds)
        # (4) exposed time
        shortcut_s = {n: statistics.median(r) for n, r in shortcut_rounds.items()}
        exposed = {n: max(0.0, baseline - s) for n, s in shortcut_s.items()}

        # (5) per-task host/device times, bytes, the machine
        host_s = device_s = None
        host_mean: Dict[str, float] = {}
        if task_times:
            host_s, device_s = _time_tasks(pipe, batch, num_measure, counter, sync, means=host_mean)
        mem = _task_memory(pipe, batch, num_measure, counter) if (task_times if memory is None else memory) else None
        measured = {"num_warmup": num_warmup, "num_measure": num_measure, "num_rounds": num_rounds,
                    "interleave": self.interleave, "skip_tasks": sorted(skip), "baseline_rounds_s": baseline_rounds,
                    "page_faults_per_iteration": statistics.median(rounds.baseline_faults),
                    "shortcut_s": shortcut_s, "shortcut_rounds_s": shortcut_rounds}
        meta = _meta(pipe, device, measured, host_mean if task_times else None, wall0)
        if self.calibrate:
            from swpipe_core.measure.calibrate import calibrate as _calibrate

            meta["machine_calibration"] = _calibrate(pipe, batch).to_dict()
        return ProfileResult(baseline_s=baseline, exposed_s=exposed, host_s=host_s, device_s=device_s, meta=meta,
                             memory=mem)

    @keywords_checked("TaskProfiler.profile_many")
    def profile_many(self, batches: Iterable[Any], num_warmup: Optional[int] = None, num_measure: Optional[int] = None,
                     num_rounds: Optional[int] = None, skip_tasks: Optional[Iterable[str]] = None, *,
                     task_times: bool = True, memory: Optional[bool] = None,
                     state: TrainState = None) -> List[ProfileResult]:
        """Profile each batch independently (how exposed time varies with the data).

        Parameters
        ----------
        batches : iterable
            One :meth:`profile` per batch, with the same settings.
        num_warmup, num_measure, num_rounds, skip_tasks, task_times, memory, state
            As in :meth:`profile` (with ``state``, restored after each batch's profile).

        Returns
        -------
        list of ProfileResult
            In the order of ``batches``; ``meta["batch_index"]`` says which.

        Raises
        ------
        ValueError
            As :meth:`profile`.
        OptionError
            As :meth:`profile` (``given_to`` is ``"TaskProfiler.profile_many"``), before any batch is profiled.

        Examples
        --------
        >>> from swpipe import SWPipeline, TaskProfiler, PipelinePlan, PipelineTask, TaskSchedule
        >>> plan = PipelinePlan({PipelineTask("Work", lambda ctx: sum(range(ctx.batch))): TaskSchedule()})
        >>> with SWPipeline(plan, device="cpu") as pipe:
        ...     results = TaskProfiler(pipe).profile_many([10, 1000], num_warmup=0, num_measure=2, num_rounds=1)
        >>> [(r.meta["batch_index"], r.meta["num_measure"]) for r in results]
        [(0, 2), (1, 2)]
        """
        counts = self._counts("TaskProfiler.profile_many", num_warmup, num_measure, num_rounds)
        skip = None if skip_tasks is None else set(skip_tasks)
        results = []
        for i, batch in enumerate(batches):
            r = self.profile(batch, *counts, skip, task_times=task_times, memory=memory, state=state)
            r.meta["batch_index"] = i
            results.append(r)
        return results


def _check_counts(given_to: str, **counts: Any) -> None:
    """Raise :class:`OptionError` for a count of rounds out of range (``num_warmup >= 0``, the others ``>= 1``)."""
    for name, value in counts.items():
        low = 0 if name == "num_warmup" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise OptionError(given_to, name, value, expected=f"an integer >= {low}")


def _task_memory(pipe: "SWPipeline", batch: Any, num_measure: int, counter: Iterator[int]) -> Dict[str, Any]:
    """Per-task bytes over ``num_measure`` serial iterations, which take the next indices of ``counter``."""
    from swpipe_core.measure.memory import measure_task_memory

    start = next(counter)
    for _ in range(num_measure - 1):
        next(counter)
    return measure_task_memory(pipe, batch, num_measure, iter_start=start).to_dict()


def _meta(pipe: "SWPipeline", device: "torch.device", measured: Dict[str, Any], host_mean: Optional[Dict[str, float]],
          wall0: float) -> Dict[str, Any]:
    """How the profile was measured: where, the ``measured`` settings and rounds, what each time means.

    ``host_mean`` is None when task times were not measured.
    """
    import torch

    timed = host_mean is not None
    device_time = ("CUDA events around each task on its stream, the stream held by a spin kernel until the host has "
                   "launched the task (device work only), in iterations apart from those that time the host"
                   if device.type == "cuda" else _CPU_DEVICE_NOTE)
    return {
        "device": str(device),
        "machine": _machine(pipe),
        **measured,
        "host_time": "median perf_counter time of each task's execution on its thread" if timed else "not measured",
        # means add up to the serial iteration (medians of skewed times do not): CostModel.from_profile uses them
        "host_mean_s": host_mean if timed else {},
        "device_time": device_time if timed else "not measured",
        "wall_s": time.perf_counter() - wall0,
        "torch": torch.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def _machine(pipe: "SWPipeline") -> str:
    """A one-line description of where the profile ran (recorded in cost models)."""
    import os
    import platform

    import torch

    host = f"{os.cpu_count()}-core {platform.machine()} CPU, torch {torch.__version__}"
    streams = pipe.streams
    if streams.is_cuda:
        return f"{streams.dev.describe()}; {host}"
    return host


def _device_sync(pipe: "SWPipeline") -> Callable[[], None]:
    """A bounded wait for all of ``pipe``'s device work (nothing on CPU); raises if the device does not finish."""
    streams = pipe.streams
    if not streams.is_cuda:
        return lambda: None
    timeout = pipe.timeouts.progress_s

    def sync() -> None:
        if not streams.synchronize(timeout):
            raise RuntimeError(f"profiling: the device work did not complete within {timeout:g} s "
                               "(Timeouts.progress_s); a kernel is hung or slow")
    return sync


class _NoBar:
    """The progress bar used when none is asked for."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="profile", unit="round")


def _targets(pipe: "SWPipeline", skip_tasks: Optional[Iterable[str]]) -> Tuple[set, List[str]]:
    """The tasks to skip and the tasks to measure; a clear error for unknown names or shortcuts already on."""
    names = list(pipe.plan.task_names)
    skip = set(skip_tasks or ())
    unknown = sorted(skip - set(names))
    if unknown:
        raise ValueError(f"skip_tasks names unknown tasks {unknown}; valid task names: {names}")
    active = pipe.shortcuts
    if active:
        raise ValueError(
            f"tasks {active} are already shortcut; the profile measures against the full step. "
            f"Call pipe.disable_shortcut({', '.join(map(repr, active))}) first."
        )
    return skip, [n for n in names if n not in skip]


class _Rounds:
    """Timed rounds of ``num_measure`` serial iterations: the baseline, and with one task shortcut."""

    def __init__(self, pipe: "SWPipeline", batch: Any, num_measure: int, counter: Iterator[int],
                 sync: Callable[[], None], bar: Any) -> None:
        self.pipe, self.batch, self.num_measure, self.counter, self.sync, self.bar = (
            pipe, batch, num_measure, counter, sync, bar)
        self.baseline_faults: List[float] = []  # minor page faults per iteration, per baseline round

    def _iteration(self) -> None:
        self.pipe.run_one_serial_iter(self.batch, iter_idx=next(self.counter))

    def timed(self, label: str) -> float:
        """Seconds per iteration of one round."""
        self.bar.set_postfix_str(label)
        self.sync()
        faults0, t0 = minor_faults(), time.perf_counter()
        for _ in range(self.num_measure):
            self._iteration()
        self.sync()
        elapsed = time.perf_counter() - t0
        if label == "baseline":
            self.baseline_faults.append((minor_faults() - faults0) / self.num_measure)
        self.bar.update(1)
        return elapsed / self.num_measure

    def shortcut(self, name: str, rounds: int) -> List[float]:
        """``rounds`` timed rounds with ``name`` shortcut, after one untimed caching iteration."""
        self.pipe.enable_shortcut(name)
        try:
            self._iteration()  # caching, untimed
            return [self.timed(name) for _ in range(rounds)]
        finally:
            self.pipe.disable_shortcut(name)  # also drops the cache

    def measure(self, targets: List[str], num_warmup: int, num_rounds: int,
                interleave: bool) -> Tuple[List[float], Dict[str, List[float]]]:
        """Warm up, then the baseline and shortcut rounds; returns (baseline rounds, rounds per task)."""
        baseline: List[float] = []
        per_task: Dict[str, List[float]] = {n: [] for n in targets}
        try:
            for _ in range(num_warmup):
                self._iteration()
            if interleave:
                # a baseline round, then one round per task, num_rounds times; the task order rotates so no
                # task always follows the baseline
                for r in range(num_rounds):
                    baseline.append(self.timed("baseline"))
                    k = r % len(targets) if targets else 0
                    for name in targets[k:] + targets[:k]:
                        per_task[name] += self.shortcut(name, 1)
            else:
                # every baseline round, then every round of each task in turn
                baseline = [self.timed("baseline") for _ in range(num_rounds)]
                for name in targets:
                    per_task[name] = self.shortcut(name, num_rounds)
        finally:
            self.bar.close()
        return baseline, per_task


def _time_tasks(pipe: "SWPipeline", batch: Any, n: int, counter: Iterator[int], sync: Callable[[], None],
                means: Optional[Dict[str, float]] = None):
    """Median host (and on CUDA device) seconds per task over ``n`` serial iterations.

    Runs every task through ``SWPipeline.instrument`` for the duration, so
    the timing covers exactly one task execution. Host time comes from ``n``
    iterations with nothing added around the tasks. On CUDA, device time
    comes from ``n`` further iterations: the span between events recorded
    before and after the task on its (current) stream. Two events around a
    task alone read about ``max(host, device)``: an idle stream runs the
    start event at once and then waits for the host to launch each kernel.
    So the stream is first held by a spin kernel lasting twice the task's
    host time plus 1 ms; the kernels queue up behind it and the span between
    the events is the device's own work. The spin would delay a task that
    waits for the device on the host (``.item()``, a blocking collective)
    by its own length, which is why the host is timed in iterations
    without it. For such a task the span also holds its host work after
    the wait (the stream idles meanwhile).
    """
    streams = pipe.streams
    cuda = streams.is_cuda
    host: Dict[str, List[float]] = {}
    events: List[tuple] = []

    def host_timed(original: "RunTask", task: "PipelineTask", ctx: "IterContext") -> None:
        t0 = time.perf_counter()
        original(task, ctx)
        host.setdefault(task.name, []).append(time.perf_counter() - t0)

    def device_timed(original: "RunTask", task: "PipelineTask", ctx: "IterContext") -> None:
        dev = streams.dev
        stream = dev.current_stream()
        dev.spin(2.0 * host_s.get(task.name, 0.0) + 1e-3)
        start = streams.record(stream, timing=True)
        original(task, ctx)
        events.append((task.name, start, streams.record(stream, timing=True)))

    with pipe.instrument(host_timed):
        sync()
        for _ in range(n):
            pipe.run_one_serial_iter(batch, iter_idx=next(counter))
        sync()
    if not host:
        _log.warning("per-task times not recorded: the pipeline did not run its tasks through instrument()")
        return None, None
    host_s = {name: statistics.median(v[-n:]) for name, v in host.items()}
    if means is not None:
        means.update({name: statistics.fmean(v[-n:]) for name, v in host.items()})
    if not cuda:
        return host_s, None
    with pipe.instrument(device_timed):
        for _ in range(n):
            pipe.run_one_serial_iter(batch, iter_idx=next(counter))
        sync()
    spans: Dict[str, List[float]] = {}
    for name, start, end in events:
        spans.setdefault(name, []).append(streams.dev.elapsed_s(start, end))
        streams.recycle((start, end), timing=True)
    return host_s, {name: statistics.median(v) for name, v in spans.items()}
