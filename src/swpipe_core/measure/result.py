"""ProfileResult: what a profile measured, the report it prints, and its JSON file.

The serial baseline and each task's exposed time (``exposed(T) =
max(0, baseline - median(serial iteration with T shortcut))``), with each
task's host and device time and bytes where measured, and how it was
measured (``meta``). :class:`~swpipe_core.measure.profiler.TaskProfiler`
makes one; :meth:`CostModel.from_profile
<autosched.model.costs.CostModel.from_profile>` reads one.

This module imports only the standard library at import time (pandas inside
:meth:`ProfileResult.to_dataframe`), so ``import swpipe_core`` stays light.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

__all__ = ["ProfileResult"]

# A step that faults this many pages (a few us each) is paying for the allocator, not only for its tasks.
_FAULTS_WORTH_NOTING = 100
_FAULTS_HINT = (" (malloc gives freed memory back to the system each step, and task times depend on how much: "
                "swpipe_core.keep_freed_memory() keeps it)")

_SCHEMA_VERSION = 2  # 2 added the optional "memory" field; version 1 files still load
_READS_VERSIONS = (1, 2)


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
            from swpipe_core.measure.measured import MeasuredRun

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
