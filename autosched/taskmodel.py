"""One model of what a task costs and holds under a plan, on a device; one critical path.

docs/semantics.md ("What a cost model means") defines it; this module is the only
code that applies it. Given a task's :class:`~autosched.costs.TaskCost`, its thread
group, stream and whether it is globally ordered, :func:`task_parts` says how long
its host part and its device part take and which resources each part holds:

* the host part holds ``thread:<group>`` and, if globally ordered, ``sequencer``;
* on CUDA the device part holds ``stream:<stream>`` and the cost's ``comm:``/
  ``pcie`` tags; on CPU there is no device part: the whole cost is host time and
  the host part holds the tags.

:func:`resource_loads` sums the parts into each resource's load per iteration
(every iteration runs every task once), the bound no steady period beats. The
simulator, the bounds, the beam search, CP-SAT, the search report and the
problem builder all use these two functions, so a change of semantics is made
here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, Iterable, List, Sequence, Tuple

import networkx as nx

from swpipe_core.plan import stream_name

__all__ = ["TaskParts", "task_parts", "plan_parts", "resource_loads", "critical_path", "stream_label"]


@dataclass(frozen=True)
class TaskParts:
    """One task instance's two parts and the resources each holds.

    Attributes
    ----------
    host, device : float
        Seconds (or model time units) of the host part on the thread and of the device
        part on the stream (0 on CPU).
    host_holds, device_holds : tuple of str
        Resource names held during each part: ``"thread:<g>"``, ``"sequencer"``,
        ``"stream:<s>"``, ``"comm:<name>"``, ``"pcie"``.
    """

    host: float
    device: float
    host_holds: Tuple[str, ...]
    device_holds: Tuple[str, ...]

    @property
    def shared(self) -> Tuple[str, ...]:
        """The cost model's resource tags among what the task holds (``comm:``, ``pcie``, ``gil``).

        Everything but the task's own thread, stream and the sequencer, which the
        simulator models as queues of their own.
        """
        return tuple(r for r in self.host_holds + self.device_holds
                     if not r.startswith(("thread:", "stream:")) and r != "sequencer")


def task_parts(host_s: float, device_s: float, resources: Sequence[str], group: str, stream: str,
               ordered: bool, cuda: bool) -> TaskParts:
    """The host and device parts of one task under a plan on a device.

    Parameters
    ----------
    host_s, device_s : float
        The task's cost (:class:`~autosched.costs.TaskCost`), in seconds or any time unit.
    resources : sequence of str
        Its ``comm:<name>`` / ``pcie`` tags.
    group, stream : str
        Its thread group and its stream's normalised name.
    ordered : bool
        Whether it is globally ordered (holds the sequencer turn during its host part).
    cuda : bool
        Device semantics: host part on the thread, device part on the stream.

    Returns
    -------
    TaskParts

    Examples
    --------
    >>> task_parts(0.1, 2.0, ("comm:nccl",), "io", "memcpy", True, cuda=True)
    TaskParts(host=0.1, device=2.0, host_holds=('thread:io', 'sequencer'), device_holds=('stream:memcpy', 'comm:nccl'))
    >>> task_parts(0.1, 2.0, ("comm:nccl",), "io", "memcpy", False, cuda=False)
    TaskParts(host=2.1, device=0.0, host_holds=('thread:io', 'comm:nccl'), device_holds=())
    """
    host_holds: Tuple[str, ...] = (f"thread:{group}",) + (("sequencer",) if ordered else ())
    tags = tuple(resources)
    if cuda:
        return TaskParts(host_s, device_s, host_holds, (f"stream:{stream}",) + tags)
    return TaskParts(host_s + device_s, 0.0, host_holds + tags, ())


def plan_parts(plan: Any, costs: Any, cuda: bool, task_overhead_s: float = 0.0) -> Dict[str, TaskParts]:
    """:func:`task_parts` of every task of a plan, by name (``task_overhead_s`` added to each host part).

    Examples
    --------
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> from autosched.costs import CostModel, TaskCost
    >>> plan = PipelinePlan({"A": TaskSchedule(0, stream="memcpy", thread_group="io")})
    >>> plan_parts(plan, CostModel({"A": TaskCost(0.001, 0.002)}), cuda=True)["A"].device_holds
    ('stream:memcpy',)
    """
    out: Dict[str, TaskParts] = {}
    for name in plan.task_names:
        s, c = plan.sched(name), costs[name]
        out[name] = task_parts(c.host_s + task_overhead_s, c.device_s, c.resources, s.thread_group,
                               stream_label(s.stream), bool(s.globally_ordered), cuda)
    return out


def resource_loads(parts: Iterable[TaskParts]) -> Dict[str, float]:
    """Each resource's work per iteration: the sum of the parts that hold it.

    Examples
    --------
    >>> a = task_parts(1.0, 3.0, ("pcie",), "a", "s", False, cuda=True)
    >>> b = task_parts(2.0, 1.0, ("pcie",), "a", "t", False, cuda=True)
    >>> sorted(resource_loads([a, b]).items())
    [('pcie', 4.0), ('stream:s', 3.0), ('stream:t', 1.0), ('thread:a', 3.0)]
    """
    load: Dict[str, float] = {}
    for p in parts:
        for r in p.host_holds:
            load[r] = load.get(r, 0) + p.host
        for r in p.device_holds:
            load[r] = load.get(r, 0) + p.device
    return load


def critical_path(names: Sequence[Hashable], intra: Iterable[Tuple[Hashable, Hashable]],
                  weight: Callable[[Any], float]) -> Tuple[float, List[Hashable]]:
    """The heaviest chain of the intra-iteration DAG (``(task, dep)`` edges), ties broken by name.

    Parameters
    ----------
    names : sequence
        The tasks.
    intra : iterable of (task, dep)
        Intra-iteration dependencies.
    weight : callable
        A task's time along the chain.

    Returns
    -------
    (length, path)
        ``path`` runs from the first task to the last.

    Examples
    --------
    >>> critical_path("ABC", [("B", "A"), ("C", "A")], {"A": 1, "B": 2, "C": 3}.get)
    (4, ['A', 'C'])
    """
    dag = nx.DiGraph()
    dag.add_nodes_from(names)
    dag.add_edges_from((d, t) for t, d in intra)
    best: Dict[Hashable, Tuple[float, Any]] = {}
    for t in nx.lexicographical_topological_sort(dag, key=str):
        prev = max(((best[d][0], str(d), d) for d in dag.predecessors(t)), default=(0, "", None))
        best[t] = (prev[0] + weight(t), prev[2])
    if not best:
        return 0, []
    end = max(best, key=lambda t: (best[t][0], str(t)))
    path = [end]
    while best[path[-1]][1] is not None:
        path.append(best[path[-1]][1])
    return best[end][0], path[::-1]


def stream_label(spec: Any) -> str:
    """A stream's normalised name in the models: distinct specs never share a name.

    ``None`` (the device's default stream) is ``"default"``; a string ``"default"``
    (rejected by ``validate``, which says to use None) would be another stream, so it
    is quoted rather than merged with it.

    Examples
    --------
    >>> stream_label(None), stream_label("memcpy"), stream_label("default")
    ('default', 'memcpy', "'default'")
    """
    name = stream_name(spec)
    return "'default'" if spec is not None and name == "default" else name
