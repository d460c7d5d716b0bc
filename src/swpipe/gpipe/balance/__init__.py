"""Balance: how many layers each partition gets, the optimum by time or by memory.

:func:`balance_by_time` and :func:`balance_by_size` measure each layer
(:func:`profile_layers`: timed rounds of the training step, made robust to
bursts of load by :func:`robust_times`) and cut the layers into contiguous
partitions that minimise the costliest one (:func:`optimal_balance`, exact,
by dynamic programming: not a greedy split). ``balance_by_time`` is
``optimal_balance(profile_layers(...).time_s, partitions)``: call the two to
see the profile's spread (:meth:`LayerProfile.report`).

A profile times each layer alone; where the partitions share a loaded
machine, :func:`balance_by_steps` judges ``balance_by_time``'s balance and
the balances one cut away by their measured training steps, timed side by
side (:func:`compare_balances`), and returns the comparison with its spread.

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

from typing import Any, List, Optional, Sequence

from torch import nn

from swpipe.gpipe.balance.partition import balance_cost, optimal_balance
from swpipe.gpipe.balance.profile import (LayerProfile, RobustTimes, TaskTimer, default_timer, profile_layers,
                                         robust_times)
from swpipe.gpipe.balance.steps import BalanceSteps, LossFn, compare_balances, neighbour_balances
from swpipe.gpipe.microbatch import Tensors, scatter

__all__ = ["balance_by_time", "balance_by_size", "balance_by_steps", "optimal_balance", "balance_cost",
           "profile_layers", "compare_balances", "neighbour_balances", "BalanceSteps", "LayerProfile",
           "robust_times", "RobustTimes", "TaskTimer", "default_timer"]


def balance_by_time(partitions: int, module: nn.Sequential, sample: Tensors, *, timeout: float = 1.0,
                    device: Any = None, num_rounds: Optional[int] = None,
                    timer: Optional[TaskTimer] = None) -> List[int]:
    """The balance whose slowest partition (forward + backward time on ``sample``) is fastest.

    Each layer's time is :func:`profile_layers`' robust statistic over
    paired rounds (:func:`robust_times`: rounds normalised by their total,
    spikes dropped, medians), so a burst of load on the machine while it
    measures moves no layer's share. On a loaded machine, check the balance
    on measured steps: :func:`balance_by_steps`.

    Parameters
    ----------
    partitions : int
    module : nn.Sequential
    sample : tensor or tuple of tensors
        One micro-batch.
    timeout : float
        About how long to measure, seconds (when ``num_rounds`` is not given).
    device : device, optional
        Where to measure; default the module's.
    num_rounds : int, optional
        How many rounds to time; default as many as ``timeout`` allows, at
        least :data:`~swpipe.gpipe.balance.profile.MIN_ROUNDS`.
    timer : callable, optional
        How each task is timed (:data:`TaskTimer`); default :func:`default_timer`.

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
    profile = profile_layers(module, sample, timeout=timeout, device=device, num_rounds=num_rounds, timer=timer)
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


def balance_by_steps(partitions: int, module: nn.Sequential, input: Tensors, target: Any, loss_fn: LossFn, *,
                     chunks: int = 1, devices: Optional[Sequence[Any]] = None, timeout: float = 1.0,
                     window: int = 1, rounds: int = 20, checkpoint: str = "except_last",
                     schedule: str = "GPipe") -> BalanceSteps:
    """:func:`balance_by_time`'s balance and those one cut away, judged by their measured training steps.

    Use it where the machine is loaded or the partitions share cores: there the profile's optimum and a cut
    one layer away can differ in step time by more than the profile says (see the module's text).

    Parameters
    ----------
    partitions : int
    module : nn.Sequential
    input, target, loss_fn
        One mini-batch and its loss; the profile takes its first micro-batch of ``chunks``.
    chunks : int
    devices : sequence, optional
    timeout : float
        :func:`balance_by_time`'s profiling time, seconds.
    window : int
        How many layers a cut moves (:func:`neighbour_balances`).
    rounds : int
        Timed steps per balance (:func:`compare_balances`).
    checkpoint, schedule : str
        As :class:`~swpipe.gpipe.GPipe` takes them: give the ones you train with.

    Returns
    -------
    BalanceSteps
        ``.fastest`` is the balance to use; the profile's is ``.balances[0]``.

    Raises
    ------
    GPipeArgumentError, ProfilingError
        As :func:`balance_by_time` and :func:`compare_balances` raise them.

    Examples
    --------
    >>> import torch
    >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
    >>> found = balance_by_steps(2, model, torch.randn(8, 8), torch.randn(8, 8), nn.functional.mse_loss,
    ...                          chunks=2, devices=["cpu", "cpu"], timeout=0.05, rounds=2)
    >>> sum(found.fastest), found.balances[0] in neighbour_balances(found.fastest, window=1)
    (4, True)
    """
    sample = scatter(input, chunks)[0]
    profiled = balance_by_time(partitions, module, sample, timeout=timeout)
    return compare_balances(module, neighbour_balances(profiled, window=window), input, target, loss_fn,
                            chunks=chunks, devices=devices, rounds=rounds, checkpoint=checkpoint,
                            schedule=schedule)
