"""Bad input gets a clear error naming what is wrong, where, and the fix; never a hang, never a thread.

``tests/test_validate.py`` checks each rule of :func:`swpipe_core.validate.validate`
on its own (rule, tasks, fix). Here: each of those plans is also rejected by
``SWPipeline(plan)`` at construction, before any thread starts; wrong
arguments to the engine; and every malformed file the loaders read (plan
JSON, task-graph JSON, cost-model JSON) gives an error naming the file, the
field and the fix. ``benchmarks/reliability.py`` counts these tables.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Tuple

import pytest

from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.validate import RULES, PlanError
from test_validate import BAD_PLANS  # the one bad plan per rule, shared with room A's tests
from conftest import swpipe_threads

autosched_graph = pytest.importorskip("autosched.model.graph")
autosched_costs = pytest.importorskip("autosched.model.costs")
GraphFileError = autosched_graph.GraphFileError
CostModelError = autosched_costs.CostModelError


def _noop(ctx):
    return None


# ----------------------------------------------------------------------------- plans at construction

@pytest.mark.parametrize("rule", sorted(BAD_PLANS))
def test_swpipeline_rejects_every_bad_plan_at_construction_naming_rule_and_fix(rule):
    make, names = BAD_PLANS[rule]
    with pytest.raises(PlanError) as info:
        SWPipeline(make(), device="cpu")
    err = info.value
    assert err.rule == rule and str(err).startswith(f"[{rule}]")
    assert err.fix and str(err).endswith(f"Fix: {err.fix}")
    assert all(n in str(err) for n in names)
    assert swpipe_threads() == []


def test_every_rule_is_covered_here_or_proved_unreachable():
    assert set(BAD_PLANS) | {"period-local-cycle"} == set(RULES)


def test_unbound_plan_constructs_but_refuses_to_run_naming_tasks_and_fix():
    plan = PipelinePlan({"A": TaskSchedule(0), PipelineTask("B", _noop): TaskSchedule(1)}, [("B", "A")])
    pipe = SWPipeline(plan, device="cpu")  # analysis-only plans are allowed
    for run in (lambda: pipe.run(range(2)), lambda: pipe.fill_pipeline(range(2)),
                lambda: pipe.run_serial(range(2)), lambda: pipe.run_one_serial_iter(0)):
        with pytest.raises(PlanError) as info:
            run()
        assert info.value.rule == "unbound-task" and info.value.tasks == ["A"]
        assert "plan.bind" in info.value.fix
    assert swpipe_threads() == []


@pytest.mark.parametrize("not_a_plan", ["plan", None, {"A": TaskSchedule(0)}, [("A", TaskSchedule(0))]],
                         ids=["str", "None", "dict", "list"])
def test_swpipeline_rejects_what_is_not_a_plan_with_type_error_and_fix(not_a_plan):
    with pytest.raises(TypeError, match=r"PipelinePlan.*got .*PipelinePlan\(schedule="):
        SWPipeline(not_a_plan, device="cpu")


# name -> (kwargs, the option the error names)
BAD_OPTIONS: Dict[str, Tuple[Dict[str, Any], str]] = {
    "timeouts not Timeouts": ({"timeouts": 5}, "timeouts"),
    "max_device_lag < 0": ({"max_device_lag": -1}, "max_device_lag"),
    "max_device_lag bool": ({"max_device_lag": True}, "max_device_lag"),
    "rng unknown": ({"rng": "global"}, "rng"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_bad_engine_options_name_the_option_and_what_it_takes(case):
    from swpipe_core.engine.options import OptionError

    kwargs, option = BAD_OPTIONS[case]
    plan = PipelinePlan({PipelineTask("A", _noop): TaskSchedule()})
    with pytest.raises(OptionError) as info:
        SWPipeline(plan, device="cpu", **kwargs)
    assert (info.value.given_to, info.value.field, info.value.home) == ("SWPipeline", option, None)
    assert info.value.value == kwargs[option] and info.value.expected
    assert isinstance(info.value, ValueError)


def test_an_unknown_device_type_names_it_and_the_accepted_values():
    plan = PipelinePlan({PipelineTask("A", _noop): TaskSchedule()})
    with pytest.raises(ValueError) as info:
        SWPipeline(plan, device="tpu")
    for part in ("tpu", "'cpu'"):
        assert part in str(info.value)


def test_explicit_cuda_device_without_cuda_says_use_cpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    plan = PipelinePlan({PipelineTask("A", _noop): TaskSchedule()})
    with pytest.raises(RuntimeError, match="device='cpu'"):
        SWPipeline(plan, device="cuda:0")


def test_misuse_of_the_run_methods_says_what_to_call():
    plan = PipelinePlan({PipelineTask("A", _noop): TaskSchedule(1)})
    pipe = SWPipeline(plan, device="cpu")
    with pytest.raises(RuntimeError, match="fill_pipeline"):
        pipe.progress()
    with pytest.raises(ValueError, match=r"\['Nope'\].*\['A'\]"):  # the unknown task, then the plan's
        pipe.enable_shortcut("Nope")
    with pytest.raises(TypeError, match="int"):  # the type given instead of an iterable
        pipe.fill_pipeline(5)
    assert swpipe_threads() == [] and pipe.in_flight == 0
    it = pipe.fill_pipeline(range(4))
    with pytest.raises(RuntimeError, match="drain"):
        pipe.fill_pipeline(range(4))
    with pytest.raises(RuntimeError, match="drain"):
        pipe.run_serial(range(2))
    with pytest.raises(RuntimeError, match="drain"):
        pipe.enable_shortcut("A")
    assert pipe.progress(it) == 0  # none of the refused calls disturbed the run
    pipe.drain()
    assert swpipe_threads() == []


# ----------------------------------------------------------------------------- malformed files

_PLAN_OK = {"format": "swpipe-plan", "version": 1,
            "tasks": [{"name": "H2D", "stage": 0, "stream": "memcpy"}, {"name": "Fwd", "stage": 1}],
            "intra_iter_deps": [["Fwd", "H2D"]], "inter_iter_deps": []}
_GRAPH_OK = {"format": "swpipe-task-graph", "version": 1, "tasks": ["A", "B"],
             "intra_iter_deps": [["B", "A"]], "inter_iter_deps": [["A", "B", 1]]}
_COST_OK = {"schema": "swpipe-cost-model", "version": 1, "machine": "test",
            "tasks": {"A": {"host_s": 0.001, "device_s": 0.0}, "B": {"host_s": 0.002, "resources": ["pcie"]}}}


def _with(base: Dict[str, Any], **changes: Any) -> Dict[str, Any]:
    doc = json.loads(json.dumps(base))
    for key, value in changes.items():
        if value is _DROP:
            doc.pop(key, None)
        else:
            doc[key] = value
    return doc


_DROP = object()

# id -> (document: a JSON-able object or raw text, error type, field the message must name)
BAD_PLAN_FILES: Dict[str, Tuple[Any, type, str]] = {
    "syntax": ('{"format": "swpipe-plan",', GraphFileError, "line 1"),
    "top level list": ([_PLAN_OK], GraphFileError, "top level"),
    "no format": (_with(_PLAN_OK, format=_DROP), GraphFileError, "format"),
    "task graph given as plan": (_GRAPH_OK, GraphFileError, "format"),
    "version 3": (_with(_PLAN_OK, version=3), GraphFileError, "version"),
    "unknown top field": (_with(_PLAN_OK, taks=[]), GraphFileError, "taks"),
    "no tasks": (_with(_PLAN_OK, tasks=_DROP), GraphFileError, "tasks"),
    "empty tasks": (_with(_PLAN_OK, tasks=[]), GraphFileError, "tasks"),
    "task not object": (_with(_PLAN_OK, tasks=["H2D"]), GraphFileError, "tasks[0]"),
    "task without name": (_with(_PLAN_OK, tasks=[{"stage": 0}]), GraphFileError, "tasks[0]"),
    "empty name": (_with(_PLAN_OK, tasks=[{"name": ""}]), GraphFileError, "tasks[0]"),
    "duplicate name": (_with(_PLAN_OK, tasks=[{"name": "A"}, {"name": "A"}], intra_iter_deps=[]),
                       GraphFileError, "tasks[1]"),
    "unknown task field": (_with(_PLAN_OK, tasks=[{"name": "A", "stagee": 1}], intra_iter_deps=[]),
                           GraphFileError, "stagee"),
    "deps not list": (_with(_PLAN_OK, intra_iter_deps={"Fwd": "H2D"}), GraphFileError, "intra_iter_deps"),
    "dep arity": (_with(_PLAN_OK, intra_iter_deps=[["Fwd"]]), GraphFileError, "intra_iter_deps[0]"),
    "dep unknown task": (_with(_PLAN_OK, intra_iter_deps=[["Fwd", "D2H"]]), GraphFileError, "D2H"),
    "distance 0": (_with(_PLAN_OK, inter_iter_deps=[["H2D", "Fwd", 0]]), GraphFileError, "inter_iter_deps[0]"),
    "distance str": (_with(_PLAN_OK, inter_iter_deps=[["H2D", "Fwd", "1"]]), GraphFileError, "inter_iter_deps[0]"),
    "enqueue_order not list": (_with(_PLAN_OK, enqueue_order="H2D,Fwd"), GraphFileError, "enqueue_order"),
    # well-formed files whose plan breaks a rule: the PlanError names the rule
    "negative stage": (_with(_PLAN_OK, tasks=[{"name": "H2D", "stage": -1}, {"name": "Fwd", "stage": 1}]),
                       PlanError, "[stage]"),
    "stage as string": (_with(_PLAN_OK, tasks=[{"name": "H2D", "stage": "0"}, {"name": "Fwd", "stage": 1}]),
                        PlanError, "[stage]"),
    "corollary-1 in file": (_with(_PLAN_OK, tasks=[{"name": "H2D", "stage": 1}, {"name": "Fwd", "stage": 0}]),
                            PlanError, "[corollary-1]"),
    "depth mismatch": (_with(_PLAN_OK, pipeline_depth=5), PlanError, "[depth-mismatch]"),
    "unknown policy": (_with(_PLAN_OK, enqueue_policy="fifo"), PlanError, "[enqueue-policy]"),
    "enqueue order not topological": (_with(_PLAN_OK, tasks=[{"name": "H2D"}, {"name": "Fwd"}],
                                            enqueue_order=["Fwd", "H2D"]), PlanError, "[enqueue-order]"),
    "empty thread group": (_with(_PLAN_OK, tasks=[{"name": "H2D", "thread_group": ""}, {"name": "Fwd", "stage": 1}]),
                           PlanError, "[thread-group]"),
    "globally_ordered not bool": (_with(_PLAN_OK, tasks=[{"name": "H2D", "globally_ordered": "yes"},
                                                         {"name": "Fwd", "stage": 1}]), PlanError, "[globally-ordered]"),
}

BAD_GRAPH_FILES: Dict[str, Tuple[Any, type, str]] = {
    "syntax": ("[", GraphFileError, "line 1"),
    "top level string": ('"tasks"', GraphFileError, "top level"),
    "plan given as task graph": (_PLAN_OK, GraphFileError, "format"),
    "version 0": (_with(_GRAPH_OK, version=0), GraphFileError, "version"),
    "unknown top field": (_with(_GRAPH_OK, stages={}), GraphFileError, "stages"),
    "no tasks": (_with(_GRAPH_OK, tasks=_DROP), GraphFileError, "tasks"),
    "tasks not names": (_with(_GRAPH_OK, tasks=[{"name": "A"}]), GraphFileError, "tasks"),
    "tasks repeat": (_with(_GRAPH_OK, tasks=["A", "A", "B"]), GraphFileError, "tasks"),
    "dep unknown task": (_with(_GRAPH_OK, intra_iter_deps=[["B", "Z"]]), GraphFileError, "Z"),
    "dep arity": (_with(_GRAPH_OK, inter_iter_deps=[["A", "B", 1, 2]]), GraphFileError, "inter_iter_deps[0]"),
    "distance negative": (_with(_GRAPH_OK, inter_iter_deps=[["A", "B", -1]]), GraphFileError, "inter_iter_deps[0]"),
    "deps not list": (_with(_GRAPH_OK, inter_iter_deps="A<-B"), GraphFileError, "inter_iter_deps"),
}

BAD_COST_FILES: Dict[str, Tuple[Any, type, str]] = {
    "syntax": ('{"schema": ', CostModelError, "line 1"),
    "top level list": ([], CostModelError, ""),
    "wrong schema": (_with(_COST_OK, schema="cost"), CostModelError, "schema"),
    "no schema": (_with(_COST_OK, schema=_DROP), CostModelError, "schema"),
    "version 4": (_with(_COST_OK, version=4), CostModelError, "version"),
    "cores in version 2": (_with(_COST_OK, version=2, cores=2), CostModelError, "version"),
    "cores zero": (_with(_COST_OK, version=3, cores=0), CostModelError, "cores"),
    "unknown top field": (_with(_COST_OK, device="gpu"), CostModelError, "device"),
    "no tasks": (_with(_COST_OK, tasks=_DROP), CostModelError, "tasks"),
    "empty tasks": (_with(_COST_OK, tasks={}), CostModelError, "tasks"),
    "task entry number": (_with(_COST_OK, tasks={"A": 0.001}), CostModelError, "tasks.A"),
    "unknown task field": (_with(_COST_OK, tasks={"A": {"host_s": 0.1, "gpu_s": 0.2}}), CostModelError, "gpu_s"),
    "missing host_s": (_with(_COST_OK, tasks={"A": {"device_s": 0.1}}), CostModelError, "tasks.A"),
    "negative host_s": (_with(_COST_OK, tasks={"A": {"host_s": -0.1}}), CostModelError, "tasks.A.host_s"),
    "host_s string": (_with(_COST_OK, tasks={"A": {"host_s": "1ms"}}), CostModelError, "tasks.A.host_s"),
    "host_s bool": (_with(_COST_OK, tasks={"A": {"host_s": True}}), CostModelError, "tasks.A.host_s"),
    "device_s NaN": ('{"schema": "swpipe-cost-model", "version": 1, "tasks": {"A": {"host_s": 0, "device_s": NaN}}}',
                     CostModelError, "tasks.A.device_s"),
    "device_s Infinity": ('{"schema": "swpipe-cost-model", "version": 1, "tasks": {"A": {"host_s": Infinity}}}',
                          CostModelError, "tasks.A.host_s"),
    "unknown resource tag": (_with(_COST_OK, tasks={"A": {"host_s": 0.1, "resources": ["nvlink"]}}),
                             CostModelError, "tasks.A.resources"),
    "resources string": (_with(_COST_OK, tasks={"A": {"host_s": 0.1, "resources": "pcie"}}),
                         CostModelError, "tasks.A.resources"),
    "repeated resource": (_with(_COST_OK, tasks={"A": {"host_s": 0.1, "resources": ["pcie", "pcie"]}}),
                          CostModelError, "tasks.A.resources"),
    "machine not string": (_with(_COST_OK, machine=3), CostModelError, "machine"),
}


def _load_plan(path):
    return autosched_graph.load_plan(path)


def _load_graph(path):
    return autosched_graph.load_task_graph(path)


def _load_costs(path):
    return autosched_costs.CostModel.load(path)


FILE_KINDS: Dict[str, Tuple[Dict[str, Tuple[Any, type, str]], Callable[[str], Any], Any]] = {
    "plan": (BAD_PLAN_FILES, _load_plan, _PLAN_OK),
    "task-graph": (BAD_GRAPH_FILES, _load_graph, _GRAPH_OK),
    "cost-model": (BAD_COST_FILES, _load_costs, _COST_OK),
}


def write_doc(path, doc: Any) -> str:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    path.write_text(text, encoding="utf-8")
    return str(path)


def check_bad_file(kind: str, case: str, tmp_path) -> BaseException:
    """Load one malformed file; return the error after checking it names the file, the field and a fix."""
    cases, load, _ = FILE_KINDS[kind]
    doc, exc_type, field = cases[case]
    path = write_doc(tmp_path / f"{kind}.json", doc)
    with pytest.raises(exc_type) as info:
        load(path)
    msg = str(info.value)
    assert field in msg, f"{kind}/{case}: field {field!r} not named in {msg!r}"
    if exc_type is PlanError:
        assert info.value.fix and "Fix:" in msg, f"{kind}/{case}: no fix in {msg!r}"
    else:
        assert path in msg, f"{kind}/{case}: file not named in {msg!r}"
        fix = msg.split("Fix: ", 1)[1] if "Fix: " in msg else ""
        assert len(fix) > 5, f"{kind}/{case}: no fix in {msg!r}"
    return info.value


@pytest.mark.parametrize("kind,case", [(k, c) for k, (cases, _, _) in FILE_KINDS.items() for c in cases])
def test_malformed_file_error_names_file_field_and_fix(kind, case, tmp_path):
    check_bad_file(kind, case, tmp_path)


@pytest.mark.parametrize("kind", sorted(FILE_KINDS))
def test_the_well_formed_base_of_each_bad_file_loads(kind, tmp_path):
    """The bad files differ from a good one in one field: the good one must load (else the cases prove nothing)."""
    _, load, good = FILE_KINDS[kind]
    assert load(write_doc(tmp_path / "ok.json", good)) is not None


def test_missing_file_is_file_not_found(tmp_path):
    for _, load, _ in FILE_KINDS.values():
        with pytest.raises(FileNotFoundError):
            load(str(tmp_path / "absent.json"))
