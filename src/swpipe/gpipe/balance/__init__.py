"""Balance: how many layers each partition gets, the optimum by time or by memory.

:func:`balance_by_time` and :func:`balance_by_size` measure each layer with
swpipe's profiler (:func:`profile_layers`) and cut the layers into contiguous
partitions that minimise the costliest one (:func:`optimal_balance`, exact,
by dynamic programming: not a greedy split).

Examples
--------
>>> import torch
>>> from torch import nn
>>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
>>> balance = balance_by_time(2, model, torch.randn(4, 8), timeout=0.05)
>>> len(balance), sum(balance)
(2, 4)
"""

from __future__ import annotations

from typing import Any, List

from torch import nn

from swpipe.gpipe.balance.partition import balance_cost, optimal_balance
from swpipe.gpipe.balance.profile import LayerProfile, profile_layers
from swpipe.gpipe.microbatch import Tensors, scatter

__all__ = ["balance_by_time", "balance_by_size", "optimal_balance", "balance_cost", "profile_layers",
           "LayerProfile"]


def balance_by_time(partitions: int, module: nn.Sequential, sample: Tensors, *, timeout: float = 1.0,
                    device: Any = None) -> List[int]:
    """The balance whose slowest partition (forward + backward time on ``sample``) is fastest.

    Parameters
    ----------
    partitions : int
    module : nn.Sequential
    sample : tensor or tuple of tensors
        One micro-batch.
    timeout : float
        About how long to measure, seconds.
    device : device, optional
        Where to measure; default the module's.

    Returns
    -------
    list of int

    Raises
    ------
    ProfilingError
        A parameter already has a gradient.
    GPipeArgumentError
        More partitions than layers.
    """
    profile = profile_layers(module, sample, timeout=timeout, device=device)
    return optimal_balance(profile.time_s, partitions)


def balance_by_size(partitions: int, module: nn.Sequential, input: Tensors, *, chunks: int = 1,
                    param_scale: float = 2.0, device: Any = None) -> List[int]:
    """The balance whose largest partition (activations kept for backward + ``param_scale`` x parameters) is least.

    Parameters
    ----------
    partitions : int
    module : nn.Sequential
    input : tensor or tuple of tensors
        A mini-batch; its first micro-batch of ``chunks`` is measured.
    chunks : int
    param_scale : float
        Bytes per parameter byte the training keeps: 1 for the weights, +1
        for their gradients, +1 or +2 for an optimizer's state (2 for SGD
        with momentum, 3 for Adam's two moments plus the gradient).
    device : device, optional

    Returns
    -------
    list of int
    """
    profile = profile_layers(module, scatter(input, chunks)[0], timeout=0.0, device=device, num_rounds=1)
    sizes = [s + param_scale * p for s, p in zip(profile.saved_bytes, profile.param_bytes)]
    return optimal_balance(sizes, partitions)
