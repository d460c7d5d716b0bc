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
    args = argparse.Namespace(rounds=3, costs="serial", serial_iters=3, sim_iters=30, core_pool=True, bracket=True)
    entries = [("overlapped", overlapped, 0), ("one thread", one_thread, 0)]
    errs = _bench().paired_errors(entries, {"overlapped": cal, "one thread": cal}, args, list(range(12)))
    assert set(errs) == {"overlapped", "one thread"}
    assert all(set(models) == {"+engine", "gil shared", "gil -wake"} for models in errs.values())
    assert all(len(v) == 3 for models in errs.values() for v in models.values())
    # 5 ms vs 10 ms per period: predicting either plan with the other's period would be off by 50-100 %;
    # the median of the rounds leaves one round slowed by a busy machine out
    for label, models in errs.items():
        for model, v in models.items():
            assert abs(statistics.median(v)) < 0.3, (label, model, v)


def test_the_summary_reports_the_paired_column(capsys):
    got = _bench().main(["--plans", "1", "--rounds", "1", "--iters", "8", "--serial-iters", "3", "--sim-iters", "20",
                        "--no-keep-freed-memory"])  # in-process: leave the test process's malloc as it is
    out = capsys.readouterr().out
    assert got == 0
    assert "paired err (rounds)" in out
    assert "sleep       paired (1 plans): median |error|" in out
    assert "sleep   paired gil (1 plans): median |error|" in out


@pytest.mark.parametrize("bracket", [True, False])
def test_paired_costs_are_taken_on_both_sides_of_each_run_when_bracketed(monkeypatch, bracket):
    bench = _bench()
    order = []
    measure = bench.measure_plans
    task_costs = bench._task_costs

    def costs(plan, args, batches, cal):
        order.append("costs")
        return task_costs(plan, args, batches, cal)

    def runs(*a, **k):
        order.append("run")
        return measure(*a, **k)

    monkeypatch.setattr(bench, "_task_costs", costs)
    monkeypatch.setattr(bench, "measure_plans", runs)
    plan = PipelinePlan({PipelineTask("A", _sleeper(0.002)): TaskSchedule(0)})
    args = argparse.Namespace(rounds=2, costs="serial", serial_iters=2, sim_iters=10, core_pool=True, bracket=bracket)
    errs = bench.paired_errors([("one", plan, 0)], {"one": MachineCalibration(cores_free=2.0, cpu_count=2)}, args,
                               list(range(6)))
    assert len(errs["one"]["+engine"]) == 2
    per_round = ["costs", "run", "costs"] if bracket else ["costs", "run"]
    assert order == per_round * 2

