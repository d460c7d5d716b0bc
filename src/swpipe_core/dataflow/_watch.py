"""Watch tensor reads and writes by storage, and draws from torch's default generators, through the dispatcher.

A :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every aten
(and c10d) op a task runs, including the ones autograd runs during
``backward()`` on the calling task's behalf. The op's schema says which
arguments it mutates (``Tensor(a!)``: ``alias_info.is_write``); every other
tensor argument is a read, and an output whose storage was never seen before
was created (written) by the op. Storages are identified by their
``StorageImpl`` (``untyped_storage()._cdata``) and kept alive while recording,
so the caching allocator cannot hand a seen address to a new tensor.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, FrozenSet, Iterator, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from swpipe_core.engine.rng import default_generator_draw

__all__: list = []


class WatchStop(RuntimeError):
    """Raised by a sink on purpose (strict mode): goes through to the user's op instead of being noted."""

_WRITES_CACHE: Dict[Any, FrozenSet[str]] = {}


def _written_args(func: Any) -> FrozenSet[str]:
    """Names of the arguments an op mutates, from its schema (cached per op).

    c10d collectives (``allreduce_``, ``alltoall_base_``) carry no alias
    annotations; by the trailing-underscore convention their first tensor
    argument is the one written.
    """
    found = _WRITES_CACHE.get(func)
    if found is not None:
        return found
    schema = func._schema
    names = frozenset(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    if not names and schema.name.split("::")[-1].endswith("_"):
        for a in schema.arguments:
            if "Tensor" in str(a.type):
                names = frozenset([a.name])
                break
    _WRITES_CACHE[func] = names
    return names


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def storage_key(t: torch.Tensor) -> Optional[int]:
    """The identity of a tensor's storage, or ``None`` for a tensor without one (sparse, meta)."""
    try:
        return t.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 - sparse/nested/subclass tensors have no plain storage
        return None


class StorageWatch(TorchDispatchMode):
    """Calls ``sink(key, tensor, mode)`` for each tensor an op touches (mode ``"read"``/``"write"``/``"new"``).

    ``seen`` is the set of storage keys met so far (shared with the
    recorder); an output storage not in it is ``"new"``. A failure inside the
    bookkeeping goes to ``on_error`` and never into the user's op.
    """

    def __init__(self, sink: Callable[[int, torch.Tensor, str], None], seen: set,
                 on_error: Callable[[BaseException, Any], None],
                 draws: Optional[Callable[[str], None]] = None) -> None:
        super().__init__()
        self._sink = sink
        self._seen = seen
        self._on_error = on_error
        self._draws = draws  # draws(device): the op drew from that device's default generator

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105 - the dispatcher hook
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self._observe(func, args, kwargs, out)
        except WatchStop:
            raise
        except Exception as exc:  # noqa: BLE001 - the recorder must never break the user's op
            self._on_error(exc, func)
        return out

    def _observe(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if self._draws is not None:
            device = default_generator_draw(func, args, kwargs)
            if device is not None:
                self._draws(device)
        written = _written_args(func)
        schema_args = func._schema.arguments
        pairs = list(zip((a.name for a in schema_args), args)) + list(kwargs.items())
        for name, value in pairs:
            mode = "write" if name in written else "read"
            for t in _tensors(value):
                key = storage_key(t)
                if key is not None:
                    self._seen.add(key)
                    self._sink(key, t, mode)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                key = storage_key(t)
                if key is not None and key not in self._seen:
                    self._seen.add(key)
                    self._sink(key, t, "new")
