"""The simulator's vocabulary: the kinds of event on its heap, the waits it records, the stop it raises."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["SimDeadlock", "Stall", "HOST_END", "DEV_END", "ENQUEUE"]

# the kinds of event on the heap: a host part ends, a device part ends, the main thread enqueues a period
HOST_END, DEV_END, ENQUEUE = 0, 1, 2


class SimDeadlock(RuntimeError):
    """The simulated plan stopped making progress (every worker waits on something that never comes)."""


class Stall(NamedTuple):
    """One wait of one task instance.

    ``part`` is ``"host"`` (waiting on its thread) or ``"device"`` (waiting on its
    stream); ``cause`` names what it waited for: ``"fifo:<group>"`` (queued behind
    earlier tasks of its thread group), ``"dep:<task>"`` / ``"dep:<task>[i-N]"``
    (a CPU signal), ``"sequencer"``, ``"comm:<name>"``, ``"pcie"``,
    ``"stream:<name>"`` (device FIFO), ``"event:<task>"`` (a device event),
    ``"cores"`` (every core of the pool busy).
    """

    task: str
    iteration: int
    part: str
    cause: str
    seconds: float
