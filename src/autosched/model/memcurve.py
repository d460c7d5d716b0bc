"""Bytes alive over time, read from a list of changes: the one memory loop every simulator's prediction uses.

A simulated run says *when* bytes come and go; what it means for memory is one
list of changes and one walk over it. :class:`MemoryChanges` holds the changes of
a run, each at an instant:

* ``add(time, delta)``: an owner (a context, a rank, a partition) holds ``delta``
  more bytes (fewer when negative);
* ``add(time, transient=x)``: ``x`` bytes on top of the level at that instant only
  (an action's working memory, measured above what was alive when it started);
* ``release(time, owner)``: everything the owner holds is let go.

At one instant the changes apply in ``order`` (any comparable; lower first), then in
the order they were added. With ``clip=True`` an owner never holds less than
nothing (figures that free more than was added free what is there). The peak is the
most bytes alive at any instant, transients included, first reached where it is
reported.

The plan simulator's memory (:func:`autosched.model.memory.predict_memory`), the
pipeline-parallel simulator's per-rank peak (:func:`autosched.pp.simulate.pp_simulate`)
and GPipe's activation prediction (:func:`swpipe.gpipe.predict.activation_peaks`) each
write their lifetime rules as changes here and read the curve and peak back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Hashable, Iterator, List, NamedTuple, Tuple

__all__ = ["Change", "MemoryChanges", "MemoryPeak"]

# a level this much above the best so far is a new peak (float sums of the same bytes in another order differ by less)
_TOLERANCE = 1e-9


class Change(NamedTuple):
    """One change of the list: its instant, its place at that instant, the owner's bytes or a release."""

    time: float
    order: Any
    seq: int
    delta: float
    transient: float
    owner: Hashable
    release: bool


@dataclass(frozen=True)
class MemoryPeak:
    """The most bytes alive: how many, when first reached, and how many changes had been applied then.

    Attributes
    ----------
    bytes : float
    time : float
    applied : int
        The changes applied (in their walking order) when the peak was reached; a transient's peak
        is reached before its own change is applied.
    """

    bytes: float
    time: float
    applied: int


class MemoryChanges:
    """A run's memory as a list of timed changes per owner; its level curve and peaks.

    Parameters
    ----------
    clip : bool
        An owner never holds less than nothing (a free of more than it holds frees what it holds).

    Examples
    --------
    A forward keeps 100 bytes from its end (t=1) to its backward's end (t=3); the backward needs
    40 bytes more while it runs (from t=2):

    >>> mem = MemoryChanges()
    >>> mem.add(1.0, 100)
    >>> mem.add(2.0, transient=40)
    >>> mem.add(3.0, -100)
    >>> mem.peak()
    MemoryPeak(bytes=140, time=2.0, applied=1)
    >>> mem.curve()
    [(1.0, 100), (2.0, 100), (3.0, 0)]
    """

    def __init__(self, clip: bool = False) -> None:
        self.clip = clip
        self._changes: List[Change] = []

    def __len__(self) -> int:
        return len(self._changes)

    def add(self, time: float, delta: float = 0, *, transient: float = 0, order: Any = 0,
            owner: Hashable = None) -> None:
        """``owner`` holds ``delta`` more bytes from ``time`` on; ``transient`` more at ``time`` only."""
        self._changes.append(Change(time, order, len(self._changes), delta, transient, owner, False))

    def release(self, time: float, owner: Hashable, *, order: Any = 0) -> None:
        """Everything ``owner`` holds is let go at ``time``."""
        self._changes.append(Change(time, order, len(self._changes), 0, 0, owner, True))

    def walk(self) -> Iterator[Tuple[Change, float, float]]:
        """Each change in walking order with the total level just before it (plus its transient) and after it."""
        held: Dict[Hashable, float] = {}
        level: Any = 0
        for c in sorted(self._changes, key=lambda c: (c.time, c.order, c.seq)):
            before = held.get(c.owner, 0)
            new = 0 if c.release else before + c.delta
            if self.clip and new < 0:
                new = 0
            during = level + c.transient
            level += new - before
            held[c.owner] = new
            yield c, during, level

    def peak(self, owner: Any = ...) -> MemoryPeak:
        """The most bytes alive (of ``owner`` alone, when given), when first reached.

        Examples
        --------
        >>> mem = MemoryChanges()
        >>> mem.add(0.0, 5, owner="a"); mem.add(1.0, 7, owner="b"); mem.add(2.0, -7, owner="b")
        >>> mem.peak().bytes, mem.peak("a").bytes, mem.peak("b").time
        (12, 5, 1.0)
        """
        if owner is not ...:
            own = MemoryChanges(self.clip)
            own._changes = [c for c in self._changes if c.owner == owner]
            return own.peak()
        best, when, applied = 0, 0.0, 0
        for k, (c, during, after) in enumerate(self.walk()):
            if during > best + _TOLERANCE:
                best, when, applied = during, c.time, k
            if after > best + _TOLERANCE:
                best, when, applied = after, c.time, k + 1
        return MemoryPeak(best, when, applied)

    def owners(self) -> List[Hashable]:
        """The owners named, in the order first named."""
        return list(dict.fromkeys(c.owner for c in self._changes))

    def curve(self) -> List[Tuple[float, float]]:
        """``(time, bytes alive from that time on)``: a step function, one point per instant with a change."""
        out: List[Tuple[float, float]] = []
        for c, _, level in self.walk():
            if out and out[-1][0] == c.time:
                out[-1] = (c.time, level)
            else:
                out.append((c.time, level))
        return out
