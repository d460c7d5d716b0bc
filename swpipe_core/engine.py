"""SWPipeline: runs a :class:`~swpipe_core.plan.PipelinePlan` pipelined on threads and streams.

Execution semantics (the contract :mod:`autosched.simulate` models):

* Period ``p`` runs, for every task ``T``, iteration ``p - stage(T)``.
  ``fill_pipeline`` enqueues periods ``0 .. depth-1``; each ``progress`` waits
  until the oldest in-flight iteration completed on the CPU side (all its
  tasks' CPU signals set), retires it, enqueues the next period and returns
  the retired index. Iterations beyond the data are never enqueued.
* The main thread enqueues a period's tasks, in the plan's enqueue order,
  onto the FIFO queue of each task's thread group (one worker thread
  ``swpipe-<group>`` per group, :mod:`swpipe_core.workers`).
* A worker takes a task and (1) waits the CPU signals of its dependencies:
  ``dep(i)`` for intra deps and ``dep(i - N)`` for inter deps of distance
  ``N`` (nothing for ``i - N < 0``); (2) a ``globally_ordered`` task waits its
  sequence turn (:mod:`swpipe_core.sequencer`); (3) on CUDA its stream waits
  the device events of dependencies on *other* streams (same-stream order is
  already given by the stream's FIFO, since the dependency's kernels were
  launched before its CPU signal was set); (4) it runs ``fn(ctx)`` with its
  stream current; (5) records its device event, then sets its CPU signal.
  On CPU, streams are names and events are no-ops.

Failures (002 section 4.4): the first exception in any task sets the run's
cancel flag, aborts the sequencer and wakes every waiter; workers skip what
is left; the caller's ``progress``/``run`` joins the workers and raises
:class:`PipelineTaskError` naming task, iteration, thread group and stage,
chained to the original exception (``__cause__``, with its traceback). A
dependency or progress wait that times out is reported the same way, naming
what it waited for. Exceptions from the data iterator propagate unchanged
and leave the pipeline intact. ``KeyboardInterrupt`` in the caller cancels
and joins the workers. After any failure ``drain()`` (or a new
``fill_pipeline``) gives a usable pipeline again.

Memory: every in-flight iteration has its own :class:`IterContext`; on CPU a
retired iteration's context is dropped when ``progress`` returns, so at most
``pipeline_depth`` are alive. On CUDA, CPU completion is not device
completion: a retired context (and its tensors) is kept until the device
events of all its tasks have completed (checked on each ``progress``, all
released by ``drain``/``close``), so the caching allocator never reuses
memory a stream still reads; no ``record_stream`` is needed.

Unbound plans (tasks without ``fn``) can be constructed, printed and
analysed; running one (``fill_pipeline``, ``run``, ``run_serial``,
``run_one_serial_iter``) raises :class:`~swpipe_core.validate.PlanError`
(rule ``unbound-task``) naming the tasks.
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from .order import enqueue_order
from .plan import IterContext, PipelinePlan, PipelineTask, ref_name
from .sequencer import SequencerAborted, _SubmissionSequencer
from .shortcut import _ShortcutState
from .streams import StreamPool, resolve_device, set_thread_device
from .trace import TimelineEvent, TimelineRecorder
from .validate import PlanError, validate
from .workers import _Workers

__all__ = ["SWPipeline", "PipelineTaskError"]

_log = logging.getLogger(__name__)

_NO_BATCH = object()
_SERIAL_GROUP = "serial"


def _profiler_active() -> bool:
    """Whether a torch profiler is recording: the thread-local C++ flag, or the
    module flag torch.profiler sets (also in all-threads mode, where the C++
    flag reads False)."""
    return bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", False)) or torch.autograd._profiler_enabled()


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


class _IterState:
    """One in-flight iteration: its context, CPU signals and device events."""

    __slots__ = ("idx", "ctx", "done", "remaining", "waiters", "complete", "events")

    def __init__(self, idx: int, ctx: Optional[IterContext], n: int) -> None:
        self.idx = idx
        self.ctx = ctx
        self.done = [False] * n          # CPU signals, one per task
        self.remaining = n
        self.waiters: Dict[int, _Flag] = {}  # created only when someone must block
        self.complete = _Flag()
        self.events: List[Any] = [None] * n  # device events (CUDA)


class _Run:
    """State of one fill_pipeline .. drain cycle. Workers only ever see their own run."""

    __slots__ = ("iters", "device_pending", "oldest", "period", "fetched", "exhausted", "draining",
                 "data_iter", "data_source", "cancelled", "error", "reported", "finished", "lock",
                 "sequencer", "workers", "profiling", "streams", "device_timing", "origin_event")

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
        self.error: Optional[BaseException] = None
        self.reported = False  # the error reached the caller
        self.finished = False  # everything retired, workers stopped
        self.lock = threading.Lock()
        self.sequencer = sequencer
        self.workers: Optional[_Workers] = None
        self.profiling = False
        self.streams: List[Any] = []
        self.device_timing: List[tuple] = []
        self.origin_event: Any = None


class SWPipeline:
    """Software-pipelined execution of a plan: pipelined, serial, or one iteration at a time.

    Parameters
    ----------
    plan : PipelinePlan
        Validated at construction (:func:`~swpipe_core.validate.validate`).
    device : int, str or torch.device
        An integer is that CUDA device when CUDA is available, else the CPU;
        ``"cpu"``/``"cuda:1"`` are taken literally.
    signal_timeout : float
        Seconds a task waits for one dependency's CPU signal before failing
        with an error naming the task, the dependency and its iteration.
    sequencer_timeout : float
        Seconds a globally ordered task waits for its turn.
    progress_timeout : float
        Seconds ``progress`` waits for the oldest iteration before raising
        ``RuntimeError`` naming the iteration and its unfinished tasks.
    record_timeline : bool
        Record a :class:`~swpipe_core.trace.TimelineEvent` per task execution
        (:attr:`timeline`); off by default to keep the hot path lean.
    strict : bool, or modules/optimizers
        Strict mode (off by default): pipelined runs check every ``ctx``
        attribute access (and, given modules/optimizers, their tensors) against
        the plan's order and raise on the first unordered one
        (:mod:`swpipe_core.dataflow.strict`).

    Raises
    ------
    TypeError
        ``plan`` is not a :class:`~swpipe_core.plan.PipelinePlan`.
    PlanError
        The plan breaks a validation rule.
    ValueError
        A timeout is not positive.

    Examples
    --------
    >>> from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
    >>> load = PipelineTask("Load", lambda ctx: setattr(ctx, "x", ctx.batch * 10))
    >>> out = []
    >>> step = PipelineTask("Step", lambda ctx: out.append(ctx.x))
    >>> plan = PipelinePlan({load: TaskSchedule(stage=0, thread_group="io"),
    ...                      step: TaskSchedule(stage=1, thread_group="compute")},
    ...                     intra_iter_deps=[(step, load)])
    >>> with SWPipeline(plan, device="cpu") as pipe:
    ...     it = pipe.fill_pipeline(range(4))
    ...     retired = []
    ...     while True:
    ...         try:
    ...             retired.append(pipe.progress(it))
    ...         except StopIteration:
    ...             break
    >>> retired, out
    ([0, 1, 2, 3], [0, 10, 20, 30])
    """

    def __init__(self, plan: PipelinePlan, device: Any = 0, *, signal_timeout: float = 30.0,
                 sequencer_timeout: float = 30.0, progress_timeout: float = 60.0,
                 record_timeline: bool = False, strict: Any = False) -> None:
        if not isinstance(plan, PipelinePlan):
            raise TypeError(f"SWPipeline needs a PipelinePlan, got {type(plan).__name__}; build one with "
                            "PipelinePlan(schedule={task: TaskSchedule(...)}, intra_iter_deps=[...])")
        validate(plan)
        for label, value in (("signal_timeout", signal_timeout), ("sequencer_timeout", sequencer_timeout),
                             ("progress_timeout", progress_timeout)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{label} must be a positive number of seconds, got {value!r}")
        self.plan = plan
        self.device = resolve_device(device)
        # float("inf") means "no limit"; lock waits accept at most TIMEOUT_MAX
        self.signal_timeout = min(float(signal_timeout), threading.TIMEOUT_MAX)
        self.sequencer_timeout = min(float(sequencer_timeout), threading.TIMEOUT_MAX)
        self.progress_timeout = min(float(progress_timeout), threading.TIMEOUT_MAX)
        self.record_timeline = bool(record_timeline)
        self._join_timeout = 5.0  # per worker, after a cancel: a task stuck in user code cannot be interrupted
        self._streams = StreamPool(self.device)
        self._infos = self._compile(plan)
        by_name = {ti.name: ti for ti in self._infos}
        self._order: List[_TaskInfo] = [by_name[n] for n in enqueue_order(plan)]
        self._serial_order: List[_TaskInfo] = self._topological(plan, by_name)
        self._groups = list(dict.fromkeys(ti.group for ti in self._order))
        self._shortcut = _ShortcutState()
        self._recorder: Optional[TimelineRecorder] = TimelineRecorder() if record_timeline else None
        self._run: Optional[_Run] = None
        from .dataflow.strict import strict_guard  # strict mode (off by default): see swpipe_core.dataflow.strict
        self._strict = strict_guard(plan, strict, self.device)

    # ------------------------------------------------------------------ setup

    @staticmethod
    def _compile(plan: PipelinePlan) -> List[_TaskInfo]:
        names = plan.task_names
        index = {n: i for i, n in enumerate(names)}
        deps: Dict[str, Dict[Tuple[int, int], None]] = {n: {} for n in names}
        for t, d in plan.intra_edges():
            deps[t][(index[d], 0)] = None
        for t, d, n in plan.inter_edges():
            deps[t][(index[d], n)] = None
        infos = []
        for name in names:
            sched = plan.sched(name)
            stream = plan.stream_of(name)
            own = tuple(deps[name])
            device_deps = tuple((d, n) for d, n in own if plan.stream_of(names[d]) != stream)
            infos.append(_TaskInfo(index[name], plan.task(name), name, sched.stage, sched.thread_group,
                                   sched.stream, stream, sched.globally_ordered, own, device_deps))
        return infos

    @staticmethod
    def _topological(plan: PipelinePlan, by_name: Dict[str, _TaskInfo]) -> List[_TaskInfo]:
        """Serial order: a topological order of the intra deps, ties broken by enqueue order."""
        import networkx as nx

        pos = {n: i for i, n in enumerate(enqueue_order(plan))}
        graph = nx.DiGraph()
        graph.add_nodes_from(plan.task_names)
        graph.add_edges_from((d, t) for t, d in plan.intra_edges())
        return [by_name[n] for n in nx.lexicographical_topological_sort(graph, key=lambda n: pos[n])]

    def _check_runnable(self) -> None:
        unbound = [t.name for t in self.plan.tasks if not callable(t.fn)]
        if unbound:
            raise PlanError(
                "unbound-task",
                f"the plan cannot run: task(s) {unbound} have no function (analysis-only plan)",
                unbound,
                "bind functions with plan.bind({name: fn, ...}) or PipelineTask(name, fn); "
                "an unbound plan can still be printed and analysed (format_schedule, print_stage_analysis)",
            )

    def _check_idle(self, what: str) -> None:
        run = self._run
        if run is not None and not (run.finished or run.cancelled):
            raise RuntimeError(f"{what} while {run.fetched - run.oldest} pipelined iteration(s) are in flight; "
                               "call drain() first")

    # --------------------------------------------------------------- pipelined

    def fill_pipeline(self, data_iter: Iterable[Any]) -> Iterator[Any]:
        """Start the workers and enqueue the first ``pipeline_depth`` periods.

        Parameters
        ----------
        data_iter : iterable
            Any iterable of batches (a list, a generator, a DataLoader); it may
            hold fewer batches than the depth, even none.

        Returns
        -------
        iterator
            The iterator to pass to :meth:`progress` (``iter(data_iter)``; the
            original iterable is accepted by ``progress`` too).

        Raises
        ------
        RuntimeError
            Called again while iterations are in flight (call :meth:`drain`
            first). A pipeline that finished (``progress`` raised
            ``StopIteration``) or failed is reset automatically.
        PlanError
            The plan has unbound tasks.
        Exception
            Whatever the data iterator raises, unchanged; no thread is left running.

        Examples
        --------
        >>> from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
        >>> plan = PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule(stage=1)})
        >>> pipe = SWPipeline(plan, device="cpu")
        >>> it = pipe.fill_pipeline([1, 2, 3])
        >>> pipe.in_flight
        2
        >>> pipe.fill_pipeline([4])
        Traceback (most recent call last):
        ...
        RuntimeError: fill_pipeline() called while 2 pipelined iteration(s) are in flight; call drain() first
        >>> pipe.drain(); pipe.in_flight
        0
        """
        self._check_idle("fill_pipeline() called")
        self._check_runnable()
        self._teardown(cancel=True)
        iterator = iter(data_iter)
        run = _Run(data_iter, iterator, _SubmissionSequencer(self.sequencer_timeout))
        self._run = run
        if self._recorder is not None:
            self._recorder.clear()
        try:
            if self._streams.is_cuda:
                run.streams = [self._streams.resolve(ti.stream_spec) for ti in self._infos]
                if self._recorder is not None:
                    run.origin_event = torch.cuda.Event(enable_timing=True)
                    run.origin_event.record(torch.cuda.default_stream(self.device))
                    self._recorder.origin = time.perf_counter()
            run.workers = _Workers(self._groups, lambda group, items: self._run_items(run, items),
                                   setup=lambda: set_thread_device(self.device),
                                   on_crash=lambda group, exc: self._cancel(run, exc, f"worker swpipe-{group} crashed"))
            run.workers.start()
            for _ in range(self.plan.pipeline_depth):
                batch = self._fetch(run)
                self._advance(run, batch)
        except BaseException:
            self._teardown(cancel=True)
            raise
        return iterator

    def progress(self, data_iter: Optional[Iterator[Any]] = None) -> int:
        """Retire the oldest in-flight iteration and enqueue the next period.

        Parameters
        ----------
        data_iter : iterator or None
            The iterator returned by :meth:`fill_pipeline` (or the iterable
            given to it). ``None`` retires without taking new data: the
            pipeline then drains (the next periods run the remaining stages of
            the in-flight iterations) and a later ``progress(data_iter)``
            raises until :meth:`drain` + :meth:`fill_pipeline`.

        Returns
        -------
        int
            The retired iteration index.

        Raises
        ------
        StopIteration
            Nothing is left in flight and no data remains; workers are stopped.
        PipelineTaskError
            A task failed (or timed out waiting); workers are stopped.
        RuntimeError
            The oldest iteration did not complete within ``progress_timeout``
            (the message names it and its unfinished tasks); called before
            :meth:`fill_pipeline`, after a failure, or with a different iterator.
        Exception
            Whatever the data iterator raises, unchanged; the pipeline stays
            usable (call ``progress`` again or :meth:`drain`).
        """
        run = self._run
        if run is None:
            raise RuntimeError("progress() called before fill_pipeline(); start with "
                               "data_iter = pipe.fill_pipeline(loader)")
        if run.cancelled:
            self._surface_failure(run)
        if data_iter is not None:
            if data_iter is not run.data_iter and data_iter is not run.data_source:
                raise RuntimeError("progress() got a different data iterator than fill_pipeline() returned; "
                                   "to switch data, call drain() and then fill_pipeline(new_data)")
            if run.draining:
                raise RuntimeError("the pipeline is draining (progress(None) or drain() was called), so it takes "
                                   "no new data; call drain() and then fill_pipeline(data) to start again")
        if run.oldest >= run.fetched:
            self._finish(run)
            raise StopIteration
        try:
            if data_iter is None:
                run.draining = run.exhausted = True
                batch = _NO_BATCH
            else:
                batch = self._fetch(run)
        except Exception:
            raise  # the data iterator's own error: nothing changed, the pipeline is intact
        except BaseException:
            self._abort(run, "interrupted while fetching a batch")
            raise
        try:
            idx = self._retire_oldest(run)
            self._advance(run, batch)
        except BaseException:
            if not run.reported:
                self._abort(run, "interrupted in progress()")
            raise
        return idx

    def _fetch(self, run: _Run) -> Any:
        if run.exhausted:
            return _NO_BATCH
        try:
            return next(run.data_iter)
        except StopIteration:
            run.exhausted = True
            return _NO_BATCH

    def _advance(self, run: _Run, batch: Any) -> None:
        """Enqueue period ``run.period`` (creating its new iteration if a batch was fetched)."""
        p = run.period
        if batch is not _NO_BATCH:
            run.iters[p] = _IterState(p, IterContext(batch, p), len(self._infos))
            run.fetched = p + 1
        run.period = p + 1
        run.profiling = _profiler_active()
        lo, hi = run.oldest, run.fetched
        iters = run.iters
        ticket = run.sequencer.ticket
        by_group: Dict[str, List[tuple]] = {}
        for ti in self._order:
            i = p - ti.stage
            if i < lo or i >= hi:
                continue
            seq = ticket(f"{ti.name} (iteration {i})") if ti.ordered else None
            items = by_group.get(ti.group)
            if items is None:
                items = by_group[ti.group] = []
            items.append((iters[i], ti, seq))
        for group, items in by_group.items():
            run.workers.submit(group, items)

    def _retire_oldest(self, run: _Run) -> int:
        idx = run.oldest
        st = run.iters[idx]
        if run.cancelled:
            self._surface_failure(run)
        if not st.complete.wait(self.progress_timeout) and not run.cancelled:
            self._progress_timed_out(run, st)
        if run.cancelled:
            self._surface_failure(run)
        if self._streams.is_cuda:
            run.device_pending[idx] = st  # first, so a worker looking up idx always finds its events
            del run.iters[idx]
            self._prune_device(run)
        else:
            del run.iters[idx]
            st.ctx = None
        run.oldest = idx + 1
        return idx

    def _prune_device(self, run: _Run) -> None:
        """Release retired contexts whose device work has completed."""
        for j in list(run.device_pending):
            st = run.device_pending[j]
            if all(ev is None or ev.query() for ev in st.events):
                st.ctx = None
                del run.device_pending[j]

    # ------------------------------------------------------------ worker side

    def _run_items(self, run: _Run, items: List[tuple]) -> None:
        for st, ti, seq in items:
            if run.cancelled:
                return
            try:
                self._run_task(run, st, ti, seq)
            except (_Cancelled, SequencerAborted):
                if run.cancelled:
                    return
                self._cancel(run, PipelineTaskError(ti.name, st.idx, ti.group, ti.stage,
                                                    RuntimeError("woken without cancellation")), "internal")
                return
            except BaseException as exc:
                self._cancel(run, PipelineTaskError(ti.name, st.idx, ti.group, ti.stage, exc),
                             f"task {ti.name} failed on iteration {st.idx}")
                return

    def _run_task(self, run: _Run, st: _IterState, ti: _TaskInfo, seq: Optional[int]) -> None:
        i = st.idx
        iters = run.iters
        for d, dist in ti.deps:  # phase 1: CPU signals
            if dist:
                if i < dist:
                    continue  # the first `dist` iterations have no predecessor
                dst = iters.get(i - dist)
                if dst is None:
                    continue  # retired, hence complete
            else:
                dst = st
            if not dst.done[d]:
                self._wait_signal(run, dst, d, st, ti, dist)
        if seq is None:
            self._submit(run, st, ti)
        else:
            run.sequencer.execute_ordered(seq, lambda: self._submit(run, st, ti))
        with run.lock:
            st.done[ti.idx] = True
            waiter = st.waiters.pop(ti.idx, None)
            st.remaining -= 1
            last = st.remaining == 0
        if waiter is not None:
            waiter.set()
        if last:
            st.complete.set()

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
        stream = run.streams[ti.idx]
        for d, dist in ti.device_deps:
            self._streams.wait(stream, self._dep_event(run, st, d, dist))
        name = self._range_name("SWP", ti.name, st.idx)
        t0 = time.perf_counter() if recorder is not None else 0.0
        with torch.cuda.stream(stream):
            if recorder is not None:
                start_ev = torch.cuda.Event(enable_timing=True)
                start_ev.record(stream)
            torch.cuda.nvtx.range_push(name)
            try:
                if run.profiling:
                    with torch.autograd.profiler.record_function(name):
                        self._exec_task(ti.task, st.ctx)
                else:
                    self._exec_task(ti.task, st.ctx)
            finally:
                torch.cuda.nvtx.range_pop()
            if recorder is not None:
                end_ev = torch.cuda.Event(enable_timing=True)
                end_ev.record(stream)
                run.device_timing.append((ti, st.idx, start_ev, end_ev))
        st.events[ti.idx] = self._streams.record(stream)
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

    def _range_name(self, prefix: str, name: str, iteration: int) -> str:
        skip = " [skip]" if name in self._shortcut.tasks else ""
        return f"{prefix}/{name}{skip}/iter{iteration}"

    def _exec_task(self, task: PipelineTask, ctx: IterContext) -> None:
        """Run one task on one context: ``task.fn(ctx)``, or its shortcut when enabled."""
        if self._strict is not None and self._run is not None and not self._strict.active():
            with self._strict.watch(task.name, ctx):  # strict mode: check every access against the plan
                return self._exec_task(task, ctx)
        if task.name in self._shortcut.tasks:
            self._shortcut.execute(task, ctx)
        else:
            task.fn(ctx)

    # ------------------------------------------------------ failure and reset

    def _cancel(self, run: _Run, error: Optional[BaseException], reason: str) -> None:
        """Record the first error, stop new task starts, wake every waiter."""
        with run.lock:
            if run.error is None and error is not None:
                run.error = error
            run.cancelled = True
            states = list(run.iters.values())
            waiters = [ev for st in states for ev in list(st.waiters.values())]
        run.sequencer.abort(reason)
        for ev in waiters:
            ev.set()
        for st in states:
            st.complete.set()

    def _stop_workers(self, run: _Run) -> None:
        if run.workers is not None:
            run.workers.stop(self._join_timeout)

    def _surface_failure(self, run: _Run) -> None:
        """Join the workers and raise the run's first error to the caller (once)."""
        self._stop_workers(run)
        if run.reported:
            why = f"failed earlier ({run.error})" if run.error is not None else "was cancelled (interrupted)"
            raise RuntimeError(f"the pipeline {why}; call drain() or fill_pipeline() to start again")
        run.reported = True
        if run.error is None:
            raise RuntimeError("the pipeline was cancelled; call drain() or fill_pipeline() to start again")
        raise run.error

    def _abort(self, run: _Run, reason: str) -> None:
        """Cancel because the caller was interrupted: stop and join the workers."""
        self._cancel(run, None, reason)
        self._stop_workers(run)
        run.reported = True

    def _progress_timed_out(self, run: _Run, st: _IterState) -> None:
        not_done = [ti.name for ti in self._infos if not st.done[ti.idx]]
        error = RuntimeError(
            f"progress() waited {self.progress_timeout:g} s for iteration {st.idx} to complete; tasks not done: "
            f"{not_done}. A task is blocked or slow (raise progress_timeout if it is just slow); the pipeline "
            "was cancelled, call drain() or fill_pipeline() to start again"
        )
        self._cancel(run, error, f"progress timeout on iteration {st.idx}")
        self._stop_workers(run)
        run.reported = True
        raise error

    def _finish(self, run: _Run) -> None:
        if not run.finished:
            self._stop_workers(run)
            self._streams.synchronize()
            self._collect_device_timeline(run)
            for st in run.device_pending.values():
                st.ctx = None
            run.device_pending.clear()
            run.finished = True

    def _teardown(self, cancel: bool) -> None:
        """Stop this run's workers, synchronise the device, release every context, forget the run."""
        run = self._run
        if run is None:
            return
        if cancel and not (run.finished or run.cancelled):
            self._cancel(run, None, "pipeline closed")
        self._stop_workers(run)
        self._streams.synchronize()
        self._collect_device_timeline(run)
        for st in list(run.iters.values()) + list(run.device_pending.values()):
            st.ctx = None
        run.iters.clear()
        run.device_pending.clear()
        self._run = None

    def _collect_device_timeline(self, run: _Run) -> None:
        """On CUDA with record_timeline: turn timing events into ``kind="device"`` events.

        Device times are placed on the host clock by the origin event recorded
        at fill time (assumed to execute when it was recorded: an idle device).
        """
        if not run.device_timing or run.origin_event is None or self._recorder is None:
            return
        origin_host = self._recorder.origin
        for ti, i, start_ev, end_ev in run.device_timing:
            start = origin_host + run.origin_event.elapsed_time(start_ev) / 1e3
            end = origin_host + run.origin_event.elapsed_time(end_ev) / 1e3
            self._recorder.record(ti.name, i, ti.group, ti.stream, start, end, kind="device")
        run.device_timing.clear()

    def drain(self) -> None:
        """Retire every in-flight iteration, stop the workers, synchronise, reset.

        Afterwards :meth:`fill_pipeline` starts afresh. After a failure,
        ``drain`` just resets. Shortcut settings and caches are kept. With no
        pipelined run (serial use) it only synchronises the device.

        Raises
        ------
        PipelineTaskError
            A task failed while draining, or failed earlier without the caller
            having seen it yet (the pipeline is reset all the same).
        """
        run = self._run
        if run is None:
            self._streams.synchronize()
            return
        unreported = None
        try:
            if run.cancelled:
                if not run.reported:  # a failure the caller has not seen yet: never lose it
                    run.reported = True
                    unreported = run.error
            elif not run.finished:
                run.draining = run.exhausted = True
                while run.oldest < run.fetched:
                    self._retire_oldest(run)
                    self._advance(run, _NO_BATCH)
        except BaseException:
            self._teardown(cancel=True)
            raise
        self._teardown(cancel=False)
        if unreported is not None:
            raise unreported

    def close(self) -> None:
        """Stop now: cancel what is in flight (running tasks finish), join the workers, reset.

        Use :meth:`drain` to complete in-flight iterations instead. The
        pipeline can be filled again afterwards.
        """
        run = self._run
        if run is not None and run.cancelled and not run.reported and run.error is not None:
            _log.warning("close(): discarding a failure that was never reported to the caller: %s", run.error)
        self._teardown(cancel=True)

    def __enter__(self) -> "SWPipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------- run modes

    def run(self, data_iter: Iterable[Any], verbose: bool = False, emit_nvtx: bool = False) -> float:
        """Pipelined execution of every batch of ``data_iter``; returns wall seconds.

        ``fill_pipeline`` + ``progress`` until ``StopIteration``, then reset
        (on CUDA the time includes the final synchronize). Tasks show as
        ``SWP/{Task}/iter{N}`` ranges in a ``torch.profiler`` trace (worker
        threads need ``experimental_config=torch._C._profiler._ExperimentalConfig(profile_all_threads=True)``)
        and as NVTX ranges on CUDA.

        Parameters
        ----------
        data_iter : iterable
        verbose : bool
            Log each retired iteration and a summary (``logging``, INFO, logger
            ``swpipe_core.engine``).
        emit_nvtx : bool
            On CUDA, wrap the run in ``torch.autograd.profiler.emit_nvtx()`` so
            autograd (backward) ops are visible in Nsight Systems. Ignored on CPU.

        Returns
        -------
        float
            Wall-clock seconds.

        Raises
        ------
        PipelineTaskError, RuntimeError
            As :meth:`progress`; no worker thread survives.
        Exception
            The data iterator's own errors, unchanged.

        Examples
        --------
        >>> from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
        >>> seen = []
        >>> plan = PipelinePlan({PipelineTask("A", lambda ctx: seen.append(ctx.iter_idx)): TaskSchedule()})
        >>> elapsed = SWPipeline(plan, device="cpu").run(range(3))
        >>> seen, elapsed > 0
        ([0, 1, 2], True)
        """
        t0 = time.perf_counter()
        n = 0
        with self._emit_nvtx(emit_nvtx):
            it = self.fill_pipeline(data_iter)  # cleans up after itself if it fails
            try:
                while True:
                    try:
                        idx = self.progress(it)
                    except StopIteration:
                        break
                    n += 1
                    if verbose:
                        _log.info("SWPipeline.run: retired iteration %d at %.3f ms", idx,
                                  (time.perf_counter() - t0) * 1e3)
                self._streams.synchronize()
            except BaseException:
                self._teardown(cancel=True)
                raise
        elapsed = time.perf_counter() - t0
        self._teardown(cancel=False)
        if verbose:
            _log.info("SWPipeline.run: %d iteration(s) in %.3f s (%.3f ms/iteration)", n, elapsed,
                      elapsed * 1e3 / max(n, 1))
        return elapsed

    def run_serial(self, data_iter: Iterable[Any], verbose: bool = False, emit_nvtx: bool = False) -> float:
        """Run every iteration serially on the caller's thread and the default stream; returns wall seconds.

        The baseline a pipelined run is compared with: no workers, no overlap,
        tasks in a topological order of the intra-iteration dependencies.
        Ranges are named ``SWP_serial/{Task}/iter{N}`` (``[skip]`` added for
        shortcut tasks). Timeline events carry thread group ``"serial"``.

        Raises
        ------
        PipelineTaskError
            A task raised (``thread_group`` is the task's configured group).
        RuntimeError
            Pipelined iterations are in flight (call :meth:`drain` first).

        Examples
        --------
        >>> from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
        >>> seen = []
        >>> plan = PipelinePlan({PipelineTask("B", lambda ctx: seen.append(("B", ctx.iter_idx))): TaskSchedule(1),
        ...                      PipelineTask("A", lambda ctx: seen.append(("A", ctx.iter_idx))): TaskSchedule(0)},
        ...                     intra_iter_deps=[("B", "A")])
        >>> _ = SWPipeline(plan, device="cpu").run_serial(range(2))
        >>> seen
        [('A', 0), ('B', 0), ('A', 1), ('B', 1)]
        """
        self._check_runnable()
        self._check_idle("run_serial() called")
        self._teardown(cancel=False)
        if self._recorder is not None:
            self._recorder.clear()
        t0 = time.perf_counter()
        n = 0
        with self._emit_nvtx(emit_nvtx):
            for i, batch in enumerate(data_iter):
                self._serial_iteration(batch, i)
                n += 1
                if verbose:
                    _log.info("SWPipeline.run_serial: finished iteration %d at %.3f ms", i,
                              (time.perf_counter() - t0) * 1e3)
            self._streams.synchronize()
        elapsed = time.perf_counter() - t0
        if verbose:
            _log.info("SWPipeline.run_serial: %d iteration(s) in %.3f s (%.3f ms/iteration)", n, elapsed,
                      elapsed * 1e3 / max(n, 1))
        return elapsed

    def run_one_serial_iter(self, batch: Any, iter_idx: int = 0) -> None:
        """One serial iteration on the default stream; no workers, no in-flight state.

        Respects shortcuts (a shortcut task replays its cache). Timeline
        events, when recorded, are appended to the current timeline.

        Parameters
        ----------
        batch : Any
        iter_idx : int

        Raises
        ------
        PipelineTaskError
            A task raised.
        RuntimeError
            Pipelined iterations are in flight (call :meth:`drain` first).

        Examples
        --------
        >>> from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
        >>> seen = []
        >>> plan = PipelinePlan({PipelineTask("A", lambda ctx: seen.append((ctx.batch, ctx.iter_idx))): TaskSchedule()})
        >>> SWPipeline(plan, device="cpu").run_one_serial_iter("b", iter_idx=7); seen
        [('b', 7)]
        """
        self._check_runnable()
        self._check_idle("run_one_serial_iter() called")
        self._serial_iteration(batch, iter_idx)

    def _serial_iteration(self, batch: Any, i: int) -> None:
        ctx = IterContext(batch, i)
        cuda = self._streams.is_cuda
        recorder = self._recorder
        profiling = _profiler_active()
        stream_ctx = self._streams.use(torch.cuda.default_stream(self.device)) if cuda else contextlib.nullcontext()
        with stream_ctx:
            for ti in self._serial_order:
                t0 = time.perf_counter() if recorder is not None else 0.0
                name = self._range_name("SWP_serial", ti.name, i) if (cuda or profiling) else ""
                if cuda:
                    torch.cuda.nvtx.range_push(name)
                try:
                    if profiling:
                        with torch.autograd.profiler.record_function(name):
                            self._exec_task(ti.task, ctx)
                    else:
                        self._exec_task(ti.task, ctx)
                except Exception as exc:
                    raise PipelineTaskError(ti.name, i, ti.group, ti.stage, exc) from exc
                finally:
                    if cuda:
                        torch.cuda.nvtx.range_pop()
                if recorder is not None:
                    recorder.record(ti.name, i, _SERIAL_GROUP, "default", t0, time.perf_counter())

    def _emit_nvtx(self, enabled: bool) -> Any:
        if enabled and self._streams.is_cuda:
            return torch.autograd.profiler.emit_nvtx()
        if enabled:
            _log.debug("emit_nvtx ignored: NVTX needs a CUDA device (running on %s)", self.device)
        return contextlib.nullcontext()

    # ------------------------------------------------------------- shortcuts

    def enable_shortcut(self, *task_names: str) -> None:
        """Shortcut tasks: the first execution caches, later ones replay (see :mod:`swpipe_core.shortcut`).

        Raises
        ------
        ValueError
            An unknown task name.
        RuntimeError
            Pipelined iterations are in flight (call :meth:`drain` first).
        """
        names = self._known(task_names, "enable_shortcut")
        self._check_idle("enable_shortcut() called")
        self._shortcut.enable(names)

    def disable_shortcut(self, *task_names: str) -> None:
        """Stop shortcutting tasks and drop their caches.

        Raises
        ------
        ValueError
            An unknown task name.
        RuntimeError
            Pipelined iterations are in flight (call :meth:`drain` first).
        """
        names = self._known(task_names, "disable_shortcut")
        self._check_idle("disable_shortcut() called")
        self._shortcut.disable(names)

    def _known(self, task_names: Tuple[Any, ...], what: str) -> List[str]:
        names = [ref_name(n) for n in task_names]
        unknown = [n for n in names if n not in self.plan.task_names]
        if unknown:
            raise ValueError(f"{what}: unknown task(s) {unknown}; tasks of this plan: {self.plan.task_names}")
        return names

    @property
    def shortcuts(self) -> List[str]:
        """Names of the tasks currently shortcut, sorted."""
        return sorted(self._shortcut.tasks)

    # ---------------------------------------------------------- observability

    @property
    def timeline(self) -> List[TimelineEvent]:
        """Events of the current or last run (``record_timeline=True`` only).

        Reset by each :meth:`fill_pipeline`, :meth:`run` and :meth:`run_serial`.

        Raises
        ------
        RuntimeError
            The pipeline was built without ``record_timeline=True``.
        """
        if self._recorder is None:
            raise RuntimeError("no timeline: construct SWPipeline(plan, record_timeline=True) to record one")
        return list(self._recorder.events)

    @property
    def in_flight(self) -> int:
        """Number of pipelined iterations enqueued and not yet retired."""
        run = self._run
        return 0 if run is None or run.finished else run.fetched - run.oldest

    @property
    def worker_threads(self) -> List[str]:
        """Names of this pipeline's worker threads that are alive."""
        run = self._run
        return [] if run is None or run.workers is None else run.workers.alive()

    def format_schedule(self, num_iterations: int = 3) -> str:
        """The period x task schedule table (see :func:`swpipe_core.analysis.format_schedule`)."""
        from .analysis import format_schedule

        return format_schedule(self.plan, num_iterations=num_iterations, shortcuts=tuple(self.shortcuts))

    def print_schedule(self, num_iterations: int = 3) -> None:
        """Print :meth:`format_schedule`."""
        print(self.format_schedule(num_iterations))

    def print_stage_analysis(self) -> None:
        """Print the topological order, stages, Dilworth LDS and optimality check."""
        from .analysis import format_stage_analysis

        print(format_stage_analysis(self.plan))

    def __repr__(self) -> str:
        dev = self.device.index if self.device.type == "cuda" else "cpu"
        try:
            from .analysis import format_plan_repr
        except ImportError:  # analysis module unavailable: a summary line alone
            return (f"SWPipeline(device={dev}, depth={self.plan.pipeline_depth}, tasks={self.plan.task_names}, "
                    f"shortcuts={self.shortcuts})")
        return format_plan_repr(self.plan, dev, self.shortcuts)
