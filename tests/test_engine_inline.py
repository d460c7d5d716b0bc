"""The caller's thread group runs inline (PipelinePlan.caller_group): no thread, no hand-off,
same results, failures, timeouts and Ctrl-C handled as for worker tasks."""

from __future__ import annotations

import re
import threading

import pytest
from conftest import drive, enqueue_sequence, swpipe_threads

from swpipe import Timeouts
from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.order import enqueue_order
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.measure.profiler import TaskProfiler

pytestmark = pytest.mark.timeout(60)

MAIN = threading.current_thread().name


def _chain(record, groups=("default", "default", "default"), caller_group="default", fail=None):
    """Load (stage 0) -> Fwd (stage 1) -> Bwd (stage 1); records (task, iteration, thread)."""
    def make(name):
        def fn(ctx):
            record.append((name, ctx.iter_idx, threading.current_thread().name, list(swpipe_threads())))
            if fail is not None and fail[0] == name and fail[1] == ctx.iter_idx:
                raise fail[2]
        return fn

    return PipelinePlan({PipelineTask("Load", make("Load")): TaskSchedule(0, "memcpy", groups[0]),
                         PipelineTask("Fwd", make("Fwd")): TaskSchedule(1, None, groups[1]),
                         PipelineTask("Bwd", make("Bwd")): TaskSchedule(1, None, groups[2])},
                        intra_iter_deps=[("Fwd", "Load"), ("Bwd", "Fwd")], inter_iter_deps=[("Fwd", "Bwd", 1)],
                        caller_group=caller_group)


def test_single_group_plan_starts_no_worker_thread():
    record = []
    plan = _chain(record)
    pipe = SWPipeline(plan, device="cpu")
    assert drive(pipe, range(6)) == list(range(6))
    assert {thread for _, _, thread, _ in record} == {MAIN}
    # no worker existed while any task ran: only the watchdog that watches the caller's tasks
    assert all(alive == ["swpipe-watchdog"] for *_, alive in record)
    assert pipe.worker_threads == [] and swpipe_threads() == []
    assert [(n, i) for n, i, *_ in record] == enqueue_sequence(plan, 6)  # enqueue order, period by period


def test_caller_group_none_runs_every_group_on_a_worker():
    record = []
    SWPipeline(_chain(record, caller_group=None), device="cpu").run(range(3))
    assert {thread for _, _, thread, _ in record} == {"swpipe-default"}


def test_two_group_plan_has_one_worker_for_the_other_group():
    record = []
    pipe = SWPipeline(_chain(record, groups=("io", "default", "default")), device="cpu")
    pipe.run(range(5))
    threads = {name: {t for n, _, t, _ in record if n == name} for name in ("Load", "Fwd", "Bwd")}
    assert threads == {"Load": {"swpipe-io"}, "Fwd": {MAIN}, "Bwd": {MAIN}}
    assert {frozenset(alive) for *_, alive in record} == {frozenset({"swpipe-io", "swpipe-watchdog"})}
    assert swpipe_threads() == []


@pytest.mark.parametrize("groups", [("default",) * 3, ("io", "default", "default")])
def test_inline_task_exception_surfaces_with_task_and_iteration(groups):
    record = []
    boom = ValueError("bad-shape")
    pipe = SWPipeline(_chain(record, groups=groups, fail=("Fwd", 3, boom)), device="cpu")
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(range(8))
    err = info.value
    assert (err.task, err.iteration, err.thread_group, err.stage) == ("Fwd", 3, "default", 1)
    assert err.__cause__ is boom and "bad-shape" in str(err)  # the original error, and in the message
    assert swpipe_threads() == []
    record.clear()
    pipe2 = SWPipeline(_chain(record, groups=groups), device="cpu")
    assert drive(pipe2, range(4)) == [0, 1, 2, 3]


def test_inline_wait_timeout_names_what_it_waited_for():
    gate = threading.Event()

    def load(ctx):
        if ctx.iter_idx == 1:
            gate.wait(30)  # blocked until the test releases it

    plan = PipelinePlan({PipelineTask("Load", load): TaskSchedule(0, None, "io"),
                         PipelineTask("Step", lambda ctx: None): TaskSchedule(0, None, "default")},
                        intra_iter_deps=[("Step", "Load")])
    # the blocked worker cannot be interrupted: do not wait long for it to stop
    pipe = SWPipeline(plan, device="cpu", timeouts=Timeouts(signal_s=0.3, join_s=0.2))
    try:
        with pytest.raises(PipelineTaskError) as info:
            pipe.run(range(4))
    finally:
        gate.set()
    for t in threading.enumerate():
        if t.name == "swpipe-io":
            t.join(10)
    err = info.value
    assert (err.task, err.iteration) == ("Step", 1)
    assert re.search(r"'Load'\D+1\b.*'io'", str(err.__cause__))  # the task waited for, its iteration, its thread
    assert swpipe_threads() == []


@pytest.mark.parametrize("groups", [("default",) * 3, ("io", "default", "default")])
def test_ctrl_c_in_an_inline_task_leaves_no_thread_and_a_usable_pipeline(groups):
    record, armed = [], [True]

    def fwd(ctx):
        record.append(ctx.iter_idx)
        if ctx.iter_idx == 2 and armed:
            armed.clear()
            raise KeyboardInterrupt

    plan = PipelinePlan({PipelineTask("Load", lambda ctx: None): TaskSchedule(0, None, groups[0]),
                         PipelineTask("Fwd", fwd): TaskSchedule(1, None, groups[1])}, [("Fwd", "Load")])
    pipe = SWPipeline(plan, device="cpu")
    with pytest.raises(KeyboardInterrupt):
        pipe.run(range(6))
    assert swpipe_threads() == [] and pipe.in_flight == 0
    record.clear()
    assert pipe.run(range(4)) > 0 and record == [0, 1, 2, 3]
    # the same through fill_pipeline / progress: drain() afterwards gives a usable pipeline
    armed.append(True)
    it = pipe.fill_pipeline(range(6))
    with pytest.raises(KeyboardInterrupt):
        while True:
            pipe.progress(it)
    assert swpipe_threads() == []
    with pytest.raises(RuntimeError, match="drain"):
        pipe.progress(it)
    pipe.drain()
    assert drive(pipe, range(3)) == [0, 1, 2] and swpipe_threads() == []


def test_inline_globally_ordered_tasks_keep_the_sequence():
    order = []
    plan = PipelinePlan({PipelineTask("A", lambda ctx: order.append(("A", ctx.iter_idx))): TaskSchedule(0, None, "io", True),
                         PipelineTask("B", lambda ctx: order.append(("B", ctx.iter_idx))): TaskSchedule(1, None, "default", True)},
                        [("B", "A")])
    SWPipeline(plan, device="cpu").run(range(5))
    assert order == enqueue_sequence(plan, 5)  # tickets follow the enqueue order across worker and caller


def test_inline_tasks_in_timeline_shortcut_and_profiler():
    record = []
    pipe = SWPipeline(_chain(record, groups=("io", "default", "default")), device="cpu", record_timeline=True)
    pipe.run(range(4))
    events = {(e.task, e.iteration): e for e in pipe.timeline}
    assert len(events) == 12 and {e.thread_group for e in pipe.timeline} == {"io", "default"}
    for i in range(4):
        assert events[("Fwd", i)].start >= events[("Load", i)].end
    calls = []
    plan = PipelinePlan({PipelineTask("Gen", lambda ctx: (calls.append(ctx.iter_idx), setattr(ctx, "y", 7))): TaskSchedule(0),
                         PipelineTask("Use", lambda ctx: record.append(ctx.y)): TaskSchedule(1)}, [("Use", "Gen")])
    pipe = SWPipeline(plan, device="cpu")
    pipe.enable_shortcut("Gen")
    record.clear()
    pipe.run(range(4))
    assert calls == [0] and record == [7, 7, 7, 7]  # cached once, replayed inline
    pipe.disable_shortcut("Gen")
    r = TaskProfiler(pipe, num_warmup=1, num_measure=2, num_rounds=1).profile(None)
    assert set(r.exposed_s) == {"Gen", "Use"} and swpipe_threads() == []


def _handoff_plan(order, seen, met, wait_s):
    """Caller's task C and worker task W ("io"), independent, both stage 0, enqueued in ``order``.

    C waits (at most ``wait_s``) for W to have run and records whether it had; W records whether C had
    ended when it ran.
    """
    ran_w, c_done = threading.Event(), threading.Event()

    def c(ctx):
        c_done.clear()
        met.append(ran_w.wait(wait_s))
        c_done.set()

    def w(ctx):
        seen.append(c_done.is_set())
        ran_w.set()

    return PipelinePlan({PipelineTask("C", c): TaskSchedule(0), PipelineTask("W", w): TaskSchedule(0, None, "io"),
                         PipelineTask("Reset", lambda ctx: ran_w.clear()): TaskSchedule(0)},
                        [("Reset", "C"), ("Reset", "W")], enqueue_order=order)


def test_a_worker_task_placed_after_a_callers_task_is_handed_off_once_it_ran():
    seen, met = [], []
    SWPipeline(_handoff_plan(["C", "W", "Reset"], seen, met, 0.05), device="cpu").run(range(4))
    assert seen == [True] * 4  # W never started while C ran
    assert met == [False] * 4


def test_a_worker_task_placed_first_runs_beside_the_callers_tasks():
    seen, met = [], []
    SWPipeline(_handoff_plan(["W", "C", "Reset"], seen, met, 10.0), device="cpu").run(range(4))
    assert met == [True] * 4 and seen == [False] * 4  # W ran while C waited for it


def test_the_policies_hand_worker_tasks_off_before_the_callers_tasks():
    # io (stage 0) and compute (stage 1) do not wait on each other within a period: by name or by stage,
    # compute would come first and, inline, hold io back until it ran. Both policies put io first.
    plan = PipelinePlan({"compute": TaskSchedule(1, None, "compute"), "io": TaskSchedule(0, None, "io")},
                        [("compute", "io")], caller_group="compute")
    for policy in ("ready_first", "stage_descending"):
        assert enqueue_order(plan.replace(enqueue_policy=policy)) == ["io", "compute"], policy
        assert enqueue_order(plan.replace(enqueue_policy=policy, caller_group=None))[0] == "compute", policy
