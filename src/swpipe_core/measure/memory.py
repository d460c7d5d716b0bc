"""Bytes an iteration keeps alive: tensor storages reachable from its context, and per-task deltas.

A pipeline holds up to ``depth`` iterations in flight, each with its own
:class:`~swpipe_core.plan.IterContext`; what those contexts reference is the
memory a deeper plan pays for. This module measures it:

* :func:`reachable_storages` walks a context (its attributes, the batch,
  nested lists, tuples, sets, dicts, dataclasses and plain objects) and
  returns every tensor storage it reaches, keyed by ``(device, data_ptr)``, so
  a storage shared by several tensors (views, ``ctx.dev`` that *is*
  ``ctx.batch`` on CPU) is counted once. Modules (``torch.nn.Module``) are not
  entered: parameters are the model's, not the iteration's.
* :func:`measure_task_memory` runs serial iterations and records, per task,
  the bytes it added to and freed from its context, the most its context
  held *while* it ran above both ends (``transient_bytes``: e.g. the ``.grad``
  that backward puts on context tensors before the task deletes them; another
  thread sees it), and on CUDA the device
  memory the caching allocator handed out and took back while it ran
  (the device allocator's counters before and after, ``torch.cuda.memory_stats`` on
  a GPU; the counters are updated on
  the host when a tensor is created or released, so no synchronisation is
  needed). On CPU the device figures equal the context figures.

Tensors referenced only by the autograd graph (activations a ``loss`` keeps
for backward) are not reachable by attribute and are not counted in the
context figures; on CUDA the device figures include them.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from swpipe_core.engine.reach import reachable_objects

__all__ = ["reachable_storages", "reachable_bytes", "live_bytes", "TaskMemory", "MemoryFigures", "measure_task_memory"]

_MAX_NODES = 100_000  # a context that reaches more objects than this is walked no further (a guard, not a limit)


def reachable_storages(*roots: Any) -> Dict[Tuple[str, int], int]:
    """Every tensor storage reachable from ``roots``, counted once.

    Parameters
    ----------
    *roots : Any
        Contexts, batches or any nesting of tensors, containers and objects.

    Returns
    -------
    dict
        ``{(device, data_ptr): nbytes}``. Empty storages (``data_ptr`` 0) are skipped.

    Examples
    --------
    >>> import torch
    >>> from swpipe import IterContext
    >>> x = torch.zeros(256)                       # 1024 bytes
    >>> ctx = IterContext({"x": x, "y": [x[:10], torch.ones(4)]}, 0)
    >>> ctx.view = x.view(16, 16)                  # same storage as x
    >>> sorted(reachable_storages(ctx).values())
    [16, 1024]
    """
    import torch

    out: Dict[Tuple[str, int], int] = {}
    for obj in reachable_objects(roots, _MAX_NODES, _tensor_children):
        if isinstance(obj, torch.Tensor):
            _add_storage(obj, out)
    return out


def _tensor_children(t: Any) -> Tuple[Any, ...]:
    """What a tensor holds that holds bytes of its own: a sparse tensor's parts, a leaf's ``.grad``."""
    if t.is_sparse:
        return (t._indices(), t._values())
    if t.layout == _strided() and t.is_leaf and t.grad is not None:  # .grad of a non-leaf is never populated
        return (t.grad,)
    return ()


def _add_storage(t: Any, out: Dict[Tuple[str, int], int], held: Optional[List[Any]] = None) -> None:
    if t.is_sparse or t.layout != _strided():
        return
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. functional wrappers)
        return
    ptr = st.data_ptr()
    if ptr:
        key = (str(t.device), ptr)
        out[key] = max(out.get(key, 0), st.nbytes())
        if held is not None:
            held.append(st)


def _held_storages(root: Any) -> Tuple[Dict[Tuple[str, int], int], List[Any]]:
    """:func:`reachable_storages` of ``root``, and the storages themselves: while they are held, no new storage
    can take one's address, so an address names one storage from before a task to after it."""
    import torch

    out: Dict[Tuple[str, int], int] = {}
    held: List[Any] = []
    for obj in reachable_objects([root], _MAX_NODES, _tensor_children):
        if isinstance(obj, torch.Tensor):
            _add_storage(obj, out, held)
    return out, held


def _strided() -> Any:
    import torch

    return torch.strided


def reachable_bytes(*roots: Any) -> int:
    """Total bytes of :func:`reachable_storages` (each storage once).

    Examples
    --------
    >>> import torch
    >>> t = torch.zeros(10, dtype=torch.float64)
    >>> reachable_bytes([t, t[2:], {"a": t}])
    80
    """
    return sum(reachable_storages(*roots).values())


@dataclass
class TaskMemory:
    """Median bytes one task adds to and frees from its context, and (CUDA) allocates and frees on the device.

    ``add_bytes``: storages reachable after the task that were not before;
    ``free_bytes``: storages reachable before and not after. On CPU
    ``device_alloc_bytes``/``device_free_bytes`` repeat the context figures.
    ``transient_bytes``: the most the context held during the task above the
    larger of its sizes before and after (sampled whenever a Python or C
    function called by the task returns).
    """

    add_bytes: float = 0.0
    free_bytes: float = 0.0
    device_alloc_bytes: float = 0.0
    device_free_bytes: float = 0.0
    transient_bytes: float = 0.0


@dataclass
class MemoryFigures:
    """What :func:`measure_task_memory` found: the batch's bytes and each task's :class:`TaskMemory`."""

    batch_bytes: float
    tasks: Dict[str, TaskMemory] = field(default_factory=dict)
    method: str = ""

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready form (``ProfileResult.memory``).

        Examples
        --------
        >>> MemoryFigures(64, {"A": TaskMemory(8, 0, 8, 0)}, "m").to_dict()["tasks"]["A"]["add_bytes"]
        8
        """
        return {"batch_bytes": self.batch_bytes, "method": self.method,
                "tasks": {n: dict(vars(m)) for n, m in self.tasks.items()}}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "MemoryFigures":
        """Inverse of :meth:`to_dict`."""
        return cls(float(data.get("batch_bytes", 0.0)),
                   {str(n): TaskMemory(**{k: float(v) for k, v in m.items()}) for n, m in data.get("tasks", {}).items()},
                   str(data.get("method", "")))


def measure_task_memory(pipe: Any, batch: Any, num_iterations: int = 3, iter_start: int = 0) -> MemoryFigures:
    """Per-task context and device bytes over ``num_iterations`` serial iterations (medians).

    Runs every task through ``SWPipeline.instrument`` for the duration (as
    the profiler's task timing does) and walks the iteration's context before
    and after each task.

    Parameters
    ----------
    pipe : SWPipeline
        With a bound plan.
    batch : Any
        A representative batch (its bytes are ``batch_bytes``).
    num_iterations : int
        Serial iterations measured (>= 1).
    iter_start : int
        Iteration index of the first one (``ctx.iter_idx``).

    Returns
    -------
    MemoryFigures

    Raises
    ------
    ValueError
        For ``num_iterations < 1``.

    Examples
    --------
    >>> import torch
    >>> from swpipe import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
    >>> def load(ctx): ctx.x = torch.zeros(100)             # 400 bytes
    >>> def step(ctx): del ctx.x; ctx.y = torch.zeros(10)  # frees 400, adds 40
    >>> plan = PipelinePlan({PipelineTask("Load", load): TaskSchedule(), PipelineTask("Step", step): TaskSchedule()},
    ...                     intra_iter_deps=[("Step", "Load")])
    >>> with SWPipeline(plan, device="cpu") as pipe:
    ...     m = measure_task_memory(pipe, torch.zeros(4), num_iterations=2)
    >>> m.batch_bytes, m.tasks["Load"].add_bytes, m.tasks["Step"].free_bytes, m.tasks["Step"].add_bytes
    (16.0, 400.0, 400.0, 40.0)
    """
    if num_iterations < 1:
        raise ValueError(f"num_iterations={num_iterations!r}: measure at least one iteration")
    streams = pipe.streams
    device = streams.dev if streams.is_cuda else None
    cuda = device is not None and device.memory_counters() is not None  # a device allocator to read
    samples: Dict[str, List[Tuple[int, int, int, int, int]]] = {}

    def measured(original: Callable[[Any, Any], None], task: Any, ctx: Any) -> None:
        # held until the task's figures are taken: a storage the task frees keeps its address, which a storage
        # the task makes would otherwise reuse, and the two would count as one that neither left nor came
        before, held = _held_storages(ctx)
        if cuda:
            a0, f0 = device.memory_counters()
        high = [0]

        def sample(frame: Any, event: str, arg: Any) -> None:
            if event in ("return", "c_return"):
                high[0] = max(high[0], reachable_bytes(ctx))

        previous = sys.getprofile()
        sys.setprofile(sample)  # this thread only: serial iterations run the task here
        try:
            original(task, ctx)
        finally:
            sys.setprofile(previous)
        after = reachable_storages(ctx)
        del held  # what the task freed goes now, before the device's counters are read
        add = sum(v for k, v in after.items() if k not in before)
        free = sum(v for k, v in before.items() if k not in after)
        if cuda:
            a1, f1 = device.memory_counters()
            dev = (a1 - a0, f1 - f0)
        else:
            dev = (add, free)
        transient = max(0, high[0] - max(sum(before.values()), sum(after.values())))
        samples.setdefault(task.name, []).append((add, free, dev[0], dev[1], transient))

    with pipe.instrument(measured):
        for i in range(num_iterations):
            pipe.run_one_serial_iter(batch, iter_idx=iter_start + i)
    tasks = {name: TaskMemory(*(float(statistics.median(col)) for col in zip(*rows)))
             for name, rows in samples.items()}
    how = ("context: storages reachable from ctx before/after each task; device: the device allocator's "
           "allocated/freed bytes around it" if cuda else
           "context: storages reachable from ctx before/after each task (CPU: device figures = context figures)")
    return MemoryFigures(float(reachable_bytes(batch)), tasks, f"median of {num_iterations} serial iteration(s); {how}")


def live_bytes(contexts: Iterable[Any]) -> int:
    """Bytes reachable from several contexts at once, each storage once (what a sampler of a run reads).

    Examples
    --------
    >>> import torch
    >>> shared = torch.zeros(8)
    >>> live_bytes([{"a": shared}, {"b": shared, "c": torch.zeros(2)}])
    40
    """
    return reachable_bytes(*list(contexts))

