"""The plan model: task identity by name, depth inference, normalised views, binding."""

from __future__ import annotations

import pytest

from swpipe_core.analysis import format_schedule
from swpipe_core.order import enqueue_order, period_local_graph
from swpipe_core.plan import (
    IterContext,
    PipelinePlan,
    PipelineTask,
    TaskSchedule,
    ref_name,
    stream_name,
)
from swpipe_core.validate import PlanError, validate


def _fn(ctx):
    ctx.done = True


def test_task_equality_and_hash_by_name():
    a1, unbound = PipelineTask("A", _fn), PipelineTask("A")
    assert a1 == unbound and a1 == PipelineTask("A", _fn) and a1 == "A" and "A" == a1
    assert a1 != PipelineTask("B") and a1 != "B"
    assert len({a1, unbound, "A"}) == 1
    assert {a1: 1}["A"] == 1 and hash(a1) == hash("A")


def test_tasks_of_one_name_are_equal_whatever_their_functions_as_the_reference_defines():
    a1, a2 = PipelineTask("A", _fn), PipelineTask("A", print)
    assert a1 == a2 and hash(a1) == hash(a2) and a1 != PipelineTask("B", _fn)
    plan = PipelinePlan({a1: TaskSchedule(1), "B": TaskSchedule(0)}, intra_iter_deps=[(a1, "B")])
    assert plan.schedule[a2] == TaskSchedule(1) and a2 in plan.schedule  # a lookup by a same-named task finds it
    assert plan.sched(a2).stage == 1 and plan.task(a2).fn is _fn  # the scheduled task's own function


def test_a_dependency_on_a_same_named_task_with_another_function_is_still_refused():
    from swpipe_core.validate import PlanError

    plan = PipelinePlan({PipelineTask("A", _fn): TaskSchedule(0), "B": TaskSchedule(0)},
                        intra_iter_deps=[("B", PipelineTask("A", print))])
    with pytest.raises(PlanError) as info:
        validate(plan)
    assert (info.value.rule, info.value.tasks, info.value.field) == ("foreign-task", ["A"], "intra_iter_deps")


def test_task_schedule_defaults_stage0_default_stream_and_group():
    s = TaskSchedule()
    assert (s.stage, s.stream, s.thread_group, s.globally_ordered) == (0, None, "default", False)


@pytest.mark.parametrize("stages,depth", [([0], 1), ([0, 1, 1], 2), ([0, 2], 3), ([3, 0], 4)])
def test_pipeline_depth_inferred_as_max_stage_plus_one(stages, depth):
    plan = PipelinePlan({f"T{i}": TaskSchedule(s) for i, s in enumerate(stages)})
    assert plan.pipeline_depth == depth == plan.inferred_depth()
    validate(plan)


def test_explicit_depth_that_disagrees_names_inferred_value():
    plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, intra_iter_deps=[("B", "A")], pipeline_depth=3)
    with pytest.raises(PlanError) as info:
        validate(plan)
    assert info.value.rule == "depth-mismatch"
    assert "max(stage) + 1 = 2" in str(info.value) and "pipeline_depth=2" in info.value.fix


def test_explicit_depth_that_agrees_is_accepted():
    plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, pipeline_depth=2)
    validate(plan)  # raises PlanError (depth-mismatch) if it were refused
    assert plan.pipeline_depth == 2 and plan == plan.replace(pipeline_depth=None)  # the inferred depth


def _three_ways():
    h2d, fwd, opt = PipelineTask("H2D", _fn), PipelineTask("Forward", _fn), PipelineTask("Optim", _fn)
    sched = lambda a, b, c: {a: TaskSchedule(0, "memcpy", "io"), b: TaskSchedule(1), c: TaskSchedule(1)}  # noqa: E731
    objects = PipelinePlan(sched(h2d, fwd, opt), [(fwd, h2d), (opt, fwd)], [(fwd, opt)])
    strings = PipelinePlan(sched("H2D", "Forward", "Optim"), [("Forward", "H2D"), ("Optim", "Forward")],
                           [("Forward", "Optim")])
    mixed = PipelinePlan(sched(h2d, "Forward", opt), [("Forward", h2d), (opt, "Forward")], [(fwd, "Optim")])
    return objects, strings, mixed


def test_string_refs_and_task_objects_are_interchangeable():
    objects, strings, mixed = _three_ways()
    for plan in (objects, strings, mixed):
        validate(plan)
    assert objects.intra_edges() == strings.intra_edges() == mixed.intra_edges() == [("Forward", "H2D"), ("Optim", "Forward")]
    assert objects.inter_edges() == strings.inter_edges() == mixed.inter_edges() == [("Forward", "Optim", 1)]
    assert enqueue_order(objects) == enqueue_order(strings) == enqueue_order(mixed)
    assert sorted(period_local_graph(objects).edges) == sorted(period_local_graph(mixed).edges)
    assert format_schedule(objects) == format_schedule(strings) == format_schedule(mixed)
    assert objects.sched("Forward") is objects.sched(PipelineTask("Forward"))
    assert mixed.stage(PipelineTask("Optim")) == mixed.stage("Optim") == 1


def test_lookup_of_unknown_task_lists_the_tasks():
    plan = PipelinePlan({"A": TaskSchedule(0)})
    with pytest.raises(KeyError, match=r"'Nope'.*\['A'\]"):
        plan.sched("Nope")
    with pytest.raises(KeyError, match="Nope"):
        plan.task("Nope")


def test_inter_dependency_distance_defaults_to_one():
    plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(2)}, inter_iter_deps=[("A", "B", 2), ("B", "A")])
    assert plan.inter_edges() == [("A", "B", 2), ("B", "A", 1)]
    validate(plan)


def test_string_keys_become_unbound_tasks():
    plan = PipelinePlan({"A": TaskSchedule(0), PipelineTask("B", _fn): TaskSchedule(0)})
    assert plan.unbound_tasks() == ["A"]
    assert plan.task("A").fn is None and plan.task("B").fn is _fn


def test_bind_sets_functions_by_name_and_keeps_the_rest():
    plan = PipelinePlan({"A": TaskSchedule(0), PipelineTask("B", print): TaskSchedule(1)}, intra_iter_deps=[("B", "A")])
    bound = plan.bind({"A": _fn})
    assert bound.task("A").fn is _fn and bound.task("B").fn is print
    assert bound.unbound_tasks() == [] and plan.unbound_tasks() == ["A"]
    assert str(bound) == str(plan) and bound.pipeline_depth == 2  # the same schedule, functions aside
    validate(bound)


def test_replace_reinfers_depth_unless_given():
    plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(2)})
    flat = plan.replace(schedule={"A": TaskSchedule(0), "B": TaskSchedule(0)})
    assert plan.pipeline_depth == 3 and flat.pipeline_depth == 1


def test_ref_name_rejects_other_types():
    assert ref_name(PipelineTask("X")) == "X"
    with pytest.raises(TypeError, match="int"):  # the type given
        ref_name(3)


def test_stream_name_is_readable_for_every_kind():
    class Named:
        swpipe_name = "emb_lookup"

    class WithId:
        stream_id = 7

    assert stream_name(None) == "default" and stream_name("memcpy") == "memcpy"
    assert stream_name(Named()) == "emb_lookup" and stream_name(WithId()) == "stream7"


def test_iter_context_carries_attributes():
    ctx = IterContext(batch=[1, 2], iter_idx=4)
    ctx.z, ctx.a = 1, 2
    assert ctx.iter_idx == 4 and ctx.batch == [1, 2]
    assert repr(ctx) == "IterContext(iter_idx=4, attrs=['a', 'z'])"
