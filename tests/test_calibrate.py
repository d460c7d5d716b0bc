"""Machine calibration (swpipe_core.calibrate) and how it reaches the cost model (autosched.calibrated).

Timing checks compare two measurements of the same thing (or a GIL-free task
with a pure-Python one) with generous margins, never an absolute time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import pytest
import torch

from autosched.calibrated import calibrated_costs, format_profile, parallelism_note, serial_iteration_s, \
    simulate_calibrated
from autosched.costs import CostModel, CostModelError, TaskCost
from autosched.simulate import simulate
from swpipe_core.calibrate import MachineCalibration, measure_gil, measure_gil_and_calls
from swpipe_core.engine import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.profiler import TaskProfiler

MS = 1e-3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cal(**kw) -> MachineCalibration:
    return MachineCalibration(**{"task_s": 1e-5, "dep_s": 2e-5, "period_s": 3e-5, **kw})


def test_cost_model_keeps_machine_calibration_through_json(tmp_path):
    cal = _cal(gil={"A": 0.75}, cores_free=1.5, cpu_count=2, measured="2026-11-23T01:00:00")
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


def test_torch_calls_per_task_go_through_json_and_files_without_them_read_as_before():
    with_calls = _cal(gil={"A": 0.2}, calls={"A": 36.0})
    doc = with_calls.to_dict()
    assert doc["calls"] == {"A": 36.0} and MachineCalibration.from_dict(doc) == with_calls
    assert "torch calls per run: A 36" in with_calls.summary()
    without = _cal(gil={"A": 0.2}).to_dict()
    assert "calls" not in without and MachineCalibration.from_dict(without).calls == {}
    for bad in ({"A": -1}, {"A": True}, ["A"]):
        with pytest.raises(ValueError, match="machine_calibration.calls: .* torch calls per run >= 0"):
            MachineCalibration.from_dict({**doc, "calls": bad})


def test_bad_calibration_section_is_a_cost_model_error():
    doc = CostModel({"A": TaskCost(MS)}, machine_calibration=_cal()).to_dict()
    doc["machine_calibration"]["version"] = 7
    with pytest.raises(CostModelError, match="machine_calibration.version: version 7"):
        CostModel.from_dict(doc)
    doc["machine_calibration"] = {"version": 1, "task_s": -1.0}
    with pytest.raises(CostModelError, match="task_s"):
        CostModel.from_dict(doc)


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
    assert simulate_calibrated(plan, costs, one).period == pytest.approx(4 * MS, rel=1e-6)
    assert simulate_calibrated(plan, costs, one, core_pool=False).period == pytest.approx(2 * MS, rel=1e-6)
    assert simulate_calibrated(plan, costs, MachineCalibration(cores_free=1.9, cpu_count=2)).period == \
        pytest.approx(2 * MS, rel=1e-6)


def test_task_measured_off_the_cpu_takes_no_core():
    plan = PipelinePlan({"Sleep": TaskSchedule(0, thread_group="x"), "Spin": TaskSchedule(0, thread_group="y")})
    costs = CostModel({"Sleep": TaskCost(2 * MS), "Spin": TaskCost(2 * MS)})
    cal = MachineCalibration(cores_free=1.0, cpu_count=2, cpu={"Sleep": 0.03, "Spin": 0.98})
    got = calibrated_costs(costs, plan, cal)
    assert got["Sleep"].resources == ("nocore",) and got["Spin"].resources == () and got.cores == 1
    assert "1 task(s) off the CPU" in got.notes
    # the sleeping task leaves the one core to the spinning one: they overlap
    assert simulate_calibrated(plan, costs, cal).period == pytest.approx(2 * MS, rel=1e-6)
    both = MachineCalibration(cores_free=1.0, cpu_count=2, cpu={"Sleep": 0.9, "Spin": 0.98})
    assert simulate_calibrated(plan, costs, both).period == pytest.approx(4 * MS, rel=1e-6)
    assert calibrated_costs(costs, plan, cal, core_pool=False)["Sleep"].resources == ()


def test_cpu_share_round_trips_and_is_left_out_when_not_measured():
    cal = _cal(cpu={"A": 0.25})
    assert MachineCalibration.from_dict(cal.to_dict()) == cal
    assert "cpu" not in _cal().to_dict() and MachineCalibration.from_dict(_cal().to_dict()).cpu == {}
    with pytest.raises(ValueError, match="cpu: .* not a map of task -> fraction"):
        MachineCalibration.from_dict({**cal.to_dict(), "cpu": {"A": 1.5}})


def test_measure_cpu_tells_a_sleeping_task_from_a_spinning_one(monkeypatch):
    """A task's share is its thread CPU time over its wall time, the largest over the iterations (other
    processes only ever take the CPU away). The module's clocks are a fake the tasks move: what a task
    reads is what it did, whatever the machine's load."""
    import swpipe_core.calibrate as calibrate
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
    from autosched.taskmodel import core_capacity

    with pytest.raises(ValueError, match="cores_free=.*MachineCalibration.cores_free"):
        core_capacity(bad)


def test_calibrated_costs_need_a_calibration():
    with pytest.raises(ValueError, match="no machine calibration"):
        calibrated_costs(CostModel({"A": TaskCost(MS)}))


def test_gil_tag_serialises_python_tasks_across_threads_in_simulation():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="y")})
    costs = CostModel({"A": TaskCost(2 * MS), "B": TaskCost(2 * MS)})
    two_cores = {"cores_free": 2.0, "cpu_count": 2}  # so that only the GIL can serialise them
    free = simulate_calibrated(plan, costs, MachineCalibration(gil={"A": 0.1, "B": 0.2}, **two_cores)).period
    held = simulate_calibrated(plan, costs, MachineCalibration(gil={"A": 0.9, "B": 1.0}, **two_cores)).period
    assert free == pytest.approx(2 * MS, rel=1e-6)
    assert held == pytest.approx(4 * MS, rel=1e-6)
    cuda = calibrated_costs(costs, plan, MachineCalibration(gil={"A": 1.0}), device="cuda")
    assert cuda["A"].resources == ()


def test_period_cost_is_main_thread_time_per_period():
    plan = PipelinePlan({"A": TaskSchedule(0)})
    costs = CostModel({"A": TaskCost(MS)})
    plain = simulate(plan, costs).period
    cal = simulate_calibrated(plan, costs, MachineCalibration(period_s=4e-4)).period
    assert cal == pytest.approx(plain + 4e-4, rel=1e-6)


def _spin_n(n: int) -> None:
    x = 0
    for i in range(n):  # pure Python: holds the GIL the whole time
        x += i


def _spin(ctx) -> None:
    _spin_n(60_000)


def test_measure_gil_ranks_pure_python_above_sleep(monkeypatch):
    """Without torch ops, a task's share of held GIL is its share on a CPU: 0 asleep, 1 in pure Python.
    The module's clocks are a fake the tasks move (what the tasks read does not depend on the load)."""
    import swpipe_core.calibrate as calibrate
    from conftest import FakeClock

    clock = FakeClock()
    monkeypatch.setattr(calibrate, "time", clock)
    plan = PipelinePlan({PipelineTask("Sleep", lambda ctx: clock.advance(0.004)): TaskSchedule(),
                         PipelineTask("Spin", lambda ctx: clock.advance(0.004, cpu_s=0.004)): TaskSchedule()})
    gil = measure_gil(SWPipeline(plan, device="cpu"), 0, num_iterations=8)
    assert gil == {"Sleep": 0.0, "Spin": 1.0}


def test_profile_with_calibration_counts_the_engines_serial_costs_in_the_model_serial_iteration():
    # a sleep workload plus overhead: eight small Python tasks between two sleeps
    tasks = {PipelineTask("Sleep0", lambda ctx: time.sleep(0.002)): TaskSchedule()}
    tasks.update({PipelineTask(f"Small{k}", lambda ctx: sum(range(200))): TaskSchedule() for k in range(8)})
    tasks[PipelineTask("Sleep1", lambda ctx: time.sleep(0.002))] = TaskSchedule()
    plan = PipelinePlan(tasks)
    with SWPipeline(plan, device="cpu") as pipe:
        result = TaskProfiler(pipe).profile(0, num_warmup=2, num_measure=8, num_rounds=3, calibrate=True)
    costs = CostModel.from_profile(result)
    assert isinstance(costs.machine_calibration, MachineCalibration)
    assert set(costs.machine_calibration.gil) == set(plan.task_names)
    predicted = serial_iteration_s(costs)
    # how close it comes to the measured baseline is a figure (format_profile prints both side by side;
    # benchmarks/calibrated_fidelity.py measures the calibrated model), not asserted
    assert predicted > sum(c.cpu_s for c in costs.tasks.values())  # the engine's serial costs are counted
    assert "model serial iteration" in format_profile(result, costs)


def test_parallelism_note_names_free_cores_and_gil():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="y")})
    costs = CostModel({"A": TaskCost(MS), "B": TaskCost(MS)})
    assert "1.20 of 2 cores" in parallelism_note(plan, costs, MachineCalibration(cores_free=1.2, cpu_count=2))
    assert "GIL" in parallelism_note(plan, costs, MachineCalibration(cores_free=2.0, gil={"A": 1.0, "B": 0.8}))
    assert parallelism_note(plan, costs, MachineCalibration(cores_free=2.0, gil={"A": 0.1})) is None


def test_shared_cores_slow_only_the_parts_that_overlap_beyond_the_free_cores():
    two = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="y"),
                        "C": TaskSchedule(0, thread_group="x")}, intra_iter_deps=[("C", "A")])
    costs = CostModel({"A": TaskCost(1 * MS), "B": TaskCost(1 * MS), "C": TaskCost(1 * MS)})
    half = MachineCalibration(cores_free=1.5, cpu_count=2)
    # A and B share 1.5 cores (each at 3/4 speed, 4/3 ms), then C runs alone (1 ms); the period waits for C
    assert simulate_calibrated(two, costs, half).period == pytest.approx(2 * MS)  # pool of 2: no slowdown
    assert simulate_calibrated(two, costs, half, sharing=True).period == pytest.approx((4 / 3 + 1) * MS, rel=1e-3)
    one_thread = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0), "C": TaskSchedule(0)})
    assert simulate_calibrated(one_thread, costs, half, sharing=True).period == pytest.approx(3 * MS)
    asleep = MachineCalibration(cores_free=1.0, cpu_count=2, cpu={"B": 0.0})  # B sleeps: takes no core
    assert simulate_calibrated(two, costs, asleep, sharing=True).period == pytest.approx(2 * MS)


@pytest.mark.parametrize("share, tagged_ms, shared_ms", [
    (0.3, 1.0, 1.0),   # 0.6 of the GIL's second in use: no task waits in either model
    (0.45, 1.0, 1.0),  # just under the tag threshold
    (0.55, 2.0, 1.1),  # just over it: the tag serialises all of both tasks, the shared GIL only the excess
    (1.0, 2.0, 2.0),   # pure Python: one at a time in both
])
def test_a_shared_gil_serialises_only_the_held_part_with_no_jump_at_the_threshold(share, tagged_ms, shared_ms):
    two = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="y")})
    costs = CostModel({"A": TaskCost(1 * MS), "B": TaskCost(1 * MS)})
    cal = MachineCalibration(cores_free=2.0, cpu_count=2, gil={"A": share, "B": share})
    assert simulate_calibrated(two, costs, cal).period == pytest.approx(tagged_ms * MS, rel=1e-3)
    assert simulate_calibrated(two, costs, cal, gil="shared").period == pytest.approx(shared_ms * MS, rel=1e-3)


def test_a_shared_gil_leaves_one_thread_and_gil_free_partners_alone_and_rejects_unknown_modes():
    costs = CostModel({"A": TaskCost(1 * MS), "B": TaskCost(1 * MS)})
    one_thread = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0)})
    python = MachineCalibration(cores_free=2.0, cpu_count=2, gil={"A": 1.0, "B": 1.0})
    assert simulate_calibrated(one_thread, costs, python, gil="shared").period == pytest.approx(2 * MS)
    two = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="y")})
    one_holds = MachineCalibration(cores_free=2.0, cpu_count=2, gil={"A": 1.0, "B": 0.0})
    assert simulate_calibrated(two, costs, one_holds, gil="shared").period == pytest.approx(1 * MS)
    with pytest.raises(ValueError, match="gil must be 'tag' or 'shared'"):
        simulate_calibrated(two, costs, one_holds, gil="split")


def test_a_shared_gil_makes_each_torch_call_wait_a_wake_up_while_another_thread_holds_the_gil():
    two = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(0, thread_group="y")})
    costs = CostModel({"A": TaskCost(1 * MS), "B": TaskCost(1 * MS)})
    # A: 10 torch calls per 1 ms run, GIL-free between them; B: pure Python, holds the GIL throughout
    cal = MachineCalibration(cores_free=2.0, cpu_count=2, dep_s=2e-5, gil={"A": 0.0, "B": 1.0}, calls={"A": 10})
    # 10 000 take-backs per second of A's work, each waiting 20 us: 1.2x slower while B runs (1 ms),
    # so A ends 1/6 ms after B
    assert simulate_calibrated(two, costs, cal, gil="shared").period == pytest.approx((1 + 1 / 6) * MS, rel=2e-3)
    half = dataclasses.replace(cal, gil={"A": 0.0, "B": 0.5})  # B holds it half the time: half the take-backs wait
    assert simulate_calibrated(two, costs, half, gil="shared").period == pytest.approx((1 + 1 / 11) * MS, rel=2e-3)
    # nothing to wait for: a GIL-free partner, one thread, no calls measured, or the GIL tags (the search's model)
    free = dataclasses.replace(cal, gil={"A": 0.0, "B": 0.0})
    assert simulate_calibrated(two, costs, free, gil="shared").period == pytest.approx(1 * MS)
    one_thread = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0)})
    assert simulate_calibrated(one_thread, costs, cal, gil="shared").period == pytest.approx(2 * MS)
    assert simulate_calibrated(two, costs, dataclasses.replace(cal, calls={}), gil="shared").period \
        == pytest.approx(1 * MS)
    assert simulate_calibrated(two, costs, cal).period == pytest.approx(1 * MS)


def test_measure_gil_and_calls_counts_the_torch_calls_a_task_makes_from_python():
    a = torch.randn(64, 64)

    def annotated(ctx):
        with torch.profiler.record_function("user.range"):  # looked through, as for the GIL share
            [a + 1 for _ in range(3)]

    plan = PipelinePlan({PipelineTask("Five", lambda ctx: [a @ a for _ in range(5)]): TaskSchedule(),
                         PipelineTask("Nested", lambda ctx: torch.nn.functional.linear(a, a)): TaskSchedule(),
                         PipelineTask("Annotated", annotated): TaskSchedule(),
                         PipelineTask("Python", _spin): TaskSchedule()})
    gil, calls = measure_gil_and_calls(SWPipeline(plan, device="cpu"), 0, num_iterations=3)
    assert calls == {"Five": 5, "Nested": 1, "Annotated": 3, "Python": 0}  # linear's inner ops are not take-backs
    assert set(gil) == set(calls)


def test_measure_gil_reads_torch_ops_as_released_and_the_python_around_them_as_held():
    a = torch.randn(256, 256)
    plan = PipelinePlan({PipelineTask("MatMul", lambda ctx: [a @ a for _ in range(20)]): TaskSchedule(),
                         PipelineTask("SmallOpsInPython", lambda ctx: [_spin_n(2_000) or a[:4] + 1 for _ in range(10)]):
                             TaskSchedule()})
    gil = measure_gil(SWPipeline(plan, device="cpu"), 0, num_iterations=5)
    # apart by ~0.8 on an idle machine; other processes lower only the Python task's CPU share (descheduled)
    assert gil["MatMul"] < 0.3 < gil["SmallOpsInPython"]


def test_measure_gil_looks_through_record_function_ranges_in_a_task():
    # a user's profiler range holds Python: counting its span as a torch op would read the task as GIL-free
    def annotated(ctx):
        with torch.profiler.record_function("user.range"):
            _spin(ctx)

    plan = PipelinePlan({PipelineTask("Annotated", annotated): TaskSchedule()})
    assert measure_gil(SWPipeline(plan, device="cpu"), 0, num_iterations=3)["Annotated"] > 0.3  # ~1 idle, 0 if counted


def test_measure_gil_under_an_active_profiler_says_profilers_do_not_nest():
    plan = PipelinePlan({PipelineTask("Spin", _spin): TaskSchedule()})
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with pytest.raises(RuntimeError, match="profiler is already recording.*Fix: calibrate"):
            measure_gil(SWPipeline(plan, device="cpu"), 0, num_iterations=1)
