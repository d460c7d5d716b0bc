"""CP-SAT joint model: its period equals brute force over the whole plan space; it honours every constraint."""

from __future__ import annotations

import pytest

from swpipe.testing.plan_space import brute_force, enumerate_plans, random_problem
from autosched.search.problem import make_problem
from autosched.search.scoring import sim_scorer
from autosched.model.costs import CostModel, TaskCost
from autosched.search.cpsat import model_lower_bound, solve_cpsat
from autosched.search.options import Constraints
from swpipe_core.order import period_local_graph
from swpipe_core.validate import validate

# (seed, tasks, edge probability, max_depth, max_threads, cost tags): chosen to cover a fractional
# recurrence-bound period (6.5 ms, 5.5 ms), a depth-bound chain, a thread-bound mix and shared resources.
SMALL = [
    (3, 4, 0.7, 2, 3, False),
    (9, 4, 0.7, 2, 3, False),
    (2, 4, 0.7, 2, 3, False),
    (3, 4, 0.8, 3, 3, False),
    (6, 4, 0.8, 3, 3, False),
    (3, 4, 0.7, 2, 2, True),
    (7, 4, 0.5, 2, 2, True),
]


def _problem(seed, n, pe, depth, threads, tags):
    graph, costs = random_problem(seed, n, pe, tags)
    return make_problem(graph, costs, Constraints(max_depth=depth, max_threads=threads))


@pytest.mark.parametrize("case", SMALL, ids=[f"seed{c[0]}-d{c[3]}-t{c[4]}{'-tags' if c[5] else ''}" for c in SMALL])
def test_cpsat_period_equals_brute_force(case):
    problem = _problem(*case)
    score = sim_scorer(problem, 24)
    truth = brute_force(problem, score)
    res = solve_cpsat(problem, time_limit_s=30)
    assert res.status == "OPTIMAL"
    validate(res.plan)
    simulated, _ = score(res.plan)
    assert simulated == pytest.approx(truth.period, rel=1e-9, abs=1e-12)
    # the model's period is what the engine reaches: the simulator agrees with CP-SAT
    assert res.model_period == pytest.approx(simulated, rel=1e-9) and res.model_optimal
    # the proof reaches the model's period (a fractional period just above an infeasible II - 1 is not excluded)
    assert res.bound <= simulated * (1 + 1e-9)
    assert res.bound >= res.model_period - problem.unit_s * (1 + 1e-9)


def test_cpsat_proves_smaller_period_infeasible():
    problem = _problem(3, 4, 0.7, 2, 3, False)
    res = solve_cpsat(problem, time_limit_s=30)
    ii = res.timetable.ii
    below = [status for tried, status in res.solves if tried < ii]
    # either it started at the analytic bound or every smaller II it tried was refuted
    assert ii == model_lower_bound(problem) or (below and set(below) == {"INFEASIBLE"})
    assert (ii - 1, "INFEASIBLE") in res.solves or ii == model_lower_bound(problem)


def test_cpsat_fractional_recurrence_period():
    # A -> B -> C, C(i) feeds A(i+2): the cycle carries 11 ms over 2 iterations -> 5.5 ms, not 6
    costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.004), "C": TaskCost(0.005)})
    problem = make_problem((["A", "B", "C"], [("B", "A"), ("C", "B")], [("A", "C", 2)]), costs,
                           Constraints(max_depth=3, max_threads=3))
    res = solve_cpsat(problem, time_limit_s=30)
    assert res.status == "OPTIMAL"
    assert res.model_period == pytest.approx(0.0055) and res.period == pytest.approx(0.0055)
    assert sim_scorer(problem, 30)(res.plan)[0] == pytest.approx(0.0055)


def test_cpsat_honours_frozen_stage_stream_and_thread():
    costs = CostModel({n: TaskCost(0.001 * (i + 1)) for i, n in enumerate(["H2D", "Dist", "Fwd", "Opt"])})
    frozen = {"Fwd": {"stage": 2, "thread_group": "main", "stream": None}, "H2D": {"stream": "memcpy"}}
    problem = make_problem((["H2D", "Dist", "Fwd", "Opt"], [("Dist", "H2D"), ("Fwd", "Dist"), ("Opt", "Fwd")]), costs,
                           Constraints(max_depth=3, max_threads=2, frozen=frozen))
    res = solve_cpsat(problem, time_limit_s=30)
    plan = res.plan
    validate(plan)
    assert plan.stage("Fwd") == 2 and plan.sched("Fwd").thread_group == "main"
    assert plan.stream_of("H2D") == "memcpy" and plan.sched("Fwd").stream is None
    assert len({plan.sched(n).thread_group for n in plan.task_names}) <= 2


def test_cpsat_serialises_a_communicator_across_threads():
    # two 3 ms collectives on one communicator can never overlap, whatever the threads
    costs = CostModel({"A": TaskCost(0.003, 0, ("comm:nccl",)), "B": TaskCost(0.003, 0, ("comm:nccl",)),
                       "C": TaskCost(0.001)})
    problem = make_problem((["A", "B", "C"], []), costs, Constraints(max_depth=2, max_threads=3))
    res = solve_cpsat(problem, time_limit_s=30)
    assert res.model_period == pytest.approx(0.006)
    assert res.plan.sched("A").globally_ordered and res.plan.sched("B").globally_ordered
    assert not res.plan.sched("C").globally_ordered


def test_cpsat_enqueue_order_is_a_topological_order_of_the_period_local_graph():
    problem = _problem(6, 4, 0.8, 3, 3, False)
    res = solve_cpsat(problem, time_limit_s=30)
    order = [str(t) for t in res.plan.enqueue_order]
    pos = {n: i for i, n in enumerate(order)}
    graph = period_local_graph(res.plan)
    assert sorted(order) == sorted(problem.names)
    assert all(pos[d] < pos[t] for d, t in graph.edges)
    # and it follows the offsets: among the caller's tasks and among the workers' tasks, a task never precedes
    # one that starts earlier in the period; a worker's task is handed off no later than the model starts it
    plan, offset = res.plan, res.timetable.offset
    inline = [n for n in order if plan.sched(n).thread_group == plan.caller_group]
    workers = [n for n in order if n not in inline]
    for part in (inline, workers):
        assert [offset[n] for n in part] == sorted(offset[n] for n in part)
    for w in workers:
        before = [g for g in inline if pos[g] < pos[w]]
        assert not before or offset[before[-1]] + problem.dur(before[-1]) <= offset[w]


def test_cpsat_gives_its_solves_no_more_than_the_budget_left(monkeypatch):
    """Each solve's limit is what is left of ``time_limit_s`` by the search's clock; the depth refinement
    at the best period takes at most ``max(0.5 s, 20 %)`` more. Checked on a fake clock that each solve
    advances by its whole limit (the worst case): the search's clock never passes the budget plus that."""
    import autosched.search.cpsat as cpsat
    from ortools.sat.python import cp_model
    from swpipe.testing.plan_space import random_graph
    from conftest import FakeClock

    clock = FakeClock()
    limits = []
    solve = cp_model.CpSolver.Solve

    def timed_solve(solver, *args, **kwargs):  # OR-Tools' solver, as every CP-SAT solve calls it
        limit = solver.parameters.max_time_in_seconds
        limits.append(limit)
        got = solve(solver, *args, **kwargs)
        clock.advance(limit)
        return got

    monkeypatch.setattr(cpsat, "time", clock)
    monkeypatch.setattr(cp_model.CpSolver, "Solve", timed_solve)
    graph, costs = random_graph(7, 40)
    problem = make_problem(graph, costs, Constraints(max_depth=3, max_threads=2))
    res = solve_cpsat(problem, time_limit_s=2.0)
    assert limits and all(limit > 0 for limit in limits)
    assert clock.now <= 2.0 + max(0.5, 0.2 * 2.0) + 1e-9, limits
    assert res.status in ("OPTIMAL", "FEASIBLE", "UNKNOWN")
    if res.plan is not None:
        validate(res.plan)


def test_brute_force_space_is_exactly_the_valid_plans():
    problem = _problem(7, 4, 0.4, 2, 2, False)
    plans = list(enumerate_plans(problem))
    for plan in plans:
        validate(plan)
        assert plan.pipeline_depth <= 2
        assert len({plan.sched(n).thread_group for n in plan.task_names}) <= 2
    keys = {(tuple(plan.stage(n) for n in problem.names), tuple(map(str, plan.enqueue_order)),
             tuple(plan.sched(n).thread_group for n in problem.names), plan.caller_group) for plan in plans}
    assert len(keys) == len(plans)


def _cuda_problem():
    # device work on two streams, a communicator shared across them, a recurrence A(i) <- D(i-1)
    costs = CostModel({"A": TaskCost(0.001, 0.003), "B": TaskCost(0.001, 0.002),
                       "C": TaskCost(0.0, 0.004, ("comm:nccl",)), "D": TaskCost(0.001, 0.001, ("comm:nccl",))})
    graph = (["A", "B", "C", "D"], [("C", "A"), ("D", "B")], [("A", "D", 1)])
    return make_problem(graph, costs, Constraints(device="cuda", streams=[None, "side"], max_depth=2, max_threads=1))


@pytest.mark.slow
def test_cpsat_cuda_period_equals_brute_force():
    problem = _cuda_problem()
    score = sim_scorer(problem, 24)
    truth = brute_force(problem, score)
    res = solve_cpsat(problem, time_limit_s=30)
    assert res.status == "OPTIMAL"
    assert score(res.plan)[0] == pytest.approx(truth.period, rel=1e-9)
    assert {res.plan.sched(n).stream for n in problem.names} <= {None, "side"}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 4])
def test_cpsat_period_equals_brute_force_on_five_tasks(seed):
    problem = _problem(seed, 5, 0.5, 3, 2, False)
    score = sim_scorer(problem, 24)
    truth = brute_force(problem, score)
    res = solve_cpsat(problem, time_limit_s=30)
    assert res.status == "OPTIMAL"
    assert score(res.plan)[0] == pytest.approx(truth.period, rel=1e-9)
