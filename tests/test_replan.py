"""Re-planning on drift (swpipe.replan): the rules on scripted numbers, the decisions on a scripted clock, and
results equal to the serial loop's across a swap. No test reads a real duration: the clock and the costs are
scripted, so every decision's iteration is known in advance."""

from __future__ import annotations

import threading

import pytest
import torch

from swpipe import (Constraints, CostModel, PipelinePlan, PipelineTask, RollingCosts, SWPipeline, TaskCost,
                    TaskSchedule)
from swpipe.replan import (AdaptivePipeline, CostSnapshot, ReplanError, ReplanOptions, RollingSource, drift_detected,
                           exchange_step, noise_band, predicted_period, swap_worth_it)
from swpipe_core.engine.options import OptionError
from conftest import ScriptedClock, swpipe_threads

pytestmark = pytest.mark.timeout(120)

NOCORE = ("nocore",)
#: the costs the first plan is searched for, and the same with Load's cost doubled (after the drift)
COSTS0 = CostModel({"Load": TaskCost(0.002, resources=NOCORE), "Forward": TaskCost(0.001, resources=NOCORE),
                    "Step": TaskCost(0.003, resources=NOCORE)})
COSTS1 = COSTS0.scaled("Load", 2.0)


# ---------------------------------------------------------------- the rules


def test_noise_band_is_the_robust_spread_times_k_above_its_floor():
    assert noise_band([2.0] * 9, min_noise=0.05, spread_k=4.0) == 0.05
    # median 2.0, absolute deviations [0.2, 0.2, 0, 0.2, 0.2] -> MAD 0.2 -> 4 * 0.2 / 2.0
    assert noise_band([1.8, 2.2, 2.0, 1.8, 2.2], min_noise=0.05, spread_k=4.0) == pytest.approx(0.4)
    # one outlier does not widen it
    assert noise_band([1.0, 1.0, 1.0, 1.0, 50.0], min_noise=0.05, spread_k=4.0) == 0.05
    with pytest.raises(ValueError):
        noise_band([], min_noise=0.05, spread_k=4.0)


@pytest.mark.parametrize("smoothed, expected", [
    ([1.0, 1.2, 1.2, 1.2], True),          # the last three above the band
    ([1.0, 0.8, 0.8, 0.8], True),          # faster counts too: the costs dropped
    ([1.2, 1.2, 1.05, 1.2], False),        # one back inside
    ([1.2, 0.8, 1.2], False),              # out on both sides: noise, not drift
    ([1.2, 1.2], False),                   # fewer than patience
    ([1.1, 1.1, 1.1], False),              # on the band's edge is inside
])
def test_drift_needs_patience_periods_in_a_row_out_of_the_band_on_one_side(smoothed, expected):
    assert drift_detected(smoothed, reference_s=1.0, noise=0.1, patience=3) is expected


def test_a_swap_must_beat_the_noise():
    assert swap_worth_it(4.0, 3.0, noise=0.2) is True
    assert swap_worth_it(4.0, 3.3, noise=0.2) is False
    assert swap_worth_it(4.0, 4.0, noise=0.0) is False


def test_the_ranks_exchange_after_every_kth_iteration_of_the_run_only():
    assert [i for i in range(50) if exchange_step(i, 16)] == [15, 31, 47]
    assert [i for i in range(8) if exchange_step(i, 1)] == list(range(8))
    assert [i for i in range(100, 112) if exchange_step(i, 4)] == [103, 107, 111]  # the run-wide index
    assert ReplanOptions().exchange_every == 16
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="exchange_every"):
            exchange_step(3, bad)


def test_the_rolling_source_is_the_base_refreshed_from_the_window_and_its_noise_the_largest_spread():
    rolling = RollingCosts(window=4, clock=lambda: 100.0)
    source = RollingSource(COSTS0, rolling, min_samples=3)
    for seconds in (0.010, 0.004, 0.004, 0.004, 0.005):  # the first falls out of the window of 4
        rolling.add("Load", seconds)
    rolling.add("Forward", 0.5)
    rolling.add("Forward", 0.5)  # two samples, fewer than min_samples: the base cost stays
    rolling.add("Other", 1.0)  # not in the base: ignored
    snap = source.costs_now()
    assert source.instrument is rolling  # the window is the wrapper the pipeline runs the tasks under
    assert snap.costs["Load"].host_s == 0.004
    assert snap.costs["Load"].resources == NOCORE
    assert snap.costs["Forward"] == COSTS0["Forward"] and snap.costs["Step"] == COSTS0["Step"]
    assert "Other" not in snap.costs
    assert snap.costs.freshness.refreshed == ["Load"]
    # window [0.004, 0.004, 0.004, 0.005]: inclusive quartiles 0.004 and 0.00425 -> IQR / median
    assert snap.noise == pytest.approx(0.00025 / 0.004)
    assert snap.noise == rolling.stats()["Load"].spread
    with pytest.raises(OptionError) as caught:  # a window that could never refresh a task
        RollingSource(COSTS0, rolling, min_samples=5)
    assert (caught.value.field, caught.value.value) == ("min_samples", 5)
    assert RollingSource(COSTS0, rolling).min_samples == 4  # the default: 5, or the window when smaller


# ---------------------------------------------------------------- the workload


class Training:
    """A small model trained by three tasks; Load's work doubles from batch ``slow_from`` (same result).

    Losses are kept by batch, so a pipelined run and the serial loop compare entry by entry.
    """

    def __init__(self, slow_from=10 ** 9):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(8, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.slow_from = slow_from
        self.losses = {}
        self.load_runs = 0
        self.iter_idx = {}  # by batch: the ctx.iter_idx each task saw
        self.draws = {}  # by batch: Forward's torch.rand

    def load(self, ctx):
        for _ in range(2 if ctx.batch >= self.slow_from else 1):  # the knob: twice the work, the same tensors
            g = torch.Generator().manual_seed(int(ctx.batch))
            ctx.x, ctx.y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
            self.load_runs += 1

    def forward(self, ctx):
        loss = torch.nn.functional.mse_loss(self.model(ctx.x), ctx.y)
        loss.backward()
        self.losses[int(ctx.batch)] = loss.item()
        self.draws[int(ctx.batch)] = torch.rand(3)  # from the task's own generator under rng="per_task"
        self.iter_idx.setdefault(int(ctx.batch), []).append(ctx.iter_idx)

    def step(self, ctx):
        self.opt.step()
        self.opt.zero_grad()
        self.iter_idx.setdefault(int(ctx.batch), []).append(ctx.iter_idx)

    def tasks(self):
        return [PipelineTask("Load", self.load), PipelineTask("Forward", self.forward),
                PipelineTask("Step", self.step)]


def searched_plan(training, costs):
    """The best plan for ``costs``, bound to ``training``'s functions (the search from the task graph)."""
    from swpipe import SolverOptions, auto_schedule

    tasks = training.tasks()
    graph = (tasks, [("Forward", "Load"), ("Step", "Forward")], [("Forward", "Step", 1)])
    plan, _ = auto_schedule(graph, costs, Constraints(max_depth=3, max_threads=2),
                            SolverOptions(time_limit_s=5, method="beam"))
    return plan


@pytest.fixture(scope="module")
def plans():
    """The plan for COSTS0 and the plan for COSTS1 (searched once; rebound to each test's functions)."""
    t = Training()
    before, after = searched_plan(t, COSTS0), searched_plan(t, COSTS1)
    assert predicted_period(after, COSTS1) < predicted_period(before, COSTS1) * 0.9  # the premise: worth a swap
    return before, after


def bound(plan, training):
    return plan.bind({t.name: t.fn for t in training.tasks()})


class Scripted:
    """A cost source that says COSTS1 (Load doubled), whenever asked, and counts the asks."""

    instrument = None

    def __init__(self, costs=COSTS1, noise=0.0):
        self.snapshot, self.asked = CostSnapshot(costs, noise), 0

    def costs_now(self):
        self.asked += 1
        return self.snapshot


OPTS = ReplanOptions(warmup=2, window=4, patience=3, search_periods=3, min_noise=0.05)


def drive(pipe, batches):
    it = pipe.fill_pipeline(batches)
    retired = []
    while True:
        try:
            retired.append(pipe.progress(it))
        except StopIteration:
            return retired


def serial_reference(n, slow_from, **options):
    t = Training(slow_from)
    plan = PipelinePlan({task: TaskSchedule() for task in t.tasks()},
                        intra_iter_deps=[("Forward", "Load"), ("Step", "Forward")])
    SWPipeline(plan, "cpu", **options).run_serial(range(n))
    return t


# ---------------------------------------------------------------- decisions and exactness


def test_a_drift_swaps_the_plan_at_the_decided_iteration_and_results_equal_the_serial_loop(plans):
    before, after = plans
    n, slow_from = 60, 25
    t = Training(slow_from)
    # clock read 0 is the fill; read j >= 1 closes the period of iteration j - 1: iterations 29 on take 2.0
    pipe = AdaptivePipeline(bound(before, t), COSTS0, "cpu", replan=OPTS, cost_source=Scripted(),
                            search=lambda plan, costs: bound(after, t), clock=ScriptedClock(switch=30))
    with pipe:
        retired = drive(pipe, range(n))
    assert retired == list(range(n))  # every iteration returned once, in order, across the drain
    # warm-up 0-1, baseline 2-5 (reference 1.0); rolling medians of 4 leave the band at 30, 31, 32 -> drift at 32;
    # decided 3 periods later; the new plan starts after what the old one had fetched
    [swap] = pipe.decisions
    assert (swap.detected_at, swap.decided_at, swap.swapped) == (32, 35, True)
    assert swap.starts_at == 35 + before.pipeline_depth + 1  # 36 .. 35 + depth were in flight, drained in order
    assert (swap.reference_s, swap.measured_s) == (1.0, 2.0)
    assert swap.costs is COSTS1
    assert swap.predicted_old_s == pytest.approx(predicted_period(before, COSTS1))
    assert swap.predicted_new_s == pytest.approx(predicted_period(after, COSTS1))
    assert swap.measured_after_s == 2.0  # the new plan's baseline (scripted)
    assert str(pipe.plan) == str(after) and pipe.swaps == [swap]
    ref = serial_reference(n, slow_from)
    assert t.losses == ref.losses  # bit for bit, every batch
    assert all(torch.equal(a, b) for a, b in zip(t.model.parameters(), ref.model.parameters()))
    assert t.load_runs == ref.load_runs == slow_from + 2 * (n - slow_from)
    # the new plan numbers its iterations on from the old one's: each task sees the iteration's run-wide index
    assert t.iter_idx == {b: [b, b] for b in range(n)}
    assert "swpipe-replan" not in swpipe_threads()


def test_per_task_random_draws_across_a_swap_equal_an_unswapped_run_and_the_serial_loop(plans):
    before, after = plans
    n = 50
    torch.manual_seed(3)  # the per-task generators' seed, read by every SWPipeline made (the new plan's too)
    t = Training()
    pipe = AdaptivePipeline(bound(before, t), COSTS0, "cpu", replan=OPTS, cost_source=Scripted(),
                            search=lambda plan, costs: bound(after, t), clock=ScriptedClock(switch=30),
                            rng="per_task")
    with pipe:
        drive(pipe, range(n))
    [swap] = pipe.swaps
    assert 0 < swap.starts_at < n
    torch.manual_seed(3)
    plain = Training()
    with AdaptivePipeline(bound(before, plain), COSTS0, "cpu", replan=None, rng="per_task") as unswapped:
        drive(unswapped, range(n))
    torch.manual_seed(3)
    ref = serial_reference(n, 10 ** 9, rng="per_task")
    for other in (plain, ref):
        assert sorted(other.draws) == sorted(t.draws) == list(range(n))
        assert all(torch.equal(t.draws[b], other.draws[b]) for b in range(n))
    assert not torch.equal(t.draws[swap.starts_at], t.draws[0])  # not drawn again from iteration 0's generator
    assert t.losses == ref.losses


def test_a_run_may_start_at_a_given_iteration_and_every_plan_numbers_on_from_it(plans):
    before, after = plans
    t = Training()
    pipe = AdaptivePipeline(bound(before, t), COSTS0, "cpu", replan=OPTS, cost_source=Scripted(),
                            search=lambda plan, costs: bound(after, t), clock=ScriptedClock(switch=30))
    with pipe:
        it = pipe.fill_pipeline(range(100, 150), first_iter_idx=100)
        retired = []
        while True:
            try:
                retired.append(pipe.progress(it))
            except StopIteration:
                break
    [swap] = pipe.swaps
    assert retired == list(range(100, 150))
    assert (swap.detected_at, swap.decided_at) == (132, 135)  # the run-wide index, as the decisions count
    assert t.iter_idx == {b: [b, b] for b in range(100, 150)}


def test_no_swap_when_the_search_finds_the_running_plan_and_the_new_level_becomes_the_reference(plans):
    before, _ = plans
    t = Training()
    source = Scripted()
    pipe = AdaptivePipeline(bound(before, t), COSTS0, "cpu", replan=OPTS, cost_source=source,
                            search=lambda plan, costs: plan, clock=ScriptedClock(switch=30))
    with pipe:
        drive(pipe, range(80))
    [kept] = pipe.decisions  # one search: after it, 2.0 is "steady", so no second drift
    assert (kept.detected_at, kept.decided_at, kept.swapped, kept.starts_at) == (32, 35, False, None)
    assert source.asked == 1 and pipe.swaps == []
    assert str(pipe.plan) == str(before)


def test_a_gain_within_the_cost_noise_is_no_swap(plans):
    before, after = plans
    t = Training()
    pipe = AdaptivePipeline(bound(before, t), COSTS0, "cpu", replan=OPTS, cost_source=Scripted(noise=0.9),
                            search=lambda plan, costs: bound(after, t), clock=ScriptedClock(switch=30))
    with pipe:
        drive(pipe, range(50))
    assert [d.swapped for d in pipe.decisions] == [False]


def test_no_search_and_no_swap_over_a_long_noisy_idle_run(plans):
    before, after = plans
    t = Training()
    searches = []
    # +-4 % jitter and a 60 % spike every 17th period: noise, never drift
    jitter = [0.04, -0.04, 0.02, -0.03, 0.0, 0.01, -0.02, 0.03, -0.01, 0.02, 0.0, -0.04, 0.04, 0.01, -0.02, 0.0, 0.6]
    pipe = AdaptivePipeline(bound(before, t), COSTS0, "cpu", replan=ReplanOptions(warmup=2, window=9, patience=5),
                            cost_source=Scripted(), search=lambda plan, costs: searches.append(1) or after,
                            clock=ScriptedClock(switch=10 ** 9, jitter=jitter))
    with pipe:
        retired = drive(pipe, range(1500))
    assert len(retired) == 1500
    assert pipe.decisions == [] and searches == []


def test_the_default_search_finds_the_plan_for_the_new_costs(plans):
    before, after = plans
    t = Training(slow_from=20)
    pipe = AdaptivePipeline(bound(before, t), COSTS0, "cpu",
                            replan=ReplanOptions(warmup=2, window=4, patience=3, search_periods=3, time_limit_s=5,
                                                 constraints=Constraints(max_depth=3, max_threads=2)),
                            cost_source=Scripted(), clock=ScriptedClock(switch=30))
    with pipe:
        drive(pipe, range(50))
    [swap] = pipe.swaps
    assert swap.predicted_new_s == pytest.approx(predicted_period(after, COSTS1))  # the searched optimum
    assert predicted_period(pipe.plan, COSTS1) == pytest.approx(swap.predicted_new_s)
    assert t.losses == serial_reference(50, 20).losses


def test_a_failed_search_surfaces_at_the_decision_with_its_traceback_and_no_thread_is_left(plans):
    before, _ = plans
    t = Training()

    def broken_search(plan, costs):
        raise ValueError("no plan")

    pipe = AdaptivePipeline(bound(before, t), COSTS0, "cpu", replan=OPTS, cost_source=Scripted(),
                            search=broken_search, clock=ScriptedClock(switch=30))
    with pipe, pytest.raises(ReplanError) as caught:
        drive(pipe, range(60))
    assert (caught.value.iteration, caught.value.reason) == (35, "failed")
    assert isinstance(caught.value.__cause__, ValueError)
    assert "broken_search" in caught.value.traceback
    assert "swpipe-replan" not in swpipe_threads()


def test_the_default_source_is_a_rolling_window_installed_on_every_pipeline_and_measures_each_task():
    reads = threading.local()

    def per_thread_clock():  # one second per read on each thread: every task measures exactly 1.0
        reads.n = getattr(reads, "n", 0) + 1
        return float(reads.n)

    ran = []
    tasks = [PipelineTask(n, lambda ctx, n=n: ran.append(n)) for n in ("Load", "Forward", "Step")]
    plan = PipelinePlan({tasks[0]: TaskSchedule(0, thread_group="io"), tasks[1]: TaskSchedule(1),
                         tasks[2]: TaskSchedule(1)}, intra_iter_deps=[("Forward", "Load"), ("Step", "Forward")])
    with AdaptivePipeline(plan, COSTS0, "cpu") as pipe:
        assert isinstance(pipe.cost_source, RollingSource) and pipe.cost_source.base is COSTS0
        # the window is the periods the drift is watched over: at a drift, most of its durations are the new level
        assert pipe.cost_source.rolling.window == ReplanOptions().window
    source = RollingSource(COSTS0, RollingCosts(window=4, clock=per_thread_clock))
    with AdaptivePipeline(plan, COSTS0, "cpu", cost_source=source) as pipe:
        pipe.run(range(6))
        assert pipe.pipeline.instruments == ()  # removed when the run ended
    snap = source.costs_now()
    assert [snap.costs[n].host_s for n in ("Load", "Forward", "Step")] == [1.0, 1.0, 1.0]
    assert [source.rolling.stats()[n].recorded for n in ("Load", "Forward", "Step")] == [6, 6, 6]
    assert len(ran) == 18


def test_without_replan_options_nothing_is_watched(plans):
    before, after = plans
    t = Training()
    source = Scripted()
    pipe = AdaptivePipeline(bound(before, t), COSTS0, "cpu", replan=None, cost_source=source,
                            clock=ScriptedClock(switch=10))
    with pipe:
        assert drive(pipe, range(40)) == list(range(40))
    assert pipe.decisions == [] and source.asked == 0


def test_options_of_the_wrong_type_or_out_of_range_are_refused(plans):
    before, _ = plans
    t = Training()
    with pytest.raises(OptionError) as caught:
        AdaptivePipeline(bound(before, t), COSTS0, "cpu").fill_pipeline(range(3), first_iter_idx=-2)
    assert (caught.value.given_to, caught.value.field, caught.value.value) == (
        "AdaptivePipeline.fill_pipeline", "first_iter_idx", -2)
    with pytest.raises(OptionError) as caught:
        AdaptivePipeline(bound(before, t), COSTS0, "cpu", replan={"patience": 3})
    assert caught.value.field == "replan"
    with pytest.raises(OptionError) as caught:
        ReplanOptions(window=0)
    assert caught.value.field == "window"
    with pytest.raises(OptionError) as caught:
        ReplanOptions(exchange_every=0)
    assert caught.value.field == "exchange_every"


def test_a_drain_during_the_swap_keeps_the_decision_the_next_fill_runs_the_new_plan(plans):
    before, after = plans
    t = Training()
    pipe = AdaptivePipeline(bound(before, t), COSTS0, "cpu", replan=OPTS, cost_source=Scripted(),
                            search=lambda plan, costs: bound(after, t), clock=ScriptedClock(switch=30))
    with pipe:
        it = pipe.fill_pipeline(range(100))
        while not pipe.decisions:
            pipe.progress(it)
        pipe.drain()  # the old plan was about to drain through progress: the swap is made all the same
        assert str(pipe.plan) == str(after) and str(pipe.pipeline.plan) == str(after)
        assert pipe.swaps == pipe.decisions
