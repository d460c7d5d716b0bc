"""The machine model of an ``auto_schedule`` call (docs/semantics.md, "The machine model").

The default path keeps what holds on any host: the engine's cost per task, per
hand-off and per period, and the free cores as a core pool. Every simulation
of one call (the searchers' scores, the report, the verification's
predictions) is of that one model.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from autosched.model.machine import searched_costs
from autosched.model.costs import CostModel, TaskCost
from autosched.model.simulate import simulate_folded
from autosched.search.options import Constraints, SolverOptions
from swpipe import auto_schedule
from autosched.verify.loop import VerifyOptions
from autosched.verify.predict import predict_periods
from conftest import measured_by_simulation
from swpipe_core.measure.calibrate import MachineCalibration
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule

MS = 1e-3
CAL = MachineCalibration(task_s=2e-5, dep_s=1e-4, period_s=5e-5, cores_free=2.2, cpu_count=4,
                         cpu={"Wait": 0.05, "Load": 0.95, "Fwd": 1.0, "Bwd": 1.0})
TASKS = {"Load": TaskCost(2 * MS), "Fwd": TaskCost(3 * MS), "Bwd": TaskCost(3 * MS), "Wait": TaskCost(2 * MS)}
GRAPH = (list(TASKS), [("Fwd", "Load"), ("Bwd", "Fwd"), ("Wait", "Load")])


def _spy_on_the_simulator(monkeypatch):
    """Record the cost model and the main thread's engine time per period of every simulation run from now on
    (every simulation, whoever asks, builds its tables with ``sim_plan``)."""
    simulate_mod = importlib.import_module("autosched.model.simulate")  # the module (autosched.model.simulate is the function)
    seen = []
    real = simulate_mod.sim_plan

    def spy(plan, costs, *args, **kw):
        seen.append((costs, kw.get("period_overhead_s", 0.0)))
        return real(plan, costs, *args, **kw)

    monkeypatch.setattr(simulate_mod, "sim_plan", spy)
    return seen


def test_the_searched_costs_hold_the_engine_costs_and_the_core_pool_and_nothing_else():
    folded = searched_costs(CostModel(TASKS, machine_calibration=CAL))
    assert folded.machine_calibration is None and folded.cores == 2  # 2.2 cores free: a pool of 2
    assert {n: round(c.host_s - TASKS[n].host_s, 9) for n, c in folded.tasks.items()} == {n: 2e-5 for n in TASKS}
    assert {n: c.resources for n, c in folded.tasks.items()} == {"Load": (), "Fwd": (), "Bwd": (),
                                                                   "Wait": ("nocore",)}
    # no interpreter-lock tag on either device, even from a file written with the old GIL shares
    legacy = MachineCalibration.from_dict({**CAL.to_dict(), "gil": {n: 1.0 for n in TASKS}, "calls": {"Fwd": 40}})
    for device in ("cpu", "cuda"):
        again = searched_costs(CostModel(TASKS, machine_calibration=legacy), device=device)
        assert not any("gil" in c.resources for c in again.tasks.values())


def test_every_simulation_of_a_call_is_of_one_model_search_report_and_verification(monkeypatch):
    # the machine runs exactly as the model says, so no refit round moves the pool
    folded = searched_costs(CostModel(TASKS, machine_calibration=CAL))
    measured_by_simulation(monkeypatch, lambda plan: simulate_folded(plan, folded, CAL, num_iterations=40).period_s)
    # the refit round simulates other pools on purpose, to fit one (tests/test_refit.py)
    monkeypatch.setattr(importlib.import_module("autosched.verify.refit"), "fit_core_pool", lambda *args: None)
    seen = _spy_on_the_simulator(monkeypatch)
    fns = {n: (lambda ctx: None) for n in TASKS}
    tasks = [PipelineTask(n, fns[n]) for n in TASKS]
    costs = CostModel(TASKS, machine_calibration=CAL)
    plan, report = auto_schedule((tasks, GRAPH[1]), costs, Constraints(max_depth=2, max_threads=2),
                                 solver=SolverOptions(time_limit_s=3),
                                 verify=VerifyOptions(rounds=1, max_rounds=1, iterations=8), batches=list(range(8)))
    assert seen, "the call simulated nothing"
    for model, period_s in seen:  # the searchers, the depth check, the what-ifs, the report, the predictions
        assert period_s == CAL.period_s
        assert model.cores == 2 and model.tasks["Wait"].resources == ("nocore",)
        assert not any("gil" in c.resources for c in model.tasks.values())
    folded = searched_costs(costs)
    table = report.verify
    for row in table.rows:  # each prediction is the model's, and predict_periods gives the same from the costs
        assert row.predicted_s == pytest.approx(simulate_folded(row.plan, folded, CAL, num_iterations=60).period_s)
        assert row.predicted_s == pytest.approx(predict_periods([(row.label, row.plan)], costs)[row.label])
    chosen = table.choose()
    assert report.period_s == pytest.approx(chosen.predicted_s)  # the report's period is the chosen row's prediction
    assert report.serial_period_s == pytest.approx(table["serial"].predicted_s)
    assert "folded" in report.notes[0].split() and "2 free core(s)" in report.notes[0] and "(1 task(s)" in report.notes[0]


def test_a_hand_off_costs_the_waiting_task_the_calibrated_wake_up_in_the_search_too():
    """The per-hand-off cost is in the search's scores, not only in the verification's predictions."""
    from autosched.search.plans import build_plan
    from autosched.search.problem import make_problem

    cal = MachineCalibration(dep_s=5e-4, cores_free=2.0, cpu_count=2)
    costs = CostModel({"A": TaskCost(2 * MS), "B": TaskCost(2 * MS)}, machine_calibration=cal)
    problem = make_problem((["A", "B"], [("B", "A")]), searched_costs(costs), Constraints(max_depth=2))
    problem.calibration = cal
    split = build_plan(problem, {"A": 0, "B": 1}, {"A": "x", "B": "y"})
    together = build_plan(problem, {"A": 0, "B": 0}, {"A": "x", "B": "x"})
    assert problem.simulate(split).period_s == pytest.approx(2.5 * MS)  # B waits A across threads: 0.5 ms more
    assert problem.simulate(together).period_s == pytest.approx(4 * MS)  # one thread: no hand-off
    assert problem.simulate(split).period_s == pytest.approx(predict_periods([("s", split)], costs)["s"])


def test_a_cost_model_without_its_calibration_is_simulated_as_given(monkeypatch):
    seen = _spy_on_the_simulator(monkeypatch)
    costs = dataclasses.replace(CostModel(TASKS, machine_calibration=CAL), machine_calibration=None)
    _, report = auto_schedule(GRAPH, costs, Constraints(max_depth=2, max_threads=2),
                              solver=SolverOptions(time_limit_s=2))
    assert seen and all(period_s == 0.0 and model.cores is None for model, period_s in seen)
    assert not any("folded" in n.split() for n in report.notes)
    one = PipelinePlan({"A": TaskSchedule(0)})
    assert predict_periods([("one", one)], CostModel({"A": TaskCost(MS)})) == {"one": pytest.approx(MS)}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_simulate_of_a_calibrated_cost_model_is_the_model_the_search_reported(device):
    """One simulate (issue 46.3): the public simulate folds the costs' calibration in, as the search does, so the
    plan auto_schedule returns simulates at the report's period, to the bit."""
    from autosched.model.simulate import simulate

    costs = CostModel(TASKS, machine_calibration=CAL)
    plan, report = auto_schedule(GRAPH, costs, Constraints(max_depth=2, max_threads=2, device=device),
                                 solver=SolverOptions(time_limit_s=3))
    assert len(plan.thread_groups) > 1  # hand-offs across threads: the per-hand-off cost is in the figure
    assert report.period_s == simulate(plan, costs, device=device).period_s
    bare = simulate(plan, dataclasses.replace(costs, machine_calibration=None), device=device).period_s
    assert report.period_s > bare  # the calibration is what the two agree on, not something both leave out


def test_the_old_name_of_the_simulated_period_warns_and_reads_period_s():
    from autosched.model.simulate import simulate

    result = simulate(PipelinePlan({"A": TaskSchedule(0)}), CostModel({"A": TaskCost(MS)}))
    with pytest.warns(FutureWarning, match=r"period_s"):
        assert result.period == result.period_s == pytest.approx(MS)
