"""swpipe.gpipe.balance.steps: balances judged by their training steps timed in the same rounds."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from swpipe.gpipe.balance import (BalanceSteps, balance_by_steps, balance_by_time, compare_balances,
                                  neighbour_balances)
from swpipe.gpipe.balance import steps as steps_module
from swpipe.gpipe.errors import GPipeArgumentError


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2))


def batch():
    torch.manual_seed(1)
    return torch.randn(8, 6), torch.randn(8, 2)


def test_neighbours_move_one_cut_within_the_window_and_keep_every_partition():
    found = neighbour_balances([2, 3, 1], window=2)
    assert found[0] == [2, 3, 1]
    assert found[1:] == [[1, 4, 1], [3, 2, 1], [4, 1, 1], [2, 1, 3], [2, 2, 2]]
    for b in found[1:]:  # one cut moved: the other cut stays where it was
        cuts, base = list(itertools.accumulate(b))[:-1], [2, 5]
        assert sum(c != d for c, d in zip(cuts, base)) == 1 and min(b) >= 1
    assert neighbour_balances([2, 3, 1], window=0) == [[2, 3, 1]]
    assert neighbour_balances([5]) == [[5]]


@pytest.mark.parametrize("balance, window, argument", [([2, 0], 1, "balance"), ([], 1, "balance"),
                                                       ([2, 2], -1, "window"), ([2, 2], True, "window")])
def test_neighbours_refuse_an_empty_partition_or_a_bad_window(balance, window, argument):
    with pytest.raises(GPipeArgumentError) as info:
        neighbour_balances(balance, window=window)
    assert info.value.argument == argument


def test_ratios_are_taken_within_each_round_so_a_slow_round_moves_no_balance():
    # balance b is 10 % faster than the reference in every round; round 2 ran 3x slower throughout
    reference = [1.0, 1.1, 3.0, 1.0, 0.9]
    faster = [0.9 * s for s in reference]
    slower = [1.2 * s for s in reference]
    s = BalanceSteps.from_rounds([[3, 3], [2, 4], [4, 2]], [reference, faster, slower])
    assert s.ratio == pytest.approx([1.0, 0.9, 1.2])
    assert s.spread[1:] == pytest.approx([0.0, 0.0])  # the ratios do not move, the raw times do
    assert s.spread[0] > 0.1
    assert s.fastest == [2, 4]
    assert s.median_s == pytest.approx([1.0, 0.9, 1.2])


def test_a_tie_keeps_the_reference():
    s = BalanceSteps.from_rounds([[3, 3], [2, 4]], [[1.0, 2.0], [2.0, 1.0]])
    assert s.ratio == [1.0, 1.25] and s.fastest == [3, 3]
    s = BalanceSteps.from_rounds([[3, 3], [2, 4]], [[1.0, 1.0], [1.0, 1.0]])
    assert s.fastest == [3, 3]


def test_the_rounds_rotate_the_order_and_time_every_balance_once_each(monkeypatch):
    order = []
    scripted = {(2, 4): 0.8, (3, 3): 1.0, (4, 2): 1.1}

    def fake_step(pipe, input, target, loss_fn):
        order.append(tuple(pipe.balance))
        return scripted[tuple(pipe.balance)] * (1 + len(order))  # the machine slows down step by step

    monkeypatch.setattr(steps_module, "timed_step", fake_step)
    x, y = batch()
    s = compare_balances(model(), [[3, 3], [2, 4], [4, 2]], x, y, nn.functional.mse_loss,
                         devices=["cpu", "cpu"], rounds=3, warmup=1)
    warm, timed = order[:3], order[3:]
    assert warm == [(3, 3), (2, 4), (4, 2)]
    assert [timed[3 * r] for r in range(3)] == [(3, 3), (2, 4), (4, 2)]  # each round starts one later
    assert all(sorted(timed[3 * r:3 * r + 3]) == sorted(scripted) for r in range(3))
    assert s.fastest == [2, 4]
    assert [len(r) for r in s.steps_s] == [3, 3, 3]


def test_the_users_module_is_not_trained_or_touched():
    m = model()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    x, y = batch()
    s = compare_balances(m, [[3, 3], [2, 4]], x, y, nn.functional.mse_loss, chunks=2, devices=["cpu", "cpu"],
                         rounds=2)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())  # BatchNorm's statistics too
    assert all(p.grad is None for p in m.parameters())
    assert [len(r) for r in s.steps_s] == [2, 2] and min(min(r) for r in s.steps_s) > 0


@pytest.mark.parametrize("balances, rounds, argument", [([], 2, "balances"), ([[3, 3]], 0, "rounds")])
def test_compare_refuses_nothing_to_time(balances, rounds, argument):
    x, y = batch()
    with pytest.raises(GPipeArgumentError) as info:
        compare_balances(model(), balances, x, y, nn.functional.mse_loss, devices=["cpu", "cpu"], rounds=rounds)
    assert info.value.argument == argument


def test_balance_by_steps_starts_from_the_profiles_balance_and_returns_the_faster_neighbour(monkeypatch):
    x, y = batch()
    profiled = balance_by_time(2, model(), x[:4], timeout=0.05)
    neighbour = neighbour_balances(profiled)[1]
    samples = []

    def fake_step(pipe, input, target, loss_fn):
        return 0.5 if pipe.balance == neighbour else 1.0

    monkeypatch.setattr(steps_module, "timed_step", fake_step)
    monkeypatch.setattr("swpipe.gpipe.balance.balance_by_time", lambda k, m, sample, **kw: samples.append(sample)
                        or list(profiled))
    found = balance_by_steps(2, model(), x, y, nn.functional.mse_loss, chunks=2, devices=["cpu", "cpu"], rounds=2)
    assert [tuple(t.shape) for t in samples] == [(4, 6)]  # profiled on one micro-batch
    assert found.balances == neighbour_balances(profiled)
    assert found.fastest == neighbour and found.ratio[1] == pytest.approx(0.5)


class _StepOnDevices:
    """What timed_step reads of a GPipe, with a step that leaves a 50 ms kernel queued on each of two devices."""

    def __init__(self, devices):
        self.devices, self.finished = devices, []

    def parameters(self):
        return []

    def step(self, input, target, loss_fn):
        from swpipe.testing import kernels

        for device in self.devices:
            kernels(device).spin(0.05)
            done = device.event()
            device.record(done, device.current_stream())
            self.finished.append((device, done))


@pytest.mark.cuda
def test_a_timed_step_ends_when_every_partitions_device_has_run_its_work(fake_cuda):
    from swpipe.gpipe.measure import timed_step

    pipe = _StepOnDevices([fake_cuda.device(0), fake_cuda.device(1)])
    assert timed_step(pipe, None, None, None) > 0
    assert [device.query(done) for device, done in pipe.finished] == [True, True]  # nothing left in flight
