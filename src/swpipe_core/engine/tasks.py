"""The worker side of the engine: one task instance from its waits to its signal.

A mixin of :class:`~swpipe_core.engine.pipeline.SWPipeline` (kept apart so each file
stays one idea). A task instance (1) waits the CPU signals of its
dependencies (:meth:`_TaskRunner._wait_signal`, bounded by
``signal_timeout``), (2) takes its sequence turn if globally ordered, (3) on
CUDA makes its stream wait the device events of dependencies on other
streams, (4) runs through the one dispatch point (``_exec_task``: the wrappers
of ``instrument``, shortcuts, strict mode) with its stream current, and (5)
records its device event, then sets its CPU signal. The same code runs the
tasks on a worker thread and, inline, the caller's group on the caller's
thread; :meth:`_TaskRunner._run_solo` is the lock-free path of a pipeline
whose caller's thread is the only one.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any, Callable, Iterator, List, Optional, Tuple

import torch

from swpipe_core.engine.checks import check_idle
from swpipe_core.engine.failure import cancel
from swpipe_core.engine.state import PipelineTaskError, _Cancelled, _Flag, _IterState, _Run, _TaskInfo
from swpipe_core.plan import IterContext, PipelineTask
from swpipe_core.engine.sequencer import SequencerAborted
from swpipe_core.measure.trace import TimelineRecorder
from swpipe_core.engine.watchdog import InlineTaskTimeout

__all__: List[str] = []

#: ``wrapper(run_task, task, ctx)``, where ``run_task(task, ctx)`` runs the task (:meth:`SWPipeline.instrument`).
TaskWrapper = Callable[[Callable[[PipelineTask, IterContext], None], PipelineTask, IterContext], Any]


class _TaskRunner:
    """Running task instances (a mixin: the state it reads lives on :class:`~swpipe_core.engine.pipeline.SWPipeline`)."""

    def _run_items(self, run: _Run, items: List[tuple], inline: bool = False) -> None:
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
                self._run_task(run, st, ti, seq, watchdog)
            except InlineTaskTimeout as exc:  # the watchdog interrupted this inline task
                self._inline_timed_out(run, st, ti, exc)
                return
            except (_Cancelled, SequencerAborted):
                if run.cancelled:
                    return
                cancel(run, PipelineTaskError(ti.name, st.idx, ti.group, ti.stage,
                                              RuntimeError("woken without cancellation")), "internal")
                return
            except BaseException as exc:
                if inline and not isinstance(exc, Exception):
                    cancel(run, None, f"interrupted in task {ti.name} (iteration {st.idx})")
                    raise
                cancel(run, PipelineTaskError(ti.name, st.idx, ti.group, ti.stage, exc),
                       f"task {ti.name} failed on iteration {st.idx}")
                return

    def _run_solo(self, run: _Run, items: List[tuple]) -> None:
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
                self._run_items(run, [(st, ti, seq)], inline=True)
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
            except InlineTaskTimeout as exc:
                self._inline_timed_out(run, st, ti, exc)
                return
            except Exception as exc:
                cancel(run, PipelineTaskError(ti.name, st.idx, ti.group, ti.stage, exc),
                       f"task {ti.name} failed on iteration {st.idx}")
                return
            except BaseException:
                cancel(run, None, f"interrupted in task {ti.name} (iteration {st.idx})")
                raise
            st.done[ti.idx] = True
            st.remaining -= 1  # only this thread exists: nobody can be blocked on st.complete

    def _watched(self, run: _Run, st: _IterState, ti: _TaskInfo, watchdog: Any) -> None:
        watchdog.begin(ti.name, st.idx)
        try:
            if run.bare:
                ti.task.fn(st.ctx)
            else:
                self._submit(run, st, ti)
        finally:
            watchdog.end()

    def _inline_timed_out(self, run: _Run, st: _IterState, ti: _TaskInfo, exc: InlineTaskTimeout) -> None:
        """The watchdog interrupted an inline task that overran ``signal_timeout``: the task's error, the run cancelled."""
        error = TimeoutError(f"{ti.name} (iteration {st.idx}) ran longer than signal_timeout={self.signal_timeout:g} s "
                             "on the caller's thread; the watchdog interrupted it (a blocked collective or queue? "
                             "raise signal_timeout if it is just slow)")
        error.__cause__ = exc
        cancel(run, PipelineTaskError(ti.name, st.idx, ti.group, ti.stage, error),
               f"inline task {ti.name} overran on iteration {st.idx}")

    def _run_task(self, run: _Run, st: _IterState, ti: _TaskInfo, seq: Optional[int], watchdog: Any = None) -> None:
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
                self._wait_signal(run, dst, d, st, ti, dist)
        if watchdog is not None:  # the caller runs it: watched once its waits (each with its own timeout) are over
            if seq is None:
                self._watched(run, st, ti, watchdog)
            else:
                run.sequencer.execute_ordered(seq, lambda: self._watched(run, st, ti, watchdog))
        elif seq is None:
            if run.bare:  # CPU, no timeline, profiler, NVTX or shortcut: nothing around the call
                ti.task.fn(st.ctx)
            else:
                self._submit(run, st, ti)
        else:
            run.sequencer.execute_ordered(seq, lambda: self._submit(run, st, ti))
        with run.lock:
            st.done[ti.idx] = True
            waiter = st.waiters.pop(ti.idx, None) if st.waiters else None
            st.remaining -= 1
            complete = st.complete if st.remaining == 0 else None
        if waiter is not None:
            waiter.set()
        if complete is not None:
            complete.set()

    def _wait_signal(self, run: _Run, dst: _IterState, d: int, st: _IterState, ti: _TaskInfo, dist: int) -> None:
        with run.lock:
            if dst.done[d]:
                return
            if run.cancelled:
                raise _Cancelled
            event = dst.waiters.get(d)
            if event is None:
                event = dst.waiters[d] = _Flag()
        if event.wait(self.signal_timeout) or dst.done[d]:
            if not dst.done[d]:
                raise _Cancelled
            return
        if run.cancelled:
            raise _Cancelled
        dep = self._infos[d]
        kind = "intra-iteration" if dist == 0 else f"inter-iteration, distance {dist}"
        raise RuntimeError(
            f"task {ti.name!r} (iteration {st.idx}) waited {self.signal_timeout:g} s for {dep.name!r} of "
            f"iteration {dst.idx} ({kind} dependency), which has not completed. {dep.name} runs on thread group "
            f"{dep.group!r} at stage {dep.stage}; it is blocked or slow (raise signal_timeout if it is just slow)"
        )

    def _submit(self, run: _Run, st: _IterState, ti: _TaskInfo) -> None:
        """Phase 2 and the task itself; records the device event."""
        recorder = self._recorder
        if self._streams.is_cuda:
            self._submit_cuda(run, st, ti, recorder)
            return
        t0 = time.perf_counter() if recorder is not None else 0.0
        if run.profiling:
            with torch.autograd.profiler.record_function(self._range_name("SWP", ti.name, st.idx)):
                self._exec_task(ti.task, st.ctx)
        else:
            self._exec_task(ti.task, st.ctx)
        if recorder is not None:
            recorder.record(ti.name, st.idx, ti.group, ti.stream, t0, time.perf_counter())

    def _submit_cuda(self, run: _Run, st: _IterState, ti: _TaskInfo, recorder: Optional[TimelineRecorder]) -> None:
        streams = self._streams
        dev = streams.dev
        stream = run.streams[ti.idx]
        if ti.starts:  # the batch's own device work (made on the fetching thread's current streams)
            for ready in st.ready:
                dev.wait(stream, ready)
        for d, dist in ti.device_deps:
            streams.wait(stream, self._dep_event(run, st, d, dist))
        nvtx = run.nvtx
        name = self._range_name("SWP", ti.name, st.idx) if (nvtx or run.profiling) else ""
        t0 = time.perf_counter() if recorder is not None else 0.0
        with dev.use(stream), dev.annotate(f"{ti.name}({st.idx})"):
            start_ev = streams.record(stream, timing=True) if recorder is not None else None  # after the waits
            if nvtx:
                dev.nvtx_push(name)
            try:
                if run.profiling:
                    with torch.autograd.profiler.record_function(name):
                        self._exec_task(ti.task, st.ctx)
                else:
                    self._exec_task(ti.task, st.ctx)
            finally:
                if nvtx:
                    dev.nvtx_pop()
            if start_ev is not None:
                st.timing.append((ti, st.idx, start_ev, streams.record(stream, timing=True)))
        run.keep(st.ctx)
        st.events[ti.idx] = streams.record(stream)
        if recorder is not None:
            recorder.record(ti.name, st.idx, ti.group, ti.stream, t0, time.perf_counter())

    def _dep_event(self, run: _Run, st: _IterState, d: int, dist: int) -> Any:
        if dist == 0:
            return st.events[d]
        j = st.idx - dist
        if j < 0:
            return None
        dst = run.iters.get(j) or run.device_pending.get(j)
        return None if dst is None else dst.events[d]  # gone from both: its device work completed

    def _worker_scope(self, run: _Run) -> Optional[Callable[[], Any]]:
        """What every worker thread enters around its loop: ``emit_nvtx`` when requested on CUDA.

        The profiler's NVTX mode is per thread, so entering it on the
        caller's thread does not reach the workers.
        """
        if not run.nvtx:
            return None
        return self._streams.dev.nvtx_mode

    def _range_name(self, prefix: str, name: str, iteration: int) -> str:
        skip = " [skip]" if name in self._shortcut.tasks else ""
        return f"{prefix}/{name}{skip}/iter{iteration}"

    @contextlib.contextmanager
    def instrument(self, wrapper: TaskWrapper) -> Iterator[TaskWrapper]:
        """For the ``with`` block, run every task execution as ``wrapper(run_task, task, ctx)``.

        The hook for measurement and tracing around each task: the profiler's
        per-task timing, memory per task, the calibration and the scheduler
        statistics all use it. ``run_task(task, ctx)`` runs the task as the
        engine would have (its shortcut replay when the task is shortcut,
        strict mode's checks when on); the wrapper should call it once and
        may do anything before and after. It is called once per task
        execution in every mode (:meth:`run`, :meth:`fill_pipeline` /
        :meth:`progress`, :meth:`run_serial`, :meth:`run_one_serial_iter`),
        on the thread that runs the task (a worker, or the caller's thread
        for the caller's group and for serial runs), with the task's stream
        current on CUDA and inside the task's profiler range; with
        ``record_timeline=True`` the recorded times include it. An exception
        it raises is the task's failure (:class:`PipelineTaskError` names the
        task). A pipelined run calls it from several threads at once: guard
        what it shares (a lock, or state per thread).

        Blocks nest: the wrapper entered first is outermost (called first;
        its ``run_task`` calls the next one). Each is removed when its block
        exits, also when the block raises, and then the engine's fast path (a
        CPU run with nothing around its tasks calls ``fn(ctx)`` directly) is
        back for the runs that follow. Enter and leave the block between runs
        (no pipelined iteration in flight), on the thread that drives the
        pipeline: a pipelined run decides when it starts whether it may skip
        the dispatch, so a wrapper entered during it would miss tasks.

        Parameters
        ----------
        wrapper : callable
            ``wrapper(run_task, task, ctx)``: ``task`` is the
            :class:`~swpipe_core.plan.PipelineTask` (``task.name``), ``ctx``
            the iteration's :class:`~swpipe_core.plan.IterContext`
            (``ctx.iter_idx``). Its return value is ignored.

        Yields
        ------
        callable
            ``wrapper`` itself (``with pipe.instrument(Counter()) as counter:``).

        Raises
        ------
        TypeError
            ``wrapper`` is not callable.
        RuntimeError
            Entered while pipelined iterations are in flight, or the block was
            left without an exception while iterations are still in flight
            (the wrapper is removed all the same and the remaining tasks run
            without it): call :meth:`drain` inside the block.

        Examples
        --------
        >>> import time
        >>> from swpipe_core.engine.pipeline import SWPipeline
        >>> from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
        >>> plan = PipelinePlan({PipelineTask("Load", lambda ctx: None): TaskSchedule(0, thread_group="io"),
        ...                      PipelineTask("Step", lambda ctx: None): TaskSchedule(1)},
        ...                     intra_iter_deps=[("Step", "Load")])
        >>> seconds = {}
        >>> def timed(run_task, task, ctx):
        ...     t0 = time.perf_counter()
        ...     run_task(task, ctx)
        ...     seconds.setdefault(task.name, []).append(time.perf_counter() - t0)
        >>> with SWPipeline(plan, device="cpu") as pipe:
        ...     with pipe.instrument(timed):
        ...         _ = pipe.run(range(3))
        ...     _ = pipe.run(range(3))  # not timed: the wrapper is gone
        >>> {name: len(v) for name, v in sorted(seconds.items())}
        {'Load': 3, 'Step': 3}
        """
        if not callable(wrapper):
            raise TypeError(f"instrument() needs a callable wrapper(run_task, task, ctx), got "
                            f"{type(wrapper).__name__}")
        check_idle(self._run, "instrument() entered")
        token = object()  # the same wrapper may be entered twice: each block removes its own
        self._set_wrappers(self._wrappers + ((token, wrapper),))
        try:
            yield wrapper
        finally:
            self._set_wrappers(tuple(w for w in self._wrappers if w[0] is not token))
        run = self._run
        if run is not None and not (run.finished or run.cancelled):
            raise RuntimeError(f"instrument() block left while {run.fetched - run.oldest} pipelined iteration(s) "
                               "are in flight: their remaining tasks run without the wrapper; call drain() (or "
                               "let run() finish) inside the block")

    def _set_wrappers(self, wrappers: Tuple[Tuple[object, TaskWrapper], ...]) -> None:
        """Install the wrappers (outermost first) as one callable chain around :meth:`_call_task`."""
        chain: Optional[Callable[[PipelineTask, IterContext], None]] = None
        if wrappers:
            chain = self._call_task
            for _, wrapper in reversed(wrappers):
                chain = functools.partial(wrapper, chain)
        self._wrappers = wrappers
        self._wrapped = chain

    def _exec_task(self, task: PipelineTask, ctx: IterContext) -> None:
        """The one dispatch point of every mode: the wrappers of :meth:`instrument`, then :meth:`_call_task`.

        The CPU fast path (``run.bare``) skips it only when no wrapper is installed.
        """
        wrapped = self._wrapped
        if wrapped is not None:
            wrapped(task, ctx)
        elif self._strict is not None or self._rng is not None or task.name in self._shortcut.tasks:
            self._call_task(task, ctx)
        else:  # nothing around the task: no second call
            task.fn(ctx)

    def _call_task(self, task: PipelineTask, ctx: IterContext) -> None:
        """Run one task on one context: ``task.fn(ctx)``, or its shortcut when enabled."""
        if self._rng is not None and not self._rng_active():
            with self._rng.scope(task.name, ctx.iter_idx):  # the task's own generators (rng="per_task")
                return self._call_task(task, ctx)
        if self._strict is not None and self._run is not None and not self._strict.active():
            with self._strict.watch(task.name, ctx):  # strict mode: check every access against the plan
                return self._call_task(task, ctx)
        if task.name in self._shortcut.tasks:
            self._shortcut.execute(task, ctx)
        else:
            task.fn(ctx)

    @staticmethod
    def _rng_active() -> bool:
        """Whether this thread already runs inside a task's generator scope (the scope is entered once)."""
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        return any(type(mode).__name__ == "_OwnGenerators" for mode in _get_current_dispatch_mode_stack())
