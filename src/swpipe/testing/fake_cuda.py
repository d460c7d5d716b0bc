"""A CPU device with CUDA's semantics: run a multi-stream pipeline without a GPU and see its races.

:class:`FakeCuda` implements the device seam (:class:`swpipe_core.engine.device.Device`)
on threads, so every CUDA path of the engine runs on a CPU machine:

* each stream is an executor thread that runs the work enqueued on it in
  order; an event is a token recorded at a point of a stream's queue and
  belongs to the device of its first record (a record on another device's
  stream raises :class:`~swpipe.testing.fake_streams.EventDeviceError`, as on
  CUDA); ``wait`` makes a stream wait for the latest record made before it;
  ``query`` says whether that record has run, and orders nothing. The current
  stream is per thread (a new thread starts on the default stream), and so is
  the current device; a fake has as many devices as asked.
* streams come from a bounded pool per device (``streams_per_device``, 32 as
  in PyTorch), handed out round robin to every name the engine resolves and
  every :meth:`FakeCudaDevice.draw_stream` (what ``torch.cuda.Stream()`` and
  NCCL draw): past the pool, two names share one queue (a
  :class:`~swpipe_core.engine.device.SharedStreamWarning` says so) and a
  kernel that never completes on one holds the other.
* memory is blocks of host bytes behind :class:`FakeTensor` handles. Its
  caching allocator behaves as CUDA's: a block freed on the host (the last
  reference dropped) goes back at once to the pool of the stream that
  allocated it, and the next allocation of that size on that stream gets it
  and queues a *poison* kernel on that stream that overwrites it. A missing
  wait or an early free then gives wrong numbers, not just a wrong log.
* timing is adversarial on request: each kernel waits a seeded random delay
  (``max_delay_s``) before it runs.
* time can be virtual (``clock``, a host clock a test moves, as ``conftest.FakeClock``):
  each stream then keeps its own time on that clock. A kernel starts when its
  stream is free and the host has launched it (the host clock at the launch),
  a ``spin`` lasts its seconds there and every other kernel none, a record
  completes at its stream's time, a wait moves the stream to the event's, and
  a host that synchronises moves the clock to what it waited for. Event
  timings (``elapsed_s``) read that time: what a profiler measures is then
  the same on every run, whatever the machine's load.
* failures: :meth:`FakeKernels.hang` queues a kernel that never completes (until
  :meth:`FakeCuda.close`), :meth:`FakeKernels.fault` a sticky device error
  after which every call on the device raises, as after a CUDA error.
* the host learns only what it synchronises with: ``synchronize()``, a copy to
  the host (``to_host``, ``item``: a copy on the current stream, which the
  host waits for) and queries the engine acts on
  (:meth:`~swpipe_core.engine.device.Device.observed`) order *that thread's*
  later work; a non-blocking copy from pageable memory returns once the data
  is staged, the copy still in flight.
* a deterministic check besides the values: every kernel's reads and writes
  (a host read too), every free, record and wait feed
  :class:`~swpipe.testing.races.HappensBefore`, which reports each pair of
  accesses no stream order, event or the accessing thread's own
  synchronisation orders, naming the tasks (the engine labels its kernels
  ``Task(iteration)``), even when the timing of a run hid it.

The kernels tests and workloads need are in :class:`FakeKernels` (``device.kernels``;
:func:`swpipe.testing.kernels` gives the same set for a real CUDA device and
for the CPU).

Examples
--------
>>> import torch
>>> with FakeCuda(num_devices=1) as fake:
...     dev = fake.device(0)
...     k = dev.kernels
...     x = k.full(4, 2.0)
...     total = k.sum(x)
...     k.item(total)
8.0
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import weakref
from typing import Any, Callable, Dict, Hashable, Iterator, List, Optional, Tuple

import torch

from swpipe_core.engine.device import Device, warn_shared_stream

from swpipe.testing.fake_memory import FakeTensor, _Allocator, _Block
from swpipe.testing.fake_torch import FakeCudaTensor, host_tensor, move_module
from swpipe.testing.kernels import FakeKernels
from swpipe.testing.fake_streams import (EventDeviceError, FakeCudaError, FakeDeviceHang, FakeEvent, FakeStream, Launch,
                                         _Token)
from swpipe.testing.races import HappensBefore, RaceError

__all__ = ["FakeCuda", "FakeCudaDevice"]


class FakeCudaDevice(Device):
    """One device of a :class:`FakeCuda`: the seam's methods on executor threads. Pass it as ``device=``."""

    type = "cuda"
    is_async = True

    def __init__(self, fake: "FakeCuda", index: int) -> None:
        self.fake = fake
        self.index = index
        self._streams: List[FakeStream] = []  # the default stream, then the pool's streams as first drawn
        self._named: Dict[str, FakeStream] = {}
        self._pool: List[Optional[FakeStream]] = [None] * fake.streams_per_device
        self._next = 0  # the pool's round robin
        self._default = self._make(0)
        self._allocator = _Allocator(self)
        self.kernels = FakeKernels(self)

    def _make(self, stream_id: int) -> FakeStream:
        stream = FakeStream(self, stream_id)
        self._streams.append(stream)
        return stream

    # -- the calling thread -----------------------------------------------------------------------------------
    def set_current(self) -> None:
        self.fake._tls.device = self.index

    def default_stream(self) -> FakeStream:
        return self._default

    def current_stream(self) -> FakeStream:
        streams = getattr(self.fake._tls, "streams", None)
        return self._default if streams is None else streams.get(self.index, self._default)

    @contextlib.contextmanager
    def use(self, stream: Optional[FakeStream]) -> Iterator[None]:
        if stream is None:
            yield
            return
        tls = self.fake._tls
        streams = getattr(tls, "streams", None)
        if streams is None:
            streams = tls.streams = {}
        before = streams.get(stream._dev.index)
        streams[stream._dev.index] = stream
        try:
            yield
        finally:
            if before is None:
                del streams[stream._dev.index]
            else:
                streams[stream._dev.index] = before

    @contextlib.contextmanager
    def annotate(self, label: str) -> Iterator[None]:
        tls = self.fake._tls
        before = getattr(tls, "label", None)
        tls.label = label
        try:
            yield
        finally:
            tls.label = before

    # -- streams and events -----------------------------------------------------------------------------------
    def new_stream(self, name: str) -> FakeStream:
        """The stream of name ``name``: drawn from the pool once, then the same (a name past the pool warns)."""
        with self.fake._lock:
            stream = self._named.get(name)
            if stream is None:
                stream = self._named[name] = self.draw_stream()
                shared = bool(stream.names)
                stream.add_name(name)
                if shared:
                    warn_shared_stream(name, f"{self.torch_device} (FakeCuda)", stream.names[0])
        return stream

    def draw_stream(self) -> FakeStream:
        """The next stream of the device's pool, round robin: what ``torch.cuda.Stream()`` gives (NCCL draws too).

        Examples
        --------
        >>> with FakeCuda(num_devices=1, streams_per_device=2) as fake:
        ...     dev = fake.device(0)
        ...     a, b, c = dev.draw_stream(), dev.draw_stream(), dev.draw_stream()
        >>> a is c, a is b, a.stream_id, b.stream_id
        (True, False, 1, 2)
        """
        with self.fake._lock:
            k = self._next
            self._next = (k + 1) % len(self._pool)
            stream = self._pool[k]
            if stream is None:
                stream = self._pool[k] = self._make(k + 1)
        return stream

    def stream_key(self, stream: Any) -> Hashable:
        return stream.key

    def is_stream(self, obj: Any) -> bool:
        return isinstance(obj, FakeStream)

    def event(self, timing: bool = False) -> FakeEvent:
        self.fake._check()
        self.fake.events_created += 1
        return FakeEvent(self, timing)

    def record(self, event: FakeEvent, stream: FakeStream) -> None:
        self.fake._check()
        owner = stream._dev.index
        if event.device_index is None:
            event.device_index = owner  # an event belongs to the device of its first record
        elif event.device_index != owner:
            raise EventDeviceError(event.device_index, owner)
        event._token = stream._dev._record_token(stream)

    def _record_token(self, stream: FakeStream) -> _Token:
        fake = self.fake
        fake._check()
        token = _Token(fake.hb.record(stream.key))
        launched = fake._launched_at()

        def reached() -> None:
            with fake._cv:
                token.time = time.perf_counter() if launched is None else stream._advance(launched, 0.0)
                token.done = True
                fake._cv.notify_all()
        stream._enqueue(reached)
        return token

    def wait(self, stream: FakeStream, event: FakeEvent) -> None:
        fake = self.fake
        fake._check()
        token = event._token
        if token is None:  # never recorded: CUDA's wait orders nothing
            return
        fake.hb.wait(stream.key, token.clock)

        def wait_for_it() -> None:
            with fake._cv:
                while not token.done and not fake._closed:
                    fake._cv.wait()
                if fake.clock is not None:
                    stream._vnow = max(stream._vnow, token.time)  # the work after the wait starts after the event
        stream._enqueue(wait_for_it)

    def query(self, event: FakeEvent) -> bool:
        """Whether the latest record has run: a look at this moment, which orders nothing."""
        self.fake._check()
        token = event._token
        return token is None or token.done

    def observed(self, events: Any) -> None:
        """The calling thread acts on these events' completion: its later launches and frees follow their work."""
        for event in events:
            token = getattr(event, "_token", None)
            if token is not None and token.done:
                self.fake._observe(token)

    def synchronize(self) -> None:
        """Wait for every stream of this device, as ``torch.cuda.synchronize(index)`` (this thread's later work is
        ordered after it)."""
        for stream in list(self._streams):
            self.fake._sync_stream(stream, "synchronize()")

    def elapsed_s(self, start: FakeEvent, end: FakeEvent) -> float:
        self.fake._check()
        if start._token is None or end._token is None or not (start._token.done and end._token.done):
            raise FakeCudaError("elapsed_time: both events must be recorded and completed")
        return end._token.time - start._token.time

    def spin(self, seconds: float) -> None:
        self.kernels.spin(seconds)

    # -- what the device holds --------------------------------------------------------------------------------
    def memory_of(self, value: Any) -> Optional[Device]:
        if isinstance(value, FakeTensor):
            return value.device
        if isinstance(value, FakeCudaTensor):
            return value.fake_device
        return None

    # -- torch tensors on the device --------------------------------------------------------------------------
    def tensor(self, data: Any) -> FakeCudaTensor:
        """``data`` copied to this device on the current stream, non-blocking (``.to("cuda", non_blocking=True)``).

        A :class:`~swpipe.testing.FakeCudaTensor`: torch's ops run on it as kernels of the fake (autograd too).
        From pageable memory the copy is staged before this returns; from memory
        :meth:`FakeKernels.pin <swpipe.testing.FakeKernels.pin>` made it reads ``data`` when it runs.
        """
        return host_tensor(self, data)

    def module(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module``'s parameters and buffers copied to this device, on the current stream (``module.to(device)``)."""
        return move_module(self, module)

    def stream_of(self, tensor: Any) -> FakeStream:
        """The stream whose pool the memory of ``tensor`` came from (where it was allocated, hence freed to)."""
        return self._block_of(tensor, "stream_of").stream

    def block_of(self, tensor: Any) -> int:
        """The caching allocator's block that holds ``tensor`` (its number, as race reports name it ``#n``): two
        tensors with one number share memory, as a freed block handed out again."""
        return self._block_of(tensor, "block_of").id

    def _block_of(self, tensor: Any, what: str) -> Any:
        if isinstance(tensor, FakeCudaTensor):
            return tensor._fake.block
        if isinstance(tensor, FakeTensor):
            return tensor._block
        raise TypeError(f"{what}: {type(tensor).__name__} is not memory of a fake device")

    def memory_counters(self) -> Optional[Tuple[int, int]]:
        return self._allocator.allocated, self._allocator.freed

    def describe(self) -> str:
        return f"FakeCuda device {self.index} (a CPU stand-in)"

    def nvtx_push(self, name: str) -> None:
        self.fake.nvtx.append((threading.current_thread().name, "push", name))

    def nvtx_pop(self) -> None:
        self.fake.nvtx.append((threading.current_thread().name, "pop", ""))

    @contextlib.contextmanager
    def nvtx_mode(self) -> Iterator[None]:
        self.fake.nvtx.append((threading.current_thread().name, "mode", "on"))
        try:
            yield
        finally:
            self.fake.nvtx.append((threading.current_thread().name, "mode", "off"))

    # -- kernels ----------------------------------------------------------------------------------------------
    def _launch(self, stream: FakeStream, fn: Callable[[], None], label: str, reads: Tuple[_Block, ...] = (),
                writes: Tuple[_Block, ...] = (), seconds: float = 0.0) -> None:
        """Enqueue ``fn`` on ``stream`` after a random delay; record its accesses in the happens-before check.

        ``seconds``: how long the kernel lasts on the fake's ``clock`` (ignored without one)."""
        fake = self.fake
        fake._check()
        launched = fake._launched_at()
        stamp = fake.hb.launch(fake._host(), stream.key, label, stream.label)
        for block in reads:
            fake.hb.access(block.id, stamp, "read", self._block_name(block))
        for block in writes:
            fake.hb.access(block.id, stamp, "write", self._block_name(block))
        delay = stream._delay()

        def kernel() -> None:
            if fake._error is not None:
                return  # after a sticky error nothing runs
            if delay:
                time.sleep(delay)  # the adversarial timing is the workload here
            if launched is not None:
                stream._advance(launched, seconds)
            try:
                fn()
            except Exception as exc:  # an error inside a kernel is sticky, as on CUDA
                fake._fail(FakeCudaError(f"kernel {label!r} on {stream!r} failed: {type(exc).__name__}: {exc}",
                                         label, stream.label))
        fake.launches.append(Launch(label, stream.label, threading.current_thread().name, stamp))
        stream._enqueue(kernel)

    @staticmethod
    def _block_name(block: _Block) -> str:
        return f"block #{block.id} ({block.raw.numel()} B, allocated by {block.owner or '?'} on {block.stream.label})"


class FakeCuda:
    """A fake CUDA runtime: devices, their streams' executor threads, the allocator and the race check.

    Parameters
    ----------
    num_devices : int
    seed : int
        Seeds each stream's random kernel delays.
    max_delay_s : float
        Each kernel waits ``uniform(0, max_delay_s)`` before it runs (0: none).
    hang_timeout_s : float
        A host call that blocks on the device (``synchronize``, ``item``,
        ``to_host``) raises :class:`FakeDeviceHang` after this long instead of
        blocking forever.
    streams_per_device : int
        The size of each device's pool of streams (PyTorch's: 32), handed out
        round robin to stream names and :meth:`FakeCudaDevice.draw_stream`.
    clock : object, optional
        Virtual time (module docstring): a host clock with ``perf_counter()``
        and ``advance(seconds)``, moved by the test and by the host's
        synchronisations; the attribute may be set before any work is
        launched. ``None``: the wall clock, and ``spin`` sleeps.

    Attributes
    ----------
    hb : HappensBefore
        The race check; :meth:`assert_no_races` raises what it found.
    nvtx : list
        ``(thread, "push"/"pop"/"mode", name)``: the NVTX calls made.
    launches : list of Launch
        Every kernel launched, in launch order: its label (the engine's
        ``Task(iteration)``), stream, host thread and place in the device order.
    events_created : int
        Events made through the seam (``Device.event``).
    """

    def __init__(self, num_devices: int = 2, seed: int = 0, max_delay_s: float = 0.0,
                 hang_timeout_s: float = 30.0, streams_per_device: int = 32, clock: Any = None) -> None:
        if streams_per_device < 1:
            raise ValueError(f"FakeCuda(streams_per_device={streams_per_device!r}): a device has at least one "
                             "pool stream besides its default stream")
        self.streams_per_device = streams_per_device
        self.seed = seed
        self.max_delay_s = max_delay_s
        self.clock = clock
        self.hang_timeout_s = hang_timeout_s
        self.hb = HappensBefore()
        self.nvtx: List[Tuple[str, str, str]] = []
        self.launches: List[Launch] = []
        self.events_created = 0
        self._lock = threading.RLock()  # re-entrant: a FakeTensor freed by the cyclic GC may run under it
        self._mutex = threading.RLock()  # the executors' queues and the events' completion
        self._cv = threading.Condition(self._mutex)  # an event completed (or the fake closed, or failed)
        self._streams: List[FakeStream] = []  # those with an executor
        self._tls = threading.local()
        self._closed = False
        self._error: Optional[FakeCudaError] = None
        self._threads: List[threading.Thread] = []
        self._hosts = itertools.count(1)
        self._pinned: "weakref.WeakSet[torch.Tensor]" = weakref.WeakSet()
        self._block_ids = itertools.count(1)
        self.devices = [FakeCudaDevice(self, i) for i in range(num_devices)]

    def device(self, index: int = 0) -> FakeCudaDevice:
        """Device ``index`` (pass it as ``SWPipeline(plan, device=...)``)."""
        return self.devices[index]

    @property
    def races(self) -> List[Any]:
        """The races found so far (:class:`~swpipe.testing.races.Race`)."""
        return list(self.hb.races)

    def assert_no_races(self) -> None:
        """Raise :class:`~swpipe.testing.races.RaceError` naming every race found so far."""
        if self.hb.races:
            raise RaceError(self.hb.races)

    def is_pinned(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is memory :meth:`FakeKernels.pin` made, or a view of it (as ``Tensor.is_pinned``).

        Page-locked is a property of the storage: ``to_device`` copies from a
        view (``reshape(-1)``), which must count as pinned too. Compared by
        storage, never with ``in`` on the set: that compares tensors by
        value when hashes collide.
        """
        ptr = t.untyped_storage().data_ptr()
        return any(p.untyped_storage().data_ptr() == ptr for p in list(self._pinned))

    def synchronize(self) -> None:
        """Wait for every stream of every device (raises :class:`FakeDeviceHang` past ``hang_timeout_s``)."""
        for dev in self.devices:
            for stream in list(dev._streams):
                self._sync_stream(stream, "synchronize()")

    def clear_error(self) -> None:
        """Forget a sticky error (a new process would start clean; tests reuse the fake instead)."""
        with self._cv:
            self._error = None
            self._cv.notify_all()

    def close(self) -> None:
        """End every executor thread (hung kernels and waits included) and join them."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            for stream in self._streams:
                stream._ready.notify_all()
        for thread in self._threads:
            thread.join(timeout=10.0)
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"FakeCuda.close(): executor threads still running: {alive} (a kernel that blocks "
                               "outside the fake, e.g. on a lock of the test?)")

    def __enter__(self) -> "FakeCuda":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def _fail(self, error: FakeCudaError) -> None:
        with self._cv:
            if self._error is None:
                self._error = error
            self._cv.notify_all()

    def _host(self) -> Hashable:
        """The calling thread's lane in the happens-before order (a token of its own, never reused)."""
        lane = getattr(self._tls, "lane", None)
        if lane is None:
            lane = self._tls.lane = ("host", next(self._hosts), threading.current_thread().name)
        return lane

    def _label(self) -> str:
        return getattr(self._tls, "label", None) or ""

    def _observe(self, token: Optional[_Token]) -> None:
        if token is not None and token.done:
            self.hb.observe(self._host(), token.clock)
            if self.clock is not None:  # the host acts on the work's completion: it is at least that late
                self.clock.advance(max(0.0, token.time - self.clock.perf_counter()))

    def _launched_at(self) -> Optional[float]:
        """The host clock now (``None`` without a ``clock``): when the work launched now may start."""
        return None if self.clock is None else self.clock.perf_counter()

    def _block_on(self, token: Optional[_Token], what: str) -> None:
        if token is None:
            return
        with self._cv:
            done = self._cv.wait_for(lambda: token.done or self._error is not None or self._closed,
                                     timeout=self.hang_timeout_s)
        self._check()
        if not done or not token.done:
            raise FakeDeviceHang(f"{what} waited {self.hang_timeout_s:g} s for the device: a kernel never "
                                 "completes; on a GPU this call would block forever", what, self.hang_timeout_s)

    def _sync_stream(self, stream: FakeStream, what: str) -> None:
        token = stream._dev._record_token(stream)
        self._block_on(token, what)
        self._observe(token)
