"""The CP-SAT model of one period ``II``: stage x thread group x stream x fire order, by modulo scheduling.

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
  (:func:`autosched.search.plans.enqueue_order_for`): it is handed off no later
  than the model starts it (a late hand-off on purpose is the beam search's
  move, scored by the simulator);
* ``stage[t] <= max_depth - 1`` and frozen stages, streams and groups.

On CUDA the device part of each task is modelled on its stream (a choice) as a
second circular interval starting after its host part; that part of the model
is an approximation of the simulator's stream semantics, which is why the
final plan is always scored by the simulator.

:func:`build_model` builds it in named phases (:class:`ModelBuilder`); :func:`hint_from` turns the
beam's best plan into a hint. The solve and the outer loop over ``II`` are in
:mod:`autosched.search.cpsat`, reading a solution as a plan in :mod:`autosched.search.cpsat_read`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from swpipe_core.plan import stream_name

from autosched.model.taskmodel import pool_limit
from autosched.search.found import Scored
from autosched.search.problem import Problem

__all__ = ["CpsatModel", "ModelBuilder", "build_model", "hint_from"]


@dataclass
class CpsatModel:
    """A built model and the variables its solution is read from (:mod:`autosched.search.cpsat_read`)."""

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
    solutions: Optional[List[dict]] = None   # when a list: every solution the solve finds, in order (autosched.search.cpsat._solve)


class ModelBuilder:
    """The CP-SAT model of one period ``II``, built in named phases (see :func:`build_model`)."""

    def __init__(self, problem: Problem, ii: int) -> None:
        from ortools.sat.python import cp_model

        self.model = cp_model.CpModel()
        self.problem, self.ii = problem, ii
        self.names = problem.names
        self.max_depth = problem.max_depth
        self.dur = {t: problem.dur(t) for t in self.names}
        self.horizon = ii * (self.max_depth + 1) + sum(self.dur.values()) + sum(problem.ddur(t) for t in self.names)
        self.dev_start: Dict[str, Any] = {}

    def circular(self, name: str, off: Any, size: int, present: Any = None) -> List[Any]:
        """The interval at ``off`` and its copy one period later (both or neither present)."""
        model, ii = self.model, self.ii
        if size <= 0:
            return []
        if present is None:
            return [model.NewFixedSizeIntervalVar(off, size, f"{name}"), model.NewFixedSizeIntervalVar(off + ii, size, f"{name}+II")]
        return [model.NewOptionalFixedSizeIntervalVar(off, size, present, f"{name}"),
                model.NewOptionalFixedSizeIntervalVar(off + ii, size, present, f"{name}+II")]

    def when(self) -> None:
        """Stage and offset of every task; its host start is ``II * stage + offset``."""
        model, problem = self.model, self.problem
        self.stage = {t: (model.NewConstant(problem.frozen_stage[t]) if t in problem.frozen_stage
                          else model.NewIntVar(0, self.max_depth - 1, f"stage[{t}]")) for t in self.names}
        self.offset = {t: model.NewIntVar(0, self.ii - 1, f"offset[{t}]") for t in self.names}
        self.start = {t: self.ii * self.stage[t] + self.offset[t] for t in self.names}

    def thread_groups(self) -> None:
        """Each task in exactly one group slot (frozen names first, then free slots, symmetry broken)."""
        model, problem, names = self.model, self.problem, self.names
        fixed = sorted(set(problem.frozen_group.values()))
        n_slots = max(len(fixed), min(problem.max_threads, len(names)))
        self.slots = fixed + [f"g{j}" for j in range(n_slots - len(fixed))]
        self.in_group: Dict[Tuple[str, int], Any] = {}
        free_rank = 0
        for t in names:
            for j in range(n_slots):
                self.in_group[t, j] = model.NewBoolVar(f"in_group[{t},{self.slots[j]}]")
            if t in problem.frozen_group:
                for j in range(n_slots):
                    model.Add(self.in_group[t, j] == int(self.slots[j] == problem.frozen_group[t]))
            else:
                # symmetry: the k-th free task may open at most free slot k
                for j in range(len(fixed) + free_rank + 1, n_slots):
                    model.Add(self.in_group[t, j] == 0)
                free_rank += 1
            model.AddExactlyOne(self.in_group[t, j] for j in range(n_slots))

    def caller(self) -> None:
        """Which slot, if any, runs on the caller's thread: the frozen caller's group, else at most one free slot."""
        problem, model = self.problem, self.model
        self.inline: Dict[int, Any] = {}
        if problem.caller_group is None:
            return
        if problem.forced_caller is not None:
            self.inline[self.slots.index(problem.forced_caller)] = model.NewConstant(1)
            return
        fixed = set(problem.frozen_group.values())
        for j, slot in enumerate(self.slots):
            if slot not in fixed:
                self.inline[j] = model.NewBoolVar(f"inline[{slot}]")
                model.Add(sum(self.in_group[t, j] for t in self.names) >= 1).OnlyEnforceIf(self.inline[j])  # a group
        if len(self.inline) > 1:
            model.AddAtMostOne(self.inline.values())

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
                    self.in_stream[t, k] = self.model.NewBoolVar(f"in_stream[{t},{stream_name(s)}]")
            self.model.AddExactlyOne(v for (tt, _), v in self.in_stream.items() if tt == t)

    def host_resources(self) -> None:
        """Threads and the sequencer: host intervals on circles of length II."""
        model, names = self.model, self.names
        for j in range(len(self.slots)):
            model.AddNoOverlap([iv for t in names for iv in self.circular(f"thread[{t},{self.slots[j]}]", self.offset[t],
                                                                      self.dur[t], self.in_group[t, j])])
        ordered = [t for t in names if t in self.problem.ordered]
        if len(ordered) > 1:
            model.AddNoOverlap([iv for t in ordered for iv in self.circular(f"sequencer[{t}]", self.offset[t], self.dur[t])])
        cores = pool_limit(self.problem.cores, len(self.slots))
        if cores is not None:
            # the circle [0, II) maps onto [II, 2 II) of the line, where each task's interval and its
            # copy cover exactly the circle's points: the line's peak is the circle's
            pool = [iv for t in names if self.problem.parts(t, "", None).takes_core
                    for iv in self.circular(f"cores[{t}]", self.offset[t], self.dur[t])]
            if pool:
                model.AddCumulative(pool, [1] * len(pool), cores)

    def device_parts(self) -> None:
        """CUDA: device parts submitted when the host part ends, FIFO per stream and per communicator.

        In window coordinates (the period in which it was submitted): ``submit_offset`` in
        ``[0, II)`` and ``device_offset = submit_offset + lag``.
        """
        model, problem, ii, names = self.model, self.problem, self.ii, self.names
        self.shared_off: Dict[str, Any] = dict(self.offset)
        self.shared_size: Dict[str, int] = dict(self.dur)
        if not problem.cuda:
            return
        submit_turn, submit_offset, device_offset = {}, {}, {}
        for t in names:
            submit_turn[t] = model.NewIntVar(0, self.max_depth + 1, f"submit_turn[{t}]")
            submit_offset[t] = model.NewIntVar(0, ii - 1, f"submit_offset[{t}]")
            model.Add(ii * submit_turn[t] + submit_offset[t] == self.start[t] + self.dur[t])
            lag = model.NewIntVar(0, self.horizon, f"device_lag[{t}]")
            device_offset[t] = submit_offset[t] + lag
            self.dev_start[t] = ii * submit_turn[t] + device_offset[t]
        for a, b in itertools.combinations(names, 2):
            shared_streams = [k for k in range(len(self.stream_list))
                              if (a, k) in self.in_stream and (b, k) in self.in_stream]
            same_comm = problem.comm[a] is not None and problem.comm[a] == problem.comm[b]
            if not shared_streams and not same_comm:
                continue
            first = model.NewBoolVar(f"submitted_first[{a},{b}]")
            model.Add(submit_offset[a] <= submit_offset[b]).OnlyEnforceIf(first)
            model.Add(submit_offset[b] <= submit_offset[a]).OnlyEnforceIf(first.Not())
            conds = [[self.in_stream[a, k], self.in_stream[b, k]] for k in shared_streams] + ([[]] if same_comm else [])
            for cond in conds:
                # a then b in one window, and b before a of the next window (and the converse)
                model.Add(device_offset[b] >= device_offset[a] + problem.ddur(a)).OnlyEnforceIf([first] + cond)
                model.Add(device_offset[a] + ii >= device_offset[b] + problem.ddur(b)).OnlyEnforceIf([first] + cond)
                model.Add(device_offset[a] >= device_offset[b] + problem.ddur(b)).OnlyEnforceIf([first.Not()] + cond)
                model.Add(device_offset[b] + ii >= device_offset[a] + problem.ddur(a)).OnlyEnforceIf([first.Not()] + cond)
        for t in names:
            if t in problem.pcie:
                # PCIe copies take turns in any order: a circular NoOverlap on their device offsets
                turn = model.NewIntVar(0, self.horizon // ii + 2, f"pcie_turn[{t}]")
                off = model.NewIntVar(0, ii - 1, f"pcie_offset[{t}]")
                model.Add(ii * turn + off == self.dev_start[t])
                self.shared_off[t], self.shared_size[t] = off, problem.ddur(t)

    def shared_resources(self) -> None:
        """Communicators (CPU: any order on host time) and PCIe serialise."""
        problem = self.problem
        groups: Dict[str, List[str]] = {}
        for t in self.names:
            for key in problem.tags(t):
                if key == "pcie" or not problem.cuda:  # on CUDA communicators are FIFOs (device_parts)
                    groups.setdefault(key, []).append(t)
        for key, members in groups.items():
            if len(members) > 1:
                self.model.AddNoOverlap([iv for t in members
                                     for iv in self.circular(f"{key}[{t}]", self.shared_off[t], self.shared_size[t])])

    def dependencies(self) -> None:
        """Every dependency (intra distance 0, inter distance N), on the host and on the device."""
        problem, ii = self.problem, self.ii
        for t in self.names:
            for d, n in problem.preds(t):
                self.model.Add(self.start[t] >= self.start[d] + self.dur[d] - ii * n)
                if problem.cuda:
                    self.model.Add(self.dev_start[t] >= self.dev_start[d] + problem.ddur(d) - ii * n)

    def barrier(self) -> None:
        """The main thread's window: the progress barrier, the engine time, the inline slot's tasks."""
        model, names, ii = self.model, self.names, self.ii
        engine = self.problem.period_units()
        self.iter_end = model.NewIntVar(0, self.horizon, "iter_end")
        for t in names:
            model.Add(self.iter_end >= self.start[t] + self.dur[t])
        self.depth_minus_1 = model.NewIntVar(0, self.max_depth - 1, "depth_minus_1")
        model.AddMaxEquality(self.depth_minus_1, [self.stage[t] for t in names])
        window = model.NewIntVar(0, ii - 1, "window")   # when the period is enqueued
        for t in names:
            model.Add(window <= self.offset[t])
        # period p + depth is enqueued, the engine's time first, once iteration p has retired
        model.Add(window >= self.iter_end + engine - ii * (self.depth_minus_1 + 1))
        for j, on_main in self.inline.items():
            for t in names:
                model.Add(self.offset[t] + self.dur[t] <= window + ii - engine).OnlyEnforceIf(
                    [self.in_group[t, j], on_main])

    def objective(self) -> None:
        """At the best period: fewest batches in flight (memory), then the shortest iteration."""
        self.model.Minimize(self.depth_minus_1 * (self.horizon + 1) + self.iter_end)

    def hints(self, hint: dict) -> None:
        """Start from a known plan (the beam's best)."""
        problem = self.problem
        for t in self.names:
            if t not in problem.frozen_stage and t in hint.get("stage", {}):
                self.model.AddHint(self.stage[t], min(self.max_depth - 1, hint["stage"][t]))
            if t in hint.get("offset", {}):
                self.model.AddHint(self.offset[t], min(self.ii - 1, max(0, hint["offset"][t])))
            if t in hint.get("slot", {}) and t not in problem.frozen_group:
                for j in range(len(self.slots)):
                    self.model.AddHint(self.in_group[t, j], int(j == hint["slot"][t]))
        if "inline" in hint and problem.forced_caller is None:
            for j, var in self.inline.items():
                self.model.AddHint(var, int(j == hint["inline"]))

    def built(self) -> CpsatModel:
        """The model with the variables the solution is read from."""
        return CpsatModel(self.model, self.ii, self.stage, self.offset, self.in_group, self.in_stream, self.slots,
                      self.stream_list, self.depth_minus_1, self.iter_end, self.inline)


def build_model(problem: Problem, ii: int, hint: Optional[dict], optimise: bool) -> CpsatModel:
    """The model of period ``II``: when, where, what each part holds, dependencies, the main thread's window.

    Parameters
    ----------
    problem : Problem
    ii : int
        The period, in time units.
    hint : dict, optional
        From :func:`hint_from`.
    optimise : bool
        Minimise the depth, then the iteration's length (else: feasibility only).

    Returns
    -------
    CpsatModel
    """
    b = ModelBuilder(problem, ii)
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
    return b.built()


def hint_from(problem: Problem, hint: Optional[Scored], ii: int) -> Optional[dict]:
    """A CP-SAT hint from a beam-search candidate (``Found.candidate``), rescaled to ``ii``.

    Parameters
    ----------
    problem : Problem
    hint : Scored, optional
    ii : int
        The period of the model hinted, in time units.

    Returns
    -------
    dict or None
        Stages, offsets, group slots and (with a caller's group) the inline slot; None without a hint.
    """
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
