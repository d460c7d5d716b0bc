"""Thread groups: named FIFO workers, joined on stop; with_thread_map strategies as a plan transform."""

from __future__ import annotations

import threading

import pytest

from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.validate import validate
from swpipe_core.engine.workers import ScheduledTask, Workers, with_thread_map

pytestmark = pytest.mark.timeout(30)


def plan_of():
    return PipelinePlan(
        {PipelineTask("H2D", lambda ctx: None): TaskSchedule(0, "memcpy", "x"),
         PipelineTask("Dist", lambda ctx: None): TaskSchedule(1, "data_dist", "x", globally_ordered=True),
         PipelineTask("Fwd", lambda ctx: None): TaskSchedule(1, None, "x"),
         PipelineTask("Bwd", lambda ctx: None): TaskSchedule(1, None, "x")},
        intra_iter_deps=[("Dist", "H2D"), ("Fwd", "Dist"), ("Bwd", "Fwd")],
        enqueue_order=["H2D", "Dist", "Fwd", "Bwd"],
    )


def groups(plan):
    return {n: plan.sched(n).thread_group for n in plan.task_names}


def test_by_stream_gives_one_group_per_stream():
    assert groups(with_thread_map(plan_of(), "by_stream")) == {"H2D": "memcpy", "Dist": "data_dist", "Fwd": "default", "Bwd": "default"}


def test_per_task_gives_one_group_per_task():
    assert groups(with_thread_map(plan_of(), "per_task")) == {n: n for n in plan_of().task_names}


def test_dict_pins_tasks_and_falls_back_to_default():
    got = groups(with_thread_map(plan_of(), {"H2D": "io", PipelineTask("Dist"): "comm"}))
    assert got == {"H2D": "io", "Dist": "comm", "Fwd": "default", "Bwd": "default"}


def test_callable_sees_the_scheduled_task():
    seen = []

    def pick(t: ScheduledTask) -> str:
        seen.append((t.name, t.stage, t.stream, t.globally_ordered))
        return "io" if t.stream == "memcpy" else "compute"

    assert groups(with_thread_map(plan_of(), pick)) == {"H2D": "io", "Dist": "compute", "Fwd": "compute", "Bwd": "compute"}
    assert ("Dist", 1, "data_dist", True) in seen


def test_transform_keeps_everything_but_thread_groups():
    plan = plan_of()
    new = with_thread_map(plan, "per_task")
    validate(new)
    assert new.intra_edges() == plan.intra_edges() and new.enqueue_order == plan.enqueue_order
    assert [(new.stage(n), new.stream_of(n), new.sched(n).globally_ordered) for n in new.task_names] == \
        [(plan.stage(n), plan.stream_of(n), plan.sched(n).globally_ordered) for n in plan.task_names]
    assert groups(plan) == {n: "x" for n in plan.task_names}  # the input is untouched


@pytest.mark.parametrize("bad,err", [("by_thread", ValueError), ({"Nope": "io"}, ValueError),
                                     (lambda t: "", ValueError), (lambda t: 3, ValueError), (42, TypeError)])
def test_bad_thread_maps_rejected(bad, err):
    with pytest.raises(err):
        with_thread_map(plan_of(), bad)


@pytest.mark.parametrize("strategy", ["by_stream", "per_task"])
def test_mapped_plans_run_on_the_mapped_threads(strategy):
    seen = {}
    plan = with_thread_map(plan_of(), strategy)
    plan = plan.bind({n: (lambda ctx, n=n: seen.setdefault(n, set()).add(threading.current_thread().name))
                      for n in plan.task_names})
    SWPipeline(plan, device="cpu").run(range(5))
    # the caller's group ("default") runs inline on the calling thread, every other group on its own worker
    assert seen == {n: {threading.current_thread().name if g == plan.caller_group else f"swpipe-{g}"}
                    for n, g in groups(plan).items()}


def test_workers_are_named_fifo_and_joined():
    out = []
    w = Workers(["a", "b"], lambda g, items: out.extend((g, threading.current_thread().name, x) for x in items))
    w.start()
    assert sorted(w.alive()) == ["swpipe-a", "swpipe-b"]
    for k in range(50):
        w.submit("a", [k, k + 0.5])
    w.submit("b", ["only"])
    assert w.stop() == []
    assert w.alive() == []
    assert [x for g, _, x in out if g == "a"] == [v for k in range(50) for v in (k, k + 0.5)]
    assert {(g, name) for g, name, _ in out} == {("a", "swpipe-a"), ("b", "swpipe-b")}


def test_worker_crash_is_reported_and_worker_still_stops():
    crashes = []

    def run_items(group, items):
        raise RuntimeError("engine bug")

    w = Workers(["a"], run_items, on_crash=lambda g, exc: crashes.append((g, str(exc))))
    w.start()
    w.submit("a", [1])
    assert w.stop(timeout=5) == []
    assert crashes == [("a", "engine bug")]


def test_stop_reports_threads_stuck_in_user_code():
    release = threading.Event()
    w = Workers(["slow"], lambda g, items: release.wait(5))
    w.start()
    w.submit("slow", [1])
    assert w.stop(timeout=0.05) == ["swpipe-slow"]
    release.set()
    assert w.stop(timeout=5) == [] and w.alive() == []


def test_worker_scope_wraps_each_thread_and_a_failing_scope_is_reported_not_hung():
    from swpipe_core.engine.workers import Workers

    entered, crashes = [], []

    class Scope:
        def __enter__(self):
            entered.append(threading.current_thread().name)

        def __exit__(self, *exc):
            entered.append("exit")

    w = Workers(["a", "b"], lambda g, items: None, scope=Scope)
    w.start()
    w.submit("a", [1])
    assert w.stop(5.0) == []
    assert sorted(entered) == ["exit", "exit", "swpipe-a", "swpipe-b"]

    class Broken:
        def __enter__(self):
            raise RuntimeError("no profiler here")

        def __exit__(self, *exc):
            return None

    w = Workers(["c"], lambda g, items: None, on_crash=lambda g, exc: crashes.append((g, str(exc))), scope=Broken)
    w.start()
    w.submit("c", [1])
    assert w.stop(5.0) == [] and crashes == [("c", "no profiler here")]
