"""Activation memory, measured: the bytes of what autograd keeps for backward, live over a run.

:class:`ActivationMeter` counts every tensor storage autograd saves for
backward (``torch.autograd.graph.saved_tensors_hooks``), once, from the
moment it is first saved until the storage is freed (a weak reference's
finaliser), leaving out the parameters and the caller's input (they exist
with or without a pipeline). Its ``peak`` is the activation memory of a run:
what checkpointing and the schedule change. Saved-tensor hooks are per
thread, so each partition's task enters :meth:`ActivationMeter.scope` on its
own thread; the storages a partition saves first are counted as its own.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Dict, Iterable, Iterator, Sequence

import torch

__all__ = ["ActivationMeter", "tensor_bytes"]


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``.

    Examples
    --------
    >>> x = torch.zeros(10)
    >>> tensor_bytes([x, x[2:4]])
    40
    """
    seen: Dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            seen[s.data_ptr() or id(s)] = s.nbytes()
    return sum(seen.values())


class ActivationMeter:
    """Live bytes of the storages autograd saved, overall and per partition, and their peaks.

    Parameters
    ----------
    exclude : iterable of tensors
        Storages never counted (the parameters, the input).

    Examples
    --------
    >>> meter = ActivationMeter()
    >>> with meter.scope(0):
    ...     y = (torch.ones(100, requires_grad=True) * 2).exp()  # exp saves its output: 400 bytes
    >>> meter.peak, meter.live
    (400, 400)
    >>> del y
    >>> meter.live
    0
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude if isinstance(t, torch.Tensor)}
        self._lock = threading.Lock()
        self._owner: Dict[int, tuple] = {}  # id(storage) -> (partition, bytes)
        self.live = 0
        self.peak = 0
        self.live_by: Dict[int, int] = {}
        self.peak_by: Dict[int, int] = {}
        self.saved_by: Dict[int, int] = {}  # bytes first saved by each partition, over the run

    def _pack(self, j: int, t: torch.Tensor) -> torch.Tensor:
        # a detached alias: the graph must not hold the Python tensor (a saved output would make a cycle with it)
        packed = t.detach()
        s = t.untyped_storage()
        n = s.nbytes()
        if n == 0 or s.data_ptr() in self._excluded:
            return packed
        key = id(s)
        with self._lock:
            if key in self._owner:
                return packed
            self._owner[key] = (j, n)
            self.live += n
            self.live_by[j] = self.live_by.get(j, 0) + n
            self.saved_by[j] = self.saved_by.get(j, 0) + n
            self.peak = max(self.peak, self.live)
            self.peak_by[j] = max(self.peak_by.get(j, 0), self.live_by[j])
        weakref.finalize(s, self._release, key)
        return packed

    def _release(self, key: int) -> None:
        with self._lock:
            j, n = self._owner.pop(key, (None, 0))
            if j is not None:
                self.live -= n
                self.live_by[j] -= n

    @contextlib.contextmanager
    def scope(self, partition: int) -> Iterator[None]:
        """Count what autograd saves on the calling thread in the block as ``partition``'s."""
        with torch.autograd.graph.saved_tensors_hooks(lambda t: self._pack(partition, t), lambda t: t):
            yield

    def exclude(self, tensors: Sequence[torch.Tensor]) -> None:
        """Never count the storages of ``tensors``."""
        self._excluded.update(t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor))
