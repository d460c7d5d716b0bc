"""GPipe.step: a training step as one plan, by GPipe's schedule or 1F1B, with the gradients of forward + backward."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from swpipe import validate
from swpipe.gpipe import GPipe
from swpipe.gpipe.errors import GPipeArgumentError, LossFunctionError, StepModeError
from swpipe.gpipe.schedule import Placement, forward_plan, step_plan
from swpipe.gpipe.skip import pop, skippable, stash


@skippable(stash=["s"])
class Save(nn.Module):
    def forward(self, x):
        yield stash("s", x)
        return x * 3


@skippable(pop=["s"])
class Use(nn.Module):
    def forward(self, x):
        s = yield pop("s")
        return x - s


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 5), Save(), nn.Tanh(), nn.Linear(5, 5), Use(), nn.Linear(5, 2)).double()


def loss_fn(out, target):
    return nn.functional.mse_loss(out, target)


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
@pytest.mark.parametrize("checkpoint", ["always", "except_last", "never"])
@pytest.mark.parametrize("balance", [[2, 4], [1, 2, 3]])
def test_step_gives_the_gradients_and_loss_of_forward_and_backward(schedule, checkpoint, balance):
    reference = model()
    x = torch.randn(10, 5, dtype=torch.float64, requires_grad=True)
    target = torch.randn(10, 2, dtype=torch.float64)
    expected = loss_fn(reference(x), target)
    expected.backward()
    expected_x = x.grad.clone()
    x.grad = None
    gpipe = GPipe(model(), balance, devices=["cpu"] * len(balance), chunks=4, checkpoint=checkpoint,
                  schedule=schedule)
    loss = gpipe.step(x, target, loss_fn)
    torch.testing.assert_close(loss, expected.detach(), rtol=0, atol=1e-12)
    for got, want in zip(gpipe.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(x.grad, expected_x, rtol=0, atol=1e-12)


def test_summed_losses_and_uneven_micro_batches():
    reference = model()
    x, target = torch.randn(7, 5, dtype=torch.float64), torch.randn(7, 2, dtype=torch.float64)

    def summed(out, t):
        return (out - t).square().sum()

    summed(reference(x), target).backward()
    gpipe = GPipe(model(), [3, 3], devices=["cpu", "cpu"], chunks=3, schedule="1F1B")
    gpipe.step(x, target, summed, reduction="sum")
    for got, want in zip(gpipe.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=1e-12)


def test_bad_step_arguments_name_the_argument():
    gpipe = GPipe(model(), [3, 3], devices=["cpu", "cpu"], chunks=2)
    with pytest.raises(GPipeArgumentError) as info:
        gpipe.step(torch.ones(4, 5, dtype=torch.float64), torch.ones(3, 2), loss_fn)
    assert info.value.argument == "target"
    with pytest.raises(GPipeArgumentError) as info:
        gpipe.step(torch.ones(4, 5, dtype=torch.float64), torch.ones(4, 2), loss_fn, reduction="max")
    assert info.value.argument == "reduction"


def test_a_failing_backward_is_raised_and_nothing_hangs():
    class Boom(Exception):
        pass

    class BadGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise Boom()

    class Layer(nn.Module):
        def forward(self, x):
            return BadGrad.apply(x)

    gpipe = GPipe(nn.Sequential(nn.Linear(2, 2), Layer(), nn.Linear(2, 1)), [1, 2], devices=["cpu", "cpu"],
                  chunks=4, schedule="1F1B")
    with pytest.raises(Boom):
        gpipe.step(torch.ones(8, 2), torch.ones(8, 1), loss_fn)


@pytest.mark.parametrize("schedule, most", [("GPipe", 6), ("1F1B", 2)])
def test_1f1b_holds_fewer_micro_batches_in_flight(schedule, most):
    alive = []

    class Track(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            alive.append(alive[-1] + 1 if alive else 1)
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            alive.append(alive[-1] - 1)
            return g

    class Layer(nn.Module):
        def forward(self, x):
            return Track.apply(x)

    gpipe = GPipe(nn.Sequential(nn.Linear(2, 2), Layer(), nn.Linear(2, 1)), [2, 1], devices=["cpu", "cpu"],
                  chunks=6, checkpoint="never", schedule=schedule)
    gpipe.step(torch.ones(12, 2), torch.ones(12, 1), loss_fn)
    # partition 0 holds a micro-batch's activations from its forward to its backward
    assert max(alive) == most and alive[-1] == 0


def test_plans_validate_and_have_the_schedules_stages():
    places = [Placement("cpu", f"p{j}") for j in range(3)]
    fwd, fill, one = forward_plan(places, microbatches=4), step_plan(places, "GPipe", 4), step_plan(places, "1F1B", 4)
    for plan in (fwd, fill, one):
        validate(plan)
    assert [fwd.stage(f"F{j}") for j in range(3)] == [0, 1, 2]
    assert [fill.stage(f"B{j}") for j in range(3)] == [7, 6, 5]  # m + 2n - 3 - j
    assert [one.stage(f"F{j}") for j in range(3)] == [0, 0, 0] and [one.stage(f"B{j}") for j in range(3)] == [2, 1, 0]
    assert {fwd.sched(t).thread_group for t in fwd.task_names} == {"p0", "p1", "p2"}


def test_a_device_boundary_gets_copy_tasks_on_copy_streams():
    places = [Placement("cuda:0", "cuda0", "compute0", "copy0"), Placement("cuda:0", "cuda0", "compute0", "copy0"),
              Placement("cuda:1", "cuda1", "compute1", "copy1")]
    plan = step_plan(places, "1F1B", 2)
    assert plan.task_names == ["F0", "F1", "C2", "F2", "B2", "G1", "B1", "B0"]
    assert plan.sched("C2").stream == "copy1" and plan.sched("G1").stream == "copy0"
    assert ("C2", "F1") in plan.intra_iter_deps and ("F2", "C2") in plan.intra_iter_deps
    assert ("G1", "B2") in plan.intra_iter_deps and ("B0", "B1") in plan.intra_iter_deps
    validate(plan)


def test_the_plan_prints_its_clock_cycles():
    gpipe = GPipe(model(), [3, 3], devices=["cpu", "cpu"], chunks=3)
    lines = str(gpipe.plan).splitlines()
    assert lines[-2].split() == ["F0", "p0", "default", "|", "i0", "i1", "i2"]
    assert lines[-1].split() == ["F1", "p1", "default", "|", "i0", "i1", "i2"]
    assert gpipe.training_plan(schedule="1F1B").kind == "1F1B"


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "eval"])
def test_step_is_refused_where_no_gradient_is_wanted(mode):
    gpipe = GPipe(model(), [3, 3], devices=["cpu", "cpu"], chunks=2)
    modes = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "eval": contextlib.nullcontext}
    if mode == "eval":
        gpipe.eval()
    x, target = torch.ones(4, 5, dtype=torch.float64), torch.ones(4, 2, dtype=torch.float64)
    with modes[mode](), pytest.raises(StepModeError) as info:
        gpipe.step(x, target, loss_fn)
    assert info.value.mode == mode and isinstance(info.value, RuntimeError)
    assert all(p.grad is None for p in gpipe.parameters())


@pytest.mark.parametrize("returned, problem", [
    (lambda out, t: 0.5, "not_tensor"),
    (lambda out, t: (out - t).square(), "not_scalar"),
    (lambda out, t: torch.tensor(0.5, dtype=torch.float64), "no_grad"),
])
def test_a_loss_fn_that_returns_no_scalar_loss_is_named(returned, problem):
    gpipe = GPipe(model(), [3, 3], devices=["cpu", "cpu"], chunks=2)
    with pytest.raises(LossFunctionError) as info:
        gpipe.step(torch.ones(4, 5, dtype=torch.float64), torch.ones(4, 2, dtype=torch.float64), returned)
    err = info.value
    assert (err.argument, err.problem, err.microbatch) == ("loss_fn", problem, 0)
    assert isinstance(err, GPipeArgumentError) and err.fix
    assert all(p.grad is None for p in gpipe.parameters())
