"""The optimal balance: contiguous layers into partitions with the least cost of the costliest partition.

A pipeline's steady state runs at the pace of its slowest partition, so the
balance to find minimises ``max_j cost(partition j)`` over every way to cut
the sequence of layer costs into ``k`` non-empty contiguous blocks. Dynamic
programming finds it exactly: ``best[j][i]``, the least maximum for the first
``i`` layers in ``j`` blocks, is ``min over s < i of max(best[j-1][s],
sum(costs[s:i]))``; O(k n^2). Among the optimal balances one with the least
sum of squared partition costs (the most even) is returned, found by a
second pass under the optimum's cap, so ties break the same way every time.
"""

from __future__ import annotations

import math
from typing import List, Sequence

from swpipe.gpipe.errors import GPipeArgumentError

__all__ = ["optimal_balance", "balance_cost"]


def balance_cost(costs: Sequence[float], balance: Sequence[int]) -> float:
    """The cost of the costliest partition of ``balance`` over ``costs``.

    Examples
    --------
    >>> balance_cost([1, 2, 3, 4, 5, 6], [4, 2])
    11
    """
    out, start = 0, 0
    for count in balance:
        out = max(out, sum(costs[start:start + count]))
        start += count
    return out


def _check(costs: Sequence[float], partitions: int) -> List[float]:
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise GPipeArgumentError("partitions", partitions, "must be an integer >= 1", "give the number of devices")
    values = [float(c) for c in costs]
    if any(not math.isfinite(c) or c < 0 for c in values):
        raise GPipeArgumentError("costs", list(costs), "costs must be finite and >= 0", "give one cost per layer")
    if len(values) < partitions:
        raise GPipeArgumentError("partitions", partitions, f"more partitions than layers ({len(values)})",
                                 f"give at most {len(values)} partitions, or more layers")
    return values


def optimal_balance(costs: Sequence[float], partitions: int) -> List[int]:
    """Layers per partition that minimise the costliest partition (ties: the most even), by dynamic programming.

    Parameters
    ----------
    costs : sequence of float
        One cost per layer (seconds, bytes...), >= 0.
    partitions : int
        How many contiguous, non-empty partitions.

    Returns
    -------
    list of int
        ``balance``: ``balance[j]`` layers in partition ``j``.

    Raises
    ------
    GPipeArgumentError
        ``partitions`` < 1 or more than the layers; a negative or non-finite cost.

    Examples
    --------
    >>> optimal_balance([1, 2, 3, 4, 5, 6], 2)
    [4, 2]
    >>> optimal_balance([0, 0], 2)
    [1, 1]
    """
    c = _check(costs, partitions)
    n = len(c)
    prefix = [0.0]
    for x in c:
        prefix.append(prefix[-1] + x)

    def block(s: int, i: int) -> float:
        return prefix[i] - prefix[s]

    inf = math.inf
    # pass 1: the least maximum
    best = [[inf] * (n + 1) for _ in range(partitions + 1)]
    best[0][0] = 0.0
    for j in range(1, partitions + 1):
        for i in range(j, n - (partitions - j) + 1):
            best[j][i] = min(max(best[j - 1][s], block(s, i)) for s in range(j - 1, i))
    cap = best[partitions][n]
    # pass 2: under that cap, the least sum of squares; remember the cuts
    sq = [[inf] * (n + 1) for _ in range(partitions + 1)]
    cut = [[0] * (n + 1) for _ in range(partitions + 1)]
    sq[0][0] = 0.0
    for j in range(1, partitions + 1):
        for i in range(j, n - (partitions - j) + 1):
            for s in range(j - 1, i):
                b = block(s, i)
                if b <= cap and sq[j - 1][s] + b * b < sq[j][i]:
                    sq[j][i], cut[j][i] = sq[j - 1][s] + b * b, s
    balance, i = [], n
    for j in range(partitions, 0, -1):
        s = cut[j][i]
        balance.append(i - s)
        i = s
    return balance[::-1]
