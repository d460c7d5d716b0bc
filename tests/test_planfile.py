"""The plan's two forms (swpipe_core.planfile): the dict form of plan files, the plan ranks share and a plan's
identity; the text form a plan prints as and parses from."""

from __future__ import annotations

import json

import pytest

from autosched.model.graph import GraphFileError, load_plan, save_plan
from autosched.verify.candidates import plan_key
from swpipe_core import pipelines
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.planfile import (DEP_FIELDS, PLAN_FIELDS, PLAN_VERSION, TASK_FIELDS, PlanFileError, plan_from_dict,
                                  plan_to_dict)
from swpipe_core.validate import PlanError


def _every_field() -> PipelinePlan:
    """A plan whose every field differs from its default."""
    return PipelinePlan(
        {"P": TaskSchedule(0, "copy", "io", True), "F": TaskSchedule(1, None, "main"),
         "B": TaskSchedule(1, "compute", "main")},
        intra_iter_deps=[("B", "F")], inter_iter_deps=[("P", "B", 2), ("F", "F")],
        same_period_deps=[("B", "P")], pipeline_depth=2, enqueue_order=["P", "F", "B"],
        enqueue_policy="stage_descending", caller_group=None)


def test_every_field_round_trips_through_the_dict_the_file_and_the_text(tmp_path):
    plan = _every_field()
    back = plan_from_dict(json.loads(json.dumps(plan_to_dict(plan))))
    assert str(back) == str(plan) and back == plan
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    assert json.loads(path.read_text())["version"] == PLAN_VERSION
    assert str(load_plan(path)) == str(plan)
    assert PipelinePlan.from_text(str(plan)) == plan and plan_to_dict(PipelinePlan.from_text(str(plan))) == plan_to_dict(plan)


@pytest.mark.parametrize("name", sorted(pipelines.PIPELINES))
def test_every_registered_pipeline_round_trips(name):
    plan = pipelines.get(name)
    assert str(plan_from_dict(plan_to_dict(plan))) == str(plan)
    back = PipelinePlan.from_text(str(plan))
    assert back == plan and str(back) == str(plan)


def test_the_text_form_is_one_line_per_task_with_its_schedule_and_its_waits():
    lines = str(_every_field()).splitlines()
    assert lines[0].split() == ["plan", "depth=2", "policy=stage_descending", "caller=none"]
    assert [line.split() for line in lines[1:]] == [
        ["0", "P", "on", "io", "stream", "copy", "global", "after", "B[i-2]"],
        ["1", "F", "on", "main", "stream", "default", "after", "F[i-1]"],
        ["1", "B", "on", "main", "stream", "compute", "after", "F", "P[period]"],
        ["order", "P", "F", "B"],
    ]
    assert len({line.index("stream") for line in lines[1:4]}) == 1  # columns aligned


def test_the_two_forms_share_one_field_list():
    doc = plan_to_dict(_every_field())
    assert set(doc) == {"format", "version", "tasks"} | {f.key for f in PLAN_FIELDS + DEP_FIELDS}
    assert set(doc["tasks"][0]) == {f.key for f in TASK_FIELDS}
    text = str(_every_field())
    for f in PLAN_FIELDS + TASK_FIELDS:  # every keyword of the text form is a field's
        assert not f.keyword or f.keyword in text.split() or f"{f.keyword}=" in text


def test_names_that_are_not_one_word_and_words_that_mean_none_are_quoted():
    plan = PipelinePlan({"load batch": TaskSchedule(0, "copy#1"), "none": TaskSchedule(0, None, "g[1]")},
                        [("none", "load batch")], caller_group="none")
    text = str(plan)
    assert text.splitlines()[0].endswith('caller="none"')  # a group named none, not None
    assert text.splitlines()[1].split()[1:2] == ['"load']  # a JSON string
    back = PipelinePlan.from_text(text)
    assert back.caller_group == "none" and back.sched("load batch").stream == "copy#1"
    assert back.sched("none").thread_group == "g[1]" and back.intra_edges() == [("none", "load batch")]


def test_the_text_takes_defaults_comments_and_binds_functions():
    plan = PipelinePlan.from_text("""
        # a comment, then the plan's line: every field left out takes its default
        plan
        0 Load
        1 Step after Load
    """, fns={"Step": print})
    assert plan == PipelinePlan({"Load": TaskSchedule(0), "Step": TaskSchedule(1)}, [("Step", "Load")])
    assert plan.task("Step").fn is print and plan.unbound_tasks() == ["Load"]


@pytest.mark.parametrize("text, line, field", [
    ("", 1, ""),
    ("steps\n0 A", 1, ""),
    ("plan depth=two\n0 A", 1, "pipeline_depth"),
    ("plan colour=red\n0 A", 1, ""),
    ("plan\n0 A\nfirst B", 3, "tasks[1].stage"),
    ("plan\n0 A\n0", 3, "tasks[1].name"),
    ("plan\n0 A stream", 2, "tasks[0]"),
    ("plan\n0 A fast", 2, "tasks[0]"),
    ("plan\n0 A\n1 B after A[next]", 3, "tasks[1]"),
    ("plan\n0 A\n1 B after C", 3, "intra_iter_deps[0]"),
    ("plan\n0 A\n1 B after A[i-0]", 3, "inter_iter_deps[0]"),
    ("plan\n0 A\n0 A", 3, "tasks[1]"),
    ('plan\n0 "A', 2, ""),
])
def test_a_line_that_does_not_parse_is_named_with_its_field(text, line, field):
    with pytest.raises(PlanFileError) as err:
        PipelinePlan.from_text(text, source="p.txt")
    assert (err.value.source, err.value.line, err.value.field) == ("p.txt", line, field)
    assert err.value.fix and str(err.value).startswith(f"p.txt, line {line}: ")


def test_a_plan_text_that_breaks_a_rule_names_the_rule_and_its_tasks_line():
    with pytest.raises(PlanError) as err:
        PipelinePlan.from_text("plan\n0 A after B\n1 B")
    assert (err.value.rule, err.value.task, err.value.line) == ("corollary-1", "A", 2)
    with pytest.raises(PlanError) as err:
        PipelinePlan.from_text("plan depth=3\n0 A\n1 B")
    assert (err.value.rule, err.value.field, err.value.value, err.value.line) == ("depth-mismatch", "pipeline_depth", 3, 1)


def test_plans_are_equal_when_they_run_alike():
    plan = _every_field()
    shuffled = plan.replace(intra_iter_deps=list(reversed(plan.intra_iter_deps)),
                            inter_iter_deps=[("F", "F", 1), ("P", "B", 2)],
                            pipeline_depth=plan.pipeline_depth)
    assert shuffled == plan  # dependencies in another order, an inter dependency's distance written out
    assert plan.bind({"P": print}) == plan  # a bound task equals its unbound self
    assert plan.replace(caller_group="main") != plan
    assert plan.replace(schedule=dict(reversed(list(plan.schedule.items())))) != plan  # the task order is kept
    assert PipelinePlan({"A": TaskSchedule(0, None)}) != PipelinePlan({"A": TaskSchedule(0, "s")})


def test_the_default_stream_and_a_named_stream_stay_apart():
    doc = plan_to_dict(PipelinePlan({"A": TaskSchedule(0, None), "B": TaskSchedule(0, "s")}))
    assert [t["stream"] for t in doc["tasks"]] == [None, "s"]
    back = plan_from_dict(doc)
    assert back.sched("A").stream is None and back.sched("B").stream == "s"


def test_functions_are_bound_back_by_name_and_a_stranger_is_refused():
    doc = plan_to_dict(PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, [("B", "A")]))
    assert plan_from_dict(doc, {"A": print}).task("A").fn is print
    with pytest.raises(PlanFileError) as err:
        plan_from_dict(doc, {"C": print})
    assert (err.value.field, err.value.value) == ("fns", ["C"])


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
    with pytest.raises(GraphFileError) as err:
        load_plan(path)
    assert (err.value.field, err.value.value) == ("top level", ["same_period_deps"])


@pytest.mark.parametrize("change, field, value", [
    ({"same_period_deps": [["B", "Z"]]}, "same_period_deps[0]", "Z"),
    ({"same_period_deps": [["B"]]}, "same_period_deps[0]", ["B"]),
    ({"same_period_deps": "B,P"}, "same_period_deps", "B,P"),
    ({"caller_group": 3}, "caller_group", 3),
    ({"enqueue_order": "P"}, "enqueue_order", "P"),
    ({"tasks": [{"name": "P", "colour": 1}]}, "tasks[0]", ["colour"]),
    ({"format": "swpipe-task-graph"}, "format", "swpipe-task-graph"),
    ({"version": 3}, "version", 3),
    ({"plan": 1}, "top level", ["plan"]),
])
def test_a_bad_field_is_named(change, field, value):
    doc = {**plan_to_dict(PipelinePlan({"P": TaskSchedule(0), "B": TaskSchedule(1)}, [("B", "P")])), **change}
    with pytest.raises(PlanFileError) as err:
        plan_from_dict(doc, source="rank 0's plan")
    assert (err.value.source, err.value.field, err.value.value) == ("rank 0's plan", field, value)
    assert err.value.fix and str(err.value).startswith(f"rank 0's plan: {field}: ")  # where, then what


def test_a_plan_that_breaks_a_rule_is_refused_by_validate():
    from swpipe_core.validate import PlanError

    doc = plan_to_dict(PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, [("B", "A")]))
    doc["enqueue_policy"] = "fifo"
    with pytest.raises(PlanError) as err:
        plan_from_dict(doc)
    assert (err.value.rule, err.value.field, err.value.value) == ("enqueue-policy", "enqueue_policy", "fifo")


def test_the_identity_of_a_plan_is_its_dict_form_with_the_enqueue_order_resolved():
    a = PipelinePlan({PipelineTask("A", print): TaskSchedule(0), "B": TaskSchedule(1, "s")}, [("B", "A")],
                     same_period_deps=[("B", "A")])
    assert plan_key(a) == plan_key(a.replace(enqueue_order=["A", "B"]))  # the order its policy gives
    assert plan_key(a) == plan_key(a.bind({"A": len}))  # functions aside
    assert plan_key(a) != plan_key(a.replace(same_period_deps=[]))
    assert plan_key(a) != plan_key(a.replace(caller_group=None))
    assert plan_key(a) != plan_key(a.replace(schedule={"A": TaskSchedule(0), "B": TaskSchedule(1)}))  # stream
