"""Which layer stashes and which pops each skip: the check of a whole model and the routes between partitions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from torch import nn

from swpipe.gpipe.errors import SkipLayoutError
from swpipe.gpipe.skip.skippable import Skippable
from swpipe.gpipe.skip.tracker import SkipKey

__all__ = ["verify_skippables", "SkipRoutes", "skip_routes"]


def verify_skippables(module: nn.Sequential) -> None:
    """Check that every skip name of ``module``'s layers is stashed once and popped once, later.

    Parameters
    ----------
    module : nn.Sequential

    Raises
    ------
    SkipLayoutError
        A ``TypeError`` whose ``problems`` lists each ``(layer, name, kind)``
        found (all of them, not the first).

    Examples
    --------
    >>> from swpipe.gpipe.skip import skippable
    >>> @skippable(stash=["x"])
    ... class A(nn.Module):
    ...     pass
    >>> try:
    ...     verify_skippables(nn.Sequential(A()))
    ... except SkipLayoutError as err:
    ...     err.problems
    [(None, 'x', 'never_popped')]
    """
    problems: List[Tuple[Optional[str], str, str]] = []
    lines: List[str] = []
    stashed: Dict[SkipKey, str] = {}
    popped: Dict[SkipKey, str] = {}

    def problem(layer: Optional[str], name: str, kind: str, line: str) -> None:
        problems.append((layer, name, kind))
        lines.append(line)

    for layer_name, layer in module.named_children():
        if not isinstance(layer, Skippable):
            continue
        for name in sorted(layer.stashable_names & layer.poppable_names):
            problem(layer_name, name, "both", f"'{layer_name}' declared {name!r} both as stashable and as poppable")
        for key, name in sorted(layer.keys(stashed=True).items(), key=lambda kv: kv[1]):
            if name in layer.poppable_names:
                continue
            if key in stashed:
                problem(layer_name, name, "stash_again", f"'{layer_name}' redeclared {name!r} as stashable; "
                        f"'{stashed[key]}' stashes it already (isolate the two with a Namespace)")
            else:
                stashed[key] = layer_name
        for key, name in sorted(layer.keys(stashed=False).items(), key=lambda kv: kv[1]):
            if name in layer.stashable_names:
                continue
            if key in popped:
                problem(layer_name, name, "pop_again", f"'{layer_name}' redeclared {name!r} as poppable; "
                        f"'{popped[key]}' pops it already (isolate the two with a Namespace)")
            elif key not in stashed:
                problem(layer_name, name, "pop_unstashed",
                        f"'{layer_name}' declared {name!r} as poppable but it was not stashed by an earlier layer")
            else:
                popped[key] = layer_name
    for key in stashed:
        if key not in popped:
            problem(None, key[1], "never_popped", f"'{stashed[key]}' stashes {key[1]!r} but no later layer declared "
                    f"{key[1]!r} as poppable")
    if problems:
        raise SkipLayoutError(problems, lines)


@dataclass
class SkipRoutes:
    """The skips that cross partitions: ``(key, from partition, to partition)`` for each."""

    routes: List[Tuple[SkipKey, int, int]] = field(default_factory=list)

    def incoming(self, j: int) -> List[Tuple[SkipKey, int]]:
        """Skips partition ``j`` pops that an earlier partition stashed: ``(key, source)``."""
        return [(key, src) for key, src, dst in self.routes if dst == j]

    def outgoing(self, j: int) -> List[Tuple[SkipKey, int]]:
        """Skips partition ``j`` stashes for a later one: ``(key, destination)``."""
        return [(key, dst) for key, src, dst in self.routes if src == j]


def skip_routes(partitions: Sequence[nn.Sequential]) -> SkipRoutes:
    """The skips between partitions (the model passed :func:`verify_skippables`)."""
    where: Dict[SkipKey, int] = {}
    routes = []
    for j, partition in enumerate(partitions):
        for layer in partition.children():
            if isinstance(layer, Skippable):
                for key in layer.keys(stashed=True):
                    where[key] = j
    for j, partition in enumerate(partitions):
        for layer in partition.children():
            if isinstance(layer, Skippable):
                for key in layer.keys(stashed=False):
                    if key in where and where[key] != j:
                        routes.append((key, where[key], j))
    return SkipRoutes(routes)
