"""How a run fails: the error it raises, the first error kept, every waiter woken, the workers joined, one raise.

No thread is ever left hanging: :func:`cancel` records the run's first error,
sets its cancel flag, aborts the sequencer and wakes every CPU-signal and
completion waiter, so workers skip what is left; the caller then joins the
workers and raises that error (:func:`surface_failure`), once. The timeouts
of the caller's waits (:func:`progress_timed_out`) and of a caller's-group
task the watchdog finds overrunning (:func:`inline_overran`,
:func:`inline_timed_out`) fail the run the same way, with an error naming
what was waited for. A task's error is a :class:`PipelineTaskError`; when
the task's own error is one a missing dependency can cause, it says so and
how to find the dependency (:func:`dependency_hint`).
"""

from __future__ import annotations

import logging
from typing import Optional

from swpipe_core.engine.program import TaskInfo
from swpipe_core.engine.run import IterState, Run
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


def cancel(run: Run, error: Optional[BaseException], reason: str) -> None:
    """Record the first error (if any), stop new task starts, wake every waiter of ``run``."""
    with run.lock:
        if run.error is None and error is not None:
            run.error = error
        run.cancelled = True
        run.stop.set()
        states = list(run.iters.values())
        waiters = [ev for st in states for ev in list(st.waiters.values())]
    run.sequencer.abort(reason)
    for ev in waiters:
        ev.set()
    for st in states:
        if st.complete is not None:  # made under the lock, so any made later sees cancelled
            st.complete.set()


def stop_workers(run: Run) -> None:
    """Stop and join the run's workers (``timeouts.join_s`` each) and its watchdog."""
    if run.workers is not None:
        run.workers.stop(run.timeouts.join_s)
    if run.watchdog is not None:
        run.watchdog.stop()


def surface_failure(run: Run) -> None:
    """Join the workers and raise the run's first error to the caller (once; later calls say it failed).

    Raises
    ------
    PipelineTaskError, RuntimeError
        Always.
    """
    stop_workers(run)
    if run.reported:
        why = f"failed earlier ({run.error})" if run.error is not None else "was cancelled (interrupted)"
        raise RuntimeError(f"the pipeline {why}; call drain() or fill_pipeline() to start again")
    run.reported = True
    if run.error is None:
        raise RuntimeError("the pipeline was cancelled; call drain() or fill_pipeline() to start again")
    raise run.error


def abort(run: Run, reason: str) -> None:
    """Cancel because the caller was interrupted: stop and join the workers; nothing is left to report."""
    cancel(run, None, reason)
    stop_workers(run)
    run.reported = True


def fail_now(run: Run, error: BaseException, reason: str) -> None:
    """Cancel the run with ``error``, join its workers and raise ``error`` (the caller's own wait timed out)."""
    cancel(run, error, reason)
    stop_workers(run)
    run.reported = True
    raise error


def progress_timed_out(run: Run, st: IterState) -> None:
    """``progress`` waited ``timeouts.progress_s`` for iteration ``st``: fail the run naming its unfinished tasks.

    Raises
    ------
    RuntimeError
        Always.
    """
    not_done = [ti.name for ti in run.compiled.tasks if not st.done[ti.idx]]
    error = RuntimeError(
        f"progress() waited {run.timeouts.progress_s:g} s for iteration {st.idx} to complete; tasks not done: "
        f"{not_done}. A task is blocked or slow (raise Timeouts(progress_s=...) if it is just slow); the pipeline "
        "was cancelled, call drain() or fill_pipeline() to start again"
    )
    fail_now(run, error, f"progress timeout on iteration {st.idx}")


def inline_overran(run: Run, task: str, iteration: int, interrupts: bool) -> None:
    """The watchdog found a caller's-group task running past ``timeouts.signal_s`` (on the watchdog's thread).

    Interrupted, the task's own error reaches the caller at once
    (:func:`inline_timed_out`); otherwise the run is cancelled now and the
    error raised when the task returns.
    """
    ti = run.compiled.by_name[task]
    how = ("the watchdog interrupts it" if interrupts else
           "the caller's thread cannot be interrupted from here (not the main thread, or Ctrl-C is handled by "
           "your code): the run is cancelled and this error is raised when the task returns. Run that group on "
           "a worker (caller_group=None) to have such a hang reported at once")
    message = (f"{ti.name} (iteration {iteration}) ran longer than Timeouts.signal_s={run.timeouts.signal_s:g} s on "
               f"the caller's thread (caller group {ti.group!r}); {how}. A blocked collective or queue? Raise "
               "Timeouts(signal_s=...) if it is just slow")
    if not interrupts:  # cancelled before it is told: whoever reads the log may release the task at once
        cancel(run, task_failed(ti, iteration, TimeoutError(message)),
               f"inline task {ti.name} overran on iteration {iteration}")
        _log.error("%s", message)


def inline_timed_out(run: Run, st: IterState, ti: TaskInfo, exc: BaseException) -> None:
    """The watchdog interrupted an inline task that overran ``timeouts.signal_s``: its error, the run cancelled."""
    error = TimeoutError(f"{ti.name} (iteration {st.idx}) ran longer than Timeouts.signal_s={run.timeouts.signal_s:g} "
                         "s on the caller's thread; the watchdog interrupted it (a blocked collective or queue? "
                         "raise Timeouts(signal_s=...) if it is just slow)")
    error.__cause__ = exc
    cancel(run, task_failed(ti, st.idx, error), f"inline task {ti.name} overran on iteration {st.idx}")
