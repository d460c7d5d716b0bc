"""The contract proven on the engine: its timelines obey it, and the simulator replays its runs.

Random plans (2-3 thread groups, stages 0-2, inter-iteration dependencies of
distance 1-2, some globally ordered tasks) of sleeping tasks run on the engine
with ``record_timeline=True``. The timeline must obey the contract
(:func:`conftest.check_contract`); the simulator, given the cost model measured
from that timeline (``CostModel.from_timeline``), must obey it too and
reproduce each thread group's steady-state order of (task, iteration) exactly.
How close its period comes to the measured one is timing, not asserted here:
``benchmarks/contract_replay.py`` measures it (:func:`replay` gives both
periods). Hypothesis draws the plans, derandomised so CI is reproducible; a
fast subset runs by default, a larger one is marked slow.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import threading
import time
from typing import Any, Dict, List, Sequence, Tuple

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autosched.model.costs import CostModel, TaskCost
from autosched.model.simulate import simulate
from conftest import check_contract
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.order import period_local_graph
from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.validate import PlanError, validate

ITERS = 32
# The simulator's period against the measured one (median ~1-2%, worst ~6-9% over 20 plans) is measured side
# by side in benchmarks/contract_replay.py (docs/results.md); the tests check the orders and the contract.


def random_plan(rng: random.Random, caller_group: Any = "default") -> Tuple[PipelinePlan, Dict[str, float]]:
    """A valid random plan of 3-6 tasks and each task's sleep (seconds, 2-5 ms).

    The first thread group is named ``caller_group`` when it is a string, so the
    caller's group has tasks.
    """
    while True:
        n = rng.randint(3, 6)
        groups = ["g0", "g1", "g2"][: rng.randint(2, 3)]
        if isinstance(caller_group, str):
            groups[0] = caller_group
        names = [f"T{k}" for k in range(n)]
        stage = {t: rng.randint(0, 2) for t in names}
        group = {t: groups[k] if k < len(groups) else rng.choice(groups) for k, t in enumerate(names)}
        sched = {t: TaskSchedule(stage[t], thread_group=group[t], globally_ordered=rng.random() < 0.25)
                 for t in names}
        intra = [(names[k], names[j]) for k in range(n) for j in range(k)
                 if stage[names[j]] <= stage[names[k]] and rng.random() < 0.35]
        inter = []
        for _ in range(rng.randint(1, 2)):
            t, d, dist = rng.choice(names), rng.choice(names), rng.randint(1, 2)
            if stage[d] - stage[t] <= dist:
                inter.append((t, d, dist))
        plan = PipelinePlan(sched, intra, inter, caller_group=caller_group)
        try:
            validate(plan)
        except PlanError:
            continue
        return plan, {t: rng.choice([2.0, 3.0, 4.0, 5.0]) * 1e-3 for t in names}


def run_on_engine(plan: PipelinePlan, sleeps: Dict[str, float], iters: int = ITERS) -> Tuple[List[Any], bool]:
    """Run the plan's sleeping tasks; the timeline, and whether the caller's group ran on the calling thread."""
    caller_threads: List[bool] = []

    def sleeper(name: str):
        def fn(ctx) -> None:
            if plan.sched(name).thread_group == plan.caller_group:
                caller_threads.append(threading.current_thread() is threading.main_thread())
            time.sleep(sleeps[name])  # the workload: the task's length
        return fn

    bound = plan.bind({t: sleeper(t) for t in plan.task_names})
    with SWPipeline(bound, device="cpu", record_timeline=True) as pipe:
        pipe.run(range(iters))
        events = list(pipe.timeline)
    return events, bool(caller_threads) and all(caller_threads)


def measured_period(events: Sequence[Any], iters: int, depth: int, k: int = 4) -> float:
    """Median over the steady iterations of the mean spacing of ``k`` consecutive completions."""
    done: Dict[int, float] = {}
    for e in events:
        done[e.iteration] = max(done.get(e.iteration, 0.0), e.end)
    c = [done[i] for i in range(iters)]
    w0, w1 = max(depth, iters // 4), iters - depth
    return statistics.median((c[i + k] - c[i]) / k for i in range(w0, w1 - k + 1))


def group_orders(plan: PipelinePlan, events: Sequence[Any], first: int, last: int) -> Dict[str, List[Tuple[str, int]]]:
    """Each thread group's (task, iteration) in the order they started, for iterations first..last."""
    out: Dict[str, List[Tuple[str, int]]] = {}
    for e in sorted((e for e in events if e.kind == "host"), key=lambda e: (e.start, e.end)):
        if first <= e.iteration <= last:
            out.setdefault(e.thread_group, []).append((e.task, e.iteration))
    return out


def fit_task_overhead(iters: int = ITERS, repeats: int = 1) -> float:
    """The engine's hand-off per task on this machine: fitted once on a fixed plan that is not a random one.

    The simulator charges nothing for the hand-off between threads (queue, signal,
    wake-up) unless told; ``task_overhead_s`` is that constant, found by bisection so
    the calibration plan's simulated period matches its measured one (the fastest of
    ``repeats`` runs: load from other processes only ever slows a run).
    """
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="g0"), "B": TaskSchedule(1, thread_group="g1"),
                         "C": TaskSchedule(1, thread_group="g2"), "D": TaskSchedule(1, thread_group="g1")},
                        intra_iter_deps=[("B", "A"), ("C", "B"), ("D", "C")], caller_group=None)
    sleeps = {"A": 2e-3, "B": 1e-3, "C": 1.5e-3, "D": 1e-3}
    runs = [run_on_engine(plan, sleeps, iters)[0] for _ in range(repeats)]
    measured, events = min((measured_period(ev, iters, plan.pipeline_depth), ev) for ev in runs)
    costs = CostModel.from_timeline(events)
    lo, hi = 0.0, 2e-3
    for _ in range(25):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if simulate(plan, costs, iters, task_overhead_s=mid).period_s < measured else (lo, mid)
    return (lo + hi) / 2


def replay(plan: PipelinePlan, sleeps: Dict[str, float], task_overhead_s: float = 0.0) -> Dict[str, Any]:
    """Run on the engine, check both timelines, simulate from the measured costs; the figures."""
    events, inline = run_on_engine(plan, sleeps)
    check_contract(plan, events, ITERS)
    # the simulator models what the engine does: the caller's group inline when the engine runs it so
    sim_plan = plan if inline or plan.caller_group is None else plan.replace(caller_group=None)
    sim = simulate(sim_plan, CostModel.from_timeline(events), num_iterations=ITERS, task_overhead_s=task_overhead_s)
    check_contract(plan, sim.events, sim.num_iterations)
    depth = plan.pipeline_depth
    steady = (max(depth, ITERS // 4), ITERS - depth - 1)
    measured = measured_period(events, ITERS, depth)
    bare = simulate(sim_plan, CostModel.from_timeline(events), num_iterations=ITERS).period_s if task_overhead_s else sim.period_s
    return {"inline": inline, "measured": measured, "simulated": sim.period_s, "simulated_bare": bare,
            "error": sim.period_s / measured - 1.0,
            "engine_order": group_orders(plan, events, *steady), "sim_order": group_orders(plan, sim.events, *steady)}


def _check_replay(plan: PipelinePlan, sleeps: Dict[str, float]) -> None:
    """Both timelines obey the contract (:func:`replay` checks them); each group ran the same order in both."""
    out = replay(plan, sleeps)
    assert out["engine_order"] == out["sim_order"]


FAST = settings(derandomize=True, max_examples=3, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SLOW = settings(FAST, max_examples=20)


@pytest.mark.parametrize("caller_group", ["default", None])
@FAST
@given(rng=st.randoms(use_true_random=False))
def test_simulator_replays_the_engine_on_random_plans(caller_group, rng):
    _check_replay(*random_plan(rng, caller_group))


@pytest.mark.slow
@pytest.mark.parametrize("caller_group", ["default", None])
@SLOW
@given(rng=st.randoms(use_true_random=False))
def test_simulator_replays_the_engine_on_many_random_plans(caller_group, rng):
    _check_replay(*random_plan(rng, caller_group))


def late_hand_off_plan(rng: random.Random) -> Tuple[PipelinePlan, Dict[str, float]]:
    """A random plan with the caller's group and an explicit random enqueue order (a random topological
    order of the period-local graph) that places some worker task after a caller's task it does not wait for."""
    while True:
        plan, sleeps = random_plan(rng, "default")
        graph = period_local_graph(plan)
        indegree = dict(graph.in_degree())
        order: List[str] = []
        while len(order) < len(indegree):
            name = rng.choice(sorted(n for n, d in indegree.items() if d == 0 and n not in order))
            order.append(name)
            for succ in graph.successors(name):
                indegree[succ] -= 1
        plan = plan.replace(enqueue_order=order, pipeline_depth=plan.pipeline_depth)
        inline = [k for k, n in enumerate(order) if plan.sched(n).thread_group == "default"]
        late = [n for k, n in enumerate(order) if plan.sched(n).thread_group != "default" and inline and k > inline[0]
                and not any(nx.has_path(graph, order[j], n) for j in inline if j < k)]
        if late:
            return plan, sleeps


@pytest.mark.parametrize("seed", range(3))
def test_simulator_replays_late_hand_offs_on_the_engine(seed):
    # A worker task placed after a caller's task waits for it on the engine (check_contract) and in the model.
    _check_replay(*late_hand_off_plan(random.Random(seed)))


def test_contract_check_catches_a_timeline_out_of_enqueue_order():
    """The checker is not vacuous: swapping two tasks of one group is caught."""
    plan, sleeps = random_plan(random.Random(3), None)
    sim = simulate(plan, CostModel.from_timeline(run_on_engine(plan, sleeps, 12)[0]), num_iterations=12)
    check_contract(plan, sim.events, sim.num_iterations)
    g = plan.sched(plan.task_names[0]).thread_group
    mine = sorted((e for e in sim.events if e.kind == "host" and e.thread_group == g), key=lambda e: e.start)
    a, b = mine[len(mine) // 2], mine[len(mine) // 2 + 1]
    swapped = [e for e in sim.events if e is not a and e is not b]
    swapped += [dataclasses.replace(a, task=b.task, iteration=b.iteration),
                dataclasses.replace(b, task=a.task, iteration=a.iteration)]
    with pytest.raises(AssertionError):
        check_contract(plan, swapped, sim.num_iterations)


def test_contract_check_catches_too_many_iterations_in_flight():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
                        intra_iter_deps=[("B", "A")], caller_group=None)
    sim = simulate(plan, CostModel({"A": TaskCost(0.001), "B": TaskCost(0.003)}), num_iterations=10)
    check_contract(plan, sim.events, sim.num_iterations)
    # pretend A ran as soon as its thread was free (no progress barrier): A(i) ahead of iteration i-2's end
    early, t = [], 0.0
    for e in sorted(sim.events, key=lambda e: e.start):
        if e.task == "A":
            e = dataclasses.replace(e, start=t, end=t + 0.001)
            t += 0.001
        early.append(e)
    with pytest.raises(AssertionError, match="flight"):  # more iterations in flight than the depth allows
        check_contract(plan, early, sim.num_iterations)
