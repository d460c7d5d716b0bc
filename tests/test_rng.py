"""Random numbers in a pipeline: draws from torch's default generators are dataflow; per-task generators."""

from __future__ import annotations

import pytest
import torch

from swpipe_core.dataflow import check_dataflow, infer_plan
from swpipe_core.dataflow.strict import StrictDataflowError
from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule

pytestmark = pytest.mark.timeout(120)


def _dropout_and_augment():
    """Augment masks the batch at random on an io thread; Forward uses dropout on the caller's thread."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    losses = {}

    def augment(ctx):
        ctx.x = ctx.batch * (torch.rand_like(ctx.batch) > 0.3)

    def forward(ctx):
        losses[ctx.iter_idx] = torch.nn.functional.dropout(model(ctx.x), 0.5, training=True).sum()

    plan = PipelinePlan({PipelineTask("Augment", augment): TaskSchedule(0, thread_group="io"),
                         PipelineTask("Forward", forward): TaskSchedule(1)}, intra_iter_deps=[("Forward", "Augment")])
    return plan, losses


BATCHES = [torch.ones(64, 8) * (k + 1) for k in range(24)]


def test_with_per_task_generators_a_pipelined_run_equals_its_serial_run_bit_for_bit():
    plan, losses = _dropout_and_augment()
    torch.manual_seed(1)
    SWPipeline(plan, device="cpu", rng="per_task").run(BATCHES)
    pipelined = dict(losses)
    losses.clear()
    torch.manual_seed(1)
    SWPipeline(plan, device="cpu", rng="per_task").run_serial(BATCHES)
    assert len(pipelined) == len(BATCHES) and all(torch.equal(pipelined[i], losses[i]) for i in losses)
    assert len({float(v.detach()) for v in losses.values()}) > 1  # the draws differ from iteration to iteration


def test_per_task_draws_follow_the_iteration_index_so_a_run_split_at_a_drain_draws_as_one_run():
    plan, losses = _dropout_and_augment()
    torch.manual_seed(1)
    SWPipeline(plan, device="cpu", rng="per_task").run(BATCHES)
    whole = dict(losses)
    losses.clear()
    torch.manual_seed(1)
    pipe = SWPipeline(plan, device="cpu", rng="per_task")
    pipe.run(BATCHES[:10])
    pipe.run(BATCHES[10:], first_iter_idx=10)  # the second part goes on from iteration 10
    assert sorted(losses) == list(range(len(BATCHES)))
    assert all(torch.equal(whole[i], losses[i]) for i in whole)
    losses.clear()
    SWPipeline(plan, device="cpu", rng="per_task").run(BATCHES[10:])  # numbered from 0: other draws
    assert not torch.equal(losses[0], whole[10])


def test_the_checker_names_the_shared_generator_and_the_order_to_add():
    plan, _ = _dropout_and_augment()
    report = check_dataflow(plan, BATCHES[:3])
    found = [f for f in report.missing if "default generator (cpu)" in str(f)]
    assert found and found[0].fix == ("Augment", "Forward", 1)
    assert check_dataflow(plan, BATCHES[:3], rng="per_task").ok
    assert infer_plan(plan, BATCHES[:3]).inter == [("Augment", "Forward", 1)]
    assert infer_plan(plan, BATCHES[:3], rng="per_task").inter == []


def test_strict_mode_raises_on_unordered_draws_unless_each_task_has_its_own_generator():
    plan, _ = _dropout_and_augment()
    with pytest.raises(PipelineTaskError) as info:
        SWPipeline(plan, device="cpu", strict=True).run(BATCHES[:6])
    cause = info.value.__cause__
    assert isinstance(cause, StrictDataflowError) and cause.attribute.endswith("(cpu)")  # torch's generator on cpu
    SWPipeline(plan, device="cpu", strict=True, rng="per_task").run(BATCHES[:6])  # nothing shared: no race


def test_an_unknown_rng_policy_is_refused():
    plan, _ = _dropout_and_augment()
    with pytest.raises(ValueError, match="rng='global'"):
        SWPipeline(plan, device="cpu", rng="global")
