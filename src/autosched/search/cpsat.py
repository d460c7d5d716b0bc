"""CP-SAT joint model: stage x thread group x stream x fire order, by modulo scheduling.

For a fixed period ``II`` (integer time units) every task ``t`` of iteration
``i`` starts at ``i * II + start[t]`` with ``start[t] = II * stage[t] +
offset[t]`` and ``0 <= offset[t] < II``; all tasks of one period start inside
that period's window, so the enqueue order is simply the tasks sorted by
offset. The model holds exactly the engine's rules (CPU semantics):

* **dependencies** ``start[t] >= start[d] + time[d] - II * distance``
  (intra: distance 0; inter: ``N``) — the stage rules follow;
* **threads**: a task runs on one of ``max_threads`` groups (optional
  intervals per (task, group)); a group's tasks never overlap on the circle of
  length ``II`` (each interval and its copy shifted by ``II`` in one
  ``NoOverlap``), which is also the FIFO order of its queue;
* **sequencer**, **communicators** and **PCIe** likewise serialise their tasks;
* the **core pool** (``CostModel.cores``, :mod:`autosched.model.taskmodel`): at most
  ``cores`` host parts that take a core at once, a ``Cumulative`` of capacity ``cores`` over the
  same circular host intervals (exact on the circle, as the ``NoOverlap`` is),
  posted when the pool has fewer cores than the model has thread slots (else
  it cannot bind); the period's lower bound includes host work / ``cores``;
* the **main thread** (docs/semantics.md, "The caller's group"): it spends the
  per-period engine time ``E`` (:attr:`~autosched.search.problem.Problem.period_overhead_s`)
  before it enqueues a period, and at most one group slot runs on it
  (``inline[j]``; forced for a group frozen under the caller's group's name,
  none when the problem has no caller's group). The period is enqueued at
  ``window`` (``0 <= window <= offset[t]`` for every task: every task of the
  period starts after it); the main thread runs the inline slot's tasks of
  the period and then the next period's engine time within that window:
  ``offset[t] + time[t] <= window + II - E`` for a task of the inline slot;
* the **progress barrier**: period ``p + depth`` is enqueued, engine time
  first, when iteration ``p`` has retired, so
  ``window >= iter_end + E - II * depth`` with ``depth = max(stage) + 1``;
* **hand-offs** need no constraint of their own: the plan's enqueue order
  places each worker's task after the inline tasks that end by its start in
  the model, or that it waits for through a dependency, its FIFO or the
  sequencer, which the model already holds
  (:func:`autosched.search.problem.enqueue_order_for`): it is handed off no later
  than the model starts it (a late hand-off on purpose is the beam search's
  move, scored by the simulator);
* ``stage[t] <= max_depth - 1`` and frozen stages, streams and groups.

On CUDA the device part of each task is modelled on its stream (a choice) as a
second circular interval starting after its host part; that part of the model
is an approximation of the simulator's stream semantics, which is why the
final plan is always scored by the simulator.

The outer loop searches ``II`` from a lower bound upward (first the bound, then
bisection up to a known feasible ``II``). A proven-infeasible ``II`` proves
every smaller one infeasible (the constraints only loosen as ``II`` grows), so
``OPTIMAL`` means: no plan in the space reaches a smaller period in this model.
At the best period a last solve minimises the depth, then the iteration's
length. The solution, and the one it refined, are read as plans with each
group whose tasks fit the main thread's window on the caller's thread (the
solved inline slot among them), or with none; the simulator ranks these
readings, a group inline winning a tie (it starts no worker; :func:`_plan_of`).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan, stream_name

from autosched.search.problem import Problem, build_plan
from autosched.model.taskmodel import pool_limit

__all__ = ["CpsatResult", "solve_cpsat", "model_lower_bound"]

log = logging.getLogger(__name__)


@dataclass
class CpsatResult:
    """What the CP-SAT search found.

    ``status`` is ``OPTIMAL`` (the model's minimum period is proven),
    ``FEASIBLE`` (a plan was found, optimality not proven in time) or
    ``UNKNOWN`` (no plan in time). ``ii`` and ``bound`` are in time units
    (``unit_s`` seconds each); ``bound`` is the largest period proven to be a
    lower bound (every smaller ``II`` was proven infeasible or is below the
    analytic bound).
    """

    status: str
    ii: Optional[int]
    bound: int
    unit_s: float
    plan: Optional[PipelinePlan] = None
    stage: Dict[str, int] = field(default_factory=dict)
    offset: Dict[str, int] = field(default_factory=dict)
    group: Dict[str, str] = field(default_factory=dict)
    stream: Dict[str, Any] = field(default_factory=dict)
    tried: List[Tuple[int, str]] = field(default_factory=list)
    solve_time_s: float = 0.0
    refined: str = ""            # status of the final solve minimising depth then latency at ``ii``

    @property
    def period_s(self) -> Optional[float]:
        return None if self.ii is None else self.ii * self.unit_s

    @property
    def bound_s(self) -> float:
        """A lower bound on the real-valued period, in seconds.

        An infeasible integer ``II = b - 1`` proves every period up to ``(b - 1)``
        units impossible; a fractional period just above it is not excluded, so
        the bound is ``(b - 1)`` units then, and ``b`` units when it is the
        analytic bound itself.
        """
        proved = any(status == "INFEASIBLE" and ii == self.bound - 1 for ii, status in self.tried)
        return (self.bound - 1 if proved else self.bound) * self.unit_s


def model_lower_bound(problem: Problem) -> int:
    """A period no plan can beat, in time units (resources, recurrences, depth-limited critical path, the main thread's
    engine time per period).

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> from autosched.search.problem import make_problem
    >>> from autosched.search.entry import Constraints
    >>> c = NS(tasks={n: NS(host_s=0.003, device_s=0.0, resources=()) for n in "ABC"})
    >>> p = make_problem((list("ABC"), [("B", "A"), ("C", "B")]), c, Constraints(max_threads=2, max_depth=3, time_unit_s=1e-3))
    >>> model_lower_bound(p)   # 9 units of work on 2 threads
    5
    >>> c.cores = 1
    >>> model_lower_bound(p)   # 9 units of work on 1 core
    9
    """
    from autosched.search.bounds import critical_path_units, recurrence_bound
    from autosched.model.taskmodel import resource_loads

    names = problem.names
    threads = min(problem.max_threads, len(names))
    bounds = [1, recurrence_bound(problem), problem.period_units(), max((problem.dur(n) for n in names), default=0),
              -(-sum(problem.dur(n) for n in names) // max(1, threads)),
              -(-critical_path_units(problem) // problem.max_depth)]
    # shared resources (sequencer, comm:, pcie, the core pool) hold the same whatever the thread and stream choice
    loads = resource_loads((problem.parts(n, "", None, units=True) for n in names), problem.cores)
    shared = {k: v for k, v in loads.items() if not k.startswith(("thread:", "stream:"))}
    bounds += [math.ceil(v) for v in shared.values()]  # the pool's load (work per core) is fractional
    if problem.cuda:
        streams = {stream_name(s) for n in names for s in problem.stream_choices[n]}
        bounds.append(-(-sum(problem.ddur(n) for n in names) // max(1, len(streams))))
        bounds.append(max((problem.ddur(n) for n in names), default=0))
        pinned: Dict[str, int] = {}
        for n in names:
            if len(problem.stream_choices[n]) == 1:
                key = stream_name(problem.stream_choices[n][0])
                pinned[key] = pinned.get(key, 0) + problem.ddur(n)
        bounds += list(pinned.values())
    return max(bounds)


# --------------------------------------------------------------------------- build


@dataclass
class _Model:
    model: Any
    ii: int
    stage: Dict[str, Any]
    offset: Dict[str, Any]
    in_group: Dict[Tuple[str, int], Any]
    in_stream: Dict[Tuple[str, int], Any]
    slots: List[str]
    streams: List[Any]
    depth_minus_1: Any
    iter_end: Any
    inline: Dict[int, Any] = field(default_factory=dict)   # slot -> "runs on the caller's thread"
    solutions: Optional[List[dict]] = None   # when a list: every solution the solve finds, in order (_solve)


class _Builder:
    """The CP-SAT model of one period ``II``, built in named phases (see :func:`_build`)."""

    def __init__(self, problem: Problem, ii: int) -> None:
        from ortools.sat.python import cp_model

        self.m = cp_model.CpModel()
        self.problem, self.ii = problem, ii
        self.names = problem.names
        self.D = problem.max_depth
        self.dur = {t: problem.dur(t) for t in self.names}
        self.horizon = ii * (self.D + 1) + sum(self.dur.values()) + sum(problem.ddur(t) for t in self.names)
        self.dev_start: Dict[str, Any] = {}

    def circular(self, name: str, off: Any, size: int, present: Any = None) -> List[Any]:
        """The interval at ``off`` and its copy one period later (both or neither present)."""
        m, ii = self.m, self.ii
        if size <= 0:
            return []
        if present is None:
            return [m.NewFixedSizeIntervalVar(off, size, f"{name}"), m.NewFixedSizeIntervalVar(off + ii, size, f"{name}+II")]
        return [m.NewOptionalFixedSizeIntervalVar(off, size, present, f"{name}"),
                m.NewOptionalFixedSizeIntervalVar(off + ii, size, present, f"{name}+II")]

    def when(self) -> None:
        """Stage and offset of every task; its host start is ``II * stage + offset``."""
        m, p = self.m, self.problem
        self.stage = {t: (m.NewConstant(p.frozen_stage[t]) if t in p.frozen_stage
                          else m.NewIntVar(0, self.D - 1, f"stage[{t}]")) for t in self.names}
        self.offset = {t: m.NewIntVar(0, self.ii - 1, f"offset[{t}]") for t in self.names}
        self.start = {t: self.ii * self.stage[t] + self.offset[t] for t in self.names}

    def thread_groups(self) -> None:
        """Each task in exactly one group slot (frozen names first, then free slots, symmetry broken)."""
        m, p, names = self.m, self.problem, self.names
        fixed = sorted(set(p.frozen_group.values()))
        n_slots = max(len(fixed), min(p.max_threads, len(names)))
        self.slots = fixed + [f"g{j}" for j in range(n_slots - len(fixed))]
        self.in_group: Dict[Tuple[str, int], Any] = {}
        free_rank = 0
        for t in names:
            for j in range(n_slots):
                self.in_group[t, j] = m.NewBoolVar(f"in_group[{t},{self.slots[j]}]")
            if t in p.frozen_group:
                for j in range(n_slots):
                    m.Add(self.in_group[t, j] == int(self.slots[j] == p.frozen_group[t]))
            else:
                # symmetry: the k-th free task may open at most free slot k
                for j in range(len(fixed) + free_rank + 1, n_slots):
                    m.Add(self.in_group[t, j] == 0)
                free_rank += 1
            m.AddExactlyOne(self.in_group[t, j] for j in range(n_slots))

    def caller(self) -> None:
        """Which slot, if any, runs on the caller's thread: the frozen caller's group, else at most one free slot."""
        p, m = self.problem, self.m
        self.inline: Dict[int, Any] = {}
        if p.caller_group is None:
            return
        if p.forced_caller is not None:
            self.inline[self.slots.index(p.forced_caller)] = m.NewConstant(1)
            return
        fixed = set(p.frozen_group.values())
        for j, slot in enumerate(self.slots):
            if slot not in fixed:
                self.inline[j] = m.NewBoolVar(f"inline[{slot}]")
                m.Add(sum(self.in_group[t, j] for t in self.names) >= 1).OnlyEnforceIf(self.inline[j])  # a group
        if len(self.inline) > 1:
            m.AddAtMostOne(self.inline.values())

    def streams(self) -> None:
        """Each task on exactly one of its stream choices (a choice only on CUDA)."""
        self.stream_list: List[Any] = []
        for t in self.names:
            for s in self.problem.stream_choices[t]:
                if s not in self.stream_list:
                    self.stream_list.append(s)
        self.in_stream: Dict[Tuple[str, int], Any] = {}
        for t in self.names:
            for k, s in enumerate(self.stream_list):
                if s in self.problem.stream_choices[t]:
                    self.in_stream[t, k] = self.m.NewBoolVar(f"in_stream[{t},{stream_name(s)}]")
            self.m.AddExactlyOne(v for (tt, _), v in self.in_stream.items() if tt == t)

    def host_resources(self) -> None:
        """Threads and the sequencer: host intervals on circles of length II."""
        m, names = self.m, self.names
        for j in range(len(self.slots)):
            m.AddNoOverlap([iv for t in names for iv in self.circular(f"thread[{t},{self.slots[j]}]", self.offset[t],
                                                                      self.dur[t], self.in_group[t, j])])
        ordered = [t for t in names if t in self.problem.ordered]
        if len(ordered) > 1:
            m.AddNoOverlap([iv for t in ordered for iv in self.circular(f"sequencer[{t}]", self.offset[t], self.dur[t])])
        cores = pool_limit(self.problem.cores, len(self.slots))
        if cores is not None:
            # the circle [0, II) maps onto [II, 2 II) of the line, where each task's interval and its
            # copy cover exactly the circle's points: the line's peak is the circle's
            pool = [iv for t in names if self.problem.parts(t, "", None).takes_core
                    for iv in self.circular(f"cores[{t}]", self.offset[t], self.dur[t])]
            if pool:
                m.AddCumulative(pool, [1] * len(pool), cores)

    def device_parts(self) -> None:
        """CUDA: device parts submitted when the host part ends, FIFO per stream and per communicator.

        In window coordinates (the period in which it was submitted): ``sub_off`` in
        ``[0, II)`` and ``dev_rel = sub_off + lag``.
        """
        m, p, ii, names = self.m, self.problem, self.ii, self.names
        self.shared_off: Dict[str, Any] = dict(self.offset)
        self.shared_size: Dict[str, int] = dict(self.dur)
        if not p.cuda:
            return
        sub_turn, sub_off, dev_rel = {}, {}, {}
        for t in names:
            sub_turn[t] = m.NewIntVar(0, self.D + 1, f"submit_turn[{t}]")
            sub_off[t] = m.NewIntVar(0, ii - 1, f"submit_offset[{t}]")
            m.Add(ii * sub_turn[t] + sub_off[t] == self.start[t] + self.dur[t])
            lag = m.NewIntVar(0, self.horizon, f"device_lag[{t}]")
            dev_rel[t] = sub_off[t] + lag
            self.dev_start[t] = ii * sub_turn[t] + dev_rel[t]
        for a, b in itertools.combinations(names, 2):
            shared_streams = [k for k in range(len(self.stream_list))
                              if (a, k) in self.in_stream and (b, k) in self.in_stream]
            same_comm = p.comm[a] is not None and p.comm[a] == p.comm[b]
            if not shared_streams and not same_comm:
                continue
            first = m.NewBoolVar(f"submitted_first[{a},{b}]")
            m.Add(sub_off[a] <= sub_off[b]).OnlyEnforceIf(first)
            m.Add(sub_off[b] <= sub_off[a]).OnlyEnforceIf(first.Not())
            conds = [[self.in_stream[a, k], self.in_stream[b, k]] for k in shared_streams] + ([[]] if same_comm else [])
            for cond in conds:
                # a then b in one window, and b before a of the next window (and the converse)
                m.Add(dev_rel[b] >= dev_rel[a] + p.ddur(a)).OnlyEnforceIf([first] + cond)
                m.Add(dev_rel[a] + ii >= dev_rel[b] + p.ddur(b)).OnlyEnforceIf([first] + cond)
                m.Add(dev_rel[a] >= dev_rel[b] + p.ddur(b)).OnlyEnforceIf([first.Not()] + cond)
                m.Add(dev_rel[b] + ii >= dev_rel[a] + p.ddur(a)).OnlyEnforceIf([first.Not()] + cond)
        for t in names:
            if t in p.pcie:
                # PCIe copies take turns in any order: a circular NoOverlap on their device offsets
                turn = m.NewIntVar(0, self.horizon // ii + 2, f"pcie_turn[{t}]")
                off = m.NewIntVar(0, ii - 1, f"pcie_offset[{t}]")
                m.Add(ii * turn + off == self.dev_start[t])
                self.shared_off[t], self.shared_size[t] = off, p.ddur(t)

    def shared_resources(self) -> None:
        """Communicators (CPU: any order on host time) and PCIe serialise."""
        p = self.problem
        groups: Dict[str, List[str]] = {}
        for t in self.names:
            for key in p.tags(t):
                if key == "pcie" or not p.cuda:  # on CUDA communicators are FIFOs (device_parts)
                    groups.setdefault(key, []).append(t)
        for key, members in groups.items():
            if len(members) > 1:
                self.m.AddNoOverlap([iv for t in members
                                     for iv in self.circular(f"{key}[{t}]", self.shared_off[t], self.shared_size[t])])

    def dependencies(self) -> None:
        """Every dependency (intra distance 0, inter distance N), on the host and on the device."""
        p, ii = self.problem, self.ii
        for t in self.names:
            for d, n in p.preds(t):
                self.m.Add(self.start[t] >= self.start[d] + self.dur[d] - ii * n)
                if p.cuda:
                    self.m.Add(self.dev_start[t] >= self.dev_start[d] + p.ddur(d) - ii * n)

    def barrier(self) -> None:
        """The main thread's window: the progress barrier, the engine time, the inline slot's tasks."""
        m, names, ii = self.m, self.names, self.ii
        engine = self.problem.period_units()
        self.iter_end = m.NewIntVar(0, self.horizon, "iter_end")
        for t in names:
            m.Add(self.iter_end >= self.start[t] + self.dur[t])
        self.depth_minus_1 = m.NewIntVar(0, self.D - 1, "depth_minus_1")
        m.AddMaxEquality(self.depth_minus_1, [self.stage[t] for t in names])
        window = m.NewIntVar(0, ii - 1, "window")   # when the period is enqueued
        for t in names:
            m.Add(window <= self.offset[t])
        # period p + depth is enqueued, the engine's time first, once iteration p has retired
        m.Add(window >= self.iter_end + engine - ii * (self.depth_minus_1 + 1))
        for j, on_main in self.inline.items():
            for t in names:
                m.Add(self.offset[t] + self.dur[t] <= window + ii - engine).OnlyEnforceIf(
                    [self.in_group[t, j], on_main])

    def objective(self) -> None:
        """At the best period: fewest batches in flight (memory), then the shortest iteration."""
        self.m.Minimize(self.depth_minus_1 * (self.horizon + 1) + self.iter_end)

    def hints(self, hint: dict) -> None:
        """Start from a known plan (the beam's best)."""
        p = self.problem
        for t in self.names:
            if t not in p.frozen_stage and t in hint.get("stage", {}):
                self.m.AddHint(self.stage[t], min(self.D - 1, hint["stage"][t]))
            if t in hint.get("offset", {}):
                self.m.AddHint(self.offset[t], min(self.ii - 1, max(0, hint["offset"][t])))
            if t in hint.get("slot", {}) and t not in p.frozen_group:
                for j in range(len(self.slots)):
                    self.m.AddHint(self.in_group[t, j], int(j == hint["slot"][t]))
        if "inline" in hint and p.forced_caller is None:
            for j, var in self.inline.items():
                self.m.AddHint(var, int(j == hint["inline"]))

    def model(self) -> _Model:
        return _Model(self.m, self.ii, self.stage, self.offset, self.in_group, self.in_stream, self.slots,
                      self.stream_list, self.depth_minus_1, self.iter_end, self.inline)


def _build(problem: Problem, ii: int, hint: Optional[dict], optimise: bool) -> _Model:
    """The model of period ``II``: when, where, what each part holds, dependencies, the main thread's window."""
    b = _Builder(problem, ii)
    b.when()
    b.thread_groups()
    b.caller()
    b.streams()
    b.host_resources()
    b.device_parts()
    b.shared_resources()
    b.dependencies()
    b.barrier()
    if optimise:
        b.objective()
    if hint:
        b.hints(hint)
    return b.model()


# --------------------------------------------------------------------------- solve


def _solve(mod: _Model, time_limit_s: float, num_workers: int, seed: int) -> Tuple[str, Any, float]:
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, time_limit_s)
    solver.parameters.num_workers = max(1, num_workers)
    solver.parameters.random_seed = seed
    # CP-SAT would otherwise install its own SIGINT handler and leave SIGINT at
    # SIG_DFL afterwards: a later Ctrl-C would kill the process instead of
    # raising KeyboardInterrupt (which the engine turns into a clean stop).
    solver.parameters.catch_sigint_signal = False
    if mod.solutions is None:
        code = solver.Solve(mod.model)
    else:
        class Collect(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(self) -> None:
                mod.solutions.append(_values(mod, self.Value))

        code = solver.Solve(mod.model, Collect())
    return solver.StatusName(code), solver, solver.WallTime()


# --------------------------------------------------------------------------- read


def _read(problem: Problem, mod: _Model, solver: Any) -> Dict[str, dict]:
    return _values(mod, solver.Value)


def _values(mod: _Model, value: Any) -> Dict[str, Any]:
    """A solution's choices (``value`` reads a variable: the solver's, or a solution callback's)."""
    names = list(mod.stage)
    stage = {t: int(value(mod.stage[t])) for t in names}
    offset = {t: int(value(mod.offset[t])) for t in names}
    group = {t: next(mod.slots[j] for j in range(len(mod.slots)) if value(mod.in_group[t, j])) for t in names}
    stream = {t: next(mod.streams[k] for (tt, k), v in mod.in_stream.items() if tt == t and value(v))
              for t in names}
    used = set(group.values())
    inline = next((mod.slots[j] for j, v in mod.inline.items() if value(v) and mod.slots[j] in used), None)
    return {"stage": stage, "offset": offset, "group": group, "stream": stream, "inline": inline}


def _hint_from(problem: Problem, hint: Any, ii: int) -> Optional[dict]:
    """A CP-SAT hint from a beam-search result (a ``Scored``), rescaled to ``ii``."""
    if hint is None:
        return None
    slots: Dict[str, int] = {}
    fixed = sorted(set(problem.frozen_group.values()))
    free: Dict[str, int] = {}
    for t, g in zip(problem.names, hint.cand.group):
        if g in fixed:
            slots[t] = fixed.index(g)
        else:
            slots[t] = len(fixed) + free.setdefault(g, len(free))
    offset = {}
    if hint.ii and hint.offset:
        offset = {t: int(o * ii / hint.ii) for t, o in hint.offset.items()}
    got = {"stage": dict(hint.stage), "offset": offset, "slot": slots}
    if problem.caller_group is not None:
        got["inline"] = slots[hint.cand.inline] if hint.cand.inline is not None else -1
    return got


def _plan_of(problem: Problem, sols: Sequence[dict], ii: int, scorer: Any) -> Tuple[PipelinePlan, dict]:
    """The best simulated reading of the solutions at ``ii``: ``(plan, its solution)``.

    ``sols`` are the refined solution (fewest stages, shortest iteration in
    the model), the refinement's last solutions before it, and the solution
    it refined, in that order: the simulator keeps the refinement unless
    one found on the way runs faster (the model approximates what the
    simulator runs: on a tie the earlier in ``sols`` wins). Each solution is read with every group on a
    worker, and with any one group on the caller's thread whose tasks fit
    the main thread's window (the model's constraint, with the window at
    the first task's start): the solved inline slot is one of these. The
    scorer ranks the readings by period, then depth and latency, then a
    group inline (it starts no worker), the busiest (as a hand-written
    loop). The model's timetable is one that the simulator's tasks, each
    started as soon as it can, need not follow where they share a core
    pool or a lock, and on CUDA the model approximates the streams.
    """
    def simulated(p: PipelinePlan) -> Tuple[float, float]:
        res = problem.simulate(p)
        return float(res.period), float(res.latency)

    def readings(sol: dict) -> List[Tuple[Any, PipelinePlan]]:
        def plan(inline: Any) -> PipelinePlan:
            return build_plan(problem, sol["stage"], sol["group"], sol["stream"], None, sol["offset"], inline=inline)

        if problem.caller_group is None or problem.forced_caller is not None:
            return [(sol["inline"], plan(sol["inline"]))]
        offset, group = sol["offset"], sol["group"]
        window = min(offset.values()) + ii - problem.period_units()
        frozen = {group[t] for t in problem.frozen_group}  # groups frozen under another name keep their worker
        fits = [g for g in sorted(set(group.values()), key=str) if g not in frozen
                and max(offset[t] + problem.dur(t) for t in group if group[t] == g) <= window]
        return [(g, plan(g)) for g in fits] + [(None, plan(None))]

    score = scorer or simulated
    u = problem.unit_s
    ranked = []
    try:
        seen = set()
        for k, sol in enumerate(sols):
            key = repr(sorted((t, sol["stage"][t], sol["offset"][t], str(sol["group"][t]), str(sol["stream"][t]))
                              for t in sol["stage"])) + repr(sol["inline"])
            if key in seen:
                continue
            seen.add(key)
            work = {g: sum(problem.dur(t) for t in sol["group"] if sol["group"][t] == g) for g in sol["group"].values()}
            for g, p in readings(sol):
                period, latency = score(p)
                rank = (round(period / u, 3), p.pipeline_depth, round(latency / u, 3), g is None, -work.get(g, 0),
                        g != sol["inline"], k)
                ranked.append((rank, p, sol))
    except Exception as exc:  # noqa: BLE001 - costs the simulator cannot take: keep the model's reading
        log.debug("CP-SAT plan not simulated: %s", exc)
        sol = sols[0]
        return build_plan(problem, sol["stage"], sol["group"], sol["stream"], None, sol["offset"],
                          inline=sol["inline"]), sol
    _, plan, sol = min(ranked, key=lambda r: r[0])
    return plan, sol


_READ_SOLUTIONS = 6  # of the refinement's solutions, the last ones the simulator ranks


def solve_cpsat(problem: Problem, *, time_limit_s: float = 30.0, num_workers: int = 2, seed: int = 0,
                hint: Any = None, upper: Optional[int] = None, scorer: Any = None) -> CpsatResult:
    """Minimise the period over the joint space with CP-SAT (outer loop over ``II``).

    Parameters
    ----------
    problem : Problem
    time_limit_s : float
        Total budget over all solves.
    num_workers : int
        CP-SAT worker threads.
    seed : int
        CP-SAT random seed.
    hint : Scored, optional
        A beam-search result: its stages, offsets and groups seed each solve.
    upper : int, optional
        A period (time units) known to be reachable, e.g. the beam's.
    scorer : callable, optional
        ``plan -> (period_s, latency_s)`` (default: the simulator,
        :meth:`Problem.simulate`): it ranks the readings of the solution's
        caller's thread, and the refined solution against the one it refined
        (:func:`_plan_of`).

    Returns
    -------
    CpsatResult
        With ``plan`` built (enqueue order by offset, ``caller_group`` set
        when a slot runs inline) when a solution was found.

    Examples
    --------
    Two 2 ms tasks in a chain, two threads, depth up to 2: pipelining them gives a 2 ms period.

    >>> from types import SimpleNamespace as NS
    >>> from autosched.search.problem import make_problem
    >>> from autosched.search.entry import Constraints
    >>> c = NS(tasks={n: NS(host_s=0.002, device_s=0.0, resources=()) for n in "AB"})
    >>> p = make_problem((["A", "B"], [("B", "A")]), c, Constraints(max_depth=2, max_threads=2, time_unit_s=1e-3))
    >>> r = solve_cpsat(p, time_limit_s=10)
    >>> r.status, r.ii, sorted(r.stage.items())
    ('OPTIMAL', 2, [('A', 0), ('B', 1)])
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    lower = model_lower_bound(problem)
    proven = lower
    best: Optional[Tuple[int, dict]] = None
    tried: List[Tuple[int, str]] = []
    solve_time = 0.0
    improving: List[dict] = []   # the refinement's solutions, in the order found

    def attempt(ii: int, optimise: bool = False) -> Optional[dict]:
        nonlocal proven, solve_time
        left = deadline - time.perf_counter()
        if optimise:
            # depth and latency at the best period are a refinement: a bounded share of the budget
            left = max(0.5, min(left, 0.2 * time_limit_s))
        elif left <= 0.05:
            return None
        elif best is None:
            # until a plan is in hand, no single period may eat the whole budget
            left = min(left, max(1.0, 0.25 * time_limit_s))
        mod = _build(problem, ii, _hint_from(problem, hint, ii), optimise)
        if optimise:
            mod.solutions = improving
        status, solver, wall = _solve(mod, left, num_workers, seed)
        solve_time += wall
        tried.append((ii, status))
        log.debug("II=%d: %s in %.2fs", ii, status, wall)
        if status in ("OPTIMAL", "FEASIBLE"):
            return _read(problem, mod, solver)
        if status == "INFEASIBLE":
            proven = max(proven, ii + 1)
        return None

    lo, hi = lower, None
    got = attempt(lo)
    if got is not None:
        best = (lo, got)
        hi = lo
    else:
        lo += 1
        if upper is not None and upper >= lo:
            got = attempt(upper)
            if got is not None:
                best, hi = (upper, got), upper
        if hi is None:
            # gallop upward from the bound until something is feasible
            step = max(1, lo // 8)
            while time.perf_counter() < deadline:
                ii = lo + step
                got = attempt(ii)
                if got is not None:
                    best, hi = (ii, got), ii
                    break
                lo, step = ii + 1, step * 2
        while hi is not None and lo < hi and time.perf_counter() < deadline:
            mid = (lo + hi) // 2
            got = attempt(mid)
            if got is not None:
                best, hi = (mid, got), mid
            else:
                lo = mid + 1
    if best is None:
        return CpsatResult("UNKNOWN", None, proven, problem.unit_s, tried=tried, solve_time_s=solve_time)
    ii, sol = best
    refined = attempt(ii, optimise=True)
    refine_status = tried[-1][1] if tried and tried[-1][0] == ii else ""
    status = "OPTIMAL" if proven >= ii else "FEASIBLE"
    # the refinement's last solutions (the last one first), then the solution it refined
    sols = ([refined] if refined is not None else []) + improving[::-1][:_READ_SOLUTIONS] + [sol]
    plan, sol = _plan_of(problem, sols, ii, scorer)
    return CpsatResult(status, ii, min(proven, ii), problem.unit_s, plan, sol["stage"], sol["offset"], sol["group"],
                       sol["stream"], tried, solve_time, refine_status)
