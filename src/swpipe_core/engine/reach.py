"""Walk every object reachable from a batch or a context: containers, attributes and slots.

Used where the engine or a measurement must find the tensors a user's data
holds without knowing its type (a dict of tensors, a dataclass, a
KeyedJaggedTensor): :func:`swpipe_core.measure.memory.reachable_storages` sums their
storages, :meth:`swpipe_core.engine.streams.StreamPool.batch_ready` looks for a CUDA
tensor. Modules, classes, Python modules and devices are not entered (their
parameters, globals and allocators are not the data's), scalars are skipped,
and each object is visited once.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Iterable, Iterator, List

from swpipe_core.engine.device import Device

__all__ = ["reachable_objects"]

_SCALARS = (str, bytes, int, float, bool, complex, type(None))


def reachable_objects(roots: Iterable[Any], max_nodes: int,
                      tensor_children: Callable[[Any], Iterable[Any]] = lambda t: ()) -> Iterator[Any]:
    """Every non-scalar object reachable from ``roots``, each once, at most ``max_nodes`` of them.

    Parameters
    ----------
    roots : iterable
        Where the walk starts.
    max_nodes : int
        Objects visited at most (a guard against huge or cyclic graphs of objects).
    tensor_children : callable, optional
        ``tensor -> objects`` walked from a tensor (e.g. its ``.grad``); none by default.

    Yields
    ------
    object
        Tensors, containers and other objects, in no particular order.

    Examples
    --------
    >>> import torch
    >>> class Batch:
    ...     __slots__ = ("ids",)
    ...     def __init__(self, ids): self.ids = ids
    >>> found = reachable_objects([{"a": [Batch(torch.ones(2)), 3]}], max_nodes=100)
    >>> [type(o).__name__ for o in found if not isinstance(o, (dict, list))]
    ['Batch', 'Tensor']
    """
    import torch

    seen: set = set()
    stack: List[Any] = list(roots)
    while stack and len(seen) < max_nodes:
        obj = stack.pop()
        if isinstance(obj, _SCALARS) or id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, torch.Tensor):
            stack.extend(tensor_children(obj))
        elif isinstance(obj, (torch.nn.Module, type, types.ModuleType, Device)):
            continue  # not the data's: a module's parameters, a device's allocator
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        else:
            stack.extend(_attributes(obj))


def _attributes(obj: Any) -> List[Any]:
    values: List[Any] = []
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        values.extend(v for k, v in d.items() if not (isinstance(k, str) and k.startswith("_swp_")))
    for cls in type(obj).__mro__:
        slots = getattr(cls, "__slots__", ()) or ()
        for name in (slots,) if isinstance(slots, str) else slots:
            # the engine's own slots on a context (what it keeps alive, a strict guard) are not the data's
            if isinstance(name, str) and not name.startswith("__") and not name.startswith("_swp_"):
                try:
                    values.append(getattr(obj, name))
                except AttributeError:  # an unset slot
                    pass
    return values
