"""auto_schedule end to end: valid, runnable plans that keep the user's dependencies, honour constraints, explain themselves."""

from __future__ import annotations

import dataclasses
import itertools
import threading

import pytest
from conftest import word_after

from swpipe.testing.plan_space import random_graph, random_problem
from autosched.model.costs import CostModel, CostModelError, TaskCost
from autosched.model.graph import task_graph
from autosched.search.options import Constraints, OptionError, SolverOptions
from autosched.search.report import SearchReport
from swpipe import auto_schedule
from autosched.model.simulate import simulate
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.validate import validate


class _Recorder:
    """Task functions that log (task, iteration, start tick, end tick) without sleeping."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tick = itertools.count()
        self.log = {}

    def fn(self, name):
        def run(ctx):
            with self.lock:
                start = next(self.tick)
            with self.lock:
                self.log[name, ctx.iter_idx] = (start, next(self.tick))
        run.__name__ = name
        return run


def _run_on_engine(plan: PipelinePlan, iterations: int = 8) -> _Recorder:
    from swpipe import Timeouts
    from swpipe_core.engine.pipeline import SWPipeline

    rec = _Recorder()
    bound = plan.bind({n: rec.fn(n) for n in plan.task_names})
    with SWPipeline(bound, device="cpu", timeouts=Timeouts(signal_s=20, progress_s=30)) as pipe:
        pipe.run(range(iterations))
    return rec


def _assert_dependencies_held(plan: PipelinePlan, rec: _Recorder, iterations: int) -> None:
    for n in plan.task_names:
        for i in range(iterations):
            assert (n, i) in rec.log, f"{n} did not run for iteration {i}"
    for t, d in plan.intra_edges():
        for i in range(iterations):
            assert rec.log[d, i][1] < rec.log[t, i][0], f"{t}({i}) started before {d}({i}) ended"
    for t, d, n in plan.inter_edges():
        for i in range(n, iterations):
            assert rec.log[d, i - n][1] < rec.log[t, i][0], f"{t}({i}) started before {d}({i - n}) ended"


@pytest.mark.parametrize("seed,method", [(0, "auto"), (3, "beam"), (5, "cpsat")])
def test_returned_plan_validates_and_runs_on_the_engine(seed, method):
    graph, costs = random_problem(seed, 5, 0.5, tags=True)
    plan, report = auto_schedule(graph, costs, Constraints(max_depth=3, max_threads=2),
                                 solver=SolverOptions(time_limit_s=8, method=method))
    validate(plan)
    rec = _run_on_engine(plan)
    _assert_dependencies_held(plan, rec, 8)
    assert report.period_s == pytest.approx(simulate(plan, costs, num_iterations=240).period_s, rel=1e-9)


def test_larger_graph_plan_runs_on_the_engine():
    graph, costs = random_graph(2, 30)
    plan, report = auto_schedule(graph, costs, Constraints(max_depth=3, max_threads=3),
                                 solver=SolverOptions(time_limit_s=3, method="beam"))
    validate(plan)
    _assert_dependencies_held(plan, _run_on_engine(plan, 6), 6)
    assert report.period_s <= report.serial_period_s


def test_declared_dependencies_are_never_dropped():
    (tasks, intra, inter), costs = random_problem(4, 5, 0.6)
    inter = inter + [("T0", "T4", 1)]
    plan, _ = auto_schedule((tasks, intra, inter), costs, Constraints(), solver=SolverOptions(time_limit_s=10))
    assert sorted(plan.intra_edges()) == sorted(intra)
    assert sorted(plan.inter_edges()) == sorted(inter)


def test_task_functions_travel_with_the_tasks():
    fns = {n: (lambda ctx: None) for n in ("A", "B", "C")}
    tasks = [PipelineTask(n, fns[n]) for n in fns]
    graph = task_graph(tasks, [("B", "A"), ("C", "B")])
    costs = CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002), "C": TaskCost(0.001)})
    plan, _ = auto_schedule(graph, costs, Constraints(), solver=SolverOptions(time_limit_s=10))
    assert plan.unbound_tasks() == []
    assert all(plan.task(n).fn is fns[n] for n in fns)


def test_caps_frozen_entries_and_collectives_are_honoured():
    graph, costs = random_graph(6, 14)
    costs = costs.replace("T004", resources=("comm:nccl",)).replace("T009", resources=("comm:nccl",))
    frozen = {"T013": {"stage": 2, "thread_group": "compute"}, "T000": {"thread_group": "io"}}
    plan, report = auto_schedule(graph, costs, Constraints(max_depth=3, max_threads=2, frozen=frozen),
                                 solver=SolverOptions(time_limit_s=4))
    assert plan.pipeline_depth <= 3 and report.depth == plan.pipeline_depth
    assert {plan.sched(n).thread_group for n in plan.task_names} <= {"compute", "io"}
    assert plan.stage("T013") == 2 and plan.sched("T013").thread_group == "compute"
    assert plan.sched("T000").thread_group == "io"
    comm = {n for n in plan.task_names if costs[n].comms}
    assert comm and {n for n in plan.task_names if plan.sched(n).globally_ordered} == comm


def test_never_worse_than_the_given_plan():
    # a hand-written 2-stage plan on one thread; the search may use a second thread
    costs = CostModel({"Load": TaskCost(0.002), "Fwd": TaskCost(0.003), "Bwd": TaskCost(0.004), "Opt": TaskCost(0.001)})
    given = PipelinePlan({"Load": TaskSchedule(0), "Fwd": TaskSchedule(1), "Bwd": TaskSchedule(1), "Opt": TaskSchedule(1)},
                         intra_iter_deps=[("Fwd", "Load"), ("Bwd", "Fwd"), ("Opt", "Bwd")])
    plan, report = auto_schedule(given, costs, Constraints(max_depth=2, max_threads=2),
                                 solver=SolverOptions(time_limit_s=10))
    base = simulate(given, costs).period_s
    assert report.baseline_period_s == pytest.approx(base)
    assert report.period_s <= base * (1 + 1e-9)
    assert report.period_s == pytest.approx(0.005)  # 10 ms of work split evenly: Load+Fwd | Bwd+Opt


@pytest.mark.parametrize("method", ["cpsat", "beam"])
def test_search_with_one_free_core_cannot_beat_total_host_work(method):
    tasks = {"Load": TaskCost(0.002), "Fwd": TaskCost(0.003), "Bwd": TaskCost(0.004), "Opt": TaskCost(0.001)}
    graph = (list(tasks), [("Fwd", "Load"), ("Bwd", "Fwd"), ("Opt", "Bwd")])
    c, s = Constraints(max_depth=2, max_threads=2), SolverOptions(time_limit_s=10, method=method)
    _, free = auto_schedule(graph, CostModel(tasks), c, solver=s)
    assert free.period_s == pytest.approx(0.005)  # two threads split the 10 ms of work
    plan, one = auto_schedule(graph, CostModel(tasks, cores=1), c, solver=s)
    # one core runs all 10 ms in turn, whatever the plan; the report's bound says so
    assert one.period_s == pytest.approx(0.010) and one.lower_bound_s == pytest.approx(0.010)
    assert one.why.bound_binding == "cores" and one.gap_pct == pytest.approx(0.0, abs=1e-6)
    assert simulate(plan, CostModel(tasks, cores=1)).period_s == pytest.approx(one.period_s)


@pytest.mark.parametrize("method", ["cpsat", "beam"])
def test_search_overlaps_a_nocore_task_with_the_one_core(method):
    tasks = {"Wait": TaskCost(0.004, 0.0, ("nocore",)), "Fwd": TaskCost(0.003), "Bwd": TaskCost(0.003)}
    graph = (list(tasks), [("Fwd", "Wait"), ("Bwd", "Fwd")])
    plan, report = auto_schedule(graph, CostModel(tasks, cores=1), Constraints(max_depth=2, max_threads=2),
                                 solver=SolverOptions(time_limit_s=10, method=method))
    # the 4 ms wait runs beside the 6 ms the one core does; no plan beats the core's 6 ms
    assert report.period_s == pytest.approx(0.006) and report.lower_bound_s == pytest.approx(0.006)
    assert plan.sched("Wait").thread_group != plan.sched("Fwd").thread_group


def test_search_folds_a_cost_models_machine_calibration_and_not_a_model_without_one():
    """A profile taken with calibrate=True carries the machine: the search sees its engine cost and free cores."""
    from swpipe_core.measure.calibrate import MachineCalibration

    tasks = {"Load": TaskCost(0.002), "Fwd": TaskCost(0.003), "Bwd": TaskCost(0.004), "Opt": TaskCost(0.001)}
    graph = (list(tasks), [("Fwd", "Load"), ("Bwd", "Fwd"), ("Opt", "Bwd")])
    c, s = Constraints(max_depth=2, max_threads=2), SolverOptions(time_limit_s=10)
    cal = MachineCalibration(task_s=1e-4, cores_free=1.0, cpu_count=2)
    _, folded = auto_schedule(graph, CostModel(tasks, machine_calibration=cal), c, solver=s)
    # one free core: the 10 ms of work plus 0.1 ms of engine per task, one after another
    assert folded.period_s == pytest.approx(0.0104) and folded.why.bound_binding == "cores"
    assert "folded" in folded.notes[0].split() and "1 free core" in folded.notes[0]  # the calibration, its pool
    uncalibrated = dataclasses.replace(CostModel(tasks, machine_calibration=cal), machine_calibration=None)
    _, raw = auto_schedule(graph, uncalibrated, c, solver=s)
    assert raw.period_s == pytest.approx(0.005) and not any("calibration" in n for n in raw.notes)
    from autosched.model.machine import calibrated_costs  # a model folded already is not folded twice

    _, again = auto_schedule(graph, calibrated_costs(CostModel(tasks, machine_calibration=cal)), c, solver=s)
    assert again.period_s == pytest.approx(folded.period_s)


def test_search_with_two_cores_for_three_threads_balances_on_the_pool():
    tasks = {n: TaskCost(0.002) for n in "ABCDEF"}
    graph = (list(tasks), [])
    c, s = Constraints(max_depth=2, max_threads=3), SolverOptions(time_limit_s=10)
    _, free = auto_schedule(graph, CostModel(tasks), c, solver=s)
    assert free.period_s == pytest.approx(0.004)  # 12 ms on three threads
    plan, pooled = auto_schedule(graph, CostModel(tasks, cores=2), c, solver=s)
    assert pooled.period_s == pytest.approx(0.006) and pooled.lower_bound_s == pytest.approx(0.006)
    validate(plan)


def test_given_plan_kept_when_nothing_beats_it():
    costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.002)})
    given = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(1, thread_group="y")},
                         intra_iter_deps=[("B", "A")])
    plan, report = auto_schedule(given, costs, Constraints(max_depth=2, max_threads=2),
                                 solver=SolverOptions(time_limit_s=10))
    assert report.period_s == pytest.approx(0.002) and report.status == "OPTIMAL"
    assert report.gap_pct == pytest.approx(0.0, abs=1e-6)


def test_report_says_what_binds_and_how_to_go_faster():
    costs = CostModel({"H2D": TaskCost(0.001), "Fwd": TaskCost(0.004), "Bwd": TaskCost(0.006)})
    graph = (["H2D", "Fwd", "Bwd"], [("Fwd", "H2D"), ("Bwd", "Fwd")], [("Fwd", "Bwd", 1)])
    plan, report = auto_schedule(graph, costs, Constraints(max_depth=2, max_threads=2),
                                 solver=SolverOptions(time_limit_s=10))
    assert isinstance(report, SearchReport)
    assert report.period_s == pytest.approx(0.010)   # Fwd(i) waits Bwd(i-1): a 10 ms recurrence
    assert report.lower_bound_s == pytest.approx(0.010) and report.gap_pct == pytest.approx(0.0, abs=1e-6)
    text = report.explain()
    assert word_after(text, "lower", "bound") == "10.000"  # reaches the lower bound, in ms
    assert word_after(text, "halving") in ("Bwd", "Fwd")  # what would make it faster: a task of the recurrence
    assert report.why.what_if and report.why.what_if[0][1] < report.period_s
    shown = str(report)
    assert "period 10.000 ms" in shown and "H2D" in shown and "depth" in shown


def test_depth_is_chosen_for_memory_when_it_costs_nothing():
    # one thread: nothing overlaps, so a deeper pipeline cannot help and depth 1 must be chosen
    costs = CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002), "C": TaskCost(0.003)})
    plan, report = auto_schedule((["A", "B", "C"], [("B", "A"), ("C", "B")]), costs,
                                 Constraints(max_depth=3, max_threads=1), solver=SolverOptions(time_limit_s=10))
    assert plan.pipeline_depth == 1 and report.depth == 1
    assert report.period_s == pytest.approx(0.006)


def test_cuda_semantics_search_streams():
    (tasks, intra, inter), _ = random_problem(2, 5, 0.5)
    costs = CostModel({t: TaskCost(0.0002, 0.001 * (1 + i % 3)) for i, t in enumerate(tasks)})
    c = Constraints(device="cuda", streams=[None, "side"], max_depth=3, max_threads=2)
    plan, report = auto_schedule((tasks, intra, inter), costs, c, solver=SolverOptions(time_limit_s=6))
    validate(plan)
    assert {plan.sched(n).stream for n in plan.task_names} <= {None, "side"}
    assert report.period_s == pytest.approx(simulate(plan, costs, 240, device="cuda").period_s, rel=1e-9)
    assert report.period_s <= report.serial_period_s
    assert report.device == "cuda"


@pytest.mark.parametrize("bad,err", [
    (dict(costs=CostModel({"A": TaskCost(0.001)})), CostModelError),
    (dict(graph=(["A", "B"], [("B", "A"), ("A", "B")])), ValueError),
    (dict(constraints=Constraints(frozen={"Z": {"stage": 0}})), ValueError),
    (dict(constraints=Constraints(max_depth=2, frozen={"A": {"stage": 5}})), ValueError),
    (dict(constraints=Constraints(max_threads=1, frozen={"A": {"thread_group": "x"}, "B": {"thread_group": "y"}})), ValueError),
    (dict(graph="not a graph"), TypeError),
])
def test_bad_input_is_a_clear_error(bad, err):
    graph = bad.get("graph", (["A", "B"], [("B", "A")]))
    costs = bad.get("costs", CostModel({"A": TaskCost(0.001), "B": TaskCost(0.001)}))
    with pytest.raises(err) as info:
        auto_schedule(graph, costs, bad.get("constraints"), solver=SolverOptions(time_limit_s=5))
    assert str(info.value)


def test_frozen_stage_that_breaks_a_corollary_has_no_plan():
    costs = CostModel({"A": TaskCost(0.001), "B": TaskCost(0.001)})
    with pytest.raises(RuntimeError, match="frozen"):  # the constraints that leave no plan
        auto_schedule((["A", "B"], [("B", "A")]), costs,
                      Constraints(max_depth=2, frozen={"A": {"stage": 1}, "B": {"stage": 0}}),
                      solver=SolverOptions(time_limit_s=5))


# ----------------------------------------------------------------------------- the caller's group


def _thread_recorder():
    """Task functions that note the thread each task ran on, and the swpipe threads alive then."""
    ran, alive = {}, set()

    def fn(name):
        def run(ctx):
            ran.setdefault(name, set()).add(threading.current_thread().name)
            alive.update(t.name for t in threading.enumerate() if t.name.startswith("swpipe-"))
        return run
    return ran, alive, fn


@pytest.mark.parametrize("method", ["beam", "cpsat"])
def test_a_searched_plan_runs_the_group_the_search_chose_on_the_callers_thread(method):
    from swpipe_core.engine.pipeline import SWPipeline

    ran, alive, fn = _thread_recorder()
    load, step = PipelineTask("Load", fn("Load")), PipelineTask("Step", fn("Step"))
    costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    plan, report = auto_schedule(([load, step], [(step, load)]), costs,
                                 Constraints(max_depth=2, max_threads=2),
                                 solver=SolverOptions(method=method, time_limit_s=5))
    # both groups on workers would run no faster in the model: the busiest runs inline, one worker fewer
    assert report.period_s == pytest.approx(0.003)
    assert plan.caller_group == "default" and plan.sched("Step").thread_group == "default"
    worker = plan.sched("Load").thread_group
    assert worker != "default" and "(default" in report.summary().split()  # the group on the caller's thread
    with SWPipeline(plan, device="cpu") as pipe:
        pipe.run(range(8))
    assert ran == {"Step": {threading.current_thread().name}, "Load": {f"swpipe-{worker}"}}
    assert f"swpipe-{worker}" in alive and "swpipe-default" not in alive  # no worker thread for the caller's group


def test_the_input_plans_caller_group_decides_whether_a_group_may_run_inline():
    costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    given = PipelinePlan({"Load": TaskSchedule(0, thread_group="io"), "Step": TaskSchedule(1, thread_group="main")},
                         intra_iter_deps=[("Step", "Load")], caller_group=None)
    s = SolverOptions(time_limit_s=5)
    plan, report = auto_schedule(given, costs, Constraints(max_depth=2, max_threads=2), solver=s)
    assert plan.caller_group is None and report.period_s == pytest.approx(0.003)
    assert "(each" in report.summary().split()  # each group with a worker: none on the caller's thread
    # a group frozen under the caller's group's name always runs inline, even the lighter one
    frozen = Constraints(max_depth=2, max_threads=2, frozen={"Load": {"thread_group": "default"}})
    plan, _ = auto_schedule((["Load", "Step"], [("Step", "Load")]), costs, frozen, solver=s)
    assert plan.caller_group == "default" and plan.sched("Load").thread_group == "default"
    assert plan.sched("Step").thread_group != "default"


def test_the_simulator_scores_a_searched_plan_with_its_hand_offs():
    from autosched.search.plans import build_plan
    from autosched.search.problem import make_problem
    from autosched.search.scoring import sim_scorer

    graph = (["Load", "Fwd", "Bwd"], [("Fwd", "Load"), ("Bwd", "Fwd")])
    costs = CostModel({"Load": TaskCost(0.002), "Fwd": TaskCost(0.003), "Bwd": TaskCost(0.003)})
    problem = make_problem(graph, costs, Constraints(max_depth=2, max_threads=2))
    stage, group = {"Load": 0, "Fwd": 1, "Bwd": 1}, {"Load": "io", "Fwd": "main", "Bwd": "main"}
    early = build_plan(problem, stage, group, inline="main")
    late = build_plan(problem, stage, group, inline="main", handoff="Bwd")
    assert early.caller_group == late.caller_group == "default"
    assert early.enqueue_order == ["Load", "Fwd", "Bwd"] and late.enqueue_order == ["Fwd", "Bwd", "Load"]
    score = sim_scorer(problem, 24)
    # handed off after Bwd, the next batch's Load starts only once the main thread ran Fwd and Bwd: 2 + 3 + 3 ms
    assert score(early)[0] == pytest.approx(0.006) and score(late)[0] == pytest.approx(0.008)
    # the same order with every group on a worker hands nothing off late
    assert score(late.replace(caller_group=None))[0] == pytest.approx(0.006)


def test_the_search_hands_off_late_where_a_lock_makes_that_faster():
    # Load and Fwd hold the interpreter lock ("gil"), Bwd does not: handed off at the period's start, Load takes
    # the lock first and Fwd waits (8 ms); handed off after Fwd, Load runs beside Bwd (6 ms)
    graph = (["Load", "Fwd", "Bwd"], [("Fwd", "Load"), ("Bwd", "Fwd")])
    costs = CostModel({"Load": TaskCost(0.002, resources=("gil",)), "Fwd": TaskCost(0.003, resources=("gil",)),
                       "Bwd": TaskCost(0.003)})
    frozen = {"Load": {"thread_group": "io", "stage": 0}, "Fwd": {"thread_group": "default", "stage": 1},
              "Bwd": {"thread_group": "default", "stage": 1}}
    plan, report = auto_schedule(graph, costs, Constraints(max_depth=2, max_threads=2, frozen=frozen),
                                 solver=SolverOptions(time_limit_s=5))
    assert plan.caller_group == "default" and plan.enqueue_order == ["Fwd", "Load", "Bwd"]
    assert report.period_s == pytest.approx(0.006)
    assert simulate(plan.replace(enqueue_order=["Load", "Fwd", "Bwd"]), costs).period_s == pytest.approx(0.008)


def test_the_main_threads_engine_time_shares_its_window_with_the_callers_group():
    """With 1 ms of engine time per period, the 3 ms Step cannot run inline at a 3 ms period; Load and Log can."""
    from autosched.search.problem import make_problem
    from autosched.search.cpsat import solve_cpsat
    from swpipe_core.measure.calibrate import MachineCalibration

    costs = CostModel({"Load": TaskCost(0.0015), "Step": TaskCost(0.003), "Log": TaskCost(0.0005)},
                      machine_calibration=MachineCalibration(period_s=0.001, cores_free=2.0, cpu_count=2))
    graph = (["Load", "Step", "Log"], [("Step", "Load"), ("Log", "Step")])
    problem = make_problem(graph, costs, Constraints(max_depth=3, max_threads=2), time_unit_s=5e-4)
    problem.calibration = costs.machine_calibration  # as auto_schedule folds one: its engine time per period counts
    res = solve_cpsat(problem, time_limit_s=10)
    assert res.status == "OPTIMAL" and res.model_period == pytest.approx(0.003)
    assert res.plan.caller_group == "default" and res.plan.sched("Step").thread_group != "default"
    assert problem.simulate(res.plan).period_s == pytest.approx(0.003)
    plan, report = auto_schedule(graph, costs, Constraints(max_depth=3, max_threads=2),
                                 solver=SolverOptions(time_limit_s=5))
    assert report.period_s == pytest.approx(0.003)
    assert plan.caller_group == "default" and plan.sched("Step").thread_group != "default"
    # Step inline instead: the main thread's 3 + 1 ms a period are a floor
    busy = plan.replace(schedule={n: TaskSchedule(plan.stage(n), thread_group="default" if n == "Step" else "io")
                                  for n in plan.task_names}, enqueue_order=None, pipeline_depth=plan.pipeline_depth)
    assert problem.simulate(busy).period_s >= 0.004 - 1e-9


# ------------------------------------------------------------ what the report's status means (issue 42, item 5)

def test_a_plan_at_the_lower_bound_is_optimal_whichever_searcher_found_it():
    costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    _, report = auto_schedule((["Load", "Step"], [("Step", "Load")]), costs, Constraints(max_depth=2),
                              solver=SolverOptions(time_limit_s=5, method="beam"))
    assert report.method == "beam" and report.search.model_period_s is None  # CP-SAT did not run
    assert report.period_s == pytest.approx(report.lower_bound_s) and report.status == "OPTIMAL"


def test_feasible_says_cpsat_proved_its_model_and_the_simulator_runs_the_plan_slower():
    # on CUDA the CP-SAT model approximates the streams: it proves 5 ms, the simulator runs its plan at 6 ms
    costs = CostModel({"A": TaskCost(0.002, 0.004), "B": TaskCost(0.003, 0.002),
                       "C": TaskCost(0.003, 0.003, ("comm:nccl",)), "D": TaskCost(0.001, 0.001, ("comm:nccl",))})
    graph = (["A", "B", "C", "D"], [("D", "B"), ("D", "C")])
    _, report = auto_schedule(graph, costs, Constraints(device="cuda", streams=[None, "side"], max_depth=2),
                              solver=SolverOptions(time_limit_s=5, num_workers=1))
    assert report.search.model_optimal and report.search.model_period_s == pytest.approx(0.005)
    assert report.period_s > report.search.model_period_s * 1.01 and report.status == "FEASIBLE"


# ------------------------------------------------------------ auto_schedule's signature and its options (issue 40.3, 42.13)

def test_auto_schedule_takes_at_most_eight_parameters_each_named_for_what_it_is():
    import inspect

    import swpipe

    params = inspect.signature(swpipe.auto_schedule).parameters
    assert len(params) <= 8 and all(len(name) > 1 for name in params)
    assert list(params)[:4] == ["tasks_or_graph", "costs", "constraints", "solver"]


@pytest.mark.parametrize("keyword, home, argument", [("max_depth", "Constraints", "constraints"),
                                                     ("time_limit_s", "SolverOptions", "solver"),
                                                     ("beam_share", "SolverOptions", "solver"),
                                                     ("rounds", "VerifyOptions", "verify")])
def test_an_option_given_to_auto_schedule_names_the_class_it_belongs_to(keyword, home, argument):
    costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    with pytest.raises(OptionError) as info:
        auto_schedule((["Load", "Step"], [("Step", "Load")]), costs, **{keyword: 2})
    err = info.value
    assert (err.field, err.given_to, err.home, err.argument, err.value) == (keyword, "auto_schedule", home, argument, 2)
    assert isinstance(err, TypeError)  # what Python raises for an unexpected keyword, with the facts added


def test_an_option_given_to_the_wrong_class_or_misspelt_names_its_home_or_none():
    import pickle

    with pytest.raises(OptionError) as info:
        Constraints(rounds=3)
    assert (info.value.field, info.value.given_to, info.value.home, info.value.argument) == (
        "rounds", "Constraints", "VerifyOptions", "verify")
    with pytest.raises(OptionError) as info:
        SolverOptions(time_limit=5)  # no option has that name
    assert (info.value.field, info.value.home, info.value.argument) == ("time_limit", None, None)
    again = pickle.loads(pickle.dumps(info.value))  # the facts travel with it (a worker process, a log)
    assert (again.field, again.given_to, again.value) == ("time_limit", "SolverOptions", 5)
    with pytest.raises(OptionError) as info:
        SolverOptions(cpsat_share=1.5)  # a share of the budget
    assert (info.value.field, info.value.home, info.value.value) == ("cpsat_share", "SolverOptions", 1.5)


def test_the_budget_split_is_the_solver_options_shares(monkeypatch):
    """The beam gets ``beam_share`` of the budget when CP-SAT follows, ``beam_only_share`` when it runs alone.

    Watched by wrapping the beam search the searchers call (its budget is an argument, not a result)."""
    import autosched.search.searchers as searchers

    budgets = []
    beam = searchers.beam_search

    def watched(problem, **kwargs):
        budgets.append(kwargs["time_limit_s"])
        return beam(problem, **kwargs)

    monkeypatch.setattr(searchers, "beam_search", watched)
    costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    graph = (["Load", "Step"], [("Step", "Load")])
    auto_schedule(graph, costs, solver=SolverOptions(time_limit_s=4, beam_share=0.25))
    auto_schedule(graph, costs, solver=SolverOptions(time_limit_s=4, method="beam", beam_only_share=0.5))
    assert budgets[0] == pytest.approx(1.0) and budgets[-1] == pytest.approx(2.0)


def test_every_searcher_returns_the_same_result_type():
    import time

    from autosched.search.beam import beam_search
    from autosched.search.cpsat import solve_cpsat
    from autosched.search.found import Found
    from autosched.search.problem import make_problem
    from autosched.search.searchers import run_searchers
    from autosched.search.seeds import best_seed

    costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    problem = make_problem((["Load", "Step"], [("Step", "Load")]), costs, Constraints(max_depth=2))
    beam, exact = beam_search(problem, time_limit_s=5), solve_cpsat(problem, time_limit_s=5)
    seeded = best_seed([("given", exact.plan)], dataclasses.replace(beam, scorer=lambda plan: (1.0, 1.0)),
                       problem.unit_s)
    both = run_searchers(problem, SolverOptions(), None, 5, time.perf_counter())
    assert all(isinstance(found, Found) for found in (beam, exact, seeded, both))
    assert (beam.method, exact.method, seeded.method, both.method) == ("beam", "cpsat", "beam", "cpsat")
    assert exact.timetable.stage == {n: exact.plan.stage(n) for n in problem.names}  # the stage map it read
