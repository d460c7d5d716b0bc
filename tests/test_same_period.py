"""Same-period dependencies: a task waits the task of the same period, which may work on a newer iteration."""

from __future__ import annotations

import threading

import pytest

from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.order import enqueue_order, period_local_graph
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.validate import PlanError, validate

pytestmark = pytest.mark.timeout(60)


def _plan(fns=None, **extra):
    """Prefetch (stage 0, thread io) of batch i+1 must be done before Backward (stage 1) of batch i goes on."""
    fns = fns or {}
    tasks = {n: PipelineTask(n, fns.get(n)) for n in ("Prefetch", "Backward")}
    return PipelinePlan({tasks["Prefetch"]: TaskSchedule(0, thread_group="io"),
                         tasks["Backward"]: TaskSchedule(1, thread_group="compute")},
                        intra_iter_deps=[("Backward", "Prefetch")], same_period_deps=[("Backward", "Prefetch")],
                        **extra)


def test_a_same_period_dep_waits_the_newer_iteration_of_the_lower_stage():
    plan = _plan()
    validate(plan)
    assert plan.same_period_edges() == [("Backward", "Prefetch", -1)]
    assert ("Backward", "Prefetch", -1) in plan.inter_edges()
    assert plan.declared_inter_edges() == []
    assert ("Prefetch", "Backward") in period_local_graph(plan).edges
    assert enqueue_order(plan) == ["Prefetch", "Backward"]
    assert enqueue_order(plan.replace(enqueue_policy="stage_descending")) == ["Prefetch", "Backward"]
    assert plan.replace(caller_group=None).same_period_deps == [("Backward", "Prefetch")]


def test_a_same_period_cycle_is_rejected_naming_it():
    # Prefetch(i) also waits Backward(i-1), which runs in the same period: the two wait each other
    plan = _plan(inter_iter_deps=[("Prefetch", "Backward", 1)])
    with pytest.raises(PlanError) as err:
        validate(plan)
    assert err.value.rule == "period-local-cycle" and set(err.value.tasks) == {"Prefetch", "Backward"}
    assert err.value.field == "same_period_deps"


@pytest.mark.parametrize("deps, rule", [([("Backward",)], "dep-format"), ([("Backward", "Nope")], "unknown-task"),
                                         ([("Backward", "Backward")], "self-dependency")])
def test_bad_same_period_deps_name_the_rule(deps, rule):
    with pytest.raises(PlanError) as err:
        validate(_plan().replace(same_period_deps=deps))
    assert err.value.rule == rule and "same" in str(err.value) + str(err.value.fix)


def test_the_simulator_serialises_the_two_tasks_of_a_period():
    from autosched.model.costs import CostModel, TaskCost
    from autosched.model.simulate import simulate

    costs = CostModel({"Prefetch": TaskCost(0.001), "Backward": TaskCost(0.001)})
    free = simulate(_plan().replace(same_period_deps=[]), costs, num_iterations=20)
    tied = simulate(_plan(), costs, num_iterations=20)
    assert free.period_s == pytest.approx(0.001)  # two threads, one task each per period
    assert tied.period_s == pytest.approx(0.002)  # Backward(i) starts after Prefetch(i+1) ends
    ends = {(e.task, e.iteration): (e.start, e.end) for e in tied.events if e.kind == "host"}
    for i in range(19):
        assert ends[("Backward", i)][0] >= ends[("Prefetch", i + 1)][1] - 1e-12
    assert ("Backward", 19) in ends  # the last Backward has no newer Prefetch and waits for none


def test_searchers_and_plan_files_refuse_same_period_deps_with_a_fix():
    from autosched.model.costs import CostModel, TaskCost
    from autosched.model.graph import plan_to_graph
    from autosched.search.options import Constraints, SolverOptions
    from swpipe import auto_schedule

    costs = CostModel({"Prefetch": TaskCost(0.001), "Backward": TaskCost(0.001)})
    with pytest.raises(ValueError, match="same_period_deps.*inter_iter_deps"):
        auto_schedule(_plan(), costs, Constraints(), solver=SolverOptions(time_limit_s=2))
    with pytest.raises(ValueError, match="same_period_deps.*inter_iter_deps"):
        plan_to_graph(_plan())


def _recording_fns(log, lock):
    def fn(name):
        def run(ctx):
            with lock:
                log.append((name, ctx.iter_idx))
        return run
    return {"Prefetch": fn("Prefetch"), "Backward": fn("Backward")}


def test_the_engine_runs_backward_after_the_newer_prefetch_and_drains():
    log, lock = [], threading.Lock()
    plan = _plan(_recording_fns(log, lock))
    with SWPipeline(plan, device="cpu") as pipe:
        pipe.run(range(12))
    pos = {entry: k for k, entry in enumerate(log)}
    assert sorted(pos) == sorted([(n, i) for n in ("Prefetch", "Backward") for i in range(12)])
    for i in range(11):
        assert pos[("Prefetch", i + 1)] < pos[("Backward", i)]


def test_a_serial_run_skips_the_wait_for_a_later_iteration():
    log, lock = [], threading.Lock()
    with SWPipeline(_plan(_recording_fns(log, lock)), device="cpu") as pipe:
        pipe.run_serial(iter(range(3)))
    assert log == [("Prefetch", 0), ("Backward", 0), ("Prefetch", 1), ("Backward", 1), ("Prefetch", 2),
                   ("Backward", 2)]
