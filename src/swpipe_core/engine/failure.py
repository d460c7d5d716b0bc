"""How a run fails: the error it raises, the first error kept, every waiter woken, the workers joined, one raise.

A run's failure is a :class:`RunFailure`, the only writer of how the run
ends. No thread is ever left hanging: :meth:`RunFailure.cancel` records the
run's first error, sets its cancel flag, aborts the sequencer and wakes every
CPU-signal and completion waiter, so workers skip what is left; the caller
then joins the threads and raises that error (:meth:`RunFailure.surface`),
once. The timeouts of the caller's waits
(:meth:`RunFailure.progress_timed_out`) and of a caller's-group task the
watchdog finds overrunning (:meth:`RunFailure.inline_overran`,
:meth:`RunFailure.inline_timed_out`) fail the run the same way, with an
error naming what was waited for. A task's error is a :class:`PipelineTaskError`; when
the task's own error is one a missing dependency can cause, it says so and
how to find the dependency (:func:`dependency_hint`).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional, Sequence

from swpipe_core.engine.program import TaskInfo
from swpipe_core.engine.run import RunSetup
from swpipe_core.plan import IterContext

__all__ = ["PipelineTaskError", "dependency_hint"]

_log = logging.getLogger("swpipe_core.engine.pipeline")

#: What to do when a task's error may come from a dependency the plan misses.
MISSING_DEPENDENCY_HINT = (
    "a dependency missing from the plan can cause this error (a task ran before the task it needs, or after another "
    "changed what it reads); check_dataflow(plan, batches, state=[model, optimizer]) names a missing dependency and "
    "the tuple to add, and SWPipeline(plan, strict=True, state=[model, optimizer]) raises at the first access the "
    "plan does not order")

#: Autograd's errors when a tensor it saved was changed, or its graph used twice: two tasks raced on them.
_AUTOGRAD_RACES = ("modified by an inplace operation", "backward through the graph a second time")


def dependency_hint(cause: Optional[BaseException]) -> Optional[str]:
    """The hint for a task's error that a missing dependency can cause, or ``None``.

    Such errors: autograd's "modified by an inplace operation" and "backward
    through the graph a second time" (a weight updated, or a graph freed, by
    a task the plan did not order), and a context attribute no task had
    written yet.

    Examples
    --------
    >>> from swpipe import IterContext
    >>> try:
    ...     IterContext(batch=None, iter_idx=0).loss
    ... except AttributeError as exc:
    ...     hint = dependency_hint(exc)
    >>> hint.startswith("a dependency missing from the plan"), dependency_hint(ValueError("bad shape"))
    (True, None)
    """
    if isinstance(cause, AttributeError) and isinstance(getattr(cause, "obj", None), IterContext):
        return MISSING_DEPENDENCY_HINT
    if isinstance(cause, RuntimeError) and any(s in str(cause) for s in _AUTOGRAD_RACES):
        return MISSING_DEPENDENCY_HINT
    return None


class PipelineTaskError(RuntimeError):
    """A task failed while the pipeline ran; ``__cause__`` is the original exception.

    Attributes
    ----------
    task : str
    iteration : int
    thread_group : str
    stage : int
    hint : str or None
        For an error a missing dependency can cause (autograd's "modified by
        an inplace operation", a context attribute no task had written): how
        to find it (``check_dataflow``, ``strict=``); ``None`` otherwise.

    Examples
    --------
    >>> from swpipe import PipelineTaskError
    >>> err = PipelineTaskError("Forward", 3, "compute", 1, ValueError("bad shape"))
    >>> print(err)
    task 'Forward' failed on iteration 3 (stage 1, thread group 'compute'): ValueError: bad shape
    >>> type(err.__cause__).__name__, err.task, err.iteration, err.hint
    ('ValueError', 'Forward', 3, None)
    """

    def __init__(self, task: str, iteration: int, thread_group: str, stage: int,
                 cause: Optional[BaseException] = None) -> None:
        self.task = task
        self.iteration = iteration
        self.thread_group = thread_group
        self.stage = stage
        self.hint = dependency_hint(cause)
        msg = f"task {task!r} failed on iteration {iteration} (stage {stage}, thread group {thread_group!r})"
        if cause is not None:
            msg += f": {type(cause).__name__}: {cause}"
        if self.hint is not None:
            msg += f"\nHint: {self.hint}"
        super().__init__(msg)
        if cause is not None:
            self.__cause__ = cause
            self.__suppress_context__ = True

    def __reduce__(self):  # keep the attributes through pickling (multiprocessing)
        return (type(self), (self.task, self.iteration, self.thread_group, self.stage, self.__cause__))


class Cancelled(Exception):
    """A wait was woken because the run was cancelled (internal: never reaches the caller)."""


def task_failed(ti: TaskInfo, iteration: int, cause: BaseException) -> PipelineTaskError:
    """The error of task ``ti`` on ``iteration``, chained to what it raised."""
    return PipelineTaskError(ti.name, iteration, ti.group, ti.stage, cause)


def _nothing() -> None:
    """What a failure wakes or joins before the run has threads and iterations to wake."""


class RunFailure:
    """How one run fails: its first error, its cancel flag, whether the caller saw the error; the run's lock.

    The lock guards the cancel flag together with the tasks' CPU signals
    (:class:`~swpipe_core.engine.tasks.IterState`): a waiter registers under
    it only while the run is not cancelled, so :meth:`cancel` wakes every
    waiter there is. What waking and joining mean is the task runner's
    (:meth:`attach`): this class knows no thread and no iteration.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> from swpipe_core.engine.sequencer import SubmissionSequencer
    >>> from swpipe_core.engine.options import Timeouts
    >>> from swpipe_core.engine.program import compile_plan
    >>> from swpipe_core.engine.streams import StreamPool
    >>> from swpipe_core.engine.device import as_device
    >>> from swpipe_core.engine.dispatch import Dispatch
    >>> pool = StreamPool(as_device("cpu"))
    >>> setup = RunSetup(compile_plan(PipelinePlan({"A": TaskSchedule()}), pool), pool, Dispatch(), Timeouts(),
    ...                  None, SubmissionSequencer(1.0), 1)
    >>> failure = RunFailure(setup)
    >>> failure.cancel(ValueError("first"), "a task failed"); failure.cancel(ValueError("second"), "another")
    >>> failure.cancelled, failure.error
    (True, ValueError('first'))
    >>> for _ in range(2):
    ...     try:
    ...         failure.surface()
    ...     except Exception as exc:
    ...         print(type(exc).__name__, exc)
    ValueError first
    RuntimeError the pipeline failed earlier (first); call drain() or fill_pipeline() to start again
    """

    __slots__ = ("lock", "cancelled", "stop", "error", "reported", "_setup", "_wake", "_join")

    def __init__(self, setup: RunSetup) -> None:
        self.lock = threading.Lock()
        self.cancelled = False
        self.stop = threading.Event()  # set with cancelled: ends device waits at once
        self.error: Optional[BaseException] = None  # the first error
        self.reported = False      # the error reached the caller
        self._setup = setup
        self._wake: Callable[[], None] = _nothing
        self._join: Callable[[], None] = _nothing

    def attach(self, wake: Callable[[], None], join: Callable[[], None]) -> None:
        """What :meth:`cancel` wakes (every waiter of the run's iterations) and what joins the run's threads."""
        self._wake, self._join = wake, join

    def cancel(self, error: Optional[BaseException], reason: str) -> None:
        """Record the first error (if any), stop new task starts, wake every waiter of the run.

        A waiter registered before the flag was set is woken here; one that
        comes later finds the run cancelled under the lock and does not wait.
        """
        with self.lock:
            if self.error is None and error is not None:
                self.error = error
            self.cancelled = True
            self.stop.set()
        self._setup.sequencer.abort(reason)
        self._wake()

    def join_threads(self) -> None:
        """Stop and join the run's workers (``timeouts.join_s`` each) and its watchdog."""
        self._join()

    def surface(self) -> None:
        """Join the threads and raise the run's first error to the caller (once; later calls say it failed).

        Raises
        ------
        PipelineTaskError, RuntimeError
            Always.
        """
        self._join()
        if self.reported:
            why = f"failed earlier ({self.error})" if self.error is not None else "was cancelled (interrupted)"
            raise RuntimeError(f"the pipeline {why}; call drain() or fill_pipeline() to start again")
        self.reported = True
        if self.error is None:
            raise RuntimeError("the pipeline was cancelled; call drain() or fill_pipeline() to start again")
        raise self.error

    def abort(self, reason: str) -> None:
        """Cancel because the caller was interrupted: stop and join the threads; nothing is left to report."""
        self.cancel(None, reason)
        self._join()
        self.reported = True

    def fail_now(self, error: BaseException, reason: str) -> None:
        """Cancel the run with ``error``, join its threads and raise ``error`` (the caller's own wait timed out)."""
        self.cancel(error, reason)
        self._join()
        self.reported = True
        raise error

    def unreported(self) -> Optional[BaseException]:
        """The error the caller has not seen yet, now counted as seen (``drain`` raises it); else ``None``."""
        if self.reported:
            return None
        self.reported = True
        return self.error

    def progress_timed_out(self, iteration: int, done: Sequence[bool]) -> None:
        """``progress`` waited ``timeouts.progress_s`` for ``iteration`` (its tasks' signals ``done``): fail the run
        naming its unfinished tasks.

        Raises
        ------
        RuntimeError
            Always.
        """
        setup = self._setup
        not_done = [ti.name for ti in setup.compiled.tasks if not done[ti.idx]]
        error = RuntimeError(
            f"progress() waited {setup.timeouts.progress_s:g} s for iteration {iteration} to complete; tasks not "
            f"done: {not_done}. A task is blocked or slow (raise Timeouts(progress_s=...) if it is just slow); the "
            "pipeline was cancelled, call drain() or fill_pipeline() to start again"
        )
        self.fail_now(error, f"progress timeout on iteration {iteration}")

    def inline_overran(self, task: str, iteration: int, interrupts: bool) -> None:
        """The watchdog found a caller's-group task running past ``timeouts.signal_s`` (on the watchdog's thread).

        Interrupted, the task's own error reaches the caller at once
        (:meth:`inline_timed_out`); otherwise the run is cancelled now and the
        error raised when the task returns.
        """
        setup = self._setup
        ti = setup.compiled.by_name[task]
        how = ("the watchdog interrupts it" if interrupts else
               "the caller's thread cannot be interrupted from here (not the main thread, or Ctrl-C is handled by "
               "your code): the run is cancelled and this error is raised when the task returns. Run that group on "
               "a worker (caller_group=None) to have such a hang reported at once")
        message = (f"{ti.name} (iteration {iteration}) ran longer than Timeouts.signal_s={setup.timeouts.signal_s:g} "
                   f"s on the caller's thread (caller group {ti.group!r}); {how}. A blocked collective or queue? "
                   "Raise Timeouts(signal_s=...) if it is just slow")
        if not interrupts:  # cancelled before it is told: whoever reads the log may release the task at once
            self.cancel(task_failed(ti, iteration, TimeoutError(message)),
                        f"inline task {ti.name} overran on iteration {iteration}")
            _log.error("%s", message)

    def inline_timed_out(self, ti: TaskInfo, iteration: int, exc: BaseException) -> None:
        """The watchdog interrupted an inline task that overran ``timeouts.signal_s``: its error, the run cancelled."""
        error = TimeoutError(f"{ti.name} (iteration {iteration}) ran longer than Timeouts.signal_s="
                             f"{self._setup.timeouts.signal_s:g} s on the caller's thread; the watchdog interrupted it "
                             "(a blocked collective or queue? raise Timeouts(signal_s=...) if it is just slow)")
        error.__cause__ = exc
        self.cancel(task_failed(ti, iteration, error), f"inline task {ti.name} overran on iteration {iteration}")
