"""swpipe.gpipe.GPipe: torchgpipe's contract (arguments, access, forward, gradients, failures, modes) on the engine."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

from conftest import swpipe_threads
from swpipe.gpipe import GPipe, is_checkpointing, is_recomputing
from swpipe_core.engine import device as device_seam
from swpipe.gpipe.errors import (GPipeArgumentError, InputTypeError, ModuleStructureError, ModuleTypeError,
                                 OutputTypeError, TooFewDevicesError)


def mlp(width: int = 6, layers: int = 4) -> nn.Sequential:
    torch.manual_seed(0)
    mods = []
    for k in range(layers):
        mods += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*mods).double()


def grads(module: nn.Module) -> list:
    return [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("kwargs, error, field, value", [
    (dict(balance=None), GPipeArgumentError, "argument", "balance"),
    (dict(balance=[1, 1]), GPipeArgumentError, "argument", "balance"),
    (dict(balance=[0, 3]), GPipeArgumentError, "argument", "balance"),
    (dict(balance=[1.5, 1.5]), GPipeArgumentError, "argument", "balance"),
    (dict(balance=[3], chunks=0), GPipeArgumentError, "argument", "chunks"),
    (dict(balance=[3], chunks=2.5), GPipeArgumentError, "argument", "chunks"),
    (dict(balance=[3], checkpoint="sometimes"), GPipeArgumentError, "argument", "checkpoint"),
    (dict(balance=[3], schedule="zb"), GPipeArgumentError, "argument", "schedule"),
    (dict(balance=[1, 1, 1], devices=["cpu"]), TooFewDevicesError, "partitions", 3),
])
def test_bad_arguments_raise_errors_naming_the_argument(kwargs, error, field, value):
    model = nn.Sequential(nn.Linear(1, 1), nn.ReLU(), nn.Linear(1, 1))
    kwargs.setdefault("devices", ["cpu"] * 3)
    with pytest.raises(error) as info:
        GPipe(model, **kwargs)
    assert getattr(info.value, field) == value


def test_builtin_exception_types_as_torchgpipe():
    model = nn.Sequential(nn.Linear(1, 1))
    assert issubclass(GPipeArgumentError, ValueError) and issubclass(TooFewDevicesError, IndexError)
    with pytest.raises(ModuleTypeError) as info:
        GPipe(nn.Linear(1, 1), [1], devices=["cpu"])
    assert isinstance(info.value, TypeError) and info.value.type is nn.Linear
    with pytest.raises(ValueError):
        GPipe(model, [1], devices=["cpu"], chunks=-1)


@pytest.mark.parametrize("share", ["child", "parameter"])
def test_shared_children_or_parameters_are_refused(share):
    conv = nn.Conv2d(1, 1, 1)
    if share == "child":
        model = nn.Sequential(conv, conv)
    else:
        model = nn.Sequential(nn.Sequential(conv), nn.Sequential(conv))
    with pytest.raises(ModuleStructureError) as info:
        GPipe(model, [1, 1], devices=["cpu", "cpu"])
    assert info.value.problem == ("duplicate_children" if share == "child" else "duplicate_parameters")
    assert info.value.layers == ("0", "1")


def test_sequential_like_access_and_attributes():
    a, b, c = nn.Linear(1, 1), nn.Linear(1, 1), nn.Linear(1, 1)
    gpipe = GPipe(nn.Sequential(a, b, c), (2, 1), devices=("cpu", "cpu", "cpu"), chunks=3.0)
    assert len(gpipe) == 3 and list(gpipe) == [a, b, c]
    assert gpipe[0] is a and gpipe[-1] is c
    with pytest.raises(IndexError):
        gpipe[3]
    assert gpipe.balance == [2, 1] and gpipe.chunks == 3 and isinstance(gpipe.chunks, int)
    assert gpipe.devices == [torch.device("cpu")] * 2  # extra devices dropped
    assert isinstance(gpipe.partitions, nn.ModuleList)
    assert "partitions.1.2.weight" in gpipe.state_dict()  # the layers keep their names
    assert len(list(gpipe.parameters())) == 6


@pytest.mark.parametrize("move", [lambda g: g.cuda(), lambda g: g.cpu(), lambda g: g.to("cpu"),
                                  lambda g: g.to(torch.device("cpu")), lambda g: g.to(0),
                                  lambda g: g.to(device="cpu"), lambda g: g.to(torch.ones(1))])
def test_moving_is_refused_casting_is_not(move):
    gpipe = GPipe(nn.Sequential(nn.Linear(1, 1)), [1], devices=["cpu"])
    with pytest.raises(TypeError):
        move(gpipe)
    assert gpipe.to(torch.float64)[0].weight.dtype == torch.float64


@pytest.mark.parametrize("balance", [[8], [4, 4], [1, 3, 3, 1]])
@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("checkpoint", ["always", "except_last", "never"])
def test_forward_and_gradients_equal_the_module_run_whole(balance, chunks, checkpoint):
    model = mlp()
    x = torch.randn(10, 6, dtype=torch.float64, requires_grad=True)
    expected = model(x)
    expected.square().sum().backward()
    expected_grads, expected_x = grads(model), x.grad.clone()
    model.zero_grad(set_to_none=True)
    x.grad = None
    gpipe = GPipe(model, balance, devices=["cpu"] * len(balance), chunks=chunks, checkpoint=checkpoint)
    y = gpipe(x)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-12)
    y.square().sum().backward()
    for got, want in zip(grads(gpipe), expected_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(x.grad, expected_x, rtol=0, atol=1e-12)


def test_a_tuple_flows_through_and_comes_back_a_tuple():
    class Split(nn.Module):
        def forward(self, x):
            return x[0] * 2, x[1] + 1

    class Join(nn.Module):
        def forward(self, pair):
            return pair[0] + pair[1], pair[1]

    gpipe = GPipe(nn.Sequential(Split(), Join()), [1, 1], devices=["cpu", "cpu"], chunks=3)
    a, b = torch.arange(6.0), torch.ones(6)
    out = gpipe((a, b))
    assert isinstance(out, tuple) and len(out) == 2
    assert out[0].tolist() == (a * 2 + b + 1).tolist() and out[1].tolist() == (b + 1).tolist()


def test_non_tensors_are_refused_with_where_and_type():
    class Word(nn.Module):
        def forward(self, x):
            return x, "hello"

    gpipe = GPipe(nn.Sequential(Word()), [1], devices=["cpu"])
    with pytest.raises(InputTypeError) as info:
        gpipe((torch.ones(1), 3))
    assert (info.value.where, info.value.index, info.value.type) == ("input", 1, int)
    with pytest.raises(OutputTypeError) as info:
        gpipe(torch.ones(2))
    assert (info.value.where, info.value.index, info.value.type) == ("partition 0 output", 1, str)


def test_small_or_indivisible_batches_give_fewer_or_uneven_micro_batches():
    sizes = []

    class Record(nn.Module):
        def forward(self, x):
            sizes.append(x.shape[0])
            return x

    gpipe = GPipe(nn.Sequential(Record()), [1], devices=["cpu"], chunks=4)
    assert gpipe(torch.arange(7.0)).tolist() == list(range(7))
    assert sizes == [2, 2, 2, 1]
    sizes.clear()
    gpipe(torch.arange(2.0))
    assert sizes == [1, 1]


def test_empty_module_returns_its_input():
    gpipe = GPipe(nn.Sequential(), [])
    x = torch.tensor(42)
    assert gpipe(x) is x
    with pytest.raises(InputTypeError):
        gpipe(42)


def test_a_failing_partition_raises_its_own_exception_and_starts_nothing_more():
    class Boom(Exception):
        pass

    started = []
    raised = []

    class Count(nn.Module):
        def forward(self, x):
            started.append(int(x[0]))
            return x

    class Fail(nn.Module):
        def forward(self, x):
            raised.append(Boom("partition 1"))
            raise raised[-1]

    gpipe = GPipe(nn.Sequential(Count(), Fail()), [1, 1], devices=["cpu", "cpu"], chunks=8)
    with pytest.raises(Boom) as info:
        gpipe(torch.arange(8.0))
    assert info.value is raised[0]  # the layer's own exception object
    # the micro-batch that failed retires no period: partition 0 started at most the pipeline's depth of them
    assert started == sorted(started) and len(started) <= gpipe.plan.pipeline_depth
    assert swpipe_threads() == []


def test_the_gpipe_is_usable_after_a_failure():
    fail = [True]

    class Maybe(nn.Module):
        def forward(self, x):
            if fail[0]:
                raise ValueError("once")
            return x + 1

    gpipe = GPipe(nn.Sequential(nn.Identity(), Maybe()), [1, 1], devices=["cpu", "cpu"], chunks=2)
    with pytest.raises(ValueError):
        gpipe(torch.zeros(4))
    fail[0] = False
    assert gpipe(torch.zeros(4)).tolist() == [1.0] * 4


def test_no_grad_and_eval_are_respected_on_the_partition_threads():
    seen = []

    class Look(nn.Module):
        def forward(self, x):
            seen.append((threading.current_thread().name, torch.is_grad_enabled(), is_checkpointing()))
            return x * 1

    model = nn.Sequential(nn.Linear(2, 2), Look(), nn.Linear(2, 2), Look())
    gpipe = GPipe(model, [2, 2], devices=["cpu", "cpu"], chunks=2)
    with torch.no_grad():
        out = gpipe(torch.ones(4, 2))
    assert out.grad_fn is None
    assert {grad for _, grad, _ in seen} == {False} and not any(chk for _, _, chk in seen)
    assert {name for name, _, _ in seen} == {"swpipe-p0", "swpipe-p1"}  # a thread per CPU partition
    seen.clear()
    gpipe.eval()
    out = gpipe(torch.ones(4, 2))
    assert out.grad_fn is not None and not any(chk for _, _, chk in seen)  # eval: no checkpointing


@pytest.mark.parametrize("checkpoint, recomputed", [("always", 4), ("except_last", 3), ("never", 0)])
def test_checkpoint_modes_recompute_that_many_micro_batches(checkpoint, recomputed):
    flags = []

    class Look(nn.Module):
        def forward(self, x):
            flags.append((is_checkpointing(), is_recomputing()))
            return x * 2

    gpipe = GPipe(nn.Sequential(Look()), [1], devices=["cpu"], chunks=4, checkpoint=checkpoint)
    x = torch.ones(4, requires_grad=True)
    gpipe(x).sum().backward()
    assert flags.count((True, False)) == recomputed and flags.count((False, True)) == recomputed
    assert flags.count((False, False)) == 4 - recomputed
    assert x.grad.tolist() == [2.0] * 4


def test_dropout_is_identical_under_recomputation_with_partitions_on_threads():
    class Drops(nn.Module):
        def forward(self, x):
            for _ in range(20):
                x = nn.functional.dropout(x, p=0.05)
            return x

    torch.manual_seed(1)
    gpipe = GPipe(nn.Sequential(Drops(), Drops()), [1, 1], devices=["cpu", "cpu"], chunks=8, checkpoint="always")
    x = torch.rand(16, 32, requires_grad=True)
    y = gpipe(x)
    y.sum().backward()
    # a recomputed mask that differs would zero other elements of the gradient than of the output
    assert torch.equal(y != 0, x.grad != 0)
    assert 0 < int((y == 0).sum()) < y.numel()


def test_random_numbers_repeat_with_the_seed_whatever_the_threads_do():
    model = nn.Sequential(nn.Dropout(0.5), nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 8))
    gpipe = GPipe(model, [2, 2], devices=["cpu", "cpu"], chunks=4)
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        runs.append(gpipe(torch.ones(8, 8)))
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    assert not torch.equal(gpipe(torch.ones(8, 8)), runs[0])  # the next call draws anew


def test_the_module_is_moved_to_the_partition_devices_and_not_copied():
    model = mlp()
    before = copy.deepcopy(model.state_dict())
    gpipe = GPipe(model, [4, 4], devices=["cpu", "cpu"])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert gpipe[0] is model[0]


def test_integer_devices_fall_back_to_the_cpu_without_cuda(monkeypatch):
    monkeypatch.setattr(device_seam, "cuda_available", lambda: False)
    model = mlp()
    gpipe = GPipe(model, [4, 4], devices=[0, 1], chunks=2)
    assert gpipe.devices == [torch.device("cpu")] * 2
    x = torch.randn(4, 6, dtype=torch.float64)
    torch.testing.assert_close(gpipe(x), model(x), rtol=0, atol=0)


def dropout_mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2)).double()


@pytest.mark.parametrize("chunks, batch", [(1, 8), (4, 1)])  # one micro-batch either way
@pytest.mark.parametrize("checkpoint", ["always", "never"])
@pytest.mark.parametrize("run", ["forward", "step"])
def test_one_micro_batch_draws_the_random_numbers_of_the_module_run_whole(chunks, batch, checkpoint, run):
    model = dropout_mlp()
    x = torch.randn(batch, 8, dtype=torch.float64, requires_grad=True)
    target = torch.randn(batch, 2, dtype=torch.float64)

    def train(fn):
        torch.manual_seed(7)
        if run == "step" and isinstance(fn, GPipe):
            out = fn.step(x, target, nn.functional.mse_loss)
        else:
            out = fn(x)
            loss = nn.functional.mse_loss(out, target)
            loss.backward()
            out = loss if run == "step" else out
        got = (out.detach(), torch.get_rng_state(), x.grad.clone(), grads(fn))
        fn.zero_grad(set_to_none=True)
        x.grad = None
        return got

    want = train(model)
    got = train(GPipe(model, [2, 3], devices=["cpu", "cpu"], chunks=chunks, checkpoint=checkpoint))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    assert all(torch.equal(a, b) for a, b in zip(got[3], want[3]))
