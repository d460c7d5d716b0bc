"""Per-task exposed time, measured on the real training step by shortcutting.

``exposed(T) = max(0, baseline - median(serial iteration with T shortcut))``:
how much one serial iteration speeds up when task ``T`` is replaced by a
replay of its cached output (:mod:`swpipe_core.engine.shortcut`). A task that
overlaps others (device work hidden behind host work) exposes less than it
takes; the exposed times are what an auto-scheduler has to hide.

This module imports only the standard library at import time (torch when a
profile runs, tqdm when a progress bar is asked for, pandas inside
:meth:`ProfileResult.to_dataframe`), so :mod:`swpipe_core.plan` can re-export
:class:`ProfileResult` without making ``import swpipe_core`` heavy.
"""

from __future__ import annotations

import datetime
import itertools
import json
import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from swpipe_core.measure.allocator import minor_faults

# A step that faults this many pages (a few us each) is paying for the allocator, not only for its tasks.
_FAULTS_WORTH_NOTING = 100
_FAULTS_HINT = (" (malloc gives freed memory back to the system each step, and task times depend on how much: "
                "swpipe_core.keep_freed_memory() keeps it)")

__all__ = ["TaskProfiler", "ProfileResult"]

_log = logging.getLogger(__name__)

_SCHEMA_VERSION = 2  # 2 added the optional "memory" field; version 1 files still load
_READS_VERSIONS = (1, 2)
_CPU_DEVICE_NOTE = "not measured on CPU: there is no device queue, all of a task's time is host time (host_s)"


@dataclass
class ProfileResult:
    """Result of :meth:`TaskProfiler.profile`: the serial baseline and each task's exposed time.

    ``exposed_s[T] = max(0, baseline_s - median(serial iteration with T shortcut))``.

    Parameters
    ----------
    baseline_s : float
        Median wall-clock seconds of one serial iteration.
    exposed_s : dict
        ``{task name: exposed seconds}``, in the plan's task order.
    host_s : dict, optional
        ``{task name: median seconds the task's function held its CPU thread}``.
    device_s : dict, optional
        ``{task name: median seconds on its stream}`` (CUDA events; None on CPU).
    meta : dict
        How it was measured: device, counts, per-round samples, the
        profiler's own wall time (``wall_s``), torch version, date.
    memory : dict, optional
        Per-task bytes (:meth:`swpipe_core.measure.memory.MemoryFigures.to_dict`):
        ``{"batch_bytes": ..., "method": ..., "tasks": {name: {"add_bytes",
        "free_bytes", "device_alloc_bytes", "device_free_bytes"}}}``; None when
        not measured. Not shown in the repr (it is long).

    Examples
    --------
    >>> r = ProfileResult(baseline_s=0.010, exposed_s={"A": 0.004, "B": 0.005})
    >>> round(sum(r.exposed_s.values()) / r.baseline_s, 2)
    0.9
    >>> r.print_report()
    Baseline serial iteration: 10.000 ms
    <BLANKLINE>
      Task                       Exposed   % baseline
      ------------------------ ---------- ------------
      A                          4.000ms       40.0%
      B                          5.000ms       50.0%
      ------------------------ ---------- ------------
      SUM                        9.000ms       90.0%
    """

    baseline_s: float
    exposed_s: Dict[str, float] = field(default_factory=dict)
    host_s: Optional[Dict[str, float]] = None
    device_s: Optional[Dict[str, float]] = None
    meta: Dict[str, Any] = field(default_factory=dict)
    memory: Optional[Dict[str, Any]] = field(default=None, repr=False)

    def format_report(self) -> str:
        """The report :meth:`print_report` prints, as a string.

        One row per task with its exposed time in ms and as a percentage of
        the baseline, then the sum. A SUM above 100 % means tasks overlap on
        the critical path (shortcutting either one removes the shared time).

        Returns
        -------
        str

        Examples
        --------
        >>> print(ProfileResult(0.002, {"H2D": 0.0005}).format_report().splitlines()[4])
          H2D                        0.500ms       25.0%
        """
        if self.host_s is not None or self.device_s is not None:
            return self._format_with_times()
        width = max([24, *(len(n) for n in self.exposed_s)])
        pct = (lambda s: 100.0 * s / self.baseline_s) if self.baseline_s > 0 else (lambda s: 0.0)
        rule = f"  {'-' * width} {'-' * 10} {'-' * 12}"
        lines = [
            *self._header(),
            "",
            f"  {'Task':<{width}} {'Exposed':>9}  {'% baseline':>11}",
            rule,
        ]
        for name, s in self.exposed_s.items():
            lines.append(f"  {name:<{width}} {s * 1e3:>7.3f}ms{pct(s):>11.1f}%")
        total = sum(self.exposed_s.values())
        lines += [rule, f"  {'SUM':<{width}} {total * 1e3:>7.3f}ms{pct(total):>11.1f}%"]
        lines += self._consistency(total, self.exposed_noise_s())
        return "\n".join(lines)

    def _header(self) -> List[str]:
        """The baseline line, then the serial iteration's page faults where the profile counted them.

        Examples
        --------
        >>> ProfileResult(0.008, {"A": 0.004}, meta={"page_faults_per_iteration": 12.0})._header()
        ['Baseline serial iteration: 8.000 ms', 'Page faults per serial iteration: 12']
        >>> many = ProfileResult(0.008, {"A": 0.004}, meta={"page_faults_per_iteration": 850.0})._header()[1]
        >>> many.startswith("Page faults per serial iteration: 850 ("), "swpipe_core.keep_freed_memory()" in many
        (True, True)
        """
        lines = [f"Baseline serial iteration: {self.baseline_s * 1e3:.3f} ms"]
        if self.meta.get("task_runs") is not None:
            from swpipe_core.measure.state import MeasuredRun

            ran = MeasuredRun(dict(self.meta["task_runs"]), bool(self.meta.get("state_restored")))
            lines.append(f"The profile {ran.describe()}")
        faults = self.meta.get("page_faults_per_iteration")
        if faults is not None:
            hint = _FAULTS_HINT if faults >= _FAULTS_WORTH_NOTING else ""
            lines.append(f"Page faults per serial iteration: {faults:.0f}{hint}")
        return lines

    def exposed_noise_s(self) -> Dict[str, float]:
        """Per task, half the range of its exposed time over the rounds (``{}`` with fewer than two rounds).

        Round ``r``'s exposed time is that round's baseline minus the task's
        shortcut round ``r`` (interleaved rounds are taken side by side).

        Examples
        --------
        >>> r = ProfileResult(0.010, {"A": 0.002}, meta={"baseline_rounds_s": [0.010, 0.011, 0.010],
        ...                                                "shortcut_rounds_s": {"A": [0.008, 0.008, 0.009]}})
        >>> round(r.exposed_noise_s()["A"] * 1e3, 3)
        1.0
        """
        base = self.meta.get("baseline_rounds_s") or []
        out: Dict[str, float] = {}
        for name, rounds in (self.meta.get("shortcut_rounds_s") or {}).items():
            exposed = [b - s for b, s in zip(base, rounds)]
            if len(exposed) >= 2:
                out[name] = (max(exposed) - min(exposed)) / 2
        return out

    def _format_with_times(self) -> str:
        """The report with host and device time per task next to exposed time (the cost model's inputs)."""
        host, device = self.host_s or {}, self.device_s or {}
        names = list(dict.fromkeys([*self.exposed_s, *host, *device]))
        width = max([24, *(len(n) for n in names)])
        pct = (lambda s: 100.0 * s / self.baseline_s) if self.baseline_s > 0 else (lambda s: 0.0)
        noise = self.exposed_noise_s()

        def ms(table: Dict[str, float], name: str) -> str:
            return f"{table[name] * 1e3:>9.3f}ms" if name in table else f"{'-':>11}"

        def spread(name: str) -> str:
            if not noise:
                return ""
            if name not in noise:
                return f" {'':>9}"
            flag = "~" if noise[name] >= self.exposed_s.get(name, 0.0) else " "
            return f" {'+-' + format(noise[name] * 1e3, '.3f'):>8}{flag}"

        head = (f"  {'Task':<{width}} {'Exposed':>11}" + (f" {'noise':>9}" if noise else "")
                + f" {'% baseline':>11} {'Host':>11} {'Device':>11}")
        rule = f"  {'-' * width} {'-' * 11}" + (f" {'-' * 9}" if noise else "") + f" {'-' * 11} {'-' * 11} {'-' * 11}"
        lines = [*self._header(), "", head, rule]
        for name in names:
            share = f"{pct(self.exposed_s[name]):>10.1f}%" if name in self.exposed_s else f"{'-':>11}"
            lines.append(f"  {name:<{width}} {ms(self.exposed_s, name)}{spread(name)} {share} {ms(host, name)} "
                         f"{ms(device, name)}")
        total = {"e": sum(self.exposed_s.values())}
        total.update({k: sum(t.values()) for k, t in (("h", host), ("d", device)) if t})
        lines += [rule, f"  {'SUM':<{width}} {ms(total, 'e')}" + (f" {'':>9}" if noise else "")
                  + f" {pct(total['e']):>10.1f}% {ms(total, 'h')} {ms(total, 'd')}"]
        lines += ["", "  Exposed: how much the serial step speeds up without the task (shortcut).",
                  "  Host: CPU time the task's function held its thread; Device: time on its stream (CUDA).",
                  "  CostModel.from_profile takes host_s = Host (Exposed where Host is -) and device_s = Device."]
        lines += self._consistency(total["e"], noise)
        return "\n".join(lines)

    def _consistency(self, exposed_sum: float, noise: Dict[str, float]) -> List[str]:
        """What the exposed times say about each other and the baseline, when they need saying."""
        out = []
        if noise:
            out.append("  noise: half the range of the exposed time over the rounds; ~: the task's exposed time is "
                       "within it (not measurably above 0)")
            flagged = [n for n, v in noise.items() if v >= self.exposed_s.get(n, 0.0)]
            if flagged:
                out.append(f"  Within noise: {', '.join(flagged)} (more rounds, num_rounds=, narrow it)")
        if self.baseline_s > 0 and exposed_sum > 1.05 * self.baseline_s:
            out.append(f"  The exposed times sum to {100 * exposed_sum / self.baseline_s:.0f} % of the baseline: each is "
                       "what skipping that task alone saves, and a task whose wait another task's work covers saves "
                       "that wait once per task, so they add up to more than the step" + (
                           " (and noise adds to each)" if noise else ""))
        return [""] + out if out else []

    def print_report(self) -> None:
        """Print :meth:`format_report` (baseline, per-task exposed, host and device ms, SUM).

        Examples
        --------
        >>> ProfileResult(0.010, {"A": 0.004}, host_s={"A": 0.005, "B": 0.001}, device_s={"A": 0.002}).print_report()
        Baseline serial iteration: 10.000 ms
        <BLANKLINE>
          Task                         Exposed  % baseline        Host      Device
          ------------------------ ----------- ----------- ----------- -----------
          A                            4.000ms       40.0%     5.000ms     2.000ms
          B                                  -           -     1.000ms           -
          ------------------------ ----------- ----------- ----------- -----------
          SUM                          4.000ms       40.0%     6.000ms     2.000ms
        <BLANKLINE>
          Exposed: how much the serial step speeds up without the task (shortcut).
          Host: CPU time the task's function held its thread; Device: time on its stream (CUDA).
          CostModel.from_profile takes host_s = Host (Exposed where Host is -) and device_s = Device.
        """
        print(self.format_report())

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict of all fields: schema ``version`` 2 with ``memory``, else 1 (older readers load it)."""
        out = {
            "version": _SCHEMA_VERSION if self.memory is not None else 1,
            "baseline_s": self.baseline_s,
            "exposed_s": dict(self.exposed_s),
            "host_s": None if self.host_s is None else dict(self.host_s),
            "device_s": None if self.device_s is None else dict(self.device_s),
            "meta": self.meta,
        }
        if self.memory is not None:
            out["memory"] = self.memory
        return out

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "ProfileResult":
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        ValueError
            If the schema version is not one this code reads, or a field is missing.
        """
        version = data.get("version", _SCHEMA_VERSION)
        if version not in _READS_VERSIONS:
            raise ValueError(f"ProfileResult schema version {version!r} is not supported (this code reads "
                             f"{', '.join(map(str, _READS_VERSIONS))})")
        if "baseline_s" not in data:
            raise ValueError("not a ProfileResult: the 'baseline_s' field is missing")
        return cls(
            baseline_s=float(data["baseline_s"]),
            exposed_s={str(k): float(v) for k, v in data.get("exposed_s", {}).items()},
            host_s=data.get("host_s"),
            device_s=data.get("device_s"),
            meta=dict(data.get("meta") or {}),
            memory=data.get("memory"),
        )

    def save(self, path: str) -> None:
        """Write the result to ``path`` as JSON.

        Parameters
        ----------
        path : str or path-like

        Examples
        --------
        >>> import os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "profile.json")
        >>> ProfileResult(0.01, {"A": 0.002}, meta={"device": "cpu"}).save(p)
        >>> ProfileResult.load(p)
        ProfileResult(baseline_s=0.01, exposed_s={'A': 0.002}, host_s=None, device_s=None, meta={'device': 'cpu'})
        """
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=False)
            f.write("\n")

    @classmethod
    def load(cls, path: str) -> "ProfileResult":
        """Read a result written by :meth:`save`.

        Parameters
        ----------
        path : str or path-like

        Returns
        -------
        ProfileResult

        Raises
        ------
        ValueError
            If the file is not a ProfileResult of a supported schema version.
        """
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def to_dataframe(self) -> Any:
        """One row per task: exposed seconds and % of baseline, host and device seconds.

        pandas is imported here, not at module import.

        Returns
        -------
        pandas.DataFrame
            Indexed by task name, columns ``exposed_s``, ``pct_baseline``,
            ``host_s``, ``device_s`` (NaN where not measured).

        Examples
        --------
        >>> df = ProfileResult(0.01, {"A": 0.002, "B": 0.005}, host_s={"A": 0.003, "B": 0.006}).to_dataframe()
        >>> df["pct_baseline"].round(1).tolist(), df.index.tolist()
        ([20.0, 50.0], ['A', 'B'])
        """
        import pandas as pd

        names = list(self.exposed_s) + [n for n in (self.host_s or {}) if n not in self.exposed_s]
        rows = []
        for n in names:
            exposed = self.exposed_s.get(n)
            rows.append({
                "task": n,
                "exposed_s": exposed,
                "pct_baseline": None if exposed is None or self.baseline_s <= 0 else 100.0 * exposed / self.baseline_s,
                "host_s": (self.host_s or {}).get(n),
                "device_s": (self.device_s or {}).get(n),
            })
        df = pd.DataFrame(rows, columns=["task", "exposed_s", "pct_baseline", "host_s", "device_s"])
        return df.set_index("task").astype(float)


class TaskProfiler:
    """Measure each task's exposed time on a :class:`~swpipe_core.engine.pipeline.SWPipeline`.

    Shortcuts one task at a time and times serial iterations
    (``pipe.run_one_serial_iter``); ``exposed(T) = max(0, baseline - median
    shortcut time)``. Optionally also times each task's host (CPU) time and,
    on CUDA, its device time with CUDA events.

    Parameters
    ----------
    pipeline : SWPipeline
        A pipeline whose plan is bound to task functions. It must have no
        shortcut enabled when :meth:`profile` starts.

    Examples
    --------
    >>> import time
    >>> from swpipe_core import PipelinePlan, PipelineTask, TaskSchedule
    >>> from swpipe_core.engine.pipeline import SWPipeline
    >>> plan = PipelinePlan(schedule={
    ...     PipelineTask("Load", lambda ctx: setattr(ctx, "x", ctx.batch)): TaskSchedule(),
    ...     PipelineTask("Work", lambda ctx: time.sleep(0.002)): TaskSchedule()},
    ...     intra_iter_deps=[("Work", "Load")])
    >>> with SWPipeline(plan, device="cpu") as pipe:
    ...     result = TaskProfiler(pipe).profile(1, num_warmup=1, num_measure=2, num_rounds=1)
    >>> sorted(result.exposed_s), result.baseline_s > 0, result.device_s
    (['Load', 'Work'], True, None)
    """

    def __init__(self, pipeline: Any) -> None:
        self.pipe = pipeline

    def profile(
        self,
        batch: Any,
        num_warmup: int = 3,
        num_measure: int = 10,
        num_rounds: int = 3,
        skip_tasks: Optional[Iterable[str]] = None,
        progress: bool = False,
        *,
        task_times: bool = True,
        interleave: bool = True,
        memory: Optional[bool] = None,
        calibrate: bool = False,
        state: Any = None,
    ) -> ProfileResult:
        """Four phases: warmup, baseline, per-task shortcut, exposed time.

        (1) ``num_warmup`` serial iterations. (2) Baseline: ``num_rounds``
        rounds of ``num_measure`` serial iterations, median of the per-round
        means. (3) For each task not in ``skip_tasks``: shortcut it, run one
        caching iteration (untimed), then time rounds; disable it (dropping
        its cache). (4) ``exposed = max(0, baseline - median)``. By default
        the rounds of (2) and (3) are interleaved (see ``interleave``).
        Each round synchronises the device exactly twice on CUDA (before and
        after its iterations) and never on CPU. With ``task_times``, a last
        phase wraps each task execution to record host time (and device time
        with CUDA events on CUDA) over ``num_measure`` iterations.

        Parameters
        ----------
        batch : Any
            A representative batch; every iteration runs on it.
        num_warmup, num_measure, num_rounds : int
            Warmup iterations, iterations per round, rounds.
        skip_tasks : iterable of str, optional
            Tasks not to shortcut (those that cannot be shortcut on their own,
            e.g. a backward whose loss another task consumes).
        progress : bool
            Show a tqdm bar over (1 + tasks) x rounds (the 1 is the baseline).
        task_times : bool
            Also record per-task host (and on CUDA device) time.
        interleave : bool
            Take the rounds interleaved (a baseline round, then one round per
            task, repeated) rather than phased (all baseline rounds first, then
            each task's rounds; ``interleave=False``).
            Slow drift in machine load (other processes, clocks) then shifts
            baseline and shortcut rounds alike instead of biasing every
            exposed time; the price is one untimed caching iteration per task
            per round instead of per task.
        memory : bool, optional
            Default: as ``task_times``. Also record per-task bytes added to and freed from the context
            (and on CUDA allocated and freed on the device) over
            ``num_measure`` serial iterations
            (:func:`swpipe_core.measure.memory.measure_task_memory`), in
            :attr:`ProfileResult.memory`.
        calibrate : bool
            Also measure the machine (:func:`swpipe_core.measure.calibrate.calibrate`:
            engine costs, cores free, each task's CPU share) into
            ``meta["machine_calibration"]``; ``CostModel.from_profile`` keeps it.
        state : modules, optimizers, or a list of them, optional
            What the tasks train. The profile runs the training step many
            times on ``batch``; with ``state`` the model, its gradients, the
            optimizer's state and torch's random generators are restored
            exactly afterwards (:func:`swpipe_core.measure.state.measured_on`).
            Without it the model keeps those steps and a ``RuntimeWarning``
            says how many; ``meta["task_runs"]`` (how often each task ran) and
            the report say it either way.

        Returns
        -------
        ProfileResult

        Raises
        ------
        ValueError
            Unknown task names in ``skip_tasks`` (valid names listed), counts
            out of range, or shortcuts already enabled on the pipeline.
        """
        from swpipe_core.measure.state import measured_on

        with measured_on(self.pipe, state, "TaskProfiler.profile") as ran:
            result = self._profile(batch, num_warmup, num_measure, num_rounds, skip_tasks, progress,
                                   task_times=task_times, interleave=interleave, memory=memory, calibrate=calibrate)
        result.meta["task_runs"] = dict(ran.runs)
        result.meta["state_restored"] = ran.restored
        return result

    def _profile(self, batch: Any, num_warmup: int, num_measure: int, num_rounds: int,
                 skip_tasks: Optional[Iterable[str]], progress: bool, *, task_times: bool, interleave: bool,
                 memory: Optional[bool], calibrate: bool) -> ProfileResult:
        if num_warmup < 0 or num_measure < 1 or num_rounds < 1:
            raise ValueError(
                f"need num_warmup >= 0, num_measure >= 1 and num_rounds >= 1; got "
                f"num_warmup={num_warmup}, num_measure={num_measure}, num_rounds={num_rounds}"
            )
        pipe = self.pipe
        import torch

        skip, targets = _targets(pipe, skip_tasks)
        device = torch.device(getattr(pipe, "device", "cpu"))
        cuda = device.type == "cuda"
        sync = _device_sync(pipe)
        counter = itertools.count()
        wall0 = time.perf_counter()

        # (1) warmup, (2) baseline rounds, (3) shortcut rounds per task
        rounds = _Rounds(pipe, batch, num_measure, counter, sync,
                         _progress_bar((1 + len(targets)) * num_rounds, enabled=progress))
        baseline_rounds, shortcut_rounds = rounds.measure(targets, num_warmup, num_rounds, interleave)
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
        mem = None
        if task_times if memory is None else memory:
            from swpipe_core.measure.memory import measure_task_memory

            start = next(counter)
            for _ in range(num_measure - 1):  # the measured iterations take the next indices
                next(counter)
            mem = measure_task_memory(pipe, batch, num_measure, iter_start=start).to_dict()
        meta: Dict[str, Any] = {
            "device": str(device),
            "machine": _machine(pipe),
            "num_warmup": num_warmup,
            "num_measure": num_measure,
            "num_rounds": num_rounds,
            "interleave": interleave,
            "skip_tasks": sorted(skip),
            "baseline_rounds_s": baseline_rounds,
            "page_faults_per_iteration": statistics.median(rounds.baseline_faults),
            "shortcut_s": shortcut_s,
            "shortcut_rounds_s": shortcut_rounds,
            "host_time": "median perf_counter time of each task's execution on its thread" if task_times else "not measured",
            # means add up to the serial iteration (medians of skewed times do not): CostModel.from_profile uses them
            "host_mean_s": host_mean,
            "device_time": ("CUDA events around each task on its stream, the stream held by a spin kernel "
                            "until the host has launched the task (device work only), in iterations apart from "
                            "those that time the host" if cuda else _CPU_DEVICE_NOTE)
            if task_times else "not measured",
            "wall_s": time.perf_counter() - wall0,
            "torch": torch.__version__,
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        if calibrate:
            from swpipe_core.measure.calibrate import calibrate as _calibrate

            meta["machine_calibration"] = _calibrate(pipe, batch).to_dict()
        return ProfileResult(baseline_s=baseline, exposed_s=exposed, host_s=host_s, device_s=device_s, meta=meta,
                             memory=mem)

    def profile_many(
        self,
        batches: Iterable[Any],
        num_warmup: int = 3,
        num_measure: int = 10,
        num_rounds: int = 3,
        skip_tasks: Optional[Iterable[str]] = None,
        progress: bool = False,
        *,
        task_times: bool = True,
        interleave: bool = True,
        state: Any = None,
    ) -> List[ProfileResult]:
        """Profile each batch independently (how exposed time varies with the data).

        Parameters
        ----------
        batches : iterable
            One :meth:`profile` per batch, with the same settings.
        num_warmup, num_measure, num_rounds, skip_tasks, progress, task_times, interleave, state
            As in :meth:`profile` (with ``state``, restored after each batch's profile).

        Returns
        -------
        list of ProfileResult
            In the order of ``batches``; ``meta["batch_index"]`` says which.

        Raises
        ------
        ValueError
            As :meth:`profile`.
        """
        skip = None if skip_tasks is None else set(skip_tasks)
        results = []
        for i, batch in enumerate(batches):
            r = self.profile(batch, num_warmup, num_measure, num_rounds, skip, progress,
                             task_times=task_times, interleave=interleave, state=state)
            r.meta["batch_index"] = i
            results.append(r)
        return results


def _machine(pipe: Any) -> str:
    """A one-line description of where the profile ran (recorded in cost models)."""
    import os
    import platform

    import torch

    host = f"{os.cpu_count()}-core {platform.machine()} CPU, torch {torch.__version__}"
    streams = getattr(pipe, "_streams", None)
    if streams is not None and streams.is_cuda:
        return f"{streams.dev.describe()}; {host}"
    return host


def _device_sync(pipe: Any) -> Callable[[], None]:
    """A bounded wait for all of ``pipe``'s device work (nothing on CPU); raises if the device does not finish."""
    streams = getattr(pipe, "_streams", None)
    if streams is None or not streams.is_cuda:
        return lambda: None
    timeout = getattr(pipe, "progress_timeout", 60.0)

    def sync() -> None:
        if not streams.synchronize(timeout):
            raise RuntimeError(f"profiling: the device work did not complete within {timeout:g} s "
                               "(progress_timeout); a kernel is hung or slow")
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



def _targets(pipe: Any, skip_tasks: Optional[Iterable[str]]) -> Tuple[set, List[str]]:
    """The tasks to skip and the tasks to measure; a clear error for unknown names or shortcuts already on."""
    names = list(pipe.plan.task_names)
    skip = set(skip_tasks or ())
    unknown = sorted(skip - set(names))
    if unknown:
        raise ValueError(f"skip_tasks names unknown tasks {unknown}; valid task names: {names}")
    active = sorted(getattr(getattr(pipe, "_shortcut", None), "tasks", ()) or ())
    if active:
        raise ValueError(
            f"tasks {active} are already shortcut; the profile measures against the full step. "
            f"Call pipe.disable_shortcut({', '.join(map(repr, active))}) first."
        )
    return skip, [n for n in names if n not in skip]


class _Rounds:
    """Timed rounds of ``num_measure`` serial iterations: the baseline, and with one task shortcut."""

    def __init__(self, pipe: Any, batch: Any, num_measure: int, counter: Any, sync: Callable[[], None],
                 bar: Any) -> None:
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

def _time_tasks(pipe: Any, batch: Any, n: int, counter: Any, sync: Callable[[], None],
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
    streams = getattr(pipe, "_streams", None)
    cuda = streams is not None and streams.is_cuda
    host: Dict[str, List[float]] = {}
    events: List[tuple] = []

    def host_timed(original: Callable[[Any, Any], None], task: Any, ctx: Any) -> None:
        t0 = time.perf_counter()
        original(task, ctx)
        host.setdefault(task.name, []).append(time.perf_counter() - t0)

    def device_timed(original: Callable[[Any, Any], None], task: Any, ctx: Any) -> None:
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
