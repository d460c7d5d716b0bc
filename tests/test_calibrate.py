"""Machine calibration (swpipe_core.measure.calibrate) and how it reaches the cost model (autosched.model.machine).

The measurements run on fake clocks where a figure is checked; the model's
folds are checked on hand-made calibrations.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import pytest

from autosched.model.machine import calibrated_costs, format_profile, parallelism_note, serial_iteration_s
from autosched.model.costs import CostModel, CostModelError, TaskCost
from autosched.model.simulate import simulate
from swpipe_core.measure.calibrate import MachineCalibration
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.measure.profiler import TaskProfiler

MS = 1e-3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cal(**kw) -> MachineCalibration:
    return MachineCalibration(**{"task_s": 1e-5, "dep_s": 2e-5, "period_s": 3e-5, **kw})


def simulate_calibrated(plan: PipelinePlan, costs: CostModel, cal: MachineCalibration):
    """``simulate`` of the costs with ``cal`` as their machine calibration (folded in by simulate)."""
    return simulate(plan, dataclasses.replace(costs, machine_calibration=cal))


def test_cost_model_keeps_machine_calibration_through_json(tmp_path):
    cal = _cal(cpu={"A": 0.75}, cores_free=1.5, cpu_count=2, measured="2026-11-23T01:00:00")
    path = tmp_path / "c.json"
    CostModel({"A": TaskCost(MS)}, machine_calibration=cal).save(path)
    doc = json.loads(path.read_text())
    assert doc["machine_calibration"]["version"] == 1
    back = CostModel.load(path)
    assert back.machine_calibration == cal
    assert back.scaled("A", 2.0).machine_calibration == cal  # what-if copies keep it


def test_old_cost_file_without_calibration_still_loads():
    costs = CostModel.load(os.path.join(ROOT, "cost_models", "base.json"))
    assert costs.machine_calibration is None
    assert "machine_calibration" not in costs.to_dict()


def test_a_section_written_with_the_removed_host_lock_fields_still_reads_without_them():
    """Files written by earlier versions carry GIL shares, torch calls and a wake-up: they load, and nothing uses them."""
    doc = {**_cal(cpu={"A": 0.9}).to_dict(), "gil": {"A": 0.8}, "calls": {"A": 36.0}, "wake_s": 9e-5}
    back = MachineCalibration.from_dict(doc)
    assert back == _cal(cpu={"A": 0.9})
    assert not {"gil", "calls", "wake_s"} & set(back.to_dict())
    with pytest.raises(ValueError, match=r"\['shares'\]"):  # the unknown field
        MachineCalibration.from_dict({**doc, "shares": {}})


def test_bad_calibration_section_is_a_cost_model_error():
    doc = CostModel({"A": TaskCost(MS)}, machine_calibration=_cal()).to_dict()
    doc["machine_calibration"]["version"] = 7
    with pytest.raises(CostModelError) as err:
        CostModel.from_dict(doc)
    assert err.value.field == "machine_calibration.version"
    doc["machine_calibration"] = {"version": 1, "task_s": -1.0}
    with pytest.raises(CostModelError) as err:
        CostModel.from_dict(doc)
    assert err.value.field == "machine_calibration.task_s"


def test_calibrated_costs_charge_dependency_cost_only_across_threads():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="x"),
                         "C": TaskSchedule(1, thread_group="y")},
                        intra_iter_deps=[("B", "A"), ("C", "B")], inter_iter_deps=[("A", "C")])
    costs = CostModel({n: TaskCost(MS) for n in "ABC"})
    got = calibrated_costs(costs, plan, _cal())
    # A waits C (other thread, inter), B waits A (same thread), C waits B (other thread)
    assert [round((got[n].host_s - MS) * 1e6, 6) for n in "ABC"] == [30.0, 10.0, 30.0]
    without_plan = calibrated_costs(costs, None, _cal())
    assert {round((without_plan[n].host_s - MS) * 1e6, 6) for n in "ABC"} == {10.0}


@pytest.mark.parametrize("cores_free, pool", [(0.4, 1), (1.2, 1), (1.5, 2), (1.71, 2), (3.9, 4)])
def test_calibrated_costs_set_the_core_pool_from_cores_free(cores_free, pool):
    costs = CostModel({"A": TaskCost(MS), "B": TaskCost(MS)}, batch_bytes=64.0)
    got = calibrated_costs(costs, None, _cal(cores_free=cores_free, cpu_count=4))
    assert got.cores == pool and f"{pool} free core(s)" in got.notes
    assert got.batch_bytes == 64.0  # the rest of the model is kept
    assert calibrated_costs(costs, None, _cal(cores_free=cores_free), core_pool=False).cores is None
    mine = CostModel(costs.tasks, cores=3)
    assert calibrated_costs(mine, None, _cal(cores_free=cores_free), core_pool=False).cores == 3


def test_one_free_core_serialises_calibrated_threads_and_the_flag_turns_it_off():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="y")})
    costs = CostModel({"A": TaskCost(2 * MS), "B": TaskCost(2 * MS)})
    one = MachineCalibration(cores_free=1.1, cpu_count=2)
    assert simulate_calibrated(plan, costs, one).period_s == pytest.approx(4 * MS, rel=1e-6)
    # core_pool=False: the fold leaves the pool as it is (none), the two threads overlap
    assert simulate(plan, calibrated_costs(costs, plan, one, core_pool=False)).period_s == pytest.approx(2 * MS, rel=1e-6)
    assert simulate_calibrated(plan, costs, MachineCalibration(cores_free=1.9, cpu_count=2)).period_s == \
        pytest.approx(2 * MS, rel=1e-6)


def test_task_measured_off_the_cpu_takes_no_core():
    plan = PipelinePlan({"Sleep": TaskSchedule(0, thread_group="x"), "Spin": TaskSchedule(0, thread_group="y")})
    costs = CostModel({"Sleep": TaskCost(2 * MS), "Spin": TaskCost(2 * MS)})
    cal = MachineCalibration(cores_free=1.0, cpu_count=2, cpu={"Sleep": 0.03, "Spin": 0.98})
    got = calibrated_costs(costs, plan, cal)
    assert got["Sleep"].resources == ("nocore",) and got["Spin"].resources == () and got.cores == 1
    assert "1 task(s)" in got.notes  # the note counts the tasks taken off the CPU
    # the sleeping task leaves the one core to the spinning one: they overlap
    assert simulate_calibrated(plan, costs, cal).period_s == pytest.approx(2 * MS, rel=1e-6)
    both = MachineCalibration(cores_free=1.0, cpu_count=2, cpu={"Sleep": 0.9, "Spin": 0.98})
    assert simulate_calibrated(plan, costs, both).period_s == pytest.approx(4 * MS, rel=1e-6)
    assert calibrated_costs(costs, plan, cal, core_pool=False)["Sleep"].resources == ()


def test_cpu_share_round_trips_and_is_left_out_when_not_measured():
    cal = _cal(cpu={"A": 0.25})
    assert MachineCalibration.from_dict(cal.to_dict()) == cal
    assert "cpu" not in _cal().to_dict() and MachineCalibration.from_dict(_cal().to_dict()).cpu == {}
    with pytest.raises(ValueError, match=r"machine_calibration\.cpu"):  # the field
        MachineCalibration.from_dict({**cal.to_dict(), "cpu": {"A": 1.5}})


def test_measure_cpu_tells_a_sleeping_task_from_a_spinning_one(monkeypatch):
    """A task's share is its thread CPU time over its wall time, the largest over the iterations (other
    processes only ever take the CPU away). The module's clocks are a fake the tasks move: what a task
    reads is what it did, whatever the machine's load."""
    import swpipe_core.measure.calibrate as calibrate
    from conftest import FakeClock

    clock = FakeClock()
    monkeypatch.setattr(calibrate, "time", clock)

    def descheduled(ctx):  # on a CPU for 10 ms, but for 40 ms of wall time once (another process ran)
        clock.advance(0.04 if ctx.iter_idx == 1 else 0.01, cpu_s=0.01)

    plan = PipelinePlan({PipelineTask("Sleep", lambda ctx: clock.advance(0.01)): TaskSchedule(),
                         PipelineTask("Spin", lambda ctx: clock.advance(0.01, cpu_s=0.01)): TaskSchedule(),
                         PipelineTask("Half", lambda ctx: clock.advance(0.01, cpu_s=0.005)): TaskSchedule(),
                         PipelineTask("Descheduled", descheduled): TaskSchedule()})
    cpu = calibrate.measure_cpu(SWPipeline(plan, device="cpu"), 0, num_iterations=5)
    assert cpu == {"Sleep": 0.0, "Spin": 1.0, "Half": 0.5, "Descheduled": 1.0}


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), True, "2"])
def test_core_capacity_rejects_a_bad_measurement(bad):
    from autosched.model.taskmodel import core_capacity

    with pytest.raises(ValueError, match="cores_free=.*MachineCalibration.cores_free"):
        core_capacity(bad)


def test_calibrated_costs_need_a_calibration():
    with pytest.raises(ValueError, match="calibration="):  # the argument to pass
        calibrated_costs(CostModel({"A": TaskCost(MS)}))


def test_the_fold_tags_no_task_gil_and_a_tag_given_by_hand_still_holds_the_lock():
    """The machine model has no interpreter lock; the cost model's "gil" resource is still the user's to set."""
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="y")})
    costs = CostModel({"A": TaskCost(2 * MS), "B": TaskCost(2 * MS)})
    two_cores = MachineCalibration(cores_free=2.0, cpu_count=2)
    for device in ("cpu", "cuda"):
        assert all("gil" not in c.resources for c in calibrated_costs(costs, plan, two_cores, device=device)
                   .tasks.values())
    assert simulate_calibrated(plan, costs, two_cores).period_s == pytest.approx(2 * MS, rel=1e-6)
    tagged = CostModel({n: TaskCost(2 * MS, resources=("gil",)) for n in "AB"})
    assert calibrated_costs(tagged, plan, two_cores)["A"].resources == ("gil",)
    assert simulate_calibrated(plan, tagged, two_cores).period_s == pytest.approx(4 * MS, rel=1e-6)


def test_period_cost_is_main_thread_time_per_period():
    plan = PipelinePlan({"A": TaskSchedule(0)})
    costs = CostModel({"A": TaskCost(MS)})
    plain = simulate(plan, costs).period_s
    cal = simulate_calibrated(plan, costs, MachineCalibration(period_s=4e-4)).period_s
    assert cal == pytest.approx(plain + 4e-4, rel=1e-6)


def test_profile_with_calibration_counts_the_engines_serial_costs_in_the_model_serial_iteration():
    # a sleep workload plus overhead: eight small Python tasks between two sleeps
    tasks = {PipelineTask("Sleep0", lambda ctx: time.sleep(0.002)): TaskSchedule()}
    tasks.update({PipelineTask(f"Small{k}", lambda ctx: sum(range(200))): TaskSchedule() for k in range(8)})
    tasks[PipelineTask("Sleep1", lambda ctx: time.sleep(0.002))] = TaskSchedule()
    plan = PipelinePlan(tasks)
    with SWPipeline(plan, device="cpu") as pipe:
        result = TaskProfiler(pipe, num_warmup=2, num_measure=8, num_rounds=3, calibrate=True).profile(0)
    costs = CostModel.from_profile(result)
    assert isinstance(costs.machine_calibration, MachineCalibration)
    assert set(costs.machine_calibration.cpu) == set(plan.task_names)
    predicted = serial_iteration_s(costs)
    # how close it comes to the measured baseline is a figure (format_profile prints both side by side;
    # benchmarks/calibrated_fidelity.py measures the calibrated model), not asserted
    assert predicted > sum(c.cpu_s for c in costs.tasks.values())  # the engine's serial costs are counted
    model_line = [line for line in format_profile(result, costs).splitlines() if "model" in line.split()]
    assert model_line and f"{predicted * 1e3:.3f}" in model_line[0]  # the model's serial iteration, beside the measured


def test_parallelism_note_names_the_free_cores():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="y")})
    costs = CostModel({"A": TaskCost(MS), "B": TaskCost(MS)})
    assert "1.20 of 2 cores" in parallelism_note(plan, costs, MachineCalibration(cores_free=1.2, cpu_count=2))
    assert parallelism_note(plan, costs, MachineCalibration(cores_free=2.0, cpu_count=2)) is None
    one_thread = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0)})
    assert parallelism_note(one_thread, costs, MachineCalibration(cores_free=1.0, cpu_count=2)) is None
