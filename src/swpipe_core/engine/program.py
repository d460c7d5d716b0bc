"""The plan compiled for the engine's hot path: tasks by index, device waits, each period's program.

:func:`compile_plan` turns a :class:`~swpipe_core.plan.PipelinePlan` into a
:class:`CompiledPlan`: one :class:`TaskInfo` per task (dependencies as
indices, the device waits a task needs because a dependency runs on another
*resolved* stream), the contract's walk (:class:`~swpipe_core.walk.PeriodWalk`)
and the thread groups. :meth:`CompiledPlan.program` turns one period of the
walk into the segments the caller hands to workers and runs inline, compiled
once per period shape and cached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from swpipe_core.engine.streams import StreamPool
from swpipe_core.plan import PipelinePlan, PipelineTask, StreamSpec
from swpipe_core.walk import PeriodWalk, Shape

__all__ = ["TaskInfo", "CompiledPlan", "compile_plan"]

#: A segment: the worker steps handed off together ``[(group, [position, ...]), ...]``, then the caller's inline steps.
Segment = Tuple[List[Tuple[str, List[int]]], List[int]]


@dataclass(eq=False)
class TaskInfo:
    """A task compiled for the hot path: indices instead of names."""

    idx: int
    task: PipelineTask
    name: str
    stage: int
    group: str
    stream_spec: StreamSpec
    stream: str
    ordered: bool
    deps: Tuple[Tuple[int, int], ...]         # (dep index, distance); distance 0 = same iteration
    device_deps: Tuple[Tuple[int, int], ...]  # the deps on another stream (phase 2)
    starts: bool = False                      # no dependency within its iteration: waits for the batch (CUDA)


#: A period's program: the task of each step, and its segments.
Program = Tuple[List[TaskInfo], List[Segment]]


@dataclass(eq=False)
class CompiledPlan:
    """A plan as the engine runs it (built once per pipeline by :func:`compile_plan`).

    Attributes
    ----------
    tasks : list of TaskInfo
        In ``plan.task_names`` order (``tasks[k].idx == k``).
    by_name : dict
        The same, by task name.
    walk : PeriodWalk
        The contract's walk of a period.
    caller_group : str or None
        The group whose tasks the caller runs inline (``None``: every group has a worker).
    worker_groups : list of str
        The other groups, one worker thread each, in enqueue order.
    device_waits : dict
        ``{task: ((dependency, distance), ...)}``: the dependencies whose device event the task's stream waits for.
    event_horizon : int
        How many iterations back a task may wait for a device event: the largest distance of a device wait (else 0).
    """

    tasks: List[TaskInfo]
    by_name: Dict[str, TaskInfo]
    walk: PeriodWalk
    caller_group: Optional[str]
    worker_groups: List[str]
    device_waits: Dict[str, Tuple[Tuple[str, int], ...]]
    event_horizon: int = 0
    programs: Dict[Tuple[int, int], Program] = field(default_factory=dict)

    def program(self, period: int, oldest: int, fetched: int) -> Program:
        """The program of ``period`` when iterations ``oldest .. fetched - 1`` are in flight (cached per shape)."""
        key = self.walk.key(period, oldest, fetched)
        found = self.programs.get(key)
        if found is None:  # a period shape not seen yet: compiled once, then cached
            found = self.programs[key] = period_program(self.walk.shape(period, oldest, fetched), self.by_name)
        return found


def compile_plan(plan: PipelinePlan, streams: StreamPool) -> CompiledPlan:
    """The plan's tasks compiled to :class:`TaskInfo` (indices, not names), its walk and its thread groups.

    "Same stream" is decided on the resolved stream (device + stream id,
    :meth:`StreamPool.key <swpipe_core.engine.streams.StreamPool.key>`), never on the name.

    Parameters
    ----------
    plan : PipelinePlan
    streams : StreamPool
        Resolves each task's stream.

    Returns
    -------
    CompiledPlan

    Examples
    --------
    >>> from swpipe_core.engine.device import as_device
    >>> from swpipe import TaskSchedule
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="io"), "B": TaskSchedule(1)},
    ...                     intra_iter_deps=[("B", "A")])
    >>> compiled = compile_plan(plan, StreamPool(as_device("cpu")))
    >>> [(t.name, t.deps) for t in compiled.tasks], compiled.caller_group, compiled.worker_groups
    ([('A', ()), ('B', ((0, 0),))], 'default', ['io'])
    >>> compiled.device_waits
    {'A': (), 'B': ()}
    """
    names = plan.task_names
    index = {n: i for i, n in enumerate(names)}
    deps: Dict[str, Dict[Tuple[int, int], None]] = {n: {} for n in names}
    for t, d in plan.intra_edges():
        deps[t][(index[d], 0)] = None
    for t, d, n in plan.inter_edges():
        deps[t][(index[d], n)] = None
    keys = [streams.key(plan.sched(n).stream) for n in names]
    tasks = []
    for name in names:
        sched = plan.sched(name)
        own = tuple(deps[name])
        device_deps = tuple((d, n) for d, n in own if keys[d] != keys[index[name]])
        starts = not any(n == 0 for _, n in own)  # every other task is ordered after one that does
        tasks.append(TaskInfo(index[name], plan.task(name), name, sched.stage, sched.thread_group,
                              sched.stream, plan.stream_of(name), sched.globally_ordered, own, device_deps, starts))
    walk = PeriodWalk(plan)
    groups = list(dict.fromkeys(plan.sched(n).thread_group for n in walk.order))
    return CompiledPlan(
        tasks=tasks,
        by_name={t.name: t for t in tasks},
        walk=walk,
        caller_group=walk.caller,  # runs inline on the thread calling fill_pipeline/progress: no hand-off
        worker_groups=[g for g in groups if g != walk.caller],
        device_waits={t.name: tuple((names[d], n) for d, n in t.device_deps) for t in tasks},
        event_horizon=max((n for t in tasks for _, n in t.device_deps), default=0),
    )


def period_program(shape: Shape, by_name: Mapping[str, TaskInfo]) -> Program:
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
    (list of TaskInfo, list of segments)
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
