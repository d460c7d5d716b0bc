"""What the re-planners decided, one entry per decision (ReplanDecision for a plan, SwitchDecision for a schedule or
a GPipe), and how a re-planning fails (ReplanError)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, Optional

from autosched.model.costs import CostModel
from swpipe_core.plan import PipelinePlan

__all__ = ["ReplanDecision", "ReplanError", "SwitchDecision"]

_log = logging.getLogger("swpipe.replan")


@dataclasses.dataclass
class ReplanDecision:
    """One decision: the drift that started a search, what the search predicted, and what was done.

    Attributes
    ----------
    detected_at : int
        The iteration whose period completed the drift (``patience`` rolling medians out of the band).
    decided_at : int
        The iteration after which the pipeline decided (``detected_at + search_periods``).
    reference_s, measured_s, noise : float
        The baseline period, the rolling median that left the band, and the band's relative half-width.
    costs : CostModel
        The costs the search ran on (what the cost source said at ``detected_at``): what caused the decision.
    cost_noise : float
        The cost source's relative spread of those costs.
    predicted_old_s, predicted_new_s : float
        The running plan's and the searched plan's simulated periods on ``costs``.
    swapped : bool
        Whether the pipeline swapped to ``plan``.
    plan : PipelinePlan
        The searched plan (the running one when the search found nothing else).
    starts_at : int or None
        The first iteration the new plan runs (every iteration before it ran the old plan, drained in order);
        ``None`` when not swapped.
    measured_after_s : float or None
        After a swap, the baseline median of the new plan (``None`` until measured, or when not swapped).
    waited_s : float
        How long the decision waited for the search to end.
    """

    detected_at: int
    decided_at: int
    reference_s: float
    measured_s: float
    noise: float
    costs: CostModel
    cost_noise: float
    predicted_old_s: float
    predicted_new_s: float
    swapped: bool
    plan: PipelinePlan
    starts_at: Optional[int] = None
    measured_after_s: Optional[float] = None
    waited_s: float = 0.0

    def __str__(self) -> str:
        what = f"swap at iteration {self.starts_at}" if self.swapped else "keep the plan"
        after = f", measured after {self.measured_after_s * 1e3:.3f} ms" if self.measured_after_s is not None else ""
        return (f"iteration {self.decided_at}: {what} (drift at {self.detected_at}: period "
                f"{self.measured_s * 1e3:.3f} ms vs {self.reference_s * 1e3:.3f} ms +- {self.noise:.0%}; predicted "
                f"{self.predicted_old_s * 1e3:.3f} -> {self.predicted_new_s * 1e3:.3f} ms{after})")


class ReplanError(RuntimeError):
    """The background search failed, or did not end in time.

    Attributes
    ----------
    iteration : int
        The iteration at which the pipeline decided (and found the failure).
    reason : str
        ``"failed"`` (the search raised: ``__cause__`` is its exception, ``traceback`` its text), ``"timeout"``
        (still running ``join_timeout_s`` after the decision point), on a rank other than 0 ``"failed on rank 0"``
        (rank 0's re-planning raised at this iteration) or ``"out of step"`` (rank 0 told about another iteration).
    traceback : str
        The search thread's traceback (empty for a timeout).
    """

    def __init__(self, iteration: int, reason: str, detail: str, traceback: str = "") -> None:
        self.iteration, self.reason, self.traceback = iteration, reason, traceback
        fix = {"timeout": "raise ReplanOptions(join_timeout_s=...) or lower time_limit_s",
               "failed on rank 0": "read rank 0's error (its search's traceback) and fix it there",
               "out of step": "give every rank the same number of batches (agree_on_end) and the same plan",
               }.get(reason, "the search's traceback follows; fix its input (costs, constraints) or pass a working "
                             "search=")
        super().__init__(f"re-planning at iteration {iteration}: {reason}: {detail}. Fix: {fix}"
                         + (f"\n{traceback}" if traceback else ""))


@dataclasses.dataclass
class SwitchDecision:
    """One decision of a re-planner that switches a runtime's configuration between steps.

    :class:`~swpipe.replan.schedule.AdaptiveSchedule` (PyTorch's pipelining schedule and micro-batch count) and
    :class:`~swpipe.replan.gpipe.AdaptiveGPipe` (GPipe's balance and chunks) log one per drift.

    Attributes
    ----------
    step : int
        The step (counted from 0) whose time completed the drift; the decision is made right after it.
    reference_s, measured_s, noise : float
        The baseline step time, the rolling median that left the band, and the band's relative half-width.
    costs : object
        The costs the candidates were predicted on (a ``PPCosts``, a ``LayerModel``): what caused the decision.
    predicted : dict
        Every candidate's predicted step time (seconds), by its label.
    running, chosen : str
        The running configuration's label and the fastest candidate's.
    predicted_old_s, predicted_new_s : float
        Their predicted step times.
    swapped : bool
        Whether the runtime switched to ``chosen`` (:func:`~swpipe.replan.rules.swap_worth_it`).
    starts_at : int or None
        The first step run by the new configuration (``step + 1``); ``None`` when not swapped.
    measured_after_s : float or None
        After a switch, the new configuration's baseline median (``None`` until measured, or when not swapped).
    choice : object
        What ``chosen`` is (a ``PPProgram``; a ``(balance, chunks)`` pair).
    """

    step: int
    reference_s: float
    measured_s: float
    noise: float
    costs: Any
    predicted: Dict[str, float]
    running: str
    chosen: str
    predicted_old_s: float
    predicted_new_s: float
    swapped: bool
    starts_at: Optional[int] = None
    measured_after_s: Optional[float] = None
    choice: Any = None

    def __str__(self) -> str:
        what = f"switch to {self.chosen} at step {self.starts_at}" if self.swapped else f"keep {self.running}"
        after = f", measured after {self.measured_after_s * 1e3:.3f} ms" if self.measured_after_s is not None else ""
        return (f"step {self.step}: {what} (step {self.measured_s * 1e3:.3f} ms vs {self.reference_s * 1e3:.3f} ms "
                f"+- {self.noise:.0%}; predicted {self.running} {self.predicted_old_s * 1e3:.3f} ms, {self.chosen} "
                f"{self.predicted_new_s * 1e3:.3f} ms{after})")

    def measured_after(self, reference_s: float) -> None:
        """Record the new configuration's first baseline (once), and log it beside the prediction."""
        if self.swapped and self.measured_after_s is None:
            self.measured_after_s = reference_s
            _log.info("re-planning: measured after the switch to %s at step %s: %.3f ms (predicted %.3f ms)",
                      self.chosen, self.starts_at, reference_s * 1e3, self.predicted_new_s * 1e3)
