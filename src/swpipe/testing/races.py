"""Races between streams, found from the order CUDA guarantees, whatever the timing of a run.

A device's work is ordered only by its rules: a stream runs its work in
order; ``wait_event`` orders what the stream runs next after the latest
record of the event made before the wait; and a host thread that
*synchronised* with some work (``Event.synchronize``, ``Stream.synchronize``,
a device-wide ``synchronize``, a copy to the host such as ``.item()``, or a
query whose answer it acts on, which it says so through the device seam's
``observed``) orders everything *it* launches or frees afterwards after that
work. :class:`HappensBefore` keeps that order as a vector clock per stream and
per host thread, and checks every access of a block of device memory against
the block's earlier accesses: a write and any other access that the rules do
not order is a race, even when a run's timing happened to hide it.

Two things are deliberately not orders, as on a GPU:

* another thread's synchronisation. What thread A saw complete orders A's
  later work only; thread B launching later *in time* is luck, not order
  (the execution contract orders device work by streams and events alone).
* a bare ``query()``. Its answer is a fact about this run's timing; the same
  program may get ``False`` next time and launch anyway. ``torch.cuda._sanitizer``
  does not count it either.

A free is a write on the stream that allocated the block, as the caching
allocator treats it (the block goes back to that stream's pool at once, and
its next allocation there may overwrite it). This is the analysis of PyTorch's
stream sanitizer (``torch.cuda._sanitizer``) with frees kept (the sanitizer
forgets a tensor when it is freed, which is exactly when the caching
allocator's reuse bites) and with host threads apart (the sanitizer's host is
one).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Dict, Hashable, List, Optional, Sequence

__all__ = ["Access", "Race", "RaceError", "HappensBefore"]

Clock = Dict[Hashable, int]


@dataclass(frozen=True)
class Access:
    """One access of a block: who (``label``), where (``lane``: a stream, or a host thread for a free), how."""

    lane: Hashable
    seq: int
    clock: Clock = field(compare=False, repr=False)
    kind: str = "read"   # "read", "write" or "free"
    label: str = ""
    where: str = ""      # the stream's (or thread's) readable name

    def before(self, other: "Access") -> bool:
        """Whether the rules order this access before ``other``."""
        return self.seq <= other.clock.get(self.lane, 0)

    def describe(self) -> str:
        verb = {"read": "reads", "write": "writes", "free": "frees"}[self.kind]
        return f"{self.label or '?'} on {self.where} {verb}"


@dataclass(frozen=True)
class Race:
    """Two accesses of one block that no stream order, event wait or host synchronisation orders."""

    block: str
    first: Access
    second: Access

    def __str__(self) -> str:
        if self.second.kind == "free":
            return (f"{self.second.label or '?'} frees {self.block} on the host ({self.second.where}) while "
                    f"{self.first.describe()} it on the device with nothing ordering that work before the free: "
                    f"the caching allocator may hand the block to the next allocation on its stream at once. Keep it "
                    f"alive until that work has completed (ctx.keep_alive, Tensor.record_stream), or make its "
                    f"stream wait")
        return (f"{self.second.describe()} {self.block}, which {self.first.describe()}, with no device order "
                f"between them: add a dependency (or an event wait) from {self.first.label or '?'} to "
                f"{self.second.label or '?'}")


class RaceError(AssertionError):
    """Raised by :meth:`HappensBefore.check` (and ``FakeCuda.assert_no_races``); ``races`` lists them."""

    def __init__(self, races: Sequence[Race]) -> None:
        self.races = list(races)
        shown = "\n".join(f"  - {r}" for r in self.races[:10])
        more = f"\n  ... and {len(self.races) - 10} more" if len(self.races) > 10 else ""
        super().__init__(f"{len(self.races)} race(s) between streams:\n{shown}{more}")


class _BlockHistory:
    __slots__ = ("last_write", "reads")

    def __init__(self) -> None:
        self.last_write: Optional[Access] = None
        self.reads: List[Access] = []


class HappensBefore:
    """Vector clocks of streams and host threads, and every block's accesses checked against them.

    Lanes are hashable names: a stream's key for streams, a host thread's own
    token for threads. Every method is called by the fake device under its
    lock, at the moment the host issues the operation (the device order is
    fixed then; running the work later changes nothing).

    Examples
    --------
    A block written on stream ``"a"`` and read on ``"b"`` without a wait races;
    with an event wait it does not:

    >>> hb = HappensBefore()
    >>> w = hb.launch("host", "a", "write-it", "a")
    >>> hb.access("blk", w, "write")
    >>> hb.access("blk", hb.launch("host", "b", "read-it", "b"), "read")
    >>> [str(r).split(", with")[0] for r in hb.races]
    ['read-it on b reads blk, which write-it on a writes']
    >>> hb = HappensBefore()
    >>> hb.access("blk", hb.launch("host", "a", "write-it", "a"), "write")
    >>> token = hb.record("a")
    >>> hb.wait("b", token)
    >>> hb.access("blk", hb.launch("host", "b", "read-it", "b"), "read")
    >>> hb.races
    []
    """

    def __init__(self, keep: int = 1000) -> None:
        self._clocks: Dict[Hashable, Clock] = {}  # streams' and host threads' clocks
        self._blocks: Dict[Hashable, _BlockHistory] = {}
        self._keep = keep
        self.races: List[Race] = []
        self.count = 0  # races found, including those past ``keep`` (not stored)
        self._lock = threading.RLock()  # re-entrant: a free from the cyclic GC may run under it

    def _clock(self, lane: Hashable) -> Clock:
        clock = self._clocks.get(lane)
        if clock is None:
            clock = self._clocks[lane] = {}
        return clock

    @staticmethod
    def _join(into: Clock, other: Clock) -> None:
        for lane, seq in other.items():
            if into.get(lane, 0) < seq:
                into[lane] = seq

    def launch(self, host: Hashable, stream: Hashable, label: str, where: str) -> Access:
        """Host ``host`` enqueues one operation on ``stream``: its place in the order (an :class:`Access` stamp)."""
        with self._lock:
            clock = self._clock(stream)
            self._join(clock, self._clock(host))
            clock[stream] = clock.get(stream, 0) + 1
            return Access(stream, clock[stream], dict(clock), "read", label, where)

    def record(self, stream: Hashable) -> Clock:
        """An event recorded at the current end of ``stream``: the clock a later wait or completion joins."""
        with self._lock:
            clock = self._clock(stream)
            clock[stream] = clock.get(stream, 0) + 1
            return dict(clock)

    def wait(self, stream: Hashable, token: Optional[Clock]) -> None:
        """``stream`` waits for a recorded event (``None``: never recorded, orders nothing)."""
        if token is not None:
            with self._lock:
                self._join(self._clock(stream), token)

    def observe(self, host: Hashable, token: Optional[Clock]) -> None:
        """Host ``host`` synchronised with the work before an event: what *it* does next comes after that work.

        Only ``host``: another thread that launches later in time is not
        ordered by it (nothing but luck made it later), and neither is any
        thread by a bare ``query()`` (the fake never calls this for one).
        """
        if token is not None:
            with self._lock:
                self._join(self._clock(host), token)

    def free_stamp(self, host: Hashable, stream: Hashable, also: Sequence[Clock], label: str, where: str) -> Access:
        """Where a free by ``host`` of a block of ``stream``'s pool falls: after what both (and ``also``) know."""
        with self._lock:
            clock = dict(self._clock(stream))
            self._join(clock, self._clock(host))
            for other in also:
                self._join(clock, other)
            return Access(stream, clock.get(stream, 0), clock, "free", label, where)

    def access(self, block: Hashable, stamp: Access, kind: str, name: Optional[str] = None) -> None:
        """Check an access of ``block`` (``"read"``, ``"write"`` or ``"free"``) against the block's history."""
        access = Access(stamp.lane, stamp.seq, stamp.clock, kind, stamp.label, stamp.where)
        name = str(block) if name is None else name
        with self._lock:
            hist = self._blocks.get(block)
            if hist is None:
                hist = self._blocks[block] = _BlockHistory()
            if hist.last_write is not None and not hist.last_write.before(access):
                self._race(name, hist.last_write, access)
            if kind == "read":
                hist.reads.append(access)
                return
            for read in hist.reads:
                if not read.before(access):
                    self._race(name, read, access)
            hist.last_write, hist.reads = access, []

    def _race(self, block: str, first: Access, second: Access) -> None:
        self.count += 1
        if len(self.races) < self._keep:
            self.races.append(Race(block, first, second))

    def check(self) -> None:
        """Raise :class:`RaceError` if any race was found."""
        if self.races:
            raise RaceError(self.races)
