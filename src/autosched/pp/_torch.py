"""The ``torch.distributed.pipelining`` internals swpipe reads, in one place, behind a version check.

PyTorch's pipeline schedules are data (``_Action`` orders per rank) that its runtime, its
validator and its dry run read, but the helpers that build and lower them are private.
Everything swpipe needs from them is here; no other module of swpipe names a private
pipelining helper. :func:`check_torch` says what is missing, with the torch version, as
:class:`PPTorchError` fields.

What is read, and why:

* ``get_schedule_class`` and each schedule class's own ``pipeline_order`` (built from
  stand-in stages, as PyTorch's schedule visualiser does): the compute order per rank;
* ``_PipelineScheduleRuntime._prepare_schedule_with_comms`` (its comms lowering,
  ``_add_send_recv``): the send/recv actions the runtime adds, for the multi-stage
  schedules and for a compute-only CSV swpipe writes;
* the single-stage schedules (GPipe, 1F1B) do not run their ``pipeline_order``: their
  ``_step_microbatches`` posts and waits point-to-point ops itself. swpipe runs that very
  function on a recording stage, with the three p2p helpers it calls
  (``_batch_p2p``, ``_sorted_batch_p2p``, ``_wait_batch_p2p``) bound to recorders in a copy
  of the function's globals (torch's module is not touched), and reads what it posted,
  waited for and computed;
* ``_format_pipeline_order``: the step x rank grid exactly as PyTorch prints it;
* ``_simulate_comms_compute``: PyTorch's own dry run, to compare with;
* ``_PipelineScheduleRuntime._load_csv``: to check that a CSV swpipe writes loads;
* ``_PipelineScheduleRuntime(defer_pp_recv=True)`` (``_defer_recv_ops``): the lowering a custom order gets, each
  receive just before its use; ``_prepare_schedule_with_comms(format="compute_comms")``: a program's lowered
  order run as it stands (:func:`runtime_from_lowered`, what ``schedule_for`` builds for a custom order);
* ``PipelineScheduleMulti``'s own step loop over a ``pipeline_order`` padded into lock-step steps
  (:func:`lockstep_order`, :func:`lockstep_schedule`): one of the paths ``benchmarks/pp_runtime_paths.py`` times;
* ``_backward.stage_backward_input`` / ``stage_backward_weight``: the backward split the
  zero-bubble schedules run, to time I and W as the runtime runs them;
* a schedule's ``_stage`` (single-stage) or ``_stages`` (multi-stage): the stages a
  schedule object steps, when a caller of ``RollingStepCosts`` does not pass them.
"""

from __future__ import annotations

import functools
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["PPTorchError", "check_torch", "SCHEDULES", "available_schedules", "schedule_is_single",
           "compute_order", "runtime_order", "lower_compute_order", "format_grid", "torch_dry_run",
           "load_compute_csv", "runtime_from_csv", "runtime_from_order", "runtime_from_lowered", "lockstep_order", "lockstep_schedule", "schedule_class", "backward_full", "backward_input", "backward_weight", "stage_to_rank_map",
           "schedule_stages"]

MIN_TORCH = (2, 8)  # the oldest torch whose private helpers here were checked; 2.13 is the one tested
SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
             "DualPipeV")
_NEEDED = ("_Action", "_ComputationType", "_format_pipeline_order", "_PipelineScheduleRuntime",
           "_simulate_comms_compute", "get_schedule_class", "PipelineScheduleSingle", "PipelineScheduleMulti",
           "_batch_p2p", "_sorted_batch_p2p", "_wait_batch_p2p")
_V_STYLE = ("ZBVZeroBubble", "DualPipeV")  # their stages sit on the ranks in a V, not in a loop


@dataclass
class PPTorchError(RuntimeError):
    """This torch lacks a ``torch.distributed.pipelining`` helper swpipe reads.

    Attributes
    ----------
    torch_version : str
    missing : tuple of str
        The names not found (``"torch>=2.8"`` when the version itself is too old).
    """

    torch_version: str
    missing: Tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        super().__init__(
            f"swpipe's pipeline-parallel analysis reads torch.distributed.pipelining's schedules; torch "
            f"{self.torch_version} lacks {', '.join(self.missing)}. Install torch>={MIN_TORCH[0]}.{MIN_TORCH[1]} "
            f"(tested with 2.13).")


def _modules() -> Tuple[Any, Any]:
    import torch

    version = torch.__version__.split("+")[0]
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:  # a development build: check the names only
        major, minor = MIN_TORCH
    if (major, minor) < MIN_TORCH:
        raise PPTorchError(version, (f"torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}",))
    try:
        from torch.distributed.pipelining import _backward, schedules
    except ImportError as exc:
        raise PPTorchError(version, ("torch.distributed.pipelining",)) from exc
    missing = [n for n in _NEEDED if not hasattr(schedules, n)]
    missing += [f"_backward.{n}" for n in ("stage_backward", "stage_backward_input", "stage_backward_weight")
                if not hasattr(_backward, n)]
    if missing:
        raise PPTorchError(version, tuple(missing))
    return schedules, _backward


def check_torch() -> str:
    """The torch version when every helper swpipe reads is there; :class:`PPTorchError` otherwise."""
    import torch

    _modules()
    return torch.__version__


def available_schedules() -> Tuple[str, ...]:
    """The names of :data:`SCHEDULES` this torch has (``get_schedule_class`` knows them)."""
    schedules, _ = _modules()
    out = []
    for name in SCHEDULES:
        try:
            schedules.get_schedule_class(name)
        except ValueError:
            continue
        out.append(name)
    return tuple(out)


def schedule_class(name: str) -> Any:
    """PyTorch's schedule class of that name (``get_schedule_class``)."""
    schedules, _ = _modules()
    return schedules.get_schedule_class(name)


def runtime_from_csv(stages: List[Any], n_microbatches: int, loss_fn: Callable[..., Any], path: str,
                     n_stages: int) -> Any:
    """A ``_PipelineScheduleRuntime`` over this rank's stages running the compute-only CSV at ``path``."""
    schedules, _ = _modules()
    runtime = schedules._PipelineScheduleRuntime(stages, n_microbatches, loss_fn=loss_fn)
    runtime._load_csv(path, format="compute_only")
    return runtime


def runtime_from_order(stages: List[Any], n_microbatches: int, loss_fn: Callable[..., Any],
                       order: Dict[int, Sequence[str]], defer_recv: bool = False) -> Any:
    """A ``_PipelineScheduleRuntime`` over this rank's stages running a compute-only order, lowered by PyTorch
    (``_prepare_schedule_with_comms``, what ``_load_csv`` calls after reading the file); ``defer_recv``: its
    ``defer_pp_recv`` (each receive posted just before the action that reads it)."""
    schedules, _ = _modules()
    runtime = schedules._PipelineScheduleRuntime(stages, n_microbatches, loss_fn=loss_fn, defer_pp_recv=defer_recv)
    runtime.pipeline_order = {r: [schedules._Action.from_str(a) for a in order[r]] for r in sorted(order)}
    runtime._prepare_schedule_with_comms(runtime.pipeline_order)
    return runtime


def runtime_from_lowered(stages: List[Any], n_microbatches: int, loss_fn: Callable[..., Any],
                         compute: Dict[int, Sequence[str]], lowered: Dict[int, Sequence[str]]) -> Any:
    """A ``_PipelineScheduleRuntime`` over this rank's stages running ``lowered`` as it stands: every send,
    receive and computation where the order puts it (``_prepare_schedule_with_comms(format="compute_comms")``,
    what ``_load_csv(format="compute_comms")`` calls); ``pipeline_order`` is ``compute``, as a CSV's loader
    leaves it."""
    schedules, _ = _modules()
    runtime = schedules._PipelineScheduleRuntime(stages, n_microbatches, loss_fn=loss_fn)
    runtime.pipeline_order = {r: [schedules._Action.from_str(a) for a in compute[r]] for r in sorted(compute)}
    runtime._prepare_schedule_with_comms({r: [schedules._Action.from_str(a) for a in lowered[r]]
                                          for r in sorted(lowered)}, format="compute_comms")
    return runtime


def lockstep_order(compute: Dict[int, Sequence[str]], stage_to_rank: Sequence[int]) -> Dict[int, List[Optional[str]]]:
    """A compute order padded with idle steps (None) as ``PipelineScheduleMulti``'s own step loop reads it.

    That loop runs every rank's ``pipeline_order`` in lock-step: at step ``t`` a rank computes its action, posts
    the sends of its output and the receives of what its neighbours compute at ``t``, and waits for them all. An
    action that reads another rank's output must therefore stand at a later step than it; each action here
    stands at the first step its inputs from other ranks allow (its own rank's order kept).
    """
    n_stages = len(stage_to_rank)
    done: Dict[Tuple[int, str, int], int] = {}
    pos = {r: 0 for r in compute}
    out: Dict[int, List[Optional[str]]] = {r: [] for r in compute}
    backward = {(s, k, mb) for r in compute for a in compute[r] for s, k, mb in [_parse(a)] if k in ("B", "I")}
    t = 0
    while any(pos[r] < len(compute[r]) for r in compute):
        placed = []
        for r in sorted(compute):
            if pos[r] >= len(compute[r]):
                continue
            s, k, mb = _parse(compute[r][pos[r]])
            need = None
            if k == "F" and s > 0 and stage_to_rank[s - 1] != r:
                need = (s - 1, "F", mb)
            elif k in ("B", "I") and s < n_stages - 1 and stage_to_rank[s + 1] != r:
                need = (s + 1, "B" if (s + 1, "B", mb) in backward else "I", mb)
            if need is None or done.get(need, t) < t:
                placed.append((r, (s, k, mb)))
                out[r].append(compute[r][pos[r]])
            else:
                out[r].append(None)
        if not placed:
            raise ValueError(f"no rank can run its next action at step {t}: the order deadlocks")
        for r, key in placed:
            done[key] = t
            pos[r] += 1
        t += 1
    return out


def _parse(action: str) -> Tuple[int, str, int]:
    """``"1B3"`` -> ``(1, "B", 3)``, read by PyTorch's ``_Action.from_str``."""
    schedules, _ = _modules()
    a = schedules._Action.from_str(str(action))
    return a.stage_index, a.computation_type.value, a.microbatch_index


def lockstep_schedule(stages: List[Any], n_microbatches: int, loss_fn: Callable[..., Any],
                      order: Dict[int, Sequence[Optional[str]]], stage_to_rank: Sequence[int]) -> Any:
    """A ``PipelineScheduleMulti`` whose ``pipeline_order`` is ``order`` (:func:`lockstep_order`'s padding): run
    by ``PipelineScheduleMulti._step_microbatches``, the loop that posts its own sends and receives each step.

    That loop sends between adjacent stages only: every pair of adjacent stages on two ranks (a loop placement,
    not a V).
    """
    schedules, _ = _modules()
    if any(stage_to_rank[s] == stage_to_rank[s + 1] for s in range(len(stage_to_rank) - 1)):
        raise ValueError("PipelineScheduleMulti's own step loop sends between every pair of adjacent stages: "
                         "two adjacent stages on one rank (a V placement) need _PipelineScheduleRuntime")
    sched = schedules.PipelineScheduleMulti(stages, n_microbatches, loss_fn=loss_fn)
    sched.pipeline_order = {r: [None if a is None else schedules._Action.from_str(a) for a in order[r]]
                            for r in sorted(order)}
    sched._validate_and_set_stage_mapping(sched.pipeline_order)
    return sched


def schedule_is_single(name: str) -> bool:
    """Whether the schedule runs one stage per rank with its own step loop (GPipe, 1F1B)."""
    schedules, _ = _modules()
    return issubclass(schedule_class(name), schedules.PipelineScheduleSingle)


def stage_to_rank_map(name: str, n_ranks: int, n_stages: int) -> Tuple[int, ...]:
    """Which rank holds each stage under the schedule ``name`` (a loop, or a V for ZBV/DualPipeV)."""
    if name in _V_STYLE:
        out = []
        rank = 0
        for s in range(n_stages):
            out.append(rank)
            if (s + 1) % n_ranks == 0:
                continue
            rank += 1 if (s // n_ranks) % 2 == 0 else -1
        return tuple(out)
    return tuple(s % n_ranks for s in range(n_stages))


class _StageShape:
    """What a schedule's constructor reads of its stages: sizes and this rank (rank 0's view)."""

    submod = None
    group_rank = 0

    def __init__(self, n_ranks: int, n_stages: int) -> None:
        self.group_size, self.num_stages = n_ranks, n_stages


def send_retention(name: str) -> str:
    """How long the schedule's runtime holds the tensor of a send it posted.

    ``"traced"`` for the single-stage schedules (GPipe, 1F1B): their own step loop, run on
    recording stages, says after which computation it lets go of each send
    (:func:`send_releases`; ``Schedule1F1B`` holds the last warmup send's work in
    ``send_work`` until its steady phase ends, and each pending ``fwd_sends``/``bwd_sends``
    until the next send the same way replaces it). ``"step"`` for the others:
    ``_PipelineScheduleRuntime`` appends every send's work to ``send_ops`` and waits them at
    the end of the step.
    """
    return "traced" if schedule_is_single(name) else "step"


def send_releases(name: str, n_ranks: int, n_microbatches: int) -> Optional[Dict[int, Dict[str, Optional[str]]]]:
    """After which computation a single-stage schedule's runtime lets go of each send it posted.

    ``{rank: {send: compute action, or None for the step's end}}``, read from the schedule's own
    step loop run on recording stages (:func:`runtime_order`): a send is let go when the loop
    drops its last reference to the op and its work (CPython frees at once). None for a
    multi-stage schedule (its runtime holds every send to the step's end).

    Examples
    --------
    >>> held = send_releases("1F1B", 4, 8)[1]  # stage 1: three warmup forwards, 0F1's send kept in send_work
    >>> held["1SEND_F0"], held["1SEND_F1"], held["1SEND_B0"]
    ('1F1', '1B5', '1B1')
    """
    if not schedule_is_single(name):
        return None
    out: Dict[int, Dict[str, Optional[str]]] = {}
    for rank, log in _single_trace(name, n_ranks, n_microbatches).items():
        last: Optional[str] = None
        released: Dict[str, Optional[str]] = {}
        for kind, acts in log:
            if kind == "compute":
                last = acts[-1]
            elif kind == "release":
                released[acts[0]] = last
            elif kind == "returned":
                last = None
        out[rank] = released
    return out


def _stand_in_stages(n_ranks: int, n_stages: int, per_rank: int) -> Any:
    """Stages with the shape a schedule's constructor reads (every rank's order is built from them)."""
    return [_StageShape(n_ranks, n_stages)] * per_rank


def compute_order(name: str, n_ranks: int, n_microbatches: int, stages_per_rank: int) -> Dict[int, List[Optional[str]]]:
    """The schedule's ``pipeline_order`` as PyTorch builds it: ``{rank: ["0F0", None, ...]}``.

    For the single-stage schedules this is the order PyTorch *prints*; what their runtime
    runs is :func:`runtime_order`.
    """
    schedules, _ = _modules()
    cls = schedule_class(name)
    stages = _stand_in_stages(n_ranks, n_ranks * stages_per_rank, stages_per_rank)
    sched = cls(stages[0] if issubclass(cls, schedules.PipelineScheduleSingle) else stages, n_microbatches)
    order = sched.pipeline_order
    return {r: [None if a is None else str(a) for a in order[r]] for r in sorted(order)}


def lower_compute_order(order: Dict[int, Sequence[Optional[str]]], n_microbatches: int,
                        stage_to_rank: Sequence[int], defer_recv: bool = False) -> Dict[int, List[str]]:
    """PyTorch's comms lowering of a compute-only order, as ``_PipelineScheduleRuntime`` runs it.

    The runtime validates the order (``_validate_schedule``: every micro-batch's F before
    its B/I before its W, each stage on one rank) and adds ``SEND_*``/``RECV_*`` (and the
    ``UNSHARD``/``RESHARD``/``REDUCE_GRAD`` bookkeeping) with ``_add_send_recv``: every receive
    as early as its sender's action allows. ``defer_recv``: the runtime's ``defer_pp_recv``
    (``_defer_recv_ops``): every receive moved to just before the action that reads it.
    """
    schedules, _ = _modules()
    n_ranks = len(order)
    n_stages = len(stage_to_rank)
    stages = _stand_in_stages(n_ranks, n_stages, max(1, n_stages // n_ranks))
    runtime = schedules._PipelineScheduleRuntime(stages, n_microbatches, defer_pp_recv=defer_recv)
    actions = {r: [None if a is None else schedules._Action.from_str(a) for a in order[r]] for r in order}
    runtime._prepare_schedule_with_comms(actions)
    return {r: [str(a) for a in runtime.pipeline_order_with_comms[r]] for r in sorted(runtime.pipeline_order_with_comms)}


def _multi_runtime_order(name: str, n_ranks: int, n_microbatches: int, stages_per_rank: int) -> Dict[int, List[str]]:
    schedules, _ = _modules()
    cls = schedule_class(name)
    stages = _stand_in_stages(n_ranks, n_ranks * stages_per_rank, stages_per_rank)
    sched = cls(stages, n_microbatches)
    lowered = sched.pipeline_order_with_comms
    return {r: [str(a) for a in lowered[r]] for r in sorted(lowered)}


class _TraceOp:
    """A point-to-point op a recording stage hands the schedule: its PyTorch action name."""

    __slots__ = ("name", "peer", "__weakref__")

    def __init__(self, name: str, peer: int) -> None:
        self.name, self.peer = name, peer


class _RecordingStage:
    """What ``PipelineScheduleSingle._step_microbatches`` calls on its stage, recorded as actions."""

    def __init__(self, index: int, n_stages: int, log: List[Tuple[str, Tuple[str, ...]]]) -> None:
        self.stage_index, self.num_stages, self.log = index, n_stages, log
        self.is_first, self.is_last = index == 0, index == n_stages - 1
        self.group_rank, self.group_size = index, n_stages
        self.has_backward, self.submod = True, None
        self.output_chunks: List[Any] = []

    def _op(self, kind: str, mb: int, peer: int) -> List[_TraceOp]:
        op = _TraceOp(f"{self.stage_index}{kind}{mb}", peer)
        if kind.startswith("SEND"):  # when the loop drops its last reference (the op, its work), the tensor goes
            weakref.finalize(op, self.log.append, ("release", (op.name,)))
        return [op]

    def get_fwd_recv_ops(self, mb: int) -> List[_TraceOp]:
        return [] if self.is_first else self._op("RECV_F", mb, self.stage_index - 1)

    def get_fwd_send_ops(self, mb: int) -> List[_TraceOp]:
        return [] if self.is_last else self._op("SEND_F", mb, self.stage_index + 1)

    def get_bwd_recv_ops(self, mb: int) -> List[_TraceOp]:
        return [] if self.is_last else self._op("RECV_B", mb, self.stage_index + 1)

    def get_bwd_send_ops(self, mb: int) -> List[_TraceOp]:
        return [] if self.is_first else self._op("SEND_B", mb, self.stage_index - 1)

    def forward_one_chunk(self, mb: int, *args: Any, **kwargs: Any) -> None:
        self.log.append(("compute", (f"{self.stage_index}F{mb}",)))

    def backward_one_chunk(self, mb: int, loss: Any = None, full_backward: bool = True,
                           last_backward: bool = False) -> None:
        self.log.append(("compute", (f"{self.stage_index}{'B' if full_backward else 'I'}{mb}",)))

    def perform_reduce_grad(self, grad_scale_factor: int) -> None:
        self.log.append(("compute", (f"{self.stage_index}REDUCE_GRAD",)))

    def clear_runtime_states(self) -> None:
        pass


@functools.lru_cache(maxsize=256)
def _single_trace(name: str, n_ranks: int, n_microbatches: int) -> Dict[int, Tuple[Tuple[str, Tuple[str, ...]], ...]]:
    """Run the single-stage schedule's own step loop on recording stages, one per rank: what it posted, waited for
    and computed, where it let go of each send (``("release", (send,))``) and where the loop returned
    (``("returned", ())``: what it still held then is let go at the step's end)."""
    schedules, _ = _modules()
    cls = schedule_class(name)
    out: Dict[int, List[Tuple[str, Tuple[str, ...]]]] = {}
    for rank in range(n_ranks):
        log: List[Tuple[str, Tuple[str, ...]]] = []
        stage = _RecordingStage(rank, n_ranks, log)
        sched = cls(stage, n_microbatches, loss_fn=lambda out, target: None)

        def post(ops: List[_TraceOp], desc: Optional[str] = None, _log: Any = log) -> List[_TraceOp]:
            if ops:
                _log.append(("post", tuple(op.name for op in ops)))
            return list(ops)

        def post_sorted(ops: List[_TraceOp], desc: Optional[str] = None) -> Dict[int, List[_TraceOp]]:
            by_peer: Dict[int, List[_TraceOp]] = {}
            for op in ops:
                by_peer.setdefault(op.peer, []).append(op)
            return {peer: post(group) for peer, group in sorted(by_peer.items())}

        def wait(works: List[_TraceOp], _log: Any = log) -> None:
            if works:
                _log.append(("wait", tuple(op.name for op in works)))

        def loss(stage_: Any, output: Any, target_mbs: Any, mb: int, loss_kwargs: Any = None, _log: Any = log) -> None:
            if stage_.is_last:
                _log.append(("compute", (f"{stage_.stage_index}LOSS{mb}",)))

        sched._initialize_stage = lambda *a, **k: None
        sched._maybe_compute_loss = loss
        sched._maybe_get_loss = lambda stage_, mb: None
        sched._update_losses = lambda *a, **k: None
        step = cls._step_microbatches
        scope = dict(step.__globals__, _batch_p2p=post, _sorted_batch_p2p=post_sorted, _wait_batch_p2p=wait)
        traced = types.FunctionType(step.__code__, scope, step.__name__, step.__defaults__, step.__closure__)
        traced(sched, [()] * n_microbatches, [{}] * n_microbatches, [None] * n_microbatches, None)
        log.append(("returned", ()))  # what is let go after this (a cycle's op, collected later) goes at the end
        out[rank] = tuple(log)
    return out


def runtime_order(name: str, n_ranks: int, n_microbatches: int, stages_per_rank: int
                  ) -> Dict[int, List[Tuple[str, Tuple[str, ...]]]]:
    """What each rank's runtime does, in order: ``[("post"|"wait"|"compute", (action, ...)), ...]``.

    Multi-stage schedules: PyTorch's lowering (``pipeline_order_with_comms``), read with
    ``_PipelineScheduleRuntime``'s semantics: a ``SEND_*``/``RECV_*`` is posted where it
    stands, a compute action waits for the receive it consumes (none when the neighbouring
    stage is on the same rank), and every send is waited for at the end of the step.
    Single-stage schedules: the posts, waits and computations their own step loop makes.
    """
    if schedule_is_single(name):
        return {r: [step for step in log if step[0] in ("post", "wait", "compute")]
                for r, log in _single_trace(name, n_ranks, n_microbatches).items()}
    lowered = _multi_runtime_order(name, n_ranks, n_microbatches, stages_per_rank)
    return read_lowered(lowered, n_ranks * stages_per_rank, stage_to_rank_map(name, n_ranks, n_ranks * stages_per_rank))


def read_lowered(lowered: Dict[int, List[str]], n_stages: int, stage_to_rank: Sequence[int]
                 ) -> Dict[int, List[Tuple[str, Tuple[str, ...]]]]:
    """``_PipelineScheduleRuntime``'s semantics of a lowered order, as posts, waits and computations."""
    schedules, _ = _modules()
    out: Dict[int, List[Tuple[str, Tuple[str, ...]]]] = {}
    for rank, actions in lowered.items():
        steps: List[Tuple[str, Tuple[str, ...]]] = []
        sends: List[str] = []
        for text in actions:
            a = schedules._Action.from_str(text)
            kind = a.computation_type.value
            if kind in ("SEND_F", "SEND_B", "RECV_F", "RECV_B"):
                steps.append(("post", (text,)))
                if kind.startswith("SEND"):
                    sends.append(text)
                continue
            if kind in ("UNSHARD", "RESHARD"):
                continue  # no FSDP here: the runtime does nothing for them
            subs = a.sub_actions if a.sub_actions is not None else (a,)
            for sub in subs:
                s, k, mb = sub.stage_index, sub.computation_type.value, sub.microbatch_index
                if k == "F" and s > 0 and stage_to_rank[s - 1] != rank:
                    steps.append(("wait", (f"{s}RECV_F{mb}",)))
                elif k in ("B", "I") and s < n_stages - 1 and stage_to_rank[s + 1] != rank:
                    steps.append(("wait", (f"{s}RECV_B{mb}",)))
                steps.append(("compute", (str(sub),)))
                if k == "F" and s == n_stages - 1:
                    steps.append(("compute", (f"{s}LOSS{mb}",)))
        if sends:
            steps.append(("wait", tuple(sends)))
        out[rank] = steps
    return out


def format_grid(order: Dict[int, Sequence[Any]]) -> str:
    """The step x rank grid, printed by PyTorch's own ``_format_pipeline_order``."""
    schedules, _ = _modules()
    return schedules._format_pipeline_order({r: list(order[r]) for r in order})


def torch_dry_run(lowered: Dict[int, List[str]], stage_to_rank: Sequence[int]) -> Dict[int, List[Optional[str]]]:
    """PyTorch's dry run (``_simulate_comms_compute``) of a lowered order: unit steps, ``None`` idle."""
    schedules, _ = _modules()
    order = {r: [schedules._Action.from_str(a) for a in lowered[r]] for r in lowered}
    order = {r: [a for a in acts if a.computation_type.value not in ("UNSHARD", "RESHARD", "REDUCE_GRAD")]
             for r, acts in order.items()}
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # it prints its work-in-progress grid before it raises
        sim = schedules._simulate_comms_compute(order, lambda s: stage_to_rank[s], len(stage_to_rank))
    return {r: [None if a is None else str(a) for a in sim[r]] for r in sorted(sim)}


def load_compute_csv(path: str, n_ranks: int, n_stages: int, n_microbatches: int, defer_recv: bool = False
                     ) -> Tuple[Dict[int, List[str]], Dict[int, List[str]], Tuple[int, ...]]:
    """Load a compute-only CSV with ``_PipelineScheduleRuntime._load_csv``, as a rank of a job would.

    Returns the compute order it read, the lowered order it runs (``defer_recv``: with the runtime's
    ``defer_pp_recv``), and the stage-to-rank map its validator inferred.
    """
    schedules, _ = _modules()
    stages = _stand_in_stages(n_ranks, n_stages, max(1, n_stages // n_ranks))
    runtime = schedules._PipelineScheduleRuntime(stages, n_microbatches, defer_pp_recv=defer_recv)
    runtime._load_csv(path, format="compute_only")
    compute = {r: [str(a) for a in runtime.pipeline_order[r] if a is not None] for r in sorted(runtime.pipeline_order)}
    lowered = {r: [str(a) for a in runtime.pipeline_order_with_comms[r]]
               for r in sorted(runtime.pipeline_order_with_comms)}
    mapping = runtime.stage_index_to_group_rank
    return compute, lowered, tuple(mapping[s] for s in range(n_stages))


def backward_full(stage_outputs: Any, output_grads: Any, inputs: Any) -> Any:
    """The B the runtime runs: input and weight gradients at once (``stage_backward``)."""
    _, backward = _modules()
    return backward.stage_backward(stage_outputs, output_grads, inputs)


def backward_input(stage_outputs: Any, output_grads: Any, inputs: Any, weights: Any) -> Tuple[Any, Any]:
    """The I of a zero-bubble schedule: gradients of the stage's inputs (``stage_backward_input``)."""
    _, backward = _modules()
    return backward.stage_backward_input(stage_outputs, output_grads, inputs, weights)


def backward_weight(params: Any, param_groups: Any) -> Any:
    """The W of a zero-bubble schedule: gradients of the stage's weights (``stage_backward_weight``)."""
    _, backward = _modules()
    return backward.stage_backward_weight(params, param_groups)


def schedule_stages(schedule: Any) -> List[Any]:
    """The stages a schedule object steps on this rank (its ``_stages``, or its single ``_stage``)."""
    stages = getattr(schedule, "_stages", None)
    if stages is None:
        stage = getattr(schedule, "_stage", None)
        if stage is None:
            import torch

            raise PPTorchError(torch.__version__.split("+")[0], ("schedule._stages", "schedule._stage"))
        stages = [stage]
    return list(stages)
