"""The simulator's vocabulary: the kinds of event on its heap, the waits it records, the stop it raises."""

from __future__ import annotations

from typing import Dict, NamedTuple, Tuple

__all__ = ["SimDeadlock", "SimCut", "Stall", "HOST_END", "DEV_END", "ENQUEUE"]

# the kinds of event on the heap: a host part ends, a device part ends, the main thread enqueues a period
HOST_END, DEV_END, ENQUEUE = 0, 1, 2


class SimDeadlock(RuntimeError):
    """The simulated plan stopped making progress (every worker waits on something that never comes).

    Attributes
    ----------
    period : int
        The period that could not be enqueued.
    threads : dict
        ``{thread group: (task, iteration)}`` each thread holds.
    streams : dict
        ``{stream: (task, iteration)}`` at the head of each stream.
    """

    def __init__(self, period: int, threads: Dict[str, Tuple[str, int]], streams: Dict[str, Tuple[str, int]]) -> None:
        self.period, self.threads, self.streams = period, dict(threads), dict(streams)
        parts = [f"thread {g} holds {t}(iter {i})" for g, (t, i) in self.threads.items()]
        parts += [f"stream {s} head {t}(iter {i})" for s, (t, i) in self.streams.items()]
        super().__init__(f"the simulated plan stopped before period {period}: " + ("; ".join(parts) or
                         "nothing is runnable") + ". validate(plan) should have rejected it; please report this plan")

    def __reduce__(self):
        return (type(self), (self.period, self.threads, self.streams))


class SimCut(RuntimeError):
    """The run was stopped by its caller's check (a search's deadline passed) before it ended.

    Attributes
    ----------
    events : int
        The events run before the check that stopped it.
    at_s : float
        The simulated time reached then.
    """

    def __init__(self, events: int, at_s: float) -> None:
        self.events, self.at_s = events, at_s
        super().__init__(f"the simulation was stopped by its check after {events} events, at {at_s:g} s simulated")

    def __reduce__(self):
        return (type(self), (self.events, self.at_s))


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
