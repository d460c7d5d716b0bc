"""Modulo list scheduling: the stages, offsets and period a candidate implies.

A :class:`Candidate` fixes a thread map (task -> group), a stream map (task ->
stream) and a fire order (a topological order of the intra-iteration DAG). For
a target period ``II`` (integer time units) every task, in fire order, is placed
at the earliest time its dependencies allow where everything its parts hold
(:mod:`autosched.model.taskmodel`: thread, sequencer, stream, communicator, PCIe) is
free modulo ``II``: a modulo reservation table (:class:`_Ring` per resource,
FIFO order for streams and communicators, and :class:`_Pool`, ``cores``
places, for the core pool when it has fewer cores than the candidate has
threads). Its stage is ``start // II``;
:func:`derive_timetable` finds the smallest ``II`` that places every task by
bisection. The beam search (:mod:`autosched.search.beam`) ranks candidates by it
before simulating the best.

The main thread (docs/semantics.md, "The caller's group") spends the
per-period engine time (:attr:`~autosched.search.problem.Problem.period_overhead_s`)
before it enqueues a period; a period is enqueued only once the oldest
iteration has retired and, when the candidate runs a group inline, once the
main thread has run that group's tasks of the previous period. So a window of
``II`` that opens where the period is enqueued holds the caller's group's
tasks of that period and the engine time: they end by ``II`` minus the engine
time. The placement itself is the same for an inline group as for a worker's
(one ring); the window is checked when the stages are read off, over the
shifts of the timetable. Hand-offs need no check: the plan's enqueue order
places each worker's task after the inline tasks that end by its start in
the timetable (:func:`autosched.search.plans.enqueue_order_for`), so it is
handed off no later than the timetable starts it. A late hand-off
(``Candidate.handoff``) is left to the simulator, which scores every plan.
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from autosched.model.taskmodel import CORES, pool_limit, resource_loads
from autosched.search.bounds import critical_path_units
from autosched.search.found import Candidate, Timetable
from autosched.search.problem import Problem

__all__ = ["modulo_schedule", "derive_timetable", "inline_label"]


def inline_label(problem: Problem, names: Sequence[str], group: Sequence[str], inline: Optional[str]) -> Optional[str]:
    """The label of the group run on the caller's thread: the frozen caller's group, else ``inline``'s group."""
    if problem.forced_caller is not None:
        return problem.forced_caller
    return None if inline is None else group[list(names).index(inline)]



class _Ring:
    """Busy intervals of one resource on a circle of length ``ii`` (integer time units).

    Examples
    --------
    >>> ring = _Ring(10)
    >>> ring.add(2, 3)        # busy [2, 5)
    >>> ring.add(8, 4)        # busy [8, 10) and, wrapped, [0, 2)
    >>> ring.earliest(0, 3)   # [0, 2) and [2, 5) are taken
    5
    >>> ring.earliest(6, 2)   # [6, 8) is free
    6
    >>> ring.earliest(6, 3)   # next turn: [15, 18) = [5, 8) mod 10
    15
    >>> ring.earliest(0, 4) is None, ring.earliest(0, 11) is None   # no 4-long gap anywhere; longer than the period
    (True, True)
    """

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


class _Pool:
    """Busy intervals of the core pool on a circle of length ``ii``: at most ``cap`` at any point.

    Same interface as :class:`_Ring` (a ring is a pool of one place).

    Examples
    --------
    >>> pool = _Pool(10, 2)
    >>> pool.add(0, 6); pool.add(2, 6)
    >>> pool.earliest(0, 3), pool.earliest(0, 2), pool.earliest(9, 3)   # [2, 6) has both places taken
    (6, 0, 9)
    >>> pool.earliest(0, 11) is None   # longer than the period
    True

    A part placed across the end of the circle takes a place at its start too:

    >>> pool = _Pool(10, 2)
    >>> pool.add(2, 3); pool.add(4, 4); pool.add(8, 4)   # [2, 5), [4, 8), [8, 10) + [0, 2): [4, 5) is full
    >>> pool.earliest(0, 4), pool.earliest(0, 5)   # [0, 4) has at most one part running
    (0, 5)
    >>> pool.earliest(3, 1), pool.earliest(4, 1)
    (3, 5)
    >>> pool.earliest(6, 9)   # [5, 10) + [0, 4) of the next turn
    15
    >>> full = _Pool(10, 1)
    >>> full.add(0, 10)
    >>> full.earliest(3, 1) is None   # the one core is never free
    True
    """

    __slots__ = ("ii", "cap", "spans")

    def __init__(self, ii: int, cap: int) -> None:
        self.ii, self.cap = ii, cap
        self.spans: List[Tuple[int, int]] = []   # (start modulo ii, duration)

    def _profile(self) -> List[Tuple[int, int, int]]:
        """``(start, end, parts running)`` segments covering ``[0, ii)``."""
        delta: Dict[int, int] = {0: 0}
        for r, d in self.spans:
            e = r + d
            delta[r] = delta.get(r, 0) + 1
            if e <= self.ii:
                delta[e] = delta.get(e, 0) - 1
            else:  # wraps: busy on [r, ii) and [0, e - ii)
                delta[0] += 1
                delta[e - self.ii] = delta.get(e - self.ii, 0) - 1
        points = sorted(p for p in delta if p < self.ii)
        out, level = [], 0
        for a, b in zip(points, points[1:] + [self.ii]):
            level += delta[a]
            out.append((a, b, level))
        return out

    def earliest(self, x: int, dur: int) -> Optional[int]:
        """Earliest ``s >= x`` with a free place on all of ``[s, s + dur)`` modulo ``ii``; None if never."""
        if dur > self.ii:
            return None
        if dur <= 0 or not self.spans:
            return x
        base = (x // self.ii) * self.ii
        run = None   # start of the current stretch with a free place
        profile = self._profile()
        for turn in range(3):   # x lies in the first turn and dur <= ii: three turns hold any fit
            for a, b, level in profile:
                a, b = base + turn * self.ii + a, base + turn * self.ii + b
                if b <= x:
                    continue
                if level >= self.cap:
                    run = None
                    continue
                run = max(a, x) if run is None else run
                if b - run >= dur:
                    return run
        return None

    def add(self, s: int, dur: int) -> None:
        if dur > 0:
            self.spans.append((s % self.ii, dur))


def _resources(problem: Problem, name: str, group: str, stream: Any) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """Resources a task holds during its host part and during its device part (:mod:`autosched.model.taskmodel`)."""
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
                    repairs: int = 3, inline: Optional[str] = None) -> Optional[Timetable]:
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
    inline : str, optional
        The label of the group run on the caller's thread (the module
        docstring): its tasks of a period and the per-period engine time fit
        one window.

    Returns
    -------
    Timetable or None
        None when some task does not fit, a stage would exceed the cap, an
        inter-iteration dependency, the progress barrier or (``inline``) the
        main thread's window is violated.

    Examples
    --------
    A 2 ms task feeding a 3 ms task on another thread fits a 3 ms period once
    the second task moves to the next stage:

    >>> from swpipe import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> from swpipe import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2), time_unit_s=1e-3)
    >>> tt = modulo_schedule(p, {"A": "a", "B": "b"}, p.init_stream, ("A", "B"), ii=3)
    >>> tt.stage, tt.offset
    ({'A': 0, 'B': 1}, {'A': 1, 'B': 0})
    >>> modulo_schedule(p, {"A": "a", "B": "a"}, p.init_stream, ("A", "B"), ii=3) is None   # one thread: 5 ms of work
    True

    B on the caller's thread: still 3 ms, the main thread runs B's 3 ms each period. With 1 ms of
    engine time per period on the main thread as well, 3 ms no longer fit:

    >>> modulo_schedule(p, {"A": "a", "B": "b"}, p.init_stream, ("A", "B"), ii=3, inline="b").stage
    {'A': 0, 'B': 1}
    >>> from swpipe_core.measure.calibrate import MachineCalibration   # the measured machine: advanced, not public
    >>> p.calibration = MachineCalibration(period_s=0.001)
    >>> modulo_schedule(p, {"A": "a", "B": "b"}, p.init_stream, ("A", "B"), ii=3, inline="b") is None
    True
    >>> modulo_schedule(p, {"A": "a", "B": "b"}, p.init_stream, ("A", "B"), ii=4, inline="b").stage
    {'A': 0, 'B': 1}
    """
    cap = problem.max_depth if max_depth is None else max_depth
    if ii <= 0:
        return None
    release: Dict[str, int] = {}
    for _ in range(repairs + 1):
        tt, need = _place_all(problem, group, stream, priority, ii, cap, release, inline)
        if tt is not None or not need:
            return tt
        for t, r in need.items():
            release[t] = max(release.get(t, 0), r)
    return None


def _place_all(problem: Problem, group: Mapping[str, str], stream: Mapping[str, Any], priority: Sequence[str],
               ii: int, cap: int, release: Mapping[str, int],
               inline: Optional[str] = None) -> Tuple[Optional[Timetable], Dict[str, int]]:
    """One placement pass; on an inter-dependency violation also the release times that would fix it."""
    rings: Dict[str, Any] = {}
    cores = pool_limit(problem.cores, len(set(group[t] for t in problem.names)))
    if cores is not None:  # every host part that takes a core takes one of the pool's places
        rings[CORES] = _Pool(ii, cores)
    fifos: Dict[str, List[Tuple[int, int, int]]] = {}
    start: Dict[str, int] = {}
    signal: Dict[str, int] = {}
    dev_start: Dict[str, int] = {}
    dev_end: Dict[str, int] = {}
    for t in priority:
        host_keys, dev_keys = _resources(problem, t, group[t], stream[t])
        if cores is None:  # the pool cannot make a part wait: no place to reserve
            host_keys = tuple(k for k in host_keys if k != CORES)
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
    engine = problem.period_units()
    on_main = [t for t in problem.names if inline is not None and group[t] == inline]
    for shift in shifts:
        stage = {t: (s + shift) // ii for t, s in start.items()}
        depth = max(stage.values()) + 1
        if depth > cap or any(stage[t] != fs for t, fs in problem.frozen_stage.items()):
            continue
        offset = {t: (s + shift) % ii for t, s in start.items()}
        # The period is enqueued at some w <= the first offset (every task starts after it), the engine time
        # after the retirement of iteration p - depth (the progress barrier), and, with a group inline, after
        # the main thread ran that group's tasks of the period before: they end by w + ii - engine time.
        w = max([0, end + shift + engine - ii * depth] + [offset[t] + problem.dur(t) + engine - ii for t in on_main])
        if min(offset.values()) >= w:
            return Timetable(ii, {t: s + shift for t, s in start.items()}, stage, offset), {}
    return None, {}


def _candidate_bound(problem: Problem, group: Mapping[str, str], stream: Mapping[str, Any], rec: int, cap: int,
                     inline: Optional[str] = None) -> int:
    load = resource_loads((problem.parts(t, group[t], stream[t], units=True) for t in problem.names), problem.cores)
    engine = problem.period_units()
    main = engine + (load.get(f"thread:{inline}", 0) if inline is not None else 0)  # the main thread's work
    longest = max((problem.dur(t) for t in problem.names), default=0)
    crit = -(-critical_path_units(problem) // cap)
    return max([1, rec, longest, crit, main, *(math.ceil(v) for v in load.values())])  # the pool's load is fractional


def derive_timetable(problem: Problem, cand: Candidate, rec: int, max_depth: Optional[int] = None,
                     rel_tol: float = 1e-3, near: Optional[int] = None) -> Optional[Timetable]:
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
    Timetable or None

    Examples
    --------
    >>> from swpipe import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> from swpipe import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2), time_unit_s=1e-3)
    >>> tt = derive_timetable(p, Candidate(("a", "b"), (None, None), ("A", "B")), rec=0)
    >>> tt.ii, tt.stage
    (3, {'A': 0, 'B': 1})
    """
    cap = problem.max_depth if max_depth is None else max_depth
    group = dict(zip(problem.names, cand.group))
    stream = dict(zip(problem.names, cand.stream))
    inline = inline_label(problem, problem.names, cand.group, cand.inline)

    def place(ii: int) -> Optional[Timetable]:
        return modulo_schedule(problem, group, stream, cand.priority, ii, cap, inline=inline)

    lo = _candidate_bound(problem, group, stream, rec, cap, inline)
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

