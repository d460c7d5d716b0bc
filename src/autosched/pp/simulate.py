"""Predict a pipeline-parallel step: each rank's actions in order, on measured costs, in time.

:func:`pp_simulate` runs a :class:`~autosched.pp.program.PPProgram`'s ``steps`` on every
rank at once, as the runtime does, on the plan simulator's event core
(:class:`autosched.model._simcore.Simulator`): the program becomes one iteration of a plan whose
tasks are compiled once per program (:func:`_compile`):

* a rank is a thread group: it runs its steps one after another (the runtime's loop);
* a compute action (F, I, W, B, LOSS, REDUCE_GRAD) is a task of its stage's cost
  (:class:`~autosched.pp.costs.StageCost`) on its rank;
* posting a send or a receive is a marker (the instant it is posted) and a task of
  :attr:`P2PCost.post_s <autosched.pp.costs.P2PCost.post_s>` (what a transfer costs the computation
  on the CPU); the rank does not wait for the peer;
* a transfer is a task on a link of its own (transfers do not queue behind each other), of
  :meth:`P2PCost.seconds <autosched.pp.costs.P2PCost.seconds>` of the bytes, once its send and its
  receive are posted; a ``wait`` is a task of no time after the transfers it names;
* ``cores``: the ranks share that many cores (the plan simulator's core pool: a compute
  action or a post's CPU time holds one; markers, waits and transfers hold none);
* on CUDA (``device="cuda"``, or costs measured over NCCL) each rank also has a compute stream
  and a communication stream, as ``ProcessGroupNCCL`` runs them: a compute action is device time on
  the compute stream; a post enqueues its operations on the communication stream after the compute
  posted before it; a posted operation (a send or a receive) holds the communication stream from
  when it starts until its transfer lands, so what was posted behind it waits (a receive posted
  before a send delays the send: PyTorch issue 172668); the operations of one post step are one
  NCCL group (``batch_isend_irecv``): they start together. A ``wait`` makes the compute stream wait
  for them; the CPU does not block;
* a step ends when every rank has run its last step.

Memory, per rank: a forward adds its stage's ``activation_bytes`` when it ends; an I leaves
``weight_keep_bytes`` of them (what W needs, with the intermediates' gradients I keeps for
it: more than the forward left, at times), a W frees those, a B everything; while an action
runs, its ``*_peak_bytes`` come on top. A tensor handed to a send (a forward's output, a backward's
input gradient) lives until the runtime lets go of the send
(:attr:`PPProgram.send_retention <autosched.pp.program.PPProgram.send_retention>`: for GPipe and 1F1B, after
the computation their own step loop lets go of it, traced). The
peak is the most of that over the step, above what was alive when it started.

PyTorch's own dry run (``_simulate_comms_compute``) counts unit steps: every action takes
one, transfers take none and no memory is counted.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from swpipe_core.measure.trace import TimelineEvent

from autosched.model._simevents import SimCut, SimDeadlock
from autosched.model._simplan import Dep
from autosched.model.memcurve import MemoryChanges
from autosched.pp.costs import PPCosts
from autosched.pp.program import (PPError, PPProgram, PPScheduleError, parse_action, transfer_key,
                                  validate_program)
from autosched.results import PeakBytes

__all__ = ["PPSimResult", "pp_simulate", "TimelineEntry", "SimCut"]

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
    events : tuple of TimelineEvent
        The same intervals as the plan simulator's timeline events (:class:`swpipe_core.measure.trace.TimelineEvent`,
        what :func:`autosched.plots.gantt` draws and Chrome traces hold), a track per rank: a compute action is
        ``task`` = stage and kind (``"0F"``), ``iteration`` = micro-batch (0 for none), on thread group
        ``"rank<r>"`` (on CUDA device time on stream ``"rank<r>.compute"``); a transfer is device time on its
        sender's ``"rank<r>.comm"`` (gloo's or NCCL's), from its send's post until it landed.
    device : str
        ``"cpu"`` or ``"cuda"``: how the step was run (:func:`pp_simulate`'s ``device``).
    """

    schedule: str
    step_s: float
    busy_s: Dict[int, float]
    bubble_s: Dict[int, float]
    peak_bytes: Dict[int, int]
    end_s: Dict[int, float]
    timeline: Tuple[TimelineEntry, ...] = field(default=(), repr=False)
    events: Tuple[TimelineEvent, ...] = field(default=(), repr=False)
    device: str = "cpu"

    @property
    def period_s(self) -> float:
        """:attr:`step_s`: a step repeats once per step (the verbs' common name, :mod:`autosched.results`)."""
        return self.step_s

    @property
    def peak_bytes_by(self) -> PeakBytes:
        """:attr:`peak_bytes` as the verbs' one memory type (:class:`autosched.results.PeakBytes`, per rank)."""
        return PeakBytes(dict(self.peak_bytes), "rank")

    @property
    def bubble_fraction(self) -> Dict[int, float]:
        """Per rank: ``bubble_s / step_s``."""
        return {r: (b / self.step_s if self.step_s > 0 else 0.0) for r, b in self.bubble_s.items()}

    @property
    def max_peak_bytes(self) -> int:
        return max(self.peak_bytes.values()) if self.peak_bytes else 0

    def gantt(self, window: Optional[Tuple[float, float]] = None, path: Optional[str] = None) -> Any:
        """:func:`autosched.plots.gantt` of :attr:`events`: a row per rank's thread and per stream, titled by schedule.

        Examples
        --------
        >>> from swpipe.pp import pp_program, PPCosts, StageCost
        >>> fig = pp_simulate(pp_program("GPipe", 2, 2), PPCosts((StageCost(1.0, 2.0),) * 2)).gantt()
        >>> [t.get_text() for t in fig.axes[0].get_yticklabels()]
        ['thread rank0', 'thread rank1', 'stream rank0.comm', 'stream rank1.comm']
        """
        from autosched.plots import gantt

        return gantt(self.events, window=window, title=f"{self.schedule} ({self.device})", path=path)

    def summary(self) -> str:
        """One line per rank under a header line."""
        lines = [f"{self.schedule}: step {self.step_s * 1e3:.3f} ms"]
        for r in sorted(self.busy_s):
            lines.append(f"  rank {r}: busy {self.busy_s[r] * 1e3:.3f} ms, bubble {self.bubble_fraction[r]:.0%}, "
                         f"peak {self.peak_bytes[r] / 2**20:.2f} MiB")
        return "\n".join(lines)


class _Transfers:
    """Posted sends and receives, matched by key, and when each transfer landed (read back from the run)."""

    def __init__(self, costs: PPCosts) -> None:
        self.costs = costs
        self.send_post: Dict[Tuple[str, int, int], float] = {}
        self.recv_post: Dict[Tuple[str, int, int], float] = {}
        self.sender: Dict[Tuple[str, int, int], int] = {}
        self.landed: Dict[Tuple[str, int, int], float] = {}

    def post(self, key: Tuple[str, int, int], send: bool, rank: int, t: float) -> None:
        if send:
            self.send_post[key] = t
            self.sender[key] = rank
        else:
            self.recv_post[key] = t

    def nbytes(self, key: Tuple[str, int, int]) -> int:
        direction, stage, _ = key
        # a gradient goes back the size of the activation that came forward on the same boundary
        return self.costs.stage(stage if direction == "F" else stage - 1).output_bytes

    def released(self, key: Tuple[str, int, int], retention: str, rank_end: float,
                 traced: Optional[float] = None) -> float:
        """When the tensor a send holds is let go (see :data:`~autosched.pp.program.PPProgram.send_retention`);
        ``traced``: with ``"traced"``, when the computation the runtime lets go of it after ended (None: the
        step's end)."""
        if key not in self.send_post:
            # a neighbour on the same rank: the runtime hands the tensor over as that stage's input (or
            # output gradient) buffer (``set_local_fwd_input``/``set_local_bwd_input``), kept to the step's end
            return rank_end
        if retention == "step":
            return rank_end
        if retention == "traced":
            return rank_end if traced is None else traced
        if retention == "next":
            later = [t for k, t in self.send_post.items() if k[0] == key[0] and self.sender.get(k) == self.sender[key]
                     and t > self.send_post[key]]
            return min(later, default=rank_end)
        return self.landed.get(key, rank_end)


class _Rank:
    """One rank's clock, compute time and memory events, read back from the simulated run."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.t = 0.0
        self.busy = 0.0
        # its bytes: at one instant the changes apply in the order the rank made them
        self.memory = MemoryChanges()
        # bytes a send may still hold once the compute that made them is done: (the send's key, bytes, when known)
        self.held: List[Tuple[Tuple[str, int, int], int, float]] = []
        self.ended: Dict[str, float] = {}  # each compute action's end

    def mem(self, t: float, delta: int = 0, transient: int = 0) -> None:
        self.memory.add(t, delta, transient=transient)

    def peak(self, transfers: _Transfers, program: PPProgram) -> int:
        after = {transfer_key(send): action for send, action in
                 ((program.send_release or {}).get(self.rank) or {}).items()}
        for key, nbytes, made in self.held:
            traced = self.ended.get(after[key]) if after.get(key) is not None else None
            self.mem(max(made, transfers.released(key, program.send_retention, self.t, traced)), -nbytes)
        return int(self.memory.peak().bytes)


def _compute(r: _Rank, action: str, parsed: Tuple[int, str, Optional[int]], costs: PPCosts,
             timeline: List[TimelineEntry], n_stages: int) -> None:
    stage, kind, mb = parsed
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
    r.ended[action] = end
    timeline.append(TimelineEntry(r.rank, action, start, end))


# what a task of the compiled program is
_COMPUTE, _POST, _POST_S, _DONE, _WAIT, _LINK = range(6)


@dataclass(frozen=True)
class _Compiled:
    """A program's tasks on the event core, built once per program (and per posting cost and device).

    Task ``k`` is ``names[k]``, of kind ``what[k]`` (``_COMPUTE`` ... ``_LINK``), about ``action[k]``
    (the compute or posted action; a link's transfer key), on thread group ``thread[k]`` and stream
    ``stream[k]``, after ``deps[k]``. ``rank_tasks[r]`` are rank ``r``'s tasks in its order;
    ``posts`` each posted action as ``(rank, transfer key, a send, tasks)``: it was posted when the
    last of ``tasks`` ended (none: at the step's start). A compute task's ``action`` is its text and
    :func:`~autosched.pp.program.parse_action` of it.
    """

    names: Tuple[str, ...]
    what: Tuple[int, ...]
    action: Tuple[object, ...]
    group_names: Tuple[str, ...]
    thread: Tuple[int, ...]
    stream_names: Tuple[str, ...]
    stream: Tuple[int, ...]
    deps: List[List[Dep]]
    rank_tasks: Tuple[Tuple[int, ...], ...]
    posts: Tuple[Tuple[int, Tuple[str, int, int], bool, Tuple[int, ...]], ...]


# compiled programs by (id, posting, cuda); an entry goes when its program is collected
_COMPILED: Dict[Tuple[int, bool, bool], Tuple["weakref.ref[PPProgram]", _Compiled]] = {}


def _compiled(program: PPProgram, posting: bool, cuda: bool) -> _Compiled:
    """:func:`_compile` of ``program``, checked (:func:`validate_program`) and built on its first call only.

    A :class:`PPProgram` is frozen: what it runs does not change once it is made.
    """
    key = (id(program), posting, cuda)
    found = _COMPILED.get(key)
    if found is not None and found[0]() is program:
        return found[1]
    validate_program(program)
    compiled = _compile(program, posting, cuda)
    if found is None:
        weakref.finalize(program, _COMPILED.pop, key, None)
    _COMPILED[key] = (weakref.ref(program), compiled)
    return compiled


def _compile(program: PPProgram, posting: bool, cuda: bool) -> _Compiled:
    """``program`` as one iteration of tasks: a rank a thread group, every step a task, a transfer a task on a link.

    See the module docstring for what each task is. ``posting``: a post takes CPU time (a task).
    On CPU the fewest tasks that give the same times (every event costs the search time): a post's
    instant is when the task before it on its rank ended, so a transfer waits for that task (and for
    the transfers waited since) instead of a marker; a wait's transfers are waited by the rank's next
    task (a wait is a task only at a rank's end). On CUDA a post is a marker on the communication
    stream (its place in the stream's order) and each posted operation an end there after its
    transfer. Every dependency is on a task earlier on its rank or on a link, whose posts come
    earlier on their ranks: a program :func:`validate_program` passed makes no cycle.
    """
    names: List[str] = []
    what: List[int] = []
    action: List[object] = []
    thread: List[int] = []
    stream: List[int] = []
    deps: List[List[object]] = []  # task indices, or a transfer's key until the links are numbered
    group_names = [f"rank{r}" for r in range(program.n_ranks)]
    stream_names = [f"rank{r}.{s}" for r in range(program.n_ranks) for s in ("compute", "comm")] if cuda else [""]
    posted: Dict[Tuple[str, int, int], List[object]] = {}  # a transfer's key -> what its posts waited
    posts: List[Tuple[int, Tuple[str, int, int], bool, Tuple[object, ...]]] = []
    rank_tasks = []

    def add(name: str, kind: int, about: object, rank: int, on_comm: bool, after: List[object]) -> int:
        names.append(name)
        what.append(kind)
        action.append(about)
        thread.append(rank)
        stream.append(2 * rank + on_comm if cuda else 0)
        deps.append(list(after))
        return len(names) - 1

    for rank in range(program.n_ranks):
        first = len(names)
        last_compute = -1
        pending: List[object] = []  # CPU: the transfers waited since the rank's last task
        ops: Dict[str, int] = {}  # CUDA: a posted action -> its end on the communication stream
        for pos, (kind, actions) in enumerate(program.steps[rank]):
            if kind == "compute":
                for a in actions:
                    last_compute = add(a, _COMPUTE, (a, parse_action(a)), rank, False, pending)
                    pending = []
            elif kind == "post" and cuda:
                for a in actions:
                    # NCCL's stream waits for the compute posted before the operation
                    marker = add(f"post {a}", _POST, a, rank, True, [last_compute] if last_compute >= 0 else [])
                    posted.setdefault(transfer_key(a), []).append(marker)
                    posts.append((rank, transfer_key(a), "SEND" in a, (marker,)))
                    if posting:
                        add(f"post_s {a}", _POST_S, a, rank, True, [])
                for a in actions:  # one group: every operation started, each holds the stream until it lands
                    ops[a] = add(f"done {a}", _DONE, a, rank, True, [transfer_key(a)])
            elif kind == "post":
                for a in actions:
                    clock = ([len(names) - 1] if len(names) > first else []) + pending
                    posted.setdefault(transfer_key(a), []).extend(clock)
                    posts.append((rank, transfer_key(a), "SEND" in a, tuple(clock)))
                    if posting:
                        add(f"post_s {a}", _POST_S, a, rank, False, pending)
                        pending = []
            elif cuda:
                add(f"wait {rank}.{pos}", _WAIT, None, rank, False, [ops[a] for a in actions])
            else:
                pending = pending + [transfer_key(a) for a in actions]
        if pending:
            add(f"wait {rank}.end", _WAIT, None, rank, False, pending)
        rank_tasks.append(tuple(range(first, len(names))))
    link: Dict[object, int] = {}
    for key, after in posted.items():
        name = f"link {_key_text(key)}"
        group_names.append(name)
        if cuda:
            stream_names.append(name)
        k = link[key] = add(name, _LINK, key, len(group_names) - 1, False, after)
        if cuda:
            stream[k] = len(stream_names) - 1

    def task(d: object) -> int:
        return d if isinstance(d, int) else link[d]

    return _Compiled(tuple(names), tuple(what), tuple(action), tuple(group_names), tuple(thread),
                     tuple(stream_names), tuple(stream),
                     [[(d, 0, f"dep:{names[d]}", f"event:{names[d]}") for d in dict.fromkeys(map(task, ds))]
                      for ds in deps],
                     tuple(rank_tasks), tuple((r, key, send, tuple(map(task, clock))) for r, key, send, clock in posts))


def _key_text(key: Tuple[str, int, int]) -> str:
    return f"{key[1]}{key[0]}{key[2]}"


def pp_simulate(program: PPProgram, costs: PPCosts, *, cores: Optional[int] = None, device: Optional[str] = None,
                stop: Optional[Callable[[], bool]] = None) -> PPSimResult:
    """The predicted step of ``program`` on ``costs``: step time, bubble and peak memory per rank.

    Parameters
    ----------
    program : PPProgram
        E.g. :func:`~autosched.pp.program.pp_program`.
    costs : PPCosts
        One :class:`~autosched.pp.costs.StageCost` per stage of the program; for a program that is not one of
        PyTorch's, with :attr:`~autosched.pp.costs.PPCosts.custom_overhead_s` on every F, I, W and B
        (:meth:`~autosched.pp.costs.PPCosts.for_program`).
    cores : int, optional
        Cores the ranks share (ranks on one CPU machine, as under ``torchrun`` on one host): a compute
        action or a post's CPU time takes one while it runs, and a rank that finds none free waits for
        one, oldest first (the plan simulator's core pool, docs/semantics.md). ``None``: a core per rank.
    device : {"cpu", "cuda"}, optional
        ``"cuda"``: each rank has a compute and a communication stream (the module docstring says how
        they run). Default: ``"cuda"`` when the costs' link was measured over NCCL
        (``costs.p2p.backend == "nccl"``), else ``"cpu"``.
    stop : callable, optional
        Asked before the first event and every 256 events of the simulation: ``True`` stops it with
        :class:`SimCut` (a search's deadline passed).

    Raises
    ------
    PPError
        ``rule="missing_cost"`` when the costs do not cover the program's stages; ``rule="bad_value"``,
        ``field="device"`` for a device other than ``"cpu"`` or ``"cuda"``.
    PPScheduleError
        When the program breaks a rule of :func:`~autosched.pp.program.validate_program`
        (an action twice or missing, a dependency out of order, ranks that deadlock): the
        runtime would not run it through, so nothing is predicted.
    SimCut
        When ``stop()`` said to stop.

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
    from autosched.model._simcore import Simulator
    from autosched.model._simplan import task_sim_plan

    if costs.n_stages != program.n_stages:
        raise PPError("missing_cost", "costs.stages", costs.n_stages, program.schedule,
                      f"the program has {program.n_stages} stages: measure costs for that split")
    costs = costs.for_program(program)  # a custom order's path: its cost per action on top
    if device is None:
        device = "cuda" if costs.p2p.backend == "nccl" else "cpu"
    if device not in ("cpu", "cuda"):
        raise PPError("bad_value", "device", device, program.schedule, 'give "cpu" or "cuda"')
    cuda = device == "cuda"
    post_s = costs.p2p.post_s
    c = _compiled(program, post_s > 0, cuda)
    n = len(c.names)
    host, dev, core = [0.0] * n, [0.0] * n, [False] * n
    seconds = _seconds(c, costs)
    for k, kind in enumerate(c.what):
        if kind == _COMPUTE or kind == _LINK:
            if cuda:
                dev[k] = seconds[k]
            else:
                host[k], core[k] = seconds[k], kind == _COMPUTE and seconds[k] > 0
        elif kind == _POST_S:
            host[k], core[k] = post_s, True
    sim = Simulator(task_sim_plan(c.names, c.group_names, c.thread, c.stream_names, c.stream, host, dev, core,
                                  c.deps, cores=cores, cuda=cuda), iterations=1, stop=stop)
    try:
        sim.run()
    except SimDeadlock as stuck:  # only streams can: validate_program replayed the ranks' own waits
        raise _stream_deadlock(program, c, stuck) from None
    return _read(program, costs, c, sim.ops, cuda)


def _stream_deadlock(program: PPProgram, c: _Compiled, stuck: SimDeadlock) -> PPScheduleError:
    """The posted operation the first stuck rank holds (its thread, or its communication stream, waits for it)."""
    stuck_at = list(stuck.threads.items()) + list(stuck.streams.items())
    held = [(where[4:].split(".")[0], task) for where, (task, _) in stuck_at
            if where.startswith("rank") and task.startswith("done ")]
    rank, name = min(((int(r), task) for r, task in held), default=(None, ""))
    action = name[len("done "):]
    step = next((i for i, (kind, acts) in enumerate(program.steps[rank]) if kind == "post" and action in acts),
                None) if rank is not None else None
    return PPScheduleError("stream_deadlock", "program", action, program.schedule,
                           f"on CUDA {action} holds rank {rank}'s communication stream until its transfer lands, "
                           "and the operation its peer needs first is queued behind one that waits for it",
                           rank=rank, action=action, step=step,
                           fix=f"post {action} after the operations it waits for, or in one post step with them")


def _seconds(c: _Compiled, costs: PPCosts) -> List[float]:
    """Each compute task's and link's time on ``costs`` (0 for the rest)."""
    out = [0.0] * len(c.names)
    transfers = _Transfers(costs)
    for k, kind in enumerate(c.what):
        if kind == _COMPUTE:
            stage, what, _ = c.action[k][1]  # type: ignore[index]
            out[k] = 0.0 if what in ("UNSHARD", "RESHARD") else costs.stage(stage).action_s(what)
        elif kind == _LINK:
            out[k] = costs.p2p.seconds(transfers.nbytes(c.action[k]))  # type: ignore[arg-type]
    return out


def _read(program: PPProgram, costs: PPCosts, c: _Compiled, ops: object, cuda: bool) -> PPSimResult:
    """The step, busy time, timeline and memory read back from the simulator's record of each task."""
    # on CUDA what a rank computes and when a transfer runs are device times; on CPU, host times
    start = ops.dev_start if cuda else ops.host_start  # type: ignore[attr-defined]
    end = ops.dev_end if cuda else ops.host_end  # type: ignore[attr-defined]
    transfers = _Transfers(costs)
    timeline: List[TimelineEntry] = []
    ranks = []
    for k, kind in enumerate(c.what):
        if kind == _LINK:
            transfers.landed[c.action[k]] = end[k]  # type: ignore[index]
    for rank, key, send, clock in c.posts:
        transfers.post(key, send, rank, max((end[k] for k in clock), default=0.0))
    for rank, mine in enumerate(c.rank_tasks):
        r = _Rank(rank)
        for k in mine:
            if c.what[k] == _COMPUTE:
                r.t = start[k]
                _compute(r, *c.action[k], costs, timeline, program.n_stages)  # type: ignore[misc]
        r.t = max((max(ops.host_end[k], end[k]) for k in mine), default=0.0)  # type: ignore[attr-defined]
        ranks.append(r)
    for key, send_t in transfers.send_post.items():
        if key in transfers.landed:
            timeline.append(TimelineEntry(transfers.sender[key], f"{key[1]}SEND_{key[0]}{key[2]}", send_t,
                                          transfers.landed[key]))
    step = max((r.t for r in ranks), default=0.0)
    timeline.sort(key=lambda e: (e.start_s, e.rank))
    return PPSimResult(program.schedule, step, {r.rank: r.busy for r in ranks},
                       {r.rank: step - r.busy for r in ranks},
                       {r.rank: r.peak(transfers, program) for r in ranks},
                       {r.rank: r.t for r in ranks}, tuple(timeline), _events(timeline, cuda),
                       "cuda" if cuda else "cpu")


def _events(timeline: List[TimelineEntry], cuda: bool) -> Tuple[TimelineEvent, ...]:
    """The timeline as the plan simulator's events (:attr:`PPSimResult.events` says on which tracks)."""
    out = []
    for e in timeline:
        stage, kind, mb = parse_action(e.action)
        rank = f"rank{e.rank}"
        if kind.startswith("SEND"):
            out.append(TimelineEvent(f"{stage}{kind}", mb or 0, rank, f"{rank}.comm", e.start_s, e.end_s, "device"))
        elif cuda:
            out.append(TimelineEvent(f"{stage}{kind}", mb or 0, rank, f"{rank}.compute", e.start_s, e.end_s, "device"))
        else:
            out.append(TimelineEvent(f"{stage}{kind}", mb or 0, rank, "default", e.start_s, e.end_s))
    return tuple(out)
