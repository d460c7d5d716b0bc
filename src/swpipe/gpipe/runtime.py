"""The torch work of GPipe's tasks: a partition's forward and backward on one micro-batch, and the copies between.

:mod:`swpipe.gpipe.schedule` says which task runs when; this module says
what each does (``F``, ``C``, ``B``, ``G``, see there) to the micro-batch's
context ``ctx``:

* ``ctx.inp[j]``: partition ``j``'s input (on its device once ``C<j>`` ran);
  ``ctx.skip[(j, key)]``: a skip partition ``j`` pops;
* in a training step, ``ctx.outs[j]`` / ``ctx.leaves[j]``: partition ``j``'s
  outputs and the leaves its inputs were cut into (its backward joins them),
  ``ctx.grads[(j, slot)]``: the gradient of one of partition ``j``'s inputs,
  ``ctx.loss``.

One :class:`Call` holds what a whole ``forward`` or training step shares:
the micro-batches, the grad mode of the caller (worker threads do not
inherit it), which micro-batches are checkpointed, the random generators,
the outputs. Values are popped from ``ctx`` once read, so a micro-batch holds
no more than the module run whole would.

Streams (CUDA): a copy runs on the destination's copy stream, with the
source's copy stream current too (a device-to-device copy runs on the
source's current stream, after a two-way barrier with the destination's);
``record_stream`` marks the source read on that stream and the copy read on
the destination's compute stream, because autograd keeps tensors beyond the
engine's lifetime rules (until backward).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from swpipe_core.engine.device import Device
from swpipe_core.engine.rng import PerTaskRng

from swpipe.gpipe.checkpoint import Draws, OwnDraws, SavedDraws, checkpointed
from swpipe.gpipe.errors import BatchDimensionError, LossFunctionError, OutputTypeError
from swpipe.gpipe.memory import ActivationMeter
from swpipe.gpipe.microbatch import MicroBatchIndex, Tensors, batch_size, running
from swpipe.gpipe.schedule import Placement
from swpipe.gpipe.skip.layout import SkipRoutes
from swpipe.gpipe.skip.tracker import SkipKey, SkipTracker, use_tracker

__all__ = ["Call", "MicroBatch", "TorchOps"]


@dataclass
class Call:
    """What one ``forward`` or training step shares across its micro-batches and threads."""

    microbatches: List[Tensors]
    grad: bool
    inference: bool
    checkpoint_stop: int  # micro-batches [0, stop) are checkpointed
    seed: int
    step: bool = False
    targets: Optional[List[Any]] = None
    loss_fn: Optional[Callable[[Any, Any], torch.Tensor]] = None
    weights: Optional[List[float]] = None
    outputs: List[Any] = field(default_factory=list)
    losses: List[Any] = field(default_factory=list)
    meter: Optional[ActivationMeter] = None  # counts what autograd saves (swpipe.gpipe.memory)

    def __post_init__(self) -> None:
        self.outputs = [None] * len(self.microbatches)
        self.losses = [None] * len(self.microbatches)
        self.rng = PerTaskRng(self.seed)
        #: (kind, partition, micro-batch) of the tasks inside the partitions' code now, oldest first: a task the run
        #: stopped waiting for is still here (swpipe.gpipe.GPipe names it)
        self.active: Dict[Tuple[str, int, int], None] = {}
        #: what the partitions' code raised (the engine's own errors, its timeouts, are not here)
        self.raised: List[BaseException] = []

    @contextlib.contextmanager
    def modes(self, grad: Optional[bool] = None, partition: Optional[int] = None) -> Iterator[None]:
        """The caller's autograd modes on a worker thread (they are per thread), and the meter if any."""
        with torch.inference_mode(self.inference), torch.set_grad_enabled(self.grad if grad is None else grad):
            if self.meter is None or partition is None:
                yield
            else:
                with self.meter.scope(partition):
                    yield


@dataclass
class MicroBatch:
    """The batch of one iteration of a GPipe plan: micro-batch ``index`` of ``call``."""

    call: Call
    index: int

    @property
    def values(self) -> Tensors:
        return self.call.microbatches[self.index]


class _Shape:
    """How a partition's flat tensors map to its input, output and skips (known after its first run)."""

    __slots__ = ("out_atomic", "n_out", "stashed_other")

    def __init__(self) -> None:
        self.out_atomic = True
        self.n_out = 1
        self.stashed_other: Dict[SkipKey, Any] = {}  # stashed values that are not tensors (None): not in autograd


def _tensors(value: Tensors) -> Tuple[torch.Tensor, ...]:
    return (value,) if isinstance(value, torch.Tensor) else tuple(value)


class TorchOps:
    """Task functions of one GPipe: ``ops()[kind](j, ctx)``.

    Parameters
    ----------
    partitions : sequence of nn.Sequential
    devices : sequence of Device
        The partitions' devices (swpipe's device seam).
    places : sequence of Placement
    routes : SkipRoutes
    shared_generator : list of bool
        Per partition: whether another thread draws from its device's
        generator meanwhile (CPU partitions on threads of their own); such a
        partition draws from a generator of its own per micro-batch.
    """

    def __init__(self, partitions: Sequence[nn.Sequential], devices: Sequence[Device], places: Sequence[Placement],
                 routes: SkipRoutes, shared_generator: Sequence[bool]) -> None:
        self.partitions, self.devices, self.places, self.routes = list(partitions), list(devices), list(places), routes
        self.shared = list(shared_generator)
        self.n = len(self.partitions)
        self.incoming = [[key for key, _ in routes.incoming(j)] for j in range(self.n)]
        self.source = [dict(routes.incoming(j)) for j in range(self.n)]
        self.outgoing = [routes.outgoing(j) for j in range(self.n)]

    def ops(self) -> Dict[str, Callable[[int, Any], None]]:
        return {kind: _tracked(kind, op) for kind, op in
                (("F", self.forward), ("C", self.copy), ("B", self.backward), ("G", self.grad_copy))}

    # -- forward --------------------------------------------------------------------------------------------
    def own_draws(self, j: int, microbatches: int) -> bool:
        """Whether partition ``j`` draws from a generator of its own per micro-batch (else its device's).

        With one micro-batch the partitions run one after the other, so they
        draw from the device's generator in the order of the module run whole.
        """
        return self.shared[j] and microbatches > 1

    def draws(self, call: Call, j: int, i: int) -> Draws:
        if self.own_draws(j, len(call.microbatches)):
            return OwnDraws(call.rng, f"F{j}", i)
        dev = self.devices[j]
        return SavedDraws([dev.default_generator()])

    def _flat_fn(self, j: int, atomic_in: bool, n_in: int, in_keys: Sequence[SkipKey],
                 in_other: Dict[SkipKey, Any], shape: _Shape) -> Callable[..., Tuple[torch.Tensor, ...]]:
        partition, out_keys = self.partitions[j], [key for key, _ in self.outgoing[j]]

        def run(*flat: torch.Tensor) -> Tuple[torch.Tensor, ...]:
            main = flat[0] if atomic_in else tuple(flat[:n_in])
            pops = dict(zip(in_keys, flat[n_in:]))
            pops.update(in_other)
            tracker = SkipTracker(pops)
            with use_tracker(tracker):
                out = partition(main)
            _check_output(out, j)
            outs = _tensors(out)
            shape.out_atomic, shape.n_out = isinstance(out, torch.Tensor), len(outs)
            stashes = []
            for key in out_keys:
                value = tracker.stashed.get(key)
                if isinstance(value, torch.Tensor):
                    stashes.append(value)
                else:
                    shape.stashed_other[key] = value
            return outs + tuple(stashes)
        return run

    def forward(self, j: int, ctx: Any) -> None:
        mb: MicroBatch = ctx.batch
        call, i = mb.call, mb.index
        if j == 0:
            ctx.inp, ctx.skip, ctx.outs, ctx.leaves, ctx.grads, ctx.out_grads = {}, {}, {}, {}, {}, {}
            ctx.batch_changed = None  # (partition, rows): the first partition whose output changed dimension 0
            main: Tensors = mb.values
        else:
            main = ctx.inp.pop(j)
        in_values = {key: ctx.skip.pop((j, key)) for key in self.incoming[j]}
        in_keys = [k for k in self.incoming[j] if isinstance(in_values[k], torch.Tensor)]
        in_other = {k: v for k, v in in_values.items() if k not in in_keys}
        flat_in = _tensors(main) + tuple(in_values[k] for k in in_keys)
        if call.step and j > 0:  # cut the graph: this partition's backward ends at these leaves
            flat_in = tuple(t.detach().requires_grad_(t.requires_grad) for t in flat_in)
            ctx.leaves[j] = (flat_in, len(_tensors(main)), in_keys)
        shape = _Shape()
        fn = self._flat_fn(j, isinstance(main, torch.Tensor), len(_tensors(main)), in_keys, in_other, shape)
        draws = self.draws(call, j, i)
        with call.modes(partition=j), running(MicroBatchIndex(i, len(call.microbatches))):
            if i < call.checkpoint_stop:
                flat_out = checkpointed(fn, flat_in, draws, self.devices[j].torch_device)
            else:
                with draws.first():
                    flat_out = fn(*flat_in)
        outs = flat_out[:shape.n_out]
        if len(call.microbatches) > 1:
            self._check_batch(j, ctx, outs, batch_size(mb.values), i)
        out: Tensors = outs[0] if shape.out_atomic else tuple(outs)
        stashed = dict(zip([k for k, _ in self.outgoing[j] if k not in shape.stashed_other], flat_out[shape.n_out:]))
        stashed.update(shape.stashed_other)
        for key, dst in self.outgoing[j]:
            ctx.skip[(dst, key)] = stashed[key]
        if call.step:
            ctx.outs[j] = (outs, {k: v for k, v in stashed.items() if isinstance(v, torch.Tensor)})
        if j + 1 < self.n:
            ctx.inp[j + 1] = out
        elif call.step:
            with call.modes():  # the loss's own saved tensors are not the partitions' activations
                loss = call.loss_fn(out, call.targets[i])
                _check_loss(loss, outs, i)
                ctx.loss = loss * call.weights[i] if call.weights[i] != 1 else loss
            call.losses[i] = ctx.loss.detach()
        else:
            call.outputs[i] = out

    def _check_batch(self, j: int, ctx: Any, outs: Sequence[torch.Tensor], size: int, i: int) -> None:
        """Raise at the last partition if its output lost the micro-batch's size in dimension 0 (naming who changed it).

        An inner partition may change dimension 0 if a later one restores it
        (torchgpipe's contract): only what is joined must keep it.
        """
        rows = next((t.shape[0] if t.dim() else -1 for t in outs if t.dim() == 0 or t.shape[0] != size), None)
        if rows is not None and ctx.batch_changed is None:
            ctx.batch_changed = (j, rows)
        if rows is not None and j == self.n - 1:
            first, first_rows = ctx.batch_changed
            raise BatchDimensionError(first, i, size, first_rows)

    # -- copies ---------------------------------------------------------------------------------------------
    def _move(self, value: Any, src: int, dst: int) -> Any:
        """``value`` (tensors) from partition ``src``'s device onto ``dst``'s, on the copy streams."""
        s, d = self.devices[src], self.devices[dst]
        if self.places[src].device == self.places[dst].device or value is None:
            return value
        src_stream = self.places[src].copy if s.is_async else None
        use = s.use(src_stream) if src_stream is not None else contextlib.nullcontext()
        with use:
            if isinstance(value, torch.Tensor):
                return self._move_tensor(value, s, d, src, dst)
            return tuple(self._move_tensor(t, s, d, src, dst) for t in value)

    def _move_tensor(self, t: torch.Tensor, s: Device, d: Device, src: int, dst: int) -> torch.Tensor:
        out = t.to(d.torch_device, non_blocking=d.is_async)
        if s.is_async:  # read on the source's copy stream: not reused before the copy ran there
            t.record_stream(self.places[src].copy)
        if d.is_async:  # read on the destination's compute stream, maybe after the engine let go (autograd keeps it)
            out.record_stream(self.places[dst].compute)
        return out

    def copy(self, j: int, ctx: Any) -> None:
        call: Call = ctx.batch.call
        with call.modes(grad=call.grad and not call.step):
            if j > 0:
                ctx.inp[j] = self._move(ctx.inp[j], j - 1, j)
            for key in self.incoming[j]:
                ctx.skip[(j, key)] = self._move(ctx.skip[(j, key)], self.source[j][key], j)

    # -- backward -------------------------------------------------------------------------------------------
    def _gather_grads(self, j: int, ctx: Any, move: bool) -> List[Optional[torch.Tensor]]:
        """Gradients of partition ``j``'s outputs (main, then stashes), from the partitions that read them."""
        outs, stashes = ctx.outs[j]
        grads: List[Optional[torch.Tensor]] = []
        for k in range(len(outs)):
            g = ctx.grads.pop((j + 1, k), None)
            grads.append(self._move(g, j + 1, j) if move else g)
        for key, dst in self.outgoing[j]:
            if key in stashes:
                g = ctx.grads.pop((dst, key), None)
                grads.append(self._move(g, dst, j) if move else g)
        return grads

    def grad_copy(self, j: int, ctx: Any) -> None:
        call: Call = ctx.batch.call
        with call.modes(grad=False):
            ctx.out_grads[j] = self._gather_grads(j, ctx, move=True)

    def backward(self, j: int, ctx: Any) -> None:
        mb: MicroBatch = ctx.batch
        call, i = mb.call, mb.index
        with call.modes(grad=True, partition=j), running(MicroBatchIndex(i, len(call.microbatches))):
            if j == self.n - 1:
                loss = ctx.loss
                del ctx.loss
                ctx.outs.pop(j)
                torch.autograd.backward([loss])
            else:
                grads = ctx.out_grads.pop(j) if j in ctx.out_grads else self._gather_grads(j, ctx, move=False)
                outs, stashes = ctx.outs.pop(j)
                tensors = list(outs) + list(stashes.values())
                pairs = [(t, g) for t, g in zip(tensors, grads) if g is not None and t.requires_grad]
                if pairs:
                    torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        entry = ctx.leaves.pop(j, None)
        if entry is None:
            return
        leaves, n_main, in_keys = entry
        for k, leaf in enumerate(leaves):
            ctx.grads[(j, k if k < n_main else in_keys[k - n_main])] = leaf.grad


def _tracked(kind: str, op: Callable[[int, Any], None]) -> Callable[[int, Any], None]:
    """``op`` recording, in its micro-batch's :class:`Call`, that it runs and what it raised."""
    def run(j: int, ctx: Any) -> None:
        mb: MicroBatch = ctx.batch
        key = (kind, j, mb.index)
        mb.call.active[key] = None
        try:
            op(j, ctx)
        except BaseException as exc:
            mb.call.raised.append(exc)
            raise
        finally:
            del mb.call.active[key]
    return run


def _check_loss(loss: Any, outs: Sequence[torch.Tensor], i: int) -> None:
    """Raise :class:`LossFunctionError` unless ``loss`` is a scalar tensor backward can start from."""
    if not isinstance(loss, torch.Tensor):
        raise LossFunctionError("not_tensor", loss, i)
    if loss.numel() != 1:
        raise LossFunctionError("not_scalar", loss, i)
    if not loss.requires_grad and any(t.requires_grad for t in outs):
        raise LossFunctionError("no_grad", loss, i)


def _check_output(out: Any, j: int) -> None:
    if isinstance(out, torch.Tensor):
        return
    where = f"partition {j} output"
    if not isinstance(out, tuple):
        raise OutputTypeError(where, None, type(out))
    for k, item in enumerate(out):
        if not isinstance(item, torch.Tensor):
            raise OutputTypeError(where, k, type(item))
