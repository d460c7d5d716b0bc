"""The engine's bookkeeping: task error, signals, per-task, per-iteration and per-run state.

Separate from :mod:`swpipe_core.engine.pipeline` (which drives them) so each file
stays one idea: these are plain data holders and the one synchronisation
primitive the hot path uses (:class:`_Flag`).
"""

from __future__ import annotations

import _thread
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from swpipe_core.plan import IterContext, PipelineTask
from swpipe_core.engine.sequencer import _SubmissionSequencer

__all__ = ["PipelineTaskError"]

_MISSING = object()


class PipelineTaskError(RuntimeError):
    """A task failed while the pipeline ran; ``__cause__`` is the original exception.

    Attributes
    ----------
    task : str
    iteration : int
    thread_group : str
    stage : int

    Examples
    --------
    >>> err = PipelineTaskError("Forward", 3, "compute", 1, ValueError("bad shape"))
    >>> print(err)
    task 'Forward' failed on iteration 3 (stage 1, thread group 'compute'): ValueError: bad shape
    >>> type(err.__cause__).__name__, err.task, err.iteration
    ('ValueError', 'Forward', 3)
    """

    def __init__(self, task: str, iteration: int, thread_group: str, stage: int,
                 cause: Optional[BaseException] = None) -> None:
        self.task = task
        self.iteration = iteration
        self.thread_group = thread_group
        self.stage = stage
        msg = f"task {task!r} failed on iteration {iteration} (stage {stage}, thread group {thread_group!r})"
        if cause is not None:
            msg += f": {type(cause).__name__}: {cause}"
        super().__init__(msg)
        if cause is not None:
            self.__cause__ = cause
            self.__suppress_context__ = True

    def __reduce__(self):  # keep the attributes through pickling (multiprocessing)
        return (type(self), (self.task, self.iteration, self.thread_group, self.stage, self.__cause__))


class _Flag:
    """A one-shot event on a raw lock: the hot-path signal between threads.

    ``threading.Event`` goes through a Python-level ``Condition``; a raw lock
    handed from setter to waiter costs about a third as much per wake-up.
    ``set`` is idempotent and safe from several threads (one ``list.pop``
    wins); any number of threads may ``wait`` (each passes the lock on).
    Lock waits are interruptible by signals, so ``KeyboardInterrupt`` reaches
    a caller blocked here.
    """

    __slots__ = ("_lock", "_token", "is_set")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._token = [None]
        self.is_set = False

    def set(self) -> None:
        try:
            self._token.pop()
        except IndexError:
            return  # already set
        self.is_set = True
        self._lock.release()

    def wait(self, timeout: float) -> bool:
        if self.is_set:
            return True
        if self._lock.acquire(True, timeout):
            self._lock.release()  # pass it on to the next waiter
            return True
        return self.is_set


class _Cancelled(Exception):
    """Internal: a wait was woken because the run was cancelled."""


@dataclass(eq=False)
class _TaskInfo:
    """A task compiled for the hot path: indices instead of names."""

    idx: int
    task: PipelineTask
    name: str
    stage: int
    group: str
    stream_spec: Any
    stream: str
    ordered: bool
    deps: Tuple[Tuple[int, int], ...]         # (dep index, distance); distance 0 = same iteration
    device_deps: Tuple[Tuple[int, int], ...]  # the deps on another stream (phase 2)
    starts: bool = False                      # no dependency within its iteration: waits for the batch (CUDA)


class _IterState:
    """One in-flight iteration: its context, CPU signals and device events."""

    __slots__ = ("idx", "ctx", "done", "remaining", "waiters", "complete", "events", "ready", "timing")

    def __init__(self, idx: int, ctx: Optional[IterContext], n: int, device: Any = ()) -> None:
        self.idx = idx
        self.ctx = ctx
        self.done = [False] * n          # CPU signals, one per task
        self.remaining = n               # tasks not done; changed under the run's lock (or by the only thread)
        self.waiters: Dict[int, _Flag] = {}  # created only when someone must block
        self.complete: Optional[_Flag] = None  # created (under the run's lock) only when the caller must block
        self.events: List[Any] = [None] * n if device else []  # device events (CUDA: device = the run's streams)
        self.ready: Tuple[Any, ...] = ()  # CUDA: events after the batch's own device work (StreamPool.batch_ready)
        self.timing: List[tuple] = []  # CUDA with a timeline: (task info, start event, end event)


class _Run:
    """State of one fill_pipeline .. drain cycle. Workers only ever see their own run."""

    __slots__ = ("iters", "device_pending", "oldest", "period", "fetched", "exhausted", "draining",
                 "data_iter", "data_source", "cancelled", "stop", "error", "reported", "finished", "lock",
                 "sequencer", "workers", "profiling", "streams", "device_timing", "origin_event", "nvtx", "ctx_type",
                 "plain", "bare", "ready", "keep", "watchdog")

    def __init__(self, data_source: Any, data_iter: Iterator, sequencer: _SubmissionSequencer) -> None:
        self.iters: Dict[int, _IterState] = {}
        self.device_pending: Dict[int, _IterState] = {}
        self.oldest = 0        # next iteration to retire
        self.period = 0        # next period to enqueue
        self.fetched = 0       # iterations created so far
        self.exhausted = False
        self.draining = False  # progress(None) or drain(): no new iterations
        self.data_iter = data_iter
        self.data_source = data_source
        self.cancelled = False
        self.stop = threading.Event()  # set with cancelled: ends the run's device waits at once
        self.error: Optional[BaseException] = None
        self.reported = False  # the error reached the caller
        self.finished = False  # everything retired, workers stopped
        self.lock = threading.Lock()
        self.sequencer = sequencer
        self.workers: Optional[Any] = None  # workers._Workers, None when every task runs inline
        self.profiling = False
        self.streams: List[Any] = []
        self.nvtx = False      # NVTX ranges per task, emit_nvtx on every worker (CUDA only)
        self.ctx_type: type = IterContext  # _GuardedContext on CUDA
        self.plain = False     # CPU, no timeline, no shortcut: tasks need nothing but fn(ctx)
        self.bare = False      # plain and no torch profiler this period
        self.device_timing: List[tuple] = []
        self.origin_event: Any = None
        self.ready: Tuple[Any, ...] = ()  # the last fetched batch's ready events, until its iteration state takes them
        self.keep: Optional[Callable[[Any], None]] = None  # CUDA: after each task, what its context must keep alive
        self.watchdog: Any = None  # the caller's thread watched while it runs a task of its group (watchdog.py)


class _GuardedContext(IterContext):
    """The :class:`IterContext` of a CUDA pipeline: keeps what its tasks may still read on the device.

    On CUDA a task may ``del ctx.x`` (or assign ``ctx.x = new``) while a
    kernel launched on *another* stream still reads ``x``; dropping the last
    reference would hand the block back to the caching allocator, which
    reuses it at once on the stream that allocated it. Every value removed
    from the context therefore goes to ``_swp_graveyard``, and what the
    engine collects after each task (device tensors inside containers and
    objects of the context, the gradients of the pipeline's ``state``) and
    what a task passes to :meth:`keep_alive` goes to ``_swp_kept``. Both are
    slots (invisible to ``vars(ctx)``, so shortcuts and ``repr`` see the same
    attributes as on CPU) that live as long as the context: the engine
    releases a context only once the device events of all its iteration's
    tasks have completed. CPU pipelines use the plain :class:`IterContext`
    and pay nothing.

    Examples
    --------
    >>> ctx = _GuardedContext(batch=None, iter_idx=0)
    >>> ctx.x = "first"; ctx.x = "second"; del ctx.x
    >>> ctx.keep_alive("cached")
    >>> ctx._swp_graveyard, list(ctx._swp_kept.values()), vars(ctx)
    (['first', 'second'], ['cached'], {'batch': None, 'iter_idx': 0})
    """

    __slots__ = ("_swp_graveyard", "_swp_kept")

    def __init__(self, batch: Any, iter_idx: int) -> None:
        object.__setattr__(self, "_swp_graveyard", [])
        object.__setattr__(self, "_swp_kept", {})
        super().__init__(batch, iter_idx)

    def __setattr__(self, name: str, value: Any) -> None:
        old = self.__dict__.get(name, _MISSING)
        object.__setattr__(self, name, value)
        if old is not _MISSING and old is not value:
            self._swp_graveyard.append(old)

    def __delattr__(self, name: str) -> None:
        old = self.__dict__.get(name, _MISSING)
        object.__delattr__(self, name)
        if old is not _MISSING:
            self._swp_graveyard.append(old)

    def keep_alive(self, *values: Any) -> None:
        kept = self._swp_kept
        for value in values:
            kept[id(value)] = value


_KEEP_WALK_LIMIT = 2000  # objects walked per task for device tensors nested in the context


def _context_keeper(dev: Any, state: Any) -> Callable[[_GuardedContext], None]:
    """What the engine runs after each task of a CUDA pipeline: keep the context's nested device values alive.

    A device tensor inside a container or object of the context (``ctx.d[k]``,
    ``ctx.batch.dense``) can be replaced or popped by the next task without
    the context seeing it; so after every task each device tensor reachable
    from the context's non-tensor attributes is kept (top-level tensors need
    nothing: the graveyard catches them when they leave). The gradients of
    ``state``'s parameters are kept too: ``zero_grad(set_to_none=True)`` in
    the next iteration drops them while the optimizer step may still read
    them on another stream.
    """
    from swpipe_core.engine.reach import reachable_objects

    params = _parameters(state)

    def keep(ctx: _GuardedContext) -> None:
        kept = ctx._swp_kept
        roots = [v for v in ctx.__dict__.values() if not isinstance(v, (torch.Tensor, int, float, str))]
        if roots:
            for item in reachable_objects(roots, _KEEP_WALK_LIMIT):
                if dev.memory_of(item) is not None:
                    kept[id(item)] = item
        for p in params:
            g = p.grad
            if g is not None:
                kept[id(g)] = g

    return keep


def _parameters(state: Any) -> List[torch.Tensor]:
    """The parameters of ``state``: modules, optimizers, or lists/tuples/dicts of them (each once).

    Examples
    --------
    >>> lin = torch.nn.Linear(2, 1)
    >>> len(_parameters([lin, torch.optim.SGD(lin.parameters(), lr=0.1)])), _parameters(None)
    (2, [])
    """
    out: Dict[int, torch.Tensor] = {}
    items: List[Any] = [state]
    while items:
        obj = items.pop()
        if obj is None:
            continue
        if isinstance(obj, torch.nn.Module):
            out.update((id(p), p) for p in obj.parameters())
        elif isinstance(obj, torch.optim.Optimizer):
            out.update((id(p), p) for group in obj.param_groups for p in group["params"])
        elif isinstance(obj, torch.Tensor):
            out[id(obj)] = obj
        elif isinstance(obj, dict):
            items.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            items.extend(obj)
        else:
            raise TypeError(f"state: expected modules, optimizers, tensors or lists/dicts of them, got "
                            f"{type(obj).__name__}")
    return list(out.values())
