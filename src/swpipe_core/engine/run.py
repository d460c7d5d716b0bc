"""The state of one pipelined run: what the period loop, the tasks and the device bookkeeping read and change.

:class:`Run` is one ``fill_pipeline`` .. ``drain`` cycle of a
:class:`~swpipe_core.engine.pipeline.SWPipeline`: the compiled plan and what
it runs with (fixed for the run), the iterations in flight
(:class:`IterState`: a context, one CPU signal and one device event per
task), the counters of the period loop, and how the run ends (its cancel
flag, its first error). :class:`SWPipeline` makes one per fill and hands it
to the functions of :mod:`~swpipe_core.engine.loop`,
:mod:`~swpipe_core.engine.tasks`, :mod:`~swpipe_core.engine.lifetime` and
:mod:`~swpipe_core.engine.failure`; each worker thread only ever sees the run
it was started for. :class:`Flag` is the one synchronisation primitive of
the hot path: the CPU signal one thread hands another.
"""

from __future__ import annotations

import _thread
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from swpipe_core.engine.dispatch import Dispatch
from swpipe_core.engine.options import Timeouts
from swpipe_core.engine.program import CompiledPlan, TaskInfo
from swpipe_core.engine.sequencer import SubmissionSequencer
from swpipe_core.engine.streams import StreamPool
from swpipe_core.engine.watchdog import InlineWatchdog
from swpipe_core.engine.workers import Workers
from swpipe_core.measure.trace import TimelineRecorder
from swpipe_core.plan import IterContext

__all__ = ["Run", "IterState", "Flag"]


class Flag:
    """A one-shot event on a raw lock: the hot-path signal between threads.

    ``threading.Event`` goes through a Python-level ``Condition``; a raw lock
    handed from setter to waiter costs about a third as much per wake-up.
    ``set`` is idempotent and safe from several threads (one ``list.pop``
    wins); any number of threads may ``wait`` (each passes the lock on).
    Lock waits are interruptible by signals, so ``KeyboardInterrupt`` reaches
    a caller blocked here.

    Examples
    --------
    >>> flag = Flag()
    >>> flag.wait(0.001), flag.set(), flag.set(), flag.wait(0.001)
    (False, None, None, True)
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


#: Timing events of one task on the device: (task, iteration, start event, end event).
DeviceTiming = Tuple[TaskInfo, int, Any, Any]


class IterState:
    """One in-flight iteration: its context, CPU signals and device events."""

    __slots__ = ("idx", "ctx", "done", "remaining", "waiters", "complete", "events", "ready", "timing")

    def __init__(self, idx: int, ctx: Optional[IterContext], n: int, device: bool = False) -> None:
        self.idx = idx
        self.ctx = ctx
        self.done = [False] * n          # CPU signals, one per task
        self.remaining = n               # tasks not done; changed under the run's lock (or by the only thread)
        self.waiters: Dict[int, Flag] = {}  # created only when someone must block
        self.complete: Optional[Flag] = None  # created (under the run's lock) only when the caller must block
        self.events: List[Any] = [None] * n if device else []  # device events, one per task (CUDA)
        self.ready: Tuple[Any, ...] = ()  # CUDA: events after the batch's own device work (StreamPool.batch_ready)
        self.timing: List[DeviceTiming] = []  # CUDA with a timeline


@dataclass(eq=False, slots=True)  # slots: the hot path reads its fields for every task
class Run:
    """One ``fill_pipeline`` .. ``drain`` cycle of a pipeline (made by ``SWPipeline.fill_pipeline``).

    The first fields are what the run executes and with what; they do not
    change while it runs. The others are where it stands and how it ends.
    """

    compiled: CompiledPlan
    pool: StreamPool
    dispatch: Dispatch
    timeouts: Timeouts
    max_device_lag: int
    recorder: Optional[TimelineRecorder]
    data_source: Iterable[Any]
    data_iter: Iterator[Any]
    sequencer: SubmissionSequencer
    # the period loop
    iters: Dict[int, IterState] = field(default_factory=dict)  # in flight, by iteration
    device_pending: Dict[int, IterState] = field(default_factory=dict)  # retired, device work not known complete
    oldest: int = 0            # next iteration to retire
    period: int = 0            # next period to enqueue
    fetched: int = 0           # iterations created so far
    exhausted: bool = False    # the data ran out
    draining: bool = False     # progress(None) or drain(): no new iterations
    ready: Tuple[Any, ...] = ()  # the last fetched batch's ready events, until its iteration state takes them
    # how the tasks run
    workers: Optional[Workers] = None  # None when every task runs inline
    watchdog: Optional[InlineWatchdog] = None  # the caller's thread watched while it runs a task of its group
    plain: bool = False        # CPU, nothing around the tasks: they need nothing but fn(ctx)
    bare: bool = False         # plain, and no torch profiler this period
    profiling: bool = False    # a torch profiler records this period: a range per task
    # the device (CUDA)
    streams: List[Any] = field(default_factory=list)  # each task's resolved stream, by index
    ctx_type: type = IterContext  # GuardedContext on CUDA
    keep: Optional[Callable[[IterContext], None]] = None  # after each task: what its context must keep alive
    nvtx: bool = False         # NVTX ranges per task, emit_nvtx on every worker
    device_timing: List[DeviceTiming] = field(default_factory=list)
    origin_event: Any = None   # the timeline's origin on the device clock
    # how it ends
    lock: threading.Lock = field(default_factory=threading.Lock)
    cancelled: bool = False
    stop: threading.Event = field(default_factory=threading.Event)  # set with cancelled: ends device waits at once
    error: Optional[BaseException] = None  # the first error
    reported: bool = False     # the error reached the caller
    finished: bool = False     # everything retired, workers stopped

    @property
    def in_flight(self) -> int:
        """Iterations enqueued and not retired yet (0 once the run finished)."""
        return 0 if self.finished else self.fetched - self.oldest
