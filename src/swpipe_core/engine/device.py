"""The device seam: every call swpipe makes to a device runtime goes through a :class:`Device`.

Streams, events, the calling thread's current stream and device, memory
counters, NVTX and the spin kernel the profiler times with. Three
implementations share these methods:

* :class:`CpuDevice`: no device queue. A stream is a name, events are
  ``None`` and waiting on them does nothing, so CPU signals alone carry the
  order and the same engine runs on both.
* :class:`CudaDevice`: ``torch.cuda``. This module is the only code of the
  library that names ``torch.cuda``.
* ``swpipe.testing.FakeCuda``: a CPU device with CUDA's semantics (one
  executor thread per stream, a caching allocator that reuses freed blocks at
  once, races reported), which runs every CUDA path of the engine on a
  machine without a GPU.

The engine asks only ``device.is_async`` (device work may complete after the
host returns: streams, events and lifetimes matter); it never asks which
implementation it holds. :func:`as_device` turns what a user passes
(``"cpu"``, ``"cuda:1"``, an integer, a ``torch.device`` or a :class:`Device`)
into one.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Any, ContextManager, Dict, Hashable, Iterator, Optional, Sequence, Tuple, Union

import torch

__all__ = ["Device", "CpuDevice", "CudaDevice", "SharedStreamWarning", "warn_shared_stream", "CpuFallbackWarning",
           "falls_back_to_cpu", "as_device", "resolve_device", "cuda_available", "cuda_device_count"]

_NULL = contextlib.nullcontext()


class Device:
    """What the engine needs of a device; the CPU's answers are the defaults.

    Subclasses override what their runtime does. Streams and events are
    opaque objects of the implementation (``None`` on the CPU).

    Attributes
    ----------
    type : str
        ``"cpu"`` or ``"cuda"``: the ``torch.device`` type plans and reports use.
    index : int or None
    is_async : bool
        Whether device work completes after the host call returns (streams,
        events and the lifetime of freed memory then matter).
    """

    type = "cpu"
    index: Optional[int] = None
    is_async = False

    @property
    def torch_device(self) -> torch.device:
        """The ``torch.device`` this device stands for."""
        return torch.device(self.type) if self.index is None else torch.device(self.type, self.index)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.torch_device})"

    # -- the calling thread ------------------------------------------------------------------------------------
    def set_current(self) -> None:
        """Make this the calling thread's current device (each worker thread calls it first)."""

    def default_stream(self) -> Any:
        """The device's default stream (``None`` on the CPU)."""
        return None

    def current_stream(self) -> Any:
        """The calling thread's current stream on this device (``None`` on the CPU)."""
        return None

    def use(self, stream: Any) -> ContextManager:
        """Make ``stream`` current on the calling thread for the block."""
        return _NULL

    def annotate(self, label: str) -> ContextManager:
        """Name the kernels the calling thread launches in the block (a race report names tasks by it)."""
        return _NULL

    # -- streams and events ------------------------------------------------------------------------------------
    def new_stream(self, name: str) -> Any:
        """A stream of this device of its own, for stream name ``name``."""
        return None

    def stream_key(self, stream: Any) -> Hashable:
        """Identity of a stream object: equal keys mean one device queue."""
        return ("cpu", 0)

    def is_stream(self, obj: Any) -> bool:
        """Whether ``obj`` is a stream object of this runtime."""
        return isinstance(obj, torch.Stream)

    def event(self, timing: bool = False) -> Any:
        """A new event (``None`` on the CPU)."""
        return None

    def record(self, event: Any, stream: Any) -> None:
        """Record ``event`` at the current end of ``stream``'s queue."""

    def wait(self, stream: Any, event: Any) -> None:
        """Make ``stream`` wait on the device for the latest record of ``event``; the host does not block."""

    def query(self, event: Any) -> bool:
        """Whether the work before the latest record of ``event`` has completed."""
        return True

    def observed(self, events: Sequence[Any]) -> None:
        """The calling thread saw ``events`` complete (queries said so) and acts on it, e.g. frees what they read.

        A real device needs nothing: completion is a fact, and what the thread
        does next follows it. A device that checks the order (``FakeCuda``)
        orders the thread's later work after theirs, which a query alone does
        not (its answer is timing: the same code may get ``False`` next time).
        """

    def elapsed_s(self, start: Any, end: Any) -> float:
        """Seconds between two completed timing events."""
        return 0.0

    def synchronize(self) -> None:
        """Block the host until all work queued on this device has run (a measurement's edge, never the hot path)."""

    def spin(self, seconds: float) -> None:
        """Hold the calling thread's current stream for about ``seconds`` (a kernel that only waits)."""

    def default_generator(self) -> torch.Generator:
        """torch's default random generator of this device (the CPU's here)."""
        return torch.default_generator

    # -- what the device holds ---------------------------------------------------------------------------------
    def memory_of(self, value: Any) -> Optional["Device"]:
        """The device of this runtime whose memory ``value`` is (a tensor written asynchronously); else ``None``."""
        return None

    def memory_counters(self) -> Optional[Tuple[int, int]]:
        """Bytes allocated and freed so far by the device's allocator; ``None`` where there is none to read."""
        return None

    def describe(self) -> str:
        """The device's name, as a report prints it."""
        return str(self.torch_device)

    # -- tracing ---------------------------------------------------------------------------------------------
    def nvtx_push(self, name: str) -> None:
        """Open an NVTX range on the calling thread."""

    def nvtx_pop(self) -> None:
        """Close the calling thread's innermost NVTX range."""

    def nvtx_mode(self) -> ContextManager:
        """The profiler's NVTX mode on the calling thread, without synchronising the device."""
        return _NULL


class CpuDevice(Device):
    """The host: no device queue, nothing asynchronous.

    Examples
    --------
    >>> cpu = CpuDevice()
    >>> cpu.torch_device, cpu.is_async, cpu.event() is None, cpu.query(None)
    (device(type='cpu'), False, True, True)
    """


class CudaDevice(Device):
    """One CUDA device through ``torch.cuda``. Use :func:`as_device`, which keeps one per index.

    Named streams are created once per device and name, process-wide, so two
    pipelines that name a stream ``"memcpy"`` share it and never draw a new
    stream from PyTorch's pool each time. That pool has 32 streams per device
    and priority and hands them out round robin (NCCL draws from it too): a
    new stream whose id another name already holds is reported with a warning,
    since the two names would then run on one queue and lose their overlap.
    """

    type = "cuda"
    is_async = True

    def __init__(self, index: int) -> None:
        self.index = index
        self._named: Dict[str, Any] = {}
        self._lock = threading.Lock()

    def set_current(self) -> None:
        torch.cuda.set_device(self.index)

    def default_stream(self) -> Any:
        return torch.cuda.default_stream(self.index)

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self.index)

    def use(self, stream: Any) -> ContextManager:
        return torch.cuda.stream(stream)

    def new_stream(self, name: str) -> Any:
        with self._lock:
            stream = self._named.get(name)
            if stream is None:
                stream = torch.cuda.Stream(device=self.index)
                stream.swpipe_name = name
                taken = {s.stream_id: n for n, s in self._named.items()}
                taken[self.default_stream().stream_id] = "the default stream (None)"
                if stream.stream_id in taken:
                    warn_shared_stream(name, f"cuda:{self.index}", taken[stream.stream_id])
                self._named[name] = stream
        return stream

    def stream_key(self, stream: Any) -> Hashable:
        return (str(stream.device), stream.stream_id)

    def is_stream(self, obj: Any) -> bool:
        return isinstance(obj, (torch.Stream, torch.cuda.Stream))

    def event(self, timing: bool = False) -> Any:
        return torch.cuda.Event(enable_timing=timing)

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def query(self, event: Any) -> bool:
        return event.query()

    def elapsed_s(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.index)

    def spin(self, seconds: float) -> None:
        torch.cuda._sleep(max(1, int(self._spin_rate() * seconds)))

    def default_generator(self) -> torch.Generator:
        return torch.cuda.default_generators[self.index]

    def _spin_rate(self) -> float:
        """Cycles per second of ``torch.cuda._sleep`` here (timed once with CUDA events, then kept)."""
        rate = getattr(self, "_rate", None)
        if rate is None:
            cycles = 20_000_000
            with torch.cuda.device(self.index):
                start, end = self.event(timing=True), self.event(timing=True)
                start.record()
                torch.cuda._sleep(cycles)
                end.record()
                end.synchronize()  # a fixed spin on an idle device: it ends
                rate = self._rate = cycles / max(self.elapsed_s(start, end), 1e-6)
        return rate

    def memory_of(self, value: Any) -> Optional[Device]:
        if isinstance(value, torch.Tensor) and value.is_cuda:
            return as_device(value.device)
        return None

    def memory_counters(self) -> Optional[Tuple[int, int]]:
        stats = torch.cuda.memory_stats(self.index)
        return int(stats.get("allocated_bytes.all.allocated", 0)), int(stats.get("allocated_bytes.all.freed", 0))

    def describe(self) -> str:
        try:
            return torch.cuda.get_device_name(self.index)
        except (RuntimeError, AssertionError):  # no usable CUDA runtime
            return str(self.torch_device)

    def nvtx_push(self, name: str) -> None:
        torch.cuda.nvtx.range_push(name)

    def nvtx_pop(self) -> None:
        torch.cuda.nvtx.range_pop()

    def nvtx_mode(self) -> ContextManager:
        return _nvtx_mode()


class SharedStreamWarning(RuntimeWarning):
    """A new stream name of a device got a device queue another name already has (the pool of streams ran out).

    The two names then run one after the other: the plan's overlap between them is lost, and a kernel that never
    completes on one (a dead peer's collective) holds the other too.

    Attributes
    ----------
    name, other : str
        The new name and the one it shares the queue with.
    device : str
    """

    def __init__(self, name: str, device: str, other: str) -> None:
        self.name, self.device, self.other = name, device, other
        super().__init__(
            f"stream {name!r} on {device} is the same device queue as {other!r}: PyTorch's pool of streams (32 per "
            "device and priority, round robin, NCCL draws from it too) is used up, so the two run one after the "
            "other and the plan's overlap between them is lost. Use fewer stream names, or pass torch.cuda.Stream "
            "objects you created in the plan")


def warn_shared_stream(name: str, device: str, other: str) -> None:
    """Warn (:class:`SharedStreamWarning`) that stream ``name`` on ``device`` shares its device queue with ``other``."""
    warnings.warn(SharedStreamWarning(name, device, other), stacklevel=4)


class CpuFallbackWarning(RuntimeWarning):
    """``SWPipeline(plan, device=N)``, an integer, was made where CUDA is not available: it runs on the CPU.

    Code written for a GPU then runs unchanged on a CPU-only machine, as long as its tasks name no CUDA device
    themselves; a task that does (``.to("cuda")``) fails inside the pipeline. The warning says so when the pipeline
    is made, before any task runs. ``device="cpu"`` asks for the CPU and warns nothing.

    Attributes
    ----------
    requested : int
        The device index given.

    Examples
    --------
    >>> str(CpuFallbackWarning(0)).split(";")[0]
    'SWPipeline(device=0): CUDA is not available, so the pipeline runs on the CPU'
    """

    def __init__(self, requested: int) -> None:
        self.requested = requested
        super().__init__(
            f"SWPipeline(device={requested}): CUDA is not available, so the pipeline runs on the CPU; a task that "
            f"moves tensors to 'cuda' will fail inside it (torch {torch.__version__}, built "
            f"{'with CUDA ' + torch.version.cuda if torch.version.cuda else 'without CUDA'}). Pass device='cpu' to run "
            "on the CPU without this warning, or run where torch sees a GPU (torch.cuda.is_available())")


def falls_back_to_cpu(device: Any) -> bool:
    """Whether ``device`` is an integer (a CUDA device) that runs on the CPU because CUDA is not available.

    Examples
    --------
    >>> falls_back_to_cpu("cpu"), falls_back_to_cpu(0) == (not cuda_available())
    (False, True)
    """
    return isinstance(device, int) and not isinstance(device, bool) and not cuda_available()


@contextlib.contextmanager
def _nvtx_mode() -> Iterator[None]:
    """``torch.autograd.profiler.emit_nvtx()`` on the calling thread, without its device synchronisation.

    ``emit_nvtx`` calls ``torch.cuda.synchronize()`` on entry and on exit.
    On exit after a failure that blocks forever on a kernel that never ends
    (a collective whose peer died) and, after a sticky CUDA error, raises and
    replaces the task's exception; every worker thread would do the same.
    NVTX ranges are pushed on the host when an op is dispatched and need no
    synchronisation, so this enables the same profiler state (NVTX mode, this
    thread only) and leaves the device alone. The calls it mirrors are
    private to torch: if they are missing or their signature changed (any
    error entering the mode), it says so once and runs without NVTX mode
    rather than synchronising or failing every worker.
    """
    started = False
    try:
        from torch.autograd import profiler as _p

        config = _p.ProfilerConfig(_p.ProfilerState.NVTX, False, False, False, False, False, _p._ExperimentalConfig())
        _p._run_on_profiler_start()
        started = True
        _p._enable_profiler(config, set())
    except Exception as exc:  # another torch: its private profiler API moved
        if started:  # the start hook marks a profiler as running: undo it, or every later profile refuses
            try:
                _p._run_on_profiler_stop()
            except Exception:
                pass
        _warn_nvtx_once(exc)
        yield
        return
    try:
        yield
    finally:
        try:
            _p._disable_profiler()
            _p._run_on_profiler_stop()
        except Exception as exc:  # never mask what the block raised
            _warn_nvtx_once(exc)


_NVTX_WARNED: list = []


def _warn_nvtx_once(exc: BaseException) -> None:
    if not _NVTX_WARNED:
        _NVTX_WARNED.append(exc)
        warnings.warn(f"emit_nvtx: this torch's profiler API differs ({type(exc).__name__}: {exc}); autograd ops get "
                      "no NVTX ranges (each task still gets its own range)", RuntimeWarning, stacklevel=3)


_CUDA_DEVICES: Dict[int, CudaDevice] = {}
_CUDA_LOCK = threading.Lock()


def cuda_available() -> bool:
    """Whether a real CUDA device can be used.

    Examples
    --------
    >>> isinstance(cuda_available(), bool)
    True
    """
    return torch.cuda.is_available()


def cuda_device_count() -> int:
    """How many CUDA devices this machine has (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(device: Union[int, str, torch.device, None]) -> torch.device:
    """The ``torch.device`` a pipeline runs on.

    An integer means CUDA device ``device`` when CUDA is available and the CPU
    otherwise (so code written for a GPU runs unchanged on a CPU-only machine);
    a string or ``torch.device`` is taken literally; a :class:`Device` is its
    own ``torch_device``.

    Parameters
    ----------
    device : int, str, torch.device, Device or None
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
    >>> resolve_device(0) == (torch.device("cuda", 0) if cuda_available() else torch.device("cpu"))
    True
    """
    if isinstance(device, Device):
        return device.torch_device
    if device is None:
        device = 0
    if falls_back_to_cpu(device):
        return torch.device("cpu")
    if isinstance(device, int) and not isinstance(device, bool):
        dev = torch.device("cuda", device)
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
    if not cuda_available():
        raise RuntimeError(f"device {dev} was requested but CUDA is not available; use device='cpu' "
                           "(or an integer, which falls back to the CPU)")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if not 0 <= index < cuda_device_count():
        raise RuntimeError(f"device cuda:{index} does not exist; this machine has {cuda_device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def as_device(device: Union[int, str, torch.device, Device, None]) -> Device:
    """The :class:`Device` for what a user passed: a :class:`Device` as is, else by :func:`resolve_device`.

    There is one :class:`CudaDevice` per CUDA index in a process, so its named
    streams are shared by every pipeline on it.

    Examples
    --------
    >>> as_device("cpu")
    CpuDevice(cpu)
    >>> d = CpuDevice(); as_device(d) is d
    True
    """
    if isinstance(device, Device):
        return device
    dev = resolve_device(device)
    if dev.type == "cpu":
        return CpuDevice()
    with _CUDA_LOCK:
        found = _CUDA_DEVICES.get(dev.index)
        if found is None:
            found = _CUDA_DEVICES[dev.index] = CudaDevice(dev.index)
    return found
