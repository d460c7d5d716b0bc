"""Measurement fed back into the model: the core pool refitted to the verified periods, and a final search round.

The tests that run a verification make its engine runs report the period the
tasks' true costs simulate (:func:`conftest.measured_by_simulation`): the fit
and the choice then follow from the costs, not from how loaded the machine is.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from autosched.model.costs import CostModel, TaskCost
from autosched.verify.refit import fit_core_pool
from autosched.search.options import Constraints, SolverOptions
from swpipe import auto_schedule
from autosched.verify.candidates import plan_key, serial_plan
from autosched.verify.loop import VerifyOptions, measure_refit
from autosched.verify.measure import PlanMeasurement, VerifyTable, measure_plans
from autosched.search.problem import make_problem
from conftest import measured_by_simulation, word_after
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule

pytestmark = pytest.mark.timeout(300)

TWO_THREADS = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
                           intra_iter_deps=[("B", "A")])
COSTS = {"A": TaskCost(0.002), "B": TaskCost(0.002)}


def _table(measured_two: float, measured_serial: float = 0.004) -> VerifyTable:
    return VerifyTable([PlanMeasurement("auto", TWO_THREADS, [measured_two]),
                        PlanMeasurement("serial", serial_plan(TWO_THREADS), [measured_serial], predicted_s=0.004)],
                       rounds=1, iterations=20)


def test_the_pool_moves_to_the_size_the_measurements_show():
    fit = fit_core_pool(_table(0.004), CostModel(COSTS, cores=2))  # two threads ran one after the other
    assert (fit.cores, fit.was, fit.plans) == (1, 2, 1)
    assert fit.changed and fit.errors_pct[1] < 1.0 < 40.0 < fit.errors_pct[2]
    fit = fit_core_pool(_table(0.002), CostModel(COSTS, cores=1))  # they ran at once
    assert (fit.cores, fit.changed) == (2, True)


def test_a_model_without_a_pool_is_fitted_against_unlimited():
    fit = fit_core_pool(_table(0.004), CostModel(COSTS))
    assert (fit.cores, fit.was) == (1, None)
    assert set(fit.errors_pct) == {1, None}
    assert word_after(fit.describe(), "model's") == "unlimited"  # fitted against the model's unlimited pool


def test_the_model_keeps_its_pool_when_no_size_fits_better_by_the_noise_floor():
    fit = fit_core_pool(_table(0.003), CostModel(COSTS, cores=2))  # halfway: both sizes 33 % off
    assert (fit.cores, fit.changed) == (2, False)
    assert "keep" in fit.describe().split() and "2 core(s)" in fit.describe()


def test_no_fit_without_a_serial_row_or_a_multi_thread_plan():
    one = serial_plan(TWO_THREADS)
    no_serial = VerifyTable([PlanMeasurement("auto", TWO_THREADS, [0.004])], rounds=1, iterations=20)
    one_thread = VerifyTable([PlanMeasurement("auto", one.replace(pipeline_depth=2), [0.004]),
                              PlanMeasurement("serial", one, [0.004], predicted_s=0.004)], rounds=1, iterations=20)
    assert fit_core_pool(no_serial, CostModel(COSTS, cores=2)) is None
    assert fit_core_pool(one_thread, CostModel(COSTS, cores=2)) is None


def _spin(seconds: float):
    def fn(ctx):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:  # pure Python: the workload holds the GIL, so threads take turns
            pass
    return fn


def test_gil_bound_tasks_refit_a_two_core_model_to_one_core_and_the_returned_plan_was_measured_fastest(monkeypatch):
    # the tasks hold the GIL: however many threads, they run one at a time, as on one core
    measured_by_simulation(monkeypatch, CostModel({"A": TaskCost(0.003), "B": TaskCost(0.003)}, cores=1))
    a, b = PipelineTask("A", _spin(0.003)), PipelineTask("B", _spin(0.003))
    costs = CostModel({"A": TaskCost(0.003), "B": TaskCost(0.003)}, cores=2)
    plan, report = auto_schedule(([a, b], [(b, a)]), costs, Constraints(max_depth=2, max_threads=2),
                                 solver=SolverOptions(time_limit_s=4),
                                 verify=VerifyOptions(rounds=2, iterations=16), batches=list(range(16)))
    notes = "\n".join(report.verify.notes + (report.verify.earlier.notes if report.verify.earlier else []))
    assert any("fit" in n.split() and "1 core(s)" in n for n in notes.splitlines())  # refitted to one core
    assert plan_key(plan) == plan_key(report.verify.choose().plan)


def _sleeper(seconds: float):
    return lambda ctx: time.sleep(seconds)  # the workload, not a synchronisation


def test_a_refitted_plan_measured_faster_than_the_choice_is_returned(monkeypatch):
    a, b = PipelineTask("A", _sleeper(0.003)), PipelineTask("B", _sleeper(0.003))
    costs = CostModel({"A": TaskCost(0.003), "B": TaskCost(0.003)}, cores=2)
    measured_by_simulation(monkeypatch, costs)  # two 3 ms sleeps: 3 ms pipelined on two threads, 6 ms serial
    c = Constraints(max_depth=2, max_threads=2)
    fast, report = auto_schedule(([a, b], [(b, a)]), costs, c, solver=SolverOptions(time_limit_s=4), verify=False)
    assert report.period_s == pytest.approx(0.003)
    slow = serial_plan(fast)
    batches = list(range(12))
    first = measure_plans([("serial", slow)], batches, 1)
    report = dataclasses.replace(report, plan=slow, verify=first, method="beam+verify")
    problem = make_problem(([a, b], [(b, a)]), costs, c)
    new = measure_refit(report, first["serial"], fast, problem, batches, VerifyOptions(rounds=2, iterations=12), 30)
    assert plan_key(new.plan) == plan_key(fast)
    assert new.method == "beam+verify+refit"
    assert new.verify.earlier is first and new.verify.choose().label == "refit"
    assert new.verify["refit"].period_s == pytest.approx(new.verify["serial"].period_s / 2)
    heads = [word_after(line, "engine:") for line in new.verify.format().splitlines() if "engine:" in line.split()]
    assert heads == ["1", "2"]  # the plans verified on the engine: the first round's, then this one's


def test_a_refitted_pool_keeps_the_calls_engine_costs_and_leaves_the_first_model_as_it_was(monkeypatch):
    """The refit round searches and predicts with the fitted pool and the same calibration's engine costs."""
    import autosched.verify.refit as refit_mod
    import autosched.verify.loop as verify_mod
    from autosched.model.machine import searched_costs
    from autosched.verify.refit import PoolFit
    from autosched.search.autoschedule import refit_round
    from swpipe_core.measure.calibrate import MachineCalibration

    a, b = PipelineTask("A", _sleeper(0.003)), PipelineTask("B", _sleeper(0.003))
    graph = ([a, b], [(b, a)])
    cal = MachineCalibration(cores_free=2.0, cpu_count=2, cpu={"A": 0.0, "B": 0.0})  # both off the CPU
    costs = CostModel({"A": TaskCost(0.003), "B": TaskCost(0.003)}, machine_calibration=cal)
    c, s = Constraints(max_depth=2, max_threads=2), SolverOptions(time_limit_s=4)
    _, report = auto_schedule(graph, costs, c, solver=s, verify=False)
    serial = serial_plan(report.plan)
    table = VerifyTable([PlanMeasurement("serial", serial, [0.006], predicted_s=0.006)], rounds=1, iterations=12)
    report = dataclasses.replace(report, plan=serial, verify=table)
    problem = make_problem(graph, searched_costs(costs), c)
    problem.calibration = cal
    monkeypatch.setattr(refit_mod, "fit_core_pool", lambda *args: PoolFit(cores=1, was=2, errors_pct={1: 1.0, 2: 20.0},
                                                                             plans=1))
    seen = {}

    def fake_measure_refit(report, chosen, plan, refit_problem, *rest):
        seen["problem"] = refit_problem
        return report

    monkeypatch.setattr(verify_mod, "measure_refit", fake_measure_refit)
    refit_round(problem, s, None, report, list(range(12)), VerifyOptions(rounds=1))
    refitted = seen["problem"]
    assert refitted.costs.cores == 1
    assert refitted.calibration is cal  # one machine model: only its pool is refitted
    assert problem.costs.cores == 2  # the first model is left as it was
