"""SWPipeline: runs a :class:`~swpipe_core.plan.PipelinePlan` pipelined on threads and streams, or serially.

Execution semantics (docs/semantics.md is the contract; :mod:`autosched.model.simulate` models it):

* Period ``p`` runs, for every task ``T``, iteration ``p - stage(T)``.
  ``fill_pipeline`` runs periods ``0 .. depth-1``; each ``progress`` fetches
  the next batch, waits until the oldest in-flight iteration completed on the
  CPU side (all its tasks' CPU signals set), retires it, on CUDA waits until
  the device work of iteration ``retired - max_device_lag`` completed
  (bounded run-ahead), runs the next period and returns the retired index.
  Iterations beyond the data are never enqueued.
* Running a period is one walk of its tasks in the plan's enqueue order
  (:class:`~swpipe_core.walk.PeriodWalk`): a task of a worker group is put
  on its group's FIFO queue (one worker thread ``swpipe-<group>`` per group)
  when the walk reaches it, a task of the caller's group
  (``PipelinePlan.caller_group``) runs inline on the caller's thread then
  (:mod:`~swpipe_core.engine.loop`).
* A task instance (1) waits the CPU signals of its dependencies, (2) takes
  its sequence turn if globally ordered, (3) on CUDA makes its stream wait
  the device events of dependencies on *other* streams, (4) runs ``fn(ctx)``
  with its stream current through the pipeline's one dispatch point, (5)
  records its device event, then sets its CPU signal
  (:mod:`~swpipe_core.engine.tasks`, :mod:`~swpipe_core.engine.dispatch`).

A run is a :class:`~swpipe_core.engine.loop.PeriodLoop`, which
``fill_pipeline`` makes: the period loop, holding the run's other owners, how
its tasks run (:mod:`~swpipe_core.engine.tasks`), its device lifetimes
(:mod:`~swpipe_core.engine.lifetime`: on CUDA a context lives until the
device is done with it) and its failure (:mod:`~swpipe_core.engine.failure`:
the first error cancels the run, wakes every waiter, and reaches the caller
once as a :class:`PipelineTaskError` naming task, iteration, thread group and
stage). Serial runs are
:mod:`~swpipe_core.engine.serial`'s. Every wait is bounded
(:class:`~swpipe_core.engine.options.Timeouts`): no thread is ever left
hanging, and after any failure ``drain()`` (or a new ``fill_pipeline``)
gives a usable pipeline again.

Unbound plans (tasks without ``fn``) can be constructed, printed and
analysed; running one raises :class:`~swpipe_core.validate.PlanError`
(rule ``unbound-task``) naming the tasks.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import warnings
from typing import Any, ContextManager, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import torch

from swpipe_core.engine.checks import check_arguments, check_first_iter_idx, check_idle, check_runnable
from swpipe_core.engine.device import CpuFallbackWarning, Device, as_device, falls_back_to_cpu
from swpipe_core.engine.dispatch import Dispatch, TaskWrapper
from swpipe_core.engine.failure import PipelineTaskError
from swpipe_core.engine.lifetime import GuardedContext, Limbo, TrainState, context_keeper, device_hung, state_parameters
from swpipe_core.engine.loop import NO_BATCH, PeriodLoop
from swpipe_core.engine.options import Timeouts, keywords_checked
from swpipe_core.engine.program import compile_plan
from swpipe_core.engine.rng import PerTaskRng
from swpipe_core.engine.run import RunSetup
from swpipe_core.engine.sequencer import SubmissionSequencer
from swpipe_core.engine.serial import SerialRunner, serial_order
from swpipe_core.engine.streams import StreamPool
from swpipe_core.measure.trace import TimelineEvent, TimelineRecorder
from swpipe_core.plan import PipelinePlan, ref_name

__all__ = ["SWPipeline", "PipelineTaskError"]

_log = logging.getLogger(__name__)

#: What ``SWPipeline(device=...)`` takes.
DeviceSpec = Union[int, str, torch.device, Device]


@contextlib.contextmanager
def _verbose_output(enabled: bool) -> Iterator[None]:
    """While a run asked for ``verbose`` output, its INFO lines reach the user.

    Python's logging shows INFO records only where the user configured it (by
    default nothing below WARNING, which ``verbose=True`` would then print
    nothing). Where this logger's INFO records already reach a handler, nothing
    changes; otherwise a handler writing the bare message to ``sys.stderr``
    is attached for the run, and the records stop at it (no second copy from
    a handler above that the user set for warnings).
    """
    if not enabled or (_log.isEnabledFor(logging.INFO) and _log.hasHandlers()):
        yield
        return
    handler = logging.StreamHandler(sys.stderr)  # sys.stderr now, not at import: a redirected stderr is honoured
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = _log.level, _log.propagate
    _log.addHandler(handler)
    _log.setLevel(logging.INFO)
    _log.propagate = False
    try:
        yield
    finally:
        _log.removeHandler(handler)
        _log.setLevel(level)
        _log.propagate = propagate


class SWPipeline:
    """Software-pipelined execution of a plan: pipelined, serial, or one iteration at a time.

    Parameters
    ----------
    plan : PipelinePlan
        Validated at construction (:func:`~swpipe_core.validate.validate`).
    device : int, str, torch.device or swpipe_core.engine.device.Device
        An integer is that CUDA device when CUDA is available, else the CPU,
        with a :class:`~swpipe_core.engine.device.CpuFallbackWarning` saying
        so (``SWPipeline(plan, device=0)`` on a machine without CUDA);
        ``"cpu"``/``"cuda:1"`` are taken literally; a
        :class:`~swpipe_core.engine.device.Device` is used as given (e.g. a device of
        ``swpipe.testing.FakeCuda``, which runs the CUDA paths on a CPU).
    timeouts : Timeouts, optional
        How long each wait may last before it is an error naming what it
        waited for (a dependency's signal, a sequencer turn, the oldest
        iteration, the device); default ``Timeouts()``.
    record_timeline : bool
        Record a :class:`~swpipe_core.measure.trace.TimelineEvent` per task execution
        (:attr:`timeline`); off by default to keep the hot path lean.
    max_device_lag : int or None
        Bounded run-ahead (CUDA): after retiring iteration ``r``, ``progress``
        waits until the device events of iteration ``r - max_device_lag``
        (if ``>= 0``) have completed before running the next period, so
        at most that many retired iterations (and their contexts) wait on
        the device. ``None`` is the pipeline depth; ``0`` waits for the
        retired iteration itself. No effect on CPU, where device work
        completes with the host.
    strict : bool, or modules/optimizers
        Strict mode (off by default; :mod:`swpipe_core.dataflow.strict`):
        pipelined runs check accesses against the plan's order and raise
        :class:`~swpipe_core.dataflow.strict.StrictDataflowError` (inside the
        task's :class:`PipelineTaskError`) on the first pair the plan does not
        order. ``True`` checks every ``ctx`` attribute a task reads, writes or
        deletes, every draw from torch's default generators (unless
        ``rng="per_task"``), and, when ``state`` is given, every in-place read
        and write of its parameters, buffers and optimizer state. Modules or
        optimizers (``strict=[model, opt]``) check those instead of ``state``.
        Serial runs are never checked (one task runs at a time).
    state : module, optimizer, or a list/dict of them, optional
        What the tasks train. On CUDA the engine keeps its parameters'
        gradients alive until the device work of the iteration that made
        them has completed, so ``zero_grad(set_to_none=True)`` on one stream
        never frees a gradient an optimizer step on another stream still
        reads (docs/semantics.md, "Lifetimes on CUDA"); ``strict=True``
        watches it. Nothing else on CPU.
    rng : {None, "per_task"}
        ``"per_task"``: every task draws its random numbers from a generator
        of its own for each iteration, seeded from ``torch.initial_seed()``
        at construction, on pipelined and serial runs alike, so a pipelined
        run equals its serial run bit for bit whatever the threads' timing
        (:mod:`swpipe_core.engine.rng`; a few microseconds per op). ``None``: tasks
        share torch's default generators, and tasks that draw must be
        ordered by the plan to match the serial loop (``check_dataflow``
        names the missing order).

    Raises
    ------
    TypeError
        ``plan`` is not a :class:`~swpipe_core.plan.PipelinePlan`, or ``state`` holds something else than
        modules, optimizers and tensors.
    PlanError
        The plan breaks a validation rule.
    OptionError
        An option out of range, or one that belongs to another call (``signal_timeout=`` is now
        ``timeouts=Timeouts(signal_s=...)``; ``num_measure=`` is the profiler's): its ``home`` and ``fix`` say
        where it goes (a ``TypeError`` and a ``ValueError``).

    Examples
    --------
    >>> from swpipe import SWPipeline, PipelinePlan, PipelineTask, TaskSchedule
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

    @keywords_checked("SWPipeline")
    def __init__(self, plan: PipelinePlan, device: DeviceSpec = 0, *, timeouts: Optional[Timeouts] = None,
                 record_timeline: bool = False, max_device_lag: Optional[int] = None,
                 strict: Union[bool, TrainState] = False, state: TrainState = None,
                 rng: Optional[str] = None) -> None:
        from swpipe_core.dataflow.strict import strict_guard  # strict mode (off by default)

        check_arguments(plan, timeouts, max_device_lag, rng)
        self.plan = plan
        self.timeouts = timeouts if timeouts is not None else Timeouts()
        self.max_device_lag = plan.pipeline_depth if max_device_lag is None else max_device_lag
        self.record_timeline = bool(record_timeline)
        self._dev = as_device(device)
        self.device = self._dev.torch_device
        if falls_back_to_cpu(device):  # said where the pipeline is made, not at the first task that names "cuda"
            warnings.warn(CpuFallbackWarning(device), stacklevel=3)  # 3: the caller of keywords_checked's wrapper
        self._state_params = state_parameters(state)  # checked now: a bad state is an error at construction
        self._pool = StreamPool(self._dev)
        self._compiled = compile_plan(plan, self._pool)
        rng_per_task = PerTaskRng(torch.initial_seed()) if rng == "per_task" else None
        self._dispatch = Dispatch(strict_guard(plan, strict, self.device, shared_rng=rng_per_task is None, state=state),
                                  rng_per_task)
        self._recorder: Optional[TimelineRecorder] = TimelineRecorder() if record_timeline else None
        self._serial = SerialRunner(serial_order(plan, self._compiled.by_name), self._pool, self._dispatch,
                                    self._recorder, self.timeouts, self.max_device_lag)
        self._limbo = Limbo()  # contexts of ended runs the device may still read
        self._run: Optional[PeriodLoop] = None  # the pipelined run in flight (or finished, failed: until reset)

    # --------------------------------------------------------------- pipelined

    def fill_pipeline(self, data_iter: Iterable[Any], emit_nvtx: bool = False, *,
                      first_iter_idx: int = 0) -> Iterator[Any]:
        """Start the workers and run the first ``pipeline_depth`` periods.

        Each period is one walk of its tasks in the plan's enqueue order: a
        task of a worker group is handed to its worker when the walk reaches
        it, a task of the caller's group (``PipelinePlan.caller_group``) runs
        inline on this thread then (docs/semantics.md, "The main thread").

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
        first_iter_idx : int
            The iteration index of the first batch (default 0): the run's
            iterations are numbered from it, everywhere the engine names one
            (``ctx.iter_idx``, what :meth:`progress` returns, errors,
            timeline events, profiler ranges, the per-task generators of
            ``rng="per_task"``). A run that continues another one, drained
            before (a new plan after a swap), passes the index it stopped
            at, so that tasks keyed by ``ctx.iter_idx`` and per-task random
            draws go on as one run. The first iteration has no predecessor
            in the run: an inter-iteration dependency reaching before it is
            met (the run it continues has drained).

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
        >>> from swpipe import SWPipeline, PipelinePlan, PipelineTask, TaskSchedule
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

        A run that goes on from iteration 10:

        >>> seen = []
        >>> plan = PipelinePlan({PipelineTask("A", lambda ctx: seen.append(ctx.iter_idx)): TaskSchedule()})
        >>> with SWPipeline(plan, device="cpu") as pipe:
        ...     it = pipe.fill_pipeline("ab", first_iter_idx=10)
        ...     pipe.progress(it), pipe.progress(it)
        (10, 11)
        >>> seen
        [10, 11]
        """
        first = check_first_iter_idx(first_iter_idx, "SWPipeline.fill_pipeline")
        check_idle(self._run, "fill_pipeline() called")
        check_runnable(self.plan)
        self._teardown(cancelling=True)
        if self._limbo.entries:  # what the teardown just kept: freed now if the device has finished meanwhile
            self._limbo.prune(self._pool)
        run = self._run = self._new_run(data_iter, emit_nvtx, first)
        try:
            run.start(self.plan.pipeline_depth)
        except BaseException:
            self._teardown(cancelling=True)
            raise
        return run.data_iter

    def _new_run(self, data_iter: Iterable[Any], emit_nvtx: bool, first: int) -> PeriodLoop:
        """A new pipelined run over ``data_iter`` from iteration ``first``, its CUDA parts made (no thread started)."""
        iterator = iter(data_iter)  # first: data that is not iterable changes nothing
        if self._recorder is not None:
            self._recorder.clear()
        pool, dispatch = self._pool, self._dispatch
        sequencer = SubmissionSequencer(self.timeouts.sequencer_s)
        common = dict(compiled=self._compiled, pool=pool, dispatch=dispatch, timeouts=self.timeouts,
                      recorder=self._recorder, sequencer=sequencer, max_device_lag=self.max_device_lag)
        if not pool.is_cuda:
            # shortcuts and instrument() wrappers cannot change while a run is in flight (both need an idle
            # pipeline); a wrapper must see every task, so only a run without one may skip the dispatch
            setup = RunSetup(**common, plain=self._recorder is None and dispatch.plain)
            return PeriodLoop(setup, data_iter, iterator, first=first)
        streams = [pool.resolve(ti.stream_spec) for ti in self._compiled.tasks]
        pool.follow_caller(streams)  # the run starts after what the caller enqueued before it
        setup = RunSetup(**common, streams=streams, nvtx=bool(emit_nvtx),
                         ctx_type=GuardedContext,  # early frees stay alive until the device is done
                         keep=context_keeper(self._dev, self._state_params))
        origin = None
        if self._recorder is not None:
            origin = pool.record(self._dev.default_stream(), timing=True)
            self._recorder.origin = time.perf_counter()
        return PeriodLoop(setup, data_iter, iterator, origin, first)

    def progress(self, data_iter: Optional[Iterator[Any]] = None) -> int:
        """Retire the oldest in-flight iteration and run the next period.

        In order: fetch the next batch; wait until the oldest in-flight
        iteration completed (CPU signals) and retire it; on CUDA wait until
        iteration ``retired - max_device_lag`` completed on the device; run
        the next period: one walk of its tasks in the enqueue order, handing
        each worker group's task to its worker and running each of the
        caller's group inline. A failure of a task the caller ran inline is
        raised by this call; a worker task's failure by the first call that
        finds it.

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
            The retired iteration index (counted from the fill's ``first_iter_idx``).

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
            The oldest iteration did not complete within ``Timeouts.progress_s``
            (the message names it and its unfinished tasks), or its device
            work within that of the device-lag wait; called before
            :meth:`fill_pipeline`, after a failure, or with a different iterator.
        Exception
            Whatever the data iterator raises, unchanged; the pipeline stays
            usable (call ``progress`` again or :meth:`drain`).
        """
        run = self._run
        if run is None:
            raise RuntimeError("progress() called before fill_pipeline(); start with "
                               "data_iter = pipe.fill_pipeline(loader)")
        failure = run.failure
        if failure.cancelled:
            failure.surface()
        if data_iter is not None:
            if data_iter is not run.data_iter and data_iter is not run.data_source:
                raise RuntimeError("progress() got a different data iterator than fill_pipeline() returned; "
                                   "to switch data, call drain() and then fill_pipeline(new_data)")
            if run.draining:
                raise RuntimeError("the pipeline is draining (progress(None) or drain() was called), so it takes "
                                   "no new data; call drain() and then fill_pipeline(data) to start again")
        if run.retired_all:
            run.finish(self._limbo)
            raise StopIteration
        try:
            if data_iter is None:
                run.start_draining()
                batch = NO_BATCH
            else:
                batch = run.fetch()
        except Exception:
            raise  # the data iterator's own error: nothing changed, the pipeline is intact
        except BaseException:
            failure.abort("interrupted while fetching a batch")
            raise
        try:
            idx = run.retire_oldest()
            if run.device.pending:
                run.device.bound_lag(idx)
            run.advance(batch)
            if failure.cancelled:  # a task of this period failed (one the caller ran inline, or a worker's): now
                failure.surface()
        except BaseException:
            if not failure.reported:
                failure.abort("interrupted in progress()")
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
            if run.failure.cancelled:
                unreported = run.failure.unreported()  # a failure the caller has not seen yet: never lose it
            elif not run.finished:
                run.drain()
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
        failure = None if run is None else run.failure
        if failure is not None and failure.cancelled and not failure.reported and failure.error is not None:
            _log.warning("close(): discarding a failure that was never reported to the caller: %s", failure.error)
        self._teardown(cancelling=True)

    def __enter__(self) -> "SWPipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _teardown(self, cancelling: bool) -> None:
        """Stop the current run, if any, forget it and release its contexts once the device is done with them.

        Frees first what earlier runs kept for the device and it has finished
        with. Never raises on a failure path (``cancelling`` or a cancelled
        run): the caller is usually re-raising a task's exception.
        """
        if self._limbo.entries:
            self._limbo.prune(self._pool)
        run = self._run
        if run is None:
            return
        states = run.stop(cancelling)
        self._run = None
        run.end(states, cancelling, self._limbo)

    def _sync_device(self, what: str) -> None:
        """A bounded wait for all work on the pipeline's streams (nothing on CPU)."""
        if not self._pool.synchronize(self.timeouts.progress_s):
            raise RuntimeError(device_hung(what, self.timeouts.progress_s))
        self._serial.device_done()

    # ------------------------------------------------------------- run modes

    def run(self, data_iter: Iterable[Any], verbose: bool = False, emit_nvtx: bool = False, *,
            first_iter_idx: int = 0) -> float:
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
            A line per retired iteration (``SWPipeline.run: retired iteration 3
            at 1.234 ms``) and a summary, on stderr. They are ``logging``
            records (INFO, logger ``swpipe_core.engine.pipeline``): where
            logging already shows that logger's INFO records they go there
            alone; otherwise a handler writing to ``sys.stderr`` is attached
            for this run only.
        emit_nvtx : bool
            On CUDA, wrap the run in ``torch.autograd.profiler.emit_nvtx()`` on
            the caller's thread *and every worker thread* (the profiler's NVTX
            mode is per thread), so autograd (backward) ops are visible in
            Nsight Systems, and push an NVTX range per task execution. Off,
            no per-task NVTX call is made. Ignored on CPU.
        first_iter_idx : int
            The iteration index of the first batch (as :meth:`fill_pipeline`'s).

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
        >>> from swpipe import SWPipeline, PipelinePlan, PipelineTask, TaskSchedule
        >>> seen = []
        >>> plan = PipelinePlan({PipelineTask("A", lambda ctx: seen.append(ctx.iter_idx)): TaskSchedule()})
        >>> elapsed = SWPipeline(plan, device="cpu").run(range(3))
        >>> seen, elapsed > 0
        ([0, 1, 2], True)
        """
        first = check_first_iter_idx(first_iter_idx, "SWPipeline.run")
        with _verbose_output(verbose):
            return self._run_pipelined(data_iter, verbose, emit_nvtx, first)

    def _run_pipelined(self, data_iter: Iterable[Any], verbose: bool, emit_nvtx: bool, first: int) -> float:
        t0 = time.perf_counter()
        n = 0
        with self._emit_nvtx(emit_nvtx):
            it = self.fill_pipeline(data_iter, emit_nvtx=emit_nvtx, first_iter_idx=first)  # cleans up if it fails
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

    def run_serial(self, data_iter: Iterable[Any], verbose: bool = False, emit_nvtx: bool = False, *,
                   first_iter_idx: int = 0) -> float:
        """Run every iteration serially on the caller's thread and the default stream; returns wall seconds.

        The baseline a pipelined run is compared with: no workers, no overlap,
        tasks in a topological order of the intra-iteration dependencies.
        Ranges are named ``SWP_serial/{Task}/iter{N}`` (``[skip]`` added for
        shortcut tasks). Timeline events carry thread group ``"serial"``.
        ``verbose``, ``emit_nvtx`` and ``first_iter_idx`` are as in
        :meth:`run` (a line per finished iteration: ``SWPipeline.run_serial:
        finished iteration 3 at 1.234 ms``).

        Raises
        ------
        PipelineTaskError
            A task raised (``thread_group`` is the task's configured group).
        RuntimeError
            Pipelined iterations are in flight (call :meth:`drain` first).

        Examples
        --------
        >>> from swpipe import SWPipeline, PipelinePlan, PipelineTask, TaskSchedule
        >>> seen = []
        >>> plan = PipelinePlan({PipelineTask("B", lambda ctx: seen.append(("B", ctx.iter_idx))): TaskSchedule(1),
        ...                      PipelineTask("A", lambda ctx: seen.append(("A", ctx.iter_idx))): TaskSchedule(0)},
        ...                     intra_iter_deps=[("B", "A")])
        >>> _ = SWPipeline(plan, device="cpu").run_serial(range(2))
        >>> seen
        [('A', 0), ('B', 0), ('A', 1), ('B', 1)]
        """
        first = check_first_iter_idx(first_iter_idx, "SWPipeline.run_serial")
        check_runnable(self.plan)
        check_idle(self._run, "run_serial() called")
        self._teardown(cancelling=False)
        if self._recorder is not None:
            self._recorder.clear()
        with _verbose_output(verbose):
            return self._run_serial(data_iter, verbose, emit_nvtx, first)

    def _run_serial(self, data_iter: Iterable[Any], verbose: bool, emit_nvtx: bool, first: int) -> float:
        t0 = time.perf_counter()
        n = 0
        with self._emit_nvtx(emit_nvtx):
            for i, batch in enumerate(data_iter, first):
                self._serial.iteration(batch, i)
                n += 1
                if verbose:
                    _log.info("SWPipeline.run_serial: finished iteration %d at %.3f ms", i,
                              (time.perf_counter() - t0) * 1e3)
            self._sync_device("run_serial()")
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
        >>> from swpipe import SWPipeline, PipelinePlan, PipelineTask, TaskSchedule
        >>> seen = []
        >>> plan = PipelinePlan({PipelineTask("A", lambda ctx: seen.append((ctx.batch, ctx.iter_idx))): TaskSchedule()})
        >>> SWPipeline(plan, device="cpu").run_one_serial_iter("b", iter_idx=7); seen
        [('b', 7)]
        """
        check_runnable(self.plan)
        check_idle(self._run, "run_one_serial_iter() called")
        self._serial.iteration(batch, iter_idx)

    def _emit_nvtx(self, enabled: bool) -> ContextManager[Any]:
        if enabled and self._pool.is_cuda:
            return self._dev.nvtx_mode()
        if enabled:
            _log.debug("emit_nvtx ignored: NVTX needs a CUDA device (running on %s)", self.device)
        return contextlib.nullcontext()

    # -------------------------------------------------------- around each task

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
        >>> from swpipe import SWPipeline, PipelinePlan, PipelineTask, TaskSchedule
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
        token = self._dispatch.add(wrapper)
        try:
            yield wrapper
        finally:
            self._dispatch.remove(token)
        run = self._run
        if run is not None and run.busy:
            raise RuntimeError(f"instrument() block left while {run.in_flight} pipelined iteration(s) "
                               "are in flight: their remaining tasks run without the wrapper; call drain() (or "
                               "let run() finish) inside the block")

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
        self._dispatch.shortcut.enable(names)

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
        self._dispatch.shortcut.disable(names)

    def _known(self, task_names: Tuple[str, ...], what: str) -> List[str]:
        names = [ref_name(n) for n in task_names]
        unknown = [n for n in names if n not in self.plan.task_names]
        if unknown:
            raise ValueError(f"{what}: unknown task(s) {unknown}; tasks of this plan: {self.plan.task_names}")
        return names

    # ---------------------------------------------------------- observability

    @property
    def shortcuts(self) -> List[str]:
        """Names of the tasks currently shortcut, sorted."""
        return sorted(self._dispatch.shortcut.tasks)

    @property
    def cached_shortcuts(self) -> List[str]:
        """Names of the shortcut tasks whose cache is filled (their next execution replays it), sorted."""
        return sorted(self._dispatch.shortcut.cached)

    @property
    def instruments(self) -> Tuple[TaskWrapper, ...]:
        """The wrappers of the :meth:`instrument` blocks open now, outermost first."""
        return self._dispatch.wrappers

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
        return 0 if run is None else run.in_flight

    @property
    def worker_threads(self) -> List[str]:
        """Names of this pipeline's worker threads that are alive."""
        run = self._run
        return [] if run is None else run.tasks.alive()

    @property
    def streams(self) -> StreamPool:
        """The pipeline's streams and device events (:class:`~swpipe_core.engine.streams.StreamPool`).

        ``pipe.streams.resolve(plan.sched("Forward").stream)`` is the stream a
        task runs on (``None`` on CPU); ``pipe.streams.synchronize(timeout)``
        waits, bounded, for all their work.
        """
        return self._pool

    @property
    def device_waits(self) -> Dict[str, Tuple[Tuple[str, int], ...]]:
        """The device waits the engine inserts: ``{task: ((dependency, distance), ...)}`` (on CPU too).

        A task's stream waits for a dependency's device event when the two
        run on different *resolved* streams; same-stream order is the
        stream's own.
        """
        return dict(self._compiled.device_waits)

    @property
    def device_lag(self) -> int:
        """Retired iterations whose device work has not completed yet (0 on CPU; at most ``max_device_lag``)."""
        run = self._run
        return 0 if run is None else run.device.lag()

    @property
    def kept_for_device(self) -> int:
        """Iteration contexts of ended runs kept alive because their device work had not completed.

        A run that fails or is closed while a kernel still runs (a hung
        collective, a sticky CUDA error) waits at most ``Timeouts.teardown_s``
        for the device and keeps its contexts past that, so that no stream
        reads freed memory; the next :meth:`fill_pipeline`, :meth:`run`,
        :meth:`drain` or :meth:`close` frees those whose work has completed since.
        """
        return self._limbo.contexts()

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
