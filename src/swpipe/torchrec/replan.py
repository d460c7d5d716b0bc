"""``TrainPipeline(replan=...)``: the drop-in's plan run by :class:`~swpipe.replan.AdaptivePipeline`.

With re-planning on, the drop-in's engine is an ``AdaptivePipeline`` (:func:`adaptive_engine`): it watches the
measured period, searches on the tasks' recent durations when it drifts, and swaps plans at a drain, every rank at
the same iteration (rank 0 decides, :class:`~swpipe.replan.ranks.DecisionExchange`, on the drop-in's own gloo
group). Two things are the drop-in's own:

* the search stays among plans the drop-in can drive (:func:`drop_in_search`): the running plan's depth, the
  forward and the tasks after it in the last stage (:func:`~swpipe.torchrec.plans.at_depth`), and the plan found
  made runnable as every drop-in plan is (:func:`~swpipe.torchrec.plans.runnable`: bound to the model's task
  functions, the forward's group the caller's, collectives globally ordered on several ranks); a plan it cannot
  drive is no swap;
* the costs: the drop-in has no profile of a named plan, so every task starts at no cost and the search runs on
  the medians of the tasks' recent durations (every task runs each iteration, so by the time the period drifts,
  each has a full window: :class:`~swpipe.replan.costs_now.RollingSource`).

Each plan after a swap numbers its iterations on from the pass's (``SWPipeline``'s ``first_iter_idx``), so the
tasks' per-batch state (:attr:`TorchRecTasks.modes <swpipe.torchrec.tasks.TorchRecTasks.modes>`, the outputs
``progress`` returns) is keyed by the same index before and after a swap. Nothing here imports TorchRec.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

import torch

from autosched.model.costs import CostModel
from autosched.model.taskcost import TaskCost
from swpipe.replan.adaptive import AdaptivePipeline, Search, default_search
from swpipe.replan.costs_now import CostSource
from swpipe.replan.options import ReplanOptions
from swpipe.torchrec.auto import auto_options
from swpipe.torchrec.plans import at_depth, check_shape, runnable
from swpipe.torchrec.tasks import TorchRecTasks
from swpipe_core.engine.options import OptionError
from swpipe_core.plan import PipelinePlan

__all__ = ["replan_options", "drop_in_search", "adaptive_engine"]

_log = logging.getLogger(__name__)


def replan_options(replan: Any) -> Optional[ReplanOptions]:
    """What ``TrainPipeline(replan=...)`` asks for: ``None`` (no re-planning) or the options.

    Raises
    ------
    OptionError
        Anything but ``None``, a bool or a :class:`~swpipe.replan.options.ReplanOptions` (a ``TypeError``).

    Examples
    --------
    >>> replan_options(True).patience, replan_options(False), replan_options(ReplanOptions(window=8)).window
    (20, None, 8)
    >>> replan_options({"window": 8})
    Traceback (most recent call last):
    ...
    swpipe_core.engine.options.OptionError: TrainPipeline(replan={'window': 8}): expected True, False, None or a ReplanOptions(...)
    """
    if replan is None or replan is False:
        return None
    if replan is True:
        return ReplanOptions()
    if isinstance(replan, ReplanOptions):
        return replan
    raise OptionError("TrainPipeline", "replan", replan, expected="True, False, None or a ReplanOptions(...)")


def drop_in_search(search: Search, tasks: TorchRecTasks, world_size: int = 1) -> Search:
    """``search``, its answer made a plan the drop-in can drive; a plan it cannot drive keeps the running one.

    Parameters
    ----------
    search : callable
        ``search(plan, costs) -> PipelinePlan``.
    tasks : TorchRecTasks
        The task functions the plan found is bound to.
    world_size : int
        Ranks: on several, the collectives of the plan found are globally ordered.

    Returns
    -------
    callable
        ``search(plan, costs) -> PipelinePlan``: the plan found, :func:`~swpipe.torchrec.plans.runnable`; the
        running ``plan`` itself (no swap) when :func:`~swpipe.torchrec.plans.check_shape` refuses it.

    Examples
    --------
    >>> from swpipe_core.plan import TaskSchedule
    >>> tasks = TorchRecTasks(torch.nn.Identity(), None, torch.device("cpu"), None)
    >>> running = runnable(PipelinePlan({"H2D": TaskSchedule(0), "Forward": TaskSchedule(1)}, [("Forward", "H2D")]),
    ...                    tasks.functions(["H2D", "Forward"]))
    >>> early = PipelinePlan({"H2D": TaskSchedule(0), "Forward": TaskSchedule(0), "Backward": TaskSchedule(1)},
    ...                      [("Forward", "H2D"), ("Backward", "Forward")])  # the forward not in the last stage
    >>> drop_in_search(lambda plan, costs: early, tasks)(running, None) is running
    True
    """
    def shaped(plan: PipelinePlan, costs: CostModel) -> PipelinePlan:
        found = search(plan, costs)
        try:
            check_shape(found)
        except ValueError as exc:
            _log.info("re-planning: the plan found is not one the drop-in can drive (%s); keeping the running plan",
                      exc)
            return plan
        return runnable(found, tasks.functions(found.task_names), world_size)

    return shaped


def adaptive_engine(plan: PipelinePlan, tasks: TorchRecTasks, device: torch.device, options: ReplanOptions,
                    world_size: int = 1, group: Any = None, *, cost_source: Optional[CostSource] = None,
                    search: Optional[Search] = None, clock: Optional[Callable[[], float]] = None,
                    **pipeline_options: Any) -> AdaptivePipeline:
    """The drop-in's engine with re-planning: an :class:`~swpipe.replan.AdaptivePipeline` running ``plan``.

    Parameters
    ----------
    plan : PipelinePlan
        The drop-in's plan, runnable (:func:`~swpipe.torchrec.plans.runnable`).
    tasks : TorchRecTasks
        Its task functions (every plan swapped in is bound to them).
    device : torch.device
        The pipeline's.
    options : ReplanOptions
        When and how to re-plan. ``options.constraints`` are checked as ``plan="auto"``'s (the forward's stage
        may not be frozen); the default search runs at ``plan``'s depth, the forward and the tasks after it in
        the last stage (:func:`~swpipe.torchrec.plans.at_depth`).
    world_size : int
        Ranks.
    group : torch.distributed.ProcessGroup, optional
        With several ranks, the drop-in's own gloo group: rank 0 decides and tells the others on it.
    cost_source, search, clock
        As ``AdaptivePipeline``'s (a scripted clock and search make a test's decisions deterministic); ``search``
        is kept to plans the drop-in can drive (:func:`drop_in_search`). Default: the tasks' recent durations
        (every task starting at no cost), ``auto_schedule`` within ``options.time_limit_s``, ``time.perf_counter``.
    **pipeline_options
        Passed to every ``SWPipeline`` (``state``, ``timeouts``).

    Returns
    -------
    AdaptivePipeline

    Raises
    ------
    TypeError, ValueError
        ``options.constraints`` the drop-in cannot search with (as ``plan="auto"``'s).

    Examples
    --------
    >>> from swpipe_core.plan import TaskSchedule
    >>> tasks = TorchRecTasks(torch.nn.Identity(), None, torch.device("cpu"), None)
    >>> plan = runnable(PipelinePlan({"H2D": TaskSchedule(0), "Forward": TaskSchedule(1)}, [("Forward", "H2D")]),
    ...                 tasks.functions(["H2D", "Forward"]))
    >>> engine = adaptive_engine(plan, tasks, torch.device("cpu"), ReplanOptions())
    >>> engine.plan is plan, sorted(engine.cost_source.base.tasks)
    (True, ['Forward', 'H2D'])
    """
    constraints, _, _ = auto_options(options.constraints, None, None, device)
    if search is None:
        search = default_search(dataclasses.replace(
            options, constraints=at_depth(constraints, plan.task_names, plan.pipeline_depth, plan.caller_group)))
    costs = CostModel({name: TaskCost(0.0) for name in plan.task_names},
                      method="swpipe.torchrec re-planning: no cost until the tasks' recent durations say")
    return AdaptivePipeline(plan, costs, device, replan=options, cost_source=cost_source,
                            search=drop_in_search(search, tasks, world_size), clock=clock, group=group,
                            **pipeline_options)
