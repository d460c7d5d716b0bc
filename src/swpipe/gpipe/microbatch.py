"""Micro-batches: a mini-batch (a tensor or a tuple of tensors) split along dimension 0, and joined back.

A mini-batch of ``N`` samples becomes ``torch.chunk``'s pieces: at most
``chunks`` of them, as equal as ``N`` allows (``N = 7, chunks = 4`` gives
sizes 2, 2, 2, 1; ``N = 2, chunks = 4`` gives two). A single tensor stays a
single tensor in every micro-batch, so the first layer receives what it would
receive without GPipe; a tuple stays a tuple.

While a partition runs on a micro-batch, :func:`current` says which one and
how many the mini-batch has (deferred batch norm knows by it that GPipe
commits its statistics after the run).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from swpipe.gpipe.errors import GPipeArgumentError, InputTypeError

__all__ = ["Tensors", "check", "scatter", "gather", "batch_size", "current", "MicroBatchIndex"]

#: What flows between layers: a tensor, or a tuple of tensors.
Tensors = Union[torch.Tensor, Tuple[torch.Tensor, ...]]


def check(value: object, where: str = "input") -> None:
    """Raise :class:`~swpipe.gpipe.errors.InputTypeError` unless ``value`` is a tensor or a tuple of tensors.

    Examples
    --------
    >>> check((torch.ones(2), torch.zeros(2)))
    >>> try:
    ...     check((torch.ones(1), "hello"))
    ... except InputTypeError as err:
    ...     err.where, err.index, err.type
    ('input', 1, <class 'str'>)
    """
    if isinstance(value, torch.Tensor):
        return
    if not isinstance(value, tuple):
        raise InputTypeError(where, None, type(value))
    for k, item in enumerate(value):
        if not isinstance(item, torch.Tensor):
            raise InputTypeError(where, k, type(item))


def batch_size(value: Tensors) -> int:
    """The size of dimension 0 shared by every tensor of ``value``."""
    tensors = (value,) if isinstance(value, torch.Tensor) else value
    sizes = [t.shape[0] if t.dim() > 0 else None for t in tensors]
    if any(s is None for s in sizes):
        raise GPipeArgumentError("input", tuple(t.shape for t in tensors), "a 0-dimensional tensor has no batch "
                                 "dimension to split", "give tensors whose dimension 0 is the batch")
    if len(set(sizes)) > 1:
        raise GPipeArgumentError("input", tuple(sizes), "the tensors' batch sizes (dimension 0) differ, so they "
                                 "cannot be split into the same micro-batches", "give tensors of one batch size")
    return int(sizes[0]) if sizes else 0


def scatter(value: Tensors, chunks: int) -> List[Tensors]:
    """Split ``value`` into at most ``chunks`` micro-batches along dimension 0 (views, no copy).

    Examples
    --------
    >>> [m.shape[0] for m in scatter(torch.zeros(7, 3), 4)]
    [2, 2, 2, 1]
    >>> [tuple(t.shape[0] for t in m) for m in scatter((torch.zeros(4), torch.zeros(4, 2)), 2)]
    [(2, 2), (2, 2)]
    """
    check(value)
    batch_size(value)
    if isinstance(value, torch.Tensor):
        return list(value.chunk(chunks))
    pieces = [t.chunk(chunks) for t in value]
    return [tuple(p[i] for p in pieces) for i in range(len(pieces[0]) if pieces else 0)]


def gather(outputs: Sequence[Tensors]) -> Tensors:
    """Concatenate micro-batch outputs along dimension 0 (a tuple is joined element by element).

    Examples
    --------
    >>> gather([torch.ones(2), torch.zeros(1)]).tolist()
    [1.0, 1.0, 0.0]
    """
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(list(outputs)) if len(outputs) > 1 else first
    return tuple(torch.cat([o[k] for o in outputs]) if len(outputs) > 1 else first[k] for k in range(len(first)))


class MicroBatchIndex(NamedTuple):
    """Which micro-batch a partition is running: ``index`` of ``count`` in this mini-batch."""

    index: int
    count: int


_local = threading.local()


def current() -> Optional[MicroBatchIndex]:
    """The micro-batch the calling thread is running a partition on, or ``None`` outside GPipe.

    Examples
    --------
    >>> current() is None
    True
    >>> with running(MicroBatchIndex(1, 4)):
    ...     current()
    MicroBatchIndex(index=1, count=4)
    """
    return getattr(_local, "mb", None)


@contextlib.contextmanager
def running(mb: MicroBatchIndex) -> Iterator[None]:
    """Mark the calling thread as running micro-batch ``mb`` for the block."""
    before = getattr(_local, "mb", None)
    _local.mb = mb
    try:
        yield
    finally:
        _local.mb = before
