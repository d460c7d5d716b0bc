"""PyTorch's pipelining runtime measured while it trains: RollingStepCosts, refreshed_pp_costs, measure_action_overhead."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from autosched.pp.costs import PPCosts, StageCost
from autosched.pp.program import PPError, pp_program
from autosched.pp.rolling import (P2P_HELPERS, RollingStepCosts, calibrate_pp, measure_action_overhead,
                                  refreshed_pp_costs)
from swpipe_core.measure.rolling import RollingCosts

pytestmark = pytest.mark.timeout(300)


def _schedule(name, n_stages=2, n_mb=2):
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    torch.manual_seed(0)
    modules = [torch.nn.Linear(4, 4) for _ in range(n_stages)]
    stages = [PipelineStage(m, s, n_stages, torch.device("cpu")) for s, m in enumerate(modules)]
    cls = get_schedule_class(name)
    single = issubclass(cls, PipelineScheduleSingle)  # GPipe and 1F1B take the one stage, the others a list
    return cls(stages[0] if single else stages, n_mb, loss_fn=torch.nn.functional.mse_loss), stages


def _step(schedule):
    schedule.step(torch.randn(4, 4), target=torch.randn(4, 4))


@pytest.mark.parametrize("name, letters", [("LoopedBFS", "FB"), ("InterleavedZeroBubble", "FIW")])
def test_every_action_and_step_is_recorded_once(one_rank, name, letters):
    schedule, _ = _schedule(name)
    with RollingStepCosts(schedule) as costs:
        for _ in range(3):
            _step(schedule)
    counts = {n: s.recorded for n, s in costs.stats().items()}
    # 2 stages x 2 micro-batches x 3 steps of each action the schedule runs
    assert counts == {"step": 3, **{f"{a}{s}": 6 for a in letters for s in (0, 1)}}


def test_nothing_is_recorded_after_the_block_and_it_can_be_entered_again(one_rank):
    schedule, stages = _schedule("GPipe", n_stages=1)
    costs = RollingStepCosts(schedule, stages=stages)
    with costs:
        _step(schedule)
    _step(schedule)
    with costs:
        _step(schedule)
    assert {n: s.recorded for n, s in costs.stats().items()} == {"F0": 4, "B0": 4, "step": 2}
    with costs, pytest.raises(RuntimeError):
        costs.__enter__()


def test_a_shared_window_takes_both_a_schedule_and_hand_made_samples(one_rank):
    rolling = RollingCosts(window=2)
    schedule, _ = _schedule("GPipe", n_stages=1)
    with RollingStepCosts(schedule, rolling=rolling):
        for _ in range(3):
            _step(schedule)
    s = rolling.stats()
    assert (s["step"].samples, s["step"].recorded, s["F0"].samples, s["F0"].recorded) == (2, 3, 2, 6)


class _ScriptedClock:
    """Seconds that move only when a fake helper says how long it took."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


# PyTorch's module-level helpers every schedule posts and waits through, by the names the timing module wraps
POST, WAIT = (name for name, _ in P2P_HELPERS)


def _helper(name):
    from torch.distributed.pipelining import schedules

    return getattr(schedules, name)


class _FakeSchedule:
    """A schedule whose step computes (a stage action), posts twice (once nothing) and waits, each taking scripted
    seconds, through PyTorch's module-level helpers as the real schedules do."""

    def __init__(self, clock, stage, fail=False, extras=()):
        self.clock, self.stage, self.fail, self.extras = clock, stage, fail, list(extras)

    def step(self):
        self.clock.now += self.extras.pop(0) if self.extras else 0.0
        self.stage.forward_one_chunk(0)
        works = _helper(POST)(["send", "recv"])
        _helper(POST)([])  # an empty post: PyTorch calls it for ranks with nothing to send
        self.clock.now += 0.25  # the schedule's own Python: not in any window
        _helper(WAIT)(works)
        if self.fail:
            raise RuntimeError("the step failed")


class _FakeStage:
    stage_index = 0

    def __init__(self, clock):
        self.clock = clock

    def forward_one_chunk(self, *args, **kwargs):
        self.clock.now += 4.0

    def backward_one_chunk(self, *args, **kwargs):
        raise AssertionError("not called")

    backward_weight_one_chunk = backward_one_chunk


@pytest.fixture
def scripted_helpers(monkeypatch):
    """PyTorch's post and wait helpers replaced by ones that take 1.0 s per posted list and 2.0 s per wait."""
    from torch.distributed.pipelining import schedules

    clock = _ScriptedClock()

    def post(ops, desc=None):
        clock.now += 1.0 if ops else 0.0
        return list(ops)

    def wait(works):
        clock.now += 2.0

    monkeypatch.setattr(schedules, POST, post)
    monkeypatch.setattr(schedules, WAIT, wait)
    return clock, post, wait


def test_a_steps_posts_and_waits_are_timed_into_their_windows_and_its_split(scripted_helpers):
    clock, post, wait = scripted_helpers
    stage = _FakeStage(clock)
    schedule = _FakeSchedule(clock, stage)
    with RollingStepCosts(schedule, stages=[stage], rolling=RollingCosts(clock=clock)) as timed:
        assert _helper(POST) is post  # wrapped only while a step runs
        schedule.step()
        schedule.step()
    stats = timed.stats()
    assert {n: (s.recorded, s.median_s) for n, s in stats.items()} == {
        "F0": (2, 4.0), "post": (2, 1.0), "wait": (2, 2.0), "step": (2, 7.25)}  # the empty post not counted
    split = timed.split()
    assert (split.step_s, split.compute_s, split.post_s, split.wait_s, split.other_s) == (7.25, 4.0, 1.0, 2.0, 0.25)
    assert _helper(POST) is post and _helper(WAIT) is wait


def test_the_split_is_the_median_steps_own(scripted_helpers):
    clock, _, _ = scripted_helpers
    stage = _FakeStage(clock)
    schedule = _FakeSchedule(clock, stage, extras=[3.0, 0.0, 1.0, 9.0])  # more of its own time in some steps
    with RollingStepCosts(schedule, stages=[stage], rolling=RollingCosts(clock=clock)) as timed:
        for _ in range(4):
            schedule.step()
    split = timed.split()  # steps of 10.25, 7.25, 8.25, 16.25: the lower middle one, 8.25
    assert (split.step_s, split.compute_s, split.other_s) == (8.25, 4.0, 1.25)


def test_a_step_that_raises_is_not_recorded_and_puts_the_helpers_back(scripted_helpers):
    clock, post, wait = scripted_helpers
    stage = _FakeStage(clock)
    schedule = _FakeSchedule(clock, stage, fail=True)
    with RollingStepCosts(schedule, stages=[stage], rolling=RollingCosts(clock=clock)) as timed:
        with pytest.raises(RuntimeError):
            schedule.step()
        assert _helper(POST) is post and _helper(WAIT) is wait
    assert "step" not in timed.stats() and timed.split() is None
    assert timed.stats()["post"].recorded == 1  # what ran before the failure was timed


def test_one_rank_posts_nothing_and_its_split_is_its_compute(one_rank):
    schedule, _ = _schedule("LoopedBFS")
    with RollingStepCosts(schedule) as timed:
        for _ in range(3):
            _step(schedule)
    split = timed.split()
    assert split.post_s == 0.0 and split.wait_s == 0.0
    assert 0 < split.compute_s <= split.step_s and split.other_s >= 0
    assert "post" not in timed.stats() and "wait" not in timed.stats()


def _costs():
    return PPCosts((StageCost(0.001, 0.002, 0.0015, 0.0005), StageCost(0.003, 0.004, 0.003, 0.001)),
                   action_overhead_s=1e-4)


def test_refreshed_costs_take_the_medians_where_there_are_enough_samples():
    r = RollingCosts()
    for d in (0.010, 0.011, 0.010, 0.5, 0.012):
        r.add("F0", d)
        r.add("I1", d / 2)
    r.add("W1", 0.9)  # one sample: kept from the costs
    out = refreshed_pp_costs(_costs(), r)
    s0, s1 = out.costs.stages
    assert (s0.forward_s, s0.backward_s, s1.backward_input_s, s1.backward_weight_s) == (0.011, 0.002, 0.0055, 0.001)
    assert out.costs.action_overhead_s == 1e-4 and out.step is None
    assert out.freshness.refreshed == ["F0", "I1"] and out.freshness.tasks["W1"].source == "model"


def test_every_ranks_window_is_merged_and_the_step_is_the_slowest_ranks():
    rank0, rank1 = RollingCosts(), RollingCosts()
    for _ in range(5):
        rank0.add("F0", 0.02)
        rank0.add("step", 0.1)
        rank1.add("F1", 0.03)
        rank1.add("step", 0.2)
    out = refreshed_pp_costs(_costs(), [rank0.stats(), rank1])
    assert [c.forward_s for c in out.costs.stages] == [0.02, 0.03]
    assert out.step.median_s == 0.2


@pytest.mark.parametrize("bad", [0, 1.5])
def test_min_samples_is_checked(bad):
    with pytest.raises(PPError) as info:
        refreshed_pp_costs(_costs(), RollingCosts(), min_samples=bad)
    assert (info.value.rule, info.value.field, info.value.value) == ("bad_value", "min_samples", bad)


def test_the_action_overhead_is_measured_on_the_users_stages_and_puts_them_back():
    torch.manual_seed(0)
    stages = [torch.nn.Linear(6, 6), torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6))]
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in stages]
    out = measure_action_overhead(stages, torch.randn(4, 6), torch.randn(4, 6), torch.nn.functional.mse_loss,
                                  n_microbatches=3, steps=3)
    assert out.actions == len(pp_program("LoopedBFS", 1, 3, stages_per_rank=2).compute[0]) == 12
    assert len(out.rounds_s) == 3 and out.overhead_s >= 0 and out.spread_s >= 0
    assert all(torch.equal(v, m.state_dict()[k]) for m, b in zip(stages, before) for k, v in b.items())
    assert all(p.grad is None for m in stages for p in m.parameters())
    assert not dist.is_initialized()  # its own group was destroyed


def test_the_action_overhead_runs_in_the_callers_one_rank_group_and_leaves_it(one_rank):
    fixed = PPCosts((StageCost(0.0, 0.0),) * 2)
    out = measure_action_overhead([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)], torch.randn(2, 4),
                                  torch.randn(2, 4), torch.nn.functional.mse_loss, n_microbatches=2, steps=2,
                                  costs=fixed)
    assert out.actions == 8 and dist.is_initialized()


@pytest.mark.parametrize("field, kwargs", [("steps", {"steps": 0}), ("n_microbatches", {"n_microbatches": 0})])
def test_the_action_overhead_checks_its_counts(field, kwargs):
    with pytest.raises(PPError) as info:
        measure_action_overhead([torch.nn.Linear(2, 2)], torch.randn(1, 2), torch.randn(1, 2),
                                torch.nn.functional.mse_loss, **kwargs)
    assert (info.value.rule, info.value.field) == ("bad_value", field)


def test_calibrate_pp_folds_the_overhead_into_the_stage_costs_and_has_no_link_on_one_rank(one_rank):
    torch.manual_seed(0)
    stages = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)]
    costs = calibrate_pp(stages, torch.randn(3, 4), torch.randn(3, 2), torch.nn.functional.mse_loss,
                         n_microbatches=2, repeats=2)
    bare = costs.with_action_overhead(0.0)
    assert (costs.n_stages, costs.samples_per_microbatch, costs.p2p.latency_s, costs.p2p.post_s) == (2, 3, 0.0, 0.0)
    assert [round(c.forward_s - b.forward_s, 12) for c, b in zip(costs.stages, bare.stages)] == \
        [round(costs.action_overhead_s, 12)] * 2
    assert costs.stages[0].output_bytes == 3 * 4 * 4 and dist.is_initialized()  # 3 x 4 float32 sent on
