"""How a pipelined run fails: the first error is kept, every waiter woken, the workers joined, the error raised once.

No thread is ever left hanging: :func:`cancel` records the run's first error,
sets its cancel flag, aborts the sequencer and wakes every CPU-signal and
completion waiter, so workers skip what is left; the caller then joins the
workers and raises that error (:func:`surface_failure`), once. The timeouts
of the caller's waits (:func:`progress_timed_out`) and of a caller's-group
task the watchdog finds overrunning (:func:`inline_overran`) fail the run
the same way, with an error naming what was waited for.
"""

from __future__ import annotations

import logging
from typing import List, Optional, Sequence

from swpipe_core.engine.state import PipelineTaskError, _IterState, _Run, _TaskInfo

__all__: List[str] = []

_log = logging.getLogger("swpipe_core.engine.pipeline")


def cancel(run: _Run, error: Optional[BaseException], reason: str) -> None:
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


def stop_workers(run: _Run, join_timeout: float) -> None:
    """Stop and join the run's workers (``join_timeout`` s each) and its watchdog."""
    if run.workers is not None:
        run.workers.stop(join_timeout)
    if run.watchdog is not None:
        run.watchdog.stop()


def surface_failure(run: _Run, join_timeout: float) -> None:
    """Join the workers and raise the run's first error to the caller (once; later calls say it failed).

    Raises
    ------
    PipelineTaskError, RuntimeError
        Always.
    """
    stop_workers(run, join_timeout)
    if run.reported:
        why = f"failed earlier ({run.error})" if run.error is not None else "was cancelled (interrupted)"
        raise RuntimeError(f"the pipeline {why}; call drain() or fill_pipeline() to start again")
    run.reported = True
    if run.error is None:
        raise RuntimeError("the pipeline was cancelled; call drain() or fill_pipeline() to start again")
    raise run.error


def abort(run: _Run, reason: str, join_timeout: float) -> None:
    """Cancel because the caller was interrupted: stop and join the workers; nothing is left to report."""
    cancel(run, None, reason)
    stop_workers(run, join_timeout)
    run.reported = True


def fail_now(run: _Run, error: BaseException, reason: str, join_timeout: float) -> None:
    """Cancel the run with ``error``, join its workers and raise ``error`` (the caller's own wait timed out)."""
    cancel(run, error, reason)
    stop_workers(run, join_timeout)
    run.reported = True
    raise error


def progress_timed_out(run: _Run, st: _IterState, infos: Sequence[_TaskInfo], timeout: float,
                       join_timeout: float) -> None:
    """``progress`` waited ``timeout`` s for iteration ``st``: fail the run naming its unfinished tasks.

    Raises
    ------
    RuntimeError
        Always.
    """
    not_done = [ti.name for ti in infos if not st.done[ti.idx]]
    error = RuntimeError(
        f"progress() waited {timeout:g} s for iteration {st.idx} to complete; tasks not done: "
        f"{not_done}. A task is blocked or slow (raise progress_timeout if it is just slow); the pipeline "
        "was cancelled, call drain() or fill_pipeline() to start again"
    )
    fail_now(run, error, f"progress timeout on iteration {st.idx}", join_timeout)


def inline_overran(run: _Run, ti: _TaskInfo, iteration: int, interrupts: bool, signal_timeout: float) -> None:
    """The watchdog found a caller's-group task running past ``signal_timeout`` (on the watchdog's thread).

    Interrupted, the task's own error reaches the caller at once; otherwise
    the run is cancelled now and the error raised when the task returns.
    """
    how = ("the watchdog interrupts it" if interrupts else
           "the caller's thread cannot be interrupted from here (not the main thread, or Ctrl-C is handled by "
           "your code): the run is cancelled and this error is raised when the task returns. Run that group on "
           "a worker (caller_group=None) to have such a hang reported at once")
    message = (f"{ti.name} (iteration {iteration}) ran longer than signal_timeout={signal_timeout:g} s on the "
               f"caller's thread (caller group {ti.group!r}); {how}. A blocked collective or queue? Raise "
               "signal_timeout if it is just slow")
    if not interrupts:  # cancelled before it is told: whoever reads the log may release the task at once
        cancel(run, PipelineTaskError(ti.name, iteration, ti.group, ti.stage, TimeoutError(message)),
               f"inline task {ti.name} overran on iteration {iteration}")
        _log.error("%s", message)
