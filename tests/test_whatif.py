"""What-if tables: predicted period, latency and binding before and after a change of costs."""

from __future__ import annotations

import os

import pytest

from autosched.model.costs import CostModel, CostModelError, TaskCost
from autosched.model.whatif import apply_changes, compare_plans, sweep, what_if
from swpipe_core import pipelines
from swpipe_core.plan import PipelinePlan, TaskSchedule

MS = 1e-3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
                    intra_iter_deps=[("B", "A")])
COSTS = CostModel({"A": TaskCost(1 * MS), "B": TaskCost(2 * MS)})


def test_what_if_doubling_the_idle_task_moves_the_binding_resource():
    t = what_if(PLAN, COSTS, {"A": 3.0})
    assert list(t.index) == ["before", "after"]
    assert t.loc["before", "period_s"] == pytest.approx(2 * MS) and t.loc["before", "binding"] == "thread:b"
    assert t.loc["after", "period_s"] == pytest.approx(3 * MS) and t.loc["after", "binding"] == "thread:a"
    assert t.loc["after", "speedup"] == pytest.approx(2 / 3)
    assert t.loc["after", "change"] == "A x3"
    assert t.loc["after", "lower_bound_s"] == pytest.approx(3 * MS)


def test_what_if_halving_the_bottleneck_on_a_torchrec_plan_is_faster():
    plan = pipelines.get("sparse_dist")
    costs = CostModel.load(os.path.join(ROOT, "cost_models", "sparse_dist.json"))
    t = what_if(plan, costs, {"Backward": 0.5}, device="cuda")
    assert t.loc["after", "period_s"] < t.loc["before", "period_s"]
    assert t.loc["after", "speedup"] > 1


def test_apply_changes_accepts_factors_costs_fields_models_and_functions():
    assert apply_changes(COSTS, {"*": 2})["B"].host_s == pytest.approx(4 * MS)
    assert apply_changes(COSTS, {"A": TaskCost(0, 5 * MS)})["A"] == TaskCost(0, 5 * MS)
    assert apply_changes(COSTS, {"A": {"resources": ["pcie"]}})["A"].resources == ("pcie",)
    assert apply_changes(COSTS, {"New": {"host_s": 0.001}})["New"] == TaskCost(0.001)
    other = CostModel({"A": TaskCost(9), "B": TaskCost(9)})
    assert apply_changes(COSTS, other) is other
    assert apply_changes(COSTS, lambda c: c.scaled(None, 0))["B"].host_s == 0
    with pytest.raises(CostModelError) as err:
        apply_changes(COSTS, {"Z": 2})
    assert (err.value.field, err.value.task) == ("changes", "Z")
    with pytest.raises(CostModelError) as err:
        apply_changes(COSTS, {"A": "twice"})
    assert (err.value.task, err.value.value) == ("A", "twice")
    with pytest.raises(CostModelError) as err:
        apply_changes(COSTS, lambda c: None)
    assert (err.value.field, err.value.value) == ("changes", None)


def test_sweep_gives_one_row_per_factor_and_finds_where_the_binding_changes():
    t = sweep(PLAN, COSTS, "A", [0.5, 1, 2, 3, 4])
    assert list(t["factor"]) == [0.5, 1, 2, 3, 4]
    assert [round(p / MS, 6) for p in t["period_s"]] == [2.0, 2.0, 2.0, 3.0, 4.0]
    assert list(t["binding"])[-1] == "thread:a" and list(t["binding"])[0] == "thread:b"
    assert t.attrs["task"] == "A"
    assert (t["lower_bound_s"] <= t["period_s"] * (1 + 1e-9)).all()


def test_compare_plans_sorts_by_period():
    serial = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0)}, intra_iter_deps=[("B", "A")])
    t = compare_plans({"serial": serial, "pipelined": PLAN}, COSTS)
    assert list(t.index) == ["pipelined", "serial"]
    assert list(t["depth"]) == [2, 1]
    assert t.loc["serial", "period_s"] == pytest.approx(3 * MS)
