"""What a custom order's path adds per action beyond PyTorch's class: measure_custom_overhead, CustomPathProbe,
CustomOverhead and calibrate_pp's ``custom_overhead_s``.

The arithmetic on injected step times (the slowest rank per round, the median of paired rounds, clamped at 0);
on one rank in this process, what runs (the order, its actions, the modules put back); then on two gloo ranks
(spawned, a ``FileStore``, a hard deadline) that calibrate_pp's figure is >= 0 and the same on both ranks.
No timing is asserted.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Dict

import pytest
import torch
import torch.distributed as dist

from autosched.pp.program import PPError, pp_program
from autosched.pp.rolling import CustomOverhead, CustomPathProbe, calibrate_pp, measure_custom_overhead
from conftest import rank_results, ranks_that_ended, spawned_ranks

pytestmark = pytest.mark.timeout(300)


def test_each_round_takes_the_slowest_rank_and_the_overhead_is_the_median_of_the_paired_rounds():
    builtin = [[2.0, 2.0, 2.0, 2.0, 9.0], [2.5, 2.0, 2.0, 2.0, 9.0]]  # round 5: a load spike on both paths
    custom = [[2.0, 2.4, 2.2, 2.1, 9.3], [2.3, 2.0, 2.0, 2.0, 9.0]]
    out = CustomOverhead.from_steps(builtin, custom, actions=4, schedule="1F1B")
    assert out.builtin_steps_s == (2.5, 2.0, 2.0, 2.0, 9.0)
    assert out.custom_steps_s == (2.3, 2.4, 2.2, 2.1, 9.3)
    assert [round(r, 9) for r in out.rounds_s] == [-0.05, 0.1, 0.05, 0.025, 0.075]
    assert out.overhead_s == pytest.approx(0.05)  # the spike's round is one of five: the median ignores it
    assert out.spread_s == pytest.approx(0.075 - 0.025)
    assert out.noise > 0 and (out.actions, out.schedule) == (4, "1F1B")


def test_a_custom_path_measured_faster_is_clamped_at_zero_and_keeps_its_rounds():
    out = CustomOverhead.from_steps([[1.0, 1.0, 1.0]], [[0.9, 0.8, 1.05]], actions=2, schedule="1F1B")
    assert out.overhead_s == 0.0
    assert [round(r, 9) for r in out.rounds_s] == [-0.05, -0.1, 0.025]


@pytest.mark.parametrize("builtin, custom", [([[]], [[]]), ([[1.0, 1.0]], [[1.0]]), ([[1.0], [1.0, 1.0]], [[1.0]] * 2),
                                             ([[1.0]], [[1.0], [1.0]])])
def test_rounds_that_do_not_pair_are_refused(builtin, custom):
    with pytest.raises(PPError) as info:
        CustomOverhead.from_steps(builtin, custom, actions=2, schedule="1F1B")
    assert (info.value.rule, info.value.field) == ("bad_value", "rounds")


@pytest.mark.parametrize("n_stages, schedule, actions", [(1, "1F1B", 2 * 3), (2, "Interleaved1F1B", 2 * 2 * 3)])
def test_one_rank_runs_the_order_both_ways_and_puts_the_modules_back(n_stages, schedule, actions):
    torch.manual_seed(0)
    stages = [torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6)) for _ in range(n_stages)]
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in stages]
    out = measure_custom_overhead(stages, torch.randn(4, 6), torch.randn(4, 6), torch.nn.functional.mse_loss,
                                  n_microbatches=3, steps=3)
    per = None if n_stages == 1 else n_stages
    assert (out.schedule, out.actions) == (schedule, actions)
    assert out.actions == len(pp_program(schedule, 1, 3, per).compute[0])
    assert len(out.rounds_s) == len(out.builtin_steps_s) == len(out.custom_steps_s) == 3
    assert out.overhead_s >= 0 and out.spread_s >= 0
    assert all(torch.equal(v, m.state_dict()[k]) for m, b in zip(stages, before) for k, v in b.items())
    assert all(p.grad is None for m in stages for p in m.parameters())
    assert not dist.is_initialized()  # its own group was destroyed


def test_the_probe_adds_one_pair_per_round_in_the_callers_group(one_rank):
    stages = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]
    with CustomPathProbe(stages, torch.randn(2, 4), torch.randn(2, 4), torch.nn.functional.mse_loss,
                         n_microbatches=2, warmup=0) as probe:
        with pytest.raises(PPError) as info:
            probe.result()  # no round yet
        assert info.value.field == "rounds"
        for expected in (1, 2):
            probe.round()
            assert [len(t) for t in probe.steps_s] == [expected, expected]
        assert len(probe.result().rounds_s) == 2
        probe.drop_rounds()  # the rounds so far let go: a result reads only the rounds from here on
        assert [len(t) for t in probe.steps_s] == [0, 0]
        with pytest.raises(PPError):
            probe.result()
        probe.round()
        assert len(probe.result().rounds_s) == 1
    assert dist.is_initialized()  # the caller's group is left


def test_without_a_process_group_the_probe_says_how_to_get_one():
    with pytest.raises(PPError) as info:
        CustomPathProbe([torch.nn.Linear(2, 2)], torch.randn(1, 2), torch.randn(1, 2), torch.nn.functional.mse_loss)
    assert (info.value.rule, info.value.field) == ("bad_value", "group")
    assert "init_process_group" in str(info.value)


@pytest.mark.parametrize("field, kwargs", [("steps", {"steps": 0}), ("n_microbatches", {"n_microbatches": 0}),
                                           ("warmup", {"warmup": -1}), ("steps", {"steps": True})])
def test_the_counts_are_checked(field, kwargs):
    with pytest.raises(PPError) as info:
        measure_custom_overhead([torch.nn.Linear(2, 2)], torch.randn(1, 2), torch.randn(1, 2),
                                torch.nn.functional.mse_loss, **kwargs)
    assert (info.value.rule, info.value.field) == ("bad_value", field)
    assert not dist.is_initialized()


def test_calibrate_pp_measures_the_custom_path_too(one_rank):
    torch.manual_seed(0)
    costs = calibrate_pp([torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)], torch.randn(3, 4), torch.randn(3, 2),
                         torch.nn.functional.mse_loss, n_microbatches=2, repeats=2)
    assert costs.custom_overhead_s >= 0 and "Interleaved1F1B's" in costs.machine.split()
    # a custom order is predicted with it, one of PyTorch's without
    assert costs.custom_path().action_overhead_s == pytest.approx(costs.action_overhead_s + costs.custom_overhead_s)


# --- two ranks ---------------------------------------------------------------------------------------------------

DEADLINE_S = 180.0


def _rank_main(rank: int, store: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    with rank_results(out_dir, rank) as results:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                                timeout=timedelta(seconds=60))
        torch.manual_seed(0)
        stages = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()) for _ in range(2)]
        x, y = torch.randn(4, 8), torch.randn(4, 8)
        costs = calibrate_pp(stages, x, y, torch.nn.functional.mse_loss,
                             alone_group=[dist.new_group([r]) for r in range(2)][rank], repeats=3)
        results["custom_overhead_s"] = costs.custom_overhead_s
        results["machine"] = costs.machine
        out = measure_custom_overhead(stages, x, y, torch.nn.functional.mse_loss, steps=2)
        results["measured"] = [out.schedule, out.actions, list(out.rounds_s)]
        try:
            measure_custom_overhead(stages + [torch.nn.Linear(8, 8)], x, y, torch.nn.functional.mse_loss)
        except PPError as exc:
            results["three_stages"] = [exc.rule, exc.field]
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks() -> Dict[str, Any]:
    return spawned_ranks(_rank_main, deadline_s=DEADLINE_S)


@pytest.mark.slow
@pytest.mark.timeout(int(DEADLINE_S) + 60)
def test_two_ranks_get_the_same_custom_overhead_from_calibrate_pp(two_ranks: Dict[str, Any]) -> None:
    ranks = ranks_that_ended(two_ranks)
    rank0, rank1 = ranks
    assert rank0["custom_overhead_s"] >= 0 and rank0["custom_overhead_s"] == rank1["custom_overhead_s"]
    assert "1F1B's" in rank0["machine"].split()
    # one stage per rank: 1F1B's order over 4 micro-batches, F and B each; every rank gathers the same rounds
    assert rank0["measured"][:2] == ["1F1B", 8] and len(rank0["measured"][2]) == 2
    assert rank0["measured"] == rank1["measured"]
    assert rank0["three_stages"] == rank1["three_stages"] == ["bad_value", "stages"]
