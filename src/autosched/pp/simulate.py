"""Predict a pipeline-parallel step: each rank's actions in order, on measured costs, in time.

:func:`pp_simulate` runs a :class:`~autosched.pp.program.PPProgram`'s ``steps`` on every
rank at once, as the runtime does:

* a rank runs its steps one after another on one thread (the runtime's loop);
* a compute action (F, I, W, B, LOSS, REDUCE_GRAD) takes its stage's cost (:class:`~autosched.pp.costs.StageCost`);
* posting a send or a receive takes the rank :attr:`P2PCost.post_s <autosched.pp.costs.P2PCost.post_s>`
  (what a transfer costs the computation on the CPU) and does not wait for the peer; a
  transfer starts once both its send and its receive are posted and takes
  :meth:`P2PCost.seconds <autosched.pp.costs.P2PCost.seconds>` of the bytes; a ``wait``
  blocks the rank until the transfers it names have ended;
* a step ends when every rank has run its last step.

Memory, per rank: a forward adds its stage's ``activation_bytes`` when it ends; an I leaves
``weight_keep_bytes`` of them (what W needs, with the intermediates' gradients I keeps for
it: more than the forward left, at times), a W frees those, a B everything; while an action
runs, its ``*_peak_bytes`` come on top. A tensor handed to a send (a forward's output, a backward's
input gradient) lives until the runtime lets go of the send
(:attr:`PPProgram.send_retention <autosched.pp.program.PPProgram.send_retention>`). The
peak is the most of that over the step, above what was alive when it started.

PyTorch's own dry run (``_simulate_comms_compute``) counts unit steps: every action takes
one, transfers take none and no memory is counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from swpipe_core.measure.trace import TimelineEvent

from autosched.model.memcurve import MemoryChanges
from autosched.pp.costs import PPCosts
from autosched.pp.program import PPError, PPProgram, parse_action, transfer_key, validate_program
from autosched.results import PeakBytes

__all__ = ["PPSimResult", "pp_simulate", "simulate_checked", "simulate_on_core", "TimelineEntry"]


@dataclass(frozen=True)
class TimelineEntry:
    """One simulated interval: a rank's compute action, or a transfer (``rank`` = the sender)."""

    rank: int
    action: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class PPSimResult:
    """What :func:`pp_simulate` predicts for one step.

    Attributes
    ----------
    schedule : str
    step_s : float
        The step time: from the first action to the last rank's end.
    busy_s, bubble_s : dict
        Per rank: seconds of compute, and the rest of the step (idle, waiting or posting).
    peak_bytes : dict
        Per rank: the most bytes alive above the step's start (activations, input
        gradients awaiting their send, the running action's transient).
    end_s : dict
        Per rank: when its last step ended.
    timeline : tuple of TimelineEntry
    """

    schedule: str
    step_s: float
    busy_s: Dict[int, float]
    bubble_s: Dict[int, float]
    peak_bytes: Dict[int, int]
    end_s: Dict[int, float]
    timeline: Tuple[TimelineEntry, ...] = field(default=(), repr=False)

    @property
    def period_s(self) -> float:
        """:attr:`step_s`: a step repeats once per step (the verbs' common name, :mod:`autosched.results`)."""
        return self.step_s

    @property
    def peak_bytes_by(self) -> PeakBytes:
        """:attr:`peak_bytes` as the verbs' one memory type (:class:`autosched.results.PeakBytes`, per rank)."""
        return PeakBytes(dict(self.peak_bytes), "rank")

    @property
    def events(self) -> List[TimelineEvent]:
        """The timeline as :class:`~swpipe_core.measure.trace.TimelineEvent`: a track per rank (``"rank 0"``) for its
        compute actions (task ``"F1"``: the action and its stage; iteration: the micro-batch), and one per
        sending rank for its transfers (``"rank 0 sends"``). :func:`autosched.plots.gantt` draws it."""
        out = []
        for e in self.timeline:
            stage, kind, mb = parse_action(e.action) if "SEND" not in e.action else (None, None, None)
            if kind is None:  # a transfer: "<stage>SEND_<F|B><micro-batch>"
                head, _, tail = e.action.partition("SEND_")
                out.append(TimelineEvent(f"send {tail[0]}{head}", int(tail[1:]), f"rank {e.rank}",
                                         f"rank {e.rank} sends", e.start_s, e.end_s, "device"))
            else:
                out.append(TimelineEvent(f"{kind}{stage}", -1 if mb is None else mb, f"rank {e.rank}", "default",
                                         e.start_s, e.end_s))
        return out

    @property
    def bubble_fraction(self) -> Dict[int, float]:
        """Per rank: ``bubble_s / step_s``."""
        return {r: (b / self.step_s if self.step_s > 0 else 0.0) for r, b in self.bubble_s.items()}

    @property
    def max_peak_bytes(self) -> int:
        return max(self.peak_bytes.values()) if self.peak_bytes else 0

    def summary(self) -> str:
        """One line per rank under a header line."""
        lines = [f"{self.schedule}: step {self.step_s * 1e3:.3f} ms"]
        for r in sorted(self.busy_s):
            lines.append(f"  rank {r}: busy {self.busy_s[r] * 1e3:.3f} ms, bubble {self.bubble_fraction[r]:.0%}, "
                         f"peak {self.peak_bytes[r] / 2**20:.2f} MiB")
        return "\n".join(lines)


class _Transfers:
    """Posted sends and receives, matched by key; a transfer's end once both sides are posted."""

    def __init__(self, program: PPProgram, costs: PPCosts) -> None:
        self.costs = costs
        self.send_post: Dict[Tuple[str, int, int], float] = {}
        self.recv_post: Dict[Tuple[str, int, int], float] = {}
        self.sender: Dict[Tuple[str, int, int], int] = {}

    def post(self, action: str, rank: int, t: float) -> None:
        key = transfer_key(action)
        if "SEND" in action:
            self.send_post[key] = t
            self.sender[key] = rank
        else:
            self.recv_post[key] = t

    def nbytes(self, key: Tuple[str, int, int]) -> int:
        direction, stage, _ = key
        # a gradient goes back the size of the activation that came forward on the same boundary
        return self.costs.stage(stage if direction == "F" else stage - 1).output_bytes

    def end(self, key: Tuple[str, int, int]) -> Optional[float]:
        if key not in self.send_post or key not in self.recv_post:
            return None
        return max(self.send_post[key], self.recv_post[key]) + self.costs.p2p.seconds(self.nbytes(key))

    def released(self, key: Tuple[str, int, int], retention: str, rank_end: float) -> float:
        """When the tensor a send holds is let go (see :data:`~autosched.pp.program.PPProgram.send_retention`)."""
        if key not in self.send_post:
            # a neighbour on the same rank: the runtime hands the tensor over as that stage's input (or
            # output gradient) buffer (``set_local_fwd_input``/``set_local_bwd_input``), kept to the step's end
            return rank_end
        if retention == "step":
            return rank_end
        if retention == "next":
            later = [t for k, t in self.send_post.items() if k[0] == key[0] and self.sender.get(k) == self.sender[key]
                     and t > self.send_post[key]]
            return min(later, default=rank_end)
        end = self.end(key)
        return rank_end if end is None else end


class _Rank:
    """One rank's clock, position in its steps, compute time and memory events."""

    def __init__(self, rank: int, steps: Tuple[Tuple[str, Tuple[str, ...]], ...]) -> None:
        self.rank, self.steps = rank, steps
        self.pos = 0
        self.t = 0.0
        self.busy = 0.0
        # its bytes: at one instant the changes apply in the order the rank made them
        self.memory = MemoryChanges()
        # bytes a send may still hold once the compute that made them is done: (the send's key, bytes, when known)
        self.held: List[Tuple[Tuple[str, int, int], int, float]] = []

    def mem(self, t: float, delta: int = 0, transient: int = 0) -> None:
        self.memory.add(t, delta, transient=transient)

    def peak(self, transfers: _Transfers, retention: str) -> int:
        for key, nbytes, made in self.held:
            self.mem(max(made, transfers.released(key, retention, self.t)), -nbytes)
        return int(self.memory.peak().bytes)


def _compute(r: _Rank, action: str, costs: PPCosts, timeline: List[TimelineEntry], n_stages: int) -> None:
    stage, kind, mb = parse_action(action)
    if kind in ("UNSHARD", "RESHARD"):  # FSDP's: nothing to do for an unsharded stage
        return
    c = costs.stage(stage)
    dt = c.action_s(kind)
    start, end = r.t, r.t + dt
    # the output went to the next stage: a send may hold it past this backward (freed when the send lets go)
    out = c.output_bytes if kind in ("B", "I") and stage < n_stages - 1 and mb is not None else 0
    # the last stage's loss, kept by the schedule to the step's end, keeps some of the forward's bytes
    out += c.loss_keep_bytes if kind in ("B", "I") and stage == n_stages - 1 else 0
    if kind == "F":
        r.mem(start, 0, c.forward_peak_bytes)
        r.mem(end, c.activation_bytes)
    elif kind == "B":
        r.mem(start, 0, c.backward_peak_bytes)
        r.mem(end, -(c.activation_bytes - out))
    elif kind == "I":
        r.mem(start, 0, c.backward_input_peak_bytes)
        r.mem(end, -(c.activation_bytes - c.weight_keep_bytes - out))
    elif kind == "W":
        r.mem(start, 0, c.backward_weight_peak_bytes)
        r.mem(end, -c.weight_keep_bytes)
    if out and stage < n_stages - 1:  # (the last stage's: held to the step's end, never freed within it)
        r.held.append((("F", stage, mb), out, end))  # type: ignore[arg-type]
    if kind in ("B", "I") and stage > 0 and mb is not None and c.grad_input_bytes:
        r.mem(end, c.grad_input_bytes)
        r.held.append((("B", stage, mb), c.grad_input_bytes, end))
    r.t, r.busy = end, r.busy + dt
    timeline.append(TimelineEntry(r.rank, action, start, end))


def _advance(r: _Rank, transfers: _Transfers, costs: PPCosts, timeline: List[TimelineEntry], n_stages: int) -> bool:
    """Run rank ``r`` until it blocks on a transfer not yet matched or ends; whether it moved."""
    moved = False
    while r.pos < len(r.steps):
        kind, actions = r.steps[r.pos]
        if kind == "post":
            for a in actions:  # each posted op takes the posting thread ``post_s`` (gloo's CPU, the wake-ups)
                transfers.post(a, r.rank, r.t)
                r.t += costs.p2p.post_s
        elif kind == "wait":
            ends = [transfers.end(transfer_key(a)) for a in actions]
            if any(e is None for e in ends):
                return moved
            r.t = max([r.t] + ends)  # type: ignore[arg-type]
        else:
            for a in actions:
                _compute(r, a, costs, timeline, n_stages)
        r.pos += 1
        moved = True
    return moved


def pp_simulate(program: PPProgram, costs: PPCosts, *, cores: Optional[int] = None) -> PPSimResult:
    """The predicted step of ``program`` on ``costs``: step time, bubble and peak memory per rank.

    Parameters
    ----------
    program : PPProgram
        E.g. :func:`~autosched.pp.program.pp_program`.
    costs : PPCosts
        One :class:`~autosched.pp.costs.StageCost` per stage of the program.
    cores : int, optional
        Cores the ranks share (ranks on one CPU machine, as under ``torchrun`` on one host): a compute
        action or a post's CPU time takes one while it runs, and a rank that finds none free waits for
        one, oldest first (the plan simulator's core pool, docs/semantics.md). ``None``: a core per
        rank. The step is then run on the plan simulator's event core (:func:`simulate_on_core`).

    Raises
    ------
    PPError
        ``rule="missing_cost"`` when the costs do not cover the program's stages.
    PPScheduleError
        When the program breaks a rule of :func:`~autosched.pp.program.validate_program`
        (an action twice or missing, a dependency out of order, ranks that deadlock): the
        runtime would not run it through, so nothing is predicted.

    Examples
    --------
    >>> from swpipe.pp import pp_program, PPCosts, StageCost
    >>> costs = PPCosts((StageCost(1.0, 2.0),) * 2)
    >>> gpipe = pp_simulate(pp_program("GPipe", 2, 4), costs)
    >>> gpipe.step_s, gpipe.bubble_s[0]
    (15.0, 3.0)
    >>> pp_simulate(pp_program("GPipe", 2, 4), costs, cores=1).step_s  # one core: the ranks take turns
    24.0
    """
    if cores is not None:
        return simulate_on_core(program, costs, cores)
    return simulate_checked(program, costs)


def simulate_checked(program: PPProgram, costs: PPCosts, check: Optional[Callable[[], None]] = None) -> PPSimResult:
    """:func:`pp_simulate`, calling ``check()`` once per round of the ranks (a search's deadline: it raises to stop)."""
    if costs.n_stages != program.n_stages:
        raise PPError("missing_cost", "costs.stages", costs.n_stages, program.schedule,
                      f"the program has {program.n_stages} stages: measure costs for that split")
    validate_program(program)
    transfers = _Transfers(program, costs)
    ranks = [_Rank(r, tuple(program.steps[r])) for r in range(program.n_ranks)]
    timeline: List[TimelineEntry] = []
    while any(r.pos < len(r.steps) for r in ranks):
        if check is not None:
            check()
        moved = False
        for r in ranks:
            moved = _advance(r, transfers, costs, timeline, program.n_stages) or moved
        if not moved:  # validate_program replays the same waits: a program it passed reaches its end
            raise RuntimeError(f"{program.schedule}: validate_program passed a program whose ranks deadlock")
    for key, send_t in transfers.send_post.items():
        end = transfers.end(key)
        if end is not None:
            timeline.append(TimelineEntry(transfers.sender[key], f"{key[1]}SEND_{key[0]}{key[2]}", send_t, end))
    step = max((r.t for r in ranks), default=0.0)
    return PPSimResult(program.schedule, step, {r.rank: r.busy for r in ranks},
                       {r.rank: step - r.busy for r in ranks}, {r.rank: r.peak(transfers, program.send_retention) for r in ranks},
                       {r.rank: r.t for r in ranks}, tuple(sorted(timeline, key=lambda e: (e.start_s, e.rank))))


def _core_plan(program: PPProgram, costs: PPCosts) -> Tuple[Any, Any, Dict[str, Tuple[str, ...]]]:
    """``program`` as one iteration of a plan: a rank is a thread group, every step a task on it, a transfer a task.

    A compute action is a task of its cost on its rank's thread; a posted send or receive is a
    marker (no time, the instant it is posted) followed by its ``post_s`` of CPU; a transfer is a
    task of :meth:`P2PCost.seconds <autosched.pp.costs.P2PCost.seconds>` on a link of its own
    (transfers do not queue behind each other, as in :func:`simulate_checked`) after both its
    markers; a wait is a task of no time after the transfers it names. Markers, waits and
    transfers hold no core (``nocore``): a blocked rank does not compute. Returns the plan, its cost
    model (without a core pool) and each rank's tasks in order.
    """
    import networkx as nx

    from autosched.model.costs import CostModel, TaskCost
    from autosched.model.taskmodel import NOCORE
    from swpipe_core.plan import PipelinePlan, TaskSchedule

    schedule: Dict[str, Any] = {}
    task_costs: Dict[str, Any] = {}
    deps: List[Tuple[str, str]] = []
    order: List[str] = []
    by_rank: Dict[str, Tuple[str, ...]] = {}
    posted: Dict[Tuple[str, int, int], List[str]] = {}

    def add(name: str, group: str, seconds: float, core: bool) -> None:
        schedule[name] = TaskSchedule(0, thread_group=group)
        task_costs[name] = TaskCost(seconds, resources=() if core and seconds > 0 else (NOCORE,))
        order.append(name)

    transfers = _Transfers(program, costs)
    for rank in range(program.n_ranks):
        group, mine = f"rank{rank}", []
        for pos, (kind, actions) in enumerate(program.steps[rank]):
            for a in actions:
                if kind == "compute":
                    stage, what, _ = parse_action(a)
                    seconds = 0.0 if what in ("UNSHARD", "RESHARD") else costs.stage(stage).action_s(what)
                    add(a, group, seconds, True)
                    mine.append(a)
                elif kind == "post":
                    add(f"post {a}", group, 0.0, False)
                    posted.setdefault(transfer_key(a), []).append(f"post {a}")
                    mine.append(f"post {a}")
                    if costs.p2p.post_s:
                        add(f"post_s {a}", group, costs.p2p.post_s, True)
                        mine.append(f"post_s {a}")
            if kind == "wait":
                name = f"wait {rank}.{pos}"
                add(name, group, 0.0, False)
                deps += [(name, f"link {_key_text(transfer_key(a))}") for a in actions]
                mine.append(name)
        by_rank[group] = tuple(mine)
    for key, markers in posted.items():
        name = f"link {_key_text(key)}"
        add(name, name, costs.p2p.seconds(transfers.nbytes(key)), False)
        deps += [(name, m) for m in markers]
    # the main thread hands tasks out in a topological order: each rank's steps in order, a task after what it waits
    graph = nx.DiGraph(deps and [(d, t) for t, d in deps])
    graph.add_nodes_from(order)
    graph.add_edges_from(pair for mine in by_rank.values() for pair in zip(mine, mine[1:]))
    place = {name: k for k, name in enumerate(order)}
    order = list(nx.lexicographical_topological_sort(graph, key=place.__getitem__))
    plan = PipelinePlan(schedule, intra_iter_deps=list(dict.fromkeys(deps)), enqueue_order=order, caller_group=None)
    return plan, CostModel(task_costs), by_rank


def _key_text(key: Tuple[str, int, int]) -> str:
    return f"{key[1]}{key[0]}{key[2]}"


def simulate_on_core(program: PPProgram, costs: PPCosts, cores: Optional[int] = None) -> PPSimResult:
    """:func:`pp_simulate` run on the plan simulator's event core (:class:`autosched.model._simcore.Simulator`).

    The program becomes one iteration of a plan (:func:`_core_plan`); the plan simulator runs it, with
    ``cores`` as its core pool, and the step, busy time, timeline and memory are read back from its
    timeline by the same rules as :func:`simulate_checked`, which it equals when no core is short.

    Examples
    --------
    >>> from swpipe.pp import pp_program, PPCosts, StageCost
    >>> costs = PPCosts((StageCost(1.0, 2.0),) * 2)
    >>> simulate_on_core(pp_program("GPipe", 2, 4), costs).step_s, simulate_on_core(pp_program("GPipe", 2, 4), costs, 1).step_s
    (15.0, 24.0)
    """
    import dataclasses

    from autosched.model._simcore import Simulator
    from autosched.model._simplan import sim_plan
    from swpipe_core.validate import validate

    if costs.n_stages != program.n_stages:
        raise PPError("missing_cost", "costs.stages", costs.n_stages, program.schedule,
                      f"the program has {program.n_stages} stages: measure costs for that split")
    validate_program(program)
    plan, model, by_rank = _core_plan(program, costs)
    validate(plan)
    sim = Simulator(sim_plan(plan, dataclasses.replace(model, cores=cores), cuda=False, task_overhead_s=0.0,
                             period_overhead_s=0.0, max_device_lag=1), iterations=1)
    sim.run()
    names = sim.plan.names
    start = {names[inst]: s for inst, s, _ in sim.ops.host_events}
    end = {names[inst]: e for inst, _, e in sim.ops.host_events}
    transfers = _Transfers(program, costs)
    timeline: List[TimelineEntry] = []
    ranks = []
    for rank in range(program.n_ranks):
        r = _Rank(rank, tuple(program.steps[rank]))
        for kind, actions in r.steps:
            for a in actions:
                if kind == "post":
                    transfers.post(a, rank, start[f"post {a}"])
                elif kind == "compute":
                    r.t = start[a]
                    _compute(r, a, costs, timeline, program.n_stages)
        r.t = max((end[name] for name in by_rank[f"rank{rank}"]), default=0.0)
        ranks.append(r)
    for key, send_t in transfers.send_post.items():
        link = end.get(f"link {_key_text(key)}")
        if link is not None:
            timeline.append(TimelineEntry(transfers.sender[key], f"{key[1]}SEND_{key[0]}{key[2]}", send_t, link))
    step = max((r.t for r in ranks), default=0.0)
    return PPSimResult(program.schedule, step, {r.rank: r.busy for r in ranks},
                       {r.rank: step - r.busy for r in ranks},
                       {r.rank: r.peak(transfers, program.send_retention) for r in ranks},
                       {r.rank: r.t for r in ranks}, tuple(sorted(timeline, key=lambda e: (e.start_s, e.rank))))
