"""What the simulator reads and never changes: a plan, its costs and the run's options as integer tables.

:func:`sim_plan` compiles them once per :func:`autosched.model.simulate.simulate` call
(the runs it lengthens share it), as the engine compiles a plan for its hot path
(:mod:`swpipe_core.engine.program`). Task ``k`` is ``plan.task_names[k]``; thread
groups, streams and the cost model's resource tags are numbered in sorted order
of their names; every per-task fact is a list indexed by ``k``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan
from swpipe_core.walk import PeriodWalk

from autosched.model.costs import CostModel
from autosched.model.taskmodel import NOCORE, TaskParts, plan_parts, pool_limit, resource_loads, stream_label, task_parts

__all__ = ["SimPlan", "Dep", "sim_plan", "task_sim_plan"]

# one dependency of a task: (task it waits for, distance in iterations, CPU-signal wait label, device-event wait label)
Dep = Tuple[int, int, str, str]


@dataclass(frozen=True)
class SimPlan:
    """The plan as the simulator reads it: one list per fact, indexed by task, group, stream or resource.

    Attributes
    ----------
    names : list of str
        Task ``k``'s name.
    index : dict
        ``{task name: k}``.
    walk : PeriodWalk
        The contract's walk of a period (:mod:`swpipe_core.walk`).
    stage : list of int
        Task ``k``'s stage; ``depth`` the pipeline depth.
    group_names, thread : list
        The thread groups by name, and task ``k``'s group (an index into them).
    thread_labels, fifo_labels : list of str
        How the waits on group ``g``'s thread (``"thread:<g>"``) and in its FIFO
        behind earlier tasks (``"fifo:<g>"``) are named in stalls and the critical cycle.
    caller : int
        The caller's group (it runs on the main thread), -1 when every group has a worker.
    stream_names, stream_labels, stream : list
        The streams' normalised names, their waits' names (``"stream:<s>"``), and task ``k``'s stream.
    ordered : list of bool
        Task ``k`` is globally ordered (takes sequencer turns).
    parts : list of TaskParts
        Task ``k``'s host and device parts (:mod:`autosched.model.taskmodel`); ``host``,
        ``device`` and ``takes_core`` repeat their fields for the hot path.
    res_names, res, comm : list
        The cost model's shared resource tags by name, the tags each task holds
        (indices), and whether tag ``r`` is a communicator (CUDA: run in submission order).
    cores, pool_size : int or None, int
        ``CostModel.cores``, and the core pool's size where it can make a part
        wait (:func:`~autosched.model.taskmodel.pool_limit`), else 0.
    deps : list of list of Dep
        What task ``k`` waits for, as ``(task, distance, CPU-signal label, device-event label)``
        (``PipelinePlan.intra_edges`` at distance 0, then ``PipelinePlan.inter_edges``).
    cuda : bool
        Device parts on streams (else all of a task's time is host time).
    period_overhead, max_device_lag : float, int
        The main thread's time per enqueued period, and how many iterations the
        device may lag the host (CUDA).
    """

    names: List[str]
    index: Dict[str, int]
    walk: PeriodWalk
    stage: List[int]
    depth: int
    group_names: List[str]
    thread_labels: List[str]
    fifo_labels: List[str]
    thread: List[int]
    caller: int
    stream_names: List[str]
    stream_labels: List[str]
    stream: List[int]
    ordered: List[bool]
    parts: List[TaskParts]
    host: List[float]
    device: List[float]
    takes_core: List[bool]
    res_names: List[str]
    res: List[Tuple[int, ...]]
    comm: List[bool]
    cores: Optional[int]
    pool_size: int
    deps: List[List[Dep]]
    cuda: bool
    period_overhead: float
    max_device_lag: int

    @property
    def tasks(self) -> int:
        """How many tasks the plan has."""
        return len(self.names)

    def busiest_load(self) -> float:
        """Seconds per iteration that the busiest resource must work: no steady period is shorter.

        Every iteration runs every task once, so each thread group, stream (CUDA),
        communicator, PCIe, the sequencer and the main thread (``period_overhead_s``
        per period) is held this long per iteration, whatever the order.
        """
        load = resource_loads(self.parts, self.cores)
        if self.caller >= 0:  # the main thread also runs the caller's group
            key = self.thread_labels[self.caller]
            load[key] = load.get(key, 0.0) + self.period_overhead
        return max(list(load.values()) + [self.period_overhead])


def sim_plan(plan: PipelinePlan, costs: CostModel, *, cuda: bool, task_overhead_s: float,
             period_overhead_s: float, max_device_lag: int) -> SimPlan:
    """Compile a validated plan and the cost model of its tasks for :class:`autosched.model._simcore.Simulator`."""
    names = plan.task_names
    index = {name: k for k, name in enumerate(names)}
    sched = [plan.sched(name) for name in names]
    group_names = sorted({s.thread_group for s in sched})
    streams = [stream_label(s.stream) for s in sched]
    stream_names = sorted(set(streams))
    by_name = plan_parts(plan, costs, cuda, task_overhead_s)
    parts = [by_name[name] for name in names]
    res_names = sorted({r for p in parts for r in p.shared})
    return SimPlan(
        names=names, index=index, walk=PeriodWalk(plan), stage=[s.stage for s in sched], depth=plan.pipeline_depth,
        group_names=group_names, thread_labels=[f"thread:{g}" for g in group_names],
        fifo_labels=[f"fifo:{g}" for g in group_names], thread=[group_names.index(s.thread_group) for s in sched],
        caller=group_names.index(plan.caller_group) if plan.caller_group in group_names else -1,
        stream_names=stream_names, stream_labels=[f"stream:{st}" for st in stream_names],
        stream=[stream_names.index(st) for st in streams],
        ordered=[bool(s.globally_ordered) for s in sched], parts=parts, host=[p.host for p in parts],
        device=[p.device for p in parts], takes_core=[p.takes_core for p in parts], res_names=res_names,
        res=[tuple(res_names.index(r) for r in p.shared) for p in parts],
        comm=[r.startswith("comm:") for r in res_names], cores=costs.cores,
        pool_size=pool_limit(costs.cores, len(group_names)) or 0, deps=_deps(plan, index), cuda=cuda,
        period_overhead=period_overhead_s, max_device_lag=max_device_lag)


def task_sim_plan(names: Sequence[str], group_names: Sequence[str], thread: Sequence[int],
                  stream_names: Sequence[str], stream: Sequence[int], host_s: Sequence[float],
                  device_s: Sequence[float], takes_core: Sequence[bool], deps: List[List[Dep]], *,
                  cores: Optional[int], cuda: bool) -> SimPlan:
    """One iteration of tasks given as tables, compiled for the simulator without a :class:`PipelinePlan`.

    A plan of one stage, every task on a worker thread (no caller's group), no overheads: what a
    program of many tasks whose structure is built once (a pipeline-parallel step,
    :mod:`autosched.pp.simulate`) hands the event core on every call. Task ``k`` is ``names[k]``, on
    thread group ``thread[k]`` and stream ``stream[k]`` (indices into the sorted ``group_names`` and
    ``stream_names``), with ``host_s[k]`` and ``device_s[k]`` as its cost's host and device time (on
    CPU their sum is host time: :func:`~autosched.model.taskmodel.task_parts`), taking a core of the pool
    (``cores``) if ``takes_core[k]``, waiting for ``deps[k]``. The main thread hands the tasks out in
    ``names``' order: each thread runs its tasks in that order. The caller checks that every
    dependency comes first on its thread or another's (no cycle): the simulator raises
    :class:`~autosched.model._simevents.SimDeadlock` otherwise.
    """
    made: Dict[Tuple[float, float, bool, int, int], TaskParts] = {}  # tasks alike share their parts (a hot path)
    parts = []
    for key in zip(host_s, device_s, takes_core, thread, stream):
        found = made.get(key)
        if found is None:
            h, d, core, g, st = key
            found = made[key] = task_parts(h, d, () if core else (NOCORE,), group_names[g], stream_names[st],
                                           False, cuda)
        parts.append(found)
    return SimPlan(
        names=list(names), index={name: k for k, name in enumerate(names)},
        walk=PeriodWalk.one_stage(names, {name: group_names[g] for name, g in zip(names, thread)}),
        stage=[0] * len(names), depth=1, group_names=list(group_names),
        thread_labels=[f"thread:{g}" for g in group_names], fifo_labels=[f"fifo:{g}" for g in group_names],
        thread=list(thread), caller=-1, stream_names=list(stream_names),
        stream_labels=[f"stream:{st}" for st in stream_names], stream=list(stream), ordered=[False] * len(names),
        parts=parts, host=[p.host for p in parts], device=[p.device for p in parts],
        takes_core=[p.takes_core for p in parts], res_names=[], res=[()] * len(names), comm=[], cores=cores,
        pool_size=pool_limit(cores, len(group_names)) or 0, deps=deps, cuda=cuda, period_overhead=0.0,
        max_device_lag=1)


def _deps(plan: PipelinePlan, index: Dict[str, int]) -> List[List[Dep]]:
    """Each task's dependencies with the labels its waits are recorded under (``i-N``: N iterations back)."""
    deps: List[List[Dep]] = [[] for _ in index]
    for task, dep in plan.intra_edges():
        deps[index[task]].append((index[dep], 0, f"dep:{dep}", f"event:{dep}"))
    for task, dep, dist in plan.inter_edges():
        it = f"i-{dist}" if dist > 0 else f"i+{-dist}" if dist < 0 else "i"  # dist < 0: a same-period dependency
        deps[index[task]].append((index[dep], dist, f"dep:{dep}[{it}]", f"event:{dep}[{it}]"))
    return deps
