"""validate(): every rule has a plan that breaks it, and the error names rule, tasks and fix."""

from __future__ import annotations

import importlib
import random

import networkx as nx
import pytest

from swpipe_core.order import period_local_graph
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.validate import RULES, PlanError, validate

S = TaskSchedule


class _IdentityTask(PipelineTask):
    """A task subclass that hashes by identity: the only way to get two schedule keys with one name.

    A plain dict cannot hold two keys named alike (PipelineTask hashes and
    compares as its name), so ``unique-names`` guards against keys with
    custom hashing such as this one.
    """

    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other


def _f1(ctx):
    pass


def _f2(ctx):
    pass


# rule -> (plan factory, names the message must mention)
BAD_PLANS = {
    "schedule-type": (lambda: PipelinePlan({"A": {"stage": 0}}), ["A"]),
    "task-ref": (lambda: PipelinePlan({"A": S(0)}, intra_iter_deps=[("A", 3)]), []),
    "unique-names": (lambda: PipelinePlan({_IdentityTask("A"): S(0), _IdentityTask("A"): S(1)}), ["A"]),
    "unknown-task": (lambda: PipelinePlan({"A": S(0)}, intra_iter_deps=[("A", "Nope")]), ["Nope"]),
    "foreign-task": (lambda: PipelinePlan({PipelineTask("A", _f1): S(0), "B": S(0)},
                                          intra_iter_deps=[("B", PipelineTask("A", _f2))]), ["A"]),
    "self-dependency": (lambda: PipelinePlan({"A": S(0)}, intra_iter_deps=[("A", "A")]), ["A"]),
    "dep-format": (lambda: PipelinePlan({"A": S(0), "B": S(0)}, inter_iter_deps=[("A", "B", 0)]), ["A", "B"]),
    "stage": (lambda: PipelinePlan({"A": S(-1)}), ["A"]),
    "stream-type": (lambda: PipelinePlan({"A": S(0, stream=3)}), ["A"]),
    "stream_name": (lambda: PipelinePlan({"A": S(0, stream="default"), "B": S(1)}, [("B", "A")]), ["A"]),
    "thread-group": (lambda: PipelinePlan({"A": S(0, thread_group="")}), ["A"]),
    "globally-ordered": (lambda: PipelinePlan({"A": S(0, globally_ordered=1)}), ["A"]),
    "cycle": (lambda: PipelinePlan({"A": S(0), "B": S(0), "C": S(0)},
                                   intra_iter_deps=[("B", "A"), ("C", "B"), ("A", "C")]), ["A", "B", "C"]),
    "corollary-1": (lambda: PipelinePlan({"A": S(1), "B": S(0)}, intra_iter_deps=[("B", "A")]), ["A", "B"]),
    "corollary-3": (lambda: PipelinePlan({"fwd": S(0), "opt": S(2)}, inter_iter_deps=[("fwd", "opt")]), ["fwd", "opt"]),
    "depth-mismatch": (lambda: PipelinePlan({"A": S(0)}, pipeline_depth=2), []),
    "enqueue-policy": (lambda: PipelinePlan({"A": S(0)}, enqueue_policy="fifo"), []),
    "enqueue-order": (lambda: PipelinePlan({"A": S(0), "B": S(0)}, intra_iter_deps=[("B", "A")],
                                           enqueue_order=["B", "A"]), ["A", "B"]),
}


def test_every_rule_has_a_bad_plan_here():
    # period-local-cycle is unreachable through validate (see the two tests
    # below); every other rule has a plan in BAD_PLANS.
    assert set(BAD_PLANS) | {"period-local-cycle"} == set(RULES)


@pytest.mark.parametrize("rule", sorted(BAD_PLANS))
def test_bad_plan_is_rejected_naming_rule_tasks_and_fix(rule):
    make, names = BAD_PLANS[rule]
    with pytest.raises(PlanError) as info:
        validate(make())
    err = info.value
    assert err.rule == rule, str(err)
    assert str(err).startswith(f"[{rule}]")
    assert err.fix and "Fix:" in str(err)
    for name in names:
        assert name in str(err)
    assert isinstance(err, ValueError)


def test_cycle_message_names_the_cycle_path():
    with pytest.raises(PlanError, match=r"cycle: (A -> B -> C -> A|B -> C -> A -> B|C -> A -> B -> C)"):
        validate(BAD_PLANS["cycle"][0]())


def test_corollary_1_fix_suggests_stages_and_inter_deps():
    with pytest.raises(PlanError) as info:
        validate(BAD_PLANS["corollary-1"][0]())
    assert info.value.tasks == ["B", "A"]
    assert (info.value.rule, info.value.field) == ("corollary-1", "intra_iter_deps")
    # the fix is the behaviour here: the stage to move A to, or the dependency list to declare it in instead
    assert "move A to stage <= 0" in info.value.fix and "inter_iter_deps" in info.value.fix


def test_corollary_3_allows_gap_up_to_distance():
    validate(PipelinePlan({"fwd": S(0), "opt": S(2)}, inter_iter_deps=[("fwd", "opt", 2)]))
    with pytest.raises(PlanError) as info:
        validate(PipelinePlan({"fwd": S(0), "opt": S(2)}, inter_iter_deps=[("fwd", "opt", 1)]))
    assert (info.value.rule, info.value.tasks, info.value.field) == ("corollary-3", ["fwd", "opt"], "inter_iter_deps")
    assert info.value.fix.endswith(">= 2")  # the distance that would do


def test_enqueue_order_must_list_every_task_once():
    plan = PipelinePlan({"A": S(0), "B": S(0)}, enqueue_order=["A"])
    with pytest.raises(PlanError, match=r"missing \['B'\]") as info:
        validate(plan)
    assert info.value.rule == "enqueue-order"
    validate(plan.replace(enqueue_order=["B", "A"]))


def test_stream_objects_are_accepted_and_other_objects_are_not():
    import torch

    stream = torch.Stream(device="cpu")
    validate(PipelinePlan({"A": S(0, stream=stream)}))  # raises PlanError (stream-type) if it were refused
    with pytest.raises(PlanError) as info:
        validate(PipelinePlan({"A": S(0, stream=object())}))
    assert (info.value.rule, info.value.task, info.value.field) == ("stream-type", "A", "stream")


def test_period_local_cycle_is_implied_by_cycle_and_corollaries():
    """Why no plan reaches the period-local-cycle rule.

    Period-local edges are intra edges within one stage (a sub-graph of the
    intra DAG, already acyclic by the ``cycle`` rule) and inter edges with
    stage(dep) = stage(task) + N, which go strictly down in stage. A cycle
    would have to come back up, which no period-local edge does. Checked here
    on random plans: none that passes the earlier rules has such a cycle.
    """
    rng = random.Random(1234)
    with_inter_edges = 0
    for _ in range(400):
        n = rng.randint(2, 6)
        names = [f"T{i}" for i in range(n)]
        sched = {t: S(rng.randint(0, 2), rng.choice([None, "x", "y"])) for t in names}
        intra = [(a, b) for a in names for b in names if a != b and rng.random() < 0.25]
        inter = [(a, b, rng.randint(1, 2)) for a in names for b in names if rng.random() < 0.2]
        plan = PipelinePlan(sched, intra, inter)
        try:
            validate(plan)
        except PlanError as err:
            assert err.rule != "period-local-cycle"
            continue
        graph = period_local_graph(plan)
        assert nx.is_directed_acyclic_graph(graph)
        with_inter_edges += any(d["kind"] == "inter" for *_, d in graph.edges(data=True))
    assert with_inter_edges > 20  # the property was exercised on non-trivial graphs


def test_period_local_cycle_check_reports_the_cycle(monkeypatch):
    # The defensive check itself: feed validate a cyclic period-local graph.
    def cyclic(plan):
        graph = nx.DiGraph()
        graph.add_edges_from([("A", "B"), ("B", "A")])
        return graph

    # where validate looks it up; the module by its name (the package's attribute `validate` is the function)
    monkeypatch.setattr(importlib.import_module("swpipe_core.validate"), "period_local_graph", cyclic)
    with pytest.raises(PlanError) as info:
        validate(PipelinePlan({"A": S(0), "B": S(0)}))
    assert info.value.rule == "period-local-cycle"
    assert set(info.value.tasks) == {"A", "B"}
    assert "A -> B -> A" in str(info.value) or "B -> A -> B" in str(info.value)
