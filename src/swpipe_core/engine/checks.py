"""What :class:`~swpipe_core.engine.pipeline.SWPipeline` checks before it builds or runs.

The constructor's arguments (a plan that validates, timeouts, a device-lag
bound, an RNG mode), whether the plan can run (every task bound
to a function), and whether the pipeline is idle (no pipelined iteration in
flight) before a call that needs it: each check raises an error that says
what to do instead.
"""

from __future__ import annotations

from typing import Any, Optional

from swpipe_core.engine.options import OptionError, Timeouts
from swpipe_core.engine.loop import PeriodLoop
from swpipe_core.plan import PipelinePlan
from swpipe_core.validate import PlanError, validate

__all__ = ["check_first_iter_idx"]


def check_arguments(plan: Any, timeouts: Any, max_device_lag: Any, rng: Any) -> None:
    """Raise on an argument of ``SWPipeline(...)`` it cannot run with (the plan is validated).

    Parameters
    ----------
    plan : Any
        Must be a :class:`~swpipe_core.plan.PipelinePlan` that passes :func:`~swpipe_core.validate.validate`.
    timeouts : Any
        ``None`` or a :class:`~swpipe_core.engine.options.Timeouts`.
    max_device_lag : Any
        ``None`` or an integer ``>= 0``.
    rng : Any
        ``None`` or ``"per_task"``.

    Raises
    ------
    TypeError
        ``plan`` is not a plan.
    PlanError
        The plan breaks a validation rule.
    OptionError
        ``timeouts``, ``max_device_lag`` or ``rng`` is out of range (a ``ValueError`` and a ``TypeError``).

    Examples
    --------
    >>> check_arguments(None, None, None, None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: SWPipeline needs a PipelinePlan, got NoneType; build one with PipelinePlan(...)
    >>> from swpipe import PipelinePlan, PipelineTask, TaskSchedule
    >>> plan = PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule()})
    >>> check_arguments(plan, None, -1, None)
    Traceback (most recent call last):
    ...
    swpipe_core.engine.options.OptionError: SWPipeline(max_device_lag=-1): expected None (the pipeline depth) or an integer >= 0
    """
    if not isinstance(plan, PipelinePlan):
        raise TypeError(f"SWPipeline needs a PipelinePlan, got {type(plan).__name__}; build one with "
                        "PipelinePlan(schedule={task: TaskSchedule(...)}, intra_iter_deps=[...])")
    validate(plan)
    if timeouts is not None and not isinstance(timeouts, Timeouts):
        raise OptionError("SWPipeline", "timeouts", timeouts, expected="None or Timeouts(signal_s=..., ...)")
    if max_device_lag is not None and (not isinstance(max_device_lag, int) or isinstance(max_device_lag, bool)
                                       or max_device_lag < 0):
        raise OptionError("SWPipeline", "max_device_lag", max_device_lag,
                          expected="None (the pipeline depth) or an integer >= 0")
    if rng not in (None, "per_task"):
        raise OptionError("SWPipeline", "rng", rng,
                          expected="None (tasks share torch's default generators) or 'per_task' (each task draws "
                                   "from its own generator, seeded from torch.initial_seed())")


def check_first_iter_idx(first_iter_idx: Any, given_to: str) -> int:
    """``first_iter_idx`` (the ``ctx.iter_idx`` of a run's first batch) as an int, or an error naming the call.

    Raises
    ------
    OptionError
        Not an integer ``>= 0`` (a ``ValueError`` and a ``TypeError``).

    Examples
    --------
    >>> check_first_iter_idx(40, "SWPipeline.run")
    40
    >>> check_first_iter_idx(-1, "SWPipeline.run")
    Traceback (most recent call last):
    ...
    swpipe_core.engine.options.OptionError: SWPipeline.run(first_iter_idx=-1): expected an integer >= 0 (the ctx.iter_idx of the first batch)
    """
    if not isinstance(first_iter_idx, int) or isinstance(first_iter_idx, bool) or first_iter_idx < 0:
        raise OptionError(given_to, "first_iter_idx", first_iter_idx,
                          expected="an integer >= 0 (the ctx.iter_idx of the first batch)")
    return first_iter_idx


def check_runnable(plan: PipelinePlan) -> None:
    """Raise unless every task of ``plan`` has a function (an analysis-only plan cannot run).

    Raises
    ------
    PlanError
        Rule ``unbound-task``, naming the unbound tasks.
    """
    unbound = [t.name for t in plan.tasks if not callable(t.fn)]
    if unbound:
        raise PlanError(
            "unbound-task",
            f"the plan cannot run: task(s) {unbound} have no function (analysis-only plan)",
            unbound,
            "bind functions with plan.bind({name: fn, ...}) or PipelineTask(name, fn); "
            "an unbound plan can still be printed and analysed (format_schedule, print_stage_analysis)",
        )


def check_idle(run: Optional[PeriodLoop], what: str) -> None:
    """Raise if ``run`` still has pipelined iterations in flight (``what`` names the call refused).

    Raises
    ------
    RuntimeError
        Iterations are in flight: the message says to call ``drain()`` first.
    """
    if run is not None and run.busy:
        raise RuntimeError(f"{what} while {run.in_flight} pipelined iteration(s) are in flight; "
                           "call drain() first")
