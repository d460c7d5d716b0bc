"""PeriodWatch: one measured period after another, judged by the re-planning rules: warm-up, baseline, drift.

Every re-planner (a plan's :class:`~swpipe.replan.adaptive.AdaptivePipeline`, PyTorch's pipelining schedules'
:class:`~swpipe.replan.schedule.AdaptiveSchedule`, GPipe's :class:`~swpipe.replan.gpipe.AdaptiveGPipe`) feeds its
periods (or steps) here, so all of them call drift by the same rules (:mod:`swpipe.replan.rules`) and the same
:class:`~swpipe.replan.options.ReplanOptions`.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Deque, List, Optional

from swpipe.replan.options import ReplanOptions
from swpipe.replan.rules import drift_detected, noise_band

__all__ = ["PeriodWatch"]


class PeriodWatch:
    """The periods of one plan (or schedule) since it started: warm-up, baseline, then the rolling median watched.

    :meth:`add` skips ``warmup`` periods, collects ``window`` of them as the baseline (its median is
    :attr:`reference_s`, its spread the band :attr:`noise`, :func:`~swpipe.replan.rules.noise_band`), then appends
    each rolling median of the last ``window`` periods and says when ``patience`` of them in a row left the band
    (:func:`~swpipe.replan.rules.drift_detected`).

    Parameters
    ----------
    options : ReplanOptions
        ``warmup``, ``window``, ``patience``, ``min_noise``, ``spread_k``.

    Attributes
    ----------
    reference_s : float or None
        The baseline's median (``None`` until ``warmup + window`` periods were added).
    noise : float
        The band's relative half-width (0 until then).

    Examples
    --------
    >>> watch = PeriodWatch(ReplanOptions(warmup=1, window=2, patience=2, min_noise=0.1))
    >>> [watch.add(p) for p in (9.0, 1.0, 1.0, 1.0, 2.0, 2.0)]   # rolling medians 1.0, 1.5, 2.0
    [None, None, 'baseline', None, None, 'drift']
    >>> watch.reference_s, watch.last_s
    (1.0, 2.0)
    >>> watch.rebase(watch.last_s); watch.add(2.0) is None
    True
    """

    def __init__(self, options: ReplanOptions) -> None:
        self.options = options
        self.seen = 0
        self.baseline: List[float] = []
        self.reference_s: Optional[float] = None
        self.noise = 0.0
        self._recent: Deque[float] = deque(maxlen=options.window)
        self.smoothed: Deque[float] = deque(maxlen=options.patience)

    def add(self, period_s: float) -> Optional[str]:
        """One more period: ``"baseline"`` when it completed the baseline, ``"drift"`` when it completed a drift."""
        opts = self.options
        self.seen += 1
        if self.seen <= opts.warmup:
            return None
        if self.reference_s is None:
            self.baseline.append(period_s)
            if len(self.baseline) < opts.window:
                return None
            self.reference_s = statistics.median(self.baseline)
            self.noise = noise_band(self.baseline, opts.min_noise, opts.spread_k)
            self._recent.extend(self.baseline)
            return "baseline"
        self._recent.append(period_s)
        self.smoothed.append(statistics.median(self._recent))
        return "drift" if drift_detected(self.smoothed, self.reference_s, self.noise, opts.patience) else None

    @property
    def last_s(self) -> Optional[float]:
        """The last rolling median (``None`` before the first one after the baseline)."""
        return self.smoothed[-1] if self.smoothed else None

    def rebase(self, reference_s: float) -> None:
        """Take ``reference_s`` as the steady level from now on (the plan was kept); the drift count starts over."""
        self.reference_s = reference_s
        self.smoothed.clear()
