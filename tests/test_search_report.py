"""auto_schedule's report tells the truth: unverified when it is, measured figures when it measured, and the runs."""

from __future__ import annotations

import pytest
from conftest import word_after
import torch

from autosched.model.costs import CostModel, TaskCost
from autosched.search.options import Constraints, SolverOptions
from swpipe import auto_schedule, simulate
from autosched.verify.loop import VerifyOptions
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule

pytestmark = pytest.mark.timeout(120)


def _plan_and_model():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def load(ctx):
        ctx.x = ctx.batch * 2

    def step(ctx):
        opt.zero_grad()
        model(ctx.x).sum().backward()
        opt.step()

    plan = PipelinePlan({PipelineTask("Load", load): TaskSchedule(0, thread_group="io"),
                         PipelineTask("Step", step): TaskSchedule(1)}, intra_iter_deps=[("Step", "Load")])
    costs = CostModel({"Load": TaskCost(0.001), "Step": TaskCost(0.002)})
    return plan, model, opt, costs


def test_without_batches_the_report_says_the_plan_is_unverified_and_how_to_verify_it():
    plan, _, _, costs = _plan_and_model()
    _, report = auto_schedule(plan, costs, Constraints(max_depth=2), solver=SolverOptions(time_limit_s=5))
    head = report.summary().splitlines()
    # the wording is the behaviour: an unverified plan says so on its first line, and how to verify it on the next
    assert "NOT VERIFIED" in head[0] and "batches=" in head[1]
    assert report.verify is None and report.iterations_run == 0
    assert report.measured is None and report.measured_period_s is None  # nothing measured: only the model's figures


def test_with_batches_and_state_the_model_is_restored_and_the_report_counts_the_runs():
    plan, model, opt, costs = _plan_and_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batches = [torch.ones(8, 4) * k for k in range(10)]
    _, report = auto_schedule(plan, costs, Constraints(max_depth=2),
                              solver=SolverOptions(time_limit_s=5), batches=batches,
                              verify=VerifyOptions(rounds=1, max_rounds=1, iterations=10), state=[model, opt])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert report.iterations_run > 0 and report.state_restored
    chosen = report.verify.choose()
    # the measured period is the chosen plan's row of the verification table; period_s stays the model's
    assert report.measured is chosen and report.measured_period_s == chosen.period_s
    assert report.period_s == pytest.approx(simulate(report.plan, costs).period_s)  # the chosen plan's, modelled
    first = report.summary().splitlines()[0]
    assert first.split()[:2] == ["auto_schedule", f"({report.method},"]
    assert word_after(first, "measured", "period") == f"{chosen.period_s * 1e3:.3f}"  # leads with the measured period
    assert report.explain().split()[0] == "Measured"
    assert word_after(report.summary(), "tasks") == str(report.iterations_run)  # the runs of the user's tasks


def test_without_state_a_warning_says_the_tasks_trained_the_model():
    plan, model, _, costs = _plan_and_model()
    with pytest.warns(RuntimeWarning, match=r"auto_schedule.*batches=.*state="):  # what ran them, the fix
        auto_schedule(plan, costs, Constraints(max_depth=2),
                      solver=SolverOptions(time_limit_s=5), batches=[torch.ones(8, 4)] * 10,
                      verify=VerifyOptions(rounds=1, max_rounds=1, iterations=10))


def test_an_unbound_plan_with_batches_is_an_error_that_says_how_to_bind_it():
    _, _, _, costs = _plan_and_model()
    unbound = PipelinePlan({"Load": TaskSchedule(0), "Step": TaskSchedule(1)}, intra_iter_deps=[("Step", "Load")])
    with pytest.raises(ValueError, match=r"\['Load', 'Step'\].*bind"):  # the unbound tasks, the fix
        auto_schedule(unbound, costs, Constraints(max_depth=2), solver=SolverOptions(time_limit_s=5), batches=[1, 2, 3])
