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
import io
import re
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from autosched.pp import _torch

__all__ = ["PPError", "PPProgram", "parse_action", "pp_program", "builtin_programs", "program_from_order",
           "read_csv", "default_stages_per_rank"]

Step = Tuple[str, Tuple[str, ...]]
_ACTION = re.compile(r"^(\d+)(F|I|B|W|LOSS|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD)(\d*)$")
_COMPUTE = ("F", "I", "W", "B")


@dataclass
class PPError(ValueError):
    """A pipeline-parallel schedule that cannot be built, read or run as asked.

    Attributes
    ----------
    rule : str
        What is wrong (``"unknown_schedule"``, ``"torch_rejects"``, ``"bad_action"``,
        ``"bad_order"``, ``"deadlock"``, ``"missing_cost"``, ``"memory_cap"``, ``"bad_value"``).
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
    ``_PipelineScheduleRuntime`` and GPipe keep every send's work in a list they wait at the
    end), ``"next"`` (until the next send the same way: 1F1B keeps only the last one) or
    ``"transfer"`` (until the transfer ends)."""

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
        """The compute-only CSV ``_PipelineScheduleRuntime._load_csv`` reads: one row per rank."""
        buf = io.StringIO()
        writer = csv.writer(buf)
        for r in range(self.n_ranks):
            writer.writerow(self.compute[r])
        return buf.getvalue()

    def to_csv(self, path: str) -> str:
        """Write :meth:`csv_text` to ``path``; returns the path."""
        with open(path, "w", newline="") as f:
            f.write(self.csv_text())
        return path


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
    canonical = {k.lower(): k for k in known}.get(str(schedule).lower())
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
                     {r: tuple(v) for r, v in printed.items()}, send_retention=_torch.send_retention(canonical))


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
        per_rank = default_stages_per_rank(name) if stages_per_rank is None else stages_per_rank
        try:
            programs[name] = pp_program(name, n_ranks, n_microbatches, per_rank)
        except PPError as exc:
            refused[name] = exc.detail
    return programs, refused


def program_from_order(order: Mapping[int, Sequence[Optional[str]]], n_microbatches: int,
                       stage_to_rank: Sequence[int], schedule: str = "custom", source: str = "swpipe") -> PPProgram:
    """A compute-only order per rank as ``_PipelineScheduleRuntime`` runs it (PyTorch's comms lowering).

    Raises
    ------
    PPError
        ``rule="bad_order"`` when PyTorch's validator or lowering refuses the order.
    """
    n_ranks = len(order)
    clean = {r: tuple(a for a in order[r] if a) for r in range(n_ranks)}
    for acts in clean.values():
        for a in acts:
            if parse_action(a)[1] not in _COMPUTE:
                raise PPError("bad_order", "order", a, schedule, "a compute-only order holds F, I, W and B only")
    try:
        lowered = _torch.lower_compute_order(clean, n_microbatches, stage_to_rank)
    except (ValueError, AssertionError) as exc:
        raise PPError("bad_order", "order", None, schedule, str(exc).splitlines()[0]) from exc
    steps = _torch.read_lowered(lowered, len(stage_to_rank), stage_to_rank)
    return PPProgram(schedule, n_ranks, len(stage_to_rank), n_microbatches, tuple(stage_to_rank), clean,
                     {r: tuple(v) for r, v in steps.items()}, {r: tuple(v) for r, v in lowered.items()},
                     {r: tuple(v) for r, v in clean.items()}, source=source)


def read_csv(path: str, n_ranks: int, n_stages: int, n_microbatches: int, schedule: str = "custom") -> PPProgram:
    """A compute-only CSV (one row per rank) read by PyTorch's own loader, ``_PipelineScheduleRuntime._load_csv``.

    What PyTorch reads, validates (inferring which rank holds each stage) and lowers is
    what the program holds, so a CSV this returns a program for is one the runtime runs.

    Raises
    ------
    PPError
        ``rule="bad_order"`` when PyTorch's loader refuses the file (``detail`` says why).
    """
    for name, value in (("n_ranks", n_ranks), ("n_stages", n_stages), ("n_microbatches", n_microbatches)):
        _check_positive(name, value)
    try:
        compute, lowered, stage_to_rank = _torch.load_compute_csv(path, n_ranks, n_stages, n_microbatches)
    except (ValueError, AssertionError, RuntimeError, KeyError) as exc:
        raise PPError("bad_order", "path", path, schedule, str(exc).splitlines()[0]) from exc
    steps = _torch.read_lowered(lowered, n_stages, stage_to_rank)
    return PPProgram(schedule, n_ranks, n_stages, n_microbatches, stage_to_rank,
                     {r: tuple(v) for r, v in compute.items()}, {r: tuple(v) for r, v in steps.items()},
                     {r: tuple(v) for r, v in lowered.items()}, {r: tuple(v) for r, v in compute.items()},
                     source="csv")
