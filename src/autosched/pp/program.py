"""A pipeline-parallel schedule as swpipe data: per-rank actions, read from PyTorch's own schedules.

An action is PyTorch's text form (``"2F0"``: stage 2, forward, micro-batch 0; ``I`` backward
for inputs, ``W`` backward for weights, ``B`` both; ``1SEND_F0``, ``1RECV_B3``; ``LOSS``
the loss the last stage computes after its forward). A :class:`PPProgram` holds

* ``compute``: each rank's compute order (what its runtime runs; the order a compute-only
  CSV holds), printed by :meth:`PPProgram.grid` as PyTorch prints a ``pipeline_order``;
* ``steps``: what each rank's runtime does, in order, as ``("post", actions)`` (sends and
  receives started), ``("wait", actions)`` (blocks until they completed) and
  ``("compute", (action,))``: what :func:`~autosched.pp.simulate.pp_simulate` reads;
* ``lowered``: for schedules run by ``_PipelineScheduleRuntime``, PyTorch's own order with
  the communication it adds (``pipeline_order_with_comms``);
* ``printed``: the ``pipeline_order`` PyTorch builds and prints for the schedule.

For the single-stage schedules (GPipe, 1F1B) ``printed`` is not what runs: their step
loop posts and waits its own sends and receives, and ``steps`` is read from that loop
(``autosched.pp._torch``).
"""

from __future__ import annotations

import csv
import functools
import io
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from autosched._fields import schedule_name
from autosched.pp import _torch

__all__ = ["PPError", "PPScheduleError", "PPProgram", "parse_action", "pp_program", "builtin_programs",
           "program_from_order", "read_csv", "default_stages_per_rank", "validate_program", "transfer_key",
           "builtin_program", "schedule_for", "DEFER_RECV", "transfer_order_mismatch"]

Step = Tuple[str, Tuple[str, ...]]

#: how a custom order (the search's, a CSV's) is lowered and run: ``_PipelineScheduleRuntime`` with each receive
#: posted just before the action that reads it (``defer_pp_recv``), where that keeps every pair of ranks' receives
#: in the order of the sends (:func:`transfer_order_mismatch`; PyTorch's default lowering otherwise). With gloo a send moves only once its receive
#: is posted, and then on the gloo threads of both ranks; PyTorch's default lowering posts every receive as early as
#: possible, so transfers run while both ranks compute and take their cores (benchmarks/pp_runtime_paths.py).
DEFER_RECV = True
_ACTION = re.compile(r"^(\d+)(F|I|B|W|LOSS|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD)(\d*)$")
_COMPUTE = ("F", "I", "W", "B")


@dataclass
class PPError(ValueError):
    """A pipeline-parallel schedule that cannot be built, read or run as asked.

    Attributes
    ----------
    rule : str
        What is wrong (``"unknown_schedule"``, ``"torch_rejects"``, ``"bad_action"``,
        ``"bad_order"``, ``"missing_cost"``, ``"memory_cap"``, ``"bad_value"``, ``"time_limit"``;
        a broken schedule's rules are :class:`PPScheduleError`'s).
    field : str
        The argument or field at fault.
    value : object
        The value given.
    schedule : str
        The schedule concerned ("" if none).
    detail : str
        How to fix it, or what PyTorch said.
    """

    rule: str
    field: str
    value: object = None
    schedule: str = ""
    detail: str = ""

    def __post_init__(self) -> None:
        where = f" ({self.schedule})" if self.schedule else ""
        super().__init__(f"{self.field}={self.value!r}{where}: {self.rule}: {self.detail}")


# cached: validate_program and the simulator read the same few thousand actions on every call of a search
@functools.lru_cache(maxsize=1 << 14)
def parse_action(text: str) -> Tuple[int, str, Optional[int]]:
    """``"2F0"`` -> ``(2, "F", 0)``; ``"0REDUCE_GRAD"`` -> ``(0, "REDUCE_GRAD", None)``.

    Examples
    --------
    >>> parse_action("3RECV_B1")
    (3, 'RECV_B', 1)
    """
    m = _ACTION.match(text.strip())
    if not m:
        raise PPError("bad_action", "action", text, detail="an action is [stage][F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B]"
                      "[micro-batch], e.g. 2F0")
    stage, kind, mb = m.groups()
    return int(stage), kind, (int(mb) if mb else None)


@dataclass
class PPScheduleError(PPError):
    """A schedule PyTorch's runtime would not run through: :func:`validate_program`'s one error.

    Attributes
    ----------
    rule : str
        The rule broken: ``"bad_action"`` (not a compute action of the program's stages and
        micro-batches), ``"wrong_rank"`` (a stage on a rank that does not hold it),
        ``"duplicate_action"`` (an action twice, or a micro-batch's B beside its I or W),
        ``"missing_action"``, ``"dependency"`` (an action before what it needs, on its own
        rank), ``"deadlock"`` (ranks that wait for each other), ``"steps_differ"`` (the
        runtime's steps do not run the compute order), ``"duplicate_transfer"``,
        ``"unmatched_transfer"`` (a send or receive no peer matches), ``"transfer_order"`` (a rank posts its
        receives from a peer in another order than the peer posts the sends: gloo and NCCL match them in
        posting order, so a tensor would land in another's buffer); from
        :func:`~autosched.pp.simulate.pp_simulate` on CUDA, ``"stream_deadlock"`` (posted
        operations that hold the ranks' communication streams while each waits for one queued
        behind another).
    rank : int or None
        The rank at fault.
    action : str
        The action at fault (``"0F1"``).
    step : int or None
        Its position in the rank's compute order (``compute[rank]``; for the transfer rules,
        in ``steps[rank]``); None for an action that is missing.
    fix : str
        What to change.
    """

    rank: Optional[int] = None
    action: str = ""
    step: Optional[int] = None
    fix: str = ""

    def __post_init__(self) -> None:
        where = f"{self.schedule}: " if self.schedule else ""
        at = f"step {self.step}" if self.step is not None else "nowhere"
        ValueError.__init__(self, f"{where}rank {self.rank}, {self.action} at {at}: {self.rule}: {self.detail}; "
                                  f"fix: {self.fix}")


@functools.lru_cache(maxsize=1 << 14)
def transfer_key(action: str) -> Tuple[str, int, int]:
    """A send and the receive it matches share a key: (direction, sending stage, micro-batch).

    Examples
    --------
    >>> transfer_key("0SEND_F3") == transfer_key("1RECV_F3")
    True
    """
    stage, kind, mb = parse_action(action)
    if mb is None or kind not in ("SEND_F", "SEND_B", "RECV_F", "RECV_B"):
        raise PPError("bad_action", "action", action, detail="a transfer is [stage][SEND_F|RECV_F|SEND_B|RECV_B]"
                      "[micro-batch], e.g. 0SEND_F0")
    if kind == "SEND_F":
        return ("F", stage, mb)
    if kind == "SEND_B":
        return ("B", stage, mb)
    if kind == "RECV_F":
        return ("F", stage - 1, mb)
    return ("B", stage + 1, mb)


Key = Tuple[int, str, int]  # (stage, kind, micro-batch) of a compute action


def validate_program(program: "PPProgram") -> "PPProgram":
    """``program`` if PyTorch's runtime runs it through; else the first rule it breaks.

    The rules every schedule keeps, whoever made it (PyTorch, the search, a CSV file, a hand):

    * every rank's compute order holds compute actions (F, I, W, B) of the stages it holds,
      for micro-batches ``0 .. n_microbatches - 1``;
    * every action exactly once: each micro-batch's F on every stage, and its backward, B
      or I and W;
    * every dependency respected: F after the previous stage's F, a backward after the
      stage's F and the next stage's backward, W after I; on one rank in that order, across
      ranks with no cycle of waits (a deadlock);
    * the runtime's ``steps`` run that compute order, post every send and receive once,
      matched by a peer, wait each input before the action that reads it, and reach their
      end (no rank waits for a transfer no rank posts).

    :func:`read_csv` and :func:`program_from_order` call it on what they build,
    :meth:`PPProgram.csv_text` (and so :meth:`PPProgram.to_csv`) before writing, and
    :func:`~autosched.pp.simulate.pp_simulate` before predicting.

    Parameters
    ----------
    program : PPProgram

    Returns
    -------
    PPProgram
        ``program`` itself.

    Raises
    ------
    PPScheduleError
        The first rule broken: ``.rule``, ``.rank``, ``.action``, ``.step`` and ``.fix``.

    Examples
    --------
    >>> p = pp_program("1F1B", n_ranks=2, n_microbatches=2)
    >>> validate_program(p) is p
    True
    >>> twice = {0: ("0F0", "0F1", "0F1", "0B0", "0B1"), 1: p.compute[1]}
    >>> try:
    ...     validate_program(PPProgram("custom", 2, 2, 2, (0, 1), twice, p.steps))
    ... except PPScheduleError as e:
    ...     print(e.rule, e.rank, e.action, e.step)
    duplicate_action 0 0F1 2
    """
    seen = _check_actions(program)
    _check_dependencies(program, seen)
    _check_steps(program)
    return program


def _fail(program: "PPProgram", rule: str, rank: Optional[int], action: str, step: Optional[int], detail: str,
          fix: str) -> PPScheduleError:
    return PPScheduleError(rule, "program", action, program.schedule, detail, rank=rank, action=action, step=step,
                           fix=fix)


def _check_actions(program: "PPProgram") -> Dict[Key, Tuple[int, int]]:
    """Each action once, on its stage's rank; each micro-batch's F and backward there. Where each one is."""
    n_stages, n_mb, where = program.n_stages, program.n_microbatches, program.stage_to_rank
    seen: Dict[Key, Tuple[int, int]] = {}
    for r in range(program.n_ranks):
        for i, a in enumerate(program.compute.get(r, ())):
            try:
                s, kind, mb = parse_action(str(a))
            except PPError:
                s, kind, mb = 0, "", None
            if kind not in _COMPUTE or mb is None or not 0 <= s < n_stages or not 0 <= mb < n_mb:
                raise _fail(program, "bad_action", r, str(a), i, "not a compute action of this program",
                            f"write [stage 0..{n_stages - 1}][F|I|W|B][micro-batch 0..{n_mb - 1}], e.g. 0F0")
            if where[s] != r:
                raise _fail(program, "wrong_rank", r, a, i, f"stage {s} is on rank {where[s]}",
                            f"move {a} to rank {where[s]}'s order")
            if (s, kind, mb) in seen:
                r0, i0 = seen[s, kind, mb]
                raise _fail(program, "duplicate_action", r, a, i, f"{a} already runs at rank {r0} step {i0}",
                            f"remove one {a}")
            seen[s, kind, mb] = (r, i)
    for s in range(n_stages):
        for mb in range(n_mb):
            if (s, "F", mb) not in seen:
                raise _fail(program, "missing_action", where[s], f"{s}F{mb}", None, "no rank runs it",
                            f"add {s}F{mb} to rank {where[s]}'s order")
            has = {k for k in ("B", "I", "W") if (s, k, mb) in seen}
            if "B" in has and has & {"I", "W"}:
                other = min(has - {"B"})
                r0, i0 = seen[s, other, mb]
                raise _fail(program, "duplicate_action", r0, f"{s}{other}{mb}", i0,
                            f"{s}B{mb} already runs the whole backward", f"keep {s}B{mb} or {s}I{mb} and {s}W{mb}")
            if not has:
                raise _fail(program, "missing_action", where[s], f"{s}B{mb}", None, "no backward of it runs",
                            f"add {s}B{mb} (or {s}I{mb} then {s}W{mb}) to rank {where[s]}'s order")
            if has in ({"I"}, {"W"}):
                lacking = "W" if has == {"I"} else "I"
                raise _fail(program, "missing_action", where[s], f"{s}{lacking}{mb}", None,
                            f"{s}{min(has)}{mb} runs without it", f"add {s}{lacking}{mb} to rank {where[s]}'s order")
    return seen


def _needs(key: Key, seen: Mapping[Key, Tuple[int, int]], n_stages: int) -> List[Key]:
    """What a compute action needs done before it (the data it reads)."""
    s, kind, mb = key
    if kind == "F":
        return [(s - 1, "F", mb)] if s > 0 else []
    if kind == "W":
        return [(s, "I", mb)]
    later = [(s + 1, "B" if (s + 1, "B", mb) in seen else "I", mb)] if s + 1 < n_stages else []
    return [(s, "F", mb)] + later


def _key(action: str) -> Key:
    """A compute action's key (only for an action :func:`_check_actions` accepted: it has a micro-batch)."""
    s, kind, mb = parse_action(action)
    return s, kind, -1 if mb is None else mb


def _text(key: Key) -> str:
    return f"{key[0]}{key[1]}{key[2]}"


def _check_dependencies(program: "PPProgram", seen: Mapping[Key, Tuple[int, int]]) -> None:
    """Each action after what it needs: on its own rank in order; across ranks with no cycle of waits."""
    orders = {r: [_key(a) for a in program.compute.get(r, ())] for r in range(program.n_ranks)}
    for r, acts in orders.items():
        for i, key in enumerate(acts):
            for need in _needs(key, seen, program.n_stages):
                r0, i0 = seen[need]
                if r0 == r and i0 > i:
                    raise _fail(program, "dependency", r, _text(key), i,
                                f"it needs {_text(need)}, which runs later (step {i0})",
                                f"move {_text(key)} after {_text(need)}")
    done: set = set()
    pos = {r: 0 for r in orders}
    moved = True
    while moved:
        moved = False
        for r, acts in orders.items():
            while pos[r] < len(acts) and all(n in done for n in _needs(acts[pos[r]], seen, program.n_stages)):
                done.add(acts[pos[r]])
                pos[r] += 1
                moved = True
    blocked = {r: acts[pos[r]] for r, acts in orders.items() if pos[r] < len(acts)}
    if blocked:
        r = min(blocked)
        key = blocked[r]
        need = next(n for n in _needs(key, seen, program.n_stages) if n not in done)
        chain = ", ".join(f"rank {b} waits at {_text(k)}" for b, k in sorted(blocked.items()))
        raise _fail(program, "deadlock", r, _text(key), pos[r],
                    f"it needs {_text(need)} from rank {seen[need][0]}, which never gets there ({chain})",
                    f"order rank {seen[need][0]} so that {_text(need)} runs before what waits for {_text(key)}")


def _check_steps(program: "PPProgram") -> None:
    """The runtime's steps: the compute order, every transfer posted once and matched, inputs waited, an end."""
    for r in range(program.n_ranks):
        ran = [a for kind, acts in program.steps.get(r, ()) if kind == "compute" for a in acts
               if parse_action(a)[1] in _COMPUTE]
        order = list(program.compute.get(r, ()))
        if ran != order:
            i = next((j for j, (x, y) in enumerate(zip(ran, order)) if x != y), min(len(ran), len(order)))
            got = ran[i] if i < len(ran) else "the end"
            want = order[i] if i < len(order) else "the end"
            raise _fail(program, "steps_differ", r, want, i, f"the runtime's steps run {got} there",
                        "rebuild the program (program_from_order) so that its steps come from its compute order")
    posted: Dict[Tuple[str, Tuple[str, int, int]], Tuple[int, int, str]] = {}
    waited: Dict[int, set] = {r: set() for r in range(program.n_ranks)}
    steps = {r: tuple(program.steps.get(r, ())) for r in range(program.n_ranks)}
    pos = {r: 0 for r in steps}

    def both(key: Tuple[str, int, int]) -> bool:
        return ("SEND", key) in posted and ("RECV", key) in posted

    moved = True
    while moved:
        moved = False
        for r, mine in steps.items():
            while pos[r] < len(mine):
                kind, acts = mine[pos[r]]
                if kind == "wait" and not all(both(transfer_key(a)) for a in acts):
                    break
                for a in acts:
                    if kind == "post":
                        side = ("SEND" if "SEND" in a else "RECV", transfer_key(a))
                        if side in posted:
                            raise _fail(program, "duplicate_transfer", r, a, pos[r],
                                        f"posted before, by rank {posted[side][0]} at step {posted[side][1]}",
                                        f"post {a} once")
                        posted[side] = (r, pos[r], a)
                    elif kind == "wait":
                        waited[r].add(transfer_key(a))
                    else:
                        _check_input_waited(program, r, a, pos[r], waited[r])
                pos[r] += 1
                moved = True
    blocked = {r: mine[pos[r]] for r, mine in steps.items() if pos[r] < len(mine)}
    if blocked:
        r = min(blocked)
        a = next(a for a in blocked[r][1] if not both(transfer_key(a)))
        chain = ", ".join(f"rank {b} at step {pos[b]} ({';'.join(st[1])})" for b, st in sorted(blocked.items()))
        raise _fail(program, "deadlock", r, a, pos[r], f"no rank posts its peer ({chain} wait)",
                    f"post the matching {'receive' if 'SEND' in a else 'send'} on the peer rank before it waits")
    for (side, key), (r, i, a) in sorted(posted.items(), key=lambda kv: kv[1]):
        other = "RECV" if side == "SEND" else "SEND"
        if (other, key) not in posted:
            raise _fail(program, "unmatched_transfer", r, a, i, f"no rank posts the {other.lower()} it pairs with",
                        f"post the {other.lower()} on the peer rank, or drop this one")
    mismatch = transfer_order_mismatch(program.steps, program.stage_to_rank)
    if mismatch is not None:
        r, a, i, detail = mismatch
        raise _fail(program, "transfer_order", r, a, i, detail,
                    "post the receives from each peer in the order that peer posts its sends (PyTorch's default "
                    "lowering does: program_from_order(..., defer_recv=False))")


def _peer(action: str, stage_to_rank: Sequence[int]) -> int:
    """The rank at the other end of a send or receive."""
    kind, sender, _ = transfer_key(action)
    if "SEND" in action:
        stage = parse_action(action)[0]
        return stage_to_rank[stage + 1 if kind == "F" else stage - 1]
    return stage_to_rank[sender]


def transfer_order_mismatch(steps: Mapping[int, Sequence[Step]], stage_to_rank: Sequence[int]
                            ) -> Optional[Tuple[int, str, int, str]]:
    """The first receive posted out of its peer's send order, as ``(rank, action, step, detail)``; None if none.

    gloo (and NCCL) match a rank's point-to-point operations with one peer in the order both post them: the k-th
    receive a rank posts from a peer gets the k-th send that peer posts to it.
    """
    sent: Dict[Tuple[int, int], List[Tuple[str, int, int]]] = {}
    received: Dict[Tuple[int, int], List[Tuple[int, str, int]]] = {}
    for r in sorted(steps):
        for i, (kind, acts) in enumerate(steps[r]):
            if kind != "post":
                continue
            for a in acts:
                peer = _peer(a, stage_to_rank)
                if peer == r:
                    continue
                if "SEND" in a:
                    sent.setdefault((r, peer), []).append(transfer_key(a))
                else:
                    received.setdefault((peer, r), []).append((i, a, r))
    for (src, dst), recvs in sorted(received.items()):
        sends = sent.get((src, dst), [])
        for k, (i, a, r) in enumerate(recvs):
            if k < len(sends) and sends[k] != transfer_key(a):
                want = sends[k]
                return r, a, i, (f"it is receive {k} from rank {src}, whose send {k} to it carries "
                                 f"{want[0]} of stage {want[1]}, micro-batch {want[2]}")
    return None


def _check_input_waited(program: "PPProgram", rank: int, action: str, step: int, waited: set) -> None:
    """A compute action reads its input from another rank only after waiting for it."""
    s, kind, mb = parse_action(action)
    where = program.stage_to_rank
    if kind == "F" and s > 0 and where[s - 1] != rank:
        key, recv = ("F", s - 1, mb), f"{s}RECV_F{mb}"
    elif kind in ("B", "I") and s + 1 < program.n_stages and where[s + 1] != rank:
        key, recv = ("B", s + 1, mb), f"{s}RECV_B{mb}"
    else:
        return
    if key not in waited:
        raise _fail(program, "dependency", rank, action, step, f"it runs before its input arrives ({recv})",
                    f"post and wait {recv} before {action}")


@dataclass(frozen=True)
class PPProgram:
    """One pipeline-parallel schedule, every rank's actions. See the module docstring."""

    schedule: str
    n_ranks: int
    n_stages: int
    n_microbatches: int
    stage_to_rank: Tuple[int, ...]
    compute: Mapping[int, Tuple[str, ...]]
    steps: Mapping[int, Tuple[Step, ...]]
    lowered: Optional[Mapping[int, Tuple[str, ...]]] = None
    printed: Optional[Mapping[int, Tuple[Optional[str], ...]]] = None
    source: str = field(default="pytorch", compare=False)
    send_retention: str = "step"
    """How long the runtime holds a sent tensor: ``"step"`` (to the end of the step:
    ``_PipelineScheduleRuntime`` keeps every send's work in a list it waits at the end),
    ``"traced"`` (after the computation :attr:`send_release` names: GPipe's and 1F1B's own
    step loops, traced), ``"next"`` (until the next send the same way) or ``"transfer"``
    (until the transfer ends)."""
    send_release: Optional[Mapping[int, Mapping[str, Optional[str]]]] = field(default=None, compare=False)
    """With ``send_retention="traced"``: ``{rank: {send: the compute action after which the runtime
    lets go of it, or None for the step's end}}`` (:func:`autosched.pp._torch.send_releases`); a
    send not named is held to the step's end."""

    @property
    def stages_per_rank(self) -> int:
        return self.n_stages // self.n_ranks

    def rank_stages(self, rank: int) -> Tuple[int, ...]:
        """The stages rank ``rank`` holds."""
        return tuple(s for s, r in enumerate(self.stage_to_rank) if r == rank)

    def grid(self, comms: bool = False) -> str:
        """The step x rank grid, printed by PyTorch's ``_format_pipeline_order``.

        ``comms=False``: the compute order each rank runs. ``comms=True``: with the
        communication: PyTorch's lowered order where its runtime runs one, else the
        posts and waits of the schedule's own step loop (``WAIT(...)``).
        """
        if not comms:
            return _torch.format_grid({r: list(self.compute[r]) for r in self.compute})
        if self.lowered is not None:
            return _torch.format_grid({r: list(self.lowered[r]) for r in self.lowered})
        shown = {r: [";".join(acts) if kind != "wait" else f"WAIT({';'.join(acts)})" for kind, acts in self.steps[r]]
                 for r in self.steps}
        return _torch.format_grid(shown)

    def csv_text(self) -> str:
        """The compute-only CSV ``_PipelineScheduleRuntime._load_csv`` reads: one row per rank.

        Raises
        ------
        PPScheduleError
            When the program breaks a rule of :func:`validate_program`: nothing is written
            that the runtime would not run through.
        """
        validate_program(self)
        buf = io.StringIO()
        writer = csv.writer(buf)
        for r in range(self.n_ranks):
            writer.writerow(self.compute[r])
        return buf.getvalue()

    def to_csv(self, path: str) -> str:
        """Write :meth:`csv_text` to ``path`` (checked first: :func:`validate_program`); returns the path."""
        text = self.csv_text()
        with open(path, "w", newline="") as f:
            f.write(text)
        return path

    def torch_schedule(self, stages: Sequence[Any], loss_fn: Callable[..., Any]) -> Any:
        """:func:`schedule_for` of this program: the ``torch.distributed.pipelining`` schedule running it."""
        return schedule_for(self, stages, loss_fn)


def schedule_for(program: PPProgram, stages: Sequence[Any], loss_fn: Callable[..., Any],
                 n_microbatches: Optional[int] = None) -> Any:
    """The ``torch.distributed.pipelining`` schedule object that runs ``program`` over one rank's stages.

    * one of PyTorch's schedules (``program.source == "pytorch"``, e.g. :func:`pp_program`): PyTorch's own class
      (``Schedule1F1B``, ``ScheduleInterleaved1F1B``, ...), which runs its own loop;
    * any other order (the search's, a CSV's, :func:`program_from_order`'s): a ``_PipelineScheduleRuntime`` that
      runs ``program.lowered`` as it stands, every send and receive where the program puts it (with
      :data:`DEFER_RECV`, each receive just before the action that reads it where the pair's order allows: the
      fastest of PyTorch's paths for a custom order, ``benchmarks/pp_runtime_paths.py``); what runs is what
      :func:`~autosched.pp.simulate.pp_simulate` predicted.

    Either way the transfers are ``torch.distributed``'s and the loop PyTorch's.

    Parameters
    ----------
    program : PPProgram
    stages : sequence of torch.distributed.pipelining.PipelineStage
        This rank's stages (``program.rank_stages(rank)`` says which), in stage order.
    loss_fn : callable
        ``loss_fn(output, target)``, per micro-batch.
    n_microbatches : int, optional
        Checked against ``program.n_microbatches`` when given.

    Returns
    -------
    torch.distributed.pipelining.schedules._PipelineSchedule
        Call ``.step(batch, target=target)`` on every rank.

    Raises
    ------
    PPError
        ``field="n_microbatches"`` when it differs from the program's; ``field="stages"`` when they are not the
        stages this rank holds under the program (``rule="bad_value"``).

    Examples
    --------
    On each rank of a job (a process group set up), with that rank's ``PipelineStage`` objects:

    >>> schedule = schedule_for(program, my_stages, torch.nn.functional.mse_loss)  # doctest: +SKIP
    >>> schedule.step(batch, target=target)                                         # doctest: +SKIP
    """
    stages = list(stages)
    if n_microbatches is not None and n_microbatches != program.n_microbatches:
        raise PPError("bad_value", "n_microbatches", n_microbatches, program.schedule,
                      f"the program runs {program.n_microbatches} micro-batches: build it for {n_microbatches}")
    if stages and all(hasattr(s, "stage_index") and hasattr(s, "group_rank") for s in stages):
        rank = stages[0].group_rank
        held = tuple(s.stage_index for s in stages)
        if held != program.rank_stages(rank):
            raise PPError("bad_value", "stages", held, program.schedule,
                          f"rank {rank} holds stages {program.rank_stages(rank)} under this program: give their "
                          "PipelineStage objects, in stage order")
    if program.source == "pytorch":
        single = _torch.schedule_is_single(program.schedule)
        return _torch.schedule_class(program.schedule)(stages[0] if single else stages, program.n_microbatches,
                                                       loss_fn=loss_fn)
    if program.lowered is None:
        raise PPError("bad_order", "program", program.schedule, program.schedule,
                      "a custom program carries PyTorch's lowering of its order: build it with program_from_order "
                      "or read_csv")
    return _torch.runtime_from_lowered(stages, program.n_microbatches, loss_fn, program.compute, program.lowered)


def default_stages_per_rank(schedule: str) -> int:
    """1 for the single-stage schedules (GPipe, 1F1B), 2 for the others."""
    return 1 if _torch.schedule_is_single(schedule) else 2


def _check_positive(name: str, value: int, least: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise PPError("bad_value", name, value, detail=f"an integer >= {least}")


def pp_program(schedule: str, n_ranks: int, n_microbatches: int, stages_per_rank: Optional[int] = None) -> PPProgram:
    """PyTorch's schedule ``schedule`` on ``n_ranks`` ranks as a :class:`PPProgram`.

    Parameters
    ----------
    schedule : str
        A name ``torch.distributed.pipelining.schedules.get_schedule_class`` knows
        (``"GPipe"``, ``"1F1B"``, ``"Interleaved1F1B"``, ``"LoopedBFS"``,
        ``"InterleavedZeroBubble"``, ``"ZBVZeroBubble"``, ``"DualPipeV"``).
    n_ranks, n_microbatches : int
    stages_per_rank : int, optional
        1 for GPipe and 1F1B; default 2 for the others (ZBV and DualPipeV need 2).

    Raises
    ------
    PPError
        ``rule="unknown_schedule"`` for a name PyTorch does not know;
        ``rule="torch_rejects"`` when PyTorch's schedule refuses the sizes (``detail`` says why).
    PPTorchError
        When this torch lacks a helper swpipe reads.

    Examples
    --------
    >>> p = pp_program("1F1B", n_ranks=2, n_microbatches=4)
    >>> p.compute[1]
    ('1F0', '1B0', '1F1', '1B1', '1F2', '1B2', '1F3', '1B3')
    """
    _check_positive("n_ranks", n_ranks)
    _check_positive("n_microbatches", n_microbatches)
    known = _torch.available_schedules()
    canonical = schedule_name(schedule, known)
    if canonical is None:
        raise PPError("unknown_schedule", "schedule", schedule, detail=f"one of {', '.join(known)}")
    single = _torch.schedule_is_single(canonical)
    per_rank = stages_per_rank if stages_per_rank is not None else (1 if single else 2)
    _check_positive("stages_per_rank", per_rank)
    if single and per_rank != 1:
        raise PPError("torch_rejects", "stages_per_rank", per_rank, canonical, "a single-stage schedule runs one stage per rank")
    if not single and per_rank < 2:
        raise PPError("torch_rejects", "stages_per_rank", per_rank, canonical, "a multi-stage schedule needs >= 2 per rank")
    try:
        printed = _torch.compute_order(canonical, n_ranks, n_microbatches, per_rank)
        steps = _torch.runtime_order(canonical, n_ranks, n_microbatches, per_rank)
        lowered = None if single else _torch._multi_runtime_order(canonical, n_ranks, n_microbatches, per_rank)
    except (ValueError, AssertionError) as exc:
        raise PPError("torch_rejects", "n_microbatches", n_microbatches, canonical, str(exc).splitlines()[0]) from exc
    n_stages = n_ranks * per_rank
    compute = {r: tuple(a for kind, acts in steps[r] if kind == "compute" for a in acts
                        if parse_action(a)[1] in _COMPUTE) for r in steps}
    return PPProgram(canonical, n_ranks, n_stages, n_microbatches, _torch.stage_to_rank_map(canonical, n_ranks, n_stages),
                     compute, {r: tuple(v) for r, v in steps.items()},
                     None if lowered is None else {r: tuple(v) for r, v in lowered.items()},
                     {r: tuple(v) for r, v in printed.items()}, send_retention=_torch.send_retention(canonical),
                     send_release=_torch.send_releases(canonical, n_ranks, n_microbatches))


def builtin_programs(n_ranks: int, n_microbatches: int, stages_per_rank: Optional[int] = None
                     ) -> Tuple[Dict[str, PPProgram], Dict[str, str]]:
    """Every PyTorch schedule this torch has, for these sizes, and why the others were refused.

    ``stages_per_rank`` None: each schedule's default (1 or 2); an integer keeps the
    schedules that run that many stages per rank.

    Returns
    -------
    (programs, refused) : dict, dict
        ``{name: PPProgram}`` and ``{name: PyTorch's reason}``.
    """
    programs: Dict[str, PPProgram] = {}
    refused: Dict[str, str] = {}
    for name in _torch.available_schedules():
        program, why = builtin_program(name, n_ranks, n_microbatches, stages_per_rank)
        if program is None:
            refused[name] = why
        else:
            programs[name] = program
    return programs, refused


def builtin_program(name: str, n_ranks: int, n_microbatches: int, stages_per_rank: Optional[int] = None
                    ) -> Tuple[Optional[PPProgram], str]:
    """One of :func:`builtin_programs`: ``(program, "")``, or ``(None, PyTorch's reason)``."""
    per_rank = default_stages_per_rank(name) if stages_per_rank is None else stages_per_rank
    try:
        return pp_program(name, n_ranks, n_microbatches, per_rank), ""
    except PPError as exc:
        return None, exc.detail


def program_from_order(order: Mapping[int, Sequence[Optional[str]]], n_microbatches: int,
                       stage_to_rank: Sequence[int], schedule: str = "custom", source: str = "swpipe",
                       defer_recv: bool = DEFER_RECV) -> PPProgram:
    """A compute-only order per rank as ``_PipelineScheduleRuntime`` runs it (PyTorch's comms lowering).

    ``defer_recv`` (default :data:`DEFER_RECV`): the lowering with the runtime's ``defer_pp_recv``, every receive
    posted just before the action that reads it (what :func:`schedule_for` runs), unless that posts a rank's
    receives from a peer out of the peer's send order (:func:`transfer_order_mismatch`: PyTorch's deferral can,
    where one pair of ranks carries forwards and backwards both); then, and with False, PyTorch's default
    lowering, every receive as early as its sender allows (what ``_load_csv`` and PyTorch's multi-stage classes run).

    Raises
    ------
    PPError
        ``rule="bad_order"`` when PyTorch's validator or lowering refuses the order.
    PPScheduleError
        When the order breaks a rule of :func:`validate_program` PyTorch does not check (an
        action twice, ...).
    """
    n_ranks = len(order)
    clean = {r: tuple(a for a in order[r] if a) for r in range(n_ranks)}
    for acts in clean.values():
        for a in acts:
            if parse_action(a)[1] not in _COMPUTE:
                raise PPError("bad_order", "order", a, schedule, "a compute-only order holds F, I, W and B only")
    try:
        lowered = _torch.lower_compute_order(clean, n_microbatches, stage_to_rank, defer_recv)
        steps = _torch.read_lowered(lowered, len(stage_to_rank), stage_to_rank)
        if defer_recv and transfer_order_mismatch(steps, stage_to_rank) is not None:
            # deferred receives out of a peer's send order: PyTorch's default lowering keeps it
            lowered = _torch.lower_compute_order(clean, n_microbatches, stage_to_rank, False)
            steps = _torch.read_lowered(lowered, len(stage_to_rank), stage_to_rank)
    except (ValueError, AssertionError) as exc:
        raise PPError("bad_order", "order", None, schedule, str(exc).splitlines()[0]) from exc
    return validate_program(PPProgram(schedule, n_ranks, len(stage_to_rank), n_microbatches, tuple(stage_to_rank),
                                      clean, {r: tuple(v) for r, v in steps.items()},
                                      {r: tuple(v) for r, v in lowered.items()}, {r: tuple(v) for r, v in clean.items()},
                                      source=source))


def read_csv(path: str, n_ranks: int, n_stages: int, n_microbatches: int, schedule: str = "custom",
             defer_recv: bool = DEFER_RECV) -> PPProgram:
    """A compute-only CSV (one row per rank) read by PyTorch's own loader, ``_PipelineScheduleRuntime._load_csv``.

    ``defer_recv``: lowered as :func:`program_from_order` says.

    What PyTorch reads, validates (inferring which rank holds each stage) and lowers is
    what the program holds, and :func:`validate_program` checks it, so a CSV this returns a
    program for is one the runtime runs through.

    Raises
    ------
    PPError
        ``rule="bad_order"`` when PyTorch's loader refuses the file (``detail`` says why).
    PPScheduleError
        When the file breaks a rule PyTorch's loader does not check (an action twice, ...).
    """
    for name, value in (("n_ranks", n_ranks), ("n_stages", n_stages), ("n_microbatches", n_microbatches)):
        _check_positive(name, value)
    try:
        compute, lowered, stage_to_rank = _torch.load_compute_csv(path, n_ranks, n_stages, n_microbatches, defer_recv)
        steps = _torch.read_lowered(lowered, n_stages, stage_to_rank)
        if defer_recv and transfer_order_mismatch(steps, stage_to_rank) is not None:  # as program_from_order
            compute, lowered, stage_to_rank = _torch.load_compute_csv(path, n_ranks, n_stages, n_microbatches, False)
            steps = _torch.read_lowered(lowered, n_stages, stage_to_rank)
    except (ValueError, AssertionError, RuntimeError, KeyError) as exc:
        raise PPError("bad_order", "path", path, schedule, str(exc).splitlines()[0]) from exc
    return validate_program(PPProgram(schedule, n_ranks, n_stages, n_microbatches, stage_to_rank,
                                      {r: tuple(v) for r, v in compute.items()}, {r: tuple(v) for r, v in steps.items()},
                                      {r: tuple(v) for r, v in lowered.items()},
                                      {r: tuple(v) for r, v in compute.items()}, source="csv"))
