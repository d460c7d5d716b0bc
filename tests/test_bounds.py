"""Lower bounds: the max cycle ratio on hand-computed event graphs, named bindings, never above the simulator."""

from __future__ import annotations

import math

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autosched.search.bounds import event_graph, lower_bounds, max_cycle_ratio
from autosched.model.costs import CostModel, CostModelError, TaskCost
from autosched.model.graph import plan_to_graph, task_graph
from autosched.model.simulate import simulate
from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.validate import PlanError, validate

MS = 1e-3


def _longest_task(b) -> str:
    """The task of a ``longest task <name>`` binding, "" for another binding."""
    words = b.binding.split()
    return words[-1] if words[:2] == ["longest", "task"] else ""


def _g(edges, multi=False):
    g = nx.MultiDiGraph() if multi else nx.DiGraph()
    for u, v, w, d in edges:
        g.add_edge(u, v, weight=w, distance=d)
    return g


# -- max cycle ratio on small event graphs computed by hand -------------------------------------------------------

def test_max_cycle_ratio_picks_the_heavier_of_two_cycles():
    # a->b->c->a: (2+3+1)/1 = 6;  a->b->a: (2+5)/1 = 7
    g = _g([("a", "b", 2, 0), ("b", "c", 3, 1), ("c", "a", 1, 0), ("b", "a", 5, 1)])
    ratio, cycle = max_cycle_ratio(g)
    assert ratio == pytest.approx(7.0)
    assert sorted(cycle) == ["a", "b"]


def test_max_cycle_ratio_divides_by_the_distance():
    # one cycle of weight 9 spanning 3 iterations beats a self-loop of 2.5 per iteration
    g = _g([("x", "y", 4, 1), ("y", "z", 3, 1), ("z", "x", 2, 1), ("w", "w", 2.5, 1)])
    ratio, cycle = max_cycle_ratio(g)
    assert ratio == pytest.approx(3.0)
    assert sorted(cycle) == ["x", "y", "z"]


def test_max_cycle_ratio_of_a_dag_is_zero():
    assert max_cycle_ratio(_g([("a", "b", 5, 0), ("b", "c", 5, 1)])) == (0.0, [])
    assert max_cycle_ratio(nx.DiGraph()) == (0.0, [])


def test_a_positive_cycle_of_distance_zero_is_infinite():
    ratio, cycle = max_cycle_ratio(_g([("a", "b", 1, 0), ("b", "a", 1, 0)]))
    assert math.isinf(ratio) and sorted(cycle) == ["a", "b"]


def test_negative_distances_count_around_the_cycle():
    # a -> b goes back one iteration, b -> a forward two: net distance 1, weight 3
    ratio, _ = max_cycle_ratio(_g([("a", "b", 1, -1), ("b", "a", 2, 2)]))
    assert ratio == pytest.approx(3.0)


def test_parallel_edges_use_the_one_that_binds():
    # two a->b edges: (w=1, d=0) and (w=4, d=1); with b->a (w=1, d=1): cycles 2/1 and 5/2 -> 2.5
    g = _g([("a", "b", 1, 0), ("a", "b", 4, 1), ("b", "a", 1, 1)], multi=True)
    ratio, _ = max_cycle_ratio(g)
    assert ratio == pytest.approx(2.5)


def test_max_cycle_ratio_matches_brute_force_on_random_graphs():
    import random

    rng = random.Random(7)
    for _ in range(30):
        n = rng.randint(2, 5)
        g = nx.DiGraph()
        for u in range(n):
            for v in range(n):
                if rng.random() < 0.4:
                    g.add_edge(u, v, weight=rng.randint(0, 9), distance=rng.randint(1, 3))
        best = 0.0
        for cyc in nx.simple_cycles(g):
            edges = list(zip(cyc, cyc[1:] + cyc[:1]))
            best = max(best, sum(g.edges[e]["weight"] for e in edges) / sum(g.edges[e]["distance"] for e in edges))
        assert max_cycle_ratio(g)[0] == pytest.approx(best, rel=1e-9, abs=1e-12)


# -- bounds of plans and task graphs ------------------------------------------------------------------------------

COSTS = CostModel({"A": TaskCost(1 * MS), "B": TaskCost(2 * MS), "C": TaskCost(0.5 * MS)})


def test_plan_bound_names_the_busiest_thread():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b"),
                         "C": TaskSchedule(1, thread_group="a")}, intra_iter_deps=[("B", "A")])
    b = lower_bounds(plan, COSTS)
    assert b.res_mii == pytest.approx(2 * MS) and b.binding == "thread:b"
    assert b.value == pytest.approx(simulate(plan, COSTS).period_s)


def test_recurrence_bound_names_its_cycle():
    g = task_graph(["A", "B", "C"], [("B", "A")], [("A", "B")])
    b = lower_bounds(g, COSTS, max_threads=3)
    assert b.rec_mii == pytest.approx(3 * MS)
    assert b.binding.split(": ")[0] == "recurrence" and "A -dep-> B -dep-> A (3.000 ms" in b.binding


def test_graph_bounds_cover_threads_longest_task_and_depth():
    g = task_graph(["A", "B", "C"], [("B", "A"), ("C", "B")])
    assert lower_bounds(g, COSTS, max_threads=1).res_mii == pytest.approx(3.5 * MS)
    assert lower_bounds(g, COSTS, max_threads=1).binding.endswith("/ 1 thread(s)")  # host work over one thread
    b = lower_bounds(g, COSTS, max_threads=4)
    assert b.res_mii == pytest.approx(2 * MS) and _longest_task(b) == "B"
    b = lower_bounds(g, COSTS, max_threads=4, max_depth=1)
    assert b.critical_path == pytest.approx(3.5 * MS) and b.binding.split(": ")[1].startswith("A -> B -> C")
    assert b.binding.split()[0] == "critical"
    assert lower_bounds(g, COSTS, max_threads=4, max_depth=2).critical_path == pytest.approx(1.75 * MS)


def test_core_pool_bounds_plans_and_graphs_by_host_work_per_core():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(0, thread_group="b"),
                         "C": TaskSchedule(0, thread_group="c")})
    one = CostModel(COSTS.tasks, cores=1)
    b = lower_bounds(plan, one)
    assert b.res_mii == pytest.approx(3.5 * MS) and b.binding == "cores"
    assert "1 core(s)" in b.summary()
    assert b.value == pytest.approx(simulate(plan, one).period_s)
    two = CostModel(COSTS.tasks, cores=2)
    assert lower_bounds(plan, two).binding == "thread:b"   # 1.75 ms per core < the 2 ms task
    g = task_graph(["A", "B", "C"])
    assert _longest_task(lower_bounds(g, COSTS, max_threads=3)) == "B"
    gb = lower_bounds(g, one, max_threads=3)
    assert gb.res_mii == pytest.approx(3.5 * MS) and gb.binding == "cores"
    # without a pool nothing changes
    assert lower_bounds(plan, COSTS).value == pytest.approx(2 * MS)


def test_communicator_and_pcie_time_bound_every_plan():
    costs = CostModel({"A": TaskCost(1 * MS, 2 * MS, ("comm:nccl",)), "B": TaskCost(1 * MS, 3 * MS, ("comm:nccl",)),
                       "C": TaskCost(0.1 * MS, 1 * MS, ("pcie",))})
    g = task_graph(["A", "B", "C"])
    b = lower_bounds(g, costs, max_threads=3, device="cuda")
    assert b.res_mii == pytest.approx(5 * MS) and b.binding == "comm:nccl"


def test_schedule_cycle_chains_a_thread_fifo_with_a_dependency():
    # thread b runs t0 then t1 each period; t2 (thread a) waits t1; depth 3 admits iteration i+3 when i
    # retires: retire -> t0 -> t1 -> t2 -> retire costs 3 ms per iteration, more than any other bound
    plan = PipelinePlan({"t0": TaskSchedule(2, thread_group="b"), "t1": TaskSchedule(2, thread_group="b"),
                         "t2": TaskSchedule(2, thread_group="a")},
                        intra_iter_deps=[("t2", "t1")], inter_iter_deps=[("t0", "t0", 1)],
                        enqueue_order=["t0", "t1", "t2"])
    costs = CostModel({"t0": TaskCost(1 * MS), "t1": TaskCost(0.5 * MS), "t2": TaskCost(1.5 * MS)})
    b = lower_bounds(plan, costs)
    assert max(b.res_mii, b.rec_mii, b.critical_path) < 2 * MS
    assert b.schedule_cycle == pytest.approx(3 * MS)
    assert b.binding.split()[0] == "schedule" and "thread:b" in b.binding and "barrier" in b.binding
    assert simulate(plan, costs).period_s == pytest.approx(3 * MS)


def test_event_graph_holds_thread_fifo_sequencer_and_barrier_edges():
    plan = PipelinePlan({"A": TaskSchedule(0, "s", "x", True), "B": TaskSchedule(1, "s", "x", True)},
                        intra_iter_deps=[("B", "A")])
    g = event_graph(plan, COSTS, device="cuda")
    kinds = {d["kind"] for _, _, d in g.edges(data=True)}
    assert {"dep", "event", "submit", "thread:x", "stream:s", "sequencer", "barrier"} <= kinds
    assert lower_bounds(plan, COSTS, device="cuda").binding == "thread:x"


def test_bounds_reject_bad_input():
    plan = PipelinePlan({"A": TaskSchedule(1), "B": TaskSchedule(0)}, intra_iter_deps=[("B", "A")])
    with pytest.raises(PlanError):
        lower_bounds(plan, COSTS)
    with pytest.raises(CostModelError, match="'Z'"):
        lower_bounds(task_graph(["A", "Z"]), COSTS)
    with pytest.raises(ValueError, match="max_threads"):
        lower_bounds(task_graph(["A"]), COSTS, max_threads=0)
    with pytest.raises(ValueError, match="device"):
        lower_bounds(task_graph(["A"]), COSTS, device="tpu")


# -- property: no bound exceeds the simulated period --------------------------------------------------------------

@st.composite
def plans_and_costs(draw):
    n = draw(st.integers(2, 5))
    names = [f"t{k}" for k in range(n)]
    depth = draw(st.integers(1, 3))
    stage = {t: draw(st.integers(0, depth - 1)) for t in names}
    sched = {t: TaskSchedule(stage[t], draw(st.sampled_from([None, "s1", "s2"])),
                             draw(st.sampled_from(["a", "b", "c"])), draw(st.booleans()) and draw(st.booleans()))
             for t in names}
    intra = [(names[k], names[j]) for k in range(n) for j in range(k)
             if stage[names[j]] <= stage[names[k]] and draw(st.booleans()) and draw(st.booleans())]
    inter = []
    for _ in range(draw(st.integers(0, 2))):
        t, d, dist = draw(st.sampled_from(names)), draw(st.sampled_from(names)), draw(st.integers(1, 2))
        if stage[d] - stage[t] <= dist:
            inter.append((t, d, dist))
    plan = PipelinePlan(sched, intra, inter, enqueue_policy=draw(st.sampled_from(["ready_first", "stage_descending"])))
    validate(plan)
    ms = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0])
    tags = st.lists(st.sampled_from(["comm:x", "pcie"]), unique=True, max_size=2).map(tuple)
    costs = CostModel({t: TaskCost(draw(ms) * MS, draw(ms) * MS, draw(tags)) for t in names})
    return plan, costs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans_and_costs(), st.sampled_from(["cpu", "cuda"]))
def test_bounds_never_exceed_the_simulated_period(pc, device):
    plan, costs = pc
    period = simulate(plan, costs, num_iterations=40, device=device).period_s
    b = lower_bounds(plan, costs, device=device)
    assert b.value <= period * (1 + 1e-9) + 1e-12, (b.summary(), period)
    groups = len({s.thread_group for s in plan.schedule.values()})
    g = lower_bounds(plan_to_graph(plan), costs, max_threads=groups, max_depth=plan.pipeline_depth, device=device)
    assert g.value <= b.value * (1 + 1e-9) + 1e-12, (g.summary(), b.summary())


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(plans_and_costs(), st.sampled_from(["cpu", "cuda"]), st.integers(1, 2))
def test_bounds_with_a_core_pool_never_exceed_the_simulated_period(pc, device, cores):
    plan, costs = pc
    pooled = CostModel(costs.tasks, cores=cores)
    period = simulate(plan, pooled, num_iterations=40, device=device).period_s
    b = lower_bounds(plan, pooled, device=device)
    assert b.value <= period * (1 + 1e-9) + 1e-12, (b.summary(), period)
    # the pool runs every host part of an iteration on at most `cores` cores at once
    host = sum(c.host_s + (c.device_s if device == "cpu" else 0.0) for c in costs.tasks.values())
    assert period >= host / cores * (1 - 1e-9) - 1e-12
