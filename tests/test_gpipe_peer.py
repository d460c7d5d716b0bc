"""swpipe.gpipe beside torchgpipe (the peer, optional): the same outputs and gradients, a balance never costlier.

Skipped where torchgpipe is not installed (``bash scripts/install_peer.sh`` installs it).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from swpipe.gpipe import GPipe
from swpipe.gpipe.balance import balance_cost, optimal_balance

torchgpipe = pytest.importorskip("torchgpipe", reason="torchgpipe not installed (bash scripts/install_peer.sh)")

pytestmark = pytest.mark.peer


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Tanh(),
                         nn.Linear(8, 3)).double()


@pytest.mark.parametrize("checkpoint", ["always", "except_last", "never"])
@pytest.mark.parametrize("balance", [[3, 3], [1, 2, 3]])
def test_outputs_and_gradients_equal_torchgpipe_s(checkpoint, balance):
    x = torch.randn(12, 6, dtype=torch.float64, requires_grad=True)
    runs = []
    for cls in (GPipe, torchgpipe.GPipe):
        g = cls(model(), balance, devices=["cpu"] * len(balance), chunks=4, checkpoint=checkpoint,
                deferred_batch_norm=True)
        xi = x.detach().clone().requires_grad_()
        y = g(xi)
        y.square().sum().backward()
        runs.append((y.detach(), [p.grad for p in g.parameters()], xi.grad))
    ours, theirs = runs
    torch.testing.assert_close(ours[0], theirs[0], rtol=0, atol=1e-12)
    for a, b in zip(ours[1], theirs[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours[2], theirs[2], rtol=0, atol=1e-12)
    # the running statistics are not compared: ours equal nn.BatchNorm's over the whole batch
    # (tests/test_gpipe_batchnorm.py); torchgpipe 0.0.7's keep the micro-batches' biased variance


def test_skip_connections_equal_torchgpipe_s():
    def layers(api):
        @api.skippable(stash=["s"])
        class Save(nn.Module):
            def forward(self, x):
                yield api.stash("s", x)
                return x * 2

        @api.skippable(pop=["s"])
        class Add(nn.Module):
            def forward(self, x):
                s = yield api.pop("s")
                return x + s

        torch.manual_seed(0)
        return nn.Sequential(Save(), nn.Linear(4, 4), nn.Tanh(), Add()).double()

    import swpipe.gpipe.skip as ours_skip
    import torchgpipe.skip as their_skip

    x = torch.randn(6, 4, dtype=torch.float64)
    results = []
    for cls, api in ((GPipe, ours_skip), (torchgpipe.GPipe, their_skip)):
        g = cls(layers(api), [1, 3], devices=["cpu", "cpu"], chunks=3)
        xi = x.clone().requires_grad_()
        y = g(xi)
        y.sum().backward()
        results.append((y.detach(), xi.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=1e-12)


@settings(max_examples=60)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=12), st.integers(1, 4))
def test_the_optimal_balance_is_never_costlier_than_torchgpipe_s_block_partition(costs, k):
    from torchgpipe.balance import blockpartition

    k = min(k, len(costs))
    blocks = blockpartition.solve(costs, partitions=k)
    theirs = [len(b) for b in blocks]
    assert balance_cost(costs, optimal_balance(costs, k)) <= balance_cost(costs, theirs)
