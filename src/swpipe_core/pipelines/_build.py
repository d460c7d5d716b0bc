"""Shared helper of the pipeline factories: names -> an (optionally bound) plan."""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from swpipe_core.plan import IterContext, PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.pipelines.orders import apply_order

__all__ = ["TaskFns", "make_plan"]

TaskFns = Optional[Mapping[str, Callable[[IterContext], None]]]


def make_plan(
    pipeline: str,
    schedule: Dict[str, TaskSchedule],
    intra: Sequence[Tuple[str, str]],
    inter: Sequence[tuple] = (),
    fns: TaskFns = None,
    order: Optional[str] = None,
) -> PipelinePlan:
    """Build the plan of ``pipeline`` from task names, binding ``fns`` by name.

    Tasks without a function stay unbound (analysis only); a function for a
    task the pipeline does not have is an error, since it is almost always a
    misspelt name.

    Parameters
    ----------
    pipeline : str
        The pipeline's name, for error messages.
    schedule : dict
        ``{task_name: TaskSchedule}`` in definition order.
    intra, inter : sequences of dependency tuples (names)
    fns : mapping, optional
        ``{task_name: fn(ctx)}``.
    order : {None, "torchrec", "ready_first", "stage_descending"}, optional
        The enqueue order (:func:`~swpipe_core.pipelines.orders.apply_order`).

    Returns
    -------
    PipelinePlan

    Raises
    ------
    ValueError
        If ``fns`` names a task the pipeline does not have, or for a bad ``order``.

    Examples
    --------
    >>> from swpipe import TaskSchedule
    >>> plan = make_plan("demo", {"A": TaskSchedule(0)}, [], fns={"A": print})
    >>> plan.unbound_tasks(), plan.task("A").fn is print
    ([], True)
    >>> make_plan("demo", {"A": TaskSchedule(0)}, [], fns={"B": print})
    Traceback (most recent call last):
    ...
    ValueError: pipeline 'demo' has no task(s) ['B']; its tasks are ['A']
    """
    fns = dict(fns or {})
    unknown = sorted(set(fns) - set(schedule))
    if unknown:
        raise ValueError(f"pipeline {pipeline!r} has no task(s) {unknown}; its tasks are {list(schedule)}")
    tasks: List[PipelineTask] = [PipelineTask(name, fns.get(name)) for name in schedule]
    plan = PipelinePlan(
        schedule={t: schedule[t.name] for t in tasks},
        intra_iter_deps=list(intra),
        inter_iter_deps=list(inter),
    )
    return apply_order(pipeline, plan, order)
