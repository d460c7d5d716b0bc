"""The few kernels tests and workloads need, for any device: a fake CUDA device, a real one, or the CPU.

:func:`kernels` returns an object with the methods of
:class:`FakeKernels` (``empty``, ``full``,
``fill_``, ``copy_``, ``add_``, ``sum``, ``spin``, ``to_device``, ``pin``,
``to_host``, ``item``), each launched on the calling thread's current stream.
A test written with them runs unchanged on ``swpipe.testing.FakeCuda`` in CI
and on a GPU where there is one.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from swpipe_core.engine.device import Device, as_device

from swpipe.testing.fake_memory import FakeTensor
from swpipe.testing.fake_streams import FakeStream


__all__ = ["kernels", "TorchKernels", "FakeKernels"]


class TorchKernels:
    """The kernels on torch tensors of a real device (CUDA or the CPU)."""

    def __init__(self, device: Device) -> None:
        self._dev = device
        self._torch_device = device.torch_device

    def empty(self, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(n, dtype=dtype, device=self._torch_device)

    def full(self, n: int, value: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.full((n,), value, dtype=dtype, device=self._torch_device)

    def fill_(self, x: torch.Tensor, value: float) -> torch.Tensor:
        return x.fill_(value)

    def copy_(self, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return dst.copy_(src)

    def add_(self, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return dst.add_(src)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum().reshape(1)

    def spin(self, seconds: float) -> None:
        if self._dev.is_async:
            self._dev.spin(seconds)
        else:
            time.sleep(seconds)  # the CPU's "kernel" runs on the host: the workload itself

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1).to(self._torch_device, non_blocking=True)

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory() if self._dev.is_async else t

    def to_host(self, x: torch.Tensor) -> torch.Tensor:
        return x.cpu()

    def item(self, x: torch.Tensor) -> float:
        return x.reshape(-1)[0].item()


class FakeKernels:
    """The kernels of a fake device; each runs on the calling thread's current stream of the device.

    The same methods exist for a real CUDA device and for the CPU
    (:func:`swpipe.testing.kernels`), so a test or a workload written with
    them runs on any of the three.
    """

    def __init__(self, device: Device) -> None:
        self._dev = device

    def _stream(self) -> FakeStream:
        return self._dev.current_stream()

    def _label(self, what: str) -> str:
        return self._dev.fake._label() or what

    def empty(self, n: int, dtype: torch.dtype = torch.float32) -> FakeTensor:
        """``n`` elements of unspecified values (the block's previous contents, or the poison)."""
        stream = self._stream()
        return self._dev._allocator.alloc(n, dtype, stream, self._label("empty"))

    def full(self, n: int, value: float, dtype: torch.dtype = torch.float32) -> FakeTensor:
        out = self.empty(n, dtype)
        self.fill_(out, value)
        return out

    def fill_(self, x: FakeTensor, value: float) -> FakeTensor:
        view = x._view()
        self._dev._launch(self._stream(), lambda: view.fill_(value), self._label("fill_"), writes=(x._block,))
        return x

    def copy_(self, dst: FakeTensor, src: FakeTensor) -> FakeTensor:
        d, s = dst._view(), src._view()
        self._dev._launch(self._stream(), lambda: d.copy_(s), self._label("copy_"), reads=(src._block,),
                          writes=(dst._block,))
        return dst

    def add_(self, dst: FakeTensor, src: FakeTensor) -> FakeTensor:
        d, s = dst._view(), src._view()
        self._dev._launch(self._stream(), lambda: d.add_(s), self._label("add_"), reads=(src._block, dst._block),
                          writes=(dst._block,))
        return dst

    def sum(self, x: FakeTensor) -> FakeTensor:
        out = self.empty(1, x.dtype)
        o, v = out._view(), x._view()
        self._dev._launch(self._stream(), lambda: o.copy_(v.sum().reshape(1)), self._label("sum"),
                          reads=(x._block,), writes=(out._block,))
        return out

    def spin(self, seconds: float) -> None:
        """Hold the current stream for ``seconds`` (a kernel that only waits; with the fake's ``clock``, on that
        clock: it ends ``seconds`` later there and returns at once)."""
        if self._dev.fake.clock is not None:
            self._dev._launch(self._stream(), lambda: None, self._label("spin"), seconds=seconds)
        else:
            self._dev._launch(self._stream(), lambda: time.sleep(seconds), self._label("spin"))

    def to_device(self, t: torch.Tensor) -> FakeTensor:
        """A non-blocking host-to-device copy of a 1-D host tensor on the current stream.

        From pinned memory the copy reads ``t`` when it runs (write ``t`` again
        before that and the device gets the new values). From pageable memory
        the host returns once the data is staged (copied aside now), the copy
        to the device still in flight: as ``Tensor.to(device, non_blocking=True)``,
        and neither orders the host after the copy.
        """
        t = t.reshape(-1)
        source = t if self._dev.fake.is_pinned(t) else t.clone()  # pageable: staged before the call returns
        out = self.empty(t.numel(), t.dtype)
        o = out._view()
        self._dev._launch(self._stream(), lambda: o.copy_(source), self._label("to_device"), writes=(out._block,))
        return out

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` as page-locked memory (a copy registered with the fake), as ``Tensor.pin_memory``."""
        pinned = t.clone()
        self._dev.fake._pinned.add(pinned)
        return pinned

    def to_host(self, x: Any) -> torch.Tensor:
        """The values: a copy on the current stream that reads ``x`` there, and the host waits for it (``.cpu()``).

        The read is an access like any kernel's: if the current stream is not
        ordered after the kernel that wrote ``x``, the race check reports it
        (and the copy may read the old bytes).
        """
        if isinstance(x, torch.Tensor):  # a FakeCudaTensor: its copy_ into host memory is the same read
            return torch.empty(x.shape, dtype=x.dtype).copy_(x)
        stream = self._stream()
        out = torch.empty(x.numel, dtype=x.dtype)
        view = x._view()
        self._dev._launch(stream, lambda: out.copy_(view), self._label("to_host"), reads=(x._block,))
        self._dev.fake._sync_stream(stream, f"to_host of {x!r}")
        return out

    def item(self, x: Any) -> float:
        """The first value as a Python number: :meth:`to_host` (a read on the current stream, the host waits)."""
        return self.to_host(x).reshape(-1)[0].item()

    def host_func(self, fn: Callable[[], None], label: str = "host_func") -> None:
        """Queue ``fn`` on the current stream, as ``cudaLaunchHostFunc``: it runs when the stream reaches it, after
        the work queued before it, and the work queued after it waits for it to return (labelled, ordered and
        traced like any kernel)."""
        self._dev._launch(self._stream(), fn, self._label(label))

    def hang(self) -> None:
        """A kernel that never completes (until the fake is closed): a collective whose peer died."""
        fake = self._dev.fake

        def never() -> None:
            with fake._cv:
                while not fake._closed:
                    fake._cv.wait()
        self._dev._launch(self._stream(), never, self._label("hang"))

    def wait_host(self, flag: threading.Event) -> None:
        """A kernel that runs until the host sets ``flag`` (or the fake is closed): device work a test ends at will."""
        fake = self._dev.fake

        def gate() -> None:
            while not flag.wait(0.01) and not fake._closed:  # the kernel's own body: holds its stream until then
                pass
        self._dev._launch(self._stream(), gate, self._label("wait_host"))

    def fault(self, message: str = "an illegal memory access was encountered") -> None:
        """A kernel that fails with a sticky error: from then on every call on the device raises it."""
        def fail() -> None:
            raise RuntimeError(message)
        self._dev._launch(self._stream(), fail, self._label("fault"))


def kernels(device: Any) -> Any:
    """The kernels of ``device`` (anything :func:`swpipe_core.engine.device.as_device` takes, or a fake's device).

    Examples
    --------
    >>> k = kernels("cpu")
    >>> k.item(k.sum(k.full(3, 2.0)))
    6.0
    """
    dev = as_device(device)
    own = getattr(dev, "kernels", None)
    return own if own is not None else TorchKernels(dev)
