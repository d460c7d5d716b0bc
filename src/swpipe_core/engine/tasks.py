"""How the tasks of a pipelined run run: each task instance from its dependency waits to its signal, inline or on
the run's worker threads.

A task instance (1) waits the CPU signals of its dependencies
(:meth:`TaskRunner.wait_signal`, bounded by ``Timeouts.signal_s``), (2) takes
its sequence turn if globally ordered, (3) on CUDA makes its stream wait the
device events of dependencies on other streams, (4) runs through the
pipeline's one dispatch point (:class:`~swpipe_core.engine.dispatch.Dispatch`)
with its stream current, and (5) records its device event, then sets its CPU
signal. The signals live in the iteration's :class:`IterState`; :class:`Flag`
is the one synchronisation primitive of the hot path. A run's
:class:`TaskRunner` owns its threads (one worker per worker group, the
watchdog of the caller's group) and what each period decides about the calls
(a torch profiler recording, the fast path); the same code runs the tasks on a
worker (:meth:`TaskRunner.run_items`) and, inline, the caller's group on the
caller's thread; :meth:`TaskRunner.run_solo` is the lock-free path of a run
whose caller's thread is the only one.
"""

from __future__ import annotations

import _thread
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from swpipe_core.engine.dispatch import profiler_active
from swpipe_core.engine.failure import Cancelled, RunFailure, task_failed
from swpipe_core.engine.program import TaskInfo
from swpipe_core.engine.run import RunSetup
from swpipe_core.engine.sequencer import SequencerAborted
from swpipe_core.engine.watchdog import InlineTaskTimeout, InlineWatchdog
from swpipe_core.engine.workers import Workers
from swpipe_core.plan import IterContext

__all__ = ["TaskRunner", "IterState", "Flag"]


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


#: One task instance as the period loop hands it out: its iteration, its task, its sequence ticket (or None).
Item = Tuple[IterState, TaskInfo, Optional[int]]


class TaskRunner:
    """How the tasks of one run run: its threads, what each period decides about the calls, every task instance.

    ``iters`` (the period loop's iterations in flight) and ``pending`` (the
    retired iterations whose device work is not known complete, the device
    lifetimes') are read here, never changed: a task looks up the signals
    and events of its dependencies in them.
    """

    __slots__ = ("setup", "failure", "lock", "iters", "pending", "workers", "watchdog", "bare", "profiling")

    def __init__(self, setup: RunSetup, failure: RunFailure, iters: Dict[int, IterState],
                 pending: Dict[int, IterState]) -> None:
        self.setup = setup
        self.failure = failure
        self.lock = failure.lock   # the run's lock: signals and the cancel flag change under it together
        self.iters = iters
        self.pending = pending
        self.workers: Optional[Workers] = None  # None when every task runs inline
        self.watchdog: Optional[InlineWatchdog] = None  # the caller's thread watched while it runs a task of its group
        self.bare = False          # plain, and no torch profiler this period
        self.profiling = False     # a torch profiler records this period: a range per task
        failure.attach(self.wake_all, self.stop)

    # ------------------------------------------------------------ threads

    def start(self) -> None:
        """Start the watchdog (a caller's group with a finite ``signal_s``) and the workers (other groups).

        A plan whose only group is the caller's starts no worker thread.
        """
        setup, failure = self.setup, self.failure
        compiled, timeouts, dev = setup.compiled, setup.timeouts, setup.pool.dev
        if compiled.caller_group is not None and timeouts.signal_s < threading.TIMEOUT_MAX:
            self.watchdog = InlineWatchdog(timeouts.signal_s, failure.inline_overran)
            self.watchdog.start()
        if compiled.worker_groups:
            self.workers = Workers(compiled.worker_groups, lambda group, items: self.run_items(items),
                                   setup=dev.set_current,
                                   on_crash=lambda group, exc: failure.cancel(exc, f"worker swpipe-{group} crashed"),
                                   scope=dev.nvtx_mode if setup.nvtx else None)
            self.workers.start()

    def stop(self) -> None:
        """Stop and join the workers (``timeouts.join_s`` each) and the watchdog."""
        if self.workers is not None:
            self.workers.stop(self.setup.timeouts.join_s)
        if self.watchdog is not None:
            self.watchdog.stop()

    def alive(self) -> List[str]:
        """Names of the run's worker threads that are alive."""
        return [] if self.workers is None else self.workers.alive()

    def wake_all(self) -> None:
        """Wake every CPU-signal and completion waiter of the iterations in flight (the run was just cancelled)."""
        with self.lock:
            states = list(self.iters.values())
            waiters = [ev for st in states for ev in list(st.waiters.values())]
        for ev in waiters:
            ev.set()
        for st in states:
            if st.complete is not None:  # made under the lock, so any made later sees cancelled
                st.complete.set()

    # ------------------------------------------------------------ one period

    def run_period(self, items: List[Item], segments: Sequence[Tuple[Any, Any]]) -> None:
        """Run one period's task instances: each worker group's handed to its worker and the caller's run inline,
        segment by segment in the walk's order (:meth:`CompiledPlan.program
        <swpipe_core.engine.program.CompiledPlan.program>`).

        Whether a torch profiler records is read once per period (a profiler
        may start between two periods); with nothing around the calls and no
        worker, the caller runs the tasks bare (:meth:`run_solo`).
        """
        self.profiling = profiling = profiler_active()
        self.bare = self.setup.plain and not profiling
        workers = self.workers
        if workers is None:
            if self.bare:
                self.run_solo(items)
            else:
                self.run_items(items, inline=True)
            return
        failure = self.failure
        for handoff, inline_at in segments:
            if failure.cancelled:
                return
            for group, at in handoff:
                workers.submit(group, [items[k] for k in at])
            if inline_at:
                self.run_items([items[k] for k in inline_at], inline=True)

    def wait_complete(self, st: IterState) -> bool:
        """Block until every task of ``st`` set its CPU signal (or the run is cancelled); whether it did.

        The flag is made only when the caller must block (usually it need
        not: the iteration completed during the periods it waited in line).
        """
        with self.lock:
            if not st.remaining or self.failure.cancelled:
                return True
            if st.complete is None:
                st.complete = Flag()
            flag = st.complete
        return flag.wait(self.setup.timeouts.progress_s)

    # ------------------------------------------------------------ task instances

    def run_items(self, items: List[Item], inline: bool = False) -> None:
        """Run tasks in order, on a worker or (``inline``) on the caller's thread.

        A task's failure cancels the run (the caller raises it). Inline, a
        ``KeyboardInterrupt``/``SystemExit`` is the caller's own: it cancels
        and propagates unchanged.
        """
        failure = self.failure
        watchdog = self.watchdog if inline else None
        for st, ti, seq in items:
            if failure.cancelled:
                return
            try:
                self.run_task(st, ti, seq, watchdog)
            except (Cancelled, SequencerAborted):
                if failure.cancelled:
                    return
                failure.cancel(task_failed(ti, st.idx, RuntimeError("woken without cancellation")), "internal")
                return
            except BaseException as exc:
                self.failed(st, ti, exc, inline)
                if inline and not isinstance(exc, (Exception, InlineTaskTimeout)):
                    raise  # the caller's own interrupt, unchanged
                return

    def failed(self, st: IterState, ti: TaskInfo, exc: BaseException, inline: bool) -> None:
        """Cancel the run for what task ``ti`` raised on ``st``'s iteration: its first error, unless ``exc`` is the
        caller's own ``KeyboardInterrupt``/``SystemExit`` (inline), which cancels and propagates unchanged."""
        failure = self.failure
        if isinstance(exc, InlineTaskTimeout):  # the watchdog interrupted this inline task
            failure.inline_timed_out(ti, st.idx, exc)
        elif inline and not isinstance(exc, Exception):
            failure.cancel(None, f"interrupted in task {ti.name} (iteration {st.idx})")
        else:
            failure.cancel(task_failed(ti, st.idx, exc), f"task {ti.name} failed on iteration {st.idx}")

    def run_solo(self, items: List[Item]) -> None:
        """The caller's thread is the only one and nothing is hooked: run the tasks, count them.

        Every dependency is met by construction: it is an earlier task of
        this period's enqueue order (a topological order of the period-local
        graph) or a task of an earlier period, and this thread ran them all
        already. No other thread reads the signals, so no lock either.
        """
        failure = self.failure
        watchdog = self.watchdog
        for st, ti, seq in items:
            if failure.cancelled:
                return
            if seq is not None:  # keep the sequencer's book for globally ordered tasks
                self.run_items([(st, ti, seq)], inline=True)
                continue
            try:
                if watchdog is not None:
                    watchdog.begin(ti.name, st.idx)
                    try:
                        ti.task.fn(st.ctx)
                    finally:
                        watchdog.end()
                else:
                    ti.task.fn(st.ctx)
            except BaseException as exc:
                self.failed(st, ti, exc, inline=True)
                if not isinstance(exc, (Exception, InlineTaskTimeout)):
                    raise  # the caller's own interrupt, unchanged
                return
            st.done[ti.idx] = True
            st.remaining -= 1  # only this thread exists: nobody can be blocked on st.complete

    def run_task(self, st: IterState, ti: TaskInfo, seq: Optional[int],
                 watchdog: Optional[InlineWatchdog] = None) -> None:
        """One task instance: its dependency waits, its turn, the task (watched when inline), its signal."""
        i = st.idx
        iters = self.iters
        for d, dist in ti.deps:  # phase 1: CPU signals
            if dist:
                if i < dist:
                    continue  # the first `dist` iterations have no predecessor
                dst = iters.get(i - dist)
                if dst is None:
                    # retired, hence complete (an iteration before a run's first_iter_idx belongs to no run of
                    # this pipeline); or (dist < 0, a same-period dep) a newer iteration the data never had: its
                    # state is registered before any task of its first period is enqueued
                    continue
            else:
                dst = st
            if not dst.done[d]:
                self.wait_signal(dst, d, st, ti, dist)
        sequencer = self.setup.sequencer
        if watchdog is not None:  # the caller runs it: watched once its waits (each with its own timeout) are over
            if seq is None:
                self._watched(st, ti, watchdog)
            else:
                sequencer.execute_ordered(seq, lambda: self._in_turn(st, ti, lambda: self._watched(st, ti, watchdog),
                                                                     inline=True))
        elif seq is None:
            if self.bare:  # CPU, no timeline, profiler, NVTX or shortcut: nothing around the call
                ti.task.fn(st.ctx)
            else:
                self.submit(st, ti)
        else:
            sequencer.execute_ordered(seq, lambda: self._in_turn(st, ti, lambda: self.submit(st, ti), inline=False))
        with self.lock:
            st.done[ti.idx] = True
            waiter = st.waiters.pop(ti.idx, None) if st.waiters else None
            st.remaining -= 1
            complete = st.complete if st.remaining == 0 else None
        if waiter is not None:
            waiter.set()
        if complete is not None:
            complete.set()

    def _in_turn(self, st: IterState, ti: TaskInfo, fn: Callable[[], None], inline: bool) -> None:
        """``fn`` while holding the task's sequence turn. A failure cancels the run (its error recorded) *before*
        the sequencer passes the failure on to the tasks waiting for later turns: woken first, one of them could
        find the run not yet cancelled and report itself, naming the wrong collective."""
        try:
            fn()
        except BaseException as exc:
            self.failed(st, ti, exc, inline)
            raise

    def _watched(self, st: IterState, ti: TaskInfo, watchdog: InlineWatchdog) -> None:
        watchdog.begin(ti.name, st.idx)
        try:
            if self.bare:
                ti.task.fn(st.ctx)
            else:
                self.submit(st, ti)
        finally:
            watchdog.end()

    def wait_signal(self, dst: IterState, d: int, st: IterState, ti: TaskInfo, dist: int) -> None:
        """Wait for the CPU signal of task ``d`` of iteration ``dst`` (``ti`` of ``st`` waits), bounded.

        Raises
        ------
        Cancelled
            The run was cancelled meanwhile.
        RuntimeError
            ``Timeouts.signal_s`` passed; the message names both tasks and iterations.
        """
        failure = self.failure
        with self.lock:
            if dst.done[d]:
                return
            if failure.cancelled:
                raise Cancelled
            event = dst.waiters.get(d)
            if event is None:
                event = dst.waiters[d] = Flag()
        timeout = self.setup.timeouts.signal_s
        if event.wait(timeout) or dst.done[d]:
            if not dst.done[d]:
                raise Cancelled
            return
        if failure.cancelled:
            raise Cancelled
        dep = self.setup.compiled.tasks[d]
        kind = "intra-iteration" if dist == 0 else f"inter-iteration, distance {dist}"
        raise RuntimeError(
            f"task {ti.name!r} (iteration {st.idx}) waited {timeout:g} s for {dep.name!r} of "
            f"iteration {dst.idx} ({kind} dependency), which has not completed. {dep.name} runs on thread group "
            f"{dep.group!r} at stage {dep.stage}; it is blocked or slow (raise Timeouts(signal_s=...) if it is just "
            "slow)"
        )

    def submit(self, st: IterState, ti: TaskInfo) -> None:
        """Phase 2 and the task itself; records the device event."""
        setup = self.setup
        recorder = setup.recorder
        if setup.pool.is_cuda:
            self._submit_cuda(st, ti)
            return
        dispatch = setup.dispatch
        t0 = time.perf_counter() if recorder is not None else 0.0
        if self.profiling:
            with torch.autograd.profiler.record_function(dispatch.range_name("SWP", ti.name, st.idx)):
                dispatch.call_pipelined(ti.task, st.ctx)
        else:
            dispatch.call_pipelined(ti.task, st.ctx)
        if recorder is not None:
            recorder.record(ti.name, st.idx, ti.group, ti.stream, t0, time.perf_counter())

    def _submit_cuda(self, st: IterState, ti: TaskInfo) -> None:
        setup = self.setup
        pool, recorder, dispatch = setup.pool, setup.recorder, setup.dispatch
        dev = pool.dev
        stream = setup.streams[ti.idx]
        if ti.starts:  # the batch's own device work (made on the fetching thread's current streams)
            for ready in st.ready:
                dev.wait(stream, ready)
        for d, dist in ti.device_deps:
            pool.wait(stream, self._dep_event(st, d, dist))
        nvtx = setup.nvtx
        name = dispatch.range_name("SWP", ti.name, st.idx) if (nvtx or self.profiling) else ""
        t0 = time.perf_counter() if recorder is not None else 0.0
        with dev.use(stream), dev.annotate(f"{ti.name}({st.idx})"):
            start_ev = pool.record(stream, timing=True) if recorder is not None else None  # after the waits
            if nvtx:
                dev.nvtx_push(name)
            try:
                if self.profiling:
                    with torch.autograd.profiler.record_function(name):
                        dispatch.call_pipelined(ti.task, st.ctx)
                else:
                    dispatch.call_pipelined(ti.task, st.ctx)
            finally:
                if nvtx:
                    dev.nvtx_pop()
            if start_ev is not None:
                st.timing.append((ti, st.idx, start_ev, pool.record(stream, timing=True)))
        setup.keep(st.ctx)
        st.events[ti.idx] = pool.record(stream)
        if recorder is not None:
            recorder.record(ti.name, st.idx, ti.group, ti.stream, t0, time.perf_counter())

    def _dep_event(self, st: IterState, d: int, dist: int) -> Any:
        if dist == 0:
            return st.events[d]
        j = st.idx - dist
        if j < 0:
            return None
        dst = self.iters.get(j) or self.pending.get(j)
        return None if dst is None else dst.events[d]  # gone from both: its device work completed
