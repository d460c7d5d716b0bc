"""The plan compiled for the engine's hot path: tasks by index, device waits, and each period's program.

:func:`compile_tasks` turns a :class:`~swpipe_core.plan.PipelinePlan` into
:class:`~swpipe_core.engine.state._TaskInfo` records (dependencies as
indices, the device waits a task needs because a dependency runs on another
*resolved* stream); :func:`period_program` turns one period shape of the
walk (:class:`~swpipe_core.walk.PeriodWalk`) into the segments the caller
hands to workers and runs inline. The pipeline caches programs per shape.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from swpipe_core.engine.state import _TaskInfo
from swpipe_core.engine.streams import StreamPool
from swpipe_core.plan import PipelinePlan

__all__: List[str] = []

#: A segment: the worker steps handed off together ``[(group, [position, ...]), ...]``, then the caller's inline steps.
Segment = Tuple[List[Tuple[str, List[int]]], List[int]]
#: A period's program: the task of each step, and its segments.
Program = Tuple[List[_TaskInfo], List[Segment]]


def compile_tasks(plan: PipelinePlan, streams: StreamPool) -> List[_TaskInfo]:
    """The plan's tasks, in ``plan.task_names`` order, compiled to :class:`_TaskInfo` (indices, not names).

    "Same stream" is decided on the resolved stream (device + stream id,
    :meth:`StreamPool.key <swpipe_core.engine.streams.StreamPool.key>`), never on the name.

    Parameters
    ----------
    plan : PipelinePlan
    streams : StreamPool
        Resolves each task's stream.

    Returns
    -------
    list of _TaskInfo
    """
    names = plan.task_names
    index = {n: i for i, n in enumerate(names)}
    deps: Dict[str, Dict[Tuple[int, int], None]] = {n: {} for n in names}
    for t, d in plan.intra_edges():
        deps[t][(index[d], 0)] = None
    for t, d, n in plan.inter_edges():
        deps[t][(index[d], n)] = None
    keys = [streams.key(plan.sched(n).stream) for n in names]
    infos = []
    for name in names:
        sched = plan.sched(name)
        own = tuple(deps[name])
        device_deps = tuple((d, n) for d, n in own if keys[d] != keys[index[name]])
        starts = not any(n == 0 for _, n in own)  # every other task is ordered after one that does
        infos.append(_TaskInfo(index[name], plan.task(name), name, sched.stage, sched.thread_group,
                               sched.stream, plan.stream_of(name), sched.globally_ordered, own, device_deps, starts))
    return infos


def device_waits(infos: List[_TaskInfo]) -> Dict[str, Tuple[Tuple[str, int], ...]]:
    """The resolved device waits, ``{task: ((dependency, distance), ...)}`` (inspectable on CPU too).

    Examples
    --------
    >>> from swpipe_core.engine.device import as_device
    >>> from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
    >>> plan = PipelinePlan({PipelineTask("A", None): TaskSchedule(), PipelineTask("B", None): TaskSchedule()},
    ...                     intra_iter_deps=[("B", "A")])
    >>> device_waits(compile_tasks(plan, StreamPool(as_device("cpu"))))
    {'A': (), 'B': ()}
    """
    return {ti.name: tuple((infos[d].name, n) for d, n in ti.device_deps) for ti in infos}


def period_program(shape: Any, by_name: Mapping[str, _TaskInfo]) -> Program:
    """A period shape compiled for the hot path: its tasks, and its segments by position.

    A segment is the worker steps handed off together (by group), then the
    caller's steps run inline before the next worker step; the walk says
    where each worker step is handed off (:attr:`Step.after
    <swpipe_core.walk.Step.after>`).

    Parameters
    ----------
    shape : swpipe_core.walk.Shape
        One period's steps, from :meth:`PeriodWalk.shape <swpipe_core.walk.PeriodWalk.shape>`.
    by_name : mapping
        The compiled tasks by name.

    Returns
    -------
    (list of _TaskInfo, list of segments)
    """
    infos = [by_name[task] for task, _, _, _ in shape.steps]
    segments: List[Segment] = []
    handoff: Dict[str, List[int]] = {}
    inline: List[int] = []
    handed_after: Optional[int] = None
    for k, (task, _, is_inline, after) in enumerate(shape.steps):
        if is_inline:
            inline.append(k)
            continue
        if after != handed_after:  # handed off once the caller ran its step `after`
            segments.append((list(handoff.items()), inline))
            handoff, inline, handed_after = {}, [], after
        handoff.setdefault(infos[k].group, []).append(k)
    segments.append((list(handoff.items()), inline))
    return infos, segments
