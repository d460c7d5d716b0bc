"""Partitions slowing each other when they run at once: measured (profile_corun) and taken by the prediction."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swpipe.gpipe.corun import CoRun, profile_corun
from swpipe.gpipe.errors import GPipeArgumentError
from swpipe.gpipe.predict import LayerModel, corun_costs, overlap_shares, predict_step, what_if
from swpipe.gpipe.skip import pop, skippable, stash
from swpipe_core.measure.trace import TimelineEvent


def uniform(layers=4, forward=0.001, backward=0.002):
    return LayerModel(forward=[(0.0, forward)] * layers, backward=[(0.0, backward)] * layers,
                      saved_per_sample=[100.0] * layers, output_per_sample=[10.0] * layers)


EVERY = {"F0": 2.0, "F1": 2.0, "B0": 2.0, "B1": 2.0}


def event(task, group, start, end):
    return TimelineEvent(task, 0, group, "default", start, end)


def test_overlap_shares_count_only_other_threads():
    events = [event("F0", "p0", 0.0, 2.0), event("B0", "p0", 2.0, 3.0), event("F1", "p1", 1.0, 2.5)]
    assert overlap_shares(events) == pytest.approx({"F0": 0.5, "B0": 0.5, "F1": 1.0})


def test_corun_costs_stretch_each_task_by_its_share_beside_another():
    from autosched.model.costs import CostModel, TaskCost

    events = [event("F0", "p0", 0.0, 2.0), event("B0", "p0", 2.0, 3.0), event("F1", "p1", 1.0, 2.5)]
    costs = CostModel({"F0": TaskCost(2.0), "B0": TaskCost(1.0), "F1": TaskCost(1.5)})
    got = corun_costs(costs, events, {"F0": 3.0, "B0": 0.5, "F1": 2.0})
    # F0: half of it beside F1, x (1 + 0.5 x 2); B0: a slowdown below 1 is noise, kept at 1; F1: all beside, x 2
    assert [got[t].host_s for t in ("F0", "B0", "F1")] == pytest.approx([4.0, 1.0, 3.0])


def test_a_slowdown_of_one_predicts_as_none():
    base = predict_step(uniform(), [2, 2], batch=8, chunks=4, checkpoint="never")
    same = predict_step(uniform(), [2, 2], batch=8, chunks=4, checkpoint="never", slowdown={t: 1.0 for t in EVERY})
    assert same.step_s == pytest.approx(base.step_s) and same.bubble == pytest.approx(base.bubble)
    assert base.slowdown is None and same.slowdown == {t: 1.0 for t in EVERY}


@pytest.mark.parametrize("schedule, checkpoint", [("GPipe", "never"), ("GPipe", "always"), ("1F1B", "never")])
def test_the_co_run_slowdown_enters_the_costs_the_step_and_the_bubble(schedule, checkpoint):
    base = predict_step(uniform(), [2, 2], batch=8, chunks=8, checkpoint=checkpoint, schedule=schedule)
    slow = predict_step(uniform(), [2, 2], batch=8, chunks=8, checkpoint=checkpoint, schedule=schedule,
                        slowdown=EVERY)
    shares = overlap_shares(base.sim.events)
    for task in EVERY:  # stretched for the share of the task that ran beside the other partition
        assert 0.0 < shares[task] <= 1.0
        assert slow.costs[task].host_s == pytest.approx(base.costs[task].host_s * (1 + shares[task]))
    assert base.step_s < slow.step_s < 2 * base.step_s
    # the bubble counts the stretched tasks as busy, as the measured one counts the measured tasks
    work = 8 * sum(slow.costs[t].host_s for t in EVERY)
    assert slow.bubble == pytest.approx(1 - work / (2 * slow.step_s))


def test_a_slowdown_of_one_task_changes_only_that_task():
    base = predict_step(uniform(), [2, 2], batch=8, chunks=4, checkpoint="never")
    slow = predict_step(uniform(), [2, 2], batch=8, chunks=4, checkpoint="never", slowdown={"B1": 3.0})
    assert [slow.costs[t].host_s == base.costs[t].host_s for t in ("F0", "F1", "B0")] == [True] * 3
    assert slow.costs["B1"].host_s > base.costs["B1"].host_s


def test_one_partition_runs_beside_nothing():
    base = predict_step(uniform(), [4], batch=8, chunks=4, checkpoint="never")
    slow = predict_step(uniform(), [4], batch=8, chunks=4, checkpoint="never", slowdown={"F0": 3.0, "B0": 3.0})
    assert slow.step_s == pytest.approx(base.step_s)


def test_what_if_takes_the_slowdown_again():
    base = predict_step(uniform(), [2, 2], batch=8, chunks=4, checkpoint="never", slowdown=EVERY)
    rows = what_if(base, uniform(), [{"chunks": 8}])
    assert rows[1].slowdown == EVERY
    assert rows[1].step_s > predict_step(uniform(), [2, 2], batch=8, chunks=8, checkpoint="never").step_s


@pytest.mark.parametrize("checkpoint, recomputed", [("always", 4), ("except_last", 3), ("never", 0)])
def test_a_checkpointed_backward_costs_its_forward_again(checkpoint, recomputed):
    p = predict_step(uniform(), [2, 2], batch=8, chunks=4, checkpoint=checkpoint)
    forward, backward = 2 * 2 * 0.001, 2 * 2 * 0.002  # 2 layers x 2 samples per micro-batch
    assert p.costs["F0"].host_s == pytest.approx(forward)
    assert p.costs["B0"].host_s == pytest.approx(backward + recomputed / 4 * forward)


def test_co_run_slowdown_is_the_median_round_s_together_over_alone_at_least_one():
    full = {"F0": [1.0, 1.0, 1.0], "B0": [1.0], "F1": [1.0]}
    corun = CoRun({"F0": [2.0, 1.0, 4.0], "B0": [4.0], "F1": [0.0]}, {"F0": [3.0, 3.0, 4.0], "B0": [3.0], "F1": [1.0]},
                  full, batch=4)
    assert corun.slowdown == {"F0": 1.5, "B0": 1.0, "F1": 1.0}


def test_co_run_slowdown_inverts_the_stretch_the_prediction_applies():
    from autosched.model.costs import CostModel, TaskCost

    # measured together: 3 s where alone took 2 s, a quarter of it beside the other partition
    corun = CoRun({"F0": [2.0]}, {"F0": [3.0]}, {"F0": [0.25]}, batch=4)
    assert corun.slowdown == {"F0": pytest.approx(3.0)}
    events = [event("F0", "p0", 0.0, 4.0), event("F1", "p1", 0.0, 1.0)]  # F0 a quarter beside F1
    stretched = corun_costs(CostModel({"F0": TaskCost(2.0)}), events, corun.slowdown)
    assert stretched["F0"].host_s == pytest.approx(3.0)
    assert CoRun({"F0": [2.0]}, {"F0": [3.0]}, {"F0": [0.0]}, batch=4).slowdown == {"F0": 1.0}  # never beside


def net():
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(16, 16), nn.ReLU())])


def test_profile_corun_times_every_task_and_leaves_the_module_as_it_was():
    model = net()
    before = [p.detach().clone() for p in model.parameters()]
    corun = profile_corun(model, [4, 4], torch.randn(8, 16), timeout=0.0, rounds=2)
    assert sorted(corun.alone_s) == sorted(corun.together_s) == ["B0", "B1", "F0", "F1"]
    assert all(len(v) == 2 and min(v) > 0 for v in [*corun.alone_s.values(), *corun.together_s.values()])
    assert all(len(v) == 2 and all(0.0 <= s <= 1.0 for s in v) for v in corun.beside.values())
    assert corun.batch == 8 and all(s >= 1.0 for s in corun.slowdown.values())
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@skippable(stash=["skip"])
class Save(nn.Module):
    def forward(self, x):
        yield stash("skip", x)
        return x * 2


@skippable(pop=["skip"])
class Add(nn.Module):
    def forward(self, x):
        skip = yield pop("skip")
        return x + skip


def test_profile_corun_carries_skips_across_partitions():
    model = nn.Sequential(Save(), nn.Linear(4, 4), nn.Tanh(), Add(), nn.Linear(4, 4))
    corun = profile_corun(model, [2, 3], torch.randn(4, 4), timeout=0.0, rounds=1)
    assert sorted(corun.slowdown) == ["B0", "B1", "F0", "F1"]


@pytest.mark.parametrize("balance, rounds, argument", [([4, 3], 1, "balance"), ([4, 4], 0, "rounds")])
def test_profile_corun_refuses_bad_arguments(balance, rounds, argument):
    with pytest.raises(GPipeArgumentError) as err:
        profile_corun(net(), balance, torch.randn(8, 16), timeout=0.0, rounds=rounds)
    assert err.value.argument == argument


def test_the_measured_bubble_is_the_median_timed_step_s_and_its_timeline_is_kept():
    from swpipe.gpipe import GPipe
    from swpipe.gpipe.measure import measure_step, step_bubble

    x = torch.randn(16, 16)
    gpipe = GPipe(net(), [4, 4], devices=["cpu", "cpu"], chunks=4, checkpoint="never")
    measured = measure_step(gpipe, x, x, nn.functional.mse_loss, repeats=3, warmup=0)
    assert len(measured.steps_s) == 3 and gpipe.record_timeline is False  # left as it was
    assert measured.bubble == pytest.approx(step_bubble(measured.events, 2))
    assert sorted({e.iteration for e in measured.events}) == [0, 1, 2, 3]
    with pytest.raises(GPipeArgumentError) as err:
        measure_step(gpipe, x, x, nn.functional.mse_loss, repeats=0)
    assert err.value.argument == "repeats"


def test_choose_predicts_every_candidate_with_the_slowdown():
    from swpipe.gpipe.predict import choose

    best, candidates = choose(uniform(), 2, batch=8, chunks=(2, 4), checkpoints=("never",), schedules=("GPipe",),
                              slowdown=EVERY)
    assert best is candidates[0] and all(c.slowdown == EVERY for c in candidates)
