"""Partitions: an ``nn.Sequential`` checked, and split by ``balance`` into one ``nn.Sequential`` per device.

Also the checks of GPipe's other arguments (``balance``, ``chunks``,
``checkpoint``, ``devices``, ``timeout_s``), each raising an error that names the argument
(:mod:`swpipe.gpipe.errors`), in torchgpipe's order and with its exception types.
"""

from __future__ import annotations

import numbers
from collections import OrderedDict
from typing import Any, Iterable, List, Optional, Sequence

import torch
from torch import nn

from swpipe_core.engine.device import CpuDevice, CudaDevice, Device, as_device, cuda_device_count
from swpipe.gpipe.errors import GPipeArgumentError, ModuleStructureError, ModuleTypeError, TooFewDevicesError

__all__ = ["CHECKPOINT_MODES", "verify_module", "check_chunks", "check_checkpoint", "check_timeout", "check_balance",
           "as_partition_device", "movable", "resolve_devices", "split_module"]

CHECKPOINT_MODES = ("always", "except_last", "never")


def verify_module(module: Any) -> None:
    """Raise unless ``module`` is an ``nn.Sequential`` whose children and parameters are all distinct.

    Raises
    ------
    ModuleTypeError
        (a ``TypeError``) ``module`` is not an ``nn.Sequential``.
    ModuleStructureError
        (a ``ValueError``) a child appears twice, or two children share a parameter.

    Examples
    --------
    >>> conv = nn.Conv2d(1, 1, 1)
    >>> try:
    ...     verify_module(nn.Sequential(conv, conv))
    ... except ModuleStructureError as err:
    ...     err.problem, err.layers
    ('duplicate_children', ('0', '1'))
    """
    if not isinstance(module, nn.Sequential):
        raise ModuleTypeError(type(module))
    # named_children() hides a child that appears twice: every direct child, repeats included
    children = [(name, m) for name, m in module.named_modules(remove_duplicate=False) if name and "." not in name]
    seen: dict = {}
    for name, child in children:
        if id(child) in seen:
            raise ModuleStructureError("duplicate_children", (seen[id(child)], name),
                                       f"module with duplicate children is not supported: layers "
                                       f"{seen[id(child)]!r} and {name!r} are one module; give each its own copy")
        seen[id(child)] = name
    owner: dict = {}
    for name, child in children:
        for p in child.parameters():
            if id(p) in owner and owner[id(p)] != name:
                raise ModuleStructureError("duplicate_parameters", (owner[id(p)], name),
                                           f"module with duplicate parameters in distinct children is not supported: "
                                           f"layers {owner[id(p)]!r} and {name!r} share a parameter")
            owner[id(p)] = name


def _as_int(argument: str, value: Any, at_least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or int(value) != value:
        raise GPipeArgumentError(argument, value, "not an integer", f"give an integer >= {at_least}")
    if value < at_least:
        raise GPipeArgumentError(argument, value, f"must be at least {at_least}", f"give an integer >= {at_least}")
    return int(value)


def check_chunks(chunks: Any) -> int:
    """``chunks`` as an ``int`` (``42.0`` is 42); :class:`GPipeArgumentError` unless a whole number >= 1."""
    return _as_int("chunks", chunks, 1)


def check_checkpoint(checkpoint: Any) -> str:
    """``str(checkpoint)``; :class:`GPipeArgumentError` unless one of :data:`CHECKPOINT_MODES`."""
    mode = str(checkpoint)
    if mode not in CHECKPOINT_MODES:
        raise GPipeArgumentError("checkpoint", checkpoint, "checkpoint is not one of 'always', 'except_last', or "
                                 "'never'", "'always' recomputes every micro-batch, 'except_last' all but the last, "
                                 "'never' none")
    return mode


def check_timeout(timeout_s: Any) -> float:
    """``timeout_s`` as a ``float``; :class:`GPipeArgumentError` unless a number of seconds > 0.

    Examples
    --------
    >>> check_timeout(2)
    2.0
    >>> try:
    ...     check_timeout(0)
    ... except GPipeArgumentError as err:
    ...     err.argument, err.value
    ('timeout_s', 0)
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not timeout_s > 0:
        raise GPipeArgumentError("timeout_s", timeout_s, "not a positive number of seconds",
                                 "give the seconds a partition may take over one micro-batch, e.g. timeout_s=300")
    return float(timeout_s)


def check_balance(module: nn.Sequential, balance: Optional[Iterable[Any]]) -> List[int]:
    """``balance`` as a list of ints that sums to ``len(module)``, each >= 1."""
    hint = ("find one with swpipe.gpipe.balance.balance_by_time(partitions, module, sample) or "
            "swpipe.gpipe.balance.balance_by_size(...)")
    if balance is None:
        raise GPipeArgumentError("balance", None, "balance is required (layers per partition)", hint)
    try:
        values = list(balance)
    except TypeError:
        raise GPipeArgumentError("balance", balance, "not a sequence of layer counts", hint) from None
    counts = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or int(v) != v:
            raise GPipeArgumentError("balance", values, f"{v!r} is not a whole number of layers", hint)
        counts.append(int(v))
    if sum(counts) != len(module):
        raise GPipeArgumentError("balance", values, f"module and sum of balance have different length (module: "
                                 f"{len(module)}, sum of balance: {sum(counts)})", hint)
    if any(c <= 0 for c in counts):
        raise GPipeArgumentError("balance", values, "all balance numbers must be positive integer", hint)
    return counts


def as_partition_device(d: Any) -> Device:
    """The device seam's :class:`Device` for one entry of ``devices``.

    An int is a CUDA device, or the CPU on a machine without CUDA: the
    engine's rule (:func:`swpipe_core.engine.device.resolve_device`), so code
    written for GPUs runs on a CPU-only machine (torchgpipe refuses it there).

    Examples
    --------
    >>> as_partition_device("cpu")
    CpuDevice(cpu)
    """
    if isinstance(d, Device):
        return d
    if isinstance(d, numbers.Integral) and not isinstance(d, bool):
        return as_device(int(d))
    return as_device(torch.device(d) if isinstance(d, str) else d)


def resolve_devices(devices: Optional[Iterable[Any]], partitions: int) -> List[Device]:
    """The devices of the partitions, through swpipe's device seam (``None``: every CUDA device).

    Extra devices are dropped; fewer than ``partitions`` raises :class:`TooFewDevicesError`.
    """
    listed = list(range(cuda_device_count())) if devices is None else list(devices)
    if len(listed) < partitions:
        raise TooFewDevicesError(partitions, len(listed))
    return [as_partition_device(d) for d in listed[:partitions]]


def movable(device: Device) -> bool:
    """Whether modules can be moved to ``device`` with ``.to`` (a torch runtime, not a test's fake)."""
    return isinstance(device, (CpuDevice, CudaDevice))


def split_module(module: nn.Sequential, balance: Sequence[int], devices: Sequence[Device]) -> nn.ModuleList:
    """``module``'s layers in ``len(balance)`` consecutive ``nn.Sequential`` s, each moved to its device."""
    layers = list(module.named_children())
    partitions = []
    start = 0
    for count, device in zip(balance, devices):
        part = nn.Sequential(OrderedDict(layers[start:start + count]))
        if movable(device):
            part.to(device.torch_device)
        partitions.append(part)
        start += count
    return nn.ModuleList(partitions)
