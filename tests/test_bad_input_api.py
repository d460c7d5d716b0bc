"""Bad input at the API fails where it is written, with a message naming what is wrong and the fix.

Duplicate task names, a non-callable task function, a plain dict as costs,
nonsensical command-line numbers; and the profile report shows the host and
device time a cost model is built from, next to exposed time.
"""

from __future__ import annotations

import re

import pytest

from swpipe import (PipelinePlan, PipelineTask, PlanError, SWPipeline, TaskSchedule, auto_schedule, lower_bounds,
                    simulate, validate, what_if)
from swpipe.cli import main
from autosched.model.costs import CostModel, CostModelError, TaskCost
from autosched.search.options import Constraints, SolverOptions
from swpipe_core.measure.profiler import TaskProfiler


def load(ctx):
    ctx.x = ctx.batch


def step(ctx):
    ctx.y = ctx.x


def _two_tasks_one_name() -> PipelinePlan:
    return PipelinePlan({PipelineTask("A", load): TaskSchedule(0), PipelineTask("A", step): TaskSchedule(1)})


def test_two_tasks_with_one_name_do_not_merge_and_validate_names_both():
    plan = _two_tasks_one_name()
    assert len(plan.schedule) == 2, "the second task silently replaced the first one's schedule"
    with pytest.raises(PlanError) as info:
        validate(plan)
    msg = str(info.value)
    assert info.value.rule == "unique-names"
    assert "PipelineTask('A', load)" in msg and "PipelineTask('A', step)" in msg
    assert "unique name" in info.value.fix


def test_swpipeline_rejects_two_tasks_with_one_name_before_running():
    with pytest.raises(PlanError, match=r"unique-names.*'A', load.*'A', step"):
        SWPipeline(_two_tasks_one_name(), device="cpu")


def test_one_task_object_reused_or_rebound_still_equals_itself():
    bound = PipelineTask("A", load)
    assert bound == PipelineTask("A", load) and bound == PipelineTask("A") and bound == "A"
    plan = PipelinePlan({bound: TaskSchedule(0)})
    assert plan.schedule[PipelineTask("A")] == TaskSchedule(0)


def test_non_callable_fn_is_rejected_at_construction_with_the_fix():
    with pytest.raises(TypeError) as info:
        PipelineTask("Z", 3)
    msg = str(info.value)
    assert "'Z'" in msg and "not callable" in msg and "int" in msg
    assert "lambda ctx" in msg and "None for an analysis-only task" in msg


@pytest.mark.parametrize("name", ["", None, 7])
def test_task_name_must_be_a_non_empty_string(name):
    with pytest.raises(TypeError, match="give a non-empty string"):
        PipelineTask(name, load)


def _pipelined() -> PipelinePlan:
    return PipelinePlan({"Load": TaskSchedule(0, thread_group="io"), "Step": TaskSchedule(1)},
                        intra_iter_deps=[("Step", "Load")])


def test_a_dict_of_floats_is_seconds_of_host_time_everywhere():
    plan, seconds = _pipelined(), {"Load": 0.002, "Step": 0.003}
    model = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    assert simulate(plan, seconds).period == pytest.approx(simulate(plan, model).period)
    assert lower_bounds(plan, seconds).value == pytest.approx(lower_bounds(plan, model).value)
    table = what_if(plan, seconds, {"Step": 2.0})
    assert table["period_s"].iloc[1] == pytest.approx(0.006)
    auto, report = auto_schedule(plan, seconds, Constraints(max_depth=2, max_threads=2),
                                 solver=SolverOptions(time_limit_s=5))
    assert report.period_s == pytest.approx(0.003)


@pytest.mark.parametrize("bad", [[0.002, 0.003], 0.005, "costs.json"])
def test_costs_of_another_type_say_how_to_build_a_cost_model(bad):
    with pytest.raises(CostModelError) as info:
        simulate(_pipelined(), bad)
    msg = str(info.value)
    assert type(bad).__name__ in msg and "not a CostModel" in msg
    assert "CostModel.load(" in msg and "CostModel.from_profile(" in msg and "{task_name: seconds}" in msg


def test_a_dict_with_a_non_time_value_names_the_task():
    with pytest.raises(CostModelError, match=r"tasks\.Step.*not a TaskCost"):
        simulate(_pipelined(), {"Load": 0.002, "Step": "fast"})


@pytest.mark.parametrize("argv, flag, bound", [
    (["plan", "--pipeline", "base", "--costs", "c.json", "--time-limit", "-5"], "--time-limit", "time > 0"),
    (["plan", "--pipeline", "base", "--costs", "c.json", "--time-limit", "0"], "--time-limit", "time > 0"),
    (["plan", "--pipeline", "base", "--costs", "c.json", "--max-depth", "0"], "--max-depth", "integer >= 1"),
    (["plan", "--pipeline", "base", "--costs", "c.json", "--max-threads", "-1"], "--max-threads", "integer >= 1"),
    (["simulate", "--pipeline", "base", "--costs", "c.json", "--iterations", "1"], "--iterations", "integer >= 2"),
    (["simulate", "--pipeline", "base", "--costs", "c.json", "--iterations", "many"], "--iterations", "integer >= 2"),
    (["show", "base", "--periods", "0"], "--periods", "integer >= 1"),
    (["demo", "--iters", "0"], "--iters", "integer >= 1"),
    (["demo", "--batch-size", "-3"], "--batch-size", "integer >= 1"),
])
def test_cli_rejects_nonsensical_numbers_naming_the_flag_and_the_range(argv, flag, bound, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and bound in err, err


def test_profile_report_prints_host_device_and_exposed_time_per_task():
    plan = PipelinePlan({PipelineTask("Load", load): TaskSchedule(0), PipelineTask("Step", step): TaskSchedule(0)},
                        intra_iter_deps=[("Step", "Load")])
    with SWPipeline(plan, device="cpu") as pipe:
        result = TaskProfiler(pipe, num_warmup=1, num_measure=3, num_rounds=1).profile(1)
    text = result.format_report()
    header = next(line for line in text.splitlines() if line.strip().startswith("Task"))
    assert header.split() == ["Task", "Exposed", "%", "baseline", "Host", "Device"]
    for name in ("Load", "Step"):
        row = next(line for line in text.splitlines() if line.split()[:1] == [name])
        assert f"{result.host_s[name] * 1e3:.3f}ms" in row
    assert "CostModel.from_profile takes host_s = Host" in text


@pytest.mark.parametrize("field,value", [("max_depth", "3"), ("max_threads", 0), ("device", "tpu"),
                                         ("streams", "memcpy"), ("frozen", ["A"]), ("globally_ordered", "A"),
                                         ("max_memory_bytes", 0)])
def test_a_bad_constraint_is_an_error_at_construction_naming_the_field(field, value):
    from autosched._fields import OptionError

    with pytest.raises(OptionError, match=re.escape(f"Constraints({field}={value!r}): expected ")):
        Constraints(**{field: value})


@pytest.mark.parametrize("field,value", [("rounds", 0), ("top", 1.5), ("keep_known", 1), ("margin_pct", "3")])
def test_a_bad_verify_option_is_an_error_at_construction_naming_the_field(field, value):
    from autosched._fields import OptionError
    from autosched.verify.loop import VerifyOptions

    with pytest.raises(OptionError, match=re.escape(f"VerifyOptions({field}={value!r}): expected ")):
        VerifyOptions(**{field: value})


@pytest.mark.parametrize("field,value", [("time_limit_s", -1.0), ("time_limit_s", "5"), ("seed", -1),
                                         ("method", "annealing"), ("cpsat_max_tasks", 2.5), ("beam_width", 0),
                                         ("beam_rounds", "20"), ("num_workers", 0), ("num_iterations", 1),
                                         ("time_unit_s", 0.0), ("progress", "yes")])
def test_a_bad_solver_option_is_an_error_at_construction_naming_the_field(field, value):
    from autosched._fields import OptionError

    with pytest.raises(OptionError, match=re.escape(f"SolverOptions({field}={value!r}): expected ")):
        SolverOptions(**{field: value})


def test_a_solver_option_given_to_constraints_names_its_new_home_and_the_fix():
    with pytest.raises(TypeError) as info:
        Constraints(max_depth=2, time_limit_s=5)
    msg = str(info.value)
    assert "time_limit_s is a solver option" in msg and "solver=SolverOptions(time_limit_s=5)" in msg
    with pytest.raises(TypeError, match=re.escape("seed, method are solver options") + ".*"
                       + re.escape("solver=SolverOptions(seed=1, method='beam')")):
        Constraints(seed=1, method="beam")
    with pytest.raises(TypeError, match=re.escape("constraints=Constraints(max_depth=2)")):
        SolverOptions(max_depth=2)


@pytest.mark.parametrize("kwargs,argument,expected", [
    (dict(solver={"time_limit_s": 5}), "solver", "SolverOptions"),
    (dict(solver=Constraints(max_depth=2)), "solver", "SolverOptions"),
    (dict(constraints=SolverOptions(time_limit_s=5)), "constraints", "Constraints"),
    (dict(constraints={"max_depth": 2}), "constraints", "Constraints"),
    (dict(verify="yes"), "verify", "VerifyOptions"),
])
def test_auto_schedule_refuses_options_of_another_type_naming_the_argument(kwargs, argument, expected):
    costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    with pytest.raises(TypeError) as info:
        auto_schedule(_pipelined(), costs, **kwargs)
    msg = str(info.value)
    assert f"auto_schedule({argument}=...)" in msg and expected in msg, msg
    if isinstance(kwargs.get(argument), (Constraints, SolverOptions)):  # the type given names where it goes
        assert f"as {'solver' if argument == 'constraints' else 'constraints'}=" in msg, msg
