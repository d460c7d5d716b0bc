"""Measurements that run the user's training step leave the model as it was when given state=, and say so."""

from __future__ import annotations

import warnings

import pytest
import torch

from swpipe_core.measure.calibrate import calibrate
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.measure.profiler import TaskProfiler
from swpipe_core.measure.measured import MeasuredRun

pytestmark = pytest.mark.timeout(120)


def _training_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)

    def forward(ctx):
        ctx.loss = ((model(ctx.batch[0]) - ctx.batch[1]) ** 2).mean()

    def backward(ctx):
        opt.zero_grad(set_to_none=True)
        ctx.loss.backward()

    def step(ctx):
        opt.step()

    plan = PipelinePlan({PipelineTask("Forward", forward): TaskSchedule(), PipelineTask("Backward", backward):
                         TaskSchedule(), PipelineTask("Step", step): TaskSchedule()},
                        intra_iter_deps=[("Backward", "Forward"), ("Step", "Backward")])
    return plan, model, opt


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        _same(a[k], b[k]) if isinstance(a[k], dict) else
        (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]) for k in a)


def _state_dicts(model, opt):
    import copy

    return copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), torch.get_rng_state().clone()


BATCH = (torch.randn(32, 8), torch.randn(32, 1))


def test_profile_with_state_leaves_model_optimizer_and_generator_exactly_as_they_were():
    plan, model, opt = _training_step()
    opt.step()  # some optimizer state already
    before = _state_dicts(model, opt)
    with SWPipeline(plan, device="cpu") as pipe, warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = TaskProfiler(pipe, num_warmup=1, num_measure=2, num_rounds=1).profile(BATCH, state=[model, opt])
    after = _state_dicts(model, opt)
    assert _same(before[0], after[0]) and _same(before[1], after[1]) and torch.equal(before[2], after[2])
    assert min(r.meta["task_runs"].values()) > 0 and r.meta["state_restored"] is True
    ran = MeasuredRun(r.meta["task_runs"], restored=True)
    assert ran.describe() in r.format_report()  # the report says what ran, and that the state was put back


def test_without_state_the_profile_says_how_many_steps_trained_the_model():
    plan, model, opt = _training_step()
    with SWPipeline(plan, device="cpu") as pipe:
        # the wording is the behaviour: the user must read that the profile trained their model, and the fix
        with pytest.warns(RuntimeWarning, match=r"TaskProfiler.profile ran your tasks .*: they trained your model"):
            r = TaskProfiler(pipe, num_warmup=1, num_measure=2, num_rounds=1).profile(BATCH)
    # every AdamW step was a run of Step (a run with the gradients of a replayed loss, None, steps nothing)
    adamw_steps = opt.state_dict()["state"][0]["step"].item()
    assert 0 < adamw_steps <= r.meta["task_runs"]["Step"]
    assert MeasuredRun(r.meta["task_runs"], restored=False).describe() in r.format_report()
    assert r.meta["state_restored"] is False


def test_calibration_with_state_restores_it():
    plan, model, opt = _training_step()
    before = _state_dicts(model, opt)
    with SWPipeline(plan, device="cpu") as pipe, warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        calibrate(pipe, BATCH, iterations=10, repeats=1, cpu_iterations=2, state=[model, opt])
    after = _state_dicts(model, opt)
    assert _same(before[0], after[0]) and _same(before[1], after[1])


@pytest.mark.parametrize("record", ["infer_plan", "check_dataflow"])
def test_recording_the_dataflow_with_state_trains_nothing(record):
    from swpipe import check_dataflow, infer_plan

    plan, model, opt = _training_step()
    opt.step()  # some optimizer state already
    before = _state_dicts(model, opt)
    batches = [BATCH] * 3
    if record == "infer_plan":
        found = infer_plan(plan, batches, state=[model, opt])
        assert ("Step", "Backward") in found.intra  # it ran the step: the optimizer's write was seen
    else:
        assert check_dataflow(plan, batches, state=[model, opt]).ok
    after = _state_dicts(model, opt)
    assert _same(before[0], after[0]) and _same(before[1], after[1]) and torch.equal(before[2], after[2])
