"""SWPipeline: runs a :class:`~swpipe_core.plan.PipelinePlan` pipelined on threads and streams.

Execution semantics (the contract :mod:`autosched.model.simulate` models):

* Period ``p`` runs, for every task ``T``, iteration ``p - stage(T)``.
  ``fill_pipeline`` enqueues periods ``0 .. depth-1``; each ``progress`` waits
  until the oldest in-flight iteration completed on the CPU side (all its
  tasks' CPU signals set), retires it, on CUDA waits until the device work
  of iteration ``retired - max_device_lag`` completed (bounded run-ahead),
  enqueues the next period and returns the retired index. Iterations beyond the data are never enqueued.
* The main thread walks a period's tasks in the plan's enqueue order,
  putting each onto the FIFO queue of its thread group (one worker thread
  ``swpipe-<group>`` per group, :mod:`swpipe_core.engine.workers`), and running
  each task of the caller's group itself when the walk reaches it (below).
* A worker takes a task and (1) waits the CPU signals of its dependencies:
  ``dep(i)`` for intra deps and ``dep(i - N)`` for inter deps of distance
  ``N`` (nothing for ``i - N < 0``); (2) a ``globally_ordered`` task waits its
  sequence turn (:mod:`swpipe_core.engine.sequencer`); (3) on CUDA its stream waits
  the device events of dependencies on *other* streams (same-stream order is
  already given by the stream's FIFO, since the dependency's kernels were
  launched before its CPU signal was set); (4) it runs ``fn(ctx)`` with its
  stream current; (5) records its device event, then sets its CPU signal.
  On CPU, streams are names and events are no-ops.

Failures (no thread is ever left hanging): the first exception in any task
sets the run's cancel flag, aborts the sequencer and wakes every waiter;
workers skip what is left; the caller's ``progress``/``run`` joins the workers and raises
:class:`PipelineTaskError` naming task, iteration, thread group and stage,
chained to the original exception (``__cause__``, with its traceback). A
dependency or progress wait that times out is reported the same way, naming
what it waited for. Exceptions from the data iterator propagate unchanged
and leave the pipeline intact. ``KeyboardInterrupt`` in the caller cancels
and joins the workers. After any failure ``drain()`` (or a new
``fill_pipeline``) gives a usable pipeline again.

Caller group (``PipelinePlan.caller_group``, ``"default"`` unless set; ``None``
= off): that group's tasks run inline on the thread calling
``fill_pipeline``/``progress``, in enqueue order; a task of another group is
handed to its worker when the walk reaches it, so one placed after a
caller's task starts once that task has run (the order policies place every
other group's task as early as the graph allows: :mod:`swpipe_core.order`).
No worker thread exists for the caller's group, so a single-group plan
starts no worker and pays no hand-off; a watchdog thread turns a caller's
task that blocks past ``signal_timeout`` into its error
(:mod:`swpipe_core.engine.watchdog`).

Memory: every in-flight iteration has its own :class:`IterContext`; on CPU a
retired iteration's context is dropped when ``progress`` returns, so at most
``pipeline_depth`` are alive. On CUDA, CPU completion is not device
completion, and a task that frees early (``del ctx.x``, ``ctx.x = new``,
``ctx.d.pop(k)``, ``zero_grad(set_to_none=True)``) may drop the last
reference to a tensor a kernel on *another* stream has not read yet: the
caching allocator would hand the block at once to the stream that allocated
it (e.g. the next H2D copy on ``memcpy``), overwriting the reader's input.
So on CUDA the context (:class:`~swpipe_core.engine.state._GuardedContext`)
keeps everything removed from it, every device tensor nested in it at the end
of each task, the gradients of ``state`` and what tasks pass to
``ctx.keep_alive``, and a retired context is released only once the device
events of all its iteration's tasks have completed (checked on each
``progress``; the device-lag bound, ``max_device_lag``, keeps their number
bounded). docs/semantics.md ("Lifetimes on CUDA") lists exactly what is kept
and what the user keeps. We chose this over ``record_stream`` because it is
stream-agnostic and type-agnostic: it needs no list of consumer streams, so
it covers a ``KeyedJaggedTensor``, a dataclass of tensors or a loss whose
autograd graph holds saved tensors, at the cost of freeing at iteration
granularity rather than per stream. CPU pipelines use the plain context.

Stream identity: "same stream" is the *resolved* stream (device + stream
id, :meth:`~swpipe_core.engine.streams.StreamPool.key`), so a device wait is
inserted whenever a dependency's stream differs from the task's;
``_device_waits`` lists them. ``stream="default"`` is rejected by
:func:`~swpipe_core.validate.validate` (rule ``stream_name``): use ``None``.

Teardown never calls an unbounded ``torch.cuda.synchronize()``: it fences
the pipeline's streams and polls with a deadline; a device that does not
finish (a dead NCCL peer) or a sticky CUDA error leaves the contexts alive
(never freed under a running kernel), never masks the task's exception, and
leaves a pipeline that can be filled again.

Unbound plans (tasks without ``fn``) can be constructed, printed and
analysed; running one (``fill_pipeline``, ``run``, ``run_serial``,
``run_one_serial_iter``) raises :class:`~swpipe_core.validate.PlanError`
(rule ``unbound-task``) naming the tasks.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import deque
from typing import Any, Deque, Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from swpipe_core.plan import PipelinePlan, ref_name
from swpipe_core.engine.checks import check_arguments, check_idle, check_runnable
from swpipe_core.engine.device import as_device
from swpipe_core.engine.failure import abort, cancel, inline_overran, surface_failure
from swpipe_core.engine.lifetime import _DeviceLifetime
from swpipe_core.engine.loop import _NO_BATCH, _PeriodLoop
from swpipe_core.engine.program import Program, compile_tasks, device_waits
from swpipe_core.engine.serial import _SerialRunner
from swpipe_core.engine.tasks import _TaskRunner
from swpipe_core.engine.state import PipelineTaskError, _context_keeper, _GuardedContext, _parameters, _Run, _TaskInfo
from swpipe_core.engine.sequencer import _SubmissionSequencer
from swpipe_core.engine.shortcut import _ShortcutState
from swpipe_core.engine.streams import StreamPool
from swpipe_core.measure.trace import TimelineEvent, TimelineRecorder
from swpipe_core.engine.rng import PerTaskRng
from swpipe_core.walk import PeriodWalk
from swpipe_core.engine.watchdog import InlineWatchdog
from swpipe_core.engine.workers import _Workers

__all__ = ["SWPipeline", "PipelineTaskError"]

_log = logging.getLogger(__name__)


class SWPipeline(_PeriodLoop, _DeviceLifetime, _SerialRunner, _TaskRunner):
    """Software-pipelined execution of a plan: pipelined, serial, or one iteration at a time.

    Parameters
    ----------
    plan : PipelinePlan
        Validated at construction (:func:`~swpipe_core.validate.validate`).
    device : int, str, torch.device or swpipe_core.engine.device.Device
        An integer is that CUDA device when CUDA is available, else the CPU;
        ``"cpu"``/``"cuda:1"`` are taken literally; a
        :class:`~swpipe_core.engine.device.Device` is used as given (e.g. a device of
        ``swpipe.testing.FakeCuda``, which runs the CUDA paths on a CPU).
    signal_timeout : float
        Seconds a task waits for one dependency's CPU signal before failing
        with an error naming the task, the dependency and its iteration.
    sequencer_timeout : float
        Seconds a globally ordered task waits for its turn.
    progress_timeout : float
        Seconds ``progress`` waits for the oldest iteration before raising
        ``RuntimeError`` naming the iteration and its unfinished tasks.
    record_timeline : bool
        Record a :class:`~swpipe_core.measure.trace.TimelineEvent` per task execution
        (:attr:`timeline`); off by default to keep the hot path lean.
    max_device_lag : int or None
        Bounded run-ahead (CUDA): after retiring iteration ``r``, ``progress``
        waits until the device events of iteration ``r - max_device_lag``
        (if ``>= 0``) have completed before enqueueing the next period, so
        at most that many retired iterations (and their contexts) wait on
        the device. ``None`` is the pipeline depth; ``0`` waits for the
        retired iteration itself. No effect on CPU, where device work
        completes with the host.
    strict : bool, or modules/optimizers
        Strict mode (off by default): pipelined runs check every ``ctx``
        attribute access (and, given modules/optimizers, their tensors) against
        the plan's order and raise on the first unordered one
        (:mod:`swpipe_core.dataflow.strict`).
    rng : {None, "per_task"}
        ``"per_task"``: every task draws its random numbers from a generator
        of its own for each iteration, seeded from ``torch.initial_seed()``
        at construction, on pipelined and serial runs alike, so a pipelined
        run equals its serial run bit for bit whatever the threads' timing
        (:mod:`swpipe_core.engine.rng`; a few microseconds per op). ``None``: tasks
        share torch's default generators, and tasks that draw must be
        ordered by the plan to match the serial loop (``check_dataflow``
        names the missing order).
    state : module, optimizer, or a list/dict of them, optional
        What the tasks train. On CUDA the engine keeps its parameters'
        gradients alive until the device work of the iteration that made
        them has completed, so ``zero_grad(set_to_none=True)`` on one stream
        never frees a gradient an optimizer step on another stream still
        reads (docs/semantics.md, "Lifetimes on CUDA"). Nothing on CPU.

    Raises
    ------
    TypeError
        ``plan`` is not a :class:`~swpipe_core.plan.PipelinePlan`.
    PlanError
        The plan breaks a validation rule.
    ValueError
        A timeout is not positive, or ``max_device_lag`` is not ``None`` or an integer ``>= 0``.

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
                 record_timeline: bool = False, max_device_lag: Optional[int] = None,
                 strict: Any = False, state: Any = None, rng: Optional[str] = None) -> None:
        check_arguments(plan, {"signal_timeout": signal_timeout, "sequencer_timeout": sequencer_timeout,
                               "progress_timeout": progress_timeout}, max_device_lag, rng)
        self.plan = plan
        self.max_device_lag = plan.pipeline_depth if max_device_lag is None else max_device_lag
        self._dev = as_device(device)
        self.device = self._dev.torch_device
        self._state_params = _parameters(state)  # checked now: a bad state is an error at construction
        self._rng = PerTaskRng(torch.initial_seed()) if rng == "per_task" else None
        # float("inf") means "no limit"; lock waits accept at most TIMEOUT_MAX
        self.signal_timeout = min(float(signal_timeout), threading.TIMEOUT_MAX)
        self.sequencer_timeout = min(float(sequencer_timeout), threading.TIMEOUT_MAX)
        self.progress_timeout = min(float(progress_timeout), threading.TIMEOUT_MAX)
        self.record_timeline = bool(record_timeline)
        self._join_timeout = 5.0  # per worker, after a cancel: a task stuck in user code cannot be interrupted
        self._teardown_timeout = 5.0  # device work after a failure: a dead NCCL peer never finishes
        self._streams = StreamPool(self._dev)
        self._infos = compile_tasks(plan, self._streams)
        by_name = self._by_name = {ti.name: ti for ti in self._infos}
        self._walk = PeriodWalk(plan)  # the contract's walk of a period (swpipe_core.walk)
        self._programs: Dict[Tuple[int, int], Program] = {}  # period shape -> its tasks and segments
        self._order: List[_TaskInfo] = [by_name[n] for n in self._walk.order]
        self._serial_order: List[_TaskInfo] = self._topological(plan, by_name)
        groups = list(dict.fromkeys(ti.group for ti in self._order))
        # the caller's group runs inline on the thread calling fill_pipeline/progress: no hand-off
        self._caller_group: Optional[str] = plan.caller_group if plan.caller_group in groups else None
        self._groups = [g for g in groups if g != self._caller_group]  # one worker thread each
        self._device_waits = device_waits(self._infos)  # inspectable on CPU too
        # (events, contexts, streams) a failed teardown could not free; events None: the fence itself failed
        self._limbo: List[Tuple[Optional[List[Any]], List[Any], List[Any]]] = []
        self._serial_pending: Deque[Tuple[Any, Any]] = deque()  # CUDA: (event, context) of serial iterations
        self._shortcut = _ShortcutState()
        self._wrappers: Tuple[Tuple[object, Any], ...] = ()  # instrument(): (token, wrapper), outermost first
        self._wrapped: Optional[Any] = None  # ... composed around _call_task; None: none installed
        self._recorder: Optional[TimelineRecorder] = TimelineRecorder() if record_timeline else None
        self._run: Optional[_Run] = None
        from swpipe_core.dataflow.strict import strict_guard  # strict mode (off by default): see swpipe_core.dataflow.strict
        self._strict = strict_guard(plan, strict, self.device, shared_rng=self._rng is None)

    # --------------------------------------------------------------- pipelined

    def fill_pipeline(self, data_iter: Iterable[Any], emit_nvtx: bool = False) -> Iterator[Any]:
        """Start the workers and run the first ``pipeline_depth`` periods.

        For each period: enqueue the tasks of the worker groups, then run the
        caller group's tasks inline (``PipelinePlan.caller_group``).

        Parameters
        ----------
        data_iter : iterable
            Any iterable of batches (a list, a generator, a DataLoader); it may
            hold fewer batches than the depth, even none.
        emit_nvtx : bool
            On CUDA, an NVTX range per task execution on every thread, and
            ``torch.autograd.profiler.emit_nvtx()`` entered on every worker
            thread (the caller's own thread is the caller's to wrap;
            :meth:`run` does it). Ignored on CPU.

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
        check_idle(self._run, "fill_pipeline() called")
        check_runnable(self.plan)
        self._teardown(cancelling=True)
        self._prune_limbo()
        iterator = iter(data_iter)
        run = _Run(data_iter, iterator, _SubmissionSequencer(self.sequencer_timeout))
        self._run = run
        if self._recorder is not None:
            self._recorder.clear()
        # shortcuts and instrument() wrappers cannot change while a run is in flight (both need an idle
        # pipeline); a wrapper must see every task, so only a run without one may skip the dispatch
        run.plain = (not self._streams.is_cuda and self._recorder is None and not self._shortcut.tasks
                     and self._wrapped is None and self._strict is None and self._rng is None)
        try:
            if self._streams.is_cuda:
                run.streams = [self._streams.resolve(ti.stream_spec) for ti in self._infos]
                self._streams.follow_caller(run.streams)  # the run starts after what the caller enqueued before it
                run.nvtx = bool(emit_nvtx)
                run.ctx_type = _GuardedContext  # early frees stay alive until the device is done
                run.keep = _context_keeper(self._dev, self._state_params)
                if self._recorder is not None:
                    run.origin_event = self._streams.record(self._dev.default_stream(), timing=True)
                    self._recorder.origin = time.perf_counter()
            if self._caller_group is not None and self.signal_timeout < threading.TIMEOUT_MAX:
                run.watchdog = InlineWatchdog(self.signal_timeout, functools.partial(self._inline_overran, run))
                run.watchdog.start()
            if self._groups:  # a plan whose only group is the caller's starts no worker thread
                run.workers = _Workers(self._groups, lambda group, items: self._run_items(run, items),
                                       setup=self._dev.set_current,
                                       on_crash=lambda group, exc: cancel(run, exc, f"worker swpipe-{group} crashed"),
                                       scope=self._worker_scope(run))
                run.workers.start()
            for _ in range(self.plan.pipeline_depth):
                batch = self._fetch(run)
                self._advance(run, batch)
        except BaseException:
            self._teardown(cancelling=True)
            raise
        return iterator

    def _inline_overran(self, run: _Run, task: str, iteration: int, interrupts: bool) -> None:
        """The watchdog saw a caller's-group task run past ``signal_timeout``: :func:`.failure.inline_overran`."""
        inline_overran(run, self._by_name[task], iteration, interrupts, self.signal_timeout)

    def progress(self, data_iter: Optional[Iterator[Any]] = None) -> int:
        """Retire the oldest in-flight iteration and run the next period.

        In order: fetch the next batch; wait until the oldest in-flight
        iteration completed (CPU signals) and retire it; on CUDA wait until
        iteration ``retired - max_device_lag`` completed on the device;
        enqueue the next period's tasks of the worker groups; run its
        caller-group tasks inline, in enqueue order. A failure of a task the
        caller ran inline is raised by this call; a worker task's failure by
        the first call that finds it.

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
        KeyboardInterrupt
            Raised in the caller (also inside an inline task): the run is
            cancelled, the workers are joined; :meth:`drain` or
            :meth:`fill_pipeline` starts again.
        RuntimeError
            The oldest iteration did not complete within ``progress_timeout``
            (the message names it and its unfinished tasks), or its device
            work within ``progress_timeout`` of the device-lag wait; called before
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
            surface_failure(run, self._join_timeout)
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
            abort(run, "interrupted while fetching a batch", self._join_timeout)
            raise
        try:
            idx = self._retire_oldest(run)
            if run.device_pending:
                self._bound_device_lag(run, idx)
            self._advance(run, batch)
            if run.cancelled:  # a task of this period failed (one the caller ran inline, or a worker's): now
                surface_failure(run, self._join_timeout)
        except BaseException:
            if not run.reported:
                abort(run, "interrupted in progress()", self._join_timeout)
            raise
        return idx

    # ---------------------------------------------------------- drain and close

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
            self._sync_device("drain()")
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
            self._teardown(cancelling=True)
            raise
        self._teardown(cancelling=False)
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
        self._teardown(cancelling=True)

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
            ``swpipe_core.engine.pipeline``).
        emit_nvtx : bool
            On CUDA, wrap the run in ``torch.autograd.profiler.emit_nvtx()`` on
            the caller's thread *and every worker thread* (the profiler's NVTX
            mode is per thread), so autograd (backward) ops are visible in
            Nsight Systems, and push an NVTX range per task execution. Off,
            no per-task NVTX call is made. Ignored on CPU.

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
            it = self.fill_pipeline(data_iter, emit_nvtx=emit_nvtx)  # cleans up after itself if it fails
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
                self._sync_device("run()")
            except BaseException:
                self._teardown(cancelling=True)
                raise
        elapsed = time.perf_counter() - t0
        self._teardown(cancelling=False)
        if verbose:
            _log.info("SWPipeline.run: %d iteration(s) in %.3f s (%.3f ms/iteration)", n, elapsed,
                      elapsed * 1e3 / max(n, 1))
        return elapsed

    def _emit_nvtx(self, enabled: bool) -> Any:
        if enabled and self._streams.is_cuda:
            return self._dev.nvtx_mode()
        if enabled:
            _log.debug("emit_nvtx ignored: NVTX needs a CUDA device (running on %s)", self.device)
        return contextlib.nullcontext()

    # ------------------------------------------------------------- shortcuts

    def enable_shortcut(self, *task_names: str) -> None:
        """Shortcut tasks: the first execution caches, later ones replay (see :mod:`swpipe_core.engine.shortcut`).

        Raises
        ------
        ValueError
            An unknown task name.
        RuntimeError
            Pipelined iterations are in flight (call :meth:`drain` first).
        """
        names = self._known(task_names, "enable_shortcut")
        check_idle(self._run, "enable_shortcut() called")
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
        check_idle(self._run, "disable_shortcut() called")
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
        from swpipe_core.analysis import format_schedule

        return format_schedule(self.plan, num_iterations=num_iterations, shortcuts=tuple(self.shortcuts))

    def print_schedule(self, num_iterations: int = 3) -> None:
        """Print :meth:`format_schedule`."""
        print(self.format_schedule(num_iterations))

    def print_stage_analysis(self) -> None:
        """Print the topological order, stages, Dilworth LDS and optimality check."""
        from swpipe_core.analysis import format_stage_analysis

        print(format_stage_analysis(self.plan))

    def __repr__(self) -> str:
        dev = self.device.index if self.device.type == "cuda" else "cpu"
        try:
            from swpipe_core.analysis import format_plan_repr
        except ImportError:  # analysis module unavailable: a summary line alone
            return (f"SWPipeline(device={dev}, depth={self.plan.pipeline_depth}, tasks={self.plan.task_names}, "
                    f"shortcuts={self.shortcuts})")
        return format_plan_repr(self.plan, dev, self.shortcuts)
