"""The beam search's moves: named thread maps and stream maps, fire-order policies, the caller's thread.

Thread maps (one group, one per stream, one per task, I/O vs compute, ...) are
capped at ``max_threads``; stream maps (CUDA only: on CPU a stream is a name);
fire orders are topological orders of the intra-iteration DAG chosen by a
policy (:data:`FIRE_POLICIES`), used as list-scheduling priorities by
:mod:`autosched.search.modulo`. A candidate names the group it runs on the caller's
thread by that group's first task (:func:`inline_anchor`); the beam's last
phase reads its best plans with each choice (:func:`inline_choices`).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import networkx as nx

from swpipe_core.plan import stream_name

from autosched.search.problem import Problem

__all__ = ["FIRE_POLICIES", "fire_order", "thread_presets", "stream_presets", "inline_anchor", "busiest_anchor",
           "inline_choices"]

FIRE_POLICIES = ("declared", "critical_chain_first", "longest_off_default_first", "collective_early",
                 "pcie_prep_early", "min_slack_first")


# --------------------------------------------------------------------------- fire orders


def _levels(problem: Problem) -> Tuple[Dict[str, int], Dict[str, int]]:
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


def fire_order(problem: Problem, policy: str, stream: Optional[Mapping[str, Any]] = None) -> Tuple[str, ...]:
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
    >>> from autosched.search.problem import make_problem
    >>> from autosched.search.options import Constraints
    >>> c = NS(tasks={"A": NS(host_s=1.0, device_s=0, resources=()), "B": NS(host_s=5.0, device_s=0, resources=()),
    ...               "C": NS(host_s=1.0, device_s=0, resources=())})
    >>> p = make_problem((["A", "B", "C"], [("C", "B")]), c, Constraints())
    >>> fire_order(p, "declared"), fire_order(p, "critical_chain_first")
    (('A', 'B', 'C'), ('B', 'A', 'C'))
    """
    stream = problem.init_stream if stream is None else stream
    key = ("fire_order", policy, tuple(stream_name(stream[n]) for n in problem.names))
    return problem.memo(key, lambda: _fire_order(problem, policy, stream))


def _fire_order(problem: Problem, policy: str, stream: Mapping[str, Any]) -> Tuple[str, ...]:
    idx = {n: i for i, n in enumerate(problem.names)}
    dag = problem.dag
    if policy == "declared":
        key = lambda n: idx[n]  # noqa: E731
    elif policy == "critical_chain_first":
        _, bottom = _levels(problem)
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
        top, bottom = _levels(problem)
        crit = max((top[n] + bottom[n] for n in problem.names), default=0)
        key = lambda n: (crit - top[n] - bottom[n], idx[n])  # noqa: E731
    else:
        raise ValueError(f"unknown fire-order policy {policy!r}; use one of {FIRE_POLICIES}")
    return tuple(nx.lexicographical_topological_sort(dag, key=key))


def _adjacent_swaps(problem: Problem, priority: Sequence[str]) -> Iterable[Tuple[str, ...]]:
    for i in range(len(priority) - 1):
        a, b = priority[i], priority[i + 1]
        if not problem.dag.has_edge(a, b):
            p = list(priority)
            p[i], p[i + 1] = b, a
            yield tuple(p)


# --------------------------------------------------------------------------- thread maps


def _canonical_groups(problem: Problem, labels: Mapping[str, str]) -> Tuple[str, ...]:
    """Relabel free groups ``g0, g1, ...`` by first use; frozen group names stay."""
    fixed = set(problem.frozen_group.values())
    rename: Dict[str, str] = {}
    out = []
    for n in problem.names:
        lab = problem.frozen_group.get(n, labels[n])
        if lab in fixed:
            out.append(lab)
            continue
        if lab not in rename:
            rename[lab] = f"g{len(rename)}"
        out.append(rename[lab])
    return tuple(out)


def inline_anchor(problem: Problem, labels: Sequence[str], task: Optional[str]) -> Optional[str]:
    """How a candidate names the group on the caller's thread: its first task in ``problem.names`` order.

    ``task`` is any task of that group (None: every group has a worker). The
    frozen caller's group is named whatever ``task`` says: it always runs inline;
    a group frozen under another name never does (None).

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> from autosched.search.problem import make_problem
    >>> from autosched.search.options import Constraints
    >>> c = NS(tasks={n: NS(host_s=1.0, device_s=0, resources=()) for n in "ABC"})
    >>> p = make_problem((["A", "B", "C"], []), c, Constraints())
    >>> inline_anchor(p, ("g0", "g1", "g1"), "C"), inline_anchor(p, ("g0", "g1", "g1"), None)
    ('B', None)
    """
    names = problem.names
    forced = problem.forced_caller
    if forced is not None:
        return next(n for n, g in zip(names, labels) if g == forced)
    if task is None:
        return None
    group = labels[names.index(task)]
    if group in problem.frozen_group.values():  # frozen under another name: it keeps that name, and its worker
        return None
    return next(n for n, g in zip(names, labels) if g == group)


def busiest_anchor(problem: Problem, labels: Sequence[str]) -> Optional[str]:
    """The anchor (:func:`inline_anchor`) of the group with the most thread time, or None when no group may run inline.

    The group a new thread map starts with on the caller's thread: the main
    thread then carries the most work, as a hand-written loop's does.
    """
    if problem.caller_group is None:
        return None
    if problem.forced_caller is not None:
        return inline_anchor(problem, labels, None)
    fixed = set(problem.frozen_group.values())
    load: Dict[str, int] = {}
    for n, g in zip(problem.names, labels):
        if g not in fixed:  # a group frozen under another name keeps it, and a worker
            load[g] = load.get(g, 0) + problem.dur(n)
    if not load:
        return None
    busiest = min(load, key=lambda g: (-load[g], labels.index(g)))
    return inline_anchor(problem, labels, problem.names[labels.index(busiest)])


def inline_choices(problem: Problem, labels: Sequence[str]) -> Tuple[Optional[str], ...]:
    """Every choice of the caller's thread for a thread map: each group's anchor, and None (all workers).

    Only the frozen caller's group when there is one; only None when the problem rules it out. A group
    frozen under another name is never a choice: it keeps that name, and its worker.
    """
    if problem.caller_group is None:
        return (None,)
    if problem.forced_caller is not None:
        return (inline_anchor(problem, labels, None),)
    fixed = set(problem.frozen_group.values())
    firsts = []
    for n, g in zip(problem.names, labels):
        if g not in fixed and all(labels[problem.names.index(f)] != g for f in firsts):
            firsts.append(n)
    return tuple(firsts) + (None,)


def _cap_groups(problem: Problem, labels: Dict[str, str]) -> Dict[str, str]:
    """Merge the lightest free groups until at most ``max_threads`` remain."""
    labels = {n: problem.frozen_group.get(n, labels[n]) for n in problem.names}
    fixed = set(problem.frozen_group.values())
    while len(set(labels.values())) > problem.max_threads:
        load: Dict[str, int] = {}
        for n, g in labels.items():
            load[g] = load.get(g, 0) + problem.dur(n)
        free = sorted((g for g in load if g not in fixed), key=lambda g: (load[g], g))
        if not free:
            break
        victim = free[0]
        target = min((g for g in load if g != victim), key=lambda g: (load[g], g))
        labels = {n: (target if g == victim else g) for n, g in labels.items()}
    return labels


def thread_presets(problem: Problem, stream: Mapping[str, Any]) -> Dict[str, Tuple[str, ...]]:
    """Named thread maps (one thread, one per stream, one per stage, ...), each within ``max_threads`` (memoised per stream map).

    Parameters
    ----------
    problem : Problem
    stream : dict
        Current stream per task (``by_stream`` follows it).

    Returns
    -------
    dict
        ``{preset_name: canonical group labels}``; presets that would need more
        threads than allowed are reduced by merging their lightest groups
        (``per_task`` is dropped instead).

    Examples
    --------
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem
    >>> from autosched.search.options import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2), time_unit_s=1e-3)
    >>> presets = thread_presets(p, p.init_stream)
    >>> presets["single"], presets["per_task"], presets["balanced"]
    (('g0', 'g0'), ('g0', 'g1'), ('g0', 'g1'))
    """
    key = ("thread_presets", tuple(stream_name(stream[n]) for n in problem.names))
    return dict(problem.memo(key, lambda: _thread_presets(problem, stream)))


def _thread_presets(problem: Problem, stream: Mapping[str, Any]) -> Dict[str, Tuple[str, ...]]:
    names = problem.names
    out: Dict[str, Dict[str, str]] = {}
    fixed = sorted(set(problem.frozen_group.values()))
    home = fixed[0] if fixed else "main"
    out["single"] = {n: home for n in names}
    out["by_stream"] = {n: stream_name(stream[n]) for n in names}
    if len(names) <= problem.max_threads:
        out["per_task"] = {n: n for n in names}
    io = {n for n in names if stream[n] is not None or n in problem.pcie}
    out["io_compute"] = {n: ("io" if n in io else "compute") for n in names}
    coll = {n for n in names if n in problem.ordered or problem.comm[n]}
    out["io_collective_compute"] = {n: ("coll" if n in coll else "io" if n in io else "compute") for n in names}
    # balanced: longest-processing-time first onto the least loaded group
    load = [0] * problem.max_threads
    bal: Dict[str, str] = {}
    for n in sorted(names, key=lambda n: (-problem.dur(n), names.index(n))):
        k = min(range(len(load)), key=lambda i: (load[i], i))
        load[k] += problem.dur(n)
        bal[n] = f"b{k}"
    out["balanced"] = bal
    # critical chain alone, the rest balanced over the other groups
    _, bottom = _levels(problem)
    chain, n = [], max(names, key=lambda x: (bottom[x], -names.index(x)), default=None)
    top_nodes = [x for x in names if problem.dag.in_degree(x) == 0]
    if top_nodes:
        n = max(top_nodes, key=lambda x: (bottom[x], -names.index(x)))
        while n is not None:
            chain.append(n)
            succ = list(problem.dag.successors(n))
            n = max(succ, key=lambda x: (bottom[x], -names.index(x))) if succ else None
        out["critical_chain"] = {x: ("chain" if x in chain else bal[x]) for x in names}
    result: Dict[str, Tuple[str, ...]] = {}
    for name, labels in out.items():
        capped = _cap_groups(problem, labels)
        if len(set(capped.values())) <= problem.max_threads:
            result[name] = _canonical_groups(problem, capped)
    return result


def stream_presets(problem: Problem, stream: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Named stream maps for CUDA: ``given``, ``default`` (all on the default stream where allowed),
    ``balanced`` (longest device work first onto the least loaded allowed stream).

    Parameters
    ----------
    problem : Problem
    stream : dict
        The current stream map.

    Returns
    -------
    dict
        ``{preset_name: {task: stream}}``, each respecting the stream choices.

    Examples
    --------
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem
    >>> from autosched.search.options import Constraints
    >>> costs = CostModel({"A": TaskCost(0.0, 0.002), "B": TaskCost(0.0, 0.003)})
    >>> p = make_problem((["A", "B"], []), costs, Constraints(device="cuda", streams=[None, "side"]))
    >>> stream_presets(p, p.init_stream)["balanced"]
    {'B': None, 'A': 'side'}
    """
    out: Dict[str, Dict[str, Any]] = {"given": dict(problem.init_stream)}
    out["default"] = {n: (None if None in problem.stream_choices[n] else stream[n]) for n in problem.names}
    load: Dict[str, int] = {}
    bal: Dict[str, Any] = {}
    for n in sorted(problem.names, key=lambda n: (-problem.ddur(n), problem.names.index(n))):
        choices = problem.stream_choices[n]
        s = min(choices, key=lambda x: (load.get(stream_name(x), 0), stream_name(x)))
        load[stream_name(s)] = load.get(stream_name(s), 0) + problem.ddur(n)
        bal[n] = s
    out["balanced"] = bal
    return out

