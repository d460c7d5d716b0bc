"""Namespace: keeps the skip names of two copies of one skippable layer apart."""

from __future__ import annotations

import uuid
from typing import Any

__all__ = ["Namespace"]


class Namespace:
    """A namespace for skip names: ``layer.isolate(ns)`` makes its names distinct from the same names elsewhere.

    Two namespaces are different unless one is a copy of the other.

    Examples
    --------
    >>> import copy
    >>> a, b = Namespace(), Namespace()
    >>> a == b, copy.copy(a) == a, copy.copy(a) is a
    (False, True, False)
    """

    __slots__ = ("id",)

    def __init__(self) -> None:
        self.id = uuid.uuid4()

    def __repr__(self) -> str:
        return f"<Namespace '{self.id}'>"

    def __hash__(self) -> int:
        return hash(self.id)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Namespace) and self.id == other.id

    def __copy__(self) -> "Namespace":
        ns = Namespace.__new__(Namespace)
        ns.id = self.id
        return ns


#: The namespace of every skip name not isolated.
DEFAULT = Namespace()
