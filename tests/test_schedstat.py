"""The wait for a core after each wake-up, from a run's own threads (swpipe_core.schedstat), and how the model uses it."""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time

import pytest

from autosched.calibrated import calibrated_costs, simulate_calibrated
from autosched.costs import CostModel, TaskCost
from autosched.simulate import simulate
from swpipe_core import schedstat
from swpipe_core.calibrate import MachineCalibration
from swpipe_core.engine import SWPipeline
from swpipe_core.plan import PipelinePlan, TaskSchedule

MS = 1e-3

pytestmark = pytest.mark.timeout(120)


def _two_threads() -> PipelinePlan:
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
                        intra_iter_deps=[("B", "A")])
    return plan.bind({"A": lambda ctx: time.sleep(1e-4), "B": lambda ctx: time.sleep(1e-4)})  # the workload


def test_wake_s_is_the_run_delay_per_time_on_a_cpu_summed_over_the_threads_that_ran_tasks(monkeypatch):
    # every reading on a thread adds 3 ms of run delay and 2 times on a CPU: 1.5 ms per time, whatever the thread
    counts = {}

    class FakeReaders:
        def read(self) -> tuple:
            n = counts[threading.get_native_id()] = counts.get(threading.get_native_id(), 0) + 1
            return n * 3e-3, n * 2

        def close(self) -> None:
            counts["closed"] = 1

    monkeypatch.setattr(schedstat, "thread_run_delay", lambda: (0.0, 1))
    monkeypatch.setattr(schedstat, "_Readers", FakeReaders)
    with SWPipeline(_two_threads(), device="cpu") as pipe:
        got = schedstat.measure_wake_s(pipe, range(10))
    assert counts.pop("closed") == 1
    assert len(counts) == 2  # one reader per task thread
    assert got == pytest.approx(1.5e-3)


def test_no_counters_give_no_wake_up(monkeypatch):
    monkeypatch.setattr(schedstat, "thread_run_delay", lambda: None)
    with SWPipeline(_two_threads(), device="cpu") as pipe:
        assert schedstat.measure_wake_s(pipe, range(10)) is None


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux schedstat")
def test_the_kernels_counters_are_read_and_only_grow():
    first = schedstat.thread_run_delay()
    for _ in itertools.repeat(None, 3):
        time.sleep(1e-3)  # the workload: three sleeps put the thread back on a CPU three times
    later = schedstat.thread_run_delay()
    assert first is not None and later is not None
    assert later[0] >= first[0] and later[1] >= first[1] + 3
    with SWPipeline(_two_threads(), device="cpu") as pipe:
        wake = schedstat.measure_wake_s(pipe, range(10))
    assert wake is not None and wake >= 0  # the workers' counters were read (how long a wake-up waits is a figure)


def test_a_measured_wake_up_longer_than_dep_s_is_charged_per_cross_thread_dependency():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(1, thread_group="y")},
                        intra_iter_deps=[("B", "A")])
    costs = CostModel({"A": TaskCost(MS), "B": TaskCost(MS)})
    cal = MachineCalibration(dep_s=2e-5)
    assert calibrated_costs(costs, plan, cal)["B"].host_s == pytest.approx(MS + 2e-5)
    assert calibrated_costs(costs, plan, dataclasses.replace(cal, wake_s=9e-5))["B"].host_s == pytest.approx(MS + 9e-5)
    # a shorter one leaves dep_s: the hand-off itself is never cheaper than the tight-loop measurement
    assert calibrated_costs(costs, plan, dataclasses.replace(cal, wake_s=1e-6))["B"].host_s == pytest.approx(MS + 2e-5)


def test_a_measured_wake_up_lengthens_each_contended_take_back():
    two = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="y")})
    costs = CostModel({"A": TaskCost(MS), "B": TaskCost(MS)})
    # A: 10 torch calls per 1 ms run beside B, pure Python: each take-back waits one wake-up while B runs
    cal = MachineCalibration(cores_free=2.0, cpu_count=2, dep_s=2e-5, gil={"A": 0.0, "B": 1.0}, calls={"A": 10})
    assert simulate_calibrated(two, costs, cal, gil="shared").period == pytest.approx((1 + 1 / 6) * MS, rel=2e-3)
    # 40 us each: 1.4x slower while B runs, so A ends 2/7 ms after B; both idle workers also wake 40 us late
    slow = dataclasses.replace(cal, wake_s=4e-5)
    assert simulate_calibrated(two, costs, slow, gil="shared").period \
        == pytest.approx(4e-5 + (1 + 2 / 7) * MS, rel=3e-3)


def test_wake_s_goes_through_json_and_files_without_it_read_as_before():
    cal = MachineCalibration(dep_s=2e-5, wake_s=8e-5)
    doc = cal.to_dict()
    assert doc["wake_s"] == 8e-5 and MachineCalibration.from_dict(doc) == cal
    assert "wait for a core per wake-up in the plan's run: 80.0 us" in cal.summary()
    without = MachineCalibration(dep_s=2e-5).to_dict()
    assert "wake_s" not in without and MachineCalibration.from_dict(without).wake_s is None
    for bad in (-1.0, True, "fast"):
        with pytest.raises(ValueError, match="machine_calibration.wake_s: .* not a time >= 0"):
            MachineCalibration.from_dict({**doc, "wake_s": bad})


def test_an_idle_worker_woken_by_the_enqueue_starts_its_task_a_wake_up_later():
    # A on the caller's thread, B on a worker that idles while A runs: B starts each period a wake-up late
    plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0, thread_group="w")}, intra_iter_deps=[("A", "B")],
                        caller_group="default")
    costs = CostModel({"A": TaskCost(MS), "B": TaskCost(MS)})
    assert simulate(plan, costs).period == pytest.approx(2 * MS)
    late = simulate(plan, costs, wake_overhead_s=1e-4)
    assert late.period == pytest.approx(2.1 * MS)
    assert {s.cause for s in late.stalls if s.task == "B"} == {"wake"}
    # the caller's own group is awake: a plan with every task on it pays nothing
    inline = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0)}, intra_iter_deps=[("A", "B")])
    assert simulate(inline, costs, wake_overhead_s=1e-4).period == pytest.approx(2 * MS)
    # the calibrated simulation charges the plan's measured wake_s there, and again where A waits for B
    cal = MachineCalibration(wake_s=1e-4)
    assert simulate_calibrated(plan, costs, cal, core_pool=False).period == pytest.approx(2.2 * MS)
    with pytest.raises(ValueError, match="wake_overhead_s"):
        simulate(plan, costs, wake_overhead_s=-1.0)


def test_a_busy_worker_takes_its_next_task_without_a_wake_up():
    # B(i + 1) is enqueued while B's thread still runs B(i): only the first period wakes it
    plan = PipelinePlan({"B": TaskSchedule(0, thread_group="w"), "A": TaskSchedule(1)}, intra_iter_deps=[("A", "B")],
                        caller_group="default")
    costs = CostModel({"A": TaskCost(MS), "B": TaskCost(3 * MS)})
    got = simulate(plan, costs, wake_overhead_s=1e-4)
    assert got.period == pytest.approx(3 * MS)
    assert [s.iteration for s in got.stalls if s.cause == "wake"] == [0]


def test_periods_enqueued_while_a_worker_wakes_do_not_wake_it_again():
    # depth 3: fill_pipeline enqueues three periods 50 us apart; the worker, woken by the first, starts A(0) 100 us
    # after it and runs the others in turn
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="w"), "B": TaskSchedule(2)}, intra_iter_deps=[("B", "A")],
                        caller_group="default")
    costs = CostModel({"A": TaskCost(MS), "B": TaskCost(MS)})
    got = simulate(plan, costs, num_iterations=6, period_overhead_s=5e-5, wake_overhead_s=1e-4)
    starts = sorted(e.start for e in got.events if e.task == "A")
    assert starts[:3] == pytest.approx([1.5e-4, 1.5e-4 + MS, 1.5e-4 + 2 * MS])


def test_calibrate_measures_the_plans_wake_up_only_when_given_batches_for_a_pipelined_run(monkeypatch):
    from swpipe_core import calibrate as calibration

    monkeypatch.setattr(calibration, "measure_engine_costs", lambda **kw: {
        "task_s": 0.0, "dep_s": 0.0, "period_s": 0.0, "serial_task_s": 0.0, "serial_iter_s": 0.0})
    monkeypatch.setattr(calibration, "measure_cores", lambda: (2.0, 2))
    monkeypatch.setattr(schedstat, "measure_wake_s", lambda pipe, batches: 7e-5 if len(list(batches)) == 12 else None)
    with SWPipeline(_two_threads(), device="cpu") as pipe:
        assert calibration.calibrate(pipe, 0, gil_iterations=1).wake_s is None
        assert calibration.calibrate(pipe, 0, gil_iterations=1, wake_batches=range(12)).wake_s == 7e-5
