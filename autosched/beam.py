"""Beam search over thread map x stream map x fire order, stages derived by modulo list scheduling.

It searches thread groups, streams and stages jointly:

* a **candidate** is a thread map (task -> group), a stream map (task ->
  stream) and a fire order (a topological order of the intra-iteration DAG
  used as list-scheduling priority);
* its **stages** are derived by *modulo list scheduling*: for a target period
  ``II`` every task, in fire order, is placed at the earliest time its
  dependencies allow where its thread (and, if it has them, the sequencer,
  its communicator, PCIe, its stream) is free modulo ``II``; its stage is
  ``start // II`` (capped by ``max_depth``). The smallest ``II`` that places
  every task is found by bisection. The enqueue order sorts tasks by their
  offset ``start % II`` (a topological order of the period-local graph);
* every candidate is **scored by the simulator** (the engine's semantics:
  progress barrier, FIFO threads, sequencer), lower is better, ties broken by
  smaller depth (memory) then latency;
* each round **mutates** the beam: thread-map presets (single, by_stream,
  per_task, io_compute, io_collective_compute, balanced) and single-task moves;
  stream-group moves (CUDA only: on CPU a stream is just a name); fire-order
  policies (critical-chain-first, longest-off-default-first,
  collective-early, PCIe-prep-early, min-slack-first) and adjacent swaps;
  then **dominance-prunes** (per thread map x stream map x stages keep the best
  order) and keeps the best ``width``;
* for small graphs the best candidates also try **every** valid stage
  assignment (exact for the stage axis).

The search stops after ``rounds`` rounds, ``patience`` rounds without
improvement, or its time limit, and always returns the best plan seen.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import networkx as nx

from swpipe_core.plan import PipelinePlan, ref_name, stream_name
from swpipe_core.stage_rules import stage_rule_holds

from ._problem import Problem, build_plan
from .taskmodel import critical_path, resource_loads

__all__ = ["Candidate", "Scored", "BeamResult", "beam_search", "modulo_schedule", "fire_order",
           "thread_presets", "stream_presets", "plan_resource_bound", "reduce_depth",
           "derive_timetable", "critical_path_units", "recurrence_bound", "FIRE_POLICIES", "stage_assignments", "sim_scorer"]

log = logging.getLogger(__name__)

FIRE_POLICIES = ("declared", "critical_chain_first", "longest_off_default_first", "collective_early",
                 "pcie_prep_early", "min_slack_first")

Scorer = Callable[[PipelinePlan], Tuple[float, float]]


# --------------------------------------------------------------------------- candidates


@dataclass(frozen=True)
class Candidate:
    """One point of the search space (stages are derived, not searched)."""

    group: Tuple[str, ...]      # thread-group label per task, in problem.names order
    stream: Tuple[Any, ...]     # stream per task, in problem.names order
    priority: Tuple[str, ...]   # fire order: a topological order of the intra DAG
    origin: str = field(default="", compare=False)
    near: Optional[int] = field(default=None, compare=False)   # the parent's period, a bisection hint

    def key(self) -> tuple:
        return (self.group, tuple(stream_name(s) for s in self.stream), self.priority)


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
        return len(set(self.cand.group))

    def rank(self, unit: float) -> tuple:
        """Simulated rank: period, then depth (memory), latency, threads."""
        return (round(self.period / unit, 3), self.depth, round(self.latency / unit, 3), self.threads)

    def proxy_rank(self) -> tuple:
        """Timetable rank, before simulation."""
        return (self.ii, self.depth, self.span, self.threads)


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

    Threads (and on CUDA streams), the sequencer, each communicator and PCIe.

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
    >>> from autosched.costs import CostModel, TaskCost
    >>> from autosched._problem import make_problem
    >>> from autosched.search import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2, time_unit_s=1e-3))
    >>> from autosched._problem import build_plan
    >>> plan = build_plan(p, {"A": 0, "B": 1}, {"A": "x", "B": "x"})
    >>> round(plan_resource_bound(p, plan) * 1e3, 6)   # both on one thread
    5.0
    """
    sched = {ref_name(k): v for k, v in plan.schedule.items()}
    load = resource_loads(problem.parts(n, sched[n].thread_group, sched[n].stream) for n in problem.names)
    return max(load.values(), default=0.0)


def sim_scorer(problem: Problem, num_iterations: int = 40) -> Scorer:
    """Score a plan by the simulator: ``(period_s, latency_s)`` (see :func:`autosched.simulate.simulate`).

    Parameters
    ----------
    problem : Problem
        Gives the cost model and the device.
    num_iterations : int
        Iterations simulated per plan (more while the run is not steady).

    Returns
    -------
    callable
        ``plan -> (period, latency)``.

    Examples
    --------
    >>> from autosched.costs import CostModel, TaskCost
    >>> from autosched._problem import make_problem
    >>> from autosched.search import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2, time_unit_s=1e-3))
    >>> from autosched._problem import build_plan
    >>> score = sim_scorer(p, 20)
    >>> [round(x * 1e3, 6) for x in score(build_plan(p, {"A": 0, "B": 0}, {"A": "x", "B": "x"}))]
    [5.0, 5.0]
    """
    from .simulate import simulate

    def score(plan: PipelinePlan) -> Tuple[float, float]:
        res = simulate(plan, problem.costs, num_iterations=num_iterations, device=problem.device)
        return float(res.period), float(res.latency)

    return score


# --------------------------------------------------------------------------- modulo list scheduling


class _Ring:
    """Busy intervals of one resource on a circle of length ``ii`` (integer time units)."""

    __slots__ = ("ii", "starts", "ends")

    def __init__(self, ii: int) -> None:
        self.ii = ii
        self.starts: List[int] = []
        self.ends: List[int] = []   # sorted like starts; only the last may exceed ii (wraps)

    def _conflict_end(self, r: int, dur: int) -> Optional[int]:
        """End of some busy interval overlapping ``[r, r + dur)`` (``0 <= r < ii``), or None."""
        if not self.starts:
            return None
        e = r + dur
        found = None
        tail = self.ends[-1] - self.ii          # the wrapped part of the last interval: [0, tail)
        if tail > r:
            found = tail
        i = bisect.bisect_left(self.starts, e) - 1
        if dur == 0:
            # a zero-length task waits only for an interval strictly around r
            i = bisect.bisect_right(self.starts, r - 1) - 1
            if i >= 0 and self.starts[i] < r < self.ends[i]:
                found = max(found or 0, self.ends[i])
            return found
        if i >= 0 and self.ends[i] > r:
            found = max(found or 0, self.ends[i])
        if e > self.starts[0] + self.ii:        # next turn's first interval
            found = max(found or 0, self.ends[0] + self.ii)
        return found

    def earliest(self, x: int, dur: int) -> Optional[int]:
        """Earliest ``s >= x`` with ``[s, s + dur)`` free modulo ``ii``; None if it never fits."""
        if dur > self.ii:
            return None
        base, r = divmod(x, self.ii)
        base *= self.ii
        wraps = 0
        for _ in range(2 * len(self.starts) + 4):
            end = self._conflict_end(r, dur)
            if end is None:
                return base + r
            r = end
            while r >= self.ii:
                r -= self.ii
                base += self.ii
                wraps += 1
            if wraps > 1:
                return None
        return None

    def add(self, s: int, dur: int) -> None:
        if dur <= 0:
            return
        r = s % self.ii
        i = bisect.bisect_left(self.starts, r)
        self.starts.insert(i, r)
        self.ends.insert(i, r + dur)


@dataclass
class _Timetable:
    ii: int
    start: Dict[str, int]       # host start, units, iteration 0
    stage: Dict[str, int]
    offset: Dict[str, int]


def _resources(problem: Problem, name: str, group: str, stream: Any) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """Resources a task holds during its host part and during its device part (:mod:`autosched.taskmodel`)."""
    p = problem.parts(name, group, stream)
    return p.host_holds, p.device_holds


def _place_fifo(fifos: Dict[str, List[Tuple[int, int, int]]], rings: Dict[str, _Ring], keys: Sequence[str],
                submit: int, est: int, dur: int, ii: int) -> Tuple[Optional[int], Optional[int]]:
    """Device start on FIFO resources (streams, communicators: submission order) and PCIe (any order).

    Each FIFO keeps ``(submit, start, end)`` of the parts already placed (iteration 0).
    The new part starts after every instance submitted no later than it, and must end
    before the next instance of each of those starts. Returns ``(start, None)``, or
    ``(None, t)`` where submitting at ``t`` or later would queue it behind the instance it
    overlaps, or ``(None, None)``.
    """
    fifo_keys = [k for k in keys if k.startswith(("stream:", "comm:"))]
    ring_keys = [k for k in keys if k == "pcie"]
    ds = est
    for _ in range(8):
        for k in fifo_keys:
            for sub, _d, end in fifos.get(k, ()):
                turns = (submit - sub) // ii      # latest instance submitted at or before us
                ds = max(ds, end + turns * ii)
        if ring_keys and dur > 0:
            got = _place(rings, ring_keys, ds, dur, ii)
            if got is None:
                return None, None
            if got != ds:
                ds = got
                continue
        break
    late = None
    for k in fifo_keys:
        for sub, d, _e in fifos.get(k, ()):
            turns = (submit - sub) // ii + 1      # the next instance, submitted after us
            if d + turns * ii < ds + dur:
                # we would overlap it: submitting after it instead may work (see _place_all)
                late = max(late or 0, sub + turns * ii + 1)
    if late is not None:
        return None, late
    for k in fifo_keys:
        fifos.setdefault(k, []).append((submit, ds, ds + dur))
    for k in ring_keys:
        rings.setdefault(k, _Ring(ii)).add(ds, dur)
    return ds, None


def _place(rings: Dict[str, _Ring], keys: Sequence[str], est: int, dur: int, ii: int) -> Optional[int]:
    s = est
    for _ in range(64):
        moved = False
        for k in keys:
            ring = rings.get(k)
            if ring is None:
                ring = rings[k] = _Ring(ii)
            s2 = ring.earliest(s, dur)
            if s2 is None:
                return None
            if s2 != s:
                s, moved = s2, True
        if not moved:
            return s
    return None


def modulo_schedule(problem: Problem, group: Mapping[str, str], stream: Mapping[str, Any],
                    priority: Sequence[str], ii: int, max_depth: Optional[int] = None,
                    repairs: int = 3) -> Optional[_Timetable]:
    """Place one iteration's tasks on a modulo-``ii`` reservation table, in ``priority`` order.

    Parameters
    ----------
    problem : Problem
    group, stream : dict
        Thread group and stream of each task.
    priority : sequence of str
        A topological order of the intra-iteration DAG.
    ii : int
        Target period in time units.
    max_depth : int, optional
        Stage cap (default the problem's).
    repairs : int
        When an inter-iteration dependency on a task placed later fails, the
        waiting task is given that release time and the placement is redone,
        at most this many times.

    Returns
    -------
    _Timetable or None
        None when some task does not fit, a stage would exceed the cap, an
        inter-iteration dependency or the progress barrier is violated.

    Examples
    --------
    A 2 ms task feeding a 3 ms task on another thread fits a 3 ms period once
    the second task moves to the next stage:

    >>> from autosched.costs import CostModel, TaskCost
    >>> from autosched._problem import make_problem
    >>> from autosched.search import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2, time_unit_s=1e-3))
    >>> tt = modulo_schedule(p, {"A": "a", "B": "b"}, p.init_stream, ("A", "B"), ii=3)
    >>> tt.stage, tt.offset
    ({'A': 0, 'B': 1}, {'A': 1, 'B': 0})
    >>> modulo_schedule(p, {"A": "a", "B": "a"}, p.init_stream, ("A", "B"), ii=3) is None   # one thread: 5 ms of work
    True
    """
    cap = problem.max_depth if max_depth is None else max_depth
    if ii <= 0:
        return None
    release: Dict[str, int] = {}
    for _ in range(repairs + 1):
        tt, need = _place_all(problem, group, stream, priority, ii, cap, release)
        if tt is not None or not need:
            return tt
        for t, r in need.items():
            release[t] = max(release.get(t, 0), r)
    return None


def _place_all(problem: Problem, group: Mapping[str, str], stream: Mapping[str, Any], priority: Sequence[str],
               ii: int, cap: int, release: Mapping[str, int]) -> Tuple[Optional[_Timetable], Dict[str, int]]:
    """One placement pass; on an inter-dependency violation also the release times that would fix it."""
    rings: Dict[str, _Ring] = {}
    fifos: Dict[str, List[Tuple[int, int, int]]] = {}
    start: Dict[str, int] = {}
    signal: Dict[str, int] = {}
    dev_start: Dict[str, int] = {}
    dev_end: Dict[str, int] = {}
    for t in priority:
        host_keys, dev_keys = _resources(problem, t, group[t], stream[t])
        est = max(ii * problem.frozen_stage.get(t, 0), release.get(t, 0))
        dest = 0
        for d, n in problem.preds(t):
            if d in start:
                est = max(est, signal[d] - ii * n)
                if problem.cuda:
                    dest = max(dest, dev_end[d] - ii * n)
        s = _place(rings, host_keys, est, problem.dur(t), ii)
        if s is None or s // ii >= cap:
            return None, {}
        for k in host_keys:
            rings[k].add(s, problem.dur(t))
        start[t] = s
        signal[t] = s + problem.dur(t)
        if problem.cuda:
            dd = problem.ddur(t)
            ds, late = _place_fifo(fifos, rings, dev_keys, signal[t], max(signal[t], dest), dd, ii)
            if ds is None:
                # retry with the host part late enough to submit behind the instance it overlapped
                return None, ({t: late - problem.dur(t)} if late is not None else {})
            dev_start[t], dev_end[t] = ds, ds + dd
    # dependencies on tasks placed later (inter-iteration) must hold too
    need: Dict[str, int] = {}
    for t in problem.names:
        for d, n in problem.preds(t):
            if start[t] < signal[d] - ii * n:
                need[t] = max(need.get(t, 0), signal[d] - ii * n)
            elif problem.cuda and dev_start[t] < dev_end[d] - ii * n:
                # the host part is not late, but its device part would be: start the host later
                need[t] = max(need.get(t, 0), start[t] + dev_end[d] - ii * n - dev_start[t])
    if need:
        return None, need
    # Dependencies and the circular reservations only see differences of start times, so the
    # whole iteration may slide by any shift; the shift decides which period window each task
    # falls in (its stage) and so whether the progress barrier holds. Try shift 0, then the
    # shifts that open a window at some task's start.
    shifts = [0] + sorted({(-s) % ii for s in start.values()} - {0})
    end = max(signal.values())
    for shift in shifts:
        stage = {t: (s + shift) // ii for t, s in start.items()}
        depth = max(stage.values()) + 1
        if depth > cap or any(stage[t] != fs for t, fs in problem.frozen_stage.items()):
            continue
        offset = {t: (s + shift) % ii for t, s in start.items()}
        # progress barrier: period p + depth is enqueued when iteration p has retired
        if min(offset.values()) >= end + shift - ii * depth:
            return _Timetable(ii, {t: s + shift for t, s in start.items()}, stage, offset), {}
    return None, {}


# --------------------------------------------------------------------------- bounds used by the search


def recurrence_bound(problem: Problem) -> int:
    """RecMII in time units: the smallest ``II`` leaving no positive cycle of ``time - II * distance``.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> from autosched._problem import make_problem
    >>> from autosched.search import Constraints
    >>> c = NS(tasks={n: NS(host_s=0.001, device_s=0.0, resources=()) for n in "AB"})
    >>> p = make_problem((["A", "B"], [("B", "A")], [("A", "B", 1)]), c, Constraints(time_unit_s=1e-6))
    >>> recurrence_bound(p)
    2000
    """
    from .bounds import max_cycle_ratio  # one RecMII implementation, shared with lower_bounds

    graph = nx.MultiDiGraph()
    graph.add_edges_from((d, t, {"weight": problem.dur(d), "distance": 0}) for t, d in problem.intra)
    graph.add_edges_from((d, t, {"weight": problem.dur(d), "distance": n}) for t, d, n in problem.inter)
    ratio, _ = max_cycle_ratio(graph)
    if math.isinf(ratio):
        raise ValueError("a dependency cycle has zero total distance; the intra-iteration graph must be a DAG")
    # durations are whole time units, so the smallest feasible integer II is the ratio rounded up
    return max(0, math.ceil(ratio * (1 - 1e-9)))


def critical_path_units(problem: Problem) -> int:
    """Longest chain of the intra DAG in time units (thread time).

    Examples
    --------
    >>> from autosched.costs import CostModel, TaskCost
    >>> from autosched._problem import make_problem
    >>> from autosched.search import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2, time_unit_s=1e-3))
    >>> critical_path_units(p)
    5
    """
    return int(critical_path(problem.names, problem.intra, problem.dur)[0])


def _candidate_bound(problem: Problem, group: Mapping[str, str], stream: Mapping[str, Any], rec: int, cap: int) -> int:
    load = resource_loads(problem.parts(t, group[t], stream[t], units=True) for t in problem.names)
    longest = max((problem.dur(t) for t in problem.names), default=0)
    crit = -(-critical_path_units(problem) // cap)
    return max([1, rec, longest, crit, *load.values()])


def derive_timetable(problem: Problem, cand: Candidate, rec: int, max_depth: Optional[int] = None,
                     rel_tol: float = 1e-3, near: Optional[int] = None) -> Optional[_Timetable]:
    """Smallest (by bisection) ``II`` at which :func:`modulo_schedule` places the candidate.

    ``near`` (e.g. the parent candidate's ``II``) narrows the bisection: a
    mutation rarely moves the period far.

    Parameters
    ----------
    problem : Problem
    cand : Candidate
    rec : int
        :func:`recurrence_bound` of the problem.
    max_depth : int, optional
    rel_tol : float
        Bisection stops within this fraction of the period.
    near : int, optional

    Returns
    -------
    _Timetable or None

    Examples
    --------
    >>> from autosched.costs import CostModel, TaskCost
    >>> from autosched._problem import make_problem
    >>> from autosched.search import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2, time_unit_s=1e-3))
    >>> tt = derive_timetable(p, Candidate(("a", "b"), (None, None), ("A", "B")), rec=0)
    >>> tt.ii, tt.stage
    (3, {'A': 0, 'B': 1})
    """
    cap = problem.max_depth if max_depth is None else max_depth
    group = dict(zip(problem.names, cand.group))
    stream = dict(zip(problem.names, cand.stream))

    def place(ii: int) -> Optional[_Timetable]:
        return modulo_schedule(problem, group, stream, cand.priority, ii, cap)

    lo = _candidate_bound(problem, group, stream, rec, cap)
    found = place(lo)
    if found is not None:
        return found
    lo += 1
    ceiling = max(lo, sum(problem.dur(n) + problem.ddur(n) for n in problem.names))
    hi = None
    if near is not None and near >= lo:
        # gallop up from the parent's period: 0.5%, 1%, 2%, ... above it
        step = max(1, near // 200)
        probe = near
        while probe <= 8 * ceiling:
            found = place(probe)
            if found is not None:
                hi = probe
                break
            lo, probe, step = probe + 1, probe + step, step * 2
    if hi is None:
        hi = max(lo, ceiling)
        for _ in range(4):
            found = place(hi)
            if found is not None:
                break
            hi *= 2
        if found is None:
            return None
    while hi - lo > max(1, int(hi * rel_tol)):
        mid = (lo + hi) // 2
        got = place(mid)
        if got is not None:
            hi, found = mid, got
        else:
            lo = mid + 1
    return found


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
    >>> from autosched._problem import make_problem
    >>> from autosched.search import Constraints
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
    >>> from autosched.costs import CostModel, TaskCost
    >>> from autosched._problem import make_problem
    >>> from autosched.search import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2, time_unit_s=1e-3))
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
    >>> from autosched.costs import CostModel, TaskCost
    >>> from autosched._problem import make_problem
    >>> from autosched.search import Constraints
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


# --------------------------------------------------------------------------- stages, small graphs


def stage_assignments(problem: Problem, limit: Optional[int] = None) -> Iterable[Dict[str, int]]:
    """Every stage assignment the stage rules, the depth cap and frozen stages allow.

    Assignments whose smallest stage is above 0 are skipped when no stage is
    frozen: they only relabel periods (same timing, deeper pipeline).

    Parameters
    ----------
    problem : Problem
    limit : int, optional
        Stop after this many.

    Yields
    ------
    dict
        ``{task: stage}``.

    Examples
    --------
    >>> from autosched.costs import CostModel, TaskCost
    >>> from autosched._problem import make_problem
    >>> from autosched.search import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2, time_unit_s=1e-3))
    >>> list(stage_assignments(p))   # B may not run in an earlier stage than A (the stage rule)
    [{'A': 0, 'B': 0}, {'A': 0, 'B': 1}]
    """
    names = list(nx.topological_sort(problem.dag))
    inter_by_task: Dict[str, List[Tuple[str, int]]] = {}
    for t, d, n in problem.inter:
        inter_by_task.setdefault(t, []).append((d, n))
        inter_by_task.setdefault(d, []).append((t, -n))
    count = 0
    stage: Dict[str, int] = {}

    def rec(i: int) -> Iterable[Dict[str, int]]:
        nonlocal count
        if limit is not None and count >= limit:
            return
        if i == len(names):
            if problem.frozen_stage or min(stage.values(), default=0) == 0:
                count += 1
                yield dict(stage)
            return
        n = names[i]
        lo = max((stage[p] for p in problem.dag.predecessors(n)), default=0)
        options = [problem.frozen_stage[n]] if n in problem.frozen_stage else range(lo, problem.max_depth)
        for s in options:
            if s < lo:
                continue
            ok = True
            for other, k in inter_by_task.get(n, ()):
                if other in stage:
                    # k > 0: n waits `other` k earlier -> stage[other] - s <= k; k < 0: other waits n -> s - stage[other] <= -k
                    if not (stage_rule_holds(s, stage[other], k) if k > 0 else stage_rule_holds(stage[other], s, -k)):
                        ok = False
                        break
            if ok:
                stage[n] = s
                yield from rec(i + 1)
                del stage[n]

    yield from rec(0)


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
                       "invalid": 0, "pruned": 0, "stage_enumerated": 0}
        self.seen: Dict[tuple, Optional[Scored]] = {}
        self.sim_cache: Dict[tuple, Tuple[float, float]] = {}

    @staticmethod
    def plan_key(plan: PipelinePlan) -> tuple:
        return tuple((ref_name(k), s.stage, s.thread_group, stream_name(s.stream)) for k, s in plan.schedule.items()) + (
            tuple(ref_name(r) for r in plan.enqueue_order or ()),)

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
            group = dict(zip(self.problem.names, sc.cand.group))
            stream = dict(zip(self.problem.names, sc.cand.stream))
            sc.plan = build_plan(self.problem, sc.stage, group, stream, sc.cand.priority, sc.offset or None)
        got = self.score_plan(sc.plan)
        if got is None:
            return False
        sc.period, sc.latency = got
        return True

    def evaluate(self, cand: Candidate, max_depth: Optional[int] = None) -> Optional[Scored]:
        """Derive and simulate."""
        sc = self.derive(cand, max_depth)
        return sc if sc is not None and self.simulate(sc) else None

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
    cand = Candidate(_canonical_groups(problem, groups), tuple(base.sched(n).stream for n in problem.names),
                     tuple(plan.enqueue_order), "given plan as is")
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


def beam_search(problem: Problem, *, width: int = 6, rounds: int = 20, patience: int = 3,
                time_limit_s: float = 10.0, seed: int = 0, scorer: Optional[Scorer] = None,
                progress: bool = False, enumerate_stages_below: int = 400,
                moves_per_round: Optional[int] = None) -> BeamResult:
    """Search thread map x stream map x fire order; stages derived; score by the simulator.

    Parameters
    ----------
    problem : Problem
        From :func:`autosched._problem.make_problem`.
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
    >>> from autosched.costs import CostModel, TaskCost
    >>> from autosched._problem import make_problem
    >>> from autosched.search import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2, time_unit_s=1e-3))
    >>> best = beam_search(p, time_limit_s=10).best
    >>> round(best.period * 1e3, 6), best.plan.stage("B"), best.threads
    (3.0, 1, 2)
    """
    t0 = time.perf_counter()
    # keep a little of the budget for the last simulation, which may overrun the deadline
    deadline = t0 + time_limit_s - min(0.5, 0.05 * time_limit_s)
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
                             fire_order(problem, "declared"), "fallback")
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
    >>> from autosched.costs import CostModel, TaskCost
    >>> from autosched._problem import make_problem
    >>> from autosched.search import Constraints
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
