"""Balances judged by measured steps: the profile's optimum and its neighbouring cuts timed side by side.

A profile times each layer alone; a step runs the partitions at once, and on
a loaded machine how they share the cores decides which of two nearly equal
cuts is faster (on a 2-core machine beside two busy processes, a U-Net cut
the profiles put within 1 % of the best ran 1.16x it). The package's
``balance_by_steps`` takes the profile's optimum (:func:`balance_by_time`'s) and the
balances one cut away from it, times the training step of each in the same
rounds (:func:`compare_balances`) and returns the fastest. Each round times
every balance once, in an order that rotates, and each balance's figure is the
median over the rounds of its step **over the first balance's step in the
same round**: a slow phase of the machine moves every balance of a round
alike, so the ratio keeps the comparison where medians of raw times would not.

The steps run on copies of the module: its parameters, gradients and buffers
are not touched (no hidden training), and the copies, one per balance, are
freed on return.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import torch
from torch import nn

from swpipe_core.measure.rolling import relative_iqr

from swpipe.gpipe.errors import GPipeArgumentError
from swpipe.gpipe.gpipe import GPipe
from swpipe.gpipe.measure import timed_step
from swpipe.gpipe.microbatch import Tensors

__all__ = ["compare_balances", "neighbour_balances", "BalanceSteps"]

LossFn = Callable[[Tensors, Any], torch.Tensor]


def neighbour_balances(balance: Sequence[int], *, window: int = 1) -> List[List[int]]:
    """The balances reached by moving one cut of ``balance`` by up to ``window`` layers, every partition kept.

    Parameters
    ----------
    balance : sequence of int
        Layers per partition, each >= 1.
    window : int
        The most layers one cut moves (>= 0).

    Returns
    -------
    list of list of int
        ``balance`` first, then the neighbours in the order of the cut moved and of the move (-window ... +window).

    Raises
    ------
    GPipeArgumentError
        A partition with fewer than one layer, or a negative ``window``.

    Examples
    --------
    >>> neighbour_balances([3, 2])
    [[3, 2], [2, 3], [4, 1]]
    >>> neighbour_balances([1, 2, 1], window=1)
    [[1, 2, 1], [2, 1, 1], [1, 1, 2]]
    """
    base = [int(n) for n in balance]
    if not base or any(n < 1 for n in base):
        raise GPipeArgumentError("balance", list(balance), "every partition needs one layer or more",
                                 "give a balance of positive layer counts")
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise GPipeArgumentError("window", window, "must be an integer >= 0", "give how many layers a cut moves")
    out = [base]
    for cut in range(len(base) - 1):
        for move in range(-window, window + 1):
            moved = list(base)
            moved[cut] += move
            moved[cut + 1] -= move
            if move and min(moved) >= 1 and moved not in out:
                out.append(moved)
    return out


@dataclass
class BalanceSteps:
    """Training steps of several balances of one model, timed in the same rounds (:func:`compare_balances`).

    Attributes
    ----------
    balances : list of list of int
        The balances, the reference first.
    steps_s : list of list of float
        Per balance, its step's wall seconds in each round.
    ratio : list of float
        Per balance, the median over the rounds of its step over the reference's in the same round (1.0 for the
        reference).
    spread : list of float
        Per balance, the relative interquartile range of those ratios (:func:`~swpipe_core.measure.rolling.
        relative_iqr`; the reference's: of its own steps).
    """

    balances: List[List[int]]
    steps_s: List[List[float]]
    ratio: List[float]
    spread: List[float]

    @classmethod
    def from_rounds(cls, balances: Sequence[Sequence[int]], steps_s: Sequence[Sequence[float]]) -> "BalanceSteps":
        """The ratios and spreads of ``steps_s[b][r]``, balance ``b``'s step in round ``r`` (``b = 0`` the reference).

        Examples
        --------
        >>> s = BalanceSteps.from_rounds([[2, 1], [1, 2]], [[1.0, 2.0, 1.0], [0.9, 1.8, 1.0]])
        >>> s.ratio, s.fastest
        ([1.0, 0.9], [1, 2])
        """
        reference = steps_s[0]
        ratios = [[s / r for s, r in zip(row, reference)] for row in steps_s[1:]]
        return cls([list(b) for b in balances], [list(r) for r in steps_s],
                   [1.0] + [statistics.median(r) for r in ratios],
                   [relative_iqr(reference)] + [relative_iqr(r) for r in ratios])

    @property
    def fastest(self) -> List[int]:
        """The balance of the least ratio (the earliest of equal ones: the reference on a tie)."""
        return self.balances[min(range(len(self.balances)), key=self.ratio.__getitem__)]

    @property
    def median_s(self) -> List[float]:
        """Per balance, its median step (seconds)."""
        return [statistics.median(r) for r in self.steps_s]

    def summary(self) -> str:
        """One line per balance: median step, ratio to the reference, spread; the fastest marked."""
        best = self.fastest
        return "\n".join(f"{'*' if b == best else ' '} {b}: {m * 1e3:.2f} ms, x{r:.3f} (spread {s:.3f})"
                         for b, m, r, s in zip(self.balances, self.median_s, self.ratio, self.spread))


def compare_balances(module: nn.Sequential, balances: Sequence[Sequence[int]], input: Tensors, target: Any,
                     loss_fn: LossFn, *, chunks: int = 1, devices: Optional[Sequence[Any]] = None,
                     rounds: int = 20, warmup: int = 1, checkpoint: str = "except_last",
                     schedule: str = "GPipe") -> BalanceSteps:
    """Time the training step (:meth:`GPipe.step <swpipe.gpipe.GPipe.step>`) of each balance in the same rounds.

    Every balance runs on its own copy of ``module`` (``module`` is not touched); each round times each balance
    once, starting one balance later than the round before, so none always runs first.

    Parameters
    ----------
    module : nn.Sequential
    balances : sequence of sequences of int
        The balances to time; the first is the reference of the ratios.
    input, target, loss_fn
        One mini-batch and its loss, as :meth:`GPipe.step` takes them.
    chunks : int
        Micro-batches per step.
    devices : sequence, optional
        The partitions' devices (:class:`~swpipe.gpipe.GPipe`'s ``devices``).
    rounds : int
        Timed steps per balance (>= 1).
    warmup : int
        Untimed steps per balance before the rounds.
    checkpoint, schedule : str
        As :class:`~swpipe.gpipe.GPipe` takes them (and with its defaults): give the ones you train with.

    Returns
    -------
    BalanceSteps

    Raises
    ------
    GPipeArgumentError
        No balance, or ``rounds`` < 1; and what :class:`~swpipe.gpipe.GPipe` raises for a balance.

    Examples
    --------
    >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> s = compare_balances(model, [[2, 1], [1, 2]], torch.randn(8, 8), torch.randn(8, 2),
    ...                      nn.functional.mse_loss, chunks=2, devices=["cpu", "cpu"], rounds=3)
    >>> [len(r) for r in s.steps_s], s.ratio[0], s.fastest in s.balances
    ([3, 3], 1.0, True)
    """
    if not balances:
        raise GPipeArgumentError("balances", list(balances), "no balance to time", "give one balance or more")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise GPipeArgumentError("rounds", rounds, "must be an integer >= 1", "time one round or more")
    pipes = [GPipe(copy.deepcopy(module), list(b), devices=devices, chunks=chunks, checkpoint=checkpoint,
                   schedule=schedule) for b in balances]
    for pipe in pipes:
        for _ in range(warmup):
            timed_step(pipe, input, target, loss_fn)
    order = list(range(len(pipes)))
    steps: List[List[float]] = [[] for _ in pipes]
    for r in range(rounds):
        k = r % len(order)
        for i in order[k:] + order[:k]:
            steps[i].append(timed_step(pipes[i], input, target, loss_fn))
    return BalanceSteps.from_rounds(balances, steps)
