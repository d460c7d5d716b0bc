"""The plan's one dict form (swpipe_core.planfile): plan files, the plan ranks share, a plan's identity."""

from __future__ import annotations

import json

import pytest

from autosched.model.graph import GraphFileError, load_plan, save_plan
from autosched.verify.candidates import plan_key
from swpipe_core import pipelines
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.planfile import PLAN_VERSION, PlanFileError, plan_from_dict, plan_to_dict


def _every_field() -> PipelinePlan:
    """A plan whose every field differs from its default."""
    return PipelinePlan(
        {"P": TaskSchedule(0, "copy", "io", True), "F": TaskSchedule(1, None, "main"),
         "B": TaskSchedule(1, "compute", "main")},
        intra_iter_deps=[("B", "F")], inter_iter_deps=[("P", "B", 2), ("F", "F")],
        same_period_deps=[("B", "P")], pipeline_depth=2, enqueue_order=["P", "F", "B"],
        enqueue_policy="stage_descending", caller_group=None)


def _fields(plan: PipelinePlan) -> dict:
    return {"schedule": {n: plan.sched(n) for n in plan.task_names}, "tasks": plan.task_names,
            "intra": plan.intra_edges(), "inter": plan.declared_inter_edges(), "same": plan.same_period_edges(),
            "depth": plan.pipeline_depth, "order": plan.enqueue_order, "policy": plan.enqueue_policy,
            "caller": plan.caller_group}


def test_every_field_round_trips_through_the_dict_and_the_file(tmp_path):
    plan = _every_field()
    back = plan_from_dict(json.loads(json.dumps(plan_to_dict(plan))))
    assert _fields(back) == _fields(plan)
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    assert json.loads(path.read_text())["version"] == PLAN_VERSION
    assert _fields(load_plan(path)) == _fields(plan)


@pytest.mark.parametrize("name", sorted(pipelines.PIPELINES))
def test_every_registered_pipeline_round_trips(name):
    plan = pipelines.get(name)
    assert _fields(plan_from_dict(plan_to_dict(plan))) == _fields(plan)


def test_the_default_stream_and_a_named_stream_stay_apart():
    doc = plan_to_dict(PipelinePlan({"A": TaskSchedule(0, None), "B": TaskSchedule(0, "s")}))
    assert [t["stream"] for t in doc["tasks"]] == [None, "s"]
    back = plan_from_dict(doc)
    assert back.sched("A").stream is None and back.sched("B").stream == "s"


def test_functions_are_bound_back_by_name_and_a_stranger_is_refused():
    doc = plan_to_dict(PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, [("B", "A")]))
    assert plan_from_dict(doc, {"A": print}).task("A").fn is print
    with pytest.raises(ValueError, match=r"fns names task\(s\) \['C'\]"):
        plan_from_dict(doc, {"C": print})


def test_a_file_written_by_the_version_1_save_plan_still_loads(tmp_path):
    # what save_plan wrote before same_period_deps could be stored (version 1), byte for byte
    old = {"format": "swpipe-plan", "version": 1,
           "tasks": [{"name": "H2D", "stage": 0, "stream": "memcpy", "thread_group": "default", "globally_ordered": False},
                     {"name": "Fwd", "stage": 1, "stream": None, "thread_group": "default", "globally_ordered": False}],
           "intra_iter_deps": [["Fwd", "H2D"]], "inter_iter_deps": [["H2D", "Fwd", 1]], "pipeline_depth": 2,
           "enqueue_order": None, "enqueue_policy": "ready_first", "caller_group": "default"}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old, indent=2))
    plan = load_plan(path, fns={"Fwd": print})
    assert plan.inter_edges() == [("H2D", "Fwd", 1)] and plan.sched("H2D").stream == "memcpy"
    assert plan.task("Fwd").fn is print and plan.same_period_deps == []
    # a version 1 file cannot hold same_period_deps: the field is named
    path.write_text(json.dumps({**old, "same_period_deps": [["Fwd", "H2D"]]}))
    with pytest.raises(GraphFileError, match=r"top level: unknown field\(s\) \['same_period_deps'\]"):
        load_plan(path)


@pytest.mark.parametrize("change, where", [
    ({"same_period_deps": [["B", "Z"]]}, "same_period_deps[0]: names unknown task 'Z'"),
    ({"same_period_deps": [["B"]]}, "same_period_deps[0]: ['B'] is not a list of 2 items"),
    ({"same_period_deps": "B,P"}, "same_period_deps: 'B,P' is not a list"),
    ({"caller_group": 3}, "caller_group: 3 is not a string or null"),
    ({"enqueue_order": "P"}, "enqueue_order: 'P' is not a list or null"),
    ({"tasks": [{"name": "P", "colour": 1}]}, "tasks[0]: unknown field(s) ['colour']"),
    ({"format": "swpipe-task-graph"}, "format: format is 'swpipe-task-graph'"),
    ({"version": 3}, "version: version 3 is not supported"),
    ({"plan": 1}, "top level: unknown field(s) ['plan']"),
])
def test_a_bad_field_is_named(change, where):
    doc = {**plan_to_dict(PipelinePlan({"P": TaskSchedule(0), "B": TaskSchedule(1)}, [("B", "P")])), **change}
    with pytest.raises(PlanFileError) as err:
        plan_from_dict(doc, source="rank 0's plan")
    assert str(err.value).startswith("rank 0's plan: ") and where in str(err.value) and "Fix: " in str(err.value)


def test_a_plan_that_breaks_a_rule_is_refused_by_validate():
    from swpipe_core.validate import PlanError

    doc = plan_to_dict(PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, [("B", "A")]))
    doc["enqueue_policy"] = "fifo"
    with pytest.raises(PlanError, match="enqueue-policy"):
        plan_from_dict(doc)


def test_the_identity_of_a_plan_is_its_dict_form_with_the_enqueue_order_resolved():
    a = PipelinePlan({PipelineTask("A", print): TaskSchedule(0), "B": TaskSchedule(1, "s")}, [("B", "A")],
                     same_period_deps=[("B", "A")])
    assert plan_key(a) == plan_key(a.replace(enqueue_order=["A", "B"]))  # the order its policy gives
    assert plan_key(a) == plan_key(a.bind({"A": len}))  # functions aside
    assert plan_key(a) != plan_key(a.replace(same_period_deps=[]))
    assert plan_key(a) != plan_key(a.replace(caller_group=None))
    assert plan_key(a) != plan_key(a.replace(schedule={"A": TaskSchedule(0), "B": TaskSchedule(1)}))  # stream
