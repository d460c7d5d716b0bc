"""Failures never hang and never get lost: they surface, name the task, and leave no thread behind.

No assertion reads a clock: a hang is caught by the pytest-timeout mark, and a failure that must not
wait for a timeout runs with waits longer than that mark (:data:`NO_TIMEOUTS`), so waiting for one
fails the test.
"""

from __future__ import annotations

import re
import signal
import threading
import time
import traceback

import pytest
import torch

from swpipe import Timeouts
from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.engine.sequencer import SequencerTimeout
from swpipe_core.order import enqueue_order
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.validate import PlanError, validate
import swpipe_core.engine.checks as engine_checks
from conftest import drive, progress_until_end, swpipe_threads

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("ctrl_c")]  # Ctrl-C tests: SIGINT as interactive

# the engine's waits made longer than the test's timeout: an error that reached the caller only when a
# wait timed out would fail the test (pytest-timeout) instead of passing late
NO_TIMEOUTS = dict(timeouts=Timeouts(signal_s=3600, sequencer_s=3600, progress_s=3600))

# name: (stage, stream, thread group, globally ordered)
LAYOUT = {
    "H2D": (0, "memcpy", "io", False),
    "DistStart": (1, "data_dist", "dist", True),
    "DistWait": (1, "data_dist", "dist", False),
    "Fwd": (2, None, "compute", False),
    "Bwd": (2, None, "compute", False),
    "Opt": (2, None, "compute", True),
}
CHAIN = list(LAYOUT)


class Boom(Exception):
    pass


def make_plan(fail_task=None, fail_iter=None, exc=Boom):
    def fn_for(name):
        def fn(ctx):
            if name == fail_task and ctx.iter_idx == fail_iter:
                raise exc(f"injected in {name} at iteration {ctx.iter_idx}")
        return fn

    sched = {PipelineTask(n, fn_for(n)): TaskSchedule(s, st, g, o) for n, (s, st, g, o) in LAYOUT.items()}
    deps = [(CHAIN[k], CHAIN[k - 1]) for k in range(1, len(CHAIN))]
    return PipelinePlan(sched, intra_iter_deps=deps, inter_iter_deps=[("Fwd", "Opt", 1)])


def assert_usable(pipe, clean):
    """After drain(), the same pipeline runs the ``clean`` batches before the injected fault to completion."""
    pipe.drain()
    assert swpipe_threads() == []
    assert drive(pipe, range(clean)) == list(range(clean))
    assert swpipe_threads() == []


CASES = [
    # first / middle / last task in the chain, each thread group and each stage
    ("H2D", 0), ("H2D", 7), ("DistStart", 3), ("DistWait", 5), ("Fwd", 0), ("Bwd", 4), ("Opt", 9), ("Opt", 0),
]


@pytest.mark.parametrize("task,iteration", CASES)
def test_exception_surfaces_without_a_timeout_with_task_and_iteration(task, iteration):
    pipe = SWPipeline(make_plan(task, iteration), device="cpu", **NO_TIMEOUTS)
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(range(12))
    err = info.value
    stage, _, group, _ = LAYOUT[task]
    assert (err.task, err.iteration, err.thread_group, err.stage) == (task, iteration, group, stage)
    assert isinstance(err.__cause__, Boom) and f"iteration {iteration}" in str(err.__cause__)
    # the original traceback is kept: it ends in the task function
    frames = traceback.extract_tb(err.__cause__.__traceback__)
    assert frames[-1].name == "fn"
    assert swpipe_threads() == []
    assert_usable(pipe, iteration)


@pytest.mark.parametrize("task,iteration", [("H2D", 2), ("DistWait", 1), ("Opt", 3)])
def test_exception_surfaces_through_progress_and_pipeline_refills(task, iteration):
    pipe = SWPipeline(make_plan(task, iteration), device="cpu")
    it = pipe.fill_pipeline(range(50))
    retired = []
    with pytest.raises(PipelineTaskError) as info:
        while True:
            retired.append(pipe.progress(it))
    assert info.value.task == task and info.value.iteration == iteration
    assert all(i < iteration for i in retired)
    assert swpipe_threads() == []
    # the failure is reported once; later calls say what to do
    with pytest.raises(RuntimeError, match="drain"):
        pipe.progress(it)
    # a new fill_pipeline without drain also works (fresh batches never hit the injected iteration)
    pipe.fill_pipeline(range(iteration))
    assert progress_until_end(pipe) == list(range(iteration))


def test_unreported_failure_is_raised_by_drain():
    done = threading.Event()

    def boom(ctx):
        try:
            raise Boom("late")
        finally:
            done.set()

    plan = PipelinePlan({PipelineTask("A", boom): TaskSchedule(0, thread_group="w")})
    pipe = SWPipeline(plan, device="cpu")
    pipe.fill_pipeline(range(3))
    assert done.wait(5)
    with pytest.raises(PipelineTaskError) as info:
        pipe.drain()
    assert info.value.task == "A" and isinstance(info.value.__cause__, Boom)
    assert swpipe_threads() == []
    pipe.drain()  # now clean: nothing raised again
    assert pipe.in_flight == 0


def test_failure_during_fill_pipeline_leaves_no_thread():
    pipe = SWPipeline(make_plan("H2D", 0), device="cpu")
    with pytest.raises(PipelineTaskError):
        it = pipe.fill_pipeline(range(10))
        pipe.progress(it)
    assert swpipe_threads() == []
    assert_usable(pipe, 0)


def test_data_iterator_exception_propagates_as_itself_and_pipeline_stays_usable():
    def data():
        yield from range(4)
        raise KeyError("batch-4")

    log = []
    plan = make_plan().bind({"Opt": lambda ctx: log.append(ctx.iter_idx)})
    pipe = SWPipeline(plan, device="cpu")
    it = pipe.fill_pipeline(data())
    retired = []
    with pytest.raises(KeyError, match="batch-4"):
        while True:
            retired.append(pipe.progress(it))
    assert retired == [0]  # fill took batches 0-2; progress took 3, then next() raised
    pipe.drain()  # completes what is in flight
    assert sorted(log) == [0, 1, 2, 3]
    assert swpipe_threads() == []


def test_data_iterator_exception_in_fill_propagates_and_leaves_no_thread():
    def data():
        yield 0
        raise ValueError("loader-broke")

    pipe = SWPipeline(make_plan(), device="cpu")
    with pytest.raises(ValueError, match="loader-broke"):
        pipe.fill_pipeline(data())
    assert swpipe_threads() == []
    assert drive(pipe, range(3)) == [0, 1, 2]


def test_data_iterator_exception_in_run_propagates_and_leaves_no_thread():
    def data():
        yield from range(6)
        raise ValueError("loader broke at 6")

    pipe = SWPipeline(make_plan(), device="cpu")
    with pytest.raises(ValueError, match="at 6"):
        pipe.run(data())
    assert swpipe_threads() == []
    assert drive(pipe, range(3)) == [0, 1, 2]


def test_blocked_dependency_times_out_naming_waiter_dependency_and_iteration():
    release = threading.Event()

    def stuck(ctx):
        if ctx.iter_idx == 2:
            release.wait(1.5)  # a workload that outlives the waiter's patience

    plan = make_plan().bind({"DistWait": stuck})
    pipe = SWPipeline(plan, device="cpu", timeouts=Timeouts(signal_s=0.3))
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(range(10))
    cause = str(info.value.__cause__)
    assert info.value.task == "Fwd" and info.value.iteration == 2
    assert re.search(r"'DistWait'\D+2\b.*Timeouts\(signal_s=", cause)  # the task waited for, its iteration, the timeout
    assert swpipe_threads() == []
    assert_usable(pipe, 2)


@pytest.fixture
def cancelled(monkeypatch):
    """Set when the engine cancels a run (``failure.cancel`` aborts the run's sequencer): a task that waits for it
    outlasts a timeout whatever the machine's load, and returns as soon as the run gave up on it."""
    from swpipe_core.engine.sequencer import SubmissionSequencer

    event, abort = threading.Event(), SubmissionSequencer.abort

    def aborted(self, *args, **kwargs):
        abort(self, *args, **kwargs)
        event.set()
    monkeypatch.setattr(SubmissionSequencer, "abort", aborted)
    return event


def test_progress_timeout_names_iteration_and_unfinished_tasks(cancelled):
    def slow(ctx):
        if ctx.iter_idx == 0:
            assert cancelled.wait(20.0)  # runs until the progress timeout cancelled the run

    plan = make_plan().bind({"Bwd": slow})
    pipe = SWPipeline(plan, device="cpu", timeouts=Timeouts(progress_s=0.2))
    it = pipe.fill_pipeline(range(10))
    with pytest.raises(RuntimeError, match=r"\b0\b.*\[.*'Bwd'.*'Opt'") as info:  # the iteration, its tasks not done
        pipe.progress(it)
    assert not isinstance(info.value, PipelineTaskError)
    assert swpipe_threads() == []
    assert_usable(pipe, 0)


def test_sequencer_timeout_surfaces_as_task_error(cancelled):
    """A globally ordered task whose turn never comes fails with the sequencer's message."""
    a = PipelineTask("A", lambda ctx: cancelled.wait(20.0))  # runs until B's timeout cancelled the run
    plan = PipelinePlan({a: TaskSchedule(0, thread_group="g1", globally_ordered=True),
                         PipelineTask("B", lambda ctx: None): TaskSchedule(0, thread_group="g2", globally_ordered=True)})
    pipe = SWPipeline(plan, device="cpu", timeouts=Timeouts(sequencer_s=0.1))
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(range(3))
    assert info.value.task == "B"
    cause = info.value.__cause__
    assert isinstance(cause, SequencerTimeout) and (cause.task, cause.waiting_for) == ("B (iteration 0)", "A (iteration 0)")
    assert swpipe_threads() == []


def test_keyboard_interrupt_in_caller_stops_workers(monkeypatch):
    main = threading.main_thread().ident
    landed, held = threading.Event(), []

    def ctrl_c(signum, frame):  # Python's handler, and the moment the caller took the signal
        landed.set()
        raise KeyboardInterrupt

    # Python's own Ctrl-C, seen landing: the engine's inline watchdog takes it for Python's and passes a real
    # Ctrl-C on to it (the ctrl_c fixture puts back the handler from before the test)
    monkeypatch.setattr(signal, "default_int_handler", ctrl_c)
    signal.signal(signal.SIGINT, ctrl_c)

    def interrupt(ctx):
        if ctx.iter_idx == 3:
            signal.pthread_kill(main, signal.SIGINT)
            # keep the caller waiting on this task until the signal landed (bounded: the run's outcome is asserted,
            # not when the interpreter ran the handler)
            held.append(landed.wait(20.0))

    plan = make_plan().bind({"Opt": interrupt})
    pipe = SWPipeline(plan, device="cpu")
    with pytest.raises(KeyboardInterrupt):
        pipe.run(range(1000))
    assert len(held) == 1 and landed.is_set() and swpipe_threads() == []  # Python's handler ran: a real Ctrl-C
    assert_usable(pipe, 3)


def test_keyboard_interrupt_from_data_iterator_stops_workers():
    def data():
        yield from range(5)
        raise KeyboardInterrupt

    pipe = SWPipeline(make_plan(), device="cpu")
    it = pipe.fill_pipeline(data())
    with pytest.raises(KeyboardInterrupt):
        while True:
            pipe.progress(it)
    assert swpipe_threads() == []
    with pytest.raises(RuntimeError, match="interrupted"):
        pipe.progress(it)
    assert_usable(pipe, 5)


def test_failure_while_draining_is_raised_and_pipeline_reset():
    pipe = SWPipeline(make_plan("Opt", 3), device="cpu")
    it = pipe.fill_pipeline(range(10))
    assert pipe.progress(it) == 0
    with pytest.raises(PipelineTaskError) as info:
        pipe.drain()
    assert info.value.task == "Opt" and info.value.iteration == 3
    assert swpipe_threads() == [] and pipe.in_flight == 0
    assert_usable(pipe, 3)


def test_serial_failure_is_a_task_error_too():
    pipe = SWPipeline(make_plan("Bwd", 1), device="cpu")
    with pytest.raises(PipelineTaskError) as info:
        pipe.run_serial(range(3))
    assert (info.value.task, info.value.iteration, info.value.thread_group) == ("Bwd", 1, "compute")
    with pytest.raises(PipelineTaskError):
        pipe.run_one_serial_iter(None, iter_idx=1)
    pipe.run_one_serial_iter(None, iter_idx=2)


def test_base_exception_in_task_is_caught_and_reported():
    pipe = SWPipeline(make_plan("Fwd", 2, exc=SystemExit), device="cpu")
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(range(6))
    assert isinstance(info.value.__cause__, SystemExit)
    assert swpipe_threads() == []


# ---- the classic enqueue-order deadlock scenarios and the head-of-line deadlock ready-first avoids ----

def scenario_1(**kw):
    """A(s=0, T1), B(s=1, T1), A waits B of the previous iteration (k=1): same period."""
    return PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule(0, thread_group="T1"),
                         PipelineTask("B", lambda ctx: None): TaskSchedule(1, thread_group="T1")},
                        inter_iter_deps=[("A", "B")], **kw)


def scenario_2(**kw):
    """T1: A(s=0), D(s=1); T2: C(s=0), B(s=1); A waits B(i-1), C waits D(i-1)."""
    return PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule(0, thread_group="T1"),
                         PipelineTask("D", lambda ctx: None): TaskSchedule(1, thread_group="T1"),
                         PipelineTask("C", lambda ctx: None): TaskSchedule(0, thread_group="T2"),
                         PipelineTask("B", lambda ctx: None): TaskSchedule(1, thread_group="T2")},
                        inter_iter_deps=[("A", "B"), ("C", "D")], **kw)


@pytest.mark.parametrize("scenario", [scenario_1, scenario_2])
@pytest.mark.parametrize("policy", ["ready_first", "stage_descending"])
def test_deadlock_scenarios_complete_under_both_policies(scenario, policy):
    pipe = SWPipeline(scenario(enqueue_policy=policy), device="cpu", record_timeline=True)
    pipe.run(range(25))
    ev = {(e.task, e.iteration): e for e in pipe.timeline}
    assert len(ev) == 25 * len(pipe.plan.task_names)
    for waiter, dep, _ in pipe.plan.inter_edges():
        for i in range(1, 25):
            assert ev[(waiter, i)].start >= ev[(dep, i - 1)].end


@pytest.mark.parametrize("scenario,ascending", [(scenario_1, ["A", "B"]), (scenario_2, ["A", "C", "D", "B"])])
def test_ascending_order_deadlocks_and_validate_rejects_it(scenario, ascending, monkeypatch):
    """Stage-ascending orders (consumer before its same-period supplier) deadlock; validation refuses them, and forced past validation the block
    surfaces as an error (short Timeouts.signal_s) rather than a hang."""
    with pytest.raises(PlanError, match="enqueue-order"):
        validate(scenario(enqueue_order=ascending))
    assert enqueue_order(scenario()) != ascending
    # the engine validates every plan it takes; this test must run one that breaks the rule, so it bypasses the
    # engine's (module-level) reference to validate
    monkeypatch.setattr(engine_checks, "validate", lambda plan: None)
    pipe = SWPipeline(scenario(enqueue_order=ascending), device="cpu", timeouts=Timeouts(signal_s=0.3))
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(range(10))
    assert info.value.iteration == 1 and "waited 0.3 s" in str(info.value.__cause__)
    assert swpipe_threads() == []


def test_ready_first_avoids_head_of_line_deadlock(monkeypatch):
    """X waits Y in the same period on the same thread. Ready-first enqueues Y first and runs; the
    non-topological queue [X, Y] would leave X blocking the head of the queue, with Y stuck behind it."""
    ran = []
    plan = PipelinePlan({PipelineTask("X", lambda ctx: ran.append("X")): TaskSchedule(0, thread_group="T"),
                         PipelineTask("Y", lambda ctx: ran.append("Y")): TaskSchedule(0, thread_group="T")},
                        intra_iter_deps=[("X", "Y")])
    assert enqueue_order(plan) == ["Y", "X"]
    SWPipeline(plan, device="cpu").run(range(20))
    assert ran == ["Y", "X"] * 20
    with pytest.raises(PlanError) as refused:
        validate(plan.replace(enqueue_order=["X", "Y"]))
    assert (refused.value.rule, refused.value.tasks) == ("enqueue-order", ["X", "Y"])
    monkeypatch.setattr(engine_checks, "validate", lambda plan: None)  # as above: run a plan validation refuses
    blocked = SWPipeline(plan.replace(enqueue_order=["X", "Y"]), device="cpu", timeouts=Timeouts(signal_s=0.3))
    with pytest.raises(PipelineTaskError) as info:
        blocked.run(range(3))
    assert info.value.task == "X" and re.search(r"'Y'\D+0\b", str(info.value.__cause__))  # waited for Y of iteration 0
    assert swpipe_threads() == []


def _step_before_backward_plan():
    """Forward saves the weight for backward; Step updates it in place before Backward: the plan misses
    ("Step", "Backward"), so Backward fails in autograd every time (one thread, a fixed order)."""
    w = torch.ones(3, requires_grad=True)

    def forward(ctx):
        ctx.loss = (w * w).sum()  # saves w for the backward pass

    def step(ctx):
        with torch.no_grad():
            w.add_(1.0)  # in place: the version autograd saved is gone

    def backward(ctx):
        ctx.loss.backward()

    tasks = [PipelineTask("Forward", forward), PipelineTask("Step", step), PipelineTask("Backward", backward)]
    return PipelinePlan({t: TaskSchedule(0) for t in tasks}, enqueue_order=["Forward", "Step", "Backward"],
                        intra_iter_deps=[("Step", "Forward"), ("Backward", "Forward")])


@pytest.mark.parametrize("mode", ["run", "run_serial"])
def test_an_error_a_missing_dependency_can_cause_says_how_to_find_it(mode):
    pipe = SWPipeline(_step_before_backward_plan(), device="cpu")
    with pytest.raises(PipelineTaskError) as info:
        getattr(pipe, mode)(range(2))
    err = info.value
    assert (err.task, err.iteration) == ("Backward", 0) and isinstance(err.__cause__, RuntimeError)
    assert err.hint is not None and "check_dataflow(plan, batches, state=" in err.hint and "strict=True" in err.hint


def test_a_context_attribute_no_task_wrote_gets_the_hint_and_other_errors_do_not():
    def read(ctx):
        return ctx.loss  # no task sets it

    plan = PipelinePlan({PipelineTask("Read", read): TaskSchedule(0)})
    with pytest.raises(PipelineTaskError) as info:
        SWPipeline(plan, device="cpu").run(range(2))
    assert info.value.task == "Read" and isinstance(info.value.__cause__, AttributeError)
    assert info.value.hint is not None
    with pytest.raises(PipelineTaskError) as info:
        SWPipeline(make_plan("Fwd", 1), device="cpu", **NO_TIMEOUTS).run(range(3))
    assert info.value.task == "Fwd" and info.value.hint is None  # a task's own error: no hint


class _SlowToFormat(RuntimeError):
    """A task's error whose message takes a while to build (a long repr, a traceback walk): when it is first built
    after the sequencer was aborted (``sequencer``), not before the next turn's waiter was woken (``woken``), so
    that the woken thread reports first if anything lets it."""

    sequencer = None
    woken = threading.Event()
    formatted = False

    def __str__(self) -> str:
        first, self.formatted = not self.formatted, True
        if first and self.sequencer is not None and self.sequencer.aborted is not None:
            self.woken.wait(20.0)
        return "collective timed out"


def test_failure_of_an_ordered_task_is_reported_not_the_next_turns_wake_up(monkeypatch):
    """Two globally ordered tasks on two workers: A holds the turn and fails while B waits for the next one.
    The run's error is A's, whatever the threads' timing (B, woken by the sequencer, used to report itself)."""
    from swpipe_core.engine.sequencer import SequencerAborted, SubmissionSequencer

    execute_ordered, woken = SubmissionSequencer.execute_ordered, threading.Event()

    def wake(self, *args, **kwargs):
        _SlowToFormat.sequencer = self  # the run's (monkeypatch puts the class's None back)
        try:
            return execute_ordered(self, *args, **kwargs)
        except SequencerAborted:
            woken.set()  # B's wait for its turn ended by A's failure
            raise
    monkeypatch.setattr(SubmissionSequencer, "execute_ordered", wake)
    monkeypatch.setattr(_SlowToFormat, "woken", woken)
    monkeypatch.setattr(_SlowToFormat, "sequencer", None)

    def a(ctx):
        if ctx.iter_idx == 3:
            raise _SlowToFormat()

    plan = PipelinePlan({PipelineTask("A", a): TaskSchedule(0, "s_a", "ga", globally_ordered=True),
                         PipelineTask("B", lambda ctx: None): TaskSchedule(0, "s_b", "gb", globally_ordered=True)},
                        enqueue_order=["A", "B"], caller_group=None)
    with pytest.raises(PipelineTaskError) as info:
        drive(SWPipeline(plan, device="cpu"), range(8))
    assert (info.value.task, info.value.iteration, type(info.value.__cause__)) == ("A", 3, _SlowToFormat)
    assert swpipe_threads() == []
