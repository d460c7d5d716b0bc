"""Beam search over thread map x stream map x fire order x caller's thread, stages by modulo list scheduling.

It searches thread groups, streams, stages and the caller's group jointly:

* a **candidate** is a thread map (task -> group), a stream map (task ->
  stream), a fire order (a topological order of the intra-iteration DAG
  used as list-scheduling priority) and the caller's thread: the group run
  inline on it (or none) and where its hand-offs go;
* its **stages** are derived by *modulo list scheduling*: for a target period
  ``II`` every task, in fire order, is placed at the earliest time its
  dependencies allow where its thread (and, if it has them, the sequencer,
  its communicator, PCIe, its stream) is free modulo ``II``; its stage is
  ``start // II`` (capped by ``max_depth``). The smallest ``II`` that places
  every task is found by bisection (with a group inline, the main thread's
  window holds that group's tasks of a period and the per-period engine
  time: :mod:`autosched.search.modulo`). The enqueue order sorts tasks by their
  offset ``start % II``, each worker's task handed off no later than the
  timetable starts it or, where the candidate says so, after a given task of
  the caller's group (:func:`autosched.search.plans.enqueue_order_for`);
* every candidate is **scored by the simulator** (the engine's semantics:
  progress barrier, FIFO threads, sequencer, the caller's group and its
  hand-offs, the per-period engine time), lower is better, ties broken by
  smaller depth (memory), latency, then fewer worker threads (a group on the
  caller's thread starts none) and an early hand-off;
* each round **mutates** the beam: thread-map presets (single, by_stream,
  per_task, io_compute, io_collective_compute, balanced) and single-task moves;
  stream-group moves (CUDA only: on CPU a stream is just a name); fire-order
  policies (critical-chain-first, longest-off-default-first,
  collective-early, PCIe-prep-early, min-slack-first) and adjacent swaps;
  then **dominance-prunes** (per thread map x stream map x stages keep the best
  order) and keeps the best ``width``;
* for small graphs the best candidates also try **every** valid stage
  assignment (exact for the stage axis);
* last, the **caller's thread is placed** (:func:`_place_caller`, a tenth of
  the budget): the best plans are read with each group on the caller's
  thread, or none (their own timetable, and one derived anew), and the best
  such reading with the other groups' tasks handed off after each task of
  the inline group in turn. The rounds explore with every group on a
  worker (unless a group is frozen to the caller's thread): in the
  timetable the caller's thread only adds constraints, so the caller's
  group is chosen for the plans the rounds found best, by the simulator.

The search stops after ``rounds`` rounds, ``patience`` rounds without
improvement, or its time limit, and always returns the best plan seen.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from autosched.search.bounds import recurrence_bound
from autosched.search.fire_orders import fire_order
from autosched.search.found import Candidate, Found, Scored, Scorer
from autosched.search.maps import busiest_anchor, canonical_groups, inline_anchor, inline_choices, thread_presets
from autosched.search.modulo import inline_label
from autosched.search.neighbours import initial_candidates, mutations
from autosched.search.problem import Problem, stage_assignments
from autosched.search.scoring import Evaluator, prune, sim_scorer

if TYPE_CHECKING:  # the progress bar is imported on demand
    from tqdm.auto import tqdm

__all__ = ["beam_search", "reduce_depth"]


def _given_plan(problem: Problem, ev: Evaluator) -> Optional[Scored]:
    """The input plan as given, if it is within the constraints (so the search is never worse)."""
    base = problem.base_plan
    if base is None:
        return None
    stage = {n: base.stage(n) for n in problem.names}
    groups = {n: base.sched(n).thread_group for n in problem.names}
    if not problem.stage_ok(stage) or len(set(groups.values())) > problem.max_threads:
        return None
    if any(groups[n] != g for n, g in problem.frozen_group.items()):
        return None
    if any(base.sched(n).stream not in problem.stream_choices[n] for n in problem.names):
        return None
    if any((n in problem.ordered) != bool(base.sched(n).globally_ordered) for n in problem.names):
        return None
    from swpipe_core.order import enqueue_order

    plan = base.replace(enqueue_order=enqueue_order(base), pipeline_depth=base.pipeline_depth)
    labels = canonical_groups(problem, groups)
    on_caller = next((n for n in problem.names if groups[n] == base.caller_group), None)
    cand = Candidate(labels, tuple(base.sched(n).stream for n in problem.names), tuple(plan.enqueue_order),
                     "given plan as is", inline=inline_anchor(problem, labels, on_caller))
    sc = Scored(cand, 0, stage, {}, plan=plan)
    return sc if ev.simulate(sc) else None


def _simulate_top(problem: Problem, ev: Evaluator, pool: List[Scored], k: int, deadline: float) -> List[Scored]:
    """Simulate the ``k`` best-by-timetable unsimulated candidates; return every simulated one."""
    fresh = sorted((s for s in pool if not s.simulated), key=lambda s: s.proxy_rank())
    for i, s in enumerate(fresh[:k]):
        # past the deadline, still simulate the single most promising newcomer
        if time.perf_counter() > deadline and i > 0:
            break
        ev.simulate(s)
    return [s for s in pool if s.simulated]


def _place_caller(problem: Problem, ev: Evaluator, members: Sequence[Scored], best: Scored, deadline: float,
                  budget: int) -> Scored:
    """PLACE_CALLER: the best plans read with each group on the caller's thread, then with later hand-offs.

    Each member is read with each group it may run inline (and with none):
    its own timetable read so, and the timetable derived anew for it (the
    main thread's window, :mod:`autosched.search.modulo`); then the best reading
    with a group inline is read with the other groups' tasks handed off
    after each task of that group in turn (up to ``budget`` of them, spread
    over the group). Every reading is simulated; the best ranked wins
    (:meth:`Scored.rank`: on equal period, depth and latency, the one with a
    group inline, one worker thread fewer, and an early hand-off; then the
    busiest group inline). The first reading is made even past the deadline.
    """
    unit, names = problem.unit_s, problem.names
    readings: List[Scored] = list(members)
    first = True

    def load(labels: Sequence[str], anchor: Optional[str]) -> int:
        if anchor is None:
            return -1
        group = labels[names.index(anchor)]
        return sum(problem.dur(n) for n, g in zip(names, labels) if g == group)

    for member in members:
        # the busiest group first: of readings that tie, the first is kept (a hand-written loop's choice)
        for anchor in sorted(inline_choices(problem, member.cand.group), key=lambda a: -load(member.cand.group, a)):
            if anchor == member.cand.inline:
                continue
            if not first and time.perf_counter() > deadline:
                break
            first = False
            cand = dataclasses.replace(member.cand, inline=anchor, handoff=None, near=member.ii or None,
                                       origin=f"{member.cand.origin}; caller's thread: {anchor}'s group")
            readings += [s for s in (ev.reread(member, cand), ev.evaluate(cand)) if s is not None]
    on_main = [s for s in readings if inline_label(problem, names, s.cand.group, s.cand.inline) is not None]
    if on_main:
        top = min(on_main, key=lambda s: s.rank(unit))
        caller = inline_label(problem, names, top.cand.group, top.cand.inline)
        tasks = [n for n in top.cand.priority if top.cand.group[names.index(n)] == caller]
        if len(tasks) < len(names):
            step = max(1, -(-len(tasks) // max(1, budget)))
            for task in tasks[::step]:
                if time.perf_counter() > deadline:
                    break
                got = ev.reread(top, dataclasses.replace(top.cand, handoff=task,
                                                        origin=f"{top.cand.origin}; hand off after {task}"))
                if got is not None:
                    readings.append(got)
    return min(readings + [best], key=lambda s: s.rank(unit))


def _first_pool(problem: Problem, ev: Evaluator, derived: List[Scored], n_sim: int, deadline: float) -> List[Scored]:
    """The first beam's pool: the initial candidates ``derived`` (the ``n_sim`` best simulated) and the input plan as
    given.

    Raises RuntimeError when none of them, nor everything on one thread at the lowest stages, is a plan.
    """
    pool = _simulate_top(problem, ev, prune(problem, derived), n_sim, deadline)
    given = _given_plan(problem, ev)
    if given is not None:
        pool.append(given)
    if pool:
        return pool
    # last resort: everything on one thread at the lowest stages the stage rules allow
    lowest_stages = next(iter(stage_assignments(problem, limit=1)), None)
    single = thread_presets(problem, problem.init_stream)["single"]
    fallback = Candidate(single, tuple(problem.init_stream[n] for n in problem.names),
                         fire_order(problem, "declared"), "fallback", inline=busiest_anchor(problem, single))
    scored = ev.with_stages(fallback, lowest_stages) if lowest_stages is not None else None
    if scored is None:
        raise RuntimeError("no plan satisfies the constraints (frozen stages/groups, depth and thread caps); "
                           "relax max_depth, max_threads or the frozen entries")
    return [scored]


def _neighbours(problem: Problem, beam: Sequence[Scored], rng: random.Random, budget: int) -> List[Candidate]:
    """Each member's mutations, each hinted with the member's period (a mutation rarely moves it far)."""
    return [dataclasses.replace(cand, near=member.ii) if member.ii else cand
            for member in beam for cand in mutations(problem, member.cand, rng, budget)]


def _next_beam(problem: Problem, ev: Evaluator, expanded: List[Scored], n_sim: int, deadline: float) -> List[Scored]:
    """One round's beam and its derived neighbours, dominance-pruned, the ``n_sim`` most promising simulated, ranked."""
    return prune(problem, _simulate_top(problem, ev, prune(problem, expanded), n_sim, deadline))


def _every_stage(problem: Problem, ev: Evaluator, members: Sequence[Scored], best: Scored, limit: int,
                 deadline: float) -> Scored:
    """Small graphs: every valid stage assignment for the best few thread maps and orders (exact on the stage axis),
    when there are at most ``limit`` of them."""
    if sum(1 for _ in stage_assignments(problem, limit=limit + 1)) > limit:
        return best
    unit = problem.unit_s
    for member in members:
        for stage in stage_assignments(problem):
            if time.perf_counter() > deadline:
                break
            scored = ev.with_stages(member.cand, stage)
            if scored is not None and scored.rank(unit) < best.rank(unit):
                best = scored
    return best


def _progress_bar(rounds: int) -> "tqdm":
    from tqdm.auto import tqdm

    return tqdm(total=rounds, desc="beam search", unit="round")


def beam_search(problem: Problem, *, width: int = 6, rounds: int = 20, patience: int = 3,
                time_limit_s: float = 10.0, seed: int = 0, scorer: Optional[Scorer] = None,
                progress: bool = False, enumerate_stages_below: int = 400,
                moves_per_round: Optional[int] = None) -> Found:
    """Search thread map x stream map x fire order; stages derived; score by the simulator.

    Parameters
    ----------
    problem : Problem
        From :func:`autosched.search.problem.make_problem`.
    width : int
        Beam width.
    rounds, patience : int
        At most ``rounds`` rounds; stop after ``patience`` rounds without improvement.
    time_limit_s : float
        Wall-clock budget; the best plan so far is returned when it runs out.
    seed : int
        Seeds the sampling of moves and swaps (the search is deterministic for a seed).
    scorer : callable, optional
        ``plan -> (period_s, latency_s)``; default the simulator (:func:`sim_scorer`).
    progress : bool
        Show a tqdm progress bar over rounds.
    enumerate_stages_below : int
        When the graph has at most this many valid stage assignments, the best
        candidates also try all of them.
    moves_per_round : int, optional
        Thread moves and swaps sampled per beam member (default scales with size).

    Returns
    -------
    Found
        The best plan seen (``method="beam"``), its period and latency by ``scorer``, its timetable and
        candidate (``candidate``: CP-SAT's hint), why the search stopped (``stopped``) and what it tried.

    Raises
    ------
    RuntimeError
        No candidate could be placed (constraints leave no valid plan).

    Examples
    --------
    >>> from swpipe import Constraints, CostModel, TaskCost
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2), time_unit_s=1e-3)
    >>> found = beam_search(p, time_limit_s=10)
    >>> round(found.period * 1e3, 6), found.plan.stage("B"), found.candidate.threads, found.plan.caller_group
    (3.0, 1, 1, 'default')
    >>> {n: found.plan.sched(n).thread_group for n in "AB"}   # B on the caller's thread, A on one worker
    {'A': 'worker1', 'B': 'default'}
    """
    t0 = time.perf_counter()
    # keep a little of the budget for the last simulation, which may overrun the deadline, and a tenth
    # of the rest for placing the caller's thread
    end = t0 + time_limit_s - min(0.5, 0.05 * time_limit_s)
    deadline = t0 + (end - t0) * (0.9 if problem.caller_group is not None else 1.0)
    rng = random.Random(seed)
    if scorer is None:
        n_iter = max(12, min(40, 2000 // max(1, len(problem.names))))
        scorer = sim_scorer(problem, n_iter)
    ev = Evaluator(problem, scorer, recurrence_bound(problem))
    n_tasks = len(problem.names)
    budget = moves_per_round if moves_per_round is not None else (40 if n_tasks <= 12 else 12 if n_tasks <= 60 else 6)
    unit = problem.unit_s
    n_sim = 2 * width if n_tasks <= 60 else 3

    derived = [s for s in (ev.derive(c) for c in initial_candidates(problem)) if s is not None]
    beam = prune(problem, _first_pool(problem, ev, derived, n_sim, deadline))[:width]
    best = beam[0]
    done, stale, stopped = 0, 0, "rounds"
    bar = _progress_bar(rounds) if progress else None
    for _ in range(rounds):
        if time.perf_counter() > deadline:
            stopped = "time limit"
            break
        derived = []
        for cand in _neighbours(problem, beam, rng, budget):
            if time.perf_counter() > deadline:
                break
            got = ev.derive(cand)
            if got is not None:
                derived.append(got)
        beam = _next_beam(problem, ev, beam + derived, n_sim, deadline)[:width]
        if bar is not None:
            bar.update(1)
            bar.set_postfix(period_ms=f"{beam[0].period * 1e3:.3f}")
        if beam[0].rank(unit) < best.rank(unit):
            best, stale = beam[0], 0
        else:
            stale += 1
        done += 1
        if stale >= patience:
            stopped = "patience"
            break
    if bar is not None:
        bar.close()
    if len(problem.names) <= 8:
        best = _every_stage(problem, ev, beam[:3], best, enumerate_stages_below, deadline)
    if problem.caller_group is not None:
        members = [best] + [m for m in beam[:3] if m is not best]
        best = _place_caller(problem, ev, members, best, end, budget // 4 or 1)
    counts = ev.counts
    tried = {"beam candidates": counts["candidates"], "beam distinct": counts["unique"],
             "beam simulated": counts["simulated"], "beam stage vectors tried": counts["stage_enumerated"],
             "beam rounds": done}
    return Found(best.plan, best.period, best.latency, "beam", scorer, timetable=best.timetable(), stopped=stopped,
                 tried=tried, pool=[("beam", best.plan)], candidate=best)


def reduce_depth(problem: Problem, best: Scored, scorer: Scorer, rec: int) -> Tuple[Scored, List[Tuple[int, float]]]:
    """Try the best candidate at smaller depth caps; keep a shallower plan that is as fast.

    Parameters
    ----------
    problem : Problem
    best : Scored
        A simulated candidate.
    scorer : callable
        As for :func:`beam_search`.
    rec : int
        :func:`recurrence_bound` of the problem.

    Returns
    -------
    (Scored, list of (depth cap, period or inf))
        The (possibly shallower) best and the periods seen at each smaller cap.

    Examples
    --------
    >>> from swpipe import Constraints, CostModel, TaskCost
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2), time_unit_s=1e-3)
    >>> best = beam_search(p, time_limit_s=10).candidate
    >>> kept, tried = reduce_depth(p, best, sim_scorer(p), recurrence_bound(p))
    >>> kept.depth, [(cap, round(period * 1e3, 6)) for cap, period in tried]
    (2, [(1, 5.0)])
    """
    ev = Evaluator(problem, scorer, rec)
    seen: List[Tuple[int, float]] = []
    cur = best
    for cap in range(best.depth - 1, 0, -1):
        shallow = ev.derive(best.cand, max_depth=cap)
        if shallow is None or not ev.simulate(shallow):
            seen.append((cap, math.inf))
            continue
        seen.append((cap, shallow.period))
        if round(shallow.period / problem.unit_s, 3) <= round(cur.period / problem.unit_s, 3):
            cur = shallow
    return cur, seen
