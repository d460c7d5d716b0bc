"""Seed plans for ``auto_schedule``: known good plans (e.g. TorchRec's) scored beside the search's own.

Seeds are labelled ``seed<k>`` (position in the list) or ``seed:<label>`` when
given as ``(label, plan)``. A seed must cover exactly the searched tasks and keep every dependency of the
task graph (it may add none that the graph lacks: a plan with other
dependencies computes something else). Seeds outside the constraints
(deeper than ``max_depth``, more thread groups than ``max_threads``) are
skipped with a note, like any plan the search could not return. A kept seed
is re-bound to the searched tasks' functions, so it runs as the search's own
plans do, and scored by the same simulator; the best seed replaces the
search's pick when it simulates strictly faster (then the rank rule of the
search: period, depth, latency).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple, Union

from swpipe_core.plan import PipelinePlan

from autosched.search.found import Found

if TYPE_CHECKING:  # the searchers' problem (it imports nothing from here)
    from autosched.search.problem import Problem

__all__ = ["Seed", "check_seeds", "best_seed", "with_dependencies_of"]

#: a seed: a plan, or ``(label, plan)``
Seed = Union[PipelinePlan, Tuple[str, PipelinePlan]]


def check_seeds(seeds: Optional[Sequence[Seed]], problem: "Problem") -> Tuple[List[Tuple[str, PipelinePlan]], List[str]]:
    """The usable seeds, labelled ``seed<k>``, and a note for each one skipped.

    Parameters
    ----------
    seeds : list of PipelinePlan, or of (label, PipelinePlan), optional
    problem : Problem
        From :func:`autosched.search.problem.make_problem`.

    Returns
    -------
    (list of (label, PipelinePlan), list of str)

    Raises
    ------
    TypeError
        A seed is not a PipelinePlan.
    ValueError
        A seed has other tasks or other dependencies than the task graph.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> from swpipe import TaskSchedule
    >>> prob = NS(names=("A", "B"), intra=(("B", "A"),), inter=(), tasks={}, max_depth=2, max_threads=2)
    >>> ok = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, [("B", "A")])
    >>> deep = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(2)}, [("B", "A")])
    >>> kept, notes = check_seeds([ok, ("deep", deep)], prob)
    >>> [k for k, _ in kept], notes
    (['seed0'], ['seed seed:deep skipped: depth 3 > max_depth 2'])
    """
    kept: List[Tuple[str, PipelinePlan]] = []
    notes: List[str] = []
    for k, seed in enumerate(seeds or ()):
        label, plan = (f"seed:{seed[0]}", seed[1]) if isinstance(seed, tuple) else (f"seed{k}", seed)
        if not isinstance(plan, PipelinePlan):
            raise TypeError(f"seed {label!r} is a {type(plan).__name__}, not a PipelinePlan")
        if sorted(plan.task_names) != sorted(problem.names):
            raise ValueError(f"seed {label!r} has tasks {sorted(plan.task_names)}, the search has "
                             f"{sorted(problem.names)}; give seeds over the same tasks")
        intra, inter = set(plan.intra_edges()), set(plan.inter_edges())
        want_intra, want_inter = set(problem.intra), set(problem.inter)
        if intra != want_intra or inter != want_inter:
            diff = sorted(map(str, (intra ^ want_intra) | (inter ^ want_inter)))
            raise ValueError(f"seed {label!r} has other dependencies than the task graph (differ: {diff}); "
                             "a seed must keep the graph's dependencies exactly")
        threads = len(plan.thread_groups)
        if plan.pipeline_depth > problem.max_depth:
            notes.append(f"seed {label} skipped: depth {plan.pipeline_depth} > max_depth {problem.max_depth}")
            continue
        if threads > problem.max_threads:
            notes.append(f"seed {label} skipped: {threads} thread groups > max_threads {problem.max_threads}")
            continue
        fns = {n: t.fn for n, t in problem.tasks.items() if callable(getattr(t, "fn", None))}
        kept.append((label, plan.bind(fns) if fns else plan))
    return kept, notes


def best_seed(seeds: Sequence[Tuple[str, PipelinePlan]], found: Found, unit_s: float) -> Found:
    """``found``, or the best seed if it ranks strictly better; every seed joins the candidates to verify.

    Parameters
    ----------
    seeds : list of (label, PipelinePlan)
        From :func:`check_seeds`.
    found : Found
        The searchers' best so far; its ``scorer`` scores the seeds.
    unit_s : float
        Periods are compared rounded to this clock (then depth, then latency).

    Returns
    -------
    Found
        A copy: the best seed's plan and figures (``method`` its label) when it ranks strictly better, the seeds
        added to ``pool`` and a note saying how they scored.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> a = PipelinePlan({"A": TaskSchedule(0)}); b = PipelinePlan({"A": TaskSchedule(0, thread_group="x")})
    >>> found = Found(a, 2.0, 2.0, "beam", scorer=lambda p: (1.0, 1.0) if p is b else (2.0, 2.0))
    >>> got = best_seed([("seed:s", b)], found, 1e-6)
    >>> got.method, got.period, got.notes
    ('seed:s', 1.0, ['seeds simulated: seed:s 1000.000 ms'])
    """
    best = dataclasses.replace(found, notes=list(found.notes), pool=list(found.pool) + list(seeds))

    def rank(p: float, d: int, lat: float) -> tuple:
        return (round(p / unit_s, 3), d, round(lat / unit_s, 3))

    scored = []
    for label, seed in seeds:
        try:
            period, latency = found.scorer(seed)
        except Exception as exc:  # noqa: BLE001 - a seed the simulator rejects is reported, not fatal
            best.notes.append(f"seed {label} could not be simulated: {exc}")
            continue
        scored.append((label, period))
        if rank(period, seed.pipeline_depth, latency) < rank(best.period, best.plan.pipeline_depth, best.latency):
            best = dataclasses.replace(best, plan=seed, period=period, latency=latency, method=label, timetable=None,
                                       candidate=None)
    if scored:
        best.notes.append("seeds simulated: " + ", ".join(f"{lab} {p * 1e3:.3f} ms" for lab, p in scored))
    return best


def with_dependencies_of(seed: PipelinePlan, graph: PipelinePlan) -> PipelinePlan:
    """``seed`` with the dependencies of ``graph`` it lacks added (a seed for ``auto_schedule(graph, ...)``).

    Adding a dependency only constrains when a task may run, so the seed still
    computes what it did; a seed with a dependency the graph lacks is refused
    (the search would drop it). E.g. a TorchRec plan as a seed for
    ``safe_task_plan``, which adds ``ZeroGrad(i)`` waiting ``OptimizerStep(i-1)``.

    Parameters
    ----------
    seed, graph : PipelinePlan
        Over the same tasks.

    Returns
    -------
    PipelinePlan

    Raises
    ------
    ValueError
        Other tasks, or a dependency of the seed that the graph does not have.

    Examples
    --------
    >>> from swpipe import TaskSchedule
    >>> seed = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, [("B", "A")])
    >>> graph = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0)}, [("B", "A")], [("A", "B", 1)])
    >>> with_dependencies_of(seed, graph).inter_edges()
    [('A', 'B', 1)]
    """
    if sorted(seed.task_names) != sorted(graph.task_names):
        raise ValueError(f"seed has tasks {sorted(seed.task_names)}, the graph {sorted(graph.task_names)}")
    if seed.same_period_deps or graph.same_period_deps:
        raise ValueError("same_period_deps: the search does not take plans with same-period dependencies (their "
                         "distance follows the stages it chooses); declare them as inter_iter_deps at fixed distances")
    extra = (set(seed.intra_edges()) - set(graph.intra_edges())) | (set(seed.inter_edges()) - set(graph.inter_edges()))
    if extra:
        raise ValueError(f"the seed has dependencies the graph lacks: {sorted(map(str, extra))}; "
                         "add them to the graph (the search keeps the graph's dependencies exactly)")
    intra = list(seed.intra_iter_deps) + [e for e in graph.intra_edges() if e not in set(seed.intra_edges())]
    inter = list(seed.inter_iter_deps) + [e for e in graph.inter_edges() if e not in set(seed.inter_edges())]
    return seed.replace(intra_iter_deps=intra, inter_iter_deps=inter, pipeline_depth=seed.pipeline_depth)
