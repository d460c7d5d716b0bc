"""GPipe after a failed run: the module's state as before it, a hung partition named, a batch dimension changed."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from conftest import swpipe_threads
from swpipe.gpipe import GPipe
from swpipe.gpipe.errors import BatchDimensionError, GPipeArgumentError, PartitionTimeoutError
from swpipe.gpipe.microbatch import current


class Boom(Exception):
    pass


class FailOn(nn.Module):
    """Raises in forward (``where`` "forward" or "after") or in backward on micro-batch ``index`` while ``armed``."""

    def __init__(self, index: int, where: str) -> None:
        super().__init__()
        self.index, self.where, self.armed = index, where, False

    def forward(self, x):
        if self.armed and self.where != "backward" and current().index == self.index:
            raise Boom(f"micro-batch {self.index}")
        return _FailBackward.apply(x, self) if self.where == "backward" else x


class _FailBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, layer):
        ctx.layer, ctx.index = layer, current().index
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if ctx.layer.armed and ctx.index == ctx.layer.index:
            raise Boom("backward")
        return g, None


def bn_gpipe(index: int, where: str, deferred: bool) -> GPipe:
    torch.manual_seed(0)
    fail = FailOn(index, where)
    # where="after": the failing layer follows the batch norm, so the last micro-batch has reached it
    layers = [nn.Linear(3, 3), nn.BatchNorm1d(3), fail] if where == "after" else [nn.Linear(3, 3), fail,
                                                                                    nn.BatchNorm1d(3)]
    return GPipe(nn.Sequential(*layers), [2, 1], devices=["cpu", "cpu"], chunks=4, deferred_batch_norm=deferred)


def state(gpipe: GPipe) -> dict:
    out = {k: v.clone() for k, v in gpipe.state_dict().items()}
    out.update({f"{n}.grad": (None if p.grad is None else p.grad.clone()) for n, p in gpipe.named_parameters()})
    return out


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert (got[k] is None) == (want[k] is None), k
        if want[k] is not None:
            assert torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("deferred", [True, False])
@pytest.mark.parametrize("where, index, run", [
    ("forward", 2, "forward"),   # micro-batches 0 and 1 reached the batch norm, 2 and 3 did not
    ("forward", 2, "step"),
    ("after", 3, "forward"),     # every micro-batch reached it: deferred statistics were committed
    ("backward", 3, "step"),     # partition 0's last backward: every other gradient accumulated already
])
def test_a_failed_run_leaves_the_module_as_before(deferred, where, index, run):
    gpipe, reference = bn_gpipe(index, where, deferred), bn_gpipe(index, where, deferred)
    fail = [layer for layer in gpipe if isinstance(layer, FailOn)][0]
    x, target = torch.randn(8, 3) * 5 + 1, torch.randn(8, 3)
    gpipe.step(x, target, nn.functional.mse_loss)  # gradients and statistics before: not at their initial values
    reference.step(x, target, nn.functional.mse_loss)
    before = state(gpipe)
    fail.armed = True
    with pytest.raises(Boom):
        if run == "forward":
            gpipe(x)
        else:
            gpipe.step(x, target, nn.functional.mse_loss)
    assert_same(state(gpipe), before)
    fail.armed = False
    gpipe.step(x, target, nn.functional.mse_loss)  # the next run mixes in nothing of the failed one
    reference.step(x, target, nn.functional.mse_loss)
    assert_same(state(gpipe), state(reference))


def _join_swpipe_threads() -> None:
    for t in threading.enumerate():
        if t.name.startswith("swpipe-"):
            t.join(30)


def test_a_hung_partition_fails_the_run_after_timeout_s_naming_partition_and_micro_batch():
    release = threading.Event()
    entered = threading.Event()

    class Hang(nn.Module):
        armed = False

        def forward(self, x):
            if self.armed and current().index == 2:
                entered.set()
                release.wait(60)  # released by the test's teardown below
            return x

    hang = Hang()
    gpipe = GPipe(nn.Sequential(nn.Identity(), hang, nn.Identity()), [1, 1, 1], devices=["cpu"] * 3, chunks=4,
                  timeout_s=60)
    gpipe(torch.zeros(8, 2))  # a first run's lazy initialisation, under a generous timeout
    gpipe.timeout_s = 1.0     # short: the next run waits this long for the hung micro-batch
    gpipe(torch.zeros(8, 2))
    hang.armed = True
    try:
        with pytest.raises(PartitionTimeoutError) as info:
            gpipe(torch.zeros(8, 2))
    finally:
        release.set()
        _join_swpipe_threads()
    assert entered.is_set()
    err = info.value
    assert (err.partition, err.microbatch, err.task, err.timeout_s) == (1, 2, "forward", 1.0)
    assert err.device == torch.device("cpu") and isinstance(err, RuntimeError)
    assert "drain()" not in str(err) and "Timeouts(" not in str(err)
    assert swpipe_threads() == []
    hang.armed = False
    assert gpipe(torch.ones(8, 2)).tolist() == [[1.0, 1.0]] * 8  # usable again


@pytest.mark.parametrize("timeout_s", [0, -1, "5", True])
def test_timeout_s_must_be_a_positive_number(timeout_s):
    with pytest.raises(GPipeArgumentError) as info:
        GPipe(nn.Sequential(nn.Identity()), [1], devices=["cpu"], timeout_s=timeout_s)
    assert info.value.argument == "timeout_s"


class SumBatch(nn.Module):
    def forward(self, x):
        return x.sum(0, keepdim=True)


@pytest.mark.parametrize("run", ["forward", "step"])
def test_a_layer_that_changes_the_batch_dimension_is_named_with_chunks_above_one(run):
    gpipe = GPipe(nn.Sequential(nn.Linear(3, 3), SumBatch(), nn.Linear(3, 3), nn.Tanh()), [1, 1, 2],
                  devices=["cpu"] * 3, chunks=4)
    x = torch.randn(8, 3)
    with pytest.raises(BatchDimensionError) as info:
        if run == "forward":
            gpipe(x)
        else:
            gpipe.step(x, torch.randn(8, 3), nn.functional.mse_loss)
    err = info.value
    assert (err.partition, err.microbatch, err.expected, err.got) == (1, 0, 2, 1)
    assert all(p.grad is None for p in gpipe.parameters())


def test_one_micro_batch_may_change_the_batch_dimension_as_the_module_run_whole():
    model = nn.Sequential(nn.Linear(3, 3), SumBatch())
    x = torch.randn(8, 3)
    want = model(x)
    for chunks, batch in ((1, x), (4, x[:1])):
        gpipe = GPipe(model, [1, 1], devices=["cpu"] * 2, chunks=chunks)
        assert torch.equal(gpipe(batch), model(batch))
    assert want.shape == (1, 3)
