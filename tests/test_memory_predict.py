"""Predicting bytes in flight, the least memory any plan needs, cost-model schema 2, searching under a cap."""

from __future__ import annotations

import glob
import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from autosched.search.bounds import lower_bounds
from autosched.model.costs import CostModel, CostModelError, TaskCost
from autosched.model.graph import task_graph
from autosched.model.memcurve import MemoryChanges
from autosched.model.memory import min_memory, predict_memory
from autosched.search.memcap import MemoryCapError
from autosched.search.tradeoff import pareto_front
from autosched.search.options import Constraints, SolverOptions
from swpipe import auto_schedule
from autosched.model.simulate import simulate
from autosched.model.whatif import what_if
from swpipe_core import pipelines
from swpipe_core.plan import PipelinePlan, TaskSchedule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _two_stage(load_bytes=1000.0, step_free=1000.0, step_add=10.0, batch=100.0):
    costs = CostModel({"Load": TaskCost(0.001, add_bytes=load_bytes),
                       "Step": TaskCost(0.002, add_bytes=step_add, free_bytes=step_free)}, batch_bytes=batch)
    plan = PipelinePlan({"Load": TaskSchedule(0, thread_group="a"), "Step": TaskSchedule(1, thread_group="b")},
                        intra_iter_deps=[("Step", "Load")])
    return plan, costs


def test_live_bytes_match_hand_computed_timeline():
    # Load (1 ms, +1000) on thread a, Step (2 ms, -1000 +10) one stage later on thread b; batch 100.
    # t=0: contexts 0 and 1 enter (200). Load(0) ends at 1 (1200), Load(1) at 2 (2200). Step(0) ends at 3:
    # 2200 - 990 = 1210, context 0 retires with its 110 (1100), context 2 enters (1200); Load(2) ends at 4
    # (2200); Step(1) at 5 (1200 again). Steady state: 1200 for 1 ms, 2200 for 1 ms, period 2 ms.
    plan, costs = _two_stage()
    sim = simulate(plan, costs, num_iterations=30)
    m = sim.memory
    assert sim.period_s == pytest.approx(0.002)
    expected = {0.0005: 200, 0.0015: 1200, 0.0025: 2200, 0.0035: 1200, 0.0045: 2200, 0.0055: 1200}
    assert {t: m.at(t) for t in expected} == pytest.approx(expected)
    assert m.peak_bytes == pytest.approx(2200) and m.peak_time == pytest.approx(0.002)
    assert m.iterations_at_peak == 2
    assert m.mean_bytes == pytest.approx(1700)
    assert (sim.peak_bytes, sim.mean_bytes) == (m.peak_bytes, m.mean_bytes)


def test_serial_plan_holds_one_context():
    _, costs = _two_stage()
    serial = PipelinePlan({"Load": TaskSchedule(0), "Step": TaskSchedule(0)}, intra_iter_deps=[("Step", "Load")])
    m = simulate(serial, costs, num_iterations=10).memory
    assert m.peak_bytes == pytest.approx(1100) and m.iterations_at_peak == 1


def test_cuda_context_lives_until_device_work_completes():
    # device-bound: the host retires each iteration after 1 ms, its device work takes 5 ms; the engine keeps
    # the context until the device events complete, so contexts pile up on CUDA and not on CPU
    costs = CostModel({"A": TaskCost(0.001, 0.005, add_bytes=100)})
    plan = PipelinePlan({"A": TaskSchedule(0)})
    cpu = predict_memory(simulate(plan, costs, num_iterations=10, device="cpu"))
    cuda = predict_memory(simulate(plan, costs, num_iterations=10, device="cuda"))
    assert cpu.iterations_at_peak == 1 and cpu.peak_bytes == 100
    assert cuda.iterations_at_peak > 1 and cuda.peak_bytes == 100 * cuda.iterations_at_peak


def test_predict_rejects_unknown_figures():
    plan, costs = _two_stage()
    with pytest.raises(ValueError, match="figures='gpu'"):
        predict_memory(simulate(plan, costs), figures="gpu")


def test_min_memory_matches_hand_computed_downsets():
    # A -> B, A -> C; A +100, B -100, C +50, batch 10.
    # At A's end (B, C not yet): 110. At B's end: {A,B} (+C only adds): 10. At C's end: {A,C} plus B's free: 60.
    # Least over all downsets: {} or {A,B} -> 0, so F = 10. Critical path A -> C = 3 ms.
    costs = CostModel({"A": TaskCost(0.001, add_bytes=100), "B": TaskCost(0.001, free_bytes=100),
                       "C": TaskCost(0.002, add_bytes=50)}, batch_bytes=10)
    b = min_memory(["A", "B", "C"], [("B", "A"), ("C", "A")], costs, period_s=0.0001)
    assert (b.single_iteration, b.task, b.floor_bytes) == (110, "A", 10)
    assert b.critical_path_s == pytest.approx(0.003)
    assert b.littles_law == pytest.approx(10 * 0.003 / 0.0001)
    assert b.value == pytest.approx(300)
    with pytest.raises(ValueError, match="period_s=0"):
        min_memory(["A"], [], costs, period_s=0)


def test_lower_bounds_carry_min_memory_only_with_bytes():
    g = task_graph(["Load", "Step"], [("Step", "Load")])
    _, costs = _two_stage()
    b = lower_bounds(g, costs, max_threads=2, max_depth=2)
    assert b.memory is not None and b.memory.period_s == b.value and b.memory.value >= 1100
    assert f"memory: {b.memory}" in b.summary()
    plain = CostModel({"Load": TaskCost(0.001), "Step": TaskCost(0.002)})
    assert lower_bounds(g, plain, max_depth=2).memory is None


_DLRM_COSTS = CostModel.load(os.path.join(ROOT, "cost_models", "dlrm_cpu", "semi_sync.json"))


@settings(max_examples=15, deadline=None, derandomize=True)
@given(name=st.sampled_from(["base", "sparse_dist", "semi_sync", "prefetch", "fused_sparse_dist"]),
       nbytes=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)), min_size=12, max_size=12),
       batch=st.integers(0, 5000))
def test_no_simulated_plan_beats_the_memory_bound(name, nbytes, batch):
    plan = pipelines.get(name)
    tasks = {}
    for (add, free), t in zip(nbytes, plan.task_names):
        base = _DLRM_COSTS.tasks.get(t, TaskCost(0.001))
        tasks[t] = TaskCost(base.host_s, base.device_s, add_bytes=add, free_bytes=free)
    costs = CostModel(tasks, batch_bytes=batch)
    sim = simulate(plan, costs, num_iterations=20)
    bound = min_memory(plan.task_names, plan.intra_edges(), costs, period_s=sim.period_s)
    assert sim.memory.peak_bytes >= bound.single_iteration - 1e-6
    assert sim.memory.mean_bytes >= bound.littles_law * (1 - 1e-6) - 1e-6


# -- cost model schema ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "cost_models", "**", "*.json"),
                                               recursive=True)))
def test_every_stored_version_1_cost_model_still_loads(path):
    costs = CostModel.load(path)
    assert json.load(open(path))["version"] == 1
    assert not costs.has_bytes and costs.to_dict()["version"] == 1


def test_bytes_round_trip_as_version_2(tmp_path):
    _, costs = _two_stage()
    costs = costs.replace("Load", device_alloc_bytes=4096, device_free_bytes=512)
    path = tmp_path / "m.json"
    costs.save(path)
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and doc["batch_bytes"] == 100 and doc["tasks"]["Step"]["free_bytes"] == 1000
    assert CostModel.load(path) == costs


def test_bytes_in_a_version_1_file_are_rejected(tmp_path):
    doc = {"schema": "swpipe-cost-model", "version": 1, "tasks": {"A": {"host_s": 0.001, "add_bytes": 10}}}
    with pytest.raises(CostModelError) as err:
        CostModel.from_dict(doc)
    assert err.value.field == "version"
    with pytest.raises(CostModelError) as err:
        CostModel.from_dict({**doc, "version": 2, "tasks": {"A": {"host_s": 0.001, "add_bytes": -1}}})
    assert (err.value.field, err.value.task, err.value.value) == ("tasks.A.add_bytes", "A", -1)


def test_what_if_batch_size_doubles_doubles_bytes_not_time():
    plan, costs = _two_stage()
    t = what_if(plan, costs, {"*bytes": 2})
    assert t["peak_bytes"]["after"] == pytest.approx(2 * t["peak_bytes"]["before"])
    assert t["period_s"]["after"] == pytest.approx(t["period_s"]["before"])
    both = what_if(plan, costs, {"*bytes": 2, "*": 2})
    assert both["period_s"]["after"] == pytest.approx(2 * both["period_s"]["before"])


# -- search under a cap -----------------------------------------------------------------------------------------------

_GRAPH = (["Load", "Step"], [("Step", "Load")])


def _cap_costs():
    return CostModel({"Load": TaskCost(0.002, add_bytes=1000), "Step": TaskCost(0.003, free_bytes=1000)},
                     batch_bytes=100)


def test_cap_below_deepest_plan_returns_shallower_plan_that_fits():
    costs = _cap_costs()
    deep, deep_report = auto_schedule(_GRAPH, costs, Constraints(max_depth=2), solver=SolverOptions(time_limit_s=4))
    assert deep.pipeline_depth == 2 and deep_report.peak_bytes == pytest.approx(2200)
    cap = 1500
    plan, report = auto_schedule(_GRAPH, costs, Constraints(max_depth=2, max_memory_bytes=cap),
                                 solver=SolverOptions(time_limit_s=4))
    assert plan.pipeline_depth == 1
    assert simulate(plan, costs).memory.peak_bytes <= cap
    assert report.period_s > deep_report.period_s and report.peak_bytes == pytest.approx(1100)
    assert [(p.depth, p.fits) for p in report.tradeoff.points] == [(1, True), (2, False)]
    assert [p.depth for p in pareto_front(report.tradeoff.points)] == [2, 1]
    text = report.summary()
    assert report.tradeoff.cap_bytes == cap and report.min_memory_bytes == pytest.approx(1100)
    assert "pareto" in text and "2.15 KiB" in text  # the trade-off table, the deep plan's peak in it
    assert "peak" in report.plot_tradeoff().axes[0].get_ylabel().split()


def test_generous_cap_keeps_the_fastest_plan():
    plan, report = auto_schedule(_GRAPH, _cap_costs(), Constraints(max_depth=2, max_memory_bytes=10_000),
                                 solver=SolverOptions(time_limit_s=4))
    assert plan.pipeline_depth == 2 and report.period_s == pytest.approx(0.003)


def test_cap_searches_only_the_depths_that_frozen_stages_allow():
    frozen = Constraints(max_depth=2, max_memory_bytes=10_000, frozen={"Step": {"stage": 1}})
    plan, report = auto_schedule(_GRAPH, _cap_costs(), frozen, solver=SolverOptions(time_limit_s=4))
    assert plan.stage("Step") == 1  # the frozen stage kept, not refused at depth cap 1
    assert [p.depth for p in report.tradeoff.points] == [2]


def test_impossible_cap_names_the_least_memory_a_plan_needs():
    with pytest.raises(MemoryCapError) as err:
        auto_schedule(_GRAPH, _cap_costs(), Constraints(max_depth=2, max_memory_bytes=500),
                      solver=SolverOptions(time_limit_s=4))
    assert (err.value.min_bytes, err.value.cap_bytes) == (1100, 500)


def test_cap_without_byte_figures_says_how_to_get_them():
    costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    with pytest.raises(ValueError, match="max_memory_bytes.*batch_bytes"):  # the option, the figures it needs
        auto_schedule(_GRAPH, costs, Constraints(max_depth=2, max_memory_bytes=500),
                      solver=SolverOptions(time_limit_s=4))


def test_transient_bytes_raise_the_level_while_the_task_runs():
    plan, costs = _two_stage()
    costs = costs.replace("Step", transient_bytes=500)
    m = simulate(plan, costs, num_iterations=30).memory
    # Step(0) runs from 1 ms to 3 ms: +500 over the hand-computed levels of the test above
    assert m.at(0.0015) == pytest.approx(1700) and m.at(0.0025) == pytest.approx(2700)
    assert m.at(0.0035) == pytest.approx(1700)  # Step(1) runs 3..5 ms
    b = min_memory(["Load", "Step"], [("Step", "Load")], costs)
    assert b.single_iteration == pytest.approx(1600) and b.task == "Step"  # batch + Load's 1000 + 500 during Step


def test_transient_bytes_sit_above_what_a_growing_task_adds():
    # Step adds 300 net (adds 1300, frees 1000) and holds 500 more while it runs: transient is measured above
    # the higher of its two ends, so during Step(0) (1..3 ms) its context holds 1100 + 300 + 500, not 1100 + 500
    plan, costs = _two_stage(step_add=1300.0)
    costs = costs.replace("Step", transient_bytes=500)
    m = simulate(plan, costs, num_iterations=30).memory
    assert m.at(0.0015) == pytest.approx(1100 + 800 + 100)  # context 1 holds its batch, Load(1) not ended
    assert m.at(0.0025) == pytest.approx(1100 + 800 + 1100)  # Load(1) ended at 2 ms
    b = min_memory(["Load", "Step"], [("Step", "Load")], costs)
    assert b.single_iteration == pytest.approx(100 + 1000 + 300 + 500)


# -- the one memory change list (autosched.model.memcurve) --------------------------------------------------------


def test_changes_at_one_instant_apply_in_order_then_as_added() -> None:
    frees_first = MemoryChanges()
    frees_first.add(0.0, 100)
    frees_first.add(1.0, 50, order=1)  # added first, but an add: after the free at the same instant
    frees_first.add(1.0, -100, order=0)
    assert frees_first.peak().bytes == 100 and frees_first.curve() == [(0.0, 100), (1.0, 50)]
    as_added = MemoryChanges()
    as_added.add(0.0, 100)
    as_added.add(1.0, 50)
    as_added.add(1.0, -100)
    assert as_added.peak().bytes == 150 and as_added.peak().time == 1.0


def test_a_clipped_owner_frees_only_what_it_holds_and_a_release_frees_all() -> None:
    mem = MemoryChanges(clip=True)
    mem.add(0.0, 10, owner="ctx0")
    mem.add(0.0, 30, owner="ctx1")
    mem.add(1.0, -25, owner="ctx0")  # holds 10: frees 10, ctx1's bytes untouched
    mem.release(2.0, "ctx1")
    assert mem.curve() == [(0.0, 40), (1.0, 30), (2.0, 0)]
    unclipped = MemoryChanges()
    unclipped.add(0.0, 10, owner="ctx0")
    unclipped.add(1.0, -25, owner="ctx0")
    assert unclipped.curve()[-1] == (1.0, -15)


def test_a_transient_counts_at_its_instant_on_top_of_the_level_and_per_owner() -> None:
    mem = MemoryChanges()
    mem.add(0.0, 100, owner=0)
    mem.add(1.0, 200, owner=1)
    mem.add(2.0, -100, transient=500, owner=0)  # the running action's 500 on top of 300 before it frees 100
    peak = mem.peak()
    assert (peak.bytes, peak.time, peak.applied) == (800, 2.0, 2)
    assert mem.peak(0).bytes == 600 and mem.peak(1).bytes == 200
    assert mem.owners() == [0, 1]
