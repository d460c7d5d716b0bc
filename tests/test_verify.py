"""Verify in the loop (autosched.verify) and seed plans (autosched.search.seeds).

No assertion reads the machine's clock: where the outcome depends on which
plan the engine runs fastest, the engine runs are made to report the period
the tasks' true costs simulate (:func:`conftest.measured_by_simulation`), so
the choice is the same on an idle and on a loaded machine.
"""

from __future__ import annotations

import time

import pytest

from conftest import measured_by_simulation, word_after
from autosched.verify.candidates import serial_plan
from autosched.verify.measure import PairedRatio, PlanMeasurement, VerifyTable, measure_plans, paired_ratio
from autosched.verify.predict import predict_periods
from swpipe import (Constraints, CostModel, PipelinePlan, PipelineTask, SolverOptions, TaskCost, TaskSchedule,
                    VerifyOptions, auto_schedule)
from swpipe_core.order import enqueue_order

MS = 1e-3


def _sleeper(seconds: float):
    def fn(ctx) -> None:
        time.sleep(seconds)  # the workload
    return fn


def _two_thread_plan(sleep_s: float = 4 * MS) -> PipelinePlan:
    a = PipelineTask("A", _sleeper(sleep_s))
    b = PipelineTask("B", _sleeper(sleep_s))
    return PipelinePlan({a: TaskSchedule(0, thread_group="a"), b: TaskSchedule(1, thread_group="b")},
                        intra_iter_deps=[(b, a)])


def _three_thread_plan(sleep_s: float = 3 * MS) -> PipelinePlan:
    """A -> B -> C on three threads, one stage each: about a third of the serial period (sleeps overlap)."""
    a, b, c = (PipelineTask(n, _sleeper(sleep_s)) for n in "ABC")
    return PipelinePlan({a: TaskSchedule(0, thread_group="a"), b: TaskSchedule(1, thread_group="b"),
                         c: TaskSchedule(2, thread_group="c")}, intra_iter_deps=[(b, a), (c, b)])


def _sleeps(sleep_s: float, names: str = "ABC") -> CostModel:
    """What the sleeper tasks really take: the machine the fake measurement simulates."""
    return CostModel({n: TaskCost(sleep_s) for n in names})


def test_measure_plans_ranks_pipelined_sleep_plan_ahead_of_serial(monkeypatch):
    runs = measured_by_simulation(monkeypatch, _sleeps(3 * MS))
    plan = _three_thread_plan()
    table = measure_plans([("pipelined", plan), ("serial", serial_plan(plan))], list(range(18)), 3)
    assert table.choose().label == "pipelined"
    # three 3 ms sleeps overlap on three threads: a third of the serial period
    assert table["serial"].period_s == pytest.approx(3 * table["pipelined"].period_s)
    assert [len(r.rounds_s) for r in table.rows] == [3, 3]
    # one short warm-up run of each plan, then three rounds of full runs, each plan once per round
    assert [n for _, n in runs] == [8, 8] + [18] * 6


def test_racing_gives_extra_rounds_only_to_plans_within_the_noise_band(monkeypatch):
    measured_by_simulation(monkeypatch, _sleeps(3 * MS))
    plan = _three_thread_plan()
    # a 30 % band: the two copies of the pipelined plan (3x faster than serial) always tie; the serial plan, the
    # simplest, runs every round (each extra round pairs the contenders with it), the slower two-thread plan stops
    a, b, c = (plan.task(n) for n in "ABC")
    slower = PipelinePlan({a: TaskSchedule(0, thread_group="x"), b: TaskSchedule(0, thread_group="x"),
                           c: TaskSchedule(1, thread_group="y")}, intra_iter_deps=[(b, a), (c, b)])  # A and B: 6 ms
    table = measure_plans([("pipelined", plan), ("again", plan), ("slower", slower),
                           ("serial", serial_plan(plan))], list(range(12)),
                          VerifyOptions(rounds=2, max_rounds=4, noise_floor_pct=30.0))
    assert {r.label: len(r.rounds_s) for r in table.rows} == {"pipelined": 4, "again": 4, "slower": 2, "serial": 4}


def test_measure_plans_rejects_bad_input():
    plan = _two_thread_plan(0.0)
    with pytest.raises(ValueError, match="repeat"):
        measure_plans([("x", plan), ("x", plan)], [0, 1])
    with pytest.raises(ValueError, match="2 batches"):  # how many it needs
        measure_plans({"x": plan}, [0])
    with pytest.raises(ValueError, match="rounds"):
        measure_plans({"x": plan}, [0, 1], 0)
    with pytest.raises(ValueError, match="max_rounds"):
        VerifyOptions(rounds=3, max_rounds=2)
    with pytest.raises(ValueError, match="baseline"):
        measure_plans({"x": plan}, [0, 1], 1, baseline="serial")


def test_measure_plans_surfaces_task_failure_with_task_name():
    from swpipe_core.engine.pipeline import PipelineTaskError

    def boom(ctx):
        raise ValueError("bad batch")

    plan = PipelinePlan({PipelineTask("Boom", boom): TaskSchedule(0)})
    with pytest.raises(PipelineTaskError, match="Boom"):
        measure_plans({"x": plan}, [0, 1, 2], 1, warmup=False)


def test_serial_plan_keeps_tasks_and_dependencies_at_depth_one():
    plan = _two_thread_plan()
    s = serial_plan(plan)
    assert s.pipeline_depth == 1
    assert s.intra_edges() == plan.intra_edges()
    assert {s.sched(n).thread_group for n in s.task_names} == {"default"}
    assert all(callable(t.fn) for t in s.tasks)


def test_machine_limit_line_when_no_plan_beats_serial():
    tie = VerifyTable([PlanMeasurement("serial", None, [0.010, 0.0101]),
                       PlanMeasurement("auto", None, [0.0099, 0.0100])], rounds=2, iterations=10)
    line = tie.machine_limit()
    assert line is not None and "x1.0" in line  # the best pipelined plan's speedup, no better than serial
    assert line in tie.format()
    win = VerifyTable([PlanMeasurement("serial", None, [0.010, 0.010]),
                       PlanMeasurement("auto", None, [0.005, 0.005])], rounds=2, iterations=10)
    assert win.machine_limit() is None


def test_verify_returns_plan_measured_fastest_over_simulators_favourite(monkeypatch):
    # The cost model lies: it puts all the time in A, so every plan simulates at 9 ms and the search
    # prefers the shallowest one. In reality A, B and C sleep 3 ms each, so the three-thread input plan
    # (depth 3) runs three times as fast as any depth-1 plan. Verification must notice.
    measured_by_simulation(monkeypatch, _sleeps(3 * MS))
    plan = _three_thread_plan()
    costs = CostModel({"A": TaskCost(9 * MS), "B": TaskCost(0.0), "C": TaskCost(0.0)})
    got, report = auto_schedule(plan, costs, Constraints(max_depth=3, max_threads=3),
                                solver=SolverOptions(time_limit_s=5),
                                batches=list(range(18)), verify=VerifyOptions(rounds=3))
    table = report.verify
    assert table is not None
    assert table["auto"].predicted_s == pytest.approx(9 * MS, rel=1e-6)
    assert got.pipeline_depth == 3
    assert len({got.sched(n).thread_group for n in got.task_names}) == 3
    assert table["serial"].period_s == pytest.approx(3 * table.choose().period_s)
    assert word_after(str(report), "engine:") == str(len(table.rows))  # verified on the engine: every row


def test_verify_never_returns_plan_measured_slower_than_input_plan(monkeypatch):
    measured_by_simulation(monkeypatch, _sleeps(2 * MS, "AB"))
    plan = _two_thread_plan(2 * MS)
    costs = CostModel({"A": TaskCost(2 * MS), "B": TaskCost(2 * MS)})
    got, report = auto_schedule(plan, costs, Constraints(max_depth=2, max_threads=2),
                                solver=SolverOptions(time_limit_s=5),
                                batches=list(range(12)), verify=2)
    table = report.verify
    chosen = table.choose()
    # the plan measured fastest, returned with its enqueue order written out (the engine computes the same one)
    assert str(got) == str(chosen.plan.replace(enqueue_order=enqueue_order(chosen.plan),
                                               pipeline_depth=chosen.plan.pipeline_depth))
    reference = table["input"] if "input" in table else table["auto"]
    assert chosen.period_s <= reference.period_s
    assert table.baseline_row.label == "serial" and table.beats(chosen, table["serial"])


def test_verify_rescales_predictions_by_the_serial_plans_measurement(monkeypatch):
    # Costs taken on a machine four times faster than now: every prediction reads 4x fast. The serial
    # plan's measured/predicted ratio finds the factor, and the rescaled predictions fit the other plans.
    measured_by_simulation(monkeypatch, _sleeps(4 * MS, "AB"))
    plan = _two_thread_plan(4 * MS)
    costs = CostModel({"A": TaskCost(1 * MS), "B": TaskCost(1 * MS)})
    _, report = auto_schedule(plan, costs, Constraints(max_depth=2, max_threads=2),
                              solver=SolverOptions(time_limit_s=5),
                              batches=list(range(12)), verify=2)
    table = report.verify
    assert table.speed_factor == pytest.approx(4.0), table
    assert table.model_error_pct == pytest.approx(75.0), table  # every prediction a quarter of the period
    assert table.rescaled_error_pct == pytest.approx(0.0, abs=1e-6), table
    assert "(measured/predicted x4.00):" in str(report)  # the predictions rescaled by the serial plan's factor


def test_verify_is_off_for_unbound_tasks_and_needs_batches_when_asked():
    costs = CostModel({"A": TaskCost(MS), "B": TaskCost(MS)})
    graph = (["A", "B"], [("B", "A")])
    _, report = auto_schedule(graph, costs, Constraints(max_depth=2), solver=SolverOptions(time_limit_s=5))
    assert report.verify is None
    with pytest.raises(ValueError, match="batches"):
        auto_schedule(graph, costs, Constraints(max_depth=2), solver=SolverOptions(time_limit_s=5), verify=True)
    with pytest.raises(ValueError, match="runnable"):
        auto_schedule(graph, costs, Constraints(max_depth=2),
                      solver=SolverOptions(time_limit_s=5), verify=True, batches=[1, 2])


def test_seed_plans_are_scored_and_bound_to_the_searched_tasks():
    a, b = PipelineTask("A", _sleeper(0.0)), PipelineTask("B", _sleeper(0.0))
    costs = CostModel({"A": TaskCost(2 * MS), "B": TaskCost(3 * MS)})
    seed = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(1, thread_group="y")},
                        intra_iter_deps=[("B", "A")])
    plan, report = auto_schedule(([a, b], [(b, a)]), costs, Constraints(max_depth=2),
                                 solver=SolverOptions(time_limit_s=5),
                                 seeds=[("hand", seed)], verify=False)
    assert word_after(" ".join(report.notes), "seed:hand") == "3.000"  # the seed, simulated
    assert report.period_s == pytest.approx(3 * MS, rel=1e-6)
    assert not plan.unbound_tasks()


def test_seed_with_other_dependencies_is_rejected():
    costs = CostModel({"A": TaskCost(MS), "B": TaskCost(MS)})
    seed = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0)})  # lost the dependency B -> A
    with pytest.raises(ValueError, match="dependencies"):
        auto_schedule((["A", "B"], [("B", "A")]), costs, Constraints(),
                      solver=SolverOptions(time_limit_s=5), seeds=[seed])


def test_seed_beyond_max_depth_is_skipped_with_a_note():
    costs = CostModel({"A": TaskCost(MS), "B": TaskCost(MS)})
    seed = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(3)}, intra_iter_deps=[("B", "A")])
    _, report = auto_schedule((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2),
                              solver=SolverOptions(time_limit_s=5),
                              seeds=[seed])
    assert [n.split()[1:3] for n in report.notes if n.split()[0] == "seed"] == [["seed0", "skipped:"]]
    assert any("depth 4 > max_depth 2" in n for n in report.notes)  # why


def test_with_dependencies_of_adds_graph_deps_and_refuses_extra_ones():
    from autosched.search.seeds import with_dependencies_of

    graph = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0)}, [("B", "A")], [("A", "B", 1)])
    seed = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1, thread_group="x")}, [("B", "A")])
    got = with_dependencies_of(seed, graph)
    assert got.inter_edges() == [("A", "B", 1)] and got.stage("B") == 1
    extra = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0)}, [("B", "A")], [("B", "B", 1)])
    with pytest.raises(ValueError, match="lacks"):
        with_dependencies_of(extra, graph)


def test_verify_measures_the_searched_plan_with_the_callers_group_the_search_chose():
    """The search places the caller's group and its hand-offs itself: the verification measures its plan as
    it is, beside the other searchers' bests, the input plan and the serial plan, and makes no variant of it."""
    import autosched.verify.candidates as verify_mod

    a, b = PipelineTask("A", _sleeper(MS)), PipelineTask("B", _sleeper(2 * MS))
    costs = CostModel({"A": TaskCost(MS), "B": TaskCost(2 * MS)})
    plan, report = auto_schedule(([a, b], [(b, a)]), costs, Constraints(max_depth=2, max_threads=2),
                                 solver=SolverOptions(time_limit_s=4),
                                 batches=list(range(8)), verify=1)
    auto = report.verify["auto"].plan
    assert auto.caller_group == "default" and auto.sched("B").thread_group == "default"  # the busiest, inline
    assert {r.label for r in report.verify.rows} <= {"auto", "beam", "beam (deeper)", "cpsat", "serial"}
    assert not any({"inline", "handed"} & set(r.label.split()) for r in report.verify.rows)
    assert plan.caller_group in (None, *plan.thread_groups)
    for gone in ("inline_variant", "late_hand_off_variant", "caller_variants"):
        assert not hasattr(verify_mod, gone)


# ----------------------------------------------------------------------------- known plans (seeds, the input plan)


def test_a_plan_ahead_only_within_noise_does_not_replace_a_known_one():
    ahead = PlanMeasurement("auto", None, [0.0098, 0.0097, 0.0099, 0.0101])  # ahead in 3 of 4 rounds, by ~1 %
    seed = PlanMeasurement("seed:x", None, [0.0100, 0.0099, 0.0100, 0.0099])
    table = VerifyTable([ahead, seed], rounds=4, iterations=20, known=("seed:x",))
    assert not table.beats(ahead, seed)
    assert table.choose() is seed
    assert VerifyTable([ahead, seed], rounds=4, iterations=20).choose() is ahead  # nothing known: the fastest


def test_a_plan_measurably_faster_replaces_the_known_one_and_of_several_known_the_fastest_is_kept():
    fast = PlanMeasurement("auto", None, [0.0050, 0.0052, 0.0049])
    slow_seed = PlanMeasurement("seed:a", None, [0.0100, 0.0101, 0.0099])
    table = VerifyTable([fast, slow_seed], rounds=3, iterations=20, known=("seed:a",))
    assert table.beats(fast, slow_seed) and table.choose() is fast
    near_seed = PlanMeasurement("seed:b", None, [0.0051, 0.0050, 0.0051])
    table = VerifyTable([fast, slow_seed, near_seed], rounds=3, iterations=20, known=("seed:a", "seed:b"))
    assert table.choose() is near_seed


def test_runs_are_paired_by_round_when_racing_skipped_some():
    # b sat out round 2: its third period is round 3's, paired with a's round 3 (where a lost)
    a = PlanMeasurement("a", None, [0.009, 0.009, 0.009, 0.012], round_ids=[0, 1, 2, 3])
    b = PlanMeasurement("b", None, [0.010, 0.010, 0.010], round_ids=[0, 1, 3])
    table = VerifyTable([a, b], rounds=2, iterations=20)
    assert b.by_round() == {0: 0.010, 1: 0.010, 3: 0.010}
    assert not table.beats(a, b)  # ratios 0.9, 0.9, 1.2: the upper quartile is not below 1


def test_measure_plans_records_the_round_of_each_run_and_keeps_an_equal_known_plan(monkeypatch):
    measured_by_simulation(monkeypatch, _sleeps(2 * MS, "AB"))
    plan = _two_thread_plan(2 * MS)
    table = measure_plans([("auto", plan), ("seed:same", plan), ("serial", serial_plan(plan))], list(range(10)),
                          VerifyOptions(rounds=2, max_rounds=4, noise_floor_pct=30.0, margin_pct=25.0),
                          known=["seed:same"])
    # the two copies tie and race; the serial plan, twice as slow, runs the extra rounds only as their pair
    assert table["auto"].round_ids == table["seed:same"].round_ids == table["serial"].round_ids == [0, 1, 2, 3]
    assert table.paired("auto").median == pytest.approx(0.5) and table.paired("auto").rounds == 4
    assert table.choose().label == "seed:same"  # one plan measured twice never beats itself by 25 %


def test_verify_keeps_a_seed_the_search_does_not_measurably_beat(monkeypatch):
    seed = _two_thread_plan(3 * MS)  # thread groups "a" and "b"; the search names its own groups
    a, b = (seed.task(n) for n in ("A", "B"))
    costs = CostModel({"A": TaskCost(3 * MS), "B": TaskCost(3 * MS)})
    c, s = Constraints(max_depth=2, max_threads=2), SolverOptions(time_limit_s=5)

    def is_seed(plan):
        return {plan.sched(n).thread_group for n in plan.task_names} == {"a", "b"}

    # every plan but the seed measures 10 % faster than its sleeps simulate: ahead, but within the margin
    measured_by_simulation(monkeypatch, costs, factor=lambda plan: 1.0 if is_seed(plan) else 0.9)
    # a 20 % margin: plans 10 % faster than the seed never replace it
    got, report = auto_schedule(([a, b], [(b, a)]), costs, c, solver=s, seeds=[("two", seed)],
                                batches=list(range(12)), verify=VerifyOptions(rounds=2, margin_pct=20.0))
    table = report.verify
    assert table.known == ("seed:two",)
    assert table.choose().label == "seed:two"
    assert {n: got.sched(n).thread_group for n in "AB"} == {"A": "a", "B": "b"}
    fastest = min(table.rows, key=lambda r: r.period_s)
    assert fastest.label != "seed:two" and any("keeping seed:two" in n for n in table.notes)
    got, report = auto_schedule(([a, b], [(b, a)]), costs, c, solver=s, seeds=[("two", seed)],
                                batches=list(range(12)), verify=VerifyOptions(rounds=2, keep_known=False))
    assert report.verify.known == () and report.verify.choose() is min(report.verify.rows, key=lambda r: r.period_s)
    assert report.verify.choose().label != "seed:two" and not is_seed(got)  # without keep_known the fastest wins


def test_predicted_speedup_is_the_models_serial_period_over_the_chosen_plans():
    """The demo compares it with a measured speedup: one model's two predictions, so the machine's speed cancels."""
    table = VerifyTable([PlanMeasurement("serial", None, [0.020], predicted_s=0.010),
                         PlanMeasurement("seed:x", None, [0.012], predicted_s=0.008),
                         PlanMeasurement("beam", None, [0.011])], rounds=1, iterations=20)
    assert table.predicted_speedup("seed:x") == pytest.approx(1.25)
    assert table.predicted_speedup("serial") == pytest.approx(1.0)
    assert table.predicted_speedup("beam") is None  # measured without a prediction
    no_serial = VerifyTable([PlanMeasurement("auto", None, [0.01], predicted_s=0.008)], rounds=1, iterations=20)
    assert no_serial.predicted_speedup("auto") is None


def test_verification_predicts_every_candidate_with_the_simulator():
    costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    two = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(1, thread_group="y")},
                       intra_iter_deps=[("B", "A")])
    got = predict_periods([("two", two), ("serial", serial_plan(two))], costs)
    assert got == {"two": pytest.approx(0.003), "serial": pytest.approx(0.005)}
    broken = PipelinePlan({"A": TaskSchedule(0), "Z": TaskSchedule(0)})  # no cost for Z: left out, not raised
    assert predict_periods([("broken", broken)], costs) == {}


def test_a_calibrated_search_predicts_each_candidate_with_the_model_it_searched_with(monkeypatch):
    """The verification's predictions are the search's model: the engine's cost per task, per hand-off and per
    period folded in, the same figures predict_periods gives from the costs, and no run spent on anything else."""
    from autosched.model.machine import searched_costs
    from autosched.model.simulate import simulate_folded
    from swpipe_core.measure.calibrate import MachineCalibration

    runs = measured_by_simulation(monkeypatch, _sleeps(2 * MS, "AB"))
    plan = _two_thread_plan(2 * MS)
    cal = MachineCalibration(task_s=1e-5, dep_s=2e-4, period_s=5e-5, cores_free=2.0, cpu_count=2)
    costs = CostModel({"A": TaskCost(2 * MS), "B": TaskCost(2 * MS)}, machine_calibration=cal)
    _, report = auto_schedule(plan, costs, Constraints(max_depth=2, max_threads=2),
                              solver=SolverOptions(time_limit_s=4),
                              verify=VerifyOptions(rounds=1, max_rounds=1, iterations=12), batches=list(range(12)))
    table = report.verify
    rows = [r for r in table.rows if r.plan is not None]
    outside = predict_periods([(r.label, r.plan) for r in rows], costs)
    for r in rows:
        model = simulate_folded(r.plan, searched_costs(costs), cal, num_iterations=60).period_s
        assert r.predicted_s == pytest.approx(model) == pytest.approx(outside[r.label])
    multi = [r for r in rows if len(r.plan.thread_groups) > 1]
    assert multi and all(r.predicted_s >= 2 * MS + 2e-4 for r in multi)  # B's hand-off from A is charged
    assert table["serial"].predicted_s == pytest.approx(4 * MS + 2e-5 + 5e-5)  # two tasks' and one period's engine
    assert len(runs) == len(rows) * 2  # each candidate: its warm-up and its one round, nothing else
    assert not any("wake" in n or "GIL" in n for n in table.notes)


def test_an_uncalibrated_search_predicts_with_its_costs_as_given():
    costs = CostModel({"A": TaskCost(2 * MS), "B": TaskCost(2 * MS)})
    _, report = auto_schedule(_two_thread_plan(2 * MS), costs, Constraints(max_depth=2, max_threads=2),
                              solver=SolverOptions(time_limit_s=4),
                              verify=VerifyOptions(rounds=1, iterations=12), batches=list(range(12)))
    assert report.verify["serial"].predicted_s == pytest.approx(4 * MS)
    assert not any("calibrat" in n for n in report.verify.notes + report.notes)


# ------------------------------------------------------------- paired against the simplest plan (fixed measurements)


def test_a_plan_not_faster_than_the_simplest_beyond_the_noise_loses_to_it():
    # issue 38's case: the fused plan looks faster by its median period, but round by round it beats TorchRec's
    # base plan in only 4 of 7 rounds: its paired ratios' middle half reaches above 1, so base is kept
    base = PlanMeasurement("seed:base", None, [0.0100, 0.0120, 0.0095, 0.0110, 0.0102, 0.0130, 0.0098])
    fused = PlanMeasurement("seed:fused_sparse_dist", None,
                            [0.0092, 0.0126, 0.0087, 0.0117, 0.0094, 0.0124, 0.0101])
    table = VerifyTable([fused, base], rounds=7, iterations=24, baseline="seed:base",
                        known=("seed:base", "seed:fused_sparse_dist"))
    assert fused.period_s < base.period_s  # unpaired, the fused plan would have won
    pair = table.paired("seed:fused_sparse_dist")
    assert pair.rounds == 7 and pair.median < 1.0 < pair.q3
    assert not table.beats(fused, base)
    assert table.choose() is base


def test_pairing_cancels_the_machines_drift_between_rounds():
    # the machine runs 40 % slower every other round: the plans' own rounds overlap, the pairs do not
    drift = [1.0, 1.4, 1.0, 1.4, 1.0, 1.4, 1.0]
    serial = PlanMeasurement("serial", None, [0.010 * d for d in drift])
    auto = PlanMeasurement("auto", None, [0.0095 * d for d in drift])
    table = VerifyTable([auto, serial], rounds=7, iterations=24)
    assert auto.spread_pct > 30 and max(auto.rounds_s) > min(serial.rounds_s)
    pair = table.paired("auto")
    assert (pair.label, pair.over, pair.rounds) == ("auto", "serial", 7)
    assert pair.median == pytest.approx(0.95) and pair.q1 == pytest.approx(0.95) and pair.q3 == pytest.approx(0.95)
    assert table.beats(auto, serial) and table.choose() is auto
    assert table.noise_pct == table.noise_floor_pct  # the pairs' middle half has no width


def test_of_the_plans_that_beat_the_simplest_the_lowest_median_paired_ratio_wins():
    serial = PlanMeasurement("serial", None, [0.010, 0.011, 0.010, 0.012, 0.010])
    a = PlanMeasurement("a", None, [0.008, 0.0088, 0.008, 0.0096, 0.008])      # x0.80 every round
    b = PlanMeasurement("b", None, [0.007, 0.0077, 0.007, 0.0084, 0.007])      # x0.70 every round
    table = VerifyTable([a, b, serial], rounds=5, iterations=24)
    assert table.choose() is b
    assert table.paired("b").gain_pct == pytest.approx(100 * (1 / 0.7 - 1))
    assert table.paired("b", over="a").median == pytest.approx(0.875)


def test_the_margin_is_the_least_median_gain_that_counts():
    serial = PlanMeasurement("serial", None, [0.010] * 5)
    close = PlanMeasurement("close", None, [0.0099] * 5)  # 1 % faster in every round
    assert VerifyTable([close, serial], 5, 24, margin_pct=2.0).choose() is serial
    assert VerifyTable([close, serial], 5, 24, margin_pct=0.5).choose() is close


def test_paired_ratio_uses_only_the_rounds_both_ran_and_gives_none_without_one():
    a = PlanMeasurement("a", None, [0.008, 0.012], round_ids=[0, 3])
    b = PlanMeasurement("b", None, [0.010, 0.010, 0.010], round_ids=[0, 1, 2])
    pair = paired_ratio(a, b)
    assert pair == PairedRatio("a", "b", median=0.8, q1=0.8, q3=0.8, rounds=1)
    assert paired_ratio(a, PlanMeasurement("c", None, [0.01], round_ids=[5])) is None


def test_the_table_reports_each_plans_paired_ratio_and_middle_half():
    serial = PlanMeasurement("serial", None, [0.010, 0.010, 0.010, 0.010])
    auto = PlanMeasurement("auto", None, [0.006, 0.007, 0.008, 0.009])
    table = VerifyTable([auto, serial], rounds=4, iterations=24)
    pair = table.paired("auto")
    assert (pair.median, round(pair.q1, 4), round(pair.q3, 4)) == (0.75, 0.675, 0.825)
    row = next(line for line in table.format().splitlines() if line.strip().startswith("auto"))
    assert str(pair) in row and "(4)" in row


def test_racing_gives_the_undecided_plans_more_rounds_with_the_simplest_one(monkeypatch):
    from autosched.verify.candidates import plan_key

    # "noisy" measures 5 % faster, 10 % slower, as fast as its sleeps, over and over: its pairs with the
    # serial plan straddle 1, so it races (with serial, its pair) to max_rounds; "slow" is decided at once
    plan = _two_thread_plan(2 * MS)
    serial = serial_plan(plan)
    a, b = plan.task("A"), plan.task("B")
    noisy = PipelinePlan({a: TaskSchedule(0, thread_group="a"), b: TaskSchedule(1, thread_group="a")},
                         intra_iter_deps=[(b, a)])
    flips = iter([0.95, 1.1, 1.0] * 20)
    factors = {plan_key(noisy): lambda: next(flips), plan_key(plan): lambda: 3.0}
    measured_by_simulation(monkeypatch, _sleeps(2 * MS, "AB"),
                           factor=lambda p: factors.get(plan_key(p), lambda: 1.0)())
    table = measure_plans([("noisy", noisy), ("serial", serial), ("slow", plan)], list(range(10)),
                          VerifyOptions(rounds=3, max_rounds=6), warmup=False)
    assert table["noisy"].round_ids == table["serial"].round_ids == [0, 1, 2, 3, 4, 5]
    assert table["slow"].round_ids == [0, 1, 2]  # 1.5 times the serial period in every round
    pair = table.paired("noisy")
    assert pair.rounds == 6 and pair.q1 < 1.0 < pair.q3
    assert table.choose() is table["serial"]


def test_a_plan_ahead_of_the_simplest_one_is_confirmed_on_every_round_racing_allows(monkeypatch):
    """The first rounds pick the leader among many plans: it replaces the simplest plan only on max_rounds rounds."""
    plan = _two_thread_plan(2 * MS)
    measured_by_simulation(monkeypatch, _sleeps(2 * MS, "AB"))
    a, b = plan.task("A"), plan.task("B")
    one_thread = PipelinePlan({a: TaskSchedule(0, thread_group="a"), b: TaskSchedule(1, thread_group="a")},
                              intra_iter_deps=[(b, a)])
    table = measure_plans([("two", plan), ("one thread", one_thread), ("serial", serial_plan(plan))],
                          list(range(10)), VerifyOptions(rounds=2, max_rounds=5), warmup=False)
    assert table["two"].round_ids == table["serial"].round_ids == [0, 1, 2, 3, 4]
    assert table["one thread"].round_ids == [0, 1]  # no faster than serial, every round: decided
    assert table.choose().label == "two" and table.paired("two").rounds == 5


def test_ranks_measured_in_lockstep_count_each_rounds_slowest_rank():
    table = VerifyTable([PlanMeasurement("seed:base", None, [0.010, 0.010]),
                         PlanMeasurement("auto", None, [0.009, 0.009])], 2, 24, baseline="seed:base", known=("x",))
    slowest = table.with_slowest([{"seed:base": [0.010, 0.010], "auto": [0.009, 0.011]},
                                  {"seed:base": [0.011, 0.009], "auto": [0.008, 0.009]}])
    assert slowest["auto"].rounds_s == [0.009, 0.011] and slowest["seed:base"].rounds_s == [0.011, 0.010]
    assert (slowest.baseline, slowest.known, slowest.margin_pct) == ("seed:base", ("x",), table.margin_pct)
