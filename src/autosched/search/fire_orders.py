"""Fire orders: topological orders of the intra-iteration DAG by a policy, the modulo scheduler's priorities.

A candidate's fire order (:class:`autosched.search.modulo.Candidate`) is the order in which the modulo list
scheduler (:mod:`autosched.search.modulo`) places its tasks: one of :data:`FIRE_POLICIES` (the longest chain
first, collectives early, ...), or one of them with two neighbours swapped (the beam's moves,
:mod:`autosched.search.neighbours`).
"""

from __future__ import annotations

from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

import networkx as nx

from swpipe_core.plan import StreamSpec, stream_name

from autosched.search.problem import Problem

__all__ = ["FIRE_POLICIES", "fire_order", "adjacent_swaps", "levels"]

FIRE_POLICIES = ("declared", "critical_chain_first", "longest_off_default_first", "collective_early",
                 "pcie_prep_early", "min_slack_first")


def levels(problem: Problem) -> Tuple[Dict[str, int], Dict[str, int]]:
    """Each task's top level (longest chain of work before it) and bottom level (its own and the longest after),
    in time units (memoised per problem)."""
    return problem.memo("levels", lambda: _compute_levels(problem))


def _compute_levels(problem: Problem) -> Tuple[Dict[str, int], Dict[str, int]]:
    top: Dict[str, int] = {}
    order = list(nx.topological_sort(problem.dag))
    for n in order:
        top[n] = max((top[p] + problem.dur(p) for p in problem.dag.predecessors(n)), default=0)
    bottom: Dict[str, int] = {}
    for n in reversed(order):
        bottom[n] = problem.dur(n) + max((bottom[s] for s in problem.dag.successors(n)), default=0)
    return top, bottom


def fire_order(problem: Problem, policy: str, stream: Optional[Mapping[str, StreamSpec]] = None) -> Tuple[str, ...]:
    """A topological order of the intra DAG by one of :data:`FIRE_POLICIES`.

    Parameters
    ----------
    problem : Problem
    policy : str
        ``declared``, ``critical_chain_first`` (longest remaining chain first),
        ``longest_off_default_first`` (off-default-stream work first, longest
        first), ``collective_early`` (collectives and what feeds them first),
        ``pcie_prep_early`` (PCIe copies and what feeds them first) or
        ``min_slack_first``.
    stream : dict, optional
        Streams to judge "off default" by (default: the problem's initial ones).

    Returns
    -------
    tuple of str

    Raises
    ------
    ValueError
        Unknown policy.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> from swpipe import Constraints
    >>> c = NS(tasks={"A": NS(host_s=1.0, device_s=0, resources=()), "B": NS(host_s=5.0, device_s=0, resources=()),
    ...               "C": NS(host_s=1.0, device_s=0, resources=())})
    >>> p = make_problem((["A", "B", "C"], [("C", "B")]), c, Constraints())
    >>> fire_order(p, "declared"), fire_order(p, "critical_chain_first")
    (('A', 'B', 'C'), ('B', 'A', 'C'))
    """
    stream = problem.init_stream if stream is None else stream
    key = ("fire_order", policy, tuple(stream_name(stream[n]) for n in problem.names))
    return problem.memo(key, lambda: _fire_order(problem, policy, stream))


def _fire_order(problem: Problem, policy: str, stream: Mapping[str, StreamSpec]) -> Tuple[str, ...]:
    idx = {n: i for i, n in enumerate(problem.names)}
    dag = problem.dag
    if policy == "declared":
        key = lambda n: idx[n]  # noqa: E731
    elif policy == "critical_chain_first":
        _, bottom = levels(problem)
        key = lambda n: (-bottom[n], idx[n])  # noqa: E731
    elif policy == "longest_off_default_first":
        key = lambda n: (stream[n] is None, -(problem.dur(n) + problem.ddur(n)), idx[n])  # noqa: E731
    elif policy in ("collective_early", "pcie_prep_early"):
        hot = ({n for n in problem.names if n in problem.ordered or problem.comm[n]} if policy == "collective_early"
               else set(problem.pcie))
        feeds = set(hot)
        for n in hot:
            feeds |= nx.ancestors(dag, n)
        key = lambda n: (n not in feeds, idx[n])  # noqa: E731
    elif policy == "min_slack_first":
        top, bottom = levels(problem)
        crit = max((top[n] + bottom[n] for n in problem.names), default=0)
        key = lambda n: (crit - top[n] - bottom[n], idx[n])  # noqa: E731
    else:
        raise ValueError(f"unknown fire-order policy {policy!r}; use one of {FIRE_POLICIES}")
    return tuple(nx.lexicographical_topological_sort(dag, key=key))


def adjacent_swaps(problem: Problem, priority: Sequence[str]) -> Iterable[Tuple[str, ...]]:
    """``priority`` with two neighbours swapped, each pair the intra DAG leaves unordered."""
    for i in range(len(priority) - 1):
        a, b = priority[i], priority[i + 1]
        if not problem.dag.has_edge(a, b):
            p = list(priority)
            p[i], p[i + 1] = b, a
            yield tuple(p)
