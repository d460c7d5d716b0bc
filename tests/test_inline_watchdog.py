"""A task of the caller's group that blocks: reported as its own error within Timeouts.signal_s, never a hang."""

from __future__ import annotations

import logging
import signal
import threading

import pytest
from conftest import swpipe_threads

from swpipe import Timeouts
from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("ctrl_c")]  # Ctrl-C tests: SIGINT as interactive


def _plan(step) -> PipelinePlan:
    """Load on a worker, Step on the caller's thread one stage later."""
    return PipelinePlan({PipelineTask("Load", lambda ctx: None): TaskSchedule(0, thread_group="io"),
                         PipelineTask("Step", step): TaskSchedule(1)}, intra_iter_deps=[("Step", "Load")])


def _blocks_at(iteration: int, release: threading.Event, swallow: bool = False):
    def step(ctx):
        if ctx.iter_idx == iteration:
            try:
                release.wait()  # a stuck collective or queue
            except Exception:  # a task's own broad handler must not swallow the watchdog's interrupt
                if not swallow:
                    raise
    return step


@pytest.mark.parametrize("swallow", [False, True])
def test_a_hang_on_the_callers_thread_is_the_tasks_error_and_the_pipeline_runs_again(swallow):
    assert threading.current_thread() is threading.main_thread()
    pipe = SWPipeline(_plan(_blocks_at(3, threading.Event(), swallow)), device="cpu", timeouts=Timeouts(signal_s=1.0))
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(range(10))
    err = info.value
    assert (err.task, err.iteration, err.thread_group) == ("Step", 3, "default")
    assert isinstance(err.__cause__, TimeoutError) and "Timeouts.signal_s=1 s" in str(err.__cause__)
    assert swpipe_threads() == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C given back
    pipe.run(range(3))  # usable again (iteration 3 never comes)


def test_ctrl_c_is_still_the_callers_keyboard_interrupt():
    def step(ctx):
        if ctx.iter_idx == 2:
            signal.raise_signal(signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        SWPipeline(_plan(step), device="cpu", timeouts=Timeouts(signal_s=5.0)).run(range(6))
    assert swpipe_threads() == [] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_caller_that_is_not_the_main_thread_is_told_at_once_and_gets_the_error_when_the_task_returns(caplog):
    release, reported, outcome = threading.Event(), threading.Event(), {}

    class Told(logging.Handler):
        def emit(self, record):
            if "ran longer than Timeouts.signal_s" in record.getMessage():
                reported.set()

    told = Told(level=logging.ERROR)
    logging.getLogger("swpipe_core.engine.pipeline").addHandler(told)

    def caller():
        try:
            SWPipeline(_plan(_blocks_at(2, release)), device="cpu", timeouts=Timeouts(signal_s=0.5)).run(range(6))
        except PipelineTaskError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=caller, name="user-loop")
    try:
        thread.start()
        assert reported.wait(30), "the watchdog never reported the blocked task"
        assert thread.is_alive()  # the caller's own thread is still inside the task: it cannot be interrupted
        release.set()
        thread.join(30)
    finally:
        release.set()
        logging.getLogger("swpipe_core.engine.pipeline").removeHandler(told)
    err = outcome["error"]
    assert (err.task, err.iteration) == ("Step", 2) and isinstance(err.__cause__, TimeoutError)
    assert "interrupted" in str(err.__cause__) and swpipe_threads() == []  # says it could not interrupt the task
