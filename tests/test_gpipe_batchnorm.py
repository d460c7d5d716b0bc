"""Deferred batch norm: running statistics over the whole mini-batch, inside and outside GPipe."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from swpipe.gpipe import GPipe
from swpipe.gpipe.batchnorm import DeferredBatchNorm


def tilted(n: int = 8) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.rand(n, 3, 4, 4)
    return x * torch.tensor([1.0, 10.0, 100.0]).view(1, 3, 1, 1) + torch.arange(n).view(n, 1, 1, 1)


@pytest.mark.parametrize("checkpoint", ["always", "except_last", "never"])
@pytest.mark.parametrize("batch", [8, 3])  # 3 samples with chunks=4: three micro-batches, committed all the same
def test_running_statistics_equal_the_whole_batch(checkpoint, batch):
    bn = nn.BatchNorm2d(3)
    model = nn.Sequential(nn.Conv2d(3, 3, 1), copy.deepcopy(bn))
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(3).view(3, 3, 1, 1))
        model[0].bias.zero_()
    gpipe = GPipe(model, [1, 1], devices=["cpu", "cpu"], chunks=4, checkpoint=checkpoint, deferred_batch_norm=True)
    assert isinstance(gpipe[1], DeferredBatchNorm)
    x = tilted(batch)
    for _ in range(2):
        gpipe(x).mean().backward()
        bn(x)
    torch.testing.assert_close(gpipe[1].running_mean, bn.running_mean)
    torch.testing.assert_close(gpipe[1].running_var, bn.running_var)
    assert int(gpipe[1].num_batches_tracked) == int(bn.num_batches_tracked) == 2


def test_outside_gpipe_the_statistics_commit_every_chunks_calls():
    bn, dbn = nn.BatchNorm2d(3, momentum=None), DeferredBatchNorm(3, momentum=None, chunks=4)
    x = tilted()
    bn(x)
    for piece in x.chunk(4)[:3]:
        dbn(piece)
    assert int(dbn.num_batches_tracked) == 0 and torch.equal(dbn.running_mean, torch.zeros(3))
    dbn(x.chunk(4)[3])
    torch.testing.assert_close(dbn.running_mean, bn.running_mean)
    torch.testing.assert_close(dbn.running_var, bn.running_var)
    dbn.eval(), bn.eval()
    torch.testing.assert_close(dbn(x), bn(x))


def test_conversion_keeps_parameters_and_skips_what_tracks_nothing():
    model = nn.Sequential(nn.BatchNorm1d(2), nn.BatchNorm1d(2, track_running_stats=False))
    converted = DeferredBatchNorm.convert_deferred_batch_norm(model, chunks=2)
    assert isinstance(converted[0], DeferredBatchNorm) and type(converted[1]) is nn.BatchNorm1d
    assert converted[0].weight is model[0].weight
    assert DeferredBatchNorm.convert_deferred_batch_norm(converted[0], chunks=2) is converted[0]
    assert DeferredBatchNorm.convert_deferred_batch_norm(converted[0], chunks=3) is not converted[0]
