"""GPipe's balance and chunks chosen again between steps (AdaptiveGPipe): the decision on scripted step times and
layer costs (no timing), the same parameter tensors across a rebalance, and training equal to the unswitched GPipe's."""

from __future__ import annotations

from typing import List

import pytest
import torch
from torch import nn

from swpipe.gpipe import GPipe
from swpipe.gpipe.predict import LayerModel
from swpipe.replan import ReplanOptions
from swpipe.replan.gpipe import AdaptiveGPipe
from test_replan_pp import DRIFT_AT, OPTS, SLOW_FROM, STEPS, StepClock

pytestmark = pytest.mark.timeout(300)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def _layers(first: float) -> LayerModel:
    """Five layers of 1 ms per sample forward and 2 ms backward, the first ``first`` times as dear."""
    scale = [first, 1.0, 1.0, 1.0, 1.0]
    return LayerModel(forward=[(0.0, 1e-3 * s) for s in scale], backward=[(0.0, 2e-3 * s) for s in scale],
                      saved_per_sample=[100.0] * 5, output_per_sample=[10.0] * 5)


class Said:
    def __init__(self, layers: LayerModel) -> None:
        self.layers, self.samples = layers, []

    def __call__(self, gpipe, sample):
        self.samples.append(tuple(sample.shape))
        return self.layers


def _train(replan, chunks=(2,), layer_costs=None, clock=None):
    gpipe = GPipe(_model(), balance=[3, 2], devices=["cpu", "cpu"], chunks=2, checkpoint="never")
    adaptive = AdaptiveGPipe(gpipe, chunks=chunks, replan=replan, layer_costs=layer_costs, clock=clock)
    ids = [id(p) for p in adaptive.parameters()]
    opt = torch.optim.SGD(adaptive.parameters(), lr=0.1)
    losses, used = [], []
    for i in range(STEPS):
        g = torch.Generator().manual_seed(100 + i)
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        used.append((list(adaptive.gpipe.balance), adaptive.gpipe.chunks))
        losses.append(float(adaptive.step(x, y, nn.functional.mse_loss)))
        opt.step()
    return adaptive, ids, losses, used, [p.detach().clone() for p in adaptive.parameters()]


def test_a_drift_rebalances_on_the_layer_costs_now_and_keeps_the_same_parameters_and_the_math():
    said = Said(_layers(first=6.0))  # the first layer became as dear as the other four together, and then some
    adaptive, ids, losses, used, params = _train(OPTS, chunks=(2, 4), layer_costs=said, clock=StepClock(SLOW_FROM))
    [d] = adaptive.decisions
    assert (d.step, d.swapped, d.starts_at) == (DRIFT_AT, True, DRIFT_AT + 1)
    assert (d.running, d.chosen, d.choice) == ("balance [3, 2] chunks 2", "balance [1, 4] chunks 4", ([1, 4], 4))
    assert (d.reference_s, d.measured_s, d.noise, d.costs) == (1.0, 2.0, 0.05, said.layers)
    assert d.predicted_new_s < d.predicted_old_s and set(d.predicted) >= {d.running, d.chosen}
    assert said.samples == [(4, 8)]  # one micro-batch of the step that completed the drift
    assert used == [([3, 2], 2)] * (DRIFT_AT + 1) + [([1, 4], 4)] * (STEPS - DRIFT_AT - 1)
    assert d.measured_after_s == 2.0
    assert [id(p) for p in adaptive.parameters()] == ids  # the same tensors: the optimizer kept training them
    ref, ref_ids, ref_losses, ref_used, ref_params = _train(None)
    assert set(map(str, ref_used)) == {str(([3, 2], 2))}
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(params, ref_params))


def test_the_balance_alone_is_chosen_when_one_chunk_count_is_allowed():
    adaptive, *_ = _train(OPTS, layer_costs=Said(_layers(first=6.0)), clock=StepClock(SLOW_FROM))
    assert adaptive.decisions[0].choice == ([1, 4], 2) and adaptive.gpipe.chunks == 2


def test_no_switch_when_the_running_balance_is_still_the_best():
    adaptive, _, _, used, _ = _train(OPTS, layer_costs=Said(_layers(first=1.0)), clock=StepClock(SLOW_FROM))
    [d] = adaptive.decisions  # five equal layers on two partitions: [2, 3] is as fast as [3, 2], a tie is no gain
    assert (d.swapped, d.chosen, d.starts_at) == (False, "balance [2, 3] chunks 2", None)
    assert d.predicted_new_s == d.predicted_old_s
    assert {str(u) for u in used} == {str(([3, 2], 2))} and adaptive.reference_s == 2.0


def test_several_chunk_counts_with_deferred_batch_norm_are_refused():
    from swpipe_core.engine.options import OptionError

    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    gpipe = GPipe(model, balance=[2, 1], devices=["cpu", "cpu"], chunks=2, deferred_batch_norm=True)
    with pytest.raises(OptionError) as refused:
        AdaptiveGPipe(gpipe, chunks=[2, 4])
    assert (refused.value.given_to, refused.value.field, refused.value.value) == ("AdaptiveGPipe", "chunks", [2, 4])
    assert AdaptiveGPipe(gpipe).chunk_counts == [2]
