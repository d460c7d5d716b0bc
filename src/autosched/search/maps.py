"""Thread maps and stream maps of a candidate, and which group runs on the caller's thread.

Named thread maps (one group, one per stream, one per task, I/O vs compute, balanced, the critical chain
alone), capped at ``max_threads`` (:func:`thread_presets`), with group labels made canonical
(:func:`canonical_groups`); named stream maps (CUDA only: on CPU a stream is a name; :func:`stream_presets`).
A candidate names the group it runs on the caller's thread by that group's first task
(:func:`inline_anchor`); the beam's last step reads its best plans with each choice (:func:`inline_choices`).
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

from swpipe_core.plan import StreamSpec, stream_name

from autosched.search.fire_orders import levels
from autosched.search.problem import Problem

__all__ = ["thread_presets", "stream_presets", "canonical_groups", "cap_groups", "inline_anchor", "busiest_anchor",
           "inline_choices"]


def canonical_groups(problem: Problem, labels: Mapping[str, str]) -> Tuple[str, ...]:
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
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> from swpipe import Constraints
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


def cap_groups(problem: Problem, labels: Mapping[str, str]) -> Dict[str, str]:
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


def thread_presets(problem: Problem, stream: Mapping[str, StreamSpec]) -> Dict[str, Tuple[str, ...]]:
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
    >>> from swpipe import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> from swpipe import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2), time_unit_s=1e-3)
    >>> presets = thread_presets(p, p.init_stream)
    >>> presets["single"], presets["per_task"], presets["balanced"]
    (('g0', 'g0'), ('g0', 'g1'), ('g0', 'g1'))
    """
    key = ("thread_presets", tuple(stream_name(stream[n]) for n in problem.names))
    return dict(problem.memo(key, lambda: _thread_presets(problem, stream)))


def _thread_presets(problem: Problem, stream: Mapping[str, StreamSpec]) -> Dict[str, Tuple[str, ...]]:
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
    _, bottom = levels(problem)
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
        capped = cap_groups(problem, labels)
        if len(set(capped.values())) <= problem.max_threads:
            result[name] = canonical_groups(problem, capped)
    return result


def stream_presets(problem: Problem, stream: Mapping[str, StreamSpec]) -> Dict[str, Dict[str, StreamSpec]]:
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
    >>> from swpipe import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> from swpipe import Constraints
    >>> costs = CostModel({"A": TaskCost(0.0, 0.002), "B": TaskCost(0.0, 0.003)})
    >>> p = make_problem((["A", "B"], []), costs, Constraints(device="cuda", streams=[None, "side"]))
    >>> stream_presets(p, p.init_stream)["balanced"]
    {'B': None, 'A': 'side'}
    """
    out: Dict[str, Dict[str, StreamSpec]] = {"given": dict(problem.init_stream)}
    out["default"] = {n: (None if None in problem.stream_choices[n] else stream[n]) for n in problem.names}
    load: Dict[str, int] = {}
    bal: Dict[str, StreamSpec] = {}
    for n in sorted(problem.names, key=lambda n: (-problem.ddur(n), problem.names.index(n))):
        choices = problem.stream_choices[n]
        s = min(choices, key=lambda x: (load.get(stream_name(x), 0), stream_name(x)))
        load[stream_name(s)] = load.get(stream_name(s), 0) + problem.ddur(n)
        bal[n] = s
    out["balanced"] = bal
    return out
