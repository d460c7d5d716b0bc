"""The fake device's queues: streams (an executor thread each), events and the record of every launch.

A stream runs the work enqueued on it in order, on its own thread; an event
stands for its latest record, a token at a point of a stream's queue, and
belongs to the device of its first record; ``wait`` makes a stream wait for
the latest record made before it.
"""

from __future__ import annotations

import collections
import random
import threading
from typing import Callable, Deque, Dict, Hashable, List, NamedTuple, Optional

from swpipe_core.engine.device import Device

from swpipe.testing.races import Access


__all__ = ["FakeCudaError", "FakeDeviceHang", "EventDeviceError", "Launch", "FakeStream", "FakeEvent"]


class FakeCudaError(RuntimeError):
    """A sticky error of the fake device (as ``CUDA error: ...``): every later call on the device raises it.

    ``kernel`` and ``stream`` name the kernel that failed, where one did (``None`` otherwise).
    """

    def __init__(self, message: str, kernel: Optional[str] = None, stream: Optional[str] = None) -> None:
        self.kernel, self.stream = kernel, stream
        super().__init__(message)


class FakeDeviceHang(RuntimeError):
    """A host call that blocks on the device (``synchronize``, ``item``) waited past ``FakeCuda.hang_timeout_s``.

    On a real GPU that call would block forever (a kernel that never
    completes); the fake raises instead so a test fails rather than hangs.
    ``call`` names the host call, ``timeout_s`` how long it waited.
    """

    def __init__(self, message: str, call: str = "", timeout_s: Optional[float] = None) -> None:
        self.call, self.timeout_s = call, timeout_s
        super().__init__(message)


class EventDeviceError(RuntimeError):
    """An event recorded on a stream of another device than its first record's (CUDA refuses it, not sticky).

    As ``torch.cuda.Event.record``: "Event device 0 does not match recording stream's device 1."

    Attributes
    ----------
    event_device, stream_device : int
        The event's device (of its first record) and the device of the stream it was recorded on now.
    """

    def __init__(self, event_device: int, stream_device: int) -> None:
        self.event_device, self.stream_device = event_device, stream_device
        super().__init__(f"Event device {event_device} does not match recording stream's device {stream_device}.")


class Launch(NamedTuple):
    """One kernel launch: who (``label``), where (``stream``), from which host ``thread``, and its ``order`` stamp."""

    label: str
    stream: str
    thread: str
    order: Access

    def before(self, other: "Launch") -> bool:
        """Whether CUDA's rules run this kernel before ``other`` (stream order, event waits, host syncs)."""
        return self.order.before(other.order)


class _Token:
    """One record of an event: done once its stream reached it."""

    __slots__ = ("done", "time", "clock")

    def __init__(self, clock: Dict[Hashable, int]) -> None:
        self.done = False
        self.time = 0.0
        self.clock = clock


class FakeStream:
    """A stream of a fake device: a FIFO queue run by its own executor thread (started on first use).

    Attributes
    ----------
    stream_id : int
        0 for the default stream, 1.. for the device's pool of streams.
    names : list of str
        The stream names the engine resolved to this stream, in order (more than one: they share one queue).
    label : str
        How reports name it: its first name, ``"default"``, or ``"stream<id>"``.
    """

    def __init__(self, device: Device, stream_id: int, name: Optional[str] = None) -> None:
        self._dev = device
        self.stream_id = stream_id
        self.device = device.torch_device
        self.key = (str(self.device), stream_id)
        self.names: List[str] = []
        self.label = "default" if stream_id == 0 else f"stream{stream_id}"
        if name:
            self.add_name(name)
        self._queue: Deque[Callable[[], None]] = collections.deque()
        self._ready = threading.Condition(device.fake._mutex)  # this executor's wake-up: work was enqueued
        self._thread: Optional[threading.Thread] = None
        self._rng = random.Random(hash((device.fake.seed, device.index, stream_id)))
        self._vnow = 0.0  # with a FakeCuda clock: when the work run so far ends, on that clock (executor only)

    def __repr__(self) -> str:
        return f"<FakeStream {self.device}/{self.label}>"

    def add_name(self, name: str) -> None:
        """A stream name now resolves to this stream; the first one names it in reports (``swpipe_name``)."""
        if not self.names:
            self.label = self.swpipe_name = name
        self.names.append(name)

    def wait_event(self, event: "FakeEvent") -> None:
        self._dev.wait(self, event)

    def wait_stream(self, other: "FakeStream") -> None:
        """Work enqueued on this stream from now on waits for the work enqueued on ``other`` so far (the host does
        not block), as ``torch.cuda.Stream.wait_stream``."""
        event = FakeEvent(other._dev)
        event.record(other)
        self._dev.wait(self, event)

    def query(self) -> bool:
        event = FakeEvent(self._dev)
        event.record(self)
        return event.query()

    def synchronize(self) -> None:
        event = FakeEvent(self._dev)
        event.record(self)
        event.synchronize()

    # -- the executor -------------------------------------------------------------------------------------
    def _enqueue(self, op: Callable[[], None]) -> None:
        fake = self._dev.fake
        with fake._cv:
            if fake._closed:
                raise FakeCudaError("the fake device was closed")
            self._queue.append(op)
            if self._thread is None:
                self._thread = threading.Thread(target=self._execute, name=f"fakecuda{self._dev.index}-{self.label}",
                                                daemon=True)
                fake._threads.append(self._thread)
                fake._streams.append(self)
                self._thread.start()
            self._ready.notify()

    def _execute(self) -> None:
        fake = self._dev.fake
        while True:
            with self._ready:
                while not self._queue and not fake._closed:
                    self._ready.wait()
                if fake._closed:
                    return
                op = self._queue.popleft()
            op()

    def _advance(self, launched: float, seconds: float) -> float:
        """On the fake's clock: work launched at ``launched`` that lasts ``seconds`` runs now; when it ends."""
        self._vnow = max(self._vnow, launched) + seconds
        return self._vnow

    def _delay(self) -> float:
        limit = self._dev.fake.max_delay_s
        return self._rng.uniform(0.0, limit) if limit > 0 else 0.0


class FakeEvent:
    """An event of a fake device (``torch.cuda.Event``'s methods): the latest record is what it stands for.

    As on CUDA it belongs to the device of its first record (``device_index``, ``None`` before); a record on a
    stream of another device raises :class:`EventDeviceError`. ``query()`` says whether the work is done and
    orders nothing (its answer is timing); ``synchronize()`` orders the calling thread's later work after it.
    """

    def __init__(self, device: Device, enable_timing: bool = False) -> None:
        self._dev = device
        self.enable_timing = enable_timing
        self.device_index: Optional[int] = None
        self._token: Optional[_Token] = None

    def record(self, stream: Optional[FakeStream] = None) -> None:
        self._dev.record(self, stream if stream is not None else self._dev.current_stream())

    def query(self) -> bool:
        return self._dev.query(self)

    def synchronize(self) -> None:
        self._dev.fake._block_on(self._token, f"{self!r}.synchronize()")
        self._dev.fake._observe(self._token)

    def wait(self, stream: Optional[FakeStream] = None) -> None:
        self._dev.wait(stream if stream is not None else self._dev.current_stream(), self)

    def elapsed_time(self, end: "FakeEvent") -> float:
        """Milliseconds between two completed records, as ``torch.cuda.Event.elapsed_time``."""
        return self._dev.elapsed_s(self, end) * 1e3
