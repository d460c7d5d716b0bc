"""The beam's starting candidates and each member's neighbours: thread-map, stream-map and fire-order moves.

:func:`initial_candidates` seeds the beam (the input plan's map, each thread-map preset with the
first fire orders, on CUDA each stream preset); :func:`mutations` are one beam member's neighbours:
thread-map presets, load-balancing moves and swaps, single-task moves; on CUDA stream presets,
single-task and whole-stream moves (:mod:`autosched.search.maps`); fire-order policies and adjacent swaps
(:mod:`autosched.search.fire_orders`).
"""

from __future__ import annotations

import random
from typing import Dict, List, Sequence, Tuple

import networkx as nx

from swpipe_core.plan import stream_name

from autosched.search.fire_orders import FIRE_POLICIES, adjacent_swaps, fire_order
from autosched.search.found import Candidate
from autosched.search.maps import canonical_groups, cap_groups, stream_presets, thread_presets
from autosched.search.problem import Problem

__all__ = ["initial_candidates", "mutations"]


def initial_candidates(problem: Problem) -> List[Candidate]:
    """The beam's first candidates: the input plan's thread map, each preset with the first fire orders.

    Parameters
    ----------
    problem : Problem

    Returns
    -------
    list of Candidate
    """
    stream = tuple(problem.init_stream[n] for n in problem.names)
    smap = dict(zip(problem.names, stream))
    presets = thread_presets(problem, smap)
    orders = {p: fire_order(problem, p, smap) for p in FIRE_POLICIES}
    cands = []
    if problem.base_plan is not None:
        from swpipe_core.order import enqueue_order

        base = problem.base_plan
        labels = cap_groups(problem, {n: base.sched(n).thread_group for n in problem.names})
        eo = enqueue_order(base)
        try:
            prio = tuple(nx.lexicographical_topological_sort(problem.dag, key=lambda n: eo.index(n)))
        except ValueError:
            prio = orders["declared"]
        cands.append(Candidate(canonical_groups(problem, labels), stream, prio, "given plan"))
    first_orders = ("critical_chain_first", "declared") if len(problem.names) <= 60 else ("critical_chain_first",)
    for pname, groups in presets.items():
        for oname in first_orders:
            cands.append(Candidate(groups, stream, orders[oname], f"{pname}+{oname}"))
    if problem.cuda:
        for sname, smap2 in stream_presets(problem, smap).items():
            if sname == "given":
                continue
            st = tuple(smap2[n] for n in problem.names)
            for pname, groups in thread_presets(problem, smap2).items():
                cands.append(Candidate(groups, st, orders["critical_chain_first"], f"{sname} streams+{pname}"))
    return cands


def _balancing_moves(problem: Problem, labels: Sequence[str], k: int) -> List[Dict[str, str]]:
    """Moves and swaps from the busiest thread group to the idlest that shrink the busiest load most.

    A transfer of ``x`` time units improves the larger of the two loads when
    ``0 < x < heavy - light``; the best is ``x`` closest to half the difference.
    """
    load: Dict[str, int] = {}
    for n, g in zip(problem.names, labels):
        load[g] = load.get(g, 0) + problem.dur(n)
    if len(load) < 2:
        return []
    heavy = max(load, key=lambda g: (load[g], g))
    light = min(load, key=lambda g: (load[g], g))
    diff = load[heavy] - load[light]
    movable = [n for n in problem.names if n not in problem.frozen_group]
    cur = dict(zip(problem.names, labels))
    on_h = [n for n in movable if cur[n] == heavy]
    on_l = [n for n in movable if cur[n] == light]
    options: List[Tuple[int, Dict[str, str]]] = []
    for a in on_h:
        x = problem.dur(a)
        if 0 < x < diff:
            options.append((abs(diff - 2 * x), {**cur, a: light}))
        for b in on_l:
            x = problem.dur(a) - problem.dur(b)
            if 0 < x < diff:
                options.append((abs(diff - 2 * x), {**cur, a: light, b: heavy}))
    options.sort(key=lambda o: o[0])
    return [m for _, m in options[:k]]


def mutations(problem: Problem, cand: Candidate, rng: random.Random, budget: int) -> List[Candidate]:
    """A beam member's neighbours: thread-map, stream-map (CUDA) and fire-order moves, ``budget`` sampled of each.

    Parameters
    ----------
    problem : Problem
    cand : Candidate
        The beam member.
    rng : random.Random
        Samples the single-task moves, stream moves and swaps (the search's seed).
    budget : int
        Moves and swaps sampled of each kind.

    Returns
    -------
    list of Candidate
    """
    out: List[Candidate] = []
    smap = dict(zip(problem.names, cand.stream))
    # MUTATE_THREAD_MAP: presets, then single-task moves
    for pname, groups in thread_presets(problem, smap).items():
        out.append(Candidate(groups, cand.stream, cand.priority, f"thread:{pname}"))
    labels = list(cand.group)
    groups = sorted(set(labels))
    fresh = "new" if len(groups) < problem.max_threads else None
    moves = []
    for i, n in enumerate(problem.names):
        if n in problem.frozen_group:
            continue
        for g in groups + ([fresh] if fresh else []):
            if g != labels[i]:
                moves.append((i, g))
    rng.shuffle(moves)
    for new in _balancing_moves(problem, labels, budget // 2 or 1):
        out.append(Candidate(canonical_groups(problem, new), cand.stream, cand.priority, "balance"))
    for i, g in moves[:budget]:
        new = dict(zip(problem.names, labels))
        new[problem.names[i]] = g
        out.append(Candidate(canonical_groups(problem, new), cand.stream, cand.priority,
                             f"move {problem.names[i]}->{g}"))
    # MUTATE_STREAM_MAP: presets, whole stream groups, single tasks (CUDA only)
    if problem.cuda:
        for pname, smap2 in stream_presets(problem, smap).items():
            out.append(Candidate(cand.group, tuple(smap2[n] for n in problem.names), cand.priority, f"streams:{pname}"))
        singles = [(n, s) for n in problem.names for s in problem.stream_choices[n]
                   if stream_name(s) != stream_name(smap[n])]
        rng.shuffle(singles)
        for n, s in singles[:budget]:
            new = dict(smap)
            new[n] = s
            out.append(Candidate(cand.group, tuple(new[x] for x in problem.names), cand.priority,
                                 f"stream {n}->{stream_name(s)}"))
        by_stream: Dict[str, List[str]] = {}
        for n, s in smap.items():
            if n not in problem.frozen_stream:
                by_stream.setdefault(stream_name(s), []).append(n)
        for sname, members in by_stream.items():
            options = set.intersection(*(set(problem.stream_choices[m]) for m in members))
            for s in options:
                if stream_name(s) != sname:
                    new = dict(smap)
                    for m in members:
                        new[m] = s
                    out.append(Candidate(cand.group, tuple(new[n] for n in problem.names), cand.priority,
                                         f"stream {sname}->{stream_name(s)}"))
    # MUTATE_FIRE_ORDERING: policies and adjacent swaps
    for p in FIRE_POLICIES:
        out.append(Candidate(cand.group, cand.stream, fire_order(problem, p, smap), f"order:{p}"))
    swaps = list(adjacent_swaps(problem, cand.priority))
    rng.shuffle(swaps)
    for pr in swaps[:budget]:
        out.append(Candidate(cand.group, cand.stream, pr, "swap"))
    return out
