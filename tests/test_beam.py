"""Beam search and its rooms (autosched.search.modulo, fire_orders, maps, stage enumeration): CP-SAT's optimum on small graphs."""

from __future__ import annotations

import itertools
import networkx as nx
import pytest

from autosched.search.problem import stage_assignments
from swpipe.testing.plan_space import brute_force, random_graph, random_problem
from autosched.search.problem import make_problem
from autosched.search.beam import beam_search
from autosched.search.scoring import sim_scorer
from autosched.search.bounds import recurrence_bound
from autosched.search.found import Candidate
from autosched.search.modulo import modulo_schedule
from autosched.search.fire_orders import FIRE_POLICIES, fire_order
from autosched.search.maps import thread_presets
from autosched.model.costs import CostModel, TaskCost
from autosched.search.cpsat import solve_cpsat
from autosched.search.options import Constraints
from swpipe_core.validate import validate

SMALL = [
    (3, 4, 0.7, 2, 3, False),
    (9, 4, 0.7, 2, 3, False),
    (2, 4, 0.7, 2, 3, False),
    (3, 4, 0.8, 3, 3, False),
    (4, 4, 0.8, 3, 3, False),
    (6, 4, 0.8, 3, 3, False),
    (0, 5, 0.5, 3, 2, False),
    (3, 4, 0.7, 2, 2, True),
]


def _problem(seed, n, pe, depth, threads, tags):
    graph, costs = random_problem(seed, n, pe, tags)
    return make_problem(graph, costs, Constraints(max_depth=depth, max_threads=threads))


@pytest.mark.parametrize("case", SMALL, ids=[f"seed{c[0]}-n{c[1]}-d{c[3]}-t{c[4]}{'-tags' if c[5] else ''}" for c in SMALL])
def test_beam_period_equals_cpsat(case):
    problem = _problem(*case)
    score = sim_scorer(problem, 24)
    exact = solve_cpsat(problem, time_limit_s=30)
    assert exact.status == "OPTIMAL"
    found = beam_search(problem, time_limit_s=30, seed=0)
    validate(found.plan)
    assert score(found.plan)[0] == pytest.approx(score(exact.plan)[0], rel=1e-9)


def test_modulo_schedule_keeps_at_most_cores_host_parts_at_once():
    graph, costs = random_graph(3, 24)
    pooled = CostModel(costs.tasks, cores=2)
    problem = make_problem(graph, pooled, Constraints(max_depth=3, max_threads=3))
    group = dict(zip(problem.names, [f"g{k % 3}" for k in range(len(problem.names))]))
    prio = fire_order(problem, "critical_chain_first")
    work = sum(problem.dur(n) for n in problem.names)
    assert modulo_schedule(problem, group, problem.init_stream, prio, -(-work // 2) - 1) is None
    tt, ii = None, -(-work // 2)
    while tt is None:
        tt = modulo_schedule(problem, group, problem.init_stream, prio, ii)
        ii += max(1, ii // 100)
    for x in range(tt.ii):   # every point of the circle
        running = sum(1 for n in problem.names for k in (0, 1)
                      if tt.start[n] % tt.ii <= x + k * tt.ii < tt.start[n] % tt.ii + problem.dur(n))
        assert running <= 2, x


def _overlap_mod(a, da, b, db, ii):
    return any(a + k * ii < b + db and b < a + k * ii + da for k in (-1, 0, 1))


def test_modulo_schedule_never_overlaps_a_thread_and_keeps_dependencies():
    graph, costs = random_graph(3, 24)
    problem = make_problem(graph, costs, Constraints(max_depth=3, max_threads=2))
    group = dict(zip(problem.names, thread_presets(problem, problem.init_stream)["balanced"]))
    prio = fire_order(problem, "critical_chain_first")
    tt = None
    ii = max(sum(problem.dur(n) for n in problem.names) // 2, recurrence_bound(problem))
    while tt is None:
        tt = modulo_schedule(problem, group, problem.init_stream, prio, ii)
        ii += max(1, ii // 100)
    for a, b in itertools.combinations(problem.names, 2):
        if group[a] == group[b]:
            assert not _overlap_mod(tt.start[a], problem.dur(a), tt.start[b], problem.dur(b), tt.ii), (a, b)
    for t in problem.names:
        for d, n in problem.preds(t):
            assert tt.start[t] >= tt.start[d] + problem.dur(d) - tt.ii * n
        assert tt.stage[t] == tt.start[t] // tt.ii < 3
    # progress barrier: period p + depth is enqueued only when iteration p is done
    depth = max(tt.stage.values()) + 1
    end = max(tt.start[t] + problem.dur(t) for t in problem.names)
    assert min(tt.offset.values()) >= end - tt.ii * depth


POOLED = [c for c in SMALL if c[4] == 3][:3]


@pytest.mark.parametrize("case", POOLED, ids=[f"seed{c[0]}-n{c[1]}-d{c[3]}" for c in POOLED])
def test_beam_and_cpsat_agree_with_brute_force_under_a_core_pool(case):
    seed, n, pe, depth, threads, tags = case
    graph, costs = random_problem(seed, n, pe, tags)
    problem = make_problem(graph, CostModel(costs.tasks, cores=2), Constraints(max_depth=depth, max_threads=threads))
    score = sim_scorer(problem, 24)
    truth = brute_force(problem, score)
    exact = solve_cpsat(problem, time_limit_s=30)
    assert exact.status == "OPTIMAL"
    assert score(exact.plan)[0] == pytest.approx(truth.period, rel=1e-9)
    assert exact.model_period == pytest.approx(truth.period, rel=1e-9)
    found = beam_search(problem, time_limit_s=30, seed=0)
    assert score(found.plan)[0] == pytest.approx(truth.period, rel=1e-9)
    # without the pool the same problem is faster: the pool binds here
    free = make_problem(graph, costs, Constraints(max_depth=depth, max_threads=threads))
    assert solve_cpsat(free, time_limit_s=30).model_period < truth.period


@pytest.mark.parametrize("policy", FIRE_POLICIES)
def test_fire_orders_are_topological(policy):
    graph, costs = random_graph(5, 30, cuda=True)
    problem = make_problem(graph, costs, Constraints(device="cuda", streams=[None, "memcpy"]))
    order = fire_order(problem, policy)
    pos = {n: i for i, n in enumerate(order)}
    assert sorted(order) == sorted(problem.names)
    assert all(pos[d] < pos[t] for t, d in problem.intra)


def test_critical_chain_first_puts_the_long_chain_first():
    costs = CostModel({"short": TaskCost(0.001), "long1": TaskCost(0.005), "long2": TaskCost(0.005)})
    problem = make_problem((["short", "long1", "long2"], [("long2", "long1")]), costs, Constraints())
    assert fire_order(problem, "critical_chain_first") == ("long1", "long2", "short")
    assert fire_order(problem, "declared") == ("short", "long1", "long2")


def test_thread_presets_stay_within_max_threads_and_keep_frozen_groups():
    graph, costs = random_graph(2, 15)
    frozen = {"T000": {"thread_group": "main"}, "T014": {"thread_group": "main"}}
    for threads in (1, 2, 3):
        problem = make_problem(graph, costs, Constraints(max_threads=threads, frozen=frozen))
        presets = thread_presets(problem, problem.init_stream)
        assert {"single", "balanced"} <= set(presets)
        for name, labels in presets.items():
            assert len(set(labels)) <= threads, name
            assert labels[0] == "main" and labels[-1] == "main", name


def test_stage_assignments_are_exactly_the_corollary_respecting_ones():
    (tasks, intra, inter), costs = random_problem(3, 4, 0.7)
    problem = make_problem((tasks, intra, inter), costs, Constraints(max_depth=3))
    got = {tuple(s[n] for n in problem.names) for s in stage_assignments(problem)}
    want = set()
    for vec in itertools.product(range(3), repeat=4):
        s = dict(zip(problem.names, vec))
        if min(vec) == 0 and problem.stage_ok(s):
            want.add(vec)
    assert got == want and got


def test_beam_honours_its_time_limit(monkeypatch):
    """Past its deadline the search simulates at most one more candidate and returns its best plan so far.

    The search's clock is a fake one that each simulation advances by 1 s: a 10 s limit (deadline 9.5 s,
    half a second kept for the last simulation) allows ten simulations, and one more past the deadline.
    """
    import autosched.search.beam as beam
    from conftest import FakeClock

    clock = FakeClock()
    monkeypatch.setattr(beam, "time", clock)
    graph, costs = random_graph(11, 40)
    problem = make_problem(graph, costs, Constraints(max_depth=3, max_threads=2))
    score = sim_scorer(problem)
    scored = []

    def one_second_each(plan):
        scored.append(plan)
        clock.advance(1.0)
        return score(plan)

    res = beam_search(problem, time_limit_s=10.0, rounds=1000, patience=1000, seed=1, scorer=one_second_each)
    assert res.stopped.startswith("time")  # by its time limit, not by rounds or patience
    assert 1 <= len(scored) <= 11, len(scored)
    validate(res.plan)
    assert res.period <= sum(problem.thread_time(n) for n in problem.names) + 1e-12


def test_beam_is_deterministic_for_a_seed():
    graph, costs = random_graph(4, 12)
    problem = make_problem(graph, costs, Constraints(max_depth=3, max_threads=2))
    a = beam_search(problem, rounds=2, time_limit_s=60, seed=5)
    b = beam_search(problem, rounds=2, time_limit_s=60, seed=5)
    assert a.plan.enqueue_order == b.plan.enqueue_order
    assert a.period == b.period


def test_beam_progress_bar_reports_rounds(capsys):
    problem = _problem(3, 4, 0.7, 2, 3, False)
    beam_search(problem, rounds=2, patience=5, time_limit_s=30, progress=True)
    err = capsys.readouterr().err
    assert "beam" in err.split() and "round" in err


def test_beam_candidate_from_each_preset_is_valid():
    graph, costs = random_graph(8, 12)
    problem = make_problem(graph, costs, Constraints(max_depth=2, max_threads=3))
    stream = tuple(problem.init_stream[n] for n in problem.names)
    rec = recurrence_bound(problem)
    from autosched.search.scoring import Evaluator

    ev = Evaluator(problem, sim_scorer(problem, 16), rec)
    for name, groups in thread_presets(problem, problem.init_stream).items():
        sc = ev.evaluate(Candidate(groups, stream, fire_order(problem, "critical_chain_first")))
        assert sc is not None, name
        validate(sc.plan)
        assert sc.plan.pipeline_depth <= 2
        # the timetable is a valid schedule of the engine, so the simulation is never slower
        assert sc.period <= sc.ii * problem.unit_s * (1 + 1e-9)
        assert nx.is_directed_acyclic_graph(problem.dag)


def test_beam_period_equals_cpsat_on_cuda_streams():
    costs = CostModel({"A": TaskCost(0.001, 0.003), "B": TaskCost(0.001, 0.002),
                       "C": TaskCost(0.0, 0.004, ("comm:nccl",)), "D": TaskCost(0.001, 0.001, ("comm:nccl",))})
    graph = (["A", "B", "C", "D"], [("C", "A"), ("D", "B")], [("A", "D", 1)])
    problem = make_problem(graph, costs, Constraints(device="cuda", streams=[None, "side"], max_depth=2, max_threads=1))
    score = sim_scorer(problem, 24)
    exact = solve_cpsat(problem, time_limit_s=30)
    found = beam_search(problem, time_limit_s=30)
    assert exact.status == "OPTIMAL"
    assert score(found.plan)[0] == pytest.approx(score(exact.plan)[0], rel=1e-9)
    assert score(exact.plan)[0] == pytest.approx(exact.model_period, rel=1e-9)   # the CUDA model is exact here
