"""The few kernels tests and workloads need, for any device: a fake CUDA device, a real one, or the CPU.

:func:`kernels` returns an object with the methods of
:class:`~swpipe.testing.fake_cuda.FakeKernels` (``empty``, ``full``,
``fill_``, ``copy_``, ``add_``, ``sum``, ``spin``, ``to_device``, ``pin``,
``to_host``, ``item``), each launched on the calling thread's current stream.
A test written with them runs unchanged on ``swpipe.testing.FakeCuda`` in CI
and on a GPU where there is one.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from swpipe_core.device import Device, as_device

__all__ = ["kernels", "TorchKernels"]


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


def kernels(device: Any) -> Any:
    """The kernels of ``device`` (anything :func:`swpipe_core.device.as_device` takes, or a fake's device).

    Examples
    --------
    >>> k = kernels("cpu")
    >>> k.item(k.sum(k.full(3, 2.0)))
    6.0
    """
    dev = as_device(device)
    own = getattr(dev, "kernels", None)
    return own if own is not None else TorchKernels(dev)
