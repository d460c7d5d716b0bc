"""Enqueue order: the classic enqueue-order deadlock scenarios, a cross-iteration P/Q/R/A example and SparseDist's
ready-first order."""

from __future__ import annotations

import networkx as nx
import pytest

from swpipe_core import pipelines
from swpipe_core.order import (
    enqueue_order,
    hand_off_after,
    period_local_graph,
    ready_first_order,
    stage_descending_order,
    stall_cost,
)
from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.validate import PlanError, validate

S = TaskSchedule
POLICIES = (ready_first_order, stage_descending_order)


def _before(order, first, then):
    return order.index(first) < order.index(then)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda f: f.__name__)
def test_scenario_1_single_thread_supplier_enqueued_first(policy):
    # A(s=0, T1) waits B(s=1, T1) of the previous iteration: same period, so
    # B must be enqueued first or the single thread deadlocks on A.
    plan = PipelinePlan({"A": S(0, thread_group="T1"), "B": S(1, thread_group="T1")}, inter_iter_deps=[("A", "B")])
    validate(plan)
    assert policy(plan) == ["B", "A"]
    with pytest.raises(PlanError) as err:
        validate(plan.replace(enqueue_order=["A", "B"]))  # the ascending order that deadlocks
    assert (err.value.rule, err.value.tasks) == ("enqueue-order", ["A", "B"])  # A waits B, enqueued before it


@pytest.mark.parametrize("policy", POLICIES, ids=lambda f: f.__name__)
def test_scenario_2_cross_thread_suppliers_enqueued_first(policy):
    plan = PipelinePlan(
        {"A": S(0, thread_group="T1"), "D": S(1, thread_group="T1"),
         "C": S(0, thread_group="T2"), "B": S(1, thread_group="T2")},
        inter_iter_deps=[("A", "B"), ("C", "D")],
    )
    validate(plan)
    order = policy(plan)
    assert _before(order, "B", "A") and _before(order, "D", "C")
    # per thread queue: each supplier ahead of its consumer
    t1 = [t for t in order if t in ("A", "D")]
    t2 = [t for t in order if t in ("C", "B")]
    assert t1 == ["D", "A"] and t2 == ["B", "C"]
    with pytest.raises(PlanError, match="enqueue-order"):
        validate(plan.replace(enqueue_order=["A", "C", "D", "B"]))


def test_scenario_3_gap_of_two_is_rejected_by_corollary_3():
    plan = PipelinePlan({"fwd": S(0), "bwd": S(1), "opt": S(2)},
                        intra_iter_deps=[("bwd", "fwd"), ("opt", "bwd")], inter_iter_deps=[("fwd", "opt")])
    with pytest.raises(PlanError) as info:
        validate(plan)
    assert info.value.rule == "corollary-3" and info.value.tasks == ["fwd", "opt"]
    # dropping the inter dependency (let the stream FIFO order fwd after opt) makes the 3-stage plan fine
    validate(plan.replace(inter_iter_deps=[]))


def _advanced_example():
    # P(s0, X), Q(s1, Y) waits P, R(s0, X) waits Q, A(s0, Z) waits Q of i-1.
    return PipelinePlan(
        {"P": S(0, "X"), "Q": S(1, "Y"), "R": S(0, "X"), "A": S(0, "Z")},
        intra_iter_deps=[("Q", "P"), ("R", "Q")],
        inter_iter_deps=[("A", "Q")],
    )


def test_advanced_example_period_local_graph_has_only_the_k1_edge():
    graph = period_local_graph(_advanced_example())
    assert list(graph.edges(data=True)) == [("Q", "A", {"kind": "inter", "distance": 1})]
    assert stall_cost(_advanced_example(), graph) == {"P": 0, "Q": 0, "R": 0, "A": 1}


def test_advanced_example_orders_on_its_period_local_graph():
    plan = _advanced_example()
    assert ready_first_order(plan) == ["P", "Q", "R", "A"]
    assert stage_descending_order(plan) == ["Q", "P", "R", "A"]
    # The same graph sorted directly by the two priorities gives the same orders.
    graph, cost = period_local_graph(plan), stall_cost(plan)
    stage = nx.get_node_attributes(graph, "stage")
    assert list(nx.lexicographical_topological_sort(graph, key=lambda n: (cost[n], n))) == ["P", "Q", "R", "A"]
    assert list(nx.lexicographical_topological_sort(graph, key=lambda n: (-stage[n], cost[n], n))) == ["Q", "P", "R", "A"]


def test_advanced_example_is_rejected_as_a_plan_by_corollary_1():
    with pytest.raises(PlanError) as info:
        validate(_advanced_example())
    err = info.value
    assert err.rule == "corollary-1"
    assert err.tasks == ["R", "Q"] and "(tasks: R, Q)" in str(err)


def test_sparse_dist_ready_first_starts_next_input_dist_before_compute():
    plan = pipelines.get("sparse_dist")
    graph = period_local_graph(plan)
    assert sorted(graph.edges) == sorted([
        ("InputDistStart", "InputDistWait"), ("ZeroGrad", "WaitBatch"), ("WaitBatch", "Forward"),
        ("Forward", "Backward"), ("Backward", "OptimizerStep"),
    ])
    assert set(stall_cost(plan).values()) == {0}
    assert ready_first_order(plan) == [
        "H2D", "InputDistStart", "ZeroGrad", "InputDistWait", "WaitBatch", "Forward", "Backward", "OptimizerStep"]
    assert stage_descending_order(plan) == [
        "ZeroGrad", "WaitBatch", "Forward", "Backward", "OptimizerStep", "InputDistStart", "InputDistWait", "H2D"]


def test_ready_first_puts_zero_stall_tasks_before_an_earlier_ready_stalling_one():
    # Y (cost 1: waits A on another stream) becomes ready before Z (cost 0),
    # yet Z is enqueued first so it does not queue behind Y's wait_event.
    plan = PipelinePlan(
        {"A": S(1, "s1"), "B": S(0, "s2"), "Y": S(0, "s2"), "Z": S(0, "s2")},
        intra_iter_deps=[("Z", "B")], inter_iter_deps=[("Y", "A")],
    )
    validate(plan)
    assert stall_cost(plan)["Y"] == 1
    assert ready_first_order(plan) == ["A", "B", "Z", "Y"]


def test_ready_first_takes_earliest_ready_among_equal_cost():
    # C is ready from the start; B only after A. C (ready earlier) precedes B
    # although "B" < "C".
    plan = PipelinePlan({"A": S(0), "B": S(0), "C": S(0)}, intra_iter_deps=[("B", "A")])
    assert ready_first_order(plan) == ["A", "C", "B"]


@pytest.mark.parametrize("name", sorted(pipelines.PIPELINES))
@pytest.mark.parametrize("policy", POLICIES, ids=lambda f: f.__name__)
def test_policy_orders_are_topological_orders_accepted_by_validate(name, policy):
    plan = pipelines.get(name)
    order = policy(plan)
    assert sorted(order) == sorted(plan.task_names)
    validate(plan.replace(enqueue_order=order))


def test_enqueue_order_follows_explicit_order_then_policy():
    plan = _advanced_example().replace(intra_iter_deps=[("Q", "P")])
    assert enqueue_order(plan) == ["P", "Q", "R", "A"]
    assert enqueue_order(plan.replace(enqueue_policy="stage_descending")) == ["Q", "P", "R", "A"]
    assert enqueue_order(plan.replace(enqueue_order=["Q", "R", "P", "A"])) == ["Q", "R", "P", "A"]
    with pytest.raises(ValueError, match="unknown enqueue_policy 'lifo'"):
        enqueue_order(plan.replace(enqueue_policy="lifo"))


def test_ready_first_on_cyclic_period_local_graph_raises():
    plan = PipelinePlan({"A": S(0), "B": S(0)}, intra_iter_deps=[("A", "B"), ("B", "A")])
    with pytest.raises(nx.NetworkXUnfeasible):
        ready_first_order(plan)


@pytest.mark.parametrize("name", ["base", "sparse_dist", "sparse_dist_lite", "fused_sparse_dist", "prefetch",
                                  "semi_sync"])
def test_hand_off_after_forward_moves_only_what_nothing_before_it_waits_for(name):
    from swpipe_core.engine.workers import with_thread_map

    plan = with_thread_map(pipelines.get(name), "by_stream")
    before, late = enqueue_order(plan), hand_off_after(plan, "Forward")
    validate(plan.replace(enqueue_order=late, pipeline_depth=plan.pipeline_depth))  # still a topological order
    assert sorted(late) == sorted(before)
    inline = [t for t in plan.task_names if plan.sched(t).thread_group == "default"]
    assert [t for t in late if t in inline] == [t for t in before if t in inline]  # the caller's program unchanged
    graph = period_local_graph(plan)
    at = late.index("Forward")
    for t in late[:at]:  # a worker task left before Forward is one a caller's task up to Forward waits for
        if t not in inline:
            assert any(nx.has_path(graph, t, c) for c in late[:at + 1] if c in inline), (name, t)
    moved = [t for t in late[at + 1:] if t not in inline and before.index(t) < before.index("Forward")]
    assert moved, name  # every one of these plans has side work the policy hands off before Forward


def test_hand_off_after_names_a_task_of_the_callers_group():
    from swpipe_core.engine.workers import with_thread_map

    plan = with_thread_map(pipelines.get("sparse_dist"), "by_stream")
    with pytest.raises(ValueError, match="'H2D'.*'default'"):  # the task, then the caller's group it is not in
        hand_off_after(plan, "H2D")
    with pytest.raises(ValueError, match="'Nope'"):
        hand_off_after(plan, "Nope")
