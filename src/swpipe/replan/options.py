"""ReplanOptions: when the re-planner calls the period drifted, and how long the search for a new plan may run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from autosched._fields import OptionError, check_fields, fraction, integer, number, optional, time_limit
from autosched.search.options import Constraints

__all__ = ["ReplanOptions"]


@dataclass
class ReplanOptions:
    """When :class:`~swpipe.replan.adaptive.AdaptivePipeline` searches again, and how.

    After a fill (the first one, and each one after a swap) the pipeline skips ``warmup`` periods, measures a
    baseline of ``window`` periods (its median is the reference, their spread the noise band,
    :func:`~swpipe.replan.rules.noise_band`), then watches the rolling median of the last ``window`` periods.
    When ``patience`` rolling medians in a row leave the band (:func:`~swpipe.replan.rules.drift_detected`), a
    search runs in the background on the costs now, and ``search_periods`` periods later the pipeline decides:
    swap (:func:`~swpipe.replan.rules.swap_worth_it`) or keep the plan and take the new level as the reference.

    Parameters
    ----------
    warmup : int
        Periods skipped after a fill before the baseline starts.
    window : int
        Periods in the baseline and in the rolling median.
    patience : int
        Rolling medians in a row out of the band before a search starts.
    min_noise : float
        The least relative half-width of the band (a fraction).
    spread_k : float
        The band's half-width in robust spreads (median absolute deviations) of the baseline.
    time_limit_s : float
        The search's time budget (``SolverOptions.time_limit_s``).
    search_periods : int, optional
        Periods between the drift and the decision; the pipeline waits for the search there if it still runs.
        ``None``: ``time_limit_s`` over the reference period, plus one. A fixed count, not "whenever the search
        ends", so the decision's iteration is the same however fast the machine is.
    constraints : Constraints, optional
        What the new plan may be (default ``Constraints()``).
    join_timeout_s : float
        How long the decision waits for the search beyond that (then a :class:`ReplanError`).
    exchange_every : int
        On several ranks (a ``group``), the iterations (steps) between two exchanges of rank 0's decision: the ranks
        take part in one small broadcast after every ``exchange_every``-th iteration only
        (:func:`~swpipe.replan.rules.exchange_step`), and a decision, a swap or a failure waits for the next one, so
        every rank swaps (or raises) at the same iteration. Larger: less per-iteration cost, a later swap. One
        rank: not read.

    Examples
    --------
    >>> ReplanOptions(patience=5).window
    20
    >>> ReplanOptions(patience=0)
    Traceback (most recent call last):
    ...
    swpipe_core.engine.options.OptionError: ReplanOptions(patience=0): expected an integer >= 1
    """

    warmup: int = 5
    window: int = 20
    patience: int = 20
    min_noise: float = 0.05
    spread_k: float = 4.0
    time_limit_s: float = 1.0
    search_periods: Optional[int] = None
    constraints: Optional[Constraints] = None
    join_timeout_s: float = 60.0
    exchange_every: int = 16

    def __post_init__(self) -> None:
        check_fields(self, {
            "warmup": integer(0), "window": integer(1), "patience": integer(1), "min_noise": fraction(),
            "spread_k": number(0), "time_limit_s": time_limit(), "search_periods": optional(integer(1)),
            "join_timeout_s": time_limit(), "exchange_every": integer(1),
        })
        if self.constraints is not None and not isinstance(self.constraints, Constraints):
            raise OptionError("ReplanOptions", "constraints", self.constraints, expected="a Constraints or None")
