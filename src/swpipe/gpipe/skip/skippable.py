"""Skippable layers: ``@skippable(stash=[...], pop=[...])``, and ``stash``/``pop`` yielded from ``forward``.

A skip connection carries a tensor from an early layer to a later one past
the layers between (a U-Net's encoder to its decoder). In an
``nn.Sequential`` the layers only see their neighbour's output, so a
skippable layer's ``forward`` is a generator: ``yield stash(name, tensor)``
hands a tensor on, ``value = yield pop(name)`` takes it back. GPipe carries
stashed tensors between partitions, across devices, with their gradients.

Examples
--------
>>> import torch
>>> from torch import nn
>>> @skippable(stash=["skip"])
... class Save(nn.Module):
...     def forward(self, x):
...         yield stash("skip", x)
...         return x * 2
>>> @skippable(pop=["skip"])
... class Add(nn.Module):
...     def forward(self, x):
...         skip = yield pop("skip")
...         return x + skip
>>> nn.Sequential(Save(), Add())(torch.ones(2)).tolist()
[3.0, 3.0]
"""

from __future__ import annotations

import types
from typing import Any, Callable, ClassVar, Dict, FrozenSet, Iterable, Optional, Type

from torch import nn

from swpipe.gpipe.errors import SkipDeclarationError
from swpipe.gpipe.skip.namespace import DEFAULT, Namespace
from swpipe.gpipe.skip.tracker import SkipKey, current_tracker

__all__ = ["skippable", "stash", "pop", "Skippable"]


class stash:
    """``yield stash(name, tensor)`` in a skippable layer's ``forward``: hand ``tensor`` on under ``name``."""

    __slots__ = ("name", "tensor")

    def __init__(self, name: str, tensor: Any) -> None:
        self.name, self.tensor = name, tensor


class pop:
    """``value = yield pop(name)`` in a skippable layer's ``forward``: take what an earlier layer stashed."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class Skippable(nn.Module):
    """A layer wrapped by :func:`skippable`; ``module`` is the wrapped layer.

    Class attributes ``stashable_names`` and ``poppable_names`` are the
    declared names; :meth:`isolate` puts them in a :class:`Namespace`.
    """

    module_cls: ClassVar[Type[nn.Module]]
    stashable_names: ClassVar[FrozenSet[str]]
    poppable_names: ClassVar[FrozenSet[str]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.module = self.module_cls(*args, **kwargs)
        self.namespaces: Dict[str, Namespace] = {}

    def __repr__(self) -> str:
        return f"@skippable({self.module!r})"

    def isolate(self, ns: Namespace, *, only: Optional[Iterable[str]] = None) -> "Skippable":
        """Put this layer's skip names (or ``only`` those) in namespace ``ns``; returns the layer."""
        names = self.stashable_names | self.poppable_names if only is None else set(only)
        for name in names:
            self.namespaces[name] = ns
        return self

    def namespaced(self, name: str) -> SkipKey:
        """The key of skip ``name`` of this layer: (its namespace, name)."""
        return self.namespaces.get(name, DEFAULT), name

    def keys(self, stashed: bool) -> Dict[SkipKey, str]:
        """The keys this layer stashes (``stashed``) or pops, with their names."""
        names = self.stashable_names if stashed else self.poppable_names
        return {self.namespaced(n): n for n in names}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        result = self.module(*args, **kwargs)
        stashed, popped = set(), set()
        if isinstance(result, types.GeneratorType):
            result = self._drive(result, stashed, popped)
        layer = type(self.module).__name__
        for name in sorted(self.stashable_names - stashed):
            raise SkipDeclarationError(layer, name, "not_stashed",
                                       f"{layer} declared {name!r} as stashable but did not stash it")
        for name in sorted(self.poppable_names - popped):
            raise SkipDeclarationError(layer, name, "not_popped",
                                       f"{layer} declared {name!r} as poppable but did not pop it")
        return result

    def _drive(self, gen: types.GeneratorType, stashed: set, popped: set) -> Any:
        layer = type(self.module).__name__
        tracker = current_tracker()
        sent: Any = None
        while True:
            try:
                op = gen.send(sent)
            except StopIteration as stop:
                return stop.value
            sent = None
            if isinstance(op, stash):
                if op.name not in self.stashable_names:
                    raise SkipDeclarationError(layer, op.name, "stash_undeclared",
                                               f"{layer} stashed {op.name!r} without declaring it: add it to "
                                               f"@skippable(stash=[...])")
                tracker.save(self.namespaced(op.name), op.tensor)
                stashed.add(op.name)
            elif isinstance(op, pop):
                if op.name not in self.poppable_names:
                    raise SkipDeclarationError(layer, op.name, "pop_undeclared",
                                               f"{layer} popped {op.name!r} without declaring it: add it to "
                                               f"@skippable(pop=[...])")
                sent = tracker.load(self.namespaced(op.name), layer)
                popped.add(op.name)
            else:
                raise TypeError(f"{layer}.forward yielded {op!r}; a skippable forward yields stash(name, tensor) "
                                "or pop(name)")


def skippable(stash: Iterable[str] = (), pop: Iterable[str] = ()) -> Callable[[Type[nn.Module]], Type[Skippable]]:
    """Class decorator: the layer's ``forward`` may ``yield stash(name, t)`` for ``stash`` names, ``yield pop(name)``
    for ``pop`` names.

    Returns a :class:`Skippable` subclass whose instances wrap an instance of
    the decorated class (constructed with the same arguments).
    """
    stashable, poppable = frozenset(stash), frozenset(pop)

    def wrap(module_cls: Type[nn.Module]) -> Type[Skippable]:
        attrs = {"module_cls": module_cls, "stashable_names": stashable, "poppable_names": poppable,
                 "__module__": module_cls.__module__, "__doc__": module_cls.__doc__}
        return type(module_cls.__name__, (Skippable,), attrs)
    return wrap
