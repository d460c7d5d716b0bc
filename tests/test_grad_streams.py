"""The search keeps gradient frees on the stream that allocated the gradients (issue 31; issue 38, section 3).

A gradient is allocated on the stream of the forward op whose backward produced it. The last test runs the issue's
scenario on the fake device, autograd on fake tensors: the old repair (onto the stream of the task calling
``backward()``) leaves a named race, the repair by the allocating stream none.
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch

from autosched.model.costs import CostModel, TaskCost
from autosched.search.entry import auto_schedule
from autosched.search.options import Constraints, SolverOptions
from autosched.search.gradstreams import repair_plan
from swpipe_core.dataflow.grads import record_grads
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule


def _training():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)

    def fwd_bwd(ctx):
        model(ctx.batch).pow(2).sum().backward()

    def step(ctx):
        opt.step()
        opt.zero_grad(set_to_none=True)

    plan = PipelinePlan({PipelineTask("Backward", fwd_bwd): TaskSchedule(0),
                         PipelineTask("Step", step): TaskSchedule(0)}, intra_iter_deps=[("Step", "Backward")])
    return model, opt, plan


def _state_of(model, opt):
    return ([p.detach().clone() for p in model.parameters()], [p.grad for p in model.parameters()],
            {k: dict(v) for k, v in opt.state.items()})


def test_record_grads_finds_makers_and_freers_and_restores_the_state():
    model, opt, plan = _training()
    model(torch.ones(1, 3)).sum().backward()  # gradients before the run: they must come back as they were
    grads = [p.grad.clone() for p in model.parameters()]
    params, _, _ = _state_of(model, opt)
    traffic = record_grads(plan, torch.ones(4, 3), [model, opt])
    # backward accumulates into the gradients there (in place or not, as torch sees fit): it made them either way
    assert traffic.makers in ((), ("Backward",)) and traffic.freers == ("Step",)
    assert traffic.frees == {"Step": ("Backward",)} and traffic.allocators == {"Step": ("Backward",)}
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    assert not opt.state
    model.zero_grad(set_to_none=True)
    assert record_grads(plan, torch.ones(4, 3), [model, opt]).makers == ("Backward",)
    assert all(p.grad is None for p in model.parameters())


def test_a_task_that_frees_the_gradients_at_the_start_of_an_iteration_is_seen_freeing_the_last_ones():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def forward(ctx):
        opt.zero_grad(set_to_none=True)  # the usual loop: clear, then forward and backward
        ctx.loss = model(ctx.batch).sum()

    plan = PipelinePlan({PipelineTask("Forward", forward): TaskSchedule(0),
                         PipelineTask("Backward", lambda ctx: ctx.loss.backward()): TaskSchedule(0),
                         PipelineTask("Step", lambda ctx: opt.step()): TaskSchedule(0)},
                        intra_iter_deps=[("Backward", "Forward"), ("Step", "Backward")])
    traffic = record_grads(plan, torch.ones(4, 3), [model, opt])
    assert traffic.frees == {"Forward": ("Backward",)} and traffic.makers == ("Backward",)
    assert all(p.grad is None for p in model.parameters())


def _search(**kwargs):
    model, opt, plan = _training()
    costs = CostModel({"Backward": TaskCost(0.001, 0.004), "Step": TaskCost(0.001, 0.002)})
    c = Constraints(device="cuda", streams=[None, "side"], max_depth=2, max_threads=2,
                    frozen={"Backward": {"stream": None}, "Step": {"stream": "side"}})
    return auto_schedule(plan, costs, c, solver=SolverOptions(time_limit_s=5), verify=False,
                         batches=[torch.ones(4, 3)] * 2, **({"state": [model, opt]} if kwargs.get("state") else {}))


def test_search_moves_the_freer_to_its_makers_stream():
    plan, report = _search(state=True)
    assert plan.sched("Step").stream == plan.sched("Backward").stream is None
    assert any(n.startswith("Step moved to the default stream: it frees gradients allocated there (by the forward "
                            "ops of Backward") for n in report.notes), report.notes
    assert "Step: Constraints(frozen=...) put it on stream 'side'; the gradient repair overrides that" in report.notes
    assert report.period_s > 0


def test_search_without_state_says_the_streams_were_not_checked():
    plan, report = _search()
    assert plan.sched("Step").stream == "side"
    assert any(n.startswith("streams not checked for cross-stream gradient frees") for n in report.notes), report.notes


def test_record_grads_names_the_task_whose_forward_ops_allocate_the_gradients():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def forward(ctx):
        ctx.loss = model(ctx.batch).sum()

    def step(ctx):
        opt.step()
        opt.zero_grad(set_to_none=True)

    plan = PipelinePlan({PipelineTask("Forward", forward): TaskSchedule(0, "fwd"),
                         PipelineTask("Backward", lambda ctx: ctx.loss.backward()): TaskSchedule(0),
                         PipelineTask("Step", step): TaskSchedule(1, "opt")},
                        intra_iter_deps=[("Backward", "Forward"), ("Step", "Backward")])
    traffic = record_grads(plan, torch.ones(4, 3), [model, opt])
    assert (traffic.makers, traffic.frees, traffic.allocators) == (
        ("Backward",), {"Step": ("Backward",)}, {"Step": ("Forward",)})
    fixed, notes = repair_plan(plan, traffic)
    assert fixed.sched("Step").stream == "fwd" and len(notes) == 1


# -- the scenario on the fake device ------------------------------------------------------------------

def _scenario(dev, step_stream: Optional[str] = "opt", n_iters: int = 6):
    """Emb and Forward on ``fwd``, Backward on the default stream, Step (step, zero_grad(set_to_none=True)) on
    ``step_stream``; Emb does not wait for Step. Returns the bound plan, the model, its optimizer, the batches."""
    torch.manual_seed(0)
    table, model = torch.nn.Embedding(32, 8), torch.nn.Linear(8, 8)
    table.weight.requires_grad_(False)
    if dev is not None:
        dev.module(table)
        dev.module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ids = [torch.arange(8) + 3 * i for i in range(n_iters)]

    def emb(ctx):
        ctx.e = table(ids[ctx.batch] if dev is None else dev.tensor(ids[ctx.batch]))

    def forward(ctx):
        ctx.loss = model(ctx.e).pow(2).sum()

    def step(ctx):
        opt.step()
        opt.zero_grad(set_to_none=True)

    plan = PipelinePlan({PipelineTask("Emb", emb): TaskSchedule(0, "fwd", "g0"),
                         PipelineTask("Forward", forward): TaskSchedule(0, "fwd", "g0"),
                         PipelineTask("Backward", lambda ctx: ctx.loss.backward()): TaskSchedule(0, None, "g1"),
                         PipelineTask("Step", step): TaskSchedule(1, step_stream, "g2")},
                        intra_iter_deps=[("Forward", "Emb"), ("Backward", "Forward"), ("Step", "Backward")],
                        inter_iter_deps=[("Forward", "Step", 1)])
    return plan, model, opt, list(range(n_iters))


@pytest.mark.cuda
def test_the_repair_puts_the_gradient_freer_on_the_stream_that_allocated_them_on_the_fake_device():
    from swpipe.testing import FakeCuda, kernels

    plan, ref, ref_opt, batches = _scenario(None)
    SWPipeline(plan, device="cpu").run_serial(batches)  # the serial loop's weights
    with FakeCuda(num_devices=1, max_delay_s=0.0005) as fake:
        dev = fake.device(0)
        plan, model, opt, batches = _scenario(dev)
        traffic = record_grads(plan, batches[0], [model, opt])
        assert traffic.frees == {"Step": ("Backward",)} and traffic.allocators == {"Step": ("Forward",)}
        by_makers = plan.replace(schedule={**plan.schedule, "Step": TaskSchedule(1, None, "g2")})  # the old repair
        SWPipeline(by_makers, device=dev).run(batches)
        assert fake.races and {(r.second.kind, r.second.label[:5], r.first.kind, r.first.where)
                               for r in fake.races} == {("free", "Step(", "read", "default")}
    with FakeCuda(num_devices=1, max_delay_s=0.0005) as fake:
        dev = fake.device(0)
        plan, model, opt, batches = _scenario(dev)
        repaired, _ = repair_plan(plan, record_grads(plan, batches[0], [model, opt]))
        assert repaired.sched("Step").stream == "fwd"
        SWPipeline(repaired, device=dev).run(batches)
        k = kernels(dev)
        assert fake.races == []
        assert all(torch.equal(k.to_host(p), q) for p, q in zip(model.parameters(), ref.parameters()))
