"""Costs measured while the job runs: RollingCosts' window arithmetic, ages, threads, the engine hook, refreshed models."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from autosched.model.costs import CostModel, CostModelError, TaskCost
from autosched.model.simulate import simulate
from swpipe_core.engine.options import OptionError
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.measure.calibrate import MachineCalibration
from swpipe_core.measure.rolling import RollingCosts
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule

pytestmark = pytest.mark.timeout(120)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _plan(names="ABC", caller_group="default"):
    tasks = {n: PipelineTask(n, lambda ctx: None) for n in names}
    return PipelinePlan({tasks[n]: TaskSchedule(min(i, 1), thread_group=f"g{i}") for i, n in enumerate(names)},
                        intra_iter_deps=list(zip(names[1:], names[:-1])), caller_group=caller_group)


# -- the window's arithmetic --------------------------------------------------------------------------------------


def test_statistics_of_injected_durations():
    r = RollingCosts(window=10, clock=Clock(5.0))
    for d in (1.0, 2.0, 3.0, 4.0, 10.0):
        r.add("A", d, at=1.0)
    s = r.stats()["A"]
    assert (s.samples, s.recorded, s.median_s, s.q1_s, s.q3_s, s.min_s, s.max_s) == (5, 5, 3.0, 2.0, 4.0, 1.0, 10.0)
    assert s.mad_s == 1.0  # deviations 2, 1, 0, 1, 7
    assert (s.iqr_s, s.spread) == (2.0, 2.0 / 3.0)


def test_one_spike_does_not_move_the_median():
    r = RollingCosts(window=9)
    for d in (0.010, 0.011, 0.009, 0.010, 0.012, 0.010, 0.011, 0.009):
        r.add("Fwd", d)
    before = r.stats()["Fwd"].median_s
    r.add("Fwd", 5.0)  # a load spike: 500 times the others
    after = r.stats()["Fwd"]
    assert after.median_s == before == 0.010 and after.max_s == 5.0


def test_the_window_keeps_only_the_last_durations_and_counts_every_one():
    r = RollingCosts(window=3)
    for d in (9.0, 8.0, 1.0, 2.0, 3.0):
        r.add("A", d)
    s = r.stats()["A"]
    assert (s.samples, s.recorded, s.min_s, s.max_s, s.median_s) == (3, 5, 1.0, 3.0, 2.0)


def test_host_and_device_windows_are_apart():
    r = RollingCosts()
    r.add("A", 1.0)
    r.add("A", 7.0, kind="device")
    assert r.stats("host")["A"].median_s == 1.0 and r.stats("device")["A"].median_s == 7.0


def test_age_comes_from_the_clock_and_max_age_leaves_old_samples_out():
    clock = Clock(100.0)
    r = RollingCosts(window=10, max_age_s=30.0, clock=clock)
    r.add("A", 5.0, at=60.0)   # 40 s old at the read: out
    r.add("A", 1.0, at=80.0)
    r.add("A", 2.0, at=95.0)
    r.add("B", 3.0, at=10.0)   # B has only an old sample: left out
    s = r.stats()
    assert list(s) == ["A"]
    assert (s["A"].samples, s["A"].recorded, s["A"].median_s, s["A"].age_s, s["A"].span_s) == (2, 3, 1.5, 5.0, 20.0)
    clock.now = 200.0
    assert r.stats() == {}


def test_samples_taken_by_the_wrapper_are_stamped_by_the_clock():
    clock = Clock(10.0)
    r = RollingCosts(clock=clock)

    def run_task(task, ctx):
        clock.now += 0.25  # the task "takes" a quarter second on the fake clock

    r(run_task, PipelineTask("A", lambda ctx: None), None)
    clock.now = 12.0
    s = r.stats()["A"]
    assert (s.median_s, s.age_s) == (0.25, 1.75)


def test_a_task_that_raises_records_nothing():
    r = RollingCosts()

    def failing(task, ctx):
        raise KeyError("boom")

    with pytest.raises(KeyError):
        r(failing, PipelineTask("A", lambda ctx: None), None)
    assert r.stats() == {}


@pytest.mark.parametrize("kwargs, field", [({"window": 0}, "window"), ({"window": 2.5}, "window"),
                                           ({"max_age_s": 0}, "max_age_s"), ({"clock": 3}, "clock")])
def test_bad_options_name_their_field(kwargs, field):
    with pytest.raises(OptionError) as info:
        RollingCosts(**kwargs)
    assert (info.value.field, info.value.given_to) == (field, "RollingCosts")


@pytest.mark.parametrize("seconds, kind", [(-1.0, "host"), (float("nan"), "host"), (1.0, "disk")])
def test_add_refuses_a_bad_duration_or_kind(seconds, kind):
    r = RollingCosts()
    with pytest.raises(ValueError):
        r.add("A", seconds, kind=kind)
    assert r.stats() == {}


def test_threads_recording_at_once_lose_no_sample():
    n_threads, per_thread = 8, 2000
    r = RollingCosts(window=n_threads * per_thread)
    start = threading.Barrier(n_threads)

    def record(k):
        start.wait(timeout=30)
        for i in range(per_thread):
            r.add("shared", 1.0)
            r.add(f"own{k}", float(i))

    threads = [threading.Thread(target=record, args=(k,), name=f"rolling-test-{k}") for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    s = r.stats()
    assert (s["shared"].samples, s["shared"].recorded) == (n_threads * per_thread,) * 2
    assert all(s[f"own{k}"].recorded == per_thread for k in range(n_threads))


# -- the engine's hook ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("caller_group", [None, "g0"])
def test_the_wrapper_records_one_sample_per_task_execution_on_a_pipelined_run(caller_group):
    pipe = SWPipeline(_plan(caller_group=caller_group), device="cpu")
    r = RollingCosts(window=5)
    try:
        with pipe.instrument(r):
            pipe.run(range(12))
            pipe.run_serial(range(3))
    finally:
        pipe.close()
    s = r.stats()
    assert {n: (w.recorded, w.samples) for n, w in s.items()} == {n: (15, 5) for n in "ABC"}
    assert r.stats("device") == {} and not r.times_device


def test_nothing_is_recorded_outside_the_instrument_block():
    pipe = SWPipeline(_plan(), device="cpu")
    r = RollingCosts()
    try:
        with pipe.instrument(r):
            pipe.run(range(4))
        pipe.run(range(4))
    finally:
        pipe.close()
    assert {n: w.recorded for n, w in r.stats().items()} == {n: 4 for n in "ABC"}


@pytest.mark.cuda
def test_device_spans_are_resolved_lazily_one_per_task_execution(fake_cuda):
    from swpipe.testing import kernels

    dev = fake_cuda.device(0)
    k = kernels(dev)
    tasks = {n: PipelineTask(n, lambda ctx: k.spin(0.0)) for n in "AB"}
    plan = PipelinePlan({tasks["A"]: TaskSchedule(0, "side", "io"), tasks["B"]: TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("B", "A")], caller_group=None)
    pipe = SWPipeline(plan, device=dev)
    r = RollingCosts(window=64, device=pipe)
    try:
        with pipe.instrument(r):
            pipe.run(range(10))
        pipe.streams.synchronize(30.0)
    finally:
        pipe.close()
    assert r.times_device and r.resolve() == 0
    host, device = r.stats("host"), r.stats("device")
    assert {n: w.recorded for n, w in host.items()} == {n: w.recorded for n, w in device.items()} == {"A": 10, "B": 10}


# -- refreshed cost models ----------------------------------------------------------------------------------------


def _window(durations, device=()):
    r = RollingCosts(clock=Clock(50.0))
    for name, values in durations.items():
        for i, d in enumerate(values):
            r.add(name, d, at=40.0 + i)
    for name, values in dict(device).items():
        for i, d in enumerate(values):
            r.add(name, d, kind="device", at=40.0 + i)
    return r


def test_a_refreshed_model_carries_the_medians_and_keeps_the_rest():
    calibration = MachineCalibration(task_s=1e-5)
    model = CostModel({"A": TaskCost(0.5, 0.1, resources=("pcie",), add_bytes=64.0), "B": TaskCost(0.25)},
                      machine="m", batch_bytes=8.0, machine_calibration=calibration, cores=2)
    r = _window({"A": [0.004, 0.002, 0.003, 0.9, 0.003], "B": [0.001, 0.002]}, device={"A": [0.01] * 5})
    fresh = model.refreshed(r, min_samples=5)
    assert fresh["A"] == TaskCost(0.003, 0.01, resources=("pcie",), add_bytes=64.0)
    assert fresh["B"] == model["B"]  # two samples: too few, the model's cost is kept
    assert (fresh.machine, fresh.batch_bytes, fresh.machine_calibration, fresh.cores) == ("m", 8.0, calibration, 2)
    f = fresh.freshness
    assert (f.tasks["A"].source, f.tasks["B"].source, f.refreshed, f.min_samples) == ("window", "model", ["A"], 5)
    assert (f.tasks["A"].samples, f.tasks["A"].age_s, f.age_s, f.span_s) == (5, 6.0, 6.0, 10.0)
    assert model.freshness is None and model["A"].host_s == 0.5  # the model itself is not changed
    assert fresh.refreshed(r, min_samples=2)["B"].host_s == 0.0015


def test_a_refreshed_model_simulates_with_the_medians():
    plan = _plan("AB", caller_group=None)
    medians = CostModel({"A": TaskCost(0.003), "B": TaskCost(0.002)})
    r = _window({"A": [0.003, 0.004, 0.003, 0.2, 0.002], "B": [0.002, 0.002, 0.5, 0.001, 0.002]})
    fresh = CostModel({"A": TaskCost(0.030), "B": TaskCost(0.050)}).refreshed(r)
    result = simulate(plan, fresh)
    assert result.period_s == simulate(plan, medians).period_s
    assert result.costs.freshness is fresh.freshness
    assert result.summary().splitlines()[-1] == fresh.freshness.summary()
    assert simulate(plan, medians).costs.freshness is None


def test_from_rolling_needs_enough_samples_for_every_task():
    r = _window({"A": [0.003] * 5, "B": [0.002]})
    with pytest.raises(CostModelError) as info:
        CostModel.from_rolling(r)
    assert (info.value.tasks, info.value.field, info.value.value) == (["B"], "rolling", 5)
    model = CostModel.from_rolling(r, min_samples=1, machine="here")
    assert (model["A"].host_s, model["B"].host_s, model.machine) == (0.003, 0.002, "here")
    with pytest.raises(CostModelError) as empty:
        CostModel.from_rolling(RollingCosts())
    assert empty.value.field == "rolling"


@pytest.mark.parametrize("bad", [0, 2.0, True])
def test_min_samples_must_be_a_positive_integer(bad):
    with pytest.raises(CostModelError) as info:
        CostModel({"A": TaskCost(1.0)}).refreshed(RollingCosts(), min_samples=bad)
    assert (info.value.field, info.value.value) == ("min_samples", bad)


def test_freshness_is_not_written_and_does_not_change_equality():
    r = _window({"A": [0.5] * 5})
    model = CostModel({"A": TaskCost(0.5)})
    fresh = model.refreshed(r)
    assert fresh == dataclasses.replace(model, method=fresh.method)
    assert CostModel.from_dict(fresh.to_dict()).freshness is None
