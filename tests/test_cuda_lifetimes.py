"""Lifetimes on CUDA: what the engine keeps alive until the device is done with it, and what the user keeps.

On a GPU a block freed on the host goes back at once to the pool of the stream that allocated it, so a
tensor dropped while a kernel on another stream still reads it is overwritten by the next allocation
there. swpipe.testing.FakeCuda reuses and poisons such a block at once, so each hole below gives wrong
values and a race report, not just a wrong log (docs/semantics.md, "Lifetimes on CUDA").
"""

from __future__ import annotations

import threading
import weakref

import pytest
import torch

from swpipe.testing import kernels
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(60)]

N, ITERS = 1 << 10, 40


def _producer_consumer(produce, consume, caller_group=None) -> PipelinePlan:
    return PipelinePlan({PipelineTask("Produce", produce): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Consume", consume): TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("Consume", "Produce")], caller_group=caller_group)


def _expected():
    return [N * (i + 1) for i in range(ITERS)]


def test_a_value_nested_in_a_context_container_stays_alive_after_the_consumer_pops_it(fake_cuda):
    """ctx.d[k] = v in the producer, ctx.d.pop(k) in the consumer: the engine keeps v (no graveyard sees it)."""
    dev = fake_cuda.device(0)
    k, sums = kernels(dev), []

    def produce(ctx):
        ctx.d = {"x": k.full(N, ctx.iter_idx + 1, dtype=torch.int64)}
        ctx.obj = type("Holder", (), {})()
        ctx.obj.y = k.full(N, 1, dtype=torch.int64)

    def consume(ctx):
        k.spin(0.002)
        sums.append(k.sum(ctx.d.pop("x")))
        k.sum(ctx.obj.y)
        ctx.obj.y = None  # an attribute of an object in ctx, replaced

    SWPipeline(_producer_consumer(produce, consume), device=dev).run(range(ITERS))
    assert [int(k.item(s)) for s in sums] == _expected()
    fake_cuda.assert_no_races()


def test_a_tensor_handed_over_outside_ctx_needs_keep_alive_and_then_is_safe(fake_cuda):
    """cache[i] = x in the producer, cache.pop(i) in the consumer: the engine cannot see it; ctx.keep_alive can."""
    dev = fake_cuda.device(0)
    k = kernels(dev)

    def run(keep: bool):
        cache, sums = {}, []

        def produce(ctx):
            cache[ctx.iter_idx] = k.full(N, ctx.iter_idx + 1, dtype=torch.int64)

        def consume(ctx):
            k.spin(0.002)
            x = cache.pop(ctx.iter_idx)
            sums.append(k.sum(x))
            if keep:
                ctx.keep_alive(x)

        SWPipeline(_producer_consumer(produce, consume), device=dev).run(range(ITERS))
        return [int(k.item(s)) for s in sums]

    assert run(keep=True) == _expected()
    fake_cuda.assert_no_races()
    run(keep=False)  # the documented hole: without keep_alive the free is reported
    assert any("frees" in str(r) and "Consume" in str(r) for r in fake_cuda.races)


def test_gradients_of_the_state_stay_alive_until_the_optimizer_step_is_done_on_the_device(fake_cuda):
    """zero_grad(set_to_none=True) in Forward(i+1) must not free the gradient Step(i) still reads on its stream."""
    dev = fake_cuda.device(0)
    k = kernels(dev)
    param = torch.nn.Parameter(torch.zeros(3))
    gate, alive = threading.Event(), []

    def backward(ctx):
        param.grad = torch.full((3,), float(ctx.iter_idx))

    def step(ctx):
        if ctx.iter_idx == 0:
            k.wait_host(gate)  # the step's kernels run until the test ends them

    def forward(ctx):
        if ctx.iter_idx == 1:
            ref = weakref.ref(param.grad)
            param.grad = None  # zero_grad(set_to_none=True)
            alive.append(ref() is not None)
            gate.set()

    plan = PipelinePlan({PipelineTask("Forward", forward): TaskSchedule(0, None, "compute"),
                         PipelineTask("Backward", backward): TaskSchedule(0, None, "compute"),
                         PipelineTask("Step", step): TaskSchedule(0, "opt", "opt")},
                        intra_iter_deps=[("Backward", "Forward"), ("Step", "Backward")],
                        inter_iter_deps=[("Forward", "Step", 1)], caller_group=None)
    SWPipeline(plan, device=dev, state=[param]).run(range(3))
    assert alive == [True]


def test_a_bad_state_is_an_error_at_construction():
    plan = PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule()})
    with pytest.raises(TypeError, match="state.*str"):  # the argument, the type given
        SWPipeline(plan, device="cpu", state=["not a module"])


def test_a_batch_from_the_loaders_stream_outlives_its_serial_iteration_until_the_device_read_it(fake_cuda):
    """run_serial: the batch is made on the loader's stream and read on the default stream; it is kept."""
    dev = fake_cuda.device(0)
    k, sums = kernels(dev), []
    side = dev.new_stream("loader")

    def loader():
        for i in range(ITERS):
            with dev.use(side):
                yield k.full(N, i + 1, dtype=torch.int64)

    def read(ctx):
        k.spin(0.001)
        sums.append(k.sum(ctx.batch))

    plan = PipelinePlan({PipelineTask("Read", read): TaskSchedule()})
    SWPipeline(plan, device=dev).run_serial(loader())
    assert [int(k.item(s)) for s in sums] == _expected()
    fake_cuda.assert_no_races()


def test_events_come_from_a_bounded_pool_whatever_the_run_length(fake_cuda):
    dev = fake_cuda.device(0)
    k = kernels(dev)
    plan = _producer_consumer(lambda ctx: setattr(ctx, "x", k.full(4, 1.0)), lambda ctx: k.sum(ctx.x))
    pipe = SWPipeline(plan, device=dev, record_timeline=True)

    def made(iterations: int) -> int:
        before = fake_cuda.events_created
        pipe.run(range(iterations))
        return fake_cuda.events_created - before

    short, long = made(10), made(60)
    assert long <= short  # reused from the pool: not one (or three) per task per iteration
    assert len([e for e in pipe.timeline if e.kind == "device"]) == 2 * 60  # the timeline is still complete
