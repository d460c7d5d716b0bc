"""``benchmarks/calibrated_fidelity.py``'s paired estimator: costs measured right before each run predict that run."""

from __future__ import annotations

import argparse
import statistics
import time

import pytest
from conftest import load_benchmark

from swpipe_core.calibrate import MachineCalibration
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule

pytestmark = pytest.mark.timeout(300)


def _bench():
    return load_benchmark("calibrated_fidelity")


def _sleeper(seconds: float):
    return lambda ctx: time.sleep(seconds)  # the workload, not a synchronisation


def test_paired_errors_give_one_small_error_per_round_for_each_plan():
    a, b = PipelineTask("A", _sleeper(0.005)), PipelineTask("B", _sleeper(0.005))
    overlapped = PipelinePlan({a: TaskSchedule(0, thread_group="io"), b: TaskSchedule(1, thread_group="compute")},
                              intra_iter_deps=[(b, a)])
    one_thread = PipelinePlan({a: TaskSchedule(0), b: TaskSchedule(0)}, intra_iter_deps=[(b, a)])
    cal = MachineCalibration(cores_free=2.0, cpu_count=2, cpu={"A": 0.0, "B": 0.0})  # sleeps hold no core
    args = argparse.Namespace(rounds=3, costs="serial", serial_iters=3, sim_iters=30, core_pool=True)
    entries = [("overlapped", overlapped, 0), ("one thread", one_thread, 0)]
    errs = _bench().paired_errors(entries, {"overlapped": cal, "one thread": cal}, args, list(range(12)))
    assert set(errs) == {"overlapped", "one thread"}
    assert all(len(v) == 3 for v in errs.values())
    # 5 ms vs 10 ms per period: predicting either plan with the other's period would be off by 50-100 %;
    # the median of the rounds leaves one round slowed by a busy machine out
    for label, v in errs.items():
        assert abs(statistics.median(v)) < 0.3, (label, v)


def test_the_summary_reports_the_paired_column(capsys):
    got = _bench().main(["--plans", "1", "--rounds", "1", "--iters", "8", "--serial-iters", "3", "--sim-iters", "20"])
    out = capsys.readouterr().out
    assert got == 0
    assert "paired err (rounds)" in out
    assert "sleep       paired (1 plans): median |error|" in out
