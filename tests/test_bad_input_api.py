"""Bad input at the API fails where it is written, with a message naming what is wrong and the fix.

Duplicate task names (one task), a non-callable task function, a plain dict as costs,
nonsensical command-line numbers; and the profile report shows the host and
device time a cost model is built from, next to exposed time.
"""

from __future__ import annotations

import re

import pytest

from swpipe import (PipelinePlan, PipelineTask, SWPipeline, TaskSchedule, auto_schedule, lower_bounds,
                    simulate, validate, what_if)
from swpipe.cli import main
from autosched.model.costs import CostModel, CostModelError, TaskCost
from autosched.search.options import Constraints, OptionError, SolverOptions
from swpipe_core.measure.profiler import TaskProfiler


def load(ctx):
    ctx.x = ctx.batch


def step(ctx):
    ctx.y = ctx.x


def test_two_tasks_with_one_name_are_one_task_and_run_as_the_first_keys_function():
    """The name is a task's identity (the API reference): as keys of one dict two tasks of one name merge, as any
    two equal keys do; the plan holds one task, the first key's function with the last value's schedule."""
    plan = PipelinePlan({PipelineTask("A", load): TaskSchedule(0), PipelineTask("A", step): TaskSchedule(1)})
    assert plan.task_names == ["A"] and plan.task("A").fn is load and plan.sched("A") == TaskSchedule(1)
    validate(plan)


def test_one_task_object_reused_or_rebound_still_equals_itself():
    bound = PipelineTask("A", load)
    assert bound == PipelineTask("A", load) and bound == PipelineTask("A") and bound == "A"
    plan = PipelinePlan({bound: TaskSchedule(0)})
    assert plan.schedule[PipelineTask("A")] == TaskSchedule(0)


def test_non_callable_fn_is_rejected_at_construction_with_the_fix():
    with pytest.raises(TypeError) as info:
        PipelineTask("Z", 3)
    msg = str(info.value)
    assert "'Z'" in msg and "(int)" in msg  # the task and the type given
    # the fix is the behaviour: a function of the context, or None for an analysis-only task
    assert "lambda ctx: ...), or None for an analysis-only task" in msg


@pytest.mark.parametrize("name", ["", None, 7])
def test_task_name_must_be_a_non_empty_string(name):
    with pytest.raises(TypeError, match=re.escape(repr(name))):  # the name given
        PipelineTask(name, load)


def _pipelined() -> PipelinePlan:
    return PipelinePlan({"Load": TaskSchedule(0, thread_group="io"), "Step": TaskSchedule(1)},
                        intra_iter_deps=[("Step", "Load")])


def test_a_dict_of_floats_is_seconds_of_host_time_everywhere():
    plan, seconds = _pipelined(), {"Load": 0.002, "Step": 0.003}
    model = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    assert simulate(plan, seconds).period_s == pytest.approx(simulate(plan, model).period_s)
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
    assert (info.value.field, info.value.value) == ("costs", bad) and type(bad).__name__ in str(info.value)
    assert "CostModel.load(" in info.value.fix and "CostModel.from_profile(" in info.value.fix  # the ways to build one


def test_a_dict_with_a_non_time_value_names_the_task():
    with pytest.raises(CostModelError) as info:
        simulate(_pipelined(), {"Load": 0.002, "Step": "fast"})
    assert (info.value.task, info.value.field, info.value.value) == ("Step", "tasks.Step", "fast")


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
    assert next(line for line in text.splitlines() if "host_s" in line).split()[:4] == [
        "CostModel.from_profile", "takes", "host_s", "="]  # which column the cost model reads


@pytest.mark.parametrize("field,value", [("max_depth", "3"), ("max_threads", 0), ("device", "tpu"),
                                         ("streams", "memcpy"), ("frozen", ["A"]), ("globally_ordered", "A"),
                                         ("max_memory_bytes", 0)])
def test_a_bad_constraint_is_an_error_at_construction_naming_the_field(field, value):
    with pytest.raises(OptionError) as info:
        Constraints(**{field: value})
    assert (info.value.given_to, info.value.field, info.value.value) == ("Constraints", field, value)
    assert info.value.expected  # what the field takes


@pytest.mark.parametrize("field,value", [("rounds", 0), ("top", 1.5), ("keep_known", 1), ("margin_pct", "3")])
def test_a_bad_verify_option_is_an_error_at_construction_naming_the_field(field, value):
    from autosched.verify.loop import VerifyOptions

    with pytest.raises(OptionError) as info:
        VerifyOptions(**{field: value})
    assert (info.value.given_to, info.value.field, info.value.value) == ("VerifyOptions", field, value)
    assert info.value.expected


@pytest.mark.parametrize("field,value", [("time_limit_s", -1.0), ("time_limit_s", "5"), ("seed", -1),
                                         ("method", "annealing"), ("cpsat_max_tasks", 2.5), ("beam_width", 0),
                                         ("beam_rounds", "20"), ("num_workers", 0), ("num_iterations", 1),
                                         ("time_unit_s", 0.0), ("progress", "yes")])
def test_a_bad_solver_option_is_an_error_at_construction_naming_the_field(field, value):
    with pytest.raises(OptionError) as info:
        SolverOptions(**{field: value})
    assert (info.value.given_to, info.value.field, info.value.value) == ("SolverOptions", field, value)
    assert info.value.expected


def test_a_solver_option_given_to_constraints_names_its_new_home_and_the_fix():
    with pytest.raises(TypeError) as info:  # an OptionError is a TypeError, as an unknown keyword is
        Constraints(max_depth=2, time_limit_s=5)
    assert (info.value.given_to, info.value.field, info.value.home) == ("Constraints", "time_limit_s", "SolverOptions")
    assert "solver=SolverOptions(time_limit_s=5)" in str(info.value)  # the call to write instead
    with pytest.raises(OptionError) as info:
        Constraints(seed=1, method="beam")
    assert (info.value.field, info.value.home) == ("seed", "SolverOptions")
    assert "solver=SolverOptions(seed=1, method='beam')" in str(info.value)
    with pytest.raises(OptionError) as info:
        SolverOptions(max_depth=2)
    assert (info.value.given_to, info.value.field, info.value.home) == ("SolverOptions", "max_depth", "Constraints")


@pytest.mark.parametrize("kwargs,argument,expected", [
    (dict(solver={"time_limit_s": 5}), "solver", "SolverOptions"),
    (dict(solver=Constraints(max_depth=2)), "solver", "SolverOptions"),
    (dict(constraints=SolverOptions(time_limit_s=5)), "constraints", "Constraints"),
    (dict(constraints={"max_depth": 2}), "constraints", "Constraints"),
    (dict(verify="yes"), "verify", "VerifyOptions"),
])
def test_auto_schedule_refuses_options_of_another_type_naming_the_argument(kwargs, argument, expected):
    costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    with pytest.raises(TypeError) as info:  # an OptionError
        auto_schedule(_pipelined(), costs, **kwargs)
    assert (info.value.given_to, info.value.field, info.value.home) == ("auto_schedule", argument, expected)
