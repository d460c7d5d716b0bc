"""One task instance of a pipelined run, from its dependency waits to its signal.

A task instance (1) waits the CPU signals of its dependencies
(:func:`wait_signal`, bounded by ``Timeouts.signal_s``), (2) takes its
sequence turn if globally ordered, (3) on CUDA makes its stream wait the
device events of dependencies on other streams, (4) runs through the
pipeline's one dispatch point (:class:`~swpipe_core.engine.dispatch.Dispatch`)
with its stream current, and (5) records its device event, then sets its
CPU signal. The same code runs the tasks on a worker thread
(:func:`run_items`) and, inline, the caller's group on the caller's thread;
:func:`run_solo` is the lock-free path of a run whose caller's thread is the
only one. Every function receives the :class:`~swpipe_core.engine.run.Run`
whose tasks it runs.
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Tuple

import torch

from swpipe_core.engine.failure import Cancelled, cancel, inline_timed_out, task_failed
from swpipe_core.engine.program import TaskInfo
from swpipe_core.engine.run import Flag, IterState, Run
from swpipe_core.engine.sequencer import SequencerAborted
from swpipe_core.engine.watchdog import InlineTaskTimeout, InlineWatchdog

__all__: List[str] = []

#: One task instance as the period loop hands it out: its iteration, its task, its sequence ticket (or None).
Item = Tuple[IterState, TaskInfo, Optional[int]]


def run_items(run: Run, items: List[Item], inline: bool = False) -> None:
    """Run tasks in order, on a worker or (``inline``) on the caller's thread.

    A task's failure cancels the run (the caller raises it). Inline, a
    ``KeyboardInterrupt``/``SystemExit`` is the caller's own: it cancels
    and propagates unchanged.
    """
    watchdog = run.watchdog if inline else None
    for st, ti, seq in items:
        if run.cancelled:
            return
        try:
            run_task(run, st, ti, seq, watchdog)
        except (Cancelled, SequencerAborted):
            if run.cancelled:
                return
            cancel(run, task_failed(ti, st.idx, RuntimeError("woken without cancellation")), "internal")
            return
        except BaseException as exc:
            failed(run, st, ti, exc, inline)
            if inline and not isinstance(exc, (Exception, InlineTaskTimeout)):
                raise  # the caller's own interrupt, unchanged
            return


def failed(run: Run, st: IterState, ti: TaskInfo, exc: BaseException, inline: bool) -> None:
    """Cancel ``run`` for what task ``ti`` raised on ``st``'s iteration: its first error, unless ``exc`` is the
    caller's own ``KeyboardInterrupt``/``SystemExit`` (inline), which cancels and propagates unchanged."""
    if isinstance(exc, InlineTaskTimeout):  # the watchdog interrupted this inline task
        inline_timed_out(run, st, ti, exc)
    elif inline and not isinstance(exc, Exception):
        cancel(run, None, f"interrupted in task {ti.name} (iteration {st.idx})")
    else:
        cancel(run, task_failed(ti, st.idx, exc), f"task {ti.name} failed on iteration {st.idx}")


def run_solo(run: Run, items: List[Item]) -> None:
    """The caller's thread is the only one and nothing is hooked: run the tasks, count them.

    Every dependency is met by construction: it is an earlier task of
    this period's enqueue order (a topological order of the period-local
    graph) or a task of an earlier period, and this thread ran them all
    already. No other thread reads the signals, so no lock either.
    """
    watchdog = run.watchdog
    for st, ti, seq in items:
        if run.cancelled:
            return
        if seq is not None:  # keep the sequencer's book for globally ordered tasks
            run_items(run, [(st, ti, seq)], inline=True)
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
            failed(run, st, ti, exc, inline=True)
            if not isinstance(exc, (Exception, InlineTaskTimeout)):
                raise  # the caller's own interrupt, unchanged
            return
        st.done[ti.idx] = True
        st.remaining -= 1  # only this thread exists: nobody can be blocked on st.complete


def run_task(run: Run, st: IterState, ti: TaskInfo, seq: Optional[int],
             watchdog: Optional[InlineWatchdog] = None) -> None:
    """One task instance: its dependency waits, its turn, the task (watched when inline), its signal."""
    i = st.idx
    iters = run.iters
    for d, dist in ti.deps:  # phase 1: CPU signals
        if dist:
            if i < dist:
                continue  # the first `dist` iterations have no predecessor
            dst = iters.get(i - dist)
            if dst is None:
                # retired, hence complete; or (dist < 0, a same-period dep) a newer iteration the data
                # never had: its state is registered before any task of its first period is enqueued
                continue
        else:
            dst = st
        if not dst.done[d]:
            wait_signal(run, dst, d, st, ti, dist)
    if watchdog is not None:  # the caller runs it: watched once its waits (each with its own timeout) are over
        if seq is None:
            _watched(run, st, ti, watchdog)
        else:
            run.sequencer.execute_ordered(seq, lambda: _in_turn(run, st, ti, lambda: _watched(run, st, ti, watchdog),
                                                                inline=True))
    elif seq is None:
        if run.bare:  # CPU, no timeline, profiler, NVTX or shortcut: nothing around the call
            ti.task.fn(st.ctx)
        else:
            submit(run, st, ti)
    else:
        run.sequencer.execute_ordered(seq, lambda: _in_turn(run, st, ti, lambda: submit(run, st, ti), inline=False))
    with run.lock:
        st.done[ti.idx] = True
        waiter = st.waiters.pop(ti.idx, None) if st.waiters else None
        st.remaining -= 1
        complete = st.complete if st.remaining == 0 else None
    if waiter is not None:
        waiter.set()
    if complete is not None:
        complete.set()


def _in_turn(run: Run, st: IterState, ti: TaskInfo, fn: Callable[[], None], inline: bool) -> None:
    """``fn`` while holding the task's sequence turn. A failure cancels the run (its error recorded) *before*
    the sequencer passes the failure on to the tasks waiting for later turns: woken first, one of them could
    find the run not yet cancelled and report itself, naming the wrong collective."""
    try:
        fn()
    except BaseException as exc:
        failed(run, st, ti, exc, inline)
        raise


def _watched(run: Run, st: IterState, ti: TaskInfo, watchdog: InlineWatchdog) -> None:
    watchdog.begin(ti.name, st.idx)
    try:
        if run.bare:
            ti.task.fn(st.ctx)
        else:
            submit(run, st, ti)
    finally:
        watchdog.end()


def wait_signal(run: Run, dst: IterState, d: int, st: IterState, ti: TaskInfo, dist: int) -> None:
    """Wait for the CPU signal of task ``d`` of iteration ``dst`` (``ti`` of ``st`` waits), bounded.

    Raises
    ------
    Cancelled
        The run was cancelled meanwhile.
    RuntimeError
        ``Timeouts.signal_s`` passed; the message names both tasks and iterations.
    """
    with run.lock:
        if dst.done[d]:
            return
        if run.cancelled:
            raise Cancelled
        event = dst.waiters.get(d)
        if event is None:
            event = dst.waiters[d] = Flag()
    timeout = run.timeouts.signal_s
    if event.wait(timeout) or dst.done[d]:
        if not dst.done[d]:
            raise Cancelled
        return
    if run.cancelled:
        raise Cancelled
    dep = run.compiled.tasks[d]
    kind = "intra-iteration" if dist == 0 else f"inter-iteration, distance {dist}"
    raise RuntimeError(
        f"task {ti.name!r} (iteration {st.idx}) waited {timeout:g} s for {dep.name!r} of "
        f"iteration {dst.idx} ({kind} dependency), which has not completed. {dep.name} runs on thread group "
        f"{dep.group!r} at stage {dep.stage}; it is blocked or slow (raise Timeouts(signal_s=...) if it is just slow)"
    )


def submit(run: Run, st: IterState, ti: TaskInfo) -> None:
    """Phase 2 and the task itself; records the device event."""
    recorder = run.recorder
    if run.pool.is_cuda:
        _submit_cuda(run, st, ti)
        return
    t0 = time.perf_counter() if recorder is not None else 0.0
    if run.profiling:
        with torch.autograd.profiler.record_function(run.dispatch.range_name("SWP", ti.name, st.idx)):
            run.dispatch.call_pipelined(ti.task, st.ctx)
    else:
        run.dispatch.call_pipelined(ti.task, st.ctx)
    if recorder is not None:
        recorder.record(ti.name, st.idx, ti.group, ti.stream, t0, time.perf_counter())


def _submit_cuda(run: Run, st: IterState, ti: TaskInfo) -> None:
    pool, recorder, dispatch = run.pool, run.recorder, run.dispatch
    dev = pool.dev
    stream = run.streams[ti.idx]
    if ti.starts:  # the batch's own device work (made on the fetching thread's current streams)
        for ready in st.ready:
            dev.wait(stream, ready)
    for d, dist in ti.device_deps:
        pool.wait(stream, _dep_event(run, st, d, dist))
    nvtx = run.nvtx
    name = dispatch.range_name("SWP", ti.name, st.idx) if (nvtx or run.profiling) else ""
    t0 = time.perf_counter() if recorder is not None else 0.0
    with dev.use(stream), dev.annotate(f"{ti.name}({st.idx})"):
        start_ev = pool.record(stream, timing=True) if recorder is not None else None  # after the waits
        if nvtx:
            dev.nvtx_push(name)
        try:
            if run.profiling:
                with torch.autograd.profiler.record_function(name):
                    dispatch.call_pipelined(ti.task, st.ctx)
            else:
                dispatch.call_pipelined(ti.task, st.ctx)
        finally:
            if nvtx:
                dev.nvtx_pop()
        if start_ev is not None:
            st.timing.append((ti, st.idx, start_ev, pool.record(stream, timing=True)))
    run.keep(st.ctx)
    st.events[ti.idx] = pool.record(stream)
    if recorder is not None:
        recorder.record(ti.name, st.idx, ti.group, ti.stream, t0, time.perf_counter())


def _dep_event(run: Run, st: IterState, d: int, dist: int) -> Any:
    if dist == 0:
        return st.events[d]
    j = st.idx - dist
    if j < 0:
        return None
    dst = run.iters.get(j) or run.device_pending.get(j)
    return None if dst is None else dst.events[d]  # gone from both: its device work completed
