"""Brute force over a small search problem's whole plan space, and random problems: the truth tests hold the searchers to.

Not part of the search: ``auto_schedule`` never enumerates. The tests and ``benchmarks/search_quality.py``
compare the searchers (:func:`autosched.search.beam.beam_search`, :func:`autosched.search.cpsat.solve_cpsat`)
with :func:`brute_force` on problems of a handful of tasks, and time them on :func:`random_graph`.

The space is exactly the one the searchers cover (:mod:`autosched.search.problem`):

* stage vectors allowed by the stage rules (docs/semantics.md), the depth cap and frozen
  stages (:func:`autosched.search.problem.stage_assignments`: without frozen stages, vectors whose
  smallest stage is above 0 are skipped: they relabel periods, same timing, deeper pipeline);
* thread maps: every partition of the tasks into at most ``max_threads``
  groups (frozen groups respected); group names do not change timing;
* the caller's thread: each group of the map inline, or none (only the frozen
  caller's group when there is one; none when the problem has no caller's
  group);
* streams: every combination of each task's stream choices;
* enqueue orders: every topological order of the period-local graph. Orders
  that put each thread's queue and the sequencer in the same sequence, and
  hand each worker's task off after the same task of the inline group, behave
  the same (the rest of a period is enqueued at one instant), so one per class
  is scored, unless tasks share a communicator or PCIe (then first-come ties
  may differ and every order is scored).

Only for a handful of tasks: the count grows as depth^n x Bell(n) x (n + 1) x n!.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import networkx as nx

from swpipe_core.order import period_local_graph
from swpipe_core.plan import PipelinePlan

from autosched.model.costs import CostModel, TaskCost
from autosched.search.plans import build_plan
from autosched.search.problem import Problem, stage_assignments
from autosched.search.maps import inline_choices

__all__ = ["thread_maps", "enumerate_plans", "brute_force", "BruteForceResult", "random_problem", "random_graph"]


def thread_maps(problem: Problem) -> Iterator[Dict[str, str]]:
    """Every partition of the tasks into at most ``max_threads`` groups, frozen groups respected.

    Yields
    ------
    dict
        ``{task: group label}`` (labels ``g0, g1, ...`` or the frozen names).

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> from swpipe import Constraints
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> c = NS(tasks={n: NS(host_s=1.0, device_s=0.0, resources=()) for n in "ABC"})
    >>> p = make_problem((list("ABC"), []), c, Constraints(max_threads=2))
    >>> len(list(thread_maps(p)))   # {ABC}, {A|BC}, {AB|C}, {AC|B}
    4
    """
    names = problem.names
    fixed = sorted(set(problem.frozen_group.values()))

    def rec(i: int, labels: List[str], opened: int) -> Iterator[Dict[str, str]]:
        if i == len(names):
            yield dict(zip(names, labels))
            return
        n = names[i]
        if n in problem.frozen_group:
            yield from rec(i + 1, labels + [problem.frozen_group[n]], opened)
            return
        for g in fixed:
            yield from rec(i + 1, labels + [g], opened)
        for j in range(opened):
            yield from rec(i + 1, labels + [f"g{j}"], opened)
        if len(fixed) + opened < problem.max_threads:
            yield from rec(i + 1, labels + [f"g{opened}"], opened + 1)

    yield from rec(0, [], 0)


def _order_key(problem: Problem, plan: PipelinePlan, order: Tuple[str, ...], exact: bool) -> tuple:
    if exact:
        return order
    by_group: Dict[str, List[str]] = {}
    for n in order:
        by_group.setdefault(plan.sched(n).thread_group, []).append(n)
    ordered = tuple(n for n in order if n in problem.ordered)
    handoffs, last = [], None  # each worker's task with the inline task the main thread runs before handing it off
    for n in order:
        if plan.sched(n).thread_group == plan.caller_group:
            last = n
        else:
            handoffs.append((n, last))
    return tuple(sorted((g, tuple(v)) for g, v in by_group.items())) + (ordered, tuple(sorted(handoffs, key=str)))


def enumerate_plans(problem: Problem) -> Iterator[PipelinePlan]:
    """Every distinct plan of the space (see the module docstring).

    Yields
    ------
    PipelinePlan
        Each with an explicit ``enqueue_order``; each passes ``validate``.

    Examples
    --------
    >>> from swpipe import Constraints, CostModel, TaskCost
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2), time_unit_s=1e-3)
    >>> len(list(enumerate_plans(p)))   # stages (0,0): 2 + 3; (0,1): one thread 2 x 2 orders, two threads 1 + 2 + 2
    14
    """

    exact = any(problem.comm[n] is not None for n in problem.names) or bool(problem.pcie)
    stream_sets = list(itertools.product(*(problem.stream_choices[n] for n in problem.names)))
    groups = list(thread_maps(problem))
    for stage in stage_assignments(problem):
        for smap in stream_sets:
            stream = dict(zip(problem.names, smap))
            for group in groups:
                labels = tuple(group[n] for n in problem.names)
                for anchor in inline_choices(problem, labels):
                    inline = group[anchor] if anchor is not None else None
                    base = build_plan(problem, stage, group, stream, inline=inline)
                    seen = set()
                    for order in nx.all_topological_sorts(period_local_graph(base)):
                        key = _order_key(problem, base, tuple(order), exact)
                        if key in seen:
                            continue
                        seen.add(key)
                        yield base.replace(enqueue_order=list(order), pipeline_depth=base.pipeline_depth)


@dataclass
class BruteForceResult:
    """The best simulated period over the space, a plan reaching it, and how many plans were scored."""

    period: float
    plan: PipelinePlan
    count: int


def brute_force(problem: Problem, scorer: Callable[[PipelinePlan], Tuple[float, float]],
                limit: Optional[int] = 200_000) -> BruteForceResult:
    """Score every plan of the space; the minimum period is the ground truth.

    Parameters
    ----------
    problem : Problem
    scorer : callable
        ``plan -> (period_s, latency_s)``, e.g. :func:`autosched.search.scoring.sim_scorer`.
    limit : int, optional
        Refuse spaces larger than this many plans.

    Returns
    -------
    BruteForceResult

    Raises
    ------
    ValueError
        The space exceeds ``limit`` plans.

    Examples
    --------
    >>> from swpipe import Constraints, CostModel, TaskCost
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2), time_unit_s=1e-3)
    >>> from autosched.search.scoring import sim_scorer
    >>> truth = brute_force(p, sim_scorer(p, 20))
    >>> round(truth.period * 1e3, 6), truth.count
    (3.0, 14)
    """
    best_period, best_plan, count = math.inf, None, 0
    for plan in enumerate_plans(problem):
        count += 1
        if limit is not None and count > limit:
            raise ValueError(f"the plan space has more than {limit} plans; brute force is for small problems")
        period, _ = scorer(plan)
        if period < best_period:
            best_period, best_plan = period, plan
    if best_plan is None:
        raise ValueError("the plan space is empty (frozen stages and caps leave no valid plan)")
    return BruteForceResult(best_period, best_plan, count)


def random_problem(seed: int, n: int = 4, p_edge: float = 0.4, tags: bool = False) -> Tuple[tuple, CostModel]:
    """A small random task graph with whole-millisecond costs (for brute-force comparisons).

    Tasks ``T0 .. T{n-1}``; each pair ``(Ti, Tj)``, ``i < j``, is an intra
    dependency ``Tj waits Ti`` with probability ``p_edge``; with probability
    0.6 one inter-iteration dependency ``Ti waits Tj`` of distance 1 or 2 closes
    a recurrence; ``tags`` puts two tasks on one communicator and one on PCIe.

    Returns
    -------
    ((tasks, intra_deps, inter_deps), CostModel)

    Examples
    --------
    >>> (tasks, intra, inter), costs = random_problem(3, 4, 0.8)
    >>> tasks, inter, costs["T3"].host_s
    (['T0', 'T1', 'T2', 'T3'], [('T1', 'T3', 2)], 0.005)
    """
    rng = random.Random(seed)
    names = [f"T{i}" for i in range(n)]
    intra = [(names[j], names[i]) for i in range(n) for j in range(i + 1, n) if rng.random() < p_edge]
    inter = []
    if rng.random() < 0.6:
        i, j = sorted(rng.sample(range(n), 2))
        inter.append((names[i], names[j], rng.choice([1, 1, 2])))
    res: Dict[str, tuple] = {t: () for t in names}
    if tags:
        for t in rng.sample(names, 2):
            res[t] = ("comm:nccl",)
        res[rng.choice(names)] += ("pcie",)
    costs = CostModel({t: TaskCost(rng.randint(1, 5) * 1e-3, 0.0, res[t]) for t in names},
                      method="random_problem", notes=f"seed {seed}")
    return (names, intra, inter), costs


def random_graph(seed: int, n: int, cuda: bool = False) -> Tuple[tuple, CostModel]:
    """A larger random task graph shaped like a training step (for search-time benchmarks).

    Each task waits 1 to 3 of the 6 tasks declared before it; ``n // 10`` inter
    dependencies of distance 1 close recurrences; host costs 0.2..3 ms (and on
    ``cuda`` device costs 0..4 ms on tasks spread over three streams); a tenth
    of the tasks are collectives on one communicator.

    Returns
    -------
    ((tasks, intra_deps, inter_deps), CostModel)

    Examples
    --------
    >>> (tasks, intra, inter), costs = random_graph(0, 20)
    >>> len(tasks), len(inter), all(costs[t].host_s > 0 for t in tasks)
    (20, 2, True)
    """
    rng = random.Random(seed)
    names = [f"T{i:03d}" for i in range(n)]
    intra = []
    for j in range(1, n):
        k = rng.choice([1, 1, 2, 2, 3])
        for i in rng.sample(range(max(0, j - 6), j), min(k, j)):
            intra.append((names[j], names[i]))
    inter = []
    for _ in range(max(1, n // 10)):
        i, j = sorted(rng.sample(range(n), 2))
        inter.append((names[i], names[j], 1))
    tasks = {}
    for t in names:
        host = round(rng.uniform(0.2, 3.0) * 1e-3, 7)
        dev = round(rng.uniform(0.0, 4.0) * 1e-3, 7) if cuda else 0.0
        tags = ("comm:nccl",) if rng.random() < 0.1 else ()
        tasks[t] = TaskCost(host, dev, tags)
    return (names, intra, inter), CostModel(tasks, method="random_graph", notes=f"seed {seed}")
