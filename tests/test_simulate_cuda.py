"""The simulator's CUDA mode: device-bound periods, bounded device lag, caller group, stream identity.

All CPU-only (the simulator needs no GPU); they always run.
"""

from __future__ import annotations

import pytest

from autosched.model.costs import CostModel, TaskCost
from autosched.search.options import Constraints, SolverOptions
from swpipe import auto_schedule
from autosched.model.simulate import simulate
from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.validate import PlanError

DEVICE_MS = {"A": 30.0, "B": 20.0, "C": 50.0}


def _chain(depth: int = 2, caller_group="default") -> PipelinePlan:
    """A -> B -> C on one thread and one stream; C one stage later."""
    return PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0), "C": TaskSchedule(1)},
                        intra_iter_deps=[("B", "A"), ("C", "B")], pipeline_depth=depth, caller_group=caller_group)


def _chain_costs(host_per_device: float) -> CostModel:
    """Device 30/20/50 ms; each task's host part is ``host_per_device`` times its device part."""
    return CostModel({k: TaskCost(host_per_device * v * 1e-3, v * 1e-3) for k, v in DEVICE_MS.items()})


@pytest.mark.parametrize("n", [20, 50, 200])
def test_light_host_chain_period_is_the_stream_load_for_any_run_length(n):
    """The case that read 31.9 s / 79.9 s / 319.9 s (the whole run) before the window was fixed."""
    costs = CostModel({k: TaskCost(1e-6, v * 1e-3) for k, v in DEVICE_MS.items()})
    r = simulate(_chain(), costs, num_iterations=n, device="cuda")
    assert r.period_s == pytest.approx(0.100, rel=1e-9)
    assert r.binding == "stream:default"
    assert r.utilisation["stream:default"] == pytest.approx(1.0, rel=1e-6)
    assert r.utilisation["thread:default"] == pytest.approx(3e-6 / 0.1, rel=1e-6)
    assert r.num_iterations == n  # steady at once: the lengthening loop did not run
    assert r.window[1] - r.window[0] >= 8


@pytest.mark.parametrize("ratio", [1e-6, 1e-3, 0.1, 0.5, 2.0, 10.0, 1e3, 1e6])
@pytest.mark.parametrize("caller_group", ["default", None])
def test_chain_period_is_the_busier_of_thread_and_stream_for_any_host_device_ratio(ratio, caller_group):
    costs = _chain_costs(ratio)
    host, device = ratio * 0.1, 0.1
    r = simulate(_chain(caller_group=caller_group), costs, num_iterations=30, device="cuda")
    assert r.period_s == pytest.approx(max(host, device), rel=1e-9)
    busy = "thread:default" if host > device else "stream:default"
    assert r.binding == busy
    assert r.utilisation[busy] == pytest.approx(1.0, rel=1e-6)
    assert r.num_iterations <= 60


def test_balanced_chain_period_is_not_below_either_load():
    r = simulate(_chain(), _chain_costs(1.0), num_iterations=30, device="cuda")
    assert r.period_s >= 0.1 * (1 - 1e-9)
    assert r.period_s <= 0.2 + 1e-9  # never worse than fully serial


@pytest.mark.parametrize("lag", [0, 1, 3, None])
def test_host_waits_for_the_device_of_iteration_r_minus_max_device_lag(lag):
    """After retiring r the next period waits for the device of r - lag: iteration p enters only once
    iteration p - depth - lag has completed on the device, and the device-bound period is unchanged."""
    costs = CostModel({k: TaskCost(1e-6, v * 1e-3) for k, v in DEVICE_MS.items()})
    plan = _chain()
    r = simulate(plan, costs, num_iterations=40, device="cuda", max_device_lag=lag)
    bound = plan.pipeline_depth if lag is None else lag
    depth = plan.pipeline_depth
    tight = 0
    for p in range(depth + bound, r.num_iterations):
        j = p - depth - bound
        assert r.completion[j] <= r.entry[p] + 1e-12
        tight += abs(r.completion[j] - r.entry[p]) < 1e-9
    assert tight > 0  # the bound is what holds the host back (it is light)
    assert r.period_s == pytest.approx(0.1, rel=1e-9)
    assert abs(r.latency_growth) < 1e-9  # bounded run-ahead: latency does not grow


def test_larger_device_lag_lets_the_host_run_further_ahead():
    costs = CostModel({k: TaskCost(1e-6, v * 1e-3) for k, v in DEVICE_MS.items()})
    lat = [simulate(_chain(), costs, num_iterations=40, device="cuda", max_device_lag=lag).latency
           for lag in (0, 2, 6)]
    assert lat[0] < lat[1] < lat[2]


def test_max_device_lag_has_no_effect_on_cpu():
    costs = _chain_costs(0.5)
    a = simulate(_chain(), costs, num_iterations=30, max_device_lag=0)
    b = simulate(_chain(), costs, num_iterations=30, max_device_lag=5)
    assert a.completion == b.completion


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_bad_max_device_lag_is_rejected(bad):
    with pytest.raises(ValueError, match="max_device_lag"):
        simulate(_chain(), _chain_costs(1.0), num_iterations=10, device="cuda", max_device_lag=bad)


def _caller_plan(caller_group):
    """The caller's group runs A (stage 0, 3 ms); a worker runs B (stage 2, 1 ms) after it."""
    return PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(2, thread_group="w")},
                        intra_iter_deps=[("B", "A")], caller_group=caller_group)


def _caller_end(r, p: int) -> float:
    """When the caller group's tasks of period p ended (A(p) is its only one)."""
    return max(e.end for e in r.events if e.task == "A" and e.iteration == p and e.kind == "host")


def test_caller_group_inline_enqueues_the_next_period_after_its_own_tasks():
    costs = CostModel({"A": TaskCost(0.003), "B": TaskCost(0.001)})
    inline = simulate(_caller_plan("default"), costs, num_iterations=20)
    workers = simulate(_caller_plan(None), costs, num_iterations=20)
    assert all(inline.entry[p] >= _caller_end(inline, p - 1) - 1e-12 for p in range(1, 20))
    # on workers, fill_pipeline enqueues every period of the fill at once, before A(0) ends
    assert any(workers.entry[p] < _caller_end(workers, p - 1) - 1e-9 for p in range(1, 20))
    assert inline.period_s == pytest.approx(0.003) and workers.period_s == pytest.approx(0.003)


def test_caller_group_main_thread_overhead_adds_to_its_load():
    """The main thread runs the caller group and enqueues: its load is both."""
    costs = CostModel({"A": TaskCost(0.003), "B": TaskCost(0.001)})
    inline = simulate(_caller_plan("default"), costs, num_iterations=20, period_overhead_s=0.001)
    workers = simulate(_caller_plan(None), costs, num_iterations=20, period_overhead_s=0.001)
    assert inline.period_s == pytest.approx(0.004)
    assert workers.period_s == pytest.approx(0.003)


def test_a_caller_group_with_no_tasks_changes_nothing():
    costs = CostModel({"A": TaskCost(0.003), "B": TaskCost(0.001)})
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(2, thread_group="w")},
                        intra_iter_deps=[("B", "A")])
    a = simulate(plan, costs, num_iterations=20)
    b = simulate(plan.replace(caller_group=None), costs, num_iterations=20)
    assert a.completion == b.completion


def test_default_stream_and_a_stream_named_default_are_never_merged():
    """None is the device's default stream; the string "default" is another stream (validate rejects it)."""
    plan = PipelinePlan({"A": TaskSchedule(0, stream=None, thread_group="a"),
                         "B": TaskSchedule(0, stream="default", thread_group="b")}, caller_group=None)
    costs = CostModel({"A": TaskCost(1e-4, 0.01), "B": TaskCost(1e-4, 0.01)})
    try:
        r = simulate(plan, costs, num_iterations=20, device="cuda")
    except PlanError as exc:  # the rule that says to use None
        assert "None" in str(exc)
        return
    streams = {e.stream for e in r.events if e.kind == "device"}
    assert len(streams) == 2
    assert r.period_s == pytest.approx(0.01, rel=1e-6)  # merged, they would add up to 20 ms


def test_auto_schedule_on_cuda_reports_sane_figures_for_a_device_bound_model():
    costs = CostModel({k: TaskCost(1e-6, v * 1e-3) for k, v in DEVICE_MS.items()})
    plan, report = auto_schedule((["A", "B", "C"], [("B", "A"), ("C", "B")]), costs,
                                 Constraints(max_depth=2, device="cuda", streams=[None, "s1"]),
                                 solver=SolverOptions(time_limit_s=5))
    assert report.serial_period_s == pytest.approx(0.1, rel=1e-4)  # the serial loop: the host runs ahead of the device
    assert report.lower_bound_s == pytest.approx(0.05, rel=1e-6)  # the longest device part, C
    assert report.lower_bound_s - 1e-9 <= report.period_s <= 0.1 + 1e-6
    assert 0.0 <= report.gap_pct < 5.0
    assert report.binding.startswith("stream:")
    assert report.serial_period_s / report.period_s >= 1.9


@pytest.mark.parametrize("caller_group", ["default", None])
@pytest.mark.parametrize("lag", [0, None])
def test_simulated_cuda_timelines_obey_the_contract(caller_group, lag):
    """Host and device parts of random plans on two streams: dependencies with distance, FIFO groups,
    depth in flight, sequencer order (tests/conftest.py check_contract)."""
    import random

    from conftest import check_contract
    from test_contract_replay import random_plan

    rng = random.Random(7)
    for _ in range(6):
        plan, sleeps = random_plan(rng, caller_group)
        sched = {t: plan.sched(t).__class__(plan.stage(t), stream=rng.choice([None, "s1"]),
                                            thread_group=plan.sched(t).thread_group,
                                            globally_ordered=plan.sched(t).globally_ordered)
                 for t in plan.task_names}
        plan = plan.replace(schedule=sched)
        costs = CostModel({t: TaskCost(s / 10, s * rng.choice([0.5, 2.0])) for t, s in sleeps.items()})
        r = simulate(plan, costs, num_iterations=24, device="cuda", max_device_lag=lag)
        check_contract(plan, r.events, r.num_iterations)
