"""One task's cost: :class:`TaskCost` (host and device time, resource tags, memory figures), its checks, its JSON entry.

The fields and tags are defined in docs/semantics.md ("What a cost model
means"); :class:`~autosched.model.costs.CostModel` maps task names to these, and
its file form (``cost_models/README.md``) stores each as the entry
:meth:`TaskCost.to_dict` writes and :func:`task_cost_from_dict` reads. Every
malformed value raises :class:`CostModelError`, naming the field and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

__all__ = ["TaskCost", "CostModelError", "task_cost_from_dict", "check_time", "check_bytes", "BYTE_FIELDS",
           "TASK_FIELDS"]

BYTE_FIELDS = ("add_bytes", "free_bytes", "device_alloc_bytes", "device_free_bytes", "transient_bytes")
TASK_FIELDS = {"host_s", "device_s", "resources", *BYTE_FIELDS}


class CostModelError(ValueError):
    """A cost model (or cost file) is malformed or does not cover a plan; the facts of the message are attributes.

    Attributes
    ----------
    what : str
        What is wrong, in words.
    field : str
        Where in the model: a field path such as ``"tasks.H2D.host_s"``, ``"version"``, ``"tasks"``.
    source : str
        The file (or argument) the model came from, ``""`` when not read from one.
    tasks : list of str
        The tasks concerned (a task without a cost, the task of a bad entry).
    task : str or None
        ``tasks[0]``.
    value : object
        The offending value where there is one.
    fix : str
        How to fix it, in words.

    Examples
    --------
    >>> from swpipe import CostModelError
    >>> e = CostModelError("negative cost", "tasks.H2D.host_s", "use a time >= 0 in seconds", tasks=["H2D"], value=-1)
    >>> print(e)
    tasks.H2D.host_s: negative cost. Fix: use a time >= 0 in seconds
    >>> e.field, e.task, e.value
    ('tasks.H2D.host_s', 'H2D', -1)
    """

    def __init__(self, what: str, where: str = "", fix: str = "", *, source: str = "", tasks: Sequence[str] = (),
                 value: object = None) -> None:
        self.what = what
        self.field = where
        self.fix = fix
        self.source = source
        self.tasks = list(tasks)
        self.value = value
        msg = ": ".join(x for x in (source, where, what) if x)
        if fix:
            msg += f". Fix: {fix}"
        super().__init__(msg)

    @property
    def where(self) -> str:
        """The field path (the name it had before ``field``)."""
        return self.field

    @property
    def task(self) -> Optional[str]:
        """The task concerned first, ``None`` when the error is about the model as a whole."""
        return self.tasks[0] if self.tasks else None

    def at_source(self, source: str) -> "CostModelError":
        """The same error, read from ``source`` (a file's path)."""
        return CostModelError(self.what, self.field, self.fix, source=source, tasks=self.tasks, value=self.value)


def check_time(value: Any, where: str, tasks: Sequence[str] = ()) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CostModelError(f"cost is {value!r} ({type(value).__name__}), not a number", where,
                             "give a time in seconds, e.g. 0.0012", tasks=tasks, value=value)
    if not math.isfinite(value):
        raise CostModelError(f"cost is {value!r}, not finite", where, "give a finite time in seconds", tasks=tasks,
                             value=value)
    if value < 0:
        raise CostModelError(f"negative cost {value!r}", where, "use a time >= 0 in seconds", tasks=tasks,
                             value=value)
    return float(value)


def check_bytes(value: Any, where: str, tasks: Sequence[str] = ()) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise CostModelError(f"bytes is {value!r}, not a finite number >= 0", where, "give a byte count, e.g. 4096",
                             tasks=tasks, value=value)
    return float(value)


def _check_resources(value: Any, where: str, tasks: Sequence[str] = ()) -> Tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise CostModelError(f"resources is {value!r}, not a list of tags", where,
                             'write e.g. ["comm:nccl"] or ["pcie"] or []', tasks=tasks, value=value)
    tags = []
    for tag in value:
        ok = isinstance(tag, str) and (tag in ("pcie", "gil", "nocore") or (tag.startswith("comm:") and len(tag) > 5))
        if not ok:
            raise CostModelError(f"unknown resource tag {tag!r}", where,
                                 'use "comm:<communicator>" for collectives, "pcie" for host<->device copies, "gil" '
                                 'for Python that holds the GIL or "nocore" for a task that sleeps or blocks',
                                 tasks=tasks, value=tag)
        tags.append(tag)
    if len(set(tags)) != len(tags):
        raise CostModelError(f"resource tags repeat: {tags}", where, "list each tag once", tasks=tasks, value=tags)
    return tuple(tags)


@dataclass(frozen=True)
class TaskCost:
    """The cost of one task for one iteration.

    Parameters
    ----------
    host_s : float
        Seconds of CPU time on the task's thread group (kernel launches, Python).
    device_s : float
        Seconds of device time on the task's stream (CUDA); 0 for pure host tasks.
    resources : tuple of str
        ``"comm:<name>"`` (serialises with every task on that communicator, even on
        another stream) and/or ``"pcie"`` (contends with every other pcie task);
        ``"gil"`` (holds the GIL: one such task at a time, CPU); ``"nocore"`` (its
        host time is spent off the CPU, sleeping or blocked: it takes no core of
        the model's core pool).
    add_bytes, free_bytes : float
        Bytes of tensor storage the task adds to / frees from its iteration's
        context (applied at the task's end by :mod:`autosched.model.memory`).
    device_alloc_bytes, device_free_bytes : float
        CUDA: bytes the caching allocator handed out / took back while it ran.
    transient_bytes : float
        Bytes the context holds while the task runs, above its size at both
        ends (e.g. gradients a backward puts on context tensors, then drops).

    Raises
    ------
    CostModelError
        For a negative, non-finite or non-numeric time, or an unknown resource tag.

    Examples
    --------
    >>> c = TaskCost(host_s=0.0001, device_s=0.002, resources=("comm:nccl",))
    >>> c.cpu_s
    0.0021
    >>> TaskCost(-1.0)
    Traceback (most recent call last):
    ...
    autosched.model.taskcost.CostModelError: host_s: negative cost -1.0. Fix: use a time >= 0 in seconds
    """

    host_s: float
    device_s: float = 0.0
    resources: Tuple[str, ...] = ()
    add_bytes: float = 0.0
    free_bytes: float = 0.0
    device_alloc_bytes: float = 0.0
    device_free_bytes: float = 0.0
    transient_bytes: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "host_s", check_time(self.host_s, "host_s"))
        object.__setattr__(self, "device_s", check_time(self.device_s, "device_s"))
        object.__setattr__(self, "resources", _check_resources(list(self.resources), "resources"))
        for name in BYTE_FIELDS:
            object.__setattr__(self, name, check_bytes(getattr(self, name), name))

    def __repr__(self) -> str:
        extra = "".join(f", {n}={getattr(self, n)!r}" for n in BYTE_FIELDS if getattr(self, n))
        return f"TaskCost(host_s={self.host_s!r}, device_s={self.device_s!r}, resources={self.resources!r}{extra})"

    @property
    def has_bytes(self) -> bool:
        """Whether any memory figure is set (a version-2 entry)."""
        return any(getattr(self, n) for n in BYTE_FIELDS)

    @property
    def cpu_s(self) -> float:
        """Time on the thread when there is no device queue (CPU runs): ``host_s + device_s``."""
        return self.host_s + self.device_s

    @property
    def comms(self) -> Tuple[str, ...]:
        """The communicator names of the task's ``comm:`` tags."""
        return tuple(t[5:] for t in self.resources if t.startswith("comm:"))

    def to_dict(self) -> Dict[str, Any]:
        """The JSON form of the cost (``resources`` only when non-empty).

        Examples
        --------
        >>> TaskCost(0.001, resources=("pcie",)).to_dict()
        {'host_s': 0.001, 'device_s': 0.0, 'resources': ['pcie']}
        """
        out: Dict[str, Any] = {"host_s": self.host_s, "device_s": self.device_s}
        if self.resources:
            out["resources"] = list(self.resources)
        for name in BYTE_FIELDS:
            if getattr(self, name):
                out[name] = getattr(self, name)
        return out


def task_cost_from_dict(name: str, entry: Any) -> TaskCost:
    where, tasks = f"tasks.{name}", [name]
    if not isinstance(entry, Mapping):
        raise CostModelError(f"entry is {entry!r}, not an object", where,
                             'write {"host_s": ..., "device_s": ..., "resources": [...]}', tasks=tasks, value=entry)
    unknown = sorted(set(entry) - TASK_FIELDS)
    if unknown:
        raise CostModelError(f"unknown field(s) {unknown}", where, f"a task entry has only {sorted(TASK_FIELDS)}",
                             tasks=tasks, value=unknown)
    if "host_s" not in entry:
        raise CostModelError("missing host_s", where, "every task needs host_s (seconds on its thread)", tasks=tasks)
    host = check_time(entry["host_s"], f"{where}.host_s", tasks)
    device = check_time(entry.get("device_s", 0.0), f"{where}.device_s", tasks)
    res = _check_resources(entry.get("resources", []), f"{where}.resources", tasks)
    nbytes = {n: check_bytes(entry[n], f"{where}.{n}", tasks) for n in BYTE_FIELDS if n in entry}
    return TaskCost(host, device, res, **nbytes)
