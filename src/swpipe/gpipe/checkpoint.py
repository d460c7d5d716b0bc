"""Checkpointing: a partition's forward keeps only its inputs; backward recomputes its activations first.

A checkpointed partition runs its forward under ``torch.no_grad()`` and keeps
its inputs alone; when the gradient of its outputs arrives, two autograd
nodes take over, in an order the graph fixes:

* ``RecomputeBackward`` runs the partition again from the kept inputs, with
  gradients on and :func:`is_recomputing` true, drawing the *same* random
  numbers as the first time (:class:`Draws`), so dropout masks match;
* ``CheckpointBackward`` then back-propagates through the recomputed graph to
  the inputs and the parameters.

:func:`is_checkpointing` is true while the first, gradient-free forward runs.
Layers read these two flags to act once per mini-batch (deferred batch norm
updates its statistics in the first forward, not again in the recomputation).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, ContextManager, Iterator, List, Optional, Sequence, Tuple

import torch

__all__ = ["is_checkpointing", "is_recomputing", "checkpoint", "checkpointed", "Draws", "SavedDraws", "OwnDraws"]

_local = threading.local()


def is_checkpointing() -> bool:
    """Whether the calling thread runs a checkpointed forward (gradients off, activations not kept).

    Examples
    --------
    >>> is_checkpointing()
    False
    """
    return getattr(_local, "checkpointing", False)


def is_recomputing() -> bool:
    """Whether the calling thread recomputes a checkpointed forward during backward.

    Examples
    --------
    >>> is_recomputing()
    False
    """
    return getattr(_local, "recomputing", False)


@contextlib.contextmanager
def _flag(name: str) -> Iterator[None]:
    before = getattr(_local, name, False)
    setattr(_local, name, True)
    try:
        yield
    finally:
        setattr(_local, name, before)


class Draws:
    """The random numbers one forward draws, drawn identically again by its recomputation."""

    def first(self) -> ContextManager:
        """Context of the first forward."""
        raise NotImplementedError

    def again(self) -> ContextManager:
        """Context of the recomputation: the same numbers as :meth:`first` drew."""
        raise NotImplementedError


class SavedDraws(Draws):
    """The generators' states saved when the forward starts, put back for the recomputation (then restored).

    Right when no other thread draws from these generators meanwhile (one
    thread per device).

    Parameters
    ----------
    generators : sequence of torch.Generator
    """

    def __init__(self, generators: Sequence[torch.Generator]) -> None:
        self.generators = list({id(g): g for g in generators}.values())
        self.states: Optional[List[torch.Tensor]] = None

    @contextlib.contextmanager
    def first(self) -> Iterator[None]:
        self.states = [g.get_state() for g in self.generators]
        yield

    @contextlib.contextmanager
    def again(self) -> Iterator[None]:
        current = [g.get_state() for g in self.generators]
        for g, state in zip(self.generators, self.states or current):
            g.set_state(state)
        try:
            yield
        finally:
            for g, state in zip(self.generators, current):
                g.set_state(state)


class OwnDraws(Draws):
    """A generator of this partition and micro-batch alone (:class:`swpipe_core.engine.rng.PerTaskRng`).

    Right whatever other threads draw meanwhile: partitions that share a
    device's generator on threads of their own (CPU partitions) each draw
    from their own, in the forward and in its recomputation alike.
    """

    def __init__(self, rng: Any, task: str, microbatch: int) -> None:
        self.rng, self.task, self.microbatch = rng, task, microbatch

    def first(self) -> ContextManager:
        return self.rng.scope(self.task, self.microbatch)

    again = first


class _Record:
    """What the two nodes of one checkpoint share: the function, its draws, the recomputed graph."""

    __slots__ = ("function", "draws", "recomputed")

    def __init__(self, function: Callable[..., Tuple[torch.Tensor, ...]], draws: Draws) -> None:
        self.function, self.draws = function, draws
        self.recomputed: Optional[Tuple[Tuple[torch.Tensor, ...], List[torch.Tensor]]] = None


class Checkpoint(torch.autograd.Function):
    """The gradient-free forward; its backward goes through the graph :class:`Recompute` rebuilt."""

    @staticmethod
    def forward(ctx: Any, phony: torch.Tensor, record: _Record, *inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.record = record
        with torch.no_grad(), _flag("checkpointing"), record.draws.first():
            outputs = record.function(*inputs)
        return tuple(o.detach() for o in outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        record: _Record = ctx.record
        assert record.recomputed is not None, "RecomputeBackward runs first: the graph orders it"
        outputs, leaves = record.recomputed
        record.recomputed = None
        pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None, *(leaf.grad if leaf.requires_grad else None for leaf in leaves))


class Recompute(torch.autograd.Function):
    """An identity on the checkpoint's outputs whose backward recomputes the forward from the kept inputs."""

    @staticmethod
    def forward(ctx: Any, record: _Record, n: int, *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.record, ctx.n = record, n
        ctx.save_for_backward(*tensors[n:])  # the inputs: autograd checks they were not changed in place
        return tuple(t.detach() for t in tensors[:n])

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        record: _Record = ctx.record
        leaves = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
        with torch.enable_grad(), _flag("recomputing"), record.draws.again():
            outputs = record.function(*leaves)
        record.recomputed = (tuple(outputs), leaves)
        return (None, None, *grads, *(None for _ in leaves))


def checkpointed(function: Callable[..., Tuple[torch.Tensor, ...]], inputs: Sequence[torch.Tensor],
                 draws: Draws, device: torch.device) -> Tuple[torch.Tensor, ...]:
    """``function(*inputs)`` (a tuple of tensors) checkpointed: its activations are recomputed in backward.

    A phony input that requires gradients makes the outputs require them even
    when no input does, so the parameters used inside get theirs.
    """
    record = _Record(function, draws)
    phony = torch.empty(0, device=device, requires_grad=True)
    outputs = Checkpoint.apply(phony, record, *inputs)
    return Recompute.apply(record, len(outputs), *outputs, *inputs)


def checkpoint(function: Callable[..., Any], *inputs: torch.Tensor) -> Any:
    """Run ``function(*inputs)`` checkpointed (a tensor or a tuple of tensors in, the same out).

    Random numbers drawn inside are drawn again identically by the
    recomputation (the CPU's generator and those of the inputs' devices are
    saved, then put back).

    Examples
    --------
    >>> x = torch.ones(2, requires_grad=True)
    >>> y = checkpoint(lambda t: t * 3, x)
    >>> y.sum().backward(); x.grad.tolist()
    [3.0, 3.0]
    """
    from swpipe_core.engine.device import as_device

    single: List[bool] = []

    def flat(*xs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        out = function(*xs)
        single[:] = [isinstance(out, torch.Tensor)]
        return (out,) if single[0] else tuple(out)

    generators = [torch.default_generator] + [as_device(t.device).default_generator() for t in inputs
                                              if t.device.type != "cpu"]
    device = inputs[0].device if inputs else torch.device("cpu")
    outputs = checkpointed(flat, inputs, SavedDraws(generators), device)
    return outputs[0] if single[0] else outputs
