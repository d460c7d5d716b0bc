"""The re-planning rules, as pure functions of numbers: the noise band, drift, whether a swap is worth it, and on
several ranks which iterations the ranks exchange decisions after.

Everything :class:`~swpipe.replan.adaptive.AdaptivePipeline` decides goes through these functions, so the
decisions can be checked with scripted numbers, without a clock or a pipeline. Times are seconds; ``noise`` is a
relative half-width (0.05: the band is the reference +- 5 %).
"""

from __future__ import annotations

import statistics
from typing import Sequence

from autosched._fields import integer

__all__ = ["noise_band", "drift_detected", "swap_worth_it", "exchange_step"]


def noise_band(periods: Sequence[float], min_noise: float, spread_k: float) -> float:
    """The relative half-width of the band a steady pipeline's period stays in.

    ``spread_k`` times the periods' median absolute deviation over their median (a robust spread: one slow
    period moves it little), never below ``min_noise``.

    Parameters
    ----------
    periods : sequence of float
        Measured periods (seconds) of a run known to be steady (the baseline window).
    min_noise : float
        The floor of the band (a relative figure, >= 0).
    spread_k : float
        How many robust spreads the band is wide.

    Returns
    -------
    float
        The relative half-width, ``>= min_noise``.

    Raises
    ------
    ValueError
        ``periods`` is empty or its median is not > 0.

    Examples
    --------
    >>> noise_band([1.0, 1.0, 1.0, 1.0], min_noise=0.05, spread_k=4.0)
    0.05
    >>> round(noise_band([1.0, 1.1, 0.9, 1.0, 1.0], min_noise=0.05, spread_k=4.0), 6)   # MAD 0 -> the floor
    0.05
    >>> round(noise_band([1.0, 1.1, 0.9, 1.1, 0.9], min_noise=0.05, spread_k=4.0), 6)   # MAD 0.1 -> 4 x 10 %
    0.4
    """
    if not periods:
        raise ValueError("noise_band() needs at least one measured period (the baseline window is empty)")
    middle = statistics.median(periods)
    if not middle > 0:
        raise ValueError(f"noise_band(): the periods' median is {middle!r}, not > 0; pass measured periods in seconds")
    mad = statistics.median(abs(p - middle) for p in periods)
    return max(float(min_noise), spread_k * mad / middle)


def drift_detected(smoothed: Sequence[float], reference_s: float, noise: float, patience: int) -> bool:
    """True when the last ``patience`` smoothed periods all lie outside the band, on the same side.

    The band is ``reference_s * (1 - noise) .. reference_s * (1 + noise)``. Requiring ``patience`` periods in a
    row, all slower or all faster, keeps a burst of slow periods (another job's spike) from counting as drift.

    Parameters
    ----------
    smoothed : sequence of float
        The periods (seconds) in the order measured, usually rolling medians; only the last ``patience`` count.
    reference_s : float
        The period the plan runs at when nothing drifts (its baseline).
    noise : float
        The band's relative half-width (:func:`noise_band`).
    patience : int
        How many periods in a row must be out of the band (>= 1).

    Returns
    -------
    bool

    Examples
    --------
    >>> drift_detected([1.0, 1.3, 1.3, 1.3], reference_s=1.0, noise=0.1, patience=3)
    True
    >>> drift_detected([1.3, 1.3, 1.0, 1.3], reference_s=1.0, noise=0.1, patience=3)   # back in the band once
    False
    >>> drift_detected([0.5, 1.5, 0.5], reference_s=1.0, noise=0.1, patience=3)        # out on both sides: noise
    False
    >>> drift_detected([1.3, 1.3], reference_s=1.0, noise=0.1, patience=3)             # not yet patience periods
    False
    """
    if patience < 1:
        raise ValueError(f"drift_detected(patience={patience!r}): patience must be an integer >= 1")
    last = list(smoothed)[-patience:]
    if len(last) < patience:
        return False
    low, high = reference_s * (1.0 - noise), reference_s * (1.0 + noise)
    return all(p > high for p in last) or all(p < low for p in last)


def swap_worth_it(predicted_old_s: float, predicted_new_s: float, noise: float) -> bool:
    """True when the new plan's predicted period beats the old one's by more than the noise.

    Both predictions are of the same costs (the rolling costs now), so the model's own bias cancels; the gain must
    exceed ``noise``, the relative band a measured period stays in anyway, or the swap (a drain and a fill)
    could not be told from chance.

    Parameters
    ----------
    predicted_old_s, predicted_new_s : float
        The running plan's and the searched plan's predicted periods (seconds) on the rolling costs.
    noise : float
        The relative gain the new plan must exceed.

    Returns
    -------
    bool

    Examples
    --------
    >>> swap_worth_it(5.0, 4.0, noise=0.05)      # 20 % faster
    True
    >>> swap_worth_it(5.0, 4.9, noise=0.05)      # 2 %: within the noise
    False
    >>> swap_worth_it(5.0, 5.0, noise=0.0)       # no gain is never worth a drain
    False
    """
    return predicted_new_s < predicted_old_s * (1.0 - noise)


def exchange_step(index: int, every: int) -> bool:
    """True when the ranks exchange rank 0's decision after iteration (or step) ``index``: every ``every``-th one.

    On several ranks a decision can only be told, and so a swap only made, after such an iteration: rank 0's
    decision waits for the next one. The rule reads the run-wide index alone, so every rank running the same
    iterations exchanges after the same ones, whatever its clock says.

    Parameters
    ----------
    index : int
        The iteration (or step) that just retired, counted over the whole run from 0 (``>= 0``).
    every : int
        ``ReplanOptions.exchange_every`` (``>= 1``; 1: after every iteration).

    Returns
    -------
    bool
        ``(index + 1) % every == 0``: after the ``every``-th, ``2 * every``-th, ... iteration.

    Raises
    ------
    ValueError
        ``every`` is not an integer ``>= 1``.

    Examples
    --------
    >>> [i for i in range(40) if exchange_step(i, 16)]
    [15, 31]
    >>> all(exchange_step(i, 1) for i in range(5))
    True
    """
    ok, expected = integer(1)
    if not ok(every):
        raise ValueError(f"exchange_step(every={every!r}): expected {expected} (ReplanOptions.exchange_every)")
    return (index + 1) % every == 0
