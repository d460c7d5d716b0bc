"""`swpipe plan` and `swpipe simulate`: search from files, print the report, write a plan that loads and simulates."""

from __future__ import annotations

import json

import pytest
from conftest import schedule_rows, word_after

from autosched.model.costs import CostModel, TaskCost
from autosched.model.graph import load_plan, save_plan, save_task_graph, task_graph
from autosched.model.simulate import simulate
from swpipe.cli import main
from swpipe.commands.plan import parse_freeze
from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.validate import validate


@pytest.fixture
def files(tmp_path):
    graph = task_graph(["H2D", "Dist", "Fwd", "Bwd"], [("Dist", "H2D"), ("Fwd", "Dist"), ("Bwd", "Fwd")])
    costs = CostModel({"H2D": TaskCost(0.002), "Dist": TaskCost(0.003), "Fwd": TaskCost(0.004),
                       "Bwd": TaskCost(0.005, 0.0, ("comm:nccl",))}, machine="test", method="by hand")
    g, c = tmp_path / "graph.json", tmp_path / "costs.json"
    save_task_graph(graph, g)
    costs.save(c)
    return g, c, costs


def test_plan_command_prints_report_and_writes_a_runnable_plan(files, tmp_path, capsys):
    g, c, costs = files
    out = tmp_path / "plan.json"
    rc = main(["plan", "--tasks", str(g), "--costs", str(c), "--max-depth", "3", "--max-threads", "2",
               "--time-limit", "10", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    plan = load_plan(out)
    validate(plan)
    period = simulate(plan, costs).period_s
    assert word_after(text, "period") == f"{period * 1e3:.3f}"  # the report's period is the plan's
    assert word_after(text, "lower", "bound") == "7.000" and "Fwd" in schedule_rows(text)[1]
    assert text.strip().splitlines()[-1].split()[-1] == str(out)  # where the plan was written
    assert period == pytest.approx(0.007)      # 14 ms of work on two threads, the 5 ms Bwd fits beside
    assert plan.sched("Bwd").globally_ordered  # a collective (comm tag) is globally ordered
    assert plan.pipeline_depth <= 3


@pytest.mark.parametrize("flag, folded", [([], True), (["--no-calibrated"], False)])
def test_plan_command_searches_with_the_cost_models_calibration_unless_told_not_to(files, tmp_path, capsys, flag,
                                                                                   folded):
    from swpipe_core.measure.calibrate import MachineCalibration

    g, _, costs = files
    c = tmp_path / "calibrated.json"
    CostModel(costs.tasks, machine_calibration=MachineCalibration(cores_free=1.0, cpu_count=2)).save(c)
    out = tmp_path / "plan.json"
    assert main(["plan", "--tasks", str(g), "--costs", str(c), "--time-limit", "10", "--out", str(out), *flag]) == 0
    text = capsys.readouterr().out
    assert ("folded" in text.splitlines()[1]) == folded  # the report's note on the calibration
    assert (word_after(text, "period") == "14.000") == folded  # one free core: all 14 ms of work in turn


def test_plan_command_takes_a_saved_plan_as_baseline(files, tmp_path, capsys):
    _, c, costs = files
    given = PipelinePlan({n: TaskSchedule(0) for n in ["H2D", "Dist", "Fwd", "Bwd"]},
                         intra_iter_deps=[("Dist", "H2D"), ("Fwd", "Dist"), ("Bwd", "Fwd")])
    src = tmp_path / "given.json"
    save_plan(given, src)
    rc = main(["plan", "--tasks", str(src), "--costs", str(c), "--time-limit", "10", "--method", "beam",
               "--freeze", "Bwd:stage=2", "--out", str(tmp_path / "p.json")])
    text = capsys.readouterr().out
    assert rc == 0
    assert word_after(text, "input", "plan") == "14.000"
    assert load_plan(tmp_path / "p.json").stage("Bwd") == 2


def test_simulate_command_prints_period_and_writes_trace(files, tmp_path, capsys):
    _, c, costs = files
    plan = PipelinePlan({"H2D": TaskSchedule(0, thread_group="io"), "Dist": TaskSchedule(0, thread_group="io"),
                         "Fwd": TaskSchedule(1), "Bwd": TaskSchedule(1)},
                        intra_iter_deps=[("Dist", "H2D"), ("Fwd", "Dist"), ("Bwd", "Fwd")])
    p, trace = tmp_path / "plan.json", tmp_path / "trace.json"
    save_plan(plan, p)
    rc = main(["simulate", "--plan", str(p), "--costs", str(c), "--trace", str(trace)])
    text = capsys.readouterr().out
    assert rc == 0
    assert word_after(text, "period") == "9.000"
    assert json.loads(trace.read_text())["traceEvents"]


@pytest.mark.parametrize("argv,needle", [
    (["plan", "--tasks", "missing.json", "--costs", "missing.json"], "missing.json"),
    (["simulate", "--plan", "missing.json", "--costs", "missing.json"], "missing.json"),
])
def test_missing_files_are_a_clear_error(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_plan_command_rejects_cost_model_without_a_task(files, tmp_path, capsys):
    g, _, _ = files
    partial = tmp_path / "partial.json"
    CostModel({"H2D": TaskCost(0.001)}).save(partial)
    assert main(["plan", "--tasks", str(g), "--costs", str(partial), "--out", str(tmp_path / "x.json")]) == 2
    assert "Dist" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_parse_freeze_reads_fields_and_rejects_garbage():
    assert parse_freeze(["Fwd:stream=default,stage=1", "H2D:thread_group=io,stream=memcpy"]) == {
        "Fwd": {"stream": None, "stage": 1}, "H2D": {"thread_group": "io", "stream": "memcpy"}}
    with pytest.raises(ValueError, match="TASK:field=value"):
        parse_freeze(["Fwd"])
    with pytest.raises(ValueError, match="colour"):
        parse_freeze(["Fwd:colour=red"])
