"""Streams and device events: phase 2 of the two-phase sync (no-ops on CPU).

A task's stream spec is ``None`` (the device's default stream), a name (one
``torch.cuda.Stream`` per name per device, created on first use and reused),
or a torch stream object used as given. On a CPU device there is no device
queue: a stream is just a name, events are ``None`` and waiting on them does
nothing, so CPU signals alone carry the order and the same engine runs on
both.

Device events order *device* work: the producer records an event on its
stream after launching its kernels, and the consumer makes its own stream
wait on that event before launching its kernels (``stream.wait_event``),
without blocking the CPU.

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
from typing import Any, ContextManager, Dict, Hashable, Iterable, List, Optional, Sequence, Union

import torch

from .plan import StreamSpec, stream_name
from .reach import reachable_objects

__all__ = ["resolve_device", "StreamPool", "set_thread_device"]


def resolve_device(device: Union[int, str, torch.device, None]) -> torch.device:
    """The ``torch.device`` a pipeline runs on.

    An integer means CUDA device ``device`` when CUDA is available and the CPU
    otherwise (so code written for a GPU runs unchanged on a CPU-only machine);
    a string or ``torch.device`` is taken literally.

    Parameters
    ----------
    device : int, str, torch.device or None
        ``None`` is the same as ``0``.

    Returns
    -------
    torch.device

    Raises
    ------
    RuntimeError
        A CUDA device was named explicitly but CUDA is not available, or the
        index is out of range.
    ValueError
        The device type is neither ``cpu`` nor ``cuda``.

    Examples
    --------
    >>> resolve_device("cpu")
    device(type='cpu')
    >>> resolve_device(0) == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    True
    """
    if device is None:
        device = 0
    if isinstance(device, int) and not isinstance(device, bool):
        if torch.cuda.is_available():
            dev = torch.device("cuda", device)
        else:
            return torch.device("cpu")
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device {device!r} is not a device: {exc}; use 'cpu', 'cuda', 'cuda:N' or an "
                             "integer") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ValueError(f"SWPipeline runs on 'cpu' or 'cuda' devices, got {dev}")
    if not torch.cuda.is_available():
        raise RuntimeError(f"device {dev} was requested but CUDA is not available; use device='cpu' "
                           "(or an integer, which falls back to the CPU)")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if not 0 <= index < torch.cuda.device_count():
        raise RuntimeError(f"device cuda:{index} does not exist; this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def set_thread_device(device: torch.device) -> None:
    """Make ``device`` the calling thread's current CUDA device (nothing on CPU).

    CUDA's current device is per thread, so every worker calls this first.

    Examples
    --------
    >>> set_thread_device(torch.device("cpu"))
    """
    if device.type == "cuda":
        torch.cuda.set_device(device)


class StreamPool:
    """Resolves stream specs to streams on one device and makes/waits device events.

    Parameters
    ----------
    device : torch.device

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

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        self._named: Dict[str, Any] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()  # set by interrupt(): ends the pool's device waits

    def resolve(self, spec: StreamSpec) -> Optional[Any]:
        """The stream object for a spec; ``None`` on CPU.

        ``None`` is the device's default stream, a name gets one stream per
        name (created on first use, then reused), and a stream object is used
        as given.
        """
        if not self.is_cuda:
            return None
        if spec is None:
            return torch.cuda.default_stream(self.device)
        if isinstance(spec, str):
            stream = self._named.get(spec)
            if stream is None:
                with self._lock:  # two workers may ask for a new name at once
                    stream = self._named.get(spec)
                    if stream is None:
                        stream = torch.cuda.Stream(device=self.device)
                        stream.swpipe_name = spec
                        self._named[spec] = stream
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
            stream = self.resolve(spec)
            return (str(stream.device), stream.stream_id)
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
        if stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(stream)

    def record(self, stream: Optional[Any]) -> Optional[Any]:
        """Record and return a new device event on ``stream`` (``None`` on CPU)."""
        if stream is None:
            return None
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def batch_ready(self, batch: Any) -> Optional[Any]:
        """An event after the device work that made ``batch``, if it holds CUDA tensors; else ``None``.

        Called on the thread that fetched the batch, right after the fetch.
        A data iterator that builds CUDA tensors (``.to("cuda",
        non_blocking=True)``, a generator on the GPU) enqueues that work on
        the *fetching* thread's current stream; a task reading the batch on
        another stream must wait for it (what TorchRec gets by fetching on its
        memcpy stream). A batch of CPU tensors needs no event: waiting for one
        would order the copy of the next batch after every kernel already
        queued on the caller's stream and end the copy/compute overlap.

        Examples
        --------
        >>> StreamPool(torch.device("cpu")).batch_ready(torch.ones(2)) is None
        True
        """
        if not self.is_cuda or not _holds_cuda(batch):
            return None
        return self.record(torch.cuda.current_stream(self.device))

    @staticmethod
    def wait(stream: Optional[Any], event: Optional[Any]) -> None:
        """Make ``stream`` wait for ``event`` on the device; the CPU does not block."""
        if stream is not None and event is not None:
            stream.wait_event(event)

    @staticmethod
    def query(event: Optional[Any]) -> bool:
        """Whether the device work before ``event`` has completed (always true on CPU)."""
        return event is None or event.query()

    def fence(self, streams: Iterable[Optional[Any]] = ()) -> List[Any]:
        """Record an event on the default stream, every pool stream and ``streams``; ``[]`` on CPU.

        Once they have all completed, every kernel launched on those streams
        before the call has completed. Raises whatever CUDA raises (a sticky
        error); callers on failure paths catch it.
        """
        if not self.is_cuda:
            return []
        seen: Dict[Hashable, Any] = {}
        with self._lock:
            named = list(self._named.values())
        for stream in [torch.cuda.default_stream(self.device), *named, *streams]:
            if stream is not None:
                seen.setdefault((str(stream.device), stream.stream_id), stream)
        return [self.record(stream) for stream in seen.values()]

    def wait_events(self, events: Sequence[Optional[Any]], timeout: float,
                    wake: Optional[threading.Event] = None) -> bool:
        """Wait until ``events`` have all completed, at most ``timeout`` s or until ``wake`` is set; whether they did.

        CUDA has no timed wait on an event (``event.synchronize()`` blocks
        until the kernels finish, forever if a dead NCCL peer holds them), so
        the device state is read with ``event.query()``; between reads the
        caller blocks on ``wake`` (default: this pool's, set by
        :meth:`interrupt`) for a pause that grows from 20 us to 1 ms. Setting
        ``wake`` ends the wait at once (the engine sets its run's when the
        run is cancelled, so a failure elsewhere is not held up by a hung
        device).

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
        pending = [ev for ev in events if ev is not None]
        deadline = time.monotonic() + timeout
        pause = 2e-5
        while pending:
            pending = [ev for ev in pending if not ev.query()]
            if not pending:
                break
            left = deadline - time.monotonic()
            if left <= 0 or wake.wait(min(pause, left)):
                return False
            pause = min(pause * 2, 1e-3)
        return True

    def interrupt(self) -> None:
        """End every wait of :meth:`wait_events` on this pool that uses its own ``wake`` (they report not done)."""
        self._wake.set()

    def synchronize(self, timeout: float = threading.TIMEOUT_MAX) -> bool:
        """Wait (polling, at most ``timeout`` s) for all work on the pool's streams; whether it completed.

        Always true on CPU.
        """
        return self.wait_events(self.fence(), timeout)


_WALK_LIMIT = 1000  # objects a batch is searched through for a CUDA tensor; past it, assume one


def _holds_cuda(obj: Any) -> bool:
    """Whether a CUDA tensor is reachable from ``obj`` (:func:`swpipe_core.reach.reachable_objects`).

    Examples
    --------
    >>> _holds_cuda({"x": [torch.ones(1), (2, "a")]}), _holds_cuda(None)
    (False, False)
    """
    for n, item in enumerate(reachable_objects([obj], _WALK_LIMIT + 1)):
        if n >= _WALK_LIMIT:
            return True  # too big to search every iteration: wait (safe, maybe slower)
        if isinstance(item, torch.Tensor) and item.is_cuda:
            return True
    return False
