"""Streams and device events through the device seam: phase 2 of the two-phase sync (no-ops on CPU).

A task's stream spec is ``None`` (the device's default stream), a name (one
stream of its own per name per device, :meth:`Device.new_stream
<swpipe_core.engine.device.Device.new_stream>`), or a stream object used as given.
On a CPU device there is no device queue: a stream is just a name, events
are ``None`` and waiting on them does nothing, so CPU signals alone carry the
order and the same engine runs on both.

Device events order *device* work: the producer records an event on its
stream after launching its kernels, and the consumer makes its own stream
wait on that event before launching its kernels (``wait``), without blocking
the CPU. Events come from a pool and go back to it once the work they mark
has completed, so a long run creates a bounded number of them.

Stream identity is the *resolved* stream: :meth:`StreamPool.key` gives
(device, stream id) on CUDA, so two specs that end up on one stream need no
device wait and two that do not always get one, whatever they are called.
Waiting for device work from the host is a poll with a deadline
(:meth:`StreamPool.wait_events`), never an unbounded synchronise: a kernel
that never finishes (a dead NCCL peer) must not hang the caller.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, ContextManager, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

import torch

from swpipe_core.engine.device import Device, as_device, resolve_device
from swpipe_core.plan import StreamSpec, stream_name
from swpipe_core.engine.reach import reachable_objects

__all__ = ["resolve_device", "StreamPool", "devices_holding"]

_NULL = contextlib.nullcontext()


class StreamPool:
    """Resolves stream specs to streams on one device and makes/waits device events.

    Parameters
    ----------
    device : torch.device, str, int or Device
        Anything :func:`swpipe_core.engine.device.as_device` takes.

    Examples
    --------
    On a CPU device a stream is a name and events are no-ops:

    >>> pool = StreamPool(torch.device("cpu"))
    >>> pool.resolve("memcpy") is None, pool.name("memcpy"), pool.record(None) is None
    (True, 'memcpy', True)
    >>> pool.wait(None, None)
    >>> with pool.use(None):
    ...     pass
    """

    def __init__(self, device: Any) -> None:
        self.dev: Device = as_device(device)
        self.device = self.dev.torch_device
        self.is_cuda = self.dev.is_async  # CUDA semantics: a real GPU or swpipe.testing's fake
        self._named: Dict[str, Any] = {}
        self._lock = threading.Lock()
        self._free: Dict[bool, List[Any]] = {False: [], True: []}  # events whose work completed, by timing
        self._wake = threading.Event()  # set by interrupt(): ends the pool's device waits

    def resolve(self, spec: StreamSpec) -> Optional[Any]:
        """The stream object for a spec; ``None`` on CPU.

        ``None`` is the device's default stream, a name gets the device's
        stream of that name (created on first use, then reused), and a stream
        object is used as given.
        """
        if not self.is_cuda:
            return None
        if spec is None:
            return self.dev.default_stream()
        if isinstance(spec, str):
            stream = self._named.get(spec)
            if stream is None:
                with self._lock:  # two workers may ask for a new name at once
                    stream = self._named.get(spec)
                    if stream is None:
                        stream = self._named[spec] = self.dev.new_stream(spec)
            return stream
        return spec

    def key(self, spec: StreamSpec) -> Hashable:
        """Identity of the stream ``spec`` resolves to: equal keys mean one device queue.

        On CUDA ``("cuda:<index>", stream_id)`` of the resolved stream. On a
        CPU device there is no stream to resolve, so the key is symbolic:
        ``None`` and CPU stream objects are the host's one queue, a name is
        its own pool stream, a stream object of another device is
        ``(device, stream_id)``.

        Examples
        --------
        >>> pool = StreamPool(torch.device("cpu"))
        >>> pool.key(None), pool.key("memcpy")
        (('cpu', 0), ('named', 'memcpy'))
        >>> pool.key(torch.Stream(stream_id=0, device_index=1, device_type=1))
        ('cuda:1', 0)
        """
        if self.is_cuda:
            return self.dev.stream_key(self.resolve(spec))
        if spec is None:
            return ("cpu", 0)
        if isinstance(spec, str):
            return ("named", spec)
        device = str(spec.device)
        return ("cpu", 0) if device.startswith("cpu") else (device, spec.stream_id)

    @staticmethod
    def name(spec: StreamSpec) -> str:
        """Readable name of a stream spec (``"default"`` for ``None``)."""
        return stream_name(spec)

    def use(self, stream: Optional[Any]) -> ContextManager:
        """Context manager making ``stream`` current (a no-op on CPU)."""
        return self.dev.use(stream) if stream is not None else _NULL

    def record(self, stream: Optional[Any], timing: bool = False) -> Optional[Any]:
        """Record an event of the pool on ``stream`` and return it (``None`` on CPU).

        Give it back with :meth:`recycle` once the work it marks has completed
        and nothing will wait on it again.
        """
        if stream is None:
            return None
        free = self._free[timing]
        try:
            event = free.pop()
        except IndexError:
            event = self.dev.event(timing=timing)
        self.dev.record(event, stream)
        return event

    def recycle(self, events: Iterable[Optional[Any]], timing: bool = False) -> None:
        """Give back events whose recorded work has completed (re-recording one moves it to new work)."""
        self._free[timing].extend(ev for ev in events if ev is not None)

    def batch_ready(self, batch: Any) -> Tuple[Any, ...]:
        """Events after the device work that made ``batch``, one per device holding part of it; ``()`` if none.

        Called on the thread that fetched the batch, right after the fetch.
        A data iterator that builds device tensors (``.to("cuda",
        non_blocking=True)``, a generator on the GPU) enqueues that work on
        the *fetching* thread's current stream *of the device the tensors are
        on* (the thread's current device, which need not be the pipeline's);
        a task reading the batch on another stream must wait for it (what
        TorchRec gets by fetching on its memcpy stream). So an event is
        recorded on the fetching thread's current stream of each device that
        holds a tensor of the batch (a stream may wait for an event of
        another device). A batch of CPU tensors needs no event: waiting for
        one would order the copy of the next batch after every kernel
        already queued on the caller's stream and end the copy/compute
        overlap.

        Examples
        --------
        >>> StreamPool(torch.device("cpu")).batch_ready(torch.ones(2))
        ()
        """
        if not self.is_cuda:
            return ()
        events = []
        for dev in devices_holding(self.dev, batch):
            if dev is self.dev:
                events.append(self.record(dev.current_stream()))
            else:  # an event belongs to one device: another device's is made there, and not pooled
                event = dev.event()
                dev.record(event, dev.current_stream())
                events.append(event)
        return tuple(events)

    def follow_caller(self, streams: Iterable[Optional[Any]]) -> None:
        """Make each of ``streams`` wait for the work the calling thread enqueued so far on its current stream.

        A run starts after what its caller did before it (a model moved with
        ``non_blocking=True``, a warm-up step, an optimizer's state set up on
        the default stream): without this, a task on another stream could
        read parameters those kernels are still writing. One event, one
        device wait per other stream; the host does not block; nothing on CPU.
        """
        if not self.is_cuda:
            return
        caller = self.dev.current_stream()
        key = self.dev.stream_key(caller)
        others = {self.dev.stream_key(s): s for s in streams if s is not None}
        others.pop(key, None)
        if others:
            event = self.record(caller)
            for stream in others.values():
                self.dev.wait(stream, event)

    def wait(self, stream: Optional[Any], event: Optional[Any]) -> None:
        """Make ``stream`` wait for ``event`` on the device; the CPU does not block."""
        if stream is not None and event is not None:
            self.dev.wait(stream, event)

    def query(self, event: Optional[Any]) -> bool:
        """Whether the device work before ``event`` has completed (always true on CPU); a look, not an order.

        The answer is this moment's timing: code that acts on it (frees what
        the work read) asks :meth:`completed`, which says so to the device.
        """
        return event is None or self.dev.query(event)

    def completed(self, events: Sequence[Optional[Any]]) -> bool:
        """Whether the device work before every one of ``events`` has completed; if so the caller acts on it.

        The calling thread then orders what it does next (free the memory
        that work read, launch after it) after that work: on a GPU that is
        just true; a device that checks orders (``swpipe.testing.FakeCuda``)
        is told (:meth:`Device.observed <swpipe_core.engine.device.Device.observed>`),
        since a bare :meth:`query` orders nothing.

        Examples
        --------
        >>> StreamPool(torch.device("cpu")).completed([None, None])
        True
        """
        pending = [ev for ev in events if ev is not None]
        if not all(map(self.dev.query, pending)):
            return False
        if pending:
            self.dev.observed(pending)
        return True

    def fence(self, streams: Iterable[Optional[Any]] = ()) -> List[Any]:
        """Record an event on the default stream, every pool stream and ``streams``; ``[]`` on CPU.

        Once they have all completed, every kernel launched on those streams
        before the call has completed. Raises whatever the device raises (a
        sticky error); callers on failure paths catch it.
        """
        if not self.is_cuda:
            return []
        seen: Dict[Hashable, Any] = {}
        with self._lock:
            named = list(self._named.values())
        for stream in [self.dev.default_stream(), *named, *streams]:
            if stream is not None:
                seen.setdefault(self.dev.stream_key(stream), stream)
        return [self.record(stream) for stream in seen.values()]

    def wait_events(self, events: Sequence[Optional[Any]], timeout: float,
                    wake: Optional[threading.Event] = None) -> bool:
        """Wait until ``events`` have all completed, at most ``timeout`` s or until ``wake`` is set; whether they did.

        CUDA has no timed wait on an event (``event.synchronize()`` blocks
        until the kernels finish, forever if a dead NCCL peer holds them), so
        the device state is read with ``query``; between reads the caller
        blocks on ``wake`` (default: this pool's, set by :meth:`interrupt`)
        for a pause that grows from 20 us to 1 ms. Setting ``wake`` ends the
        wait at once (the engine sets its run's when the run is cancelled, so
        a failure elsewhere is not held up by a hung device).

        Examples
        --------
        >>> pool = StreamPool(torch.device("cpu"))
        >>> pool.wait_events([None], timeout=1.0)
        True
        >>> class Hung:
        ...     def query(self): return False
        >>> pool.wait_events([Hung()], timeout=0.01)
        False
        >>> cancelled = threading.Event()
        >>> cancelled.set()
        >>> pool.wait_events([Hung()], timeout=60.0, wake=cancelled)  # returns at once
        False
        """
        wake = self._wake if wake is None else wake
        waited = pending = [ev for ev in events if ev is not None]
        query = self.dev.query if self.is_cuda else (lambda ev: ev.query())
        deadline = time.monotonic() + timeout
        pause = 2e-5
        while pending:
            pending = [ev for ev in pending if not query(ev)]
            if not pending:
                break
            left = deadline - time.monotonic()
            if left <= 0 or wake.wait(min(pause, left)):
                return False
            pause = min(pause * 2, 1e-3)
        if waited and self.is_cuda:  # a wait until done is a synchronisation: the caller acts on it
            self.dev.observed(waited)
        return True

    def interrupt(self) -> None:
        """End every wait of :meth:`wait_events` on this pool that uses its own ``wake`` (they report not done)."""
        self._wake.set()

    def synchronize(self, timeout: float = threading.TIMEOUT_MAX) -> bool:
        """Wait (polling, at most ``timeout`` s) for all work on the pool's streams; whether it completed.

        Always true on CPU.
        """
        events = self.fence()
        done = self.wait_events(events, timeout)
        if done:
            self.recycle(events)
        return done


_WALK_LIMIT = 1000  # objects a batch is searched through for a CUDA tensor; past it, assume one


def devices_holding(dev: Device, obj: Any) -> List[Device]:
    """The devices whose memory is reachable from ``obj``, ``dev``'s kind only (:meth:`Device.memory_of`).

    The walk is :func:`swpipe_core.engine.reach.reachable_objects`; past
    ``_WALK_LIMIT`` objects it stops and assumes ``dev`` holds part of it
    (a wait that may be needless, never a missing one).

    Examples
    --------
    >>> from swpipe_core.engine.device import CpuDevice
    >>> devices_holding(CpuDevice(), {"x": [torch.ones(1), (2, "a")]})
    []
    """
    found: Dict[int, Device] = {}
    for n, item in enumerate(reachable_objects([obj], _WALK_LIMIT + 1)):
        if n >= _WALK_LIMIT:
            found.setdefault(id(dev), dev)  # too big to search every iteration: wait (safe, maybe slower)
            break
        owner = dev.memory_of(item)
        if owner is not None:
            found.setdefault(id(owner), owner)
    return list(found.values())
