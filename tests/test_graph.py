"""Task graphs, plan <-> graph conversion, unrolling, and the plan / task-graph JSON files."""

from __future__ import annotations

import json
import re

import networkx as nx
import pytest

from autosched.model.graph import (GraphFileError, graph_to_plan, load_plan, load_task_graph, period_local_graph,
                             plan_to_graph, save_plan, save_task_graph, task_graph, unroll)
import swpipe_core.order as order
from swpipe_core import pipelines
from swpipe_core.order import enqueue_order
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.planfile import PlanFileError
from swpipe_core.validate import PlanError


def _same_plan(a: PipelinePlan, b: PipelinePlan) -> None:
    """The same schedule: the plans' text forms, each with its enqueue order written out, compared."""
    a, b = (p.replace(enqueue_order=enqueue_order(p), enqueue_policy="ready_first", pipeline_depth=p.pipeline_depth)
            for p in (a, b))
    assert str(a) == str(b)


def test_task_graph_edges_run_dep_to_task_with_distance():
    g = task_graph(["H2D", "Fwd", "Bwd", "Opt"], [("Fwd", "H2D"), ("Bwd", "Fwd"), ("Opt", "Bwd")],
                   [("Fwd", "Opt"), ("H2D", "Opt", 2)])
    assert g.edges["H2D", "Fwd"]["distance"] == 0 and g.edges["H2D", "Fwd"]["kind"] == "intra"
    assert g.edges["Opt", "Fwd"]["distance"] == 1 and g.edges["Opt", "Fwd"]["kind"] == "inter"
    assert g.edges["Opt", "H2D"]["distance"] == 2
    assert set(g.nodes) == {"H2D", "Fwd", "Bwd", "Opt"}


def test_task_graph_keeps_the_smallest_distance_of_a_repeated_pair_and_all_of_them():
    g = task_graph(["A", "B"], [], [("A", "B", 3), ("A", "B", 1)])
    assert g.edges["B", "A"]["distance"] == 1
    assert sorted(g.edges["B", "A"]["distances"]) == [1, 3]


@pytest.mark.parametrize("args, what", [
    ((["A"], [("A", "Z")], []), "'Z'"),
    ((["A", "B"], [], [("A", "B", 0)]), "distance 0"),
    ((["A", "B"], [("A",)], []), "not a"),
    ((["A", "A"], [], []), "twice"),
])
def test_task_graph_rejects_bad_input(args, what):
    with pytest.raises(ValueError, match=what):
        task_graph(*args)


def test_task_graph_keeps_task_functions_on_the_nodes():
    fn = lambda ctx: None  # noqa: E731
    g = task_graph([PipelineTask("A", fn), "B"], [("B", "A")])
    assert g.nodes["A"]["task"].fn is fn and g.nodes["B"]["task"].fn is None


@pytest.mark.parametrize("name", sorted(pipelines.PIPELINES))
def test_plan_graph_round_trip_gives_the_same_plan(name):
    plan = pipelines.get(name)
    g = plan_to_graph(plan)
    assert g.nodes[plan.task_names[0]]["stage"] == plan.stage(plan.task_names[0])
    _same_plan(plan, graph_to_plan(g))


def test_graph_to_plan_takes_a_schedule_and_binds_functions():
    g = task_graph(["A", "B"], [("B", "A")])
    fn = lambda ctx: None  # noqa: E731
    plan = graph_to_plan(g, {"B": TaskSchedule(stage=1, thread_group="t")}, fns={"A": fn})
    assert plan.stage("B") == 1 and plan.sched("B").thread_group == "t" and plan.stage("A") == 0
    assert plan.task("A").fn is fn
    with pytest.raises(ValueError, match="'Z'"):
        graph_to_plan(g, {"Z": TaskSchedule()})
    with pytest.raises(ValueError, match="'Z'"):
        graph_to_plan(g, fns={"Z": fn})


def test_unroll_connects_iterations_by_distance():
    g = task_graph(["Fwd", "Opt"], [("Opt", "Fwd")], [("Fwd", "Opt", 2)])
    u = unroll(g, 4)
    assert u.number_of_nodes() == 8
    assert ((("Opt", 1), ("Fwd", 3)) in u.edges) and ((("Opt", 2), ("Fwd", 4)) not in u.edges)
    assert u.number_of_edges() == 4 + 2
    assert nx.is_directed_acyclic_graph(u)
    with pytest.raises(ValueError):
        unroll(g, 0)


def test_unroll_accepts_a_plan():
    plan = pipelines.get("fused_sparse_dist")
    u = unroll(plan, 3)
    assert (("Backward", 0), ("EmbLookup", 1)) in u.edges
    assert nx.is_directed_acyclic_graph(u)


def test_period_local_graph_is_the_engines():
    plan = pipelines.get("fused_sparse_dist")
    assert sorted(period_local_graph(plan).edges) == sorted(order.period_local_graph(plan).edges)
    assert ("Backward", "EmbLookup") not in period_local_graph(plan).edges  # Backward(i-1) ran a period earlier


@pytest.mark.parametrize("name", sorted(pipelines.PIPELINES))
def test_plan_json_round_trip(tmp_path, name):
    plan = pipelines.get(name)
    path = str(tmp_path / "plan.json")
    save_plan(plan, path)
    back = load_plan(path)
    _same_plan(plan, back)
    assert back.unbound_tasks() == back.task_names


def test_plan_json_keeps_an_explicit_enqueue_order_and_binds_functions_by_name(tmp_path):
    calls = []
    plan = PipelinePlan({"A": TaskSchedule(0, "s", "io"), "B": TaskSchedule(0, None, "cpu", True)},
                        enqueue_order=["B", "A"])
    path = str(tmp_path / "p.json")
    save_plan(plan, path)
    back = load_plan(path, fns={"A": calls.append, "B": calls.append})
    assert back.enqueue_order == ["B", "A"] and back.sched("B").globally_ordered
    back.task("A").fn(1)
    assert calls == [1]
    with pytest.raises(PlanFileError) as err:
        load_plan(path, fns={"C": print})
    assert (err.value.field, err.value.value) == ("fns", ["C"])


@pytest.mark.parametrize("caller", [None, "io", "default"])
def test_plan_json_keeps_the_callers_group(tmp_path, caller):
    # The caller's group decides which tasks run inline and when the others are handed off: a plan file
    # that lost it would run (and simulate) a searched plan, which has none, with "default" inline.
    plan = PipelinePlan({"A": TaskSchedule(0, None, "io"), "B": TaskSchedule(1)}, [("B", "A")], caller_group=caller)
    path = str(tmp_path / "p.json")
    save_plan(plan, path)
    assert load_plan(path).caller_group == caller


def test_a_plan_file_without_a_callers_group_runs_default_inline_and_rejects_a_bad_one(tmp_path):
    path = tmp_path / "p.json"
    doc = {"format": "swpipe-plan", "version": 1, "tasks": [{"name": "A"}]}
    path.write_text(json.dumps(doc))
    assert load_plan(str(path)).caller_group == "default"  # files written before the field existed
    path.write_text(json.dumps({**doc, "caller_group": 3}))
    with pytest.raises(GraphFileError) as err:
        load_plan(str(path))
    assert (err.value.path, err.value.field, err.value.value) == (str(path), "caller_group", 3)


def test_a_plan_with_functions_runs_after_a_json_round_trip(tmp_path):
    from swpipe_core.engine.pipeline import SWPipeline

    plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, [("B", "A")])
    path = str(tmp_path / "p.json")
    save_plan(plan, path)
    seen = []
    fns = {"A": lambda ctx: setattr(ctx, "x", ctx.batch * 2), "B": lambda ctx: seen.append(ctx.x)}
    with SWPipeline(load_plan(path, fns=fns), device="cpu") as pipe:
        pipe.run(range(4))
    assert seen == [0, 2, 4, 6]


@pytest.mark.parametrize("text, where", [
    ("{not json", "not valid JSON"),
    ('[1, 2]', "not an object"),
    ('{"format": "swpipe-task-graph", "version": 1, "tasks": ["A"]}', "format"),
    ('{"format": "swpipe-plan", "version": 9, "tasks": [{"name": "A"}]}', "version 9"),
    ('{"format": "swpipe-plan", "version": 1, "tasks": []}', "not a non-empty list"),
    ('{"format": "swpipe-plan", "version": 1, "tasks": [{"stage": 0}]}', "tasks[0]: missing field(s) ['name']"),
    ('{"format": "swpipe-plan", "version": 1, "tasks": [{"name": "A", "speed": 1}]}', "unknown field(s) ['speed']"),
    ('{"format": "swpipe-plan", "version": 1, "tasks": [{"name": "A"}, {"name": "A"}]}', "appears twice"),
    ('{"format": "swpipe-plan", "version": 1, "tasks": [{"name": "A"}], "intra_iter_deps": [["A", "B"]]}',
     "intra_iter_deps[0]: names unknown task 'B'"),
    ('{"format": "swpipe-plan", "version": 1, "tasks": [{"name": "A"}], "inter_iter_deps": [["A", "A", 0]]}',
     "distance 0"),
    ('{"format": "swpipe-plan", "version": 1, "tasks": [{"name": "A"}], "inter_iter_deps": [["A"]]}', "not a list of"),
    ('{"format": "swpipe-plan", "version": 1, "tasks": [{"name": "A"}], "colour": 1}', "unknown field(s) ['colour']"),
])
def test_load_plan_rejects_malformed_files_naming_file_and_field(tmp_path, text, where):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(GraphFileError) as err:
        load_plan(str(path))
    assert str(path) in str(err.value) and where in str(err.value)


def test_load_plan_rejects_a_plan_that_breaks_a_rule(tmp_path):
    doc = {"format": "swpipe-plan", "version": 1, "tasks": [{"name": "A", "stage": 1}, {"name": "B", "stage": 0}],
           "intra_iter_deps": [["B", "A"]]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanError) as err:
        load_plan(str(path))
    assert err.value.rule == "corollary-1"


def test_task_graph_json_round_trip_with_functions(tmp_path):
    g = task_graph(["A", "B", "C"], [("B", "A"), ("C", "B")], [("A", "C"), ("A", "B", 2)])
    path = str(tmp_path / "g.json")
    save_task_graph(g, path)
    fn = lambda ctx: None  # noqa: E731
    back = load_task_graph(path, fns={"C": fn})
    assert sorted(back.edges(data="distance")) == sorted(g.edges(data="distance"))
    assert back.nodes["C"]["task"].fn is fn


@pytest.mark.parametrize("text, where", [
    ('{"format": "swpipe-task-graph", "version": 1, "tasks": []}', "not a non-empty list"),
    ('{"format": "swpipe-task-graph", "version": 1, "tasks": ["A", "A"]}', "repeat"),
    ('{"format": "swpipe-task-graph", "version": 1, "tasks": ["A"], "inter_iter_deps": [["A", "Q"]]}', "'Q'"),
    ('{"format": "swpipe-plan", "version": 1, "tasks": ["A"]}', "format"),
])
def test_load_task_graph_rejects_malformed_files(tmp_path, text, where):
    path = tmp_path / "g.json"
    path.write_text(text)
    with pytest.raises(GraphFileError, match=re.escape(where)):
        load_task_graph(str(path))
