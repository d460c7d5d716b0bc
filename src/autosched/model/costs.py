"""Per-task cost models: what each task costs on the host and on the device, and what it contends for.

A :class:`CostModel` maps task names to :class:`TaskCost` (defined with
:class:`CostModelError` and the field checks in :mod:`autosched.model.taskcost`,
and public here as part of the cost model; ``host_s``: CPU time
on the task's thread; ``device_s``: time on the task's stream on CUDA;
``resources``: tags ``"comm:<name>"`` for collectives that serialise on one
communicator even across streams, ``"pcie"`` for copies that contend for the
bus). It is built by hand, from a :class:`~swpipe_core.measure.profiler.ProfileResult`,
or from an engine timeline, and stored as JSON (schema version 3, documented
in ``cost_models/README.md``; versions 1 and 2 still load)::

    {"schema": "swpipe-cost-model", "version": 1,
     "machine": "...", "method": "...", "notes": "...", "pipeline": "...",
     "tasks": {"H2D": {"host_s": 5e-05, "device_s": 0.0012, "resources": ["pcie"]}, ...}}

What each part holds on each device is defined in docs/semantics.md ("What
a cost model means"); on a CPU run there is no device queue, so a task's whole
``host_s + device_s`` is thread time (:meth:`TaskCost.cpu_s`).

Version 2 adds optional memory figures (bytes): per task ``add_bytes`` /
``free_bytes`` (tensor storages the task adds to / frees from the iteration's
context), ``transient_bytes`` (held only while it runs) and
``device_alloc_bytes`` / ``device_free_bytes`` (what the CUDA caching
allocator handed out / took back while it ran), and at the top level
``batch_bytes`` (the batch every context holds from its start);
:mod:`autosched.model.memory` predicts bytes in flight from them. A model without
bytes is written as version 1.

Version 3 adds an optional top-level ``cores``: the machine's free cores as a
pool that every host part draws one core from while it runs (docs/semantics.md,
"What a cost model means"; :func:`autosched.model.machine.calibrated_costs` sets it
from the calibration's measured ``cores_free``), and the task tag ``"nocore"``
(a task that sleeps or blocks: its host part takes no core). Absent (``None``)
is unlimited. Each model is written as the lowest version that holds what it has.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field as _dc_field, replace as _dc_replace
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional, Sequence, Union

from autosched.model.taskcost import (BYTE_FIELDS, TASK_FIELDS, CostModelError, TaskCost, check_bytes, check_time,
                                      task_cost_from_dict)

__all__ = ["TaskCost", "CostModel", "CostModelError", "SCHEMA", "SCHEMA_VERSION", "as_cost_model",
           "combine_slowest"]

SCHEMA = "swpipe-cost-model"
SCHEMA_VERSION = 3
_READS_VERSIONS = (1, 2, 3)  # 2 added the optional byte fields, 3 the optional core pool ("cores")
_TOP_FIELDS = {"schema", "version", "machine", "method", "notes", "pipeline", "tasks", "batch_bytes",
               "machine_calibration",  # optional, versioned on its own: swpipe_core.measure.calibrate
               "cores"}


def _check_cores(value: Any, where: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CostModelError(f"cores is {value!r}, not an integer >= 1", where, value=value, fix=
                             "give the number of free cores as an int (autosched.model.taskmodel.core_capacity rounds a "
                             "measured cores_free), or None for unlimited")
    return value


def _names_of(plan_or_names: Any) -> list:
    names = getattr(plan_or_names, "task_names", None)
    if names is not None:
        return list(names)
    if hasattr(plan_or_names, "nodes"):  # a networkx task graph
        return list(plan_or_names.nodes)
    return [getattr(n, "name", n) for n in plan_or_names]


@dataclass
class CostModel:
    """Per-task costs with the machine and method they came from.

    Parameters
    ----------
    tasks : dict
        ``{task_name: TaskCost}``.
    machine, method, notes : str
        Where and how the numbers were obtained (kept in the JSON file).
    pipeline : str
        Optional name of the pipeline the model is for.
    batch_bytes : float
        Bytes of the batch each iteration's context holds from its start (0: not measured).
    machine_calibration : MachineCalibration, optional
        What :mod:`swpipe_core.measure.calibrate` measured (:mod:`autosched.model.machine` folds it in).
    cores : int, optional
        The core pool: at most this many host parts run at once, whatever their
        threads (docs/semantics.md). ``None`` (default): unlimited.
    freshness : CostFreshness, optional
        For a model refreshed from costs measured while the job ran
        (:meth:`refreshed`): per task where its cost came from, how many samples,
        how old and how noisy (:class:`autosched.model.refresh.CostFreshness`;
        ``print(model.freshness)``). Not written to the JSON file; ``None`` otherwise.

    Examples
    --------
    >>> m = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.001, 0.003)}, machine="laptop", method="by hand")
    >>> m["B"].device_s, len(m), "A" in m
    (0.003, 2, True)
    >>> m.scaled("A", 2.0)["A"].host_s
    0.004
    >>> m.replace("B", device_s=0.0)["B"]
    TaskCost(host_s=0.001, device_s=0.0, resources=())
    """

    tasks: Dict[str, TaskCost]
    machine: str = ""
    method: str = ""
    notes: str = ""
    pipeline: str = ""
    batch_bytes: float = 0.0
    machine_calibration: Any = None  # swpipe_core.measure.calibrate.MachineCalibration (autosched.model.machine uses it)
    cores: Optional[int] = None
    freshness: Any = _dc_field(default=None, compare=False, repr=False)  # autosched.model.refresh.CostFreshness

    def __post_init__(self) -> None:
        self.batch_bytes = check_bytes(self.batch_bytes, "batch_bytes")
        self.cores = _check_cores(self.cores, "cores")
        if not isinstance(self.tasks, Mapping):
            raise CostModelError(f"tasks is {type(self.tasks).__name__}, not a dict", "tasks",
                                 "pass {task_name: TaskCost(...)}")
        clean: Dict[str, TaskCost] = {}
        for name, cost in self.tasks.items():
            name = getattr(name, "name", name)
            if not isinstance(name, str) or not name:
                raise CostModelError(f"task name {name!r} is not a non-empty string", "tasks", value=name)
            if isinstance(cost, Mapping):
                cost = task_cost_from_dict(name, cost)
            elif isinstance(cost, (int, float)) and not isinstance(cost, bool):
                cost = TaskCost(cost)
            if not isinstance(cost, TaskCost):
                raise CostModelError(f"cost is {cost!r}, not a TaskCost", f"tasks.{name}",
                                     "use TaskCost(host_s, device_s, resources)", tasks=[name], value=cost)
            clean[name] = cost
        self.tasks = clean

    # -- mapping interface --

    def __getitem__(self, name: Any) -> TaskCost:
        name = getattr(name, "name", name)
        try:
            return self.tasks[name]
        except KeyError:
            raise KeyError(f"no cost for task {name!r}; the cost model has {sorted(self.tasks)}") from None

    def __contains__(self, name: Any) -> bool:
        return getattr(name, "name", name) in self.tasks

    def __iter__(self) -> Iterator[str]:
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    # -- checks --

    def check(self, plan_or_names: Any) -> None:
        """Raise unless every task of a plan (or task graph, or list of names) has a cost.

        Parameters
        ----------
        plan_or_names : PipelinePlan, networkx graph or iterable of names

        Raises
        ------
        CostModelError
            Naming the tasks without a cost.

        Examples
        --------
        >>> CostModel({"A": TaskCost(1e-3)}).check(["A", "B"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        autosched.model.taskcost.CostModelError: tasks: no cost for task(s) ['B'] (the model has ['A']). Fix: add them ...
        """
        missing = [n for n in _names_of(plan_or_names) if n not in self.tasks]
        if missing:
            raise CostModelError(
                f"no cost for task(s) {missing} (the model has {sorted(self.tasks)})", "tasks",
                f"add them to the cost model, e.g. model.tasks[{missing[0]!r}] = TaskCost(host_s=...)", tasks=missing)

    # -- what-if edits --

    def scaled(self, task: Optional[Any], factor: float, part: str = "both") -> "CostModel":
        """A copy with one task's (or every task's, for ``None``) cost multiplied by ``factor``.

        Parameters
        ----------
        task : str, PipelineTask or None
            The task to scale; ``None`` scales every task.
        factor : float
            Multiplier, ``>= 0``.
        part : {"both", "host", "device", "bytes"}
            Which part of the cost to scale. ``"bytes"`` scales the memory
            figures (with ``task=None`` also ``batch_bytes``): "what if the
            batch size doubles".

        Returns
        -------
        CostModel

        Raises
        ------
        KeyError
            For a task without a cost.
        CostModelError
            For a negative factor or an unknown part.

        Examples
        --------
        >>> m = CostModel({"A": TaskCost(0.001, 0.002)})
        >>> m.scaled(None, 3, part="device")["A"]
        TaskCost(host_s=0.001, device_s=0.006, resources=())
        """
        factor = check_time(factor, "factor")
        if part not in ("both", "host", "device", "bytes"):
            raise CostModelError(f"unknown part {part!r}", "part", 'use "both", "host", "device" or "bytes"', value=part)
        names = list(self.tasks) if task is None else [getattr(task, "name", task)]
        new = dict(self.tasks)
        for name in names:
            c = self[name]
            if part == "bytes":
                new[name] = _dc_replace(c, **{n: getattr(c, n) * factor for n in BYTE_FIELDS})
                continue
            host = c.host_s * factor if part in ("both", "host") else c.host_s
            dev = c.device_s * factor if part in ("both", "device") else c.device_s
            new[name] = _dc_replace(c, host_s=host, device_s=dev)
        label = f"{'all' if task is None else names[0]}{' bytes' if part == 'bytes' else ''} x{factor:g}"
        out = self._copy(new, label)
        if part == "bytes" and task is None:
            out.batch_bytes = self.batch_bytes * factor
        return out

    def replace(self, task: Any, **fields: Any) -> "CostModel":
        """A copy with some fields of one task's cost replaced (``host_s``, ``device_s``, ``resources``).

        Parameters
        ----------
        task : str or PipelineTask
        **fields
            New values for :class:`TaskCost` fields.

        Returns
        -------
        CostModel

        Raises
        ------
        KeyError
            For a task without a cost.
        CostModelError
            For an unknown field or a bad value.

        Examples
        --------
        >>> CostModel({"A": TaskCost(0.001)}).replace("A", resources=["pcie"])["A"].resources
        ('pcie',)
        """
        name = getattr(task, "name", task)
        unknown = sorted(set(fields) - TASK_FIELDS)
        if unknown:
            raise CostModelError(f"unknown field(s) {unknown}", f"tasks.{name}", f"use {sorted(TASK_FIELDS)}", tasks=[name],
                                 value=unknown)
        new = dict(self.tasks)
        new[name] = _dc_replace(self[name], **fields)
        return self._copy(new, f"{name} replaced")

    def _copy(self, tasks: Dict[str, TaskCost], edit: str) -> "CostModel":
        notes = f"{self.notes}; what-if: {edit}" if self.notes else f"what-if: {edit}"
        return _dc_replace(self, tasks=tasks, notes=notes)

    # -- builders --

    @classmethod
    def from_profile(cls, result: Any, machine: str = "", notes: str = "") -> "CostModel":
        """Build a model from a :class:`~swpipe_core.measure.profiler.ProfileResult`.

        ``host_s`` / ``device_s`` are used where the profile measured them (``host_s``:
        the mean per task, ``meta["host_mean_s"]``, when recorded, so the tasks' times
        add up to the measured serial iteration; else the median); otherwise a
        task's exposed time becomes its ``host_s`` (on CPU all time is host time). A
        ``meta["machine_calibration"]`` (``TaskProfiler(pipe, calibrate=True).profile(batch)``)
        becomes the model's ``machine_calibration``.

        Parameters
        ----------
        result : ProfileResult
        machine, notes : str

        Returns
        -------
        CostModel

        Examples
        --------
        >>> from swpipe import ProfileResult
        >>> r = ProfileResult(baseline_s=0.01, exposed_s={"A": 0.004, "B": 0.005}, meta={"device": "cpu"})
        >>> m = CostModel.from_profile(r, machine="2-core CPU")
        >>> m["A"].host_s, m.method
        (0.004, 'profile: exposed time (baseline 10.000 ms)')
        """
        meta = getattr(result, "meta", None) or {}
        # the mean host time when the profile has it: means add up to the serial iteration, medians do not
        host = meta.get("host_mean_s") or result.host_s or {}
        device = result.device_s or {}
        memory = getattr(result, "memory", None) or {}
        mem_tasks = memory.get("tasks", {})
        names = list(dict.fromkeys([*result.exposed_s, *host, *device]))
        tasks = {}
        for name in names:
            h = host.get(name, result.exposed_s.get(name, 0.0))
            nbytes = {n: max(0.0, float(v)) for n, v in mem_tasks.get(name, {}).items() if n in BYTE_FIELDS}
            tasks[name] = TaskCost(max(0.0, float(h)), max(0.0, float(device.get(name, 0.0))), **nbytes)
        kind = "host/device time" if result.host_s else "exposed time"
        calibration = meta.get("machine_calibration")
        if isinstance(calibration, Mapping):
            from swpipe_core.measure.calibrate import MachineCalibration

            calibration = MachineCalibration.from_dict(calibration)
        extra = ", ".join(f"{k}={v}" for k, v in sorted(meta.items()) if isinstance(v, (str, int, float)))
        return cls(tasks, machine=machine or str(meta.get("machine", "")),
                   method=f"profile: {kind} (baseline {result.baseline_s * 1e3:.3f} ms)",
                   notes="; ".join(x for x in (notes, extra) if x),
                   batch_bytes=max(0.0, float(memory.get("batch_bytes", 0.0))),
                   machine_calibration=calibration)

    def with_memory(self, figures: Any) -> "CostModel":
        """A copy with the memory figures of :func:`swpipe_core.measure.memory.measure_task_memory` (or its dict).

        Parameters
        ----------
        figures : MemoryFigures or dict
            ``batch_bytes`` and per-task ``add_bytes``, ``free_bytes``,
            ``device_alloc_bytes``, ``device_free_bytes``.

        Returns
        -------
        CostModel

        Examples
        --------
        >>> m = CostModel({"A": TaskCost(0.001)}).with_memory(
        ...     {"batch_bytes": 64, "tasks": {"A": {"add_bytes": 32, "free_bytes": 0}}})
        >>> m.batch_bytes, m["A"].add_bytes
        (64.0, 32.0)
        """
        doc = figures.to_dict() if hasattr(figures, "to_dict") else dict(figures)
        new = dict(self.tasks)
        for name, entry in doc.get("tasks", {}).items():
            if name in new:
                new[name] = _dc_replace(new[name], **{n: float(v) for n, v in entry.items() if n in BYTE_FIELDS})
        out = self._copy(new, "memory measured")
        out.notes = self.notes
        out.batch_bytes = check_bytes(float(doc.get("batch_bytes", 0.0)), "batch_bytes")
        return out

    def refreshed(self, rolling: Any, min_samples: int = 5) -> "CostModel":
        """A copy whose task times are the medians of recent executions, where there are enough of them.

        Per task, the median host duration of ``rolling``'s window replaces
        ``host_s`` (and the median device span ``device_s``) when the window holds
        at least ``min_samples`` of them; a task with fewer keeps this model's cost,
        so one execution on a load spike does not decide. Resource tags, bytes, the
        machine calibration and the core pool are kept. The copy's
        :attr:`freshness` says per task where its cost came from, how old and how
        noisy (:mod:`autosched.model.refresh`).

        Parameters
        ----------
        rolling : RollingCosts
            What the job measured while it ran (:class:`swpipe_core.measure.rolling.RollingCosts`).
        min_samples : int
            The fewest samples that replace a task's cost, ``>= 1``.

        Returns
        -------
        CostModel

        Raises
        ------
        CostModelError
            ``min_samples`` not an integer ``>= 1`` (``.field == "min_samples"``).

        Examples
        --------
        >>> from swpipe_core.measure.rolling import RollingCosts
        >>> r = RollingCosts()
        >>> for d in (0.004, 0.005, 0.004, 0.090, 0.004):  # one spike
        ...     r.add("A", d)
        >>> r.add("B", 0.5)  # one sample: too few
        >>> m = CostModel({"A": TaskCost(0.002, resources=("pcie",)), "B": TaskCost(0.001)}).refreshed(r)
        >>> m["A"], m["B"].host_s, m.freshness.tasks["B"].source
        (TaskCost(host_s=0.004, device_s=0.0, resources=('pcie',)), 0.001, 'model')
        """
        from autosched.model.refresh import refreshed_costs

        return refreshed_costs(self, rolling, min_samples)

    @classmethod
    def from_rolling(cls, rolling: Any, min_samples: int = 5, machine: str = "") -> "CostModel":
        """A model of every task ``rolling`` measured: the medians of its recent executions.

        As :meth:`refreshed` with nothing to fall back on: every task needs
        ``min_samples`` samples.

        Parameters
        ----------
        rolling : RollingCosts
        min_samples : int
        machine : str

        Returns
        -------
        CostModel

        Raises
        ------
        CostModelError
            No task measured, or tasks with fewer than ``min_samples`` samples
            (``.tasks`` names them).

        Examples
        --------
        >>> from swpipe_core.measure.rolling import RollingCosts
        >>> r = RollingCosts()
        >>> for d in (0.003, 0.002, 0.002):
        ...     r.add("A", d)
        >>> CostModel.from_rolling(r, min_samples=3)["A"].host_s
        0.002
        """
        from autosched.model.refresh import refreshed_costs

        model = refreshed_costs(cls({}, machine=machine), rolling, min_samples, tasks_from_window=True)
        if not model.tasks:
            raise CostModelError("the rolling window has no samples", "rolling",
                                 "run the pipeline inside `with pipe.instrument(rolling):` first")
        few = [n for n, f in model.freshness.tasks.items() if f.source != "window"]
        if few:
            raise CostModelError(f"task(s) {few} have fewer than {min_samples} samples", "rolling",
                                 "run more iterations, lower min_samples, or refresh a model measured before "
                                 "(CostModel.refreshed)", tasks=few, value=min_samples)
        return model

    @property
    def has_bytes(self) -> bool:
        """Whether the model carries memory figures (``batch_bytes`` or any task's bytes)."""
        return bool(self.batch_bytes) or any(c.has_bytes for c in self.tasks.values())

    @property
    def uses_core_pool(self) -> bool:
        """Whether the model has a core pool (``cores``) or a ``"nocore"`` tag (a version-3 model)."""
        return self.cores is not None or any("nocore" in c.resources for c in self.tasks.values())

    @classmethod
    def from_timeline(cls, events: Iterable[Any], machine: str = "", notes: str = "") -> "CostModel":
        """Build a model from recorded timeline events: the median duration per task.

        ``kind == "host"`` events give ``host_s`` and ``kind == "device"`` events give
        ``device_s``.

        Parameters
        ----------
        events : iterable of TimelineEvent
            E.g. ``SWPipeline(plan, record_timeline=True).timeline``.
        machine, notes : str

        Returns
        -------
        CostModel

        Raises
        ------
        CostModelError
            If there are no events.

        Examples
        --------
        >>> from types import SimpleNamespace as E
        >>> ev = [E(task="A", kind="host", start=0.0, end=0.002), E(task="A", kind="host", start=0.01, end=0.014),
        ...       E(task="A", kind="host", start=0.02, end=0.023)]
        >>> CostModel.from_timeline(ev)["A"].host_s
        0.003
        """
        host: Dict[str, list] = {}
        device: Dict[str, list] = {}
        for ev in events:
            target = device if getattr(ev, "kind", "host") == "device" else host
            target.setdefault(ev.task, []).append(ev.end - ev.start)
        if not host and not device:
            raise CostModelError("no timeline events", "events",
                                 "run the pipeline with SWPipeline(plan, record_timeline=True) first")
        tasks = {}
        for name in dict.fromkeys([*host, *device]):
            h = statistics.median(host[name]) if name in host else 0.0
            d = statistics.median(device[name]) if name in device else 0.0
            tasks[name] = TaskCost(max(0.0, round(h, 12)), max(0.0, round(d, 12)))
        n = max((len(v) for v in [*host.values(), *device.values()]), default=0)
        return cls(tasks, machine=machine, method=f"timeline: median of {n} executions per task", notes=notes)

    # -- JSON --

    def to_dict(self) -> Dict[str, Any]:
        """The JSON document of the model (version 3 with a core pool or a ``"nocore"`` tag, else 2 with memory figures, else 1).

        Examples
        --------
        >>> CostModel({"A": TaskCost(0.001)}, machine="m").to_dict()["tasks"]
        {'A': {'host_s': 0.001, 'device_s': 0.0}}
        >>> doc = CostModel({"A": TaskCost(0.001)}, cores=2).to_dict()
        >>> doc["version"], doc["cores"], CostModel.from_dict(doc).cores
        (3, 2, 2)
        """
        # the lowest version that holds the model: older readers still read what they can
        version = 3 if self.uses_core_pool else 2 if self.has_bytes else 1
        doc: Dict[str, Any] = {"schema": SCHEMA, "version": version, "machine": self.machine,
                               "method": self.method, "notes": self.notes}
        if self.pipeline:
            doc["pipeline"] = self.pipeline
        if self.batch_bytes:
            doc["batch_bytes"] = self.batch_bytes
        doc["tasks"] = {name: c.to_dict() for name, c in self.tasks.items()}
        if self.machine_calibration is not None:
            doc["machine_calibration"] = self.machine_calibration.to_dict()
        if self.cores is not None:
            doc["cores"] = self.cores
        return doc

    @classmethod
    def from_dict(cls, doc: Any, where: str = "") -> "CostModel":
        """Build a model from its JSON document, checking every field.

        Parameters
        ----------
        doc : dict
        where : str
            Prefix for error messages (e.g. the file path).

        Returns
        -------
        CostModel

        Raises
        ------
        CostModelError
            For a wrong schema or version, an unknown field, a missing or negative cost.

        Examples
        --------
        >>> CostModel.from_dict({"schema": "swpipe-cost-model", "version": 4, "tasks": {}})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        autosched.model.taskcost.CostModelError: version: version 4 is not supported (this swpipe reads versions 1, 2, 3). Fix: ...
        """
        try:
            return _model_from_dict(cls, doc)
        except CostModelError as exc:
            if not where or exc.source:
                raise
            raise exc.at_source(where) from None


    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write the model as JSON (the lowest schema version that holds it: see :meth:`to_dict`).

        Parameters
        ----------
        path : str or path-like

        Examples
        --------
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "c.json")
        >>> CostModel({"A": TaskCost(0.001, resources=("pcie",))}, machine="m").save(p)
        >>> CostModel.load(p)["A"].resources
        ('pcie',)
        """
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_dict(), fh, indent=2)
            fh.write("\n")

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "CostModel":
        """Read a cost model JSON file, checking every field.

        Parameters
        ----------
        path : str or path-like

        Returns
        -------
        CostModel

        Raises
        ------
        CostModelError
            For invalid JSON, a wrong schema or version, an unknown field, a missing or negative cost.
        FileNotFoundError
            If the file does not exist.

        Examples
        --------
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "bad.json")
        >>> _ = open(p, "w").write('{"schema": "swpipe-cost-model", "version": 1, "tasks": {"A": {"host_s": -2}}}')
        >>> CostModel.load(p)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        autosched.model.taskcost.CostModelError: ...bad.json: tasks.A.host_s: negative cost -2. Fix: use a time >= 0 in seconds
        """
        path = os.fspath(path)
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CostModelError(f"not valid JSON ({exc})", "", "fix the syntax; see cost_models/README.md for the schema",
                                 source=str(path)) from None
        return cls.from_dict(doc, where=path)


def _model_from_dict(cls: type, doc: object) -> "CostModel":
    """The body of :meth:`CostModel.from_dict`, its errors without the source (the caller adds it)."""
    if not isinstance(doc, Mapping):
        raise CostModelError(f"top level is {type(doc).__name__}, not an object", "",
                             "see cost_models/README.md for the schema")
    if doc.get("schema") != SCHEMA:
        raise CostModelError(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}", "schema",
                             f'start the file with {{"schema": "{SCHEMA}", "version": {SCHEMA_VERSION}, ...}}')
    if doc.get("version") not in _READS_VERSIONS or isinstance(doc.get("version"), bool):
        raise CostModelError(f"version {doc.get('version')!r} is not supported (this swpipe reads versions "
                             f"{', '.join(map(str, _READS_VERSIONS))})", "version",
                             f"convert the file to version {SCHEMA_VERSION} (see cost_models/README.md)",
                             value=doc.get("version"))
    unknown = sorted(set(doc) - _TOP_FIELDS)
    if unknown:
        raise CostModelError(f"unknown field(s) {unknown}", "top level",
                             f"the top level has only {sorted(_TOP_FIELDS)}", value=unknown)
    tasks = doc.get("tasks")
    if not isinstance(tasks, Mapping) or not tasks:
        raise CostModelError(f"tasks is {tasks!r}, not a non-empty object", "tasks",
                             'write "tasks": {"TaskName": {"host_s": ..., "device_s": ...}, ...}')
    for key in ("machine", "method", "notes", "pipeline"):
        if not isinstance(doc.get(key, ""), str):
            raise CostModelError(f"{key} is {doc[key]!r}, not a string", key, "use a string")
    parsed = {name: task_cost_from_dict(name, entry) for name, entry in tasks.items()}
    if doc.get("version") == 1 and ("batch_bytes" in doc or any(c.has_bytes for c in parsed.values())):
        raise CostModelError("memory figures (bytes) in a version 1 file", "version",
                             f'write "version": {SCHEMA_VERSION} (bytes came with version 2)')
    if doc.get("version") in (1, 2) and ("cores" in doc or any("nocore" in c.resources for c in parsed.values())):
        raise CostModelError(f"a core pool (cores, or a \"nocore\" tag) in a version {doc['version']} file",
                             "version", 'write "version": 3 (the core pool came with version 3)')
    cores = _check_cores(doc.get("cores"), "cores")
    batch = check_bytes(doc.get("batch_bytes", 0.0), "batch_bytes")
    calibration = doc.get("machine_calibration")
    if calibration is not None:
        from swpipe_core.measure.calibrate import MachineCalibration

        try:
            calibration = MachineCalibration.from_dict(calibration)
        except ValueError as exc:
            field, _, what = str(exc).partition(": ")  # the section's own message leads with the field
            raise CostModelError(what, field) from None
    return cls(parsed, doc.get("machine", ""), doc.get("method", ""), doc.get("notes", ""), doc.get("pipeline", ""),
               batch, machine_calibration=calibration, cores=cores)


def as_cost_model(costs: Any) -> "CostModel":
    """The ``costs`` argument of the public entry points as a :class:`CostModel`.

    A plain dict is accepted: ``{task: seconds}`` (host time, the CPU model) or
    ``{task: {"host_s": ..., "device_s": ..., "resources": [...]}}``.

    Parameters
    ----------
    costs : CostModel or dict

    Returns
    -------
    CostModel

    Raises
    ------
    CostModelError
        For anything else, or a dict whose values are not times, saying how to build a model.

    Examples
    --------
    >>> as_cost_model({"A": 0.002, "B": 0.001})["A"]
    TaskCost(host_s=0.002, device_s=0.0, resources=())
    >>> as_cost_model([0.002])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    autosched.model.taskcost.CostModelError: costs: got list, not a CostModel. Fix: pass {task_name: seconds}, ...
    """
    if isinstance(costs, CostModel):
        return costs
    if isinstance(costs, Mapping):
        return CostModel(dict(costs), method="a dict of seconds (host time)")
    raise CostModelError(
        f"got {type(costs).__name__}, not a CostModel", "costs", value=costs, fix=
        "pass {task_name: seconds}, CostModel({name: TaskCost(host_s, device_s)}), "
        "CostModel.from_profile(profile_result) or CostModel.load('costs.json')")


def combine_slowest(models: Sequence[Any], machine: str = "") -> Any:
    """One cost model whose every task costs what it costs on the slowest of ``models``.

    In a synchronous data-parallel step every rank waits for the slowest at
    each collective, so per task the largest host time and the largest
    device time (taken separately) decide.

    Parameters
    ----------
    models : sequence of CostModel
        One per rank, over the same tasks.
    machine : str
        Recorded in the result (default: the first model's, with the rank count).

    Returns
    -------
    CostModel

    Raises
    ------
    ValueError
        If ``models`` is empty or the models cover different tasks.

    Examples
    --------
    >>> from swpipe import CostModel, TaskCost
    >>> a = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.001, 0.004)})
    >>> b = CostModel({"A": TaskCost(0.003), "B": TaskCost(0.001, 0.001)})
    >>> c = combine_slowest([a, b])
    >>> c["A"].host_s, c["B"].device_s
    (0.003, 0.004)
    """
    if not models:
        raise ValueError("combine_slowest: no cost models given")
    names = list(models[0])
    for r, m in enumerate(models):
        if set(m) != set(names):
            raise ValueError(f"combine_slowest: cost model {r} covers tasks {sorted(m)}, model 0 covers "
                             f"{sorted(names)}; measure the same plan on every rank")
    tasks = {n: TaskCost(max(m[n].host_s for m in models), max(m[n].device_s for m in models),
                         models[0][n].resources) for n in names}
    first = models[0]
    return CostModel(tasks, machine=machine or f"{first.machine} (slowest of {len(models)} rank(s))".strip(),
                     method=first.method, notes=f"per task the maximum over {len(models)} rank(s); {first.notes}",
                     pipeline=first.pipeline)
