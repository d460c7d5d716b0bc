"""Re-planning while training runs: when the measured period drifts, search again and swap plans at a drain.

``AdaptivePipeline(plan, costs, "cpu")`` is used like ``SWPipeline``; the rules it decides by are pure functions
(:mod:`swpipe.replan.rules`), its cost source an interface (:mod:`swpipe.replan.costs_now`). The same rules
choose PyTorch's pipelining schedule between steps (``AdaptiveSchedule``, also ``swpipe.pp.AdaptiveSchedule``) and
GPipe's balance and chunks (``AdaptiveGPipe``, also ``swpipe.gpipe.AdaptiveGPipe``). See docs/guide/replan.md.
"""

from swpipe.replan.adaptive import AdaptivePipeline, default_search, predicted_period
from swpipe.replan.costs_now import CostSnapshot, CostSource, RollingSource
from swpipe.replan.gpipe import AdaptiveGPipe
from swpipe.replan.log import ReplanDecision, ReplanError, SwitchDecision
from swpipe.replan.options import ReplanOptions
from swpipe.replan.rules import drift_detected, exchange_step, noise_band, swap_worth_it
from swpipe.replan.schedule import AdaptiveSchedule, choose_schedule
from swpipe.replan.watch import PeriodWatch

__all__ = ["AdaptivePipeline", "ReplanOptions", "ReplanDecision", "ReplanError", "CostSnapshot", "CostSource",
           "RollingSource", "default_search", "predicted_period", "drift_detected", "noise_band", "swap_worth_it",
           "exchange_step", "AdaptiveSchedule", "AdaptiveGPipe", "SwitchDecision", "PeriodWatch", "choose_schedule"]
