"""Search an action order per rank (and the micro-batch count) that PyTorch's runtime then runs.

For each micro-batch count and stage layout (one stage per rank; two per rank in a loop;
two per rank in a V) with costs, the candidates are

* **seeds**: PyTorch's schedules of that layout, as they run, and their compute orders
  as ``_PipelineScheduleRuntime`` runs them from a CSV;
* **list schedules**: a greedy scheduler in time, on the cost model, with a family of
  policies (full backward or I + W; backward first or forward first; a cap on forwards
  in flight per stage; W eagerly or only when nothing else is ready) and the memory cap;
* **CP-SAT** (small problems: at most ``cpsat_max_actions`` compute actions): start times
  that minimise the makespan under the ranks' one-at-a-time rule, the data dependencies
  with transfer times, and the memory cap as a reservoir per rank, hinted with the best
  list schedule.

Every candidate is lowered by PyTorch's own comms lowering and scored by
:func:`~autosched.pp.simulate.pp_simulate`; those over the cap are dropped, and the
fastest is returned (:func:`autosched.results.fastest`'s rule with only equal steps tied: less
memory, then fewer stages and micro-batches, wins a tie), so the answer is never predicted
slower than the best seed that fits. A candidate that is not one of PyTorch's schedules runs on
``_PipelineScheduleRuntime`` (:func:`~autosched.pp.program.schedule_for`) and is scored with that
path's cost per action (:attr:`PPCosts.custom_overhead_s <autosched.pp.costs.PPCosts.custom_overhead_s>`),
so a custom order is chosen only where it beats PyTorch's schedule by more than its path costs;
``schedule_for(found.program, ...)`` runs the choice either way.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from autosched._fields import check_arguments, integer, number
from autosched.pp import _torch
from autosched.pp.bounds import pp_lower_bounds
from autosched.pp.costs import PPCosts
from autosched.pp.program import PPError, PPProgram, builtin_program, program_from_order
from autosched.pp.simulate import PPSimResult, SimCut, pp_simulate
from autosched.results import Preference, fastest, pp_preference
from autosched.search.options import Constraints, SolverOptions, misplaced_option

_T = TypeVar("_T")

__all__ = ["PPCandidate", "PPCpsatRun", "PPSearchResult", "pp_search", "list_schedule"]

@dataclass(frozen=True)
class PPCpsatRun:
    """One CP-SAT problem :func:`pp_search` solved: which, CP-SAT's status and its model's makespan.

    Attributes
    ----------
    layout : str
        ``"loop1"`` (one stage per rank), ``"loop2"`` (two, looped) or ``"v2"`` (two, in a V).
    n_microbatches : int
    split : bool
        Backward as I then W (True) or as one B.
    status : str
        CP-SAT's status name (``"OPTIMAL"``, ``"FEASIBLE"``, ``"INFEASIBLE"``, ``"UNKNOWN"``, ...).
    makespan_s : float or None
        The makespan of CP-SAT's own model (``PPCpsatRun.MEANS`` says what it counts: not a
        predicted step, which the simulator gives each candidate); None without a solution.
    """

    layout: str
    n_microbatches: int
    split: bool
    status: str
    makespan_s: Optional[float] = None

    # what a CP-SAT makespan is, said wherever one is printed: its model is not the simulator that predicts a step
    MEANS: ClassVar[str] = ("CP-SAT's model makespan: compute and transfer times only (no cost per posted send or "
                            "receive, no REDUCE_GRAD; micro-batches in order per stage), not a predicted step; "
                            "OPTIMAL: the least makespan of that model, FEASIBLE: the least it found in its time")

    def __str__(self) -> str:
        made = "" if self.makespan_s is None else f" {self.makespan_s * 1e3:.3f} ms"
        return f"{self.layout} n={self.n_microbatches} {'IW' if self.split else 'B'}: {self.status}{made}"


@dataclass(frozen=True)
class PPCandidate:
    """One scored candidate: where it came from, its program and its prediction."""

    origin: str
    program: PPProgram
    result: PPSimResult
    costs: PPCosts = field(repr=False, compare=False, default=None)  # type: ignore[assignment]


@dataclass(frozen=True)
class PPSearchResult:
    """What :func:`pp_search` found.

    Attributes
    ----------
    best : PPCandidate
        The fastest candidate within the cap (a seed when none beat it, a custom order's path cost included, or
        none beat it by more than ``pp_search``'s ``margin_pct``);
        :func:`~autosched.pp.program.schedule_for` of its program runs it.
    best_seed : PPCandidate or None
        The fastest of PyTorch's schedules (as they run) within the cap.
    exported : PPCandidate
        The fastest candidate ``_PipelineScheduleRuntime`` runs from a compute-only CSV
        (``exported.program.to_csv(path)``); ``best`` itself when it is one.
    bound_s : float
        The lower bound of ``best``'s micro-batch count and layout.
    candidates : tuple of PPCandidate
        Every candidate scored, within the cap or not.
    max_memory_bytes : int or None
        The cap per rank searched under (``memory_cap_bytes``, its old name, still reads it and warns).
    cpsat : tuple of PPCpsatRun
        Each CP-SAT problem solved (empty when none was small enough); ``cpsat_status`` says them in one line.
    cut : str
        ``""`` when the search tried everything; else the stage in which its time limit
        passed (``"seeds"``: building PyTorch's schedules, ``"list"``: the list scheduler,
        ``"cpsat"``, ``"simulate"`` or ``"score"``: scoring a candidate) and where it stopped.
    not_tried : tuple of str
        What the cut left out (``"PyTorch DualPipeV n=64"``, ``"list(B,...) loop2 n=64"``,
        ``"cpsat(IW) v2 n=4"``), the one it stopped in first.
    elapsed_s, time_limit_s : float
        How long the search ran, and its limit.
    """

    best: PPCandidate
    best_seed: Optional[PPCandidate]
    exported: PPCandidate
    bound_s: float
    candidates: Tuple[PPCandidate, ...] = field(repr=False)
    max_memory_bytes: Optional[float] = None
    cpsat: Tuple[PPCpsatRun, ...] = ()
    cut: str = ""
    not_tried: Tuple[str, ...] = ()
    elapsed_s: float = 0.0
    time_limit_s: float = 0.0

    @property
    def memory_cap_bytes(self) -> Optional[float]:
        """Deprecated: :attr:`max_memory_bytes` (one name for a memory cap); warns with ``FutureWarning``."""
        warnings.warn("PPSearchResult.memory_cap_bytes is renamed max_memory_bytes; read .max_memory_bytes",
                      FutureWarning, stacklevel=2)
        return self.max_memory_bytes

    # -- SearchReport's fields, where they mean the same (the verbs' one report, autosched.results) ---------------
    @property
    def program(self) -> PPProgram:
        """``best.program``: what the search chose (a plan search's ``SearchReport.plan``)."""
        return self.best.program

    @property
    def period_s(self) -> float:
        """``best``'s predicted step (a step repeats once per step)."""
        return self.best.result.step_s

    @property
    def lower_bound_s(self) -> float:
        """:attr:`bound_s`."""
        return self.bound_s

    @property
    def peak_bytes(self) -> int:
        """``best``'s predicted peak on its fullest rank."""
        return self.best.result.max_peak_bytes

    @property
    def method(self) -> str:
        """Where ``best`` came from: ``"seed:<PyTorch's schedule>"``, ``"list"`` or ``"cpsat"``."""
        origin = self.best.origin
        if origin.startswith("PyTorch "):
            return "seed:" + origin[len("PyTorch "):]
        return "cpsat" if origin.startswith("cpsat") else "list"

    @property
    def status(self) -> str:
        """As ``SearchReport.status``: ``"OPTIMAL"`` when ``best`` reaches the lower bound, ``"FEASIBLE"`` when
        CP-SAT ran without that proof, ``"HEURISTIC"`` otherwise (PyTorch's schedules and the list scheduler)."""
        if self.period_s <= self.bound_s * (1 + 1e-9):
            return "OPTIMAL"
        return "FEASIBLE" if self.cpsat_status else "HEURISTIC"

    @property
    def cpsat_status(self) -> str:
        """CP-SAT's status and model makespan per problem, in one line ("" when none was solved)."""
        return "; ".join(str(run) for run in self.cpsat)

    @property
    def gain_over_seed(self) -> float:
        """``best_seed``'s predicted step over ``best``'s (1.0: no better than PyTorch's best)."""
        if self.best_seed is None or self.best.result.step_s <= 0:
            return float("nan")
        return self.best_seed.result.step_s / self.best.result.step_s

    def summary(self) -> str:
        b = self.best
        lines = [f"search (pipeline-parallel, {self.status}): step {self.period_s * 1e3:.3f} ms, bound "
                 f"{self.bound_s * 1e3:.3f} ms",
                 f"best: {b.origin} ({b.program.schedule}, {b.program.n_microbatches} micro-batches, "
                 f"{b.program.n_stages} stages): {b.result.step_s * 1e3:.3f} ms predicted, "
                 f"peak {b.result.max_peak_bytes / 2**20:.2f} MiB, bound {self.bound_s * 1e3:.3f} ms"]
        if self.best_seed is not None:
            s = self.best_seed
            lines.append(f"best of PyTorch's: {s.program.schedule}: {s.result.step_s * 1e3:.3f} ms, "
                         f"peak {s.result.max_peak_bytes / 2**20:.2f} MiB ({self.gain_over_seed:.3f}x)")
        if self.exported is not b:
            lines.append(f"best as a CSV for _PipelineScheduleRuntime: {self.exported.origin}: "
                         f"{self.exported.result.step_s * 1e3:.3f} ms")
        if self.cpsat_status:
            lines.append(f"{PPCpsatRun.MEANS}: {self.cpsat_status}")
        if self.cut:
            shown = ", ".join(self.not_tried[:3]) + (f" and {len(self.not_tried) - 3} more" if len(self.not_tried) > 3
                                                      else "")
            lines.append(f"cut: the {self.time_limit_s:g} s time limit passed in {self.cut} after "
                         f"{self.elapsed_s:.1f} s; not tried: {shown}")
        return "\n".join(lines)


# --- the list scheduler -----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Policy:
    split: bool                 # I + W instead of B
    backward_first: bool        # a ready backward goes before a ready forward
    extra_in_flight: Optional[int]  # forwards a stage may run ahead of its backwards, beyond its depth; None: no cap
    w_fill: bool                # W only when nothing else is ready (zero-bubble), else right after its I

    def name(self) -> str:
        cap = "inf" if self.extra_in_flight is None else f"+{self.extra_in_flight}"
        return (f"list({'IW' if self.split else 'B'},{'bwd' if self.backward_first else 'fwd'}-first,"
                f"inflight{cap},{'W-fill' if self.w_fill else 'W-eager'})")


def _hop(costs: PPCosts, stage_to_rank: Sequence[int], s: int) -> float:
    """The transfer between stage s and s + 1 (0 when they share a rank)."""
    if s + 1 >= len(stage_to_rank) or stage_to_rank[s] == stage_to_rank[s + 1]:
        return 0.0
    return costs.p2p.seconds(costs.stages[s].output_bytes)


def list_schedule(costs: PPCosts, stage_to_rank: Sequence[int], n_microbatches: int, policy: _Policy,
                  memory_cap_bytes: Optional[int] = None, check: Optional[Callable[[], None]] = None
                  ) -> Optional[Dict[int, List[str]]]:
    """A compute order per rank by greedy list scheduling in time; None when the cap blocks it.

    ``check()`` is called once per action placed (a search's deadline: it raises to stop).
    """
    n_stages, n = len(stage_to_rank), n_microbatches
    ranks = sorted(set(stage_to_rank))
    depth = {s: n_stages - s for s in range(n_stages)}
    ready_at: Dict[Tuple[str, int, int], float] = {("F", 0, m): 0.0 for m in range(n)}
    next_f = {s: 0 for s in range(n_stages)}
    next_b = {s: 0 for s in range(n_stages)}
    pending_w: Dict[int, List[Tuple[int, int]]] = {r: [] for r in ranks}
    live = {r: 0 for r in ranks}
    free_at = {r: 0.0 for r in ranks}
    order: Dict[int, List[str]] = {r: [] for r in ranks}
    done = 0
    total = n_stages * n * (3 if policy.split else 2)
    events: List[Tuple[float, int, int]] = [(0.0, r, r) for r in ranks]  # (time, tiebreak, rank)
    heapq.heapify(events)
    tick = itertools.count(len(ranks))
    while done < total:
        if check is not None:
            check()
        if not events:
            return None  # nothing can start: the cap (or the in-flight rule) starves a rank
        t, _, r = heapq.heappop(events)
        if t < free_at[r]:
            continue
        choice = _pick(r, t, costs, stage_to_rank, n, policy, ready_at, next_f, next_b, pending_w, live,
                       memory_cap_bytes, depth)
        if choice is None:
            later = [v for v in ready_at.values() if v > t]
            if later:
                heapq.heappush(events, (min(later), next(tick), r))
            continue
        kind, s, m = choice
        c = costs.stages[s]
        dur = c.action_s(kind) + (c.loss_s if kind == "F" and s == n_stages - 1 else 0.0)
        end = t + dur
        free_at[r] = end
        order[r].append(f"{s}{kind}{m}")
        done += 1
        if kind == "F":
            next_f[s] += 1
            live[r] += c.activation_bytes
            if s + 1 < n_stages:
                ready_at[("F", s + 1, m)] = end + _hop(costs, stage_to_rank, s)
            else:
                ready_at[("B", s, m)] = end
        elif kind in ("B", "I"):
            next_b[s] += 1
            live[r] -= c.activation_bytes if kind == "B" else c.activation_bytes - c.weight_keep_bytes
            if s > 0:
                ready_at[("B", s - 1, m)] = end + _hop(costs, stage_to_rank, s - 1)
            if kind == "I":
                pending_w[r].append((s, m))
        else:
            live[r] -= c.weight_keep_bytes
        heapq.heappush(events, (end, next(tick), r))
        for other in ranks:
            if other != r and free_at[other] <= end:
                heapq.heappush(events, (max(free_at[other], t), next(tick), other))
    return order


def _pick(r: int, t: float, costs: PPCosts, stage_to_rank: Sequence[int], n: int, policy: _Policy,
          ready_at: Dict[Tuple[str, int, int], float], next_f: Dict[int, int], next_b: Dict[int, int],
          pending_w: Dict[int, List[Tuple[int, int]]], live: Dict[int, int], cap: Optional[int],
          depth: Dict[int, int]) -> Optional[Tuple[str, int, int]]:
    mine = [s for s, rr in enumerate(stage_to_rank) if rr == r]
    backwards, forwards = [], []
    for s in mine:
        m = next_b[s]
        if m < n and next_f[s] > m and ready_at.get(("B", s, m), float("inf")) <= t:
            backwards.append(("I" if policy.split else "B", s, m))
        m = next_f[s]
        if m < n and ready_at.get(("F", s, m), float("inf")) <= t:
            in_flight = next_f[s] - next_b[s]
            limit = None if policy.extra_in_flight is None else depth[s] + policy.extra_in_flight
            fits = cap is None or live[r] + costs.stages[s].activation_bytes <= cap
            if (limit is None or in_flight < limit) and fits:
                forwards.append(("F", s, m))
    backwards.sort(key=lambda a: -a[1])  # the later stage first: it unblocks the others' backwards
    forwards.sort(key=lambda a: -a[1])   # the later stage first: it is nearer the loss
    w = [("W", s, m) for s, m in pending_w[r][:1]]
    if w and not policy.w_fill:
        pending_w[r].pop(0)
        return w[0]
    first, second = (backwards, forwards) if policy.backward_first else (forwards, backwards)
    for group in (first, second):
        if group:
            return group[0]
    if w:
        pending_w[r].pop(0)
        return w[0]
    return None


def _policies(split_ok: bool) -> List[_Policy]:
    out = []
    for split, bwd_first, extra, w_fill in itertools.product((False, True), (True, False), (0, 1, 2, None),
                                                            (True, False)):
        if (split and not split_ok) or (not split and w_fill):
            continue
        out.append(_Policy(split, bwd_first, extra, w_fill))
    return out


# --- CP-SAT -----------------------------------------------------------------------------------------

def _cpsat_order(costs: PPCosts, stage_to_rank: Sequence[int], n: int, split: bool, cap: Optional[int],
                 time_limit_s: float, hint: Optional[Dict[int, List[str]]]
                 ) -> Tuple[Optional[Dict[int, List[str]]], str, Optional[float]]:
    from ortools.sat.python import cp_model

    n_stages = len(stage_to_rank)
    scale = 1e6  # microseconds
    model = cp_model.CpModel()

    def dur(s: int, kind: str) -> int:
        c = costs.stages[s]
        return max(0, int(round((c.action_s(kind) + (c.loss_s if kind == "F" and s == n_stages - 1 else 0)) * scale)))

    def hop(s: int) -> int:
        return int(round(_hop(costs, stage_to_rank, s) * scale))

    kinds = ("F", "I", "W") if split else ("F", "B")
    horizon = sum(dur(s, k) for s in range(n_stages) for k in kinds) * n + sum(hop(s) for s in range(n_stages)) * 2 * n
    start, end, iv = {}, {}, {}
    for s, m, k in itertools.product(range(n_stages), range(n), kinds):
        start[s, m, k] = model.NewIntVar(0, horizon, f"s{s}{k}{m}")
        end[s, m, k] = model.NewIntVar(0, horizon, f"e{s}{k}{m}")
        iv[s, m, k] = model.NewIntervalVar(start[s, m, k], dur(s, k), end[s, m, k], f"i{s}{k}{m}")
    back = "I" if split else "B"
    for s, m in itertools.product(range(n_stages), range(n)):
        if s > 0:
            model.Add(start[s, m, "F"] >= end[s - 1, m, "F"] + hop(s - 1))
        model.Add(start[s, m, back] >= end[s, m, "F"])
        if s + 1 < n_stages:
            model.Add(start[s, m, back] >= end[s + 1, m, back] + hop(s))
        if split:
            model.Add(start[s, m, "W"] >= end[s, m, "I"])
        if m > 0:  # micro-batches in order within a stage: a symmetry the runtime's buffers expect anyway
            model.Add(start[s, m, "F"] >= end[s, m - 1, "F"])
            model.Add(start[s, m, back] >= end[s, m - 1, back])
    for r in sorted(set(stage_to_rank)):
        mine = [s for s in range(n_stages) if stage_to_rank[s] == r]
        model.AddNoOverlap([iv[s, m, k] for s in mine for m in range(n) for k in kinds])
        if cap is not None:
            times, demands = [], []
            for s in mine:
                c = costs.stages[s]
                for m in range(n):
                    times.append(end[s, m, "F"])
                    demands.append(c.activation_bytes)
                    if split:
                        times += [end[s, m, "I"], end[s, m, "W"]]
                        demands += [-(c.activation_bytes - c.weight_keep_bytes), -c.weight_keep_bytes]
                    else:
                        times.append(end[s, m, "B"])
                        demands.append(-c.activation_bytes)
            model.AddReservoirConstraint(times, demands, 0, cap)
    makespan = model.NewIntVar(0, horizon, "makespan")
    model.AddMaxEquality(makespan, [end[k] for k in end])
    model.Minimize(makespan)
    if hint:
        _hint_from_order(model, start, hint, costs, stage_to_rank, n, split, dur, hop)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 2
    solver.parameters.random_seed = 0
    status = solver.Solve(model)
    name = solver.StatusName(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, name, None
    order: Dict[int, List[str]] = {}
    for r in sorted(set(stage_to_rank)):
        acts = [(solver.Value(start[s, m, k]), s, k, m) for (s, m, k) in start if stage_to_rank[s] == r]
        acts.sort(key=lambda a: (a[0], "FIBW".index(a[2]), -a[1]))
        order[r] = [f"{s}{k}{m}" for _, s, k, m in acts]
    return order, name, solver.Value(makespan) / scale


def _hint_from_order(model: object, start: Dict, hint: Dict[int, List[str]], costs: PPCosts,
                     stage_to_rank: Sequence[int], n: int, split: bool, dur: object, hop: object) -> None:
    """Start times of ``hint``'s order replayed on the model's own rules, as CP-SAT's hint."""
    from autosched.pp.program import parse_action

    kinds_ok = {"F", "I", "W"} if split else {"F", "B"}
    acts = {r: list(a) for r, a in hint.items()}
    if any(parse_action(a)[1] not in kinds_ok for r in acts for a in acts[r]):
        return
    done: Dict[Tuple[int, int, str], int] = {}
    clock = {r: 0 for r in acts}
    pos = {r: 0 for r in acts}
    back = "I" if split else "B"
    progress = True
    while progress:
        progress = False
        for r in acts:
            while pos[r] < len(acts[r]):
                s, k, m = parse_action(acts[r][pos[r]])
                deps = []
                if k == "F" and s > 0:
                    deps.append(((s - 1, m, "F"), hop(s - 1)))
                if k == back:
                    deps.append(((s, m, "F"), 0))
                    if s + 1 < len(stage_to_rank):
                        deps.append(((s + 1, m, back), hop(s)))
                if k == "W":
                    deps.append(((s, m, "I"), 0))
                if any(d not in done for d, _ in deps):
                    break
                t0 = max([clock[r]] + [done[d] + h for d, h in deps])
                model.AddHint(start[s, m, k], t0)  # type: ignore[attr-defined]
                done[(s, m, k)] = t0 + dur(s, k)  # type: ignore[operator]
                clock[r] = done[(s, m, k)]
                pos[r] += 1
                progress = True


# --- the search ------------------------------------------------------------------------------------

def _layouts(n_ranks: int, costs_by_stages: Mapping[int, PPCosts]) -> List[Tuple[str, Tuple[int, ...]]]:
    out = []
    if n_ranks in costs_by_stages:
        out.append(("loop1", tuple(range(n_ranks))))
    if 2 * n_ranks in costs_by_stages:
        out.append(("loop2", _torch.stage_to_rank_map("Interleaved1F1B", n_ranks, 2 * n_ranks)))
        out.append(("v2", _torch.stage_to_rank_map("ZBVZeroBubble", n_ranks, 2 * n_ranks)))
    return out


class _Cut(Exception):
    """The search's deadline passed in ``stage``."""

    def __init__(self, stage: str) -> None:
        super().__init__(stage)
        self.stage = stage


class _Deadline:
    """The whole search's time limit, on one clock that every stage reads.

    A stage calls :meth:`checker`'s function in its loop; a step it cannot interrupt (PyTorch
    building a schedule or lowering an order) is started only when the longest such step so
    far still fits (:meth:`atomic`), so that the search ends near the limit, not one step past it.
    """

    def __init__(self, limit_s: float, clock: Callable[[], float]) -> None:
        self.clock, self.limit_s = clock, limit_s
        self.start = clock()
        self.end = self.start + limit_s
        self.longest: Dict[str, float] = {}
        # nothing is cut before one schedule is scored: a search always answers (on a loaded machine, building
        # PyTorch's first schedule alone may take longer than a short limit)
        self.armed = False

    def check(self, stage: str, expect_s: float = 0.0) -> float:
        """The clock's time now; :class:`_Cut` when less than ``expect_s`` is left (once armed)."""
        now = self.clock()
        if self.armed and self.end - now <= expect_s:
            raise _Cut(stage)
        return now

    def passed(self) -> bool:
        """Whether the time limit has passed (the clock read once): a loop that stops itself asks this."""
        return self.end - self.clock() <= 0 and self.armed

    def checker(self, stage: str) -> Callable[[], None]:
        """A stage's check, for its loop to call."""
        def check() -> None:
            self.check(stage)
        return check

    def atomic(self, kind: str, stage: str, run: Callable[[], _T]) -> _T:
        t0 = self.check(stage, self.longest.get(kind, 0.0))
        out = run()
        self.longest[kind] = max(self.longest.get(kind, 0.0), self.clock() - t0)
        return out


def _score(origin: str, program: PPProgram, costs: PPCosts, deadline: _Deadline) -> PPCandidate:
    try:
        return PPCandidate(origin, program, pp_simulate(program, costs, stop=deadline.passed), costs)
    except SimCut:  # the simulator's loop read the deadline
        raise _Cut("simulate") from None


#: the pipeline-parallel search's own defaults, as SolverOptions (its problems are small, its seeds good)
PP_SOLVER = {"time_limit_s": 10.0, "cpsat_max_tasks": 64}


def pp_search(costs: Union[PPCosts, Mapping[int, PPCosts]], n_ranks: int,
              n_microbatches: Union[int, Sequence[int]], *, constraints: Optional[Constraints] = None,
              solver: Optional[SolverOptions] = None,
              costs_for_microbatches: Optional[Mapping[int, Mapping[int, PPCosts]]] = None,
              margin_pct: float = 0.0, clock: Callable[[], float] = time.monotonic, **old: Any) -> PPSearchResult:
    """The fastest action order per rank (and micro-batch count) within a memory cap per rank.

    The options are the plan search's (``auto_schedule``'s): ``constraints=Constraints(max_memory_bytes=...)``
    (the cap per rank; the other constraints are a plan's and are not read here) and
    ``solver=SolverOptions(time_limit_s=..., method=..., cpsat_max_tasks=...)`` (``method="beam"``: the list
    scheduler alone, no CP-SAT; ``cpsat_max_tasks``: CP-SAT runs on a problem of at most this many compute
    actions). Without ``solver`` the search takes 10 s and ``cpsat_max_tasks=64``. The keywords before them
    (``memory_cap_bytes``, ``time_limit_s``, ``cpsat_max_actions``, ``use_cpsat``) are still taken for one release,
    with a ``FutureWarning`` naming the option that replaces each.

    Parameters
    ----------
    costs : PPCosts or dict
        The model's costs, or ``{n_stages: PPCosts}`` for each stage split measured
        (``n_ranks`` stages: one per rank; ``2 * n_ranks``: two per rank, looped or in a V).
    n_ranks : int
    n_microbatches : int or sequence of int
        The micro-batch counts to try, for the same batch: other counts than the one the
        costs were measured at are rescaled (:meth:`PPCosts.rescaled
        <autosched.pp.costs.PPCosts.rescaled>`) unless ``costs_for_microbatches`` has them.
    constraints : Constraints, optional
        ``max_memory_bytes``: the most any rank may hold at its peak (as ``simulate`` predicts it).
    solver : SolverOptions, optional
        ``time_limit_s``: the whole search's limit, in seconds of ``clock``. The search tries PyTorch's
        schedules first, then the list scheduler's policies, then CP-SAT (which shares what
        is left); every stage reads the same deadline and the search stops once it has
        passed, returning the best found so far (``.cut`` says where it stopped,
        ``.not_tried`` what it left out); the first of PyTorch's schedules that runs on these
        costs is scored whatever the limit, so the search always answers. The clock starts once torch's pipelining package is
        imported (a one-off cost of a process's first call). ``cpsat_max_tasks``: CP-SAT runs
        when a problem has at most this many compute actions; beyond, the list scheduler alone.
        ``method="beam"``: no CP-SAT.
    costs_for_microbatches : dict, optional
        ``{n_microbatches: {n_stages: PPCosts}}`` measured for each count.
    margin_pct : float
        A custom order is ``best`` only where it is predicted faster than PyTorch's fastest schedule (``best_seed``)
        by more than this percent; else ``best`` is that schedule. Pass the prediction's own error (on held-out
        steps: :func:`~autosched.pp.rolling.held_out_error_pct`): a smaller predicted gain is not one.
    clock : callable
        Seconds, monotonic: what the time limit is read on (tests pass a fake clock).

    Raises
    ------
    PPError
        ``rule="memory_cap"`` when no candidate fits the cap (``detail`` gives the least
        peak the bounds allow); ``rule="missing_cost"`` without costs for a stage split;
    OptionError
        An old keyword that is no option (its ``.home`` names the class of one that is); ``n_ranks`` or
        ``margin_pct`` out of range.

    Examples
    --------
    >>> from swpipe.pp import PPCosts, StageCost
    >>> costs = PPCosts((StageCost(1.0, 2.0, 1.0, 1.0),) * 2)
    >>> from swpipe import SolverOptions
    >>> found = pp_search(costs, 2, 4, solver=SolverOptions(method="beam"))
    >>> found.best.result.step_s <= found.best_seed.result.step_s, found.cut, found.status
    (True, '', 'OPTIMAL')
    """
    constraints, solver = _options(constraints, solver, old)
    memory_cap_bytes = constraints.max_memory_bytes
    time_limit_s, cpsat_max_actions = solver.time_limit_s, solver.cpsat_max_tasks
    use_cpsat = solver.method != "beam"
    check_arguments("pp_search", {"n_ranks": (n_ranks, integer(1)),
                                  "margin_pct": (margin_pct, number(0, finite=True))})
    by_stages = {costs.n_stages: costs} if isinstance(costs, PPCosts) else dict(costs)
    counts = [n_microbatches] if isinstance(n_microbatches, int) else list(n_microbatches)
    if not counts or any(not isinstance(n, int) or n < 1 for n in counts):
        raise PPError("bad_value", "n_microbatches", n_microbatches, detail="integers >= 1")
    layouts = _layouts(n_ranks, by_stages)
    if not layouts:
        raise PPError("missing_cost", "costs", sorted(by_stages), detail=f"costs for {n_ranks} or {2 * n_ranks} stages")
    costs_n = {n: _costs_for(by_stages, counts, n, costs_for_microbatches) for n in counts}
    candidates: List[PPCandidate] = []
    statuses: List[PPCpsatRun] = []
    best_orders: Dict[Tuple[int, str], Tuple[float, Dict[int, List[str]]]] = {}  # the hint CP-SAT starts from
    work: List[Tuple[str, str, Callable[[], None]]] = []  # (stage, what, run): cheap first, CP-SAT last

    def seed(n: int, name: str) -> None:
        p, _ = deadline.atomic("build", "seeds", lambda: builtin_program(name, n_ranks, n))
        c = costs_n[n].get(p.n_stages) if p is not None else None
        if p is None or c is None:
            return
        candidates.append(_score(f"PyTorch {name}", p, c, deadline))
        if p.lowered is None:  # its compute order through _PipelineScheduleRuntime, as a CSV runs it
            cand = _try(f"{name} order as CSV", p.compute, n, p.stage_to_rank, c, deadline, f"{name}-csv")
            if cand is not None:
                candidates.append(cand)

    def listed(n: int, layout: str, stage_to_rank: Tuple[int, ...], policy: _Policy) -> None:
        c = costs_n[n][len(stage_to_rank)]
        order = list_schedule(c, stage_to_rank, n, policy, memory_cap_bytes, check=deadline.checker("list"))
        cand = None if order is None else _try(f"{policy.name()} {layout}", order, n, stage_to_rank, c, deadline)
        if cand is not None:
            candidates.append(cand)
            if (n, layout) not in best_orders or cand.result.step_s < best_orders[n, layout][0]:
                best_orders[n, layout] = (cand.result.step_s, order)

    def exact(n: int, layout: str, stage_to_rank: Tuple[int, ...], split: bool, share: int) -> None:
        c = costs_n[n][len(stage_to_rank)]
        best = best_orders[n, layout][1] if (n, layout) in best_orders else None
        hint = best if best and _order_is(best, split) else None
        budget_s = (deadline.end - deadline.check("cpsat")) / share  # what is left, shared by those still to run
        order, status, made = _cpsat_order(c, stage_to_rank, n, split, memory_cap_bytes, budget_s, hint)
        statuses.append(PPCpsatRun(layout, n, split, status, made))
        cand = None if order is None else _try(f"cpsat({'IW' if split else 'B'}) {layout}", order, n, stage_to_rank,
                                                  c, deadline)
        if cand is not None:
            candidates.append(cand)

    for n in counts:
        work += [("seeds", f"PyTorch {name} n={n}", functools.partial(seed, n, name))
                 for name in _torch.available_schedules()]
    exact_problems = []
    for n, (layout, stage_to_rank) in itertools.product(counts, layouts):
        split_ok = all(x.backward_weight_s > 0 for x in costs_n[n][len(stage_to_rank)].stages)
        work += [("list", f"{policy.name()} {layout} n={n}",
                  functools.partial(listed, n, layout, stage_to_rank, policy)) for policy in _policies(split_ok)]
        if use_cpsat and len(stage_to_rank) * n * 3 <= cpsat_max_actions:
            exact_problems += [(n, layout, stage_to_rank, split) for split in ((False, True) if split_ok else (False,))]
    work += [("cpsat", f"cpsat({'IW' if split else 'B'}) {layout} n={n}",
              functools.partial(exact, n, layout, stage_to_rank, split, len(exact_problems) - i))
             for i, (n, layout, stage_to_rank, split) in enumerate(exact_problems)]
    # the clock starts here: after the one-off import of torch's pipelining package (seconds on a busy
    # machine, paid once per process) that listing PyTorch's schedules above may have done
    deadline = _Deadline(time_limit_s, clock)
    cut, not_tried = "", ()
    for i, (stage, what, run) in enumerate(work):
        try:
            deadline.check(stage)
            run()
            deadline.armed = bool(candidates)
        except _Cut as stop:
            cut, not_tried = stop.stage, tuple(w for _, w, _ in work[i:])
            break
    if not candidates:
        raise PPError("time_limit", "time_limit_s", time_limit_s,
                      detail=f"no schedule was scored within it (cut in {cut}): give the search more time")
    return _choose(candidates, memory_cap_bytes, tuple(statuses),
                   _Ended(cut, not_tried, deadline.clock() - deadline.start, time_limit_s), margin_pct)


#: pp_search's keywords before SolverOptions and Constraints: (the options class, its field, how a value maps)
_OLD = {"memory_cap_bytes": ("Constraints", "max_memory_bytes", lambda v: v),
        "time_limit_s": ("SolverOptions", "time_limit_s", lambda v: v),
        "cpsat_max_actions": ("SolverOptions", "cpsat_max_tasks", lambda v: v),
        "use_cpsat": ("SolverOptions", "method", lambda v: "auto" if v else "beam")}


def _options(constraints: Optional[Constraints], solver: Optional[SolverOptions],
             old: Mapping[str, Any]) -> Tuple[Constraints, SolverOptions]:
    """The search's options: ``constraints`` and ``solver`` (default: :data:`PP_SOLVER`), with ``pp_search``'s
    keywords from before them mapped on, each warned (``FutureWarning``) for one release."""
    plan_side: Dict[str, Any] = {}
    solver_side: Dict[str, Any] = dict(PP_SOLVER) if solver is None else {}
    for name, value in old.items():
        if name not in _OLD:
            raise misplaced_option("pp_search", name, value)
        home, field_name, mapped = _OLD[name]
        warnings.warn(f"pp_search({name}=...) is replaced by {home}({field_name}=...): pass "
                      f"{'constraints' if home == 'Constraints' else 'solver'}={home}({field_name}="
                      f"{mapped(value)!r})", FutureWarning, stacklevel=3)
        (plan_side if home == "Constraints" else solver_side)[field_name] = mapped(value)
    constraints = dataclasses.replace(constraints or Constraints(), **plan_side) if plan_side else (
        constraints or Constraints())
    solver = dataclasses.replace(solver or SolverOptions(), **solver_side) if solver_side else solver
    return constraints, solver


def _order_is(order: Dict[int, List[str]], split: bool) -> bool:
    from autosched.pp.program import parse_action

    has_w = any(parse_action(a)[1] == "W" for acts in order.values() for a in acts)
    return has_w == split


def _costs_for(by_stages: Mapping[int, PPCosts], counts: Sequence[int], n: int,
               measured: Optional[Mapping[int, Mapping[int, PPCosts]]]) -> Dict[int, PPCosts]:
    if measured and n in measured:
        return dict(measured[n])
    if len(counts) == 1:
        return dict(by_stages)
    base = counts[0]
    out = {}
    for k, c in by_stages.items():
        batch = c.samples_per_microbatch * base
        if c.samples_per_microbatch <= 0 or batch % n:
            raise PPError("missing_cost", "costs_for_microbatches", n,
                          detail="give costs measured for this micro-batch count (the batch does not rescale to it)")
        out[k] = c.rescaled(batch // n)
    return out


def _try(origin: str, order: Mapping[int, Sequence[str]], n: int, stage_to_rank: Sequence[int], costs: PPCosts,
         deadline: _Deadline, schedule: str = "swpipe-searched") -> Optional[PPCandidate]:
    try:
        program = deadline.atomic("lower", "score", lambda: program_from_order(order, n, stage_to_rank, schedule,
                                                                               source="swpipe"))
    except PPError:
        return None  # PyTorch's lowering refuses this order (it cannot place its sends and receives)
    return _score(origin, program, costs, deadline)


@dataclass(frozen=True)
class _Ended:
    """How the search ended: cut by its time limit (in which stage, leaving what) or not."""

    cut: str
    not_tried: Tuple[str, ...]
    elapsed_s: float
    time_limit_s: float


# steps this close (relative) are the same step to the search: sums of the same costs in another order
_SAME_STEP = 1e-9


def _choose(candidates: List[PPCandidate], cap: Optional[float], statuses: Tuple[PPCpsatRun, ...],
            ended: _Ended, margin_pct: float = 0.0) -> PPSearchResult:
    def fits(c: PPCandidate) -> bool:
        return cap is None or c.result.max_peak_bytes <= cap

    def key(c: PPCandidate) -> Preference:
        return pp_preference(c.result.step_s, c.result.max_peak_bytes, c.program.n_stages, c.program.n_microbatches)

    def best_of(among: List[PPCandidate]) -> PPCandidate:
        # the search promises no candidate predicted faster than its answer: only equal steps (to float noise) tie
        return fastest(among, key, tolerance=_SAME_STEP)

    ok = [c for c in candidates if fits(c)]
    if not ok:
        least = min((c.result.max_peak_bytes for c in candidates), default=0)
        raise PPError("memory_cap", "max_memory_bytes", cap,
                      detail=f"no schedule found fits; the least predicted peak is {least} bytes")
    best = best_of(ok)
    seeds = [c for c in ok if c.origin.startswith("PyTorch ")]
    exported = [c for c in ok if c.program.lowered is not None]
    best_seed = best_of(seeds) if seeds else None
    margin = 1 + margin_pct / 100
    if margin_pct > 0 and best_seed is not None and best_seed.result.step_s < best.result.step_s * margin:
        best = best_seed  # a custom order's predicted gain within the margin is no gain
    bound = pp_lower_bounds(best.costs, best.program.n_microbatches, best.program.stage_to_rank).value
    return PPSearchResult(best, best_seed, best_of(exported) if exported else best, bound, tuple(candidates),
                          cap, statuses, ended.cut, ended.not_tried, ended.elapsed_s, ended.time_limit_s)
