"""swpipe.gpipe.predict: a step's time, bubble and activation memory predicted from layer profiles, and measured."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swpipe import gantt, lower_bounds, simulate, what_if as what_if_costs
from swpipe.gpipe import GPipe
from swpipe.gpipe.balance import LayerProfile, profile_layers
from swpipe.gpipe.measure import measure_step
from swpipe.gpipe.predict import LayerModel, choose, predict_step, what_if


def uniform(layers=4, forward=0.001, backward=0.002, saved=100.0):
    """Layers that each take ``forward`` / ``backward`` seconds and keep ``saved`` bytes per sample."""
    return LayerModel(forward=[(0.0, forward)] * layers, backward=[(0.0, backward)] * layers,
                      saved_per_sample=[saved] * layers, output_per_sample=[10.0] * layers)


@pytest.mark.parametrize("chunks", [1, 2, 4, 8])
def test_equal_partitions_have_gpipe_s_bubble(chunks):
    p = predict_step(uniform(), [2, 2], batch=8, chunks=chunks, checkpoint="never")
    assert p.bubble == pytest.approx(1 / (chunks + 1))  # (n - 1) / (m + n - 1)
    assert p.step_s == pytest.approx(p.bound_s)  # no contention: the step reaches its bound
    assert p.step_s == pytest.approx((chunks + 1) * 2 * 0.003 * 8 / chunks)


def test_the_step_plan_is_read_by_simulate_bounds_and_gantt():
    p = predict_step(uniform(), [3, 1], batch=8, chunks=4, checkpoint="always", schedule="1F1B")
    assert simulate(p.plan, p.costs, num_iterations=4, lengthen=False).makespan == pytest.approx(p.step_s)
    # partition 0's thread per micro-batch of 2 samples: 3 layers x (forward + backward + recomputed forward)
    assert lower_bounds(p.plan, p.costs).value == pytest.approx(3 * 2 * (0.001 + 0.002 + 0.001))
    assert gantt(p.sim.events) is not None
    # swpipe.what_if on the plan: half partition 0's backward, the steady-state period follows the new bottleneck
    table = what_if_costs(p.plan, p.costs, {"B0": 0.5})
    assert table.loc["after", "period_s"] < table.loc["before", "period_s"]


def test_what_if_chunks_balance_and_checkpoint():
    base = predict_step(uniform(), [2, 2], batch=8, chunks=2, checkpoint="never")
    rows = what_if(base, uniform(), [{"chunks": 8}, {"balance": [3, 1]}, {"checkpoint": "always"},
                                     {"schedule": "1F1B", "chunks": 8}])
    assert [r.chunks for r in rows] == [2, 8, 2, 2, 8] and rows[2].balance == [3, 1]
    assert rows[1].bubble < rows[0].bubble and rows[2].step_s > rows[0].step_s
    assert rows[3].activation_bytes < rows[0].activation_bytes and rows[3].step_s > rows[0].step_s
    assert rows[4].activation_bytes < rows[1].activation_bytes  # 1F1B keeps fewer micro-batches than GPipe
    assert rows[4].step_s == pytest.approx(rows[1].step_s)


def test_choose_takes_the_fastest_step_under_the_cap():
    # a fixed cost per layer call: many small micro-batches cost more, few keep more memory
    layers = LayerModel(forward=[(0.002, 0.001)] * 4, backward=[(0.004, 0.002)] * 4, saved_per_sample=[100.0] * 4,
                        output_per_sample=[10.0] * 4)
    free, candidates = choose(layers, 2, batch=16)
    assert free is candidates[0]
    cap = sorted(c.activation_bytes for c in candidates)[len(candidates) // 3]
    assert free.activation_bytes > cap
    chosen, _ = choose(layers, 2, batch=16, max_memory_bytes=cap)
    assert chosen.activation_bytes <= cap
    assert all(c.step_s >= chosen.step_s for c in candidates if c.activation_bytes <= cap)
    assert choose(layers, 2, batch=16, max_memory_bytes=1.0)[0] is None


def test_a_fit_over_two_sizes_is_affine():
    small = LayerProfile([0.002], [0.004], [800.0], [400.0], [0.0], batch=8, device="cpu")
    large = LayerProfile([0.003], [0.006], [1600.0], [800.0], [0.0], batch=16, device="cpu")
    model = LayerModel.fit([small, large])
    assert model.at(8)["forward"] == pytest.approx([0.002]) and model.at(32)["backward"] == pytest.approx([0.010])
    assert model.at(4)["saved"] == pytest.approx([400.0])


def net():
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(16, 16), nn.ReLU())])


@pytest.mark.parametrize("schedule, checkpoint", [("GPipe", "never"), ("1F1B", "never"), ("GPipe", "always")])
def test_predicted_activation_memory_per_partition_is_measured(schedule, checkpoint):
    x, target = torch.randn(32, 16), torch.randn(32, 16)
    layers = LayerModel.fit([profile_layers(net(), x[:8], timeout=0.0, num_rounds=1)])
    predicted = predict_step(layers, [4, 4], batch=32, chunks=4, checkpoint=checkpoint, schedule=schedule)
    gpipe = GPipe(net(), [4, 4], devices=["cpu", "cpu"], chunks=4, checkpoint=checkpoint, schedule=schedule)
    measured = measure_step(gpipe, x, target, nn.functional.mse_loss, repeats=1, warmup=0)
    assert measured.activation_by == pytest.approx(predicted.activation_by)
    assert measured.step_s > 0 and all(p.grad is None for p in gpipe.parameters())
