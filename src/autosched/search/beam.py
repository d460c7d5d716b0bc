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
  the caller's group (:func:`autosched.search.problem.enqueue_order_for`);
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
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import networkx as nx

from swpipe_core.plan import PipelinePlan, ref_name, stream_name

from autosched.search.problem import Problem, build_plan
from autosched.search.enumerate import stage_assignments
from autosched.search.bounds import critical_path_units, recurrence_bound
from autosched.search.modulo import Candidate, derive_timetable, inline_label, modulo_schedule
from autosched.search.presets import (FIRE_POLICIES, _adjacent_swaps, _canonical_groups, _cap_groups, busiest_anchor, fire_order,
                      inline_anchor, inline_choices, stream_presets, thread_presets)
from autosched.model.taskmodel import resource_loads

__all__ = ["Candidate", "Scored", "BeamResult", "beam_search", "modulo_schedule", "fire_order",
           "thread_presets", "stream_presets", "plan_resource_bound", "reduce_depth",
           "derive_timetable", "critical_path_units", "recurrence_bound", "FIRE_POLICIES", "stage_assignments", "sim_scorer"]

log = logging.getLogger(__name__)

Scorer = Callable[[PipelinePlan], Tuple[float, float]]


# --------------------------------------------------------------------------- candidates


@dataclass
class Scored:
    """A candidate with its derived stages and its scores.

    ``ii``/``span`` (time units) come from the modulo timetable and rank
    candidates cheaply; ``period``/``latency`` (seconds) are the simulator's
    and are set once the candidate is simulated (``plan`` is built then).
    """

    cand: Candidate
    ii: int                      # period of the modulo timetable, in time units (0: stages not derived)
    stage: Dict[str, int]
    offset: Dict[str, int]
    span: int = 0                # one iteration's length in the timetable, time units
    plan: Optional[PipelinePlan] = None
    period: float = math.inf     # simulated steady-state period, seconds
    latency: float = math.inf

    @property
    def simulated(self) -> bool:
        return math.isfinite(self.period)

    @property
    def depth(self) -> int:
        return max(self.stage.values()) + 1 if self.stage else 1

    @property
    def threads(self) -> int:
        """Worker threads the plan starts: its groups, less the one on the caller's thread."""
        return len(set(self.cand.group)) - (self.cand.inline is not None)

    def rank(self, unit: float) -> tuple:
        """Simulated rank: period, then depth (memory), latency, worker threads, a late hand-off last."""
        return (round(self.period / unit, 3), self.depth, round(self.latency / unit, 3), self.threads,
                self.cand.handoff is not None)

    def proxy_rank(self) -> tuple:
        """Timetable rank, before simulation (a late hand-off, which the timetable does not see, last)."""
        return (self.ii, self.depth, self.span, self.threads, self.cand.handoff is not None)


@dataclass
class BeamResult:
    """Best plan found and what the search tried."""

    best: Scored
    counts: Dict[str, int]
    history: List[float]
    time_s: float
    stopped: str


def plan_resource_bound(problem: Problem, plan: PipelinePlan) -> float:
    """Seconds of work per iteration on the plan's busiest resource: no steady state is faster.

    Threads (and on CUDA streams), the sequencer, each communicator, PCIe, the
    core pool's work per core (``CostModel.cores``) and the main thread (the
    per-period engine time, and the caller's group when one runs inline).

    Parameters
    ----------
    problem : Problem
    plan : PipelinePlan
        A plan of the problem's tasks.

    Returns
    -------
    float

    Examples
    --------
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem
    >>> from autosched.search.entry import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2, time_unit_s=1e-3))
    >>> from autosched.search.problem import build_plan
    >>> plan = build_plan(p, {"A": 0, "B": 1}, {"A": "x", "B": "x"})
    >>> round(plan_resource_bound(p, plan) * 1e3, 6)   # both on one thread
    5.0
    >>> two = build_plan(p, {"A": 0, "B": 1}, {"A": "x", "B": "y"})
    >>> round(plan_resource_bound(p, two) * 1e3, 6)
    3.0
    >>> one_core = make_problem((["A", "B"], [("B", "A")]), CostModel(costs.tasks, cores=1),
    ...                         Constraints(max_depth=2, time_unit_s=1e-3))
    >>> round(plan_resource_bound(one_core, two) * 1e3, 6)   # one core runs both threads' work
    5.0
    """
    sched = {ref_name(k): v for k, v in plan.schedule.items()}
    load = resource_loads((problem.parts(n, sched[n].thread_group, sched[n].stream) for n in problem.names),
                          problem.cores)
    main = problem.period_overhead_s + (load.get(f"thread:{plan.caller_group}", 0.0)
                                        if plan.caller_group in plan.thread_groups else 0.0)
    return max([main, *load.values()])


def sim_scorer(problem: Problem, num_iterations: int = 40) -> Scorer:
    """Score a plan by the simulator: ``(period_s, latency_s)`` (see :func:`autosched.model.simulate.simulate`).

    Parameters
    ----------
    problem : Problem
        Gives the cost model, the device and the per-period engine time (:meth:`Problem.simulate`).
    num_iterations : int
        Iterations simulated per plan (more while the run is not steady).

    Returns
    -------
    callable
        ``plan -> (period, latency)``.

    Examples
    --------
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem
    >>> from autosched.search.entry import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2, time_unit_s=1e-3))
    >>> from autosched.search.problem import build_plan
    >>> score = sim_scorer(p, 20)
    >>> [round(x * 1e3, 6) for x in score(build_plan(p, {"A": 0, "B": 0}, {"A": "x", "B": "x"}))]
    [5.0, 5.0]
    """
    def score(plan: PipelinePlan) -> Tuple[float, float]:
        res = problem.simulate(plan, num_iterations)
        return float(res.period), float(res.latency)

    return score


# --------------------------------------------------------------------------- the search


def _initial(problem: Problem) -> List[Candidate]:
    stream = tuple(problem.init_stream[n] for n in problem.names)
    smap = dict(zip(problem.names, stream))
    presets = thread_presets(problem, smap)
    orders = {p: fire_order(problem, p, smap) for p in FIRE_POLICIES}
    cands = []
    if problem.base_plan is not None:
        from swpipe_core.order import enqueue_order

        base = problem.base_plan
        labels = _cap_groups(problem, {n: base.sched(n).thread_group for n in problem.names})
        eo = enqueue_order(base)
        try:
            prio = tuple(nx.lexicographical_topological_sort(problem.dag, key=lambda n: eo.index(n)))
        except ValueError:
            prio = orders["declared"]
        cands.append(Candidate(_canonical_groups(problem, labels), stream, prio, "given plan"))
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


def _mutations(problem: Problem, cand: Candidate, rng: random.Random, budget: int) -> List[Candidate]:
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
        out.append(Candidate(_canonical_groups(problem, new), cand.stream, cand.priority, "balance"))
    for i, g in moves[:budget]:
        new = dict(zip(problem.names, labels))
        new[problem.names[i]] = g
        out.append(Candidate(_canonical_groups(problem, new), cand.stream, cand.priority,
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
    swaps = list(_adjacent_swaps(problem, cand.priority))
    rng.shuffle(swaps)
    for pr in swaps[:budget]:
        out.append(Candidate(cand.group, cand.stream, pr, "swap"))
    return out


class _Evaluator:
    """Derives stages for candidates (cheap), simulates the promising ones, counts what was tried."""

    def __init__(self, problem: Problem, scorer: Scorer, rec: int) -> None:
        self.problem, self.scorer, self.rec = problem, scorer, rec
        self.counts = {"candidates": 0, "unique": 0, "derived": 0, "underivable": 0, "simulated": 0,
                       "invalid": 0, "pruned": 0, "stage_enumerated": 0, "caller_readings": 0}
        self.seen: Dict[tuple, Optional[Scored]] = {}
        self.sim_cache: Dict[tuple, Tuple[float, float]] = {}

    @staticmethod
    def plan_key(plan: PipelinePlan) -> tuple:
        return tuple((ref_name(k), s.stage, s.thread_group, stream_name(s.stream)) for k, s in plan.schedule.items()) + (
            tuple(ref_name(r) for r in plan.enqueue_order or ()), plan.caller_group)

    def score_plan(self, plan: PipelinePlan) -> Optional[Tuple[float, float]]:
        key = self.plan_key(plan)
        if key not in self.sim_cache:
            try:
                # the simulator validates the plan first
                self.sim_cache[key] = self.scorer(plan)
                self.counts["simulated"] += 1
            except Exception as exc:  # a plan the simulator rejects is just not a candidate
                log.debug("candidate rejected: %s", exc)
                self.counts["invalid"] += 1
                self.sim_cache[key] = (math.inf, math.inf)
        got = self.sim_cache[key]
        return None if math.isinf(got[0]) else got

    def derive(self, cand: Candidate, max_depth: Optional[int] = None) -> Optional[Scored]:
        """Stages from the modulo list scheduler; not simulated yet."""
        self.counts["candidates"] += 1
        key = cand.key() + (max_depth,)
        if key in self.seen:
            return self.seen[key]
        self.counts["unique"] += 1
        tol = 1e-3 if len(self.problem.names) <= 50 else 3e-3
        tt = derive_timetable(self.problem, cand, self.rec, max_depth, rel_tol=tol, near=cand.near)
        if tt is None:
            self.counts["underivable"] += 1
            self.seen[key] = None
            return None
        self.counts["derived"] += 1
        span = max(tt.start[t] + self.problem.dur(t) for t in self.problem.names) - min(tt.start.values())
        sc = Scored(cand, tt.ii, tt.stage, tt.offset, span)
        self.seen[key] = sc
        return sc

    def simulate(self, sc: Scored) -> bool:
        """Build the candidate's plan and score it by the simulator; False if it is rejected."""
        if sc.simulated:
            return True
        if sc.plan is None:
            names, cand = self.problem.names, sc.cand
            group = dict(zip(names, cand.group))
            stream = dict(zip(names, cand.stream))
            sc.plan = build_plan(self.problem, sc.stage, group, stream, cand.priority, sc.offset or None,
                                 inline=inline_label(self.problem, names, cand.group, cand.inline),
                                 handoff=cand.handoff)
        got = self.score_plan(sc.plan)
        if got is None:
            return False
        sc.period, sc.latency = got
        return True

    def evaluate(self, cand: Candidate, max_depth: Optional[int] = None) -> Optional[Scored]:
        """Derive and simulate."""
        sc = self.derive(cand, max_depth)
        return sc if sc is not None and self.simulate(sc) else None

    def reread(self, sc: Scored, cand: Candidate) -> Optional[Scored]:
        """``sc``'s stages and offsets read as ``cand`` (another caller's thread or hand-off), simulated."""
        self.counts["caller_readings"] += 1
        got = Scored(cand, sc.ii, dict(sc.stage), dict(sc.offset), sc.span)
        return got if self.simulate(got) else None

    def with_stages(self, cand: Candidate, stage: Dict[str, int]) -> Optional[Scored]:
        self.counts["stage_enumerated"] += 1
        sc = Scored(cand, 0, dict(stage), {})
        return sc if self.simulate(sc) else None


def _prune(problem: Problem, scored: List[Scored]) -> List[Scored]:
    """DOMINANCE_PRUNE: per (thread map, stream map, stages) keep the best fire order."""
    best: Dict[tuple, Scored] = {}
    for s in scored:
        k = (s.cand.group, tuple(stream_name(x) for x in s.cand.stream), tuple(sorted(s.stage.items())))
        if k not in best or _key(problem, s) < _key(problem, best[k]):
            best[k] = s
    return sorted(best.values(), key=lambda s: _key(problem, s))


def _key(problem: Problem, s: Scored) -> tuple:
    """Simulated candidates by their simulated rank, ahead of unsimulated ones ranked by timetable."""
    return (0,) + s.rank(problem.unit_s) if s.simulated else (1,) + s.proxy_rank()


def _given_plan(problem: Problem, ev: _Evaluator) -> Optional[Scored]:
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
    labels = _canonical_groups(problem, groups)
    on_caller = next((n for n in problem.names if groups[n] == base.caller_group), None)
    cand = Candidate(labels, tuple(base.sched(n).stream for n in problem.names), tuple(plan.enqueue_order),
                     "given plan as is", inline=inline_anchor(problem, labels, on_caller))
    sc = Scored(cand, 0, stage, {}, plan=plan)
    return sc if ev.simulate(sc) else None


def _simulate_top(problem: Problem, ev: _Evaluator, pool: List[Scored], k: int, deadline: float) -> List[Scored]:
    """Simulate the ``k`` best-by-timetable unsimulated candidates; return every simulated one."""
    fresh = sorted((s for s in pool if not s.simulated), key=lambda s: s.proxy_rank())
    for i, s in enumerate(fresh[:k]):
        # past the deadline, still simulate the single most promising newcomer
        if time.perf_counter() > deadline and i > 0:
            break
        ev.simulate(s)
    return [s for s in pool if s.simulated]


def _place_caller(problem: Problem, ev: _Evaluator, members: Sequence[Scored], best: Scored, deadline: float,
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


def beam_search(problem: Problem, *, width: int = 6, rounds: int = 20, patience: int = 3,
                time_limit_s: float = 10.0, seed: int = 0, scorer: Optional[Scorer] = None,
                progress: bool = False, enumerate_stages_below: int = 400,
                moves_per_round: Optional[int] = None) -> BeamResult:
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
    BeamResult

    Raises
    ------
    RuntimeError
        No candidate could be placed (constraints leave no valid plan).

    Examples
    --------
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem
    >>> from autosched.search.entry import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2, time_unit_s=1e-3))
    >>> best = beam_search(p, time_limit_s=10).best
    >>> round(best.period * 1e3, 6), best.plan.stage("B"), best.threads, best.plan.caller_group
    (3.0, 1, 1, 'default')
    >>> {n: best.plan.sched(n).thread_group for n in "AB"}   # B on the caller's thread, A on one worker
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
    rec = recurrence_bound(problem)
    ev = _Evaluator(problem, scorer, rec)
    n_tasks = len(problem.names)
    budget = moves_per_round if moves_per_round is not None else (40 if n_tasks <= 12 else 12 if n_tasks <= 60 else 6)
    unit = problem.unit_s
    n_sim = 2 * width if n_tasks <= 60 else 3

    derived = [s for s in (ev.derive(c) for c in _initial(problem)) if s is not None]
    pool = _simulate_top(problem, ev, _prune(problem, derived), n_sim, deadline)
    given = _given_plan(problem, ev)
    if given is not None:
        pool.append(given)
    if not pool:
        # last resort: everything on one thread at the lowest stages the stage rules allow
        stage0 = next(iter(stage_assignments(problem, limit=1)), None)
        single = thread_presets(problem, problem.init_stream)["single"]
        fallback = Candidate(single, tuple(problem.init_stream[n] for n in problem.names),
                             fire_order(problem, "declared"), "fallback", inline=busiest_anchor(problem, single))
        s = ev.with_stages(fallback, stage0) if stage0 is not None else None
        if s is None:
            raise RuntimeError("no plan satisfies the constraints (frozen stages/groups, depth and thread caps); "
                               "relax max_depth, max_threads or the frozen entries")
        pool = [s]
    beam = _prune(problem, pool)[:width]
    best = beam[0]
    history = [best.period]
    stale, stopped = 0, "rounds"
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=rounds, desc="beam search", unit="round")
    for _ in range(rounds):
        if time.perf_counter() > deadline:
            stopped = "time limit"
            break
        expanded: List[Scored] = list(beam)
        for member in beam:
            for cand in _mutations(problem, member.cand, rng, budget):
                if time.perf_counter() > deadline:
                    break
                if member.ii:
                    cand = dataclasses.replace(cand, near=member.ii)
                s = ev.derive(cand)
                if s is not None:
                    expanded.append(s)
        pruned = _prune(problem, expanded)
        ev.counts["pruned"] += len(expanded) - len(pruned)
        simulated = _simulate_top(problem, ev, pruned, n_sim, deadline)
        beam = _prune(problem, simulated)[:width]
        if bar is not None:
            bar.update(1)
            bar.set_postfix(period_ms=f"{beam[0].period * 1e3:.3f}")
        if beam[0].rank(unit) < best.rank(unit):
            best, stale = beam[0], 0
        else:
            stale += 1
        history.append(best.period)
        if stale >= patience:
            stopped = "patience"
            break
    if bar is not None:
        bar.close()

    # small graphs: exact over the stage axis for the best few thread maps / orders
    if len(problem.names) <= 8:
        n_stage = sum(1 for _ in stage_assignments(problem, limit=enumerate_stages_below + 1))
        if n_stage <= enumerate_stages_below:
            for member in beam[:3]:
                for stage in stage_assignments(problem):
                    if time.perf_counter() > deadline:
                        break
                    s = ev.with_stages(member.cand, stage)
                    if s is not None and s.rank(unit) < best.rank(unit):
                        best = s
    if problem.caller_group is not None:
        members = [best] + [m for m in beam[:3] if m is not best]
        best = _place_caller(problem, ev, members, best, end, budget // 4 or 1)
    ev.counts["rounds"] = len(history) - 1
    return BeamResult(best, ev.counts, history, time.perf_counter() - t0, stopped)


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
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem
    >>> from autosched.search.entry import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2, time_unit_s=1e-3))
    >>> best = beam_search(p, time_limit_s=10).best
    >>> kept, tried = reduce_depth(p, best, sim_scorer(p), recurrence_bound(p))
    >>> kept.depth, [(cap, round(period * 1e3, 6)) for cap, period in tried]
    (2, [(1, 5.0)])
    """
    ev = _Evaluator(problem, scorer, rec)
    seen: List[Tuple[int, float]] = []
    cur = best
    for cap in range(best.depth - 1, 0, -1):
        s = ev.evaluate(best.cand, max_depth=cap)
        seen.append((cap, s.period if s is not None else math.inf))
        if s is not None and round(s.period / problem.unit_s, 3) <= round(cur.period / problem.unit_s, 3):
            cur = s
    return cur, seen
