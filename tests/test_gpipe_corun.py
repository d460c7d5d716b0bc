"""Partitions slowing each other when they run at once: measured (profile_corun) and taken by the prediction."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swpipe.gpipe.corun import CoRun, check_slowdown, profile_corun
from swpipe.gpipe.errors import GPipeArgumentError
from swpipe.gpipe.predict import (CheckedSlowdown, LayerModel, choose, corun_costs, overlap_shares, predict_step,
                                  what_if)
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

    # measured together: 3 s where alone took 2 s, half of it beside the other partition
    corun = CoRun({"F0": [2.0]}, {"F0": [3.0]}, {"F0": [0.5]}, batch=4)
    assert corun.slowdown == {"F0": pytest.approx(2.0)}
    events = [event("F0", "p0", 0.0, 4.0), event("F1", "p1", 0.0, 2.0)]  # F0 half beside F1
    stretched = corun_costs(CostModel({"F0": TaskCost(2.0)}), events, corun.slowdown)
    assert stretched["F0"].host_s == pytest.approx(3.0)
    assert CoRun({"F0": [2.0]}, {"F0": [3.0]}, {"F0": [0.0]}, batch=4).slowdown == {"F0": 1.0}  # never beside


def test_a_round_with_the_task_little_beside_another_does_not_measure_its_slowdown():
    from swpipe.gpipe.corun import MIN_BESIDE

    # round 2: 0.6 s more together, but only a tenth of the task ran beside the other: 1 + 0.6 / 0.1 = 7 if counted
    corun = CoRun({"F0": [1.0, 1.0, 1.0]}, {"F0": [1.2, 1.6, 1.2]}, {"F0": [1.0, 0.1, MIN_BESIDE]}, batch=4)
    assert corun.slowdown == {"F0": pytest.approx(1.3)}  # the median of 1.2 and 1.4
    assert corun.slowdown_from(0.0) == {"F0": pytest.approx(1.4)}  # 1.2, 7, 1.4
    assert CoRun({"F0": [1.0]}, {"F0": [1.6]}, {"F0": [0.1]}, batch=4).slowdown == {"F0": 1.0}  # no round measures it


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


# Checked slowdown (issue 47): applied per micro-batch size only where it predicts held-out measured steps better.

def scripted(slowdown, batch):
    """A CoRun whose slowdown is ``slowdown`` on every task (each task beside the other partition all the time)."""
    tasks = ("F0", "F1", "B0", "B1")
    return CoRun({t: [1.0] for t in tasks}, {t: [slowdown] for t in tasks}, {t: [1.0] for t in tasks}, batch=batch)


def config(chunks):
    return {"balance": [2, 2], "batch": 16, "chunks": chunks, "checkpoint": "never"}


def test_a_slowdown_that_hurts_is_not_applied_and_one_that_helps_is():
    plain, slow = (predict_step(uniform(), **config(4), slowdown=s).step_s for s in (None, EVERY))
    hurts = check_slowdown(uniform(), scripted(2.0, 4), [(config(4), plain)])  # measured as the plain prediction
    helps = check_slowdown(uniform(), scripted(2.0, 4), [(config(4), slow)])   # measured as the corrected one
    assert (hurts.decision(4).applied, hurts.decision(4).reason) == (False, "farther")
    assert (helps.decision(4).applied, helps.decision(4).reason) == (True, "closer")
    got_hurts = predict_step(uniform(), **config(4), slowdown=hurts)
    got_helps = predict_step(uniform(), **config(4), slowdown=helps)
    assert got_hurts.step_s == pytest.approx(plain) and got_hurts.slowdown is None
    assert got_helps.step_s == pytest.approx(slow) and got_helps.slowdown == EVERY
    assert got_hurts.decision is hurts.decision(4) and got_helps.checked is helps
    assert hurts.decision(4).error_without == 0.0 and hurts.decision(4).error_with > 0.0


def test_decisions_are_per_micro_batch_size_and_choose_and_what_if_honour_them():
    # measured: chunks 2 (micro-batch 8) as the plain prediction, chunks 8 (micro-batch 2) as the corrected one
    measured = [(config(2), predict_step(uniform(), **config(2)).step_s),
                (config(8), predict_step(uniform(), **config(8), slowdown=EVERY).step_s)]
    checked = check_slowdown(uniform(), [scripted(2.0, 8), scripted(2.0, 2)], measured)
    assert {k: d.applied for k, d in checked.decisions.items()} == {8: False, 2: True}
    _, candidates = choose(uniform(), 2, batch=16, chunks=(2, 4, 8), checkpoints=("never",), schedules=("gpipe",),
                           slowdown=checked)
    by_chunks = {c.chunks: c for c in candidates}
    assert {c: (p.slowdown is not None, p.decision.reason) for c, p in by_chunks.items()} == {
        2: (False, "farther"), 4: (False, "no-held-out-steps"), 8: (True, "closer")}
    assert by_chunks[2].step_s == pytest.approx(measured[0][1]) and by_chunks[8].step_s == pytest.approx(measured[1][1])
    base = predict_step(uniform(), **config(2), slowdown=checked)
    rows = what_if(base, uniform(), [{"chunks": 8}, {"chunks": 4}])
    assert [r.slowdown is not None for r in rows] == [False, True, False]
    assert all(r.checked is checked for r in rows)


def test_a_micro_batch_size_with_no_measured_step_keeps_the_plain_prediction():
    checked = check_slowdown(uniform(), scripted(3.0, 4), [])
    assert (checked.decision(4).applied, checked.decision(4).reason, checked.decision(4).steps) == (
        False, "no-held-out-steps", 0)
    assert checked.slowdown == {4: EVERY | {t: 3.0 for t in EVERY}}
    got = predict_step(uniform(), **config(4), slowdown=checked)
    assert got.step_s == pytest.approx(predict_step(uniform(), **config(4)).step_s) and got.slowdown is None


def test_each_micro_batch_size_takes_the_slowdown_measured_nearest_it_and_every_timed_repeat_judges():
    from swpipe.gpipe.measure import MeasuredStep

    plain = predict_step(uniform(), **config(4)).step_s  # micro-batch 4: measured at 2 and 8, 2 is as near
    step = MeasuredStep(plain, [plain, plain, 9.0], 0.0, [0.0, 0.0])
    checked = check_slowdown(uniform(), [scripted(1.5, 8), scripted(2.0, 2)], [(config(4), step)])
    assert checked.slowdown[4] == {t: 2.0 for t in EVERY}
    assert (checked.decision(4).steps, checked.decision(4).applied) == (3, False)
    assert sorted(checked.decisions) == [2, 4, 8]


@pytest.mark.parametrize("coruns, steps, argument", [
    ([], [], "coruns"),
    (None, [({"balance": [2, 2], "batch": 16}, 1.0)], "steps"),
    (None, [({**config(4), "chunk": 4}, 1.0)], "steps")])
def test_check_slowdown_refuses_what_it_cannot_predict(coruns, steps, argument):
    with pytest.raises(GPipeArgumentError) as err:
        check_slowdown(uniform(), scripted(2.0, 4) if coruns is None else coruns, steps)
    assert err.value.argument == argument


def test_a_checked_slowdown_s_summary_names_each_decided_size():
    checked = CheckedSlowdown({2: EVERY, 8: EVERY}, {})
    assert checked.at(2) is None and checked.decision(8).reason == "no-held-out-steps"
    measured = [(config(2), predict_step(uniform(), **config(2)).step_s)]
    line = check_slowdown(uniform(), [scripted(2.0, 8), scripted(2.0, 2)], measured).summary()
    assert [line.count(f" {k} (") for k in (2, 8)] == [1, 1]


def measured(events, step_s=1.0):
    from swpipe.gpipe.measure import MeasuredStep

    return MeasuredStep(step_s, [step_s], 0.0, [], events=events)


def test_the_slowdown_in_steps_is_each_task_s_time_there_over_its_plain_cost_for_its_share_beside_another():
    from swpipe.gpipe.corun import corun_in_steps

    one = {"balance": [1, 1], "batch": 2, "chunks": 1, "checkpoint": "never"}  # plain: F 2 ms, B 4 ms per partition
    plain = predict_step(uniform(2), **one).costs
    assert (plain["F0"].host_s, plain["B1"].host_s) == (pytest.approx(0.002), pytest.approx(0.004))
    steps = [measured([event("F0", "p0", 0.0, 0.004), event("F1", "p1", 0.002, 0.004),  # F0 half beside F1
                       event("B1", "p1", 0.004, 0.010)]),                                 # B1 alone
             measured([event("F0", "p0", 0.0, 0.006), event("F1", "p1", 0.003, 0.006),
                       event("B1", "p1", 0.006, 0.012)])]
    corun = corun_in_steps(uniform(2), one, steps)
    assert corun.batch == 2 and corun.alone_s["F0"] == [pytest.approx(0.002)] * 2
    assert corun.together_s["F0"] == [0.004, 0.006] and corun.beside["F0"] == [0.5, 0.5]
    # F0: 1 + (2 - 1) / 0.5 = 3 and 1 + (3 - 1) / 0.5 = 5, the median 4; F1 as fast as planned (1.5 x in step 2:
    # 1 + 0.5 / 1 = 1.5, the median 1.25); B1 never beside another partition: not measured
    assert corun.slowdown == {"F0": pytest.approx(4.0), "F1": pytest.approx(1.25), "B1": 1.0}


def test_the_slowdown_in_steps_is_checked_like_the_measured_one():
    from swpipe.gpipe.corun import corun_in_steps

    slow = predict_step(uniform(), **config(4), slowdown=EVERY)  # steps as if every task took twice as long beside
    fitted = corun_in_steps(uniform(), config(4), [measured(slow.sim.events)])
    assert all(v > 1.0 for v in fitted.slowdown.values())
    helps = check_slowdown(uniform(), fitted, [(config(4), slow.step_s)])
    hurts = check_slowdown(uniform(), fitted, [(config(4), predict_step(uniform(), **config(4)).step_s)])
    assert helps.decision(4).applied and not hurts.decision(4).applied
    with pytest.raises(GPipeArgumentError):
        corun_in_steps(uniform(), {"balance": [2, 2]}, [])


def test_the_closest_checked_slowdown_is_taken_per_micro_batch_size():
    from swpipe.gpipe.corun import closest_slowdown
    from swpipe.gpipe.predict import CORUN

    # measured: at micro-batch 4 as a slowdown of 2 predicts, at 8 as a slowdown of 1.5, at 2 as the plain prediction
    measured = [(config(4), predict_step(uniform(), **config(4), slowdown=EVERY).step_s),
                (config(2), predict_step(uniform(), **config(2), slowdown={t: 1.5 for t in EVERY}).step_s),
                (config(8), predict_step(uniform(), **config(8)).step_s)]
    twice = check_slowdown(uniform(), [scripted(2.0, 4), scripted(2.0, 8), scripted(2.0, 2)], measured)
    half = check_slowdown(uniform(), [scripted(1.5, 4), scripted(1.5, 8), scripted(1.5, 2)], measured)
    best = closest_slowdown({"twice": twice, "half": half})
    assert best.at(4) == EVERY and best.at(8) == {t: 1.5 for t in EVERY} and best.at(2) is None
    assert [best.decision(k).correction for k in (4, 8)] == [f"{CORUN} (twice)", f"{CORUN} (half)"]
    assert best.decision(2) == twice.decision(2)  # neither applied: the first one's decision, unnamed
    for config_, step_s in measured:  # the choice predicts each size's steps exactly
        assert predict_step(uniform(), **config_, slowdown=best).step_s == pytest.approx(step_s)
    tie = closest_slowdown({"half": half, "twice": half})
    assert tie.decision(8).correction == f"{CORUN} (half)"  # the first named on a tie
    with pytest.raises(GPipeArgumentError):
        closest_slowdown({})
