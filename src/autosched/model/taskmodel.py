"""One model of what a task costs and holds under a plan, on a device; one critical path.

docs/semantics.md ("What a cost model means") defines it; this module is the only
code that applies it. Given a task's :class:`~autosched.model.costs.TaskCost`, its thread
group, stream and whether it is globally ordered, :func:`task_parts` says how long
its host part and its device part take and which resources each part holds:

* the host part holds ``thread:<group>``, if globally ordered ``sequencer``,
  and ``cores`` (one core of the pool) unless the cost is tagged ``"nocore"``;
* on CUDA the device part holds ``stream:<stream>`` and the cost's ``comm:``/
  ``pcie`` tags; on CPU there is no device part: the whole cost is host time and
  the host part holds the tags.

**The core pool.** A cost model may give the machine's free cores
(``CostModel.cores``, an integer capacity; ``None``, the default, is
unlimited). Every host part, on CPU and on CUDA, needs one core while it runs
(also the GIL-holding ones, and the caller group's on the main thread), except
a task tagged ``"nocore"``: its host time is spent off the CPU (sleeping,
blocked on I/O or on another process), so it holds no core. A part waiting
(Phase 1, the sequencer, its thread's FIFO, another resource) holds none, and
device parts hold none. At most ``cores`` host parts run at
once; a part, once started, keeps its core until it ends (the OS time-slices
instead, which changes who waits, not how much host work the pool does per
second). The main thread's per-period engine time is not drawn from the pool.
:func:`core_capacity` turns a measured parallelism into the pool's size;
:func:`pool_limit` says when the pool can make a part wait at all (fewer cores
than threads: each thread runs one host part at a time).

:func:`resource_loads` sums the parts into each resource's load per iteration
(every iteration runs every task once), and the core pool's host work per
core, the bounds no steady period beats. The simulator, the bounds, the beam
search (its modulo timetable holds the pool as a ring of ``cores`` places),
CP-SAT (a circular cumulative of capacity ``cores``), the search report and
the problem builder all use these functions, so a change of semantics is made
here once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

import networkx as nx

from swpipe_core.plan import PipelinePlan, StreamSpec, stream_name

from autosched.model.costs import CostModel

__all__ = ["TaskParts", "task_parts", "plan_parts", "resource_loads", "core_capacity", "pool_limit",
           "critical_path", "stream_label"]

CORES = "cores"  # the core pool's name in loads, utilisation, stalls and binding waits
NOCORE = "nocore"  # the cost tag of a task whose host part holds no core (sleeps, blocks)


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
        ``"cores"`` (one core of the pool), ``"stream:<s>"``, ``"comm:<name>"``,
        ``"pcie"``, ``"gil"``.
    """

    host: float
    device: float
    host_holds: Tuple[str, ...]
    device_holds: Tuple[str, ...]

    @property
    def shared(self) -> Tuple[str, ...]:
        """The cost model's resource tags among what the task holds (``comm:``, ``pcie``, ``gil``).

        Everything but the task's own thread, stream, the sequencer and the core
        pool, which the simulator models as queues of their own.
        """
        return tuple(r for r in self.host_holds + self.device_holds
                     if not r.startswith(("thread:", "stream:")) and r not in ("sequencer", CORES))

    @property
    def takes_core(self) -> bool:
        """Whether the host part takes one core of the pool while it runs."""
        return CORES in self.host_holds


def task_parts(host_s: float, device_s: float, resources: Sequence[str], group: str, stream: str,
               ordered: bool, cuda: bool) -> TaskParts:
    """The host and device parts of one task under a plan on a device.

    Parameters
    ----------
    host_s, device_s : float
        The task's cost (:class:`~autosched.model.costs.TaskCost`), in seconds or any time unit.
    resources : sequence of str
        Its ``comm:<name>`` / ``pcie`` / ``gil`` tags, and ``nocore`` (its host
        part holds no core of the pool).
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
    TaskParts(host=0.1, device=2.0, host_holds=('thread:io', 'sequencer', 'cores'), device_holds=('stream:memcpy', 'comm:nccl'))
    >>> task_parts(0.1, 2.0, ("comm:nccl", "nocore"), "io", "memcpy", False, cuda=False)
    TaskParts(host=2.1, device=0.0, host_holds=('thread:io', 'comm:nccl'), device_holds=())
    """
    host_holds: Tuple[str, ...] = (f"thread:{group}",) + (("sequencer",) if ordered else ()) \
        + ((CORES,) if NOCORE not in resources else ())
    tags = tuple(r for r in resources if r != NOCORE)
    if cuda:
        return TaskParts(host_s, device_s, host_holds, (f"stream:{stream}",) + tags)
    return TaskParts(host_s + device_s, 0.0, host_holds + tags, ())


def plan_parts(plan: PipelinePlan, costs: CostModel, cuda: bool, task_overhead_s: float = 0.0) -> Dict[str, TaskParts]:
    """:func:`task_parts` of every task of a plan, by name (``task_overhead_s`` added to each host part).

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> from swpipe import CostModel, TaskCost
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


def resource_loads(parts: Iterable[TaskParts], cores: Optional[int] = None) -> Dict[str, float]:
    """Each resource's work per iteration: the sum of the parts that hold it.

    With a core pool of ``cores``, ``"cores"`` is the time of every host part
    that takes a core over the pool's size: the pool's work per core, so that
    every value is a lower bound on the period.

    Parameters
    ----------
    parts : iterable of TaskParts
    cores : int, optional
        The core pool's size (``CostModel.cores``); ``None``: unlimited, no entry.

    Returns
    -------
    dict
        ``{resource: seconds per iteration}``.

    Examples
    --------
    >>> a = task_parts(1.0, 3.0, ("pcie",), "a", "s", False, cuda=True)
    >>> b = task_parts(2.0, 1.0, ("pcie",), "a", "t", False, cuda=True)
    >>> sorted(resource_loads([a, b]).items())
    [('pcie', 4.0), ('stream:s', 3.0), ('stream:t', 1.0), ('thread:a', 3.0)]
    >>> resource_loads([a, b], cores=2)["cores"]
    1.5
    >>> resource_loads([a, task_parts(2.0, 1.0, ("nocore",), "b", "t", False, cuda=True)], cores=2)["cores"]
    0.5
    """
    load: Dict[str, float] = {}
    for p in parts:
        for r in p.host_holds:
            load[r] = load.get(r, 0) + p.host
        for r in p.device_holds:
            load[r] = load.get(r, 0) + p.device
    pool = load.pop(CORES, 0.0)
    if cores is not None:
        load[CORES] = pool / cores
    return load


def core_capacity(cores_free: float) -> int:
    """The core pool's size for a measured parallelism: ``cores_free`` rounded to the nearest integer, at least 1.

    ``cores_free`` (:func:`swpipe_core.measure.calibrate.measure_cores`) is how many
    cores' worth of GIL-free work ran at once. The pool is the integer nearest
    to it (halves round up), so the pool's throughput is off by at most half a
    core either way: 1.71 of 2 free is 2 (two threads run at 86 % speed rather
    than one at a time), 1.2 is 1 (threads share one core). At least 1: the
    process always runs. It agrees with
    :func:`autosched.model.machine.parallelism_note`, which reports threads sharing
    a core below 1.5.

    Parameters
    ----------
    cores_free : float
        Measured parallelism (1.0 = one core's worth).

    Returns
    -------
    int

    Raises
    ------
    ValueError
        For a value that is not a finite number >= 0.

    Examples
    --------
    >>> core_capacity(1.71), core_capacity(1.2), core_capacity(1.5), core_capacity(0.3)
    (2, 1, 2, 1)
    """
    if isinstance(cores_free, bool) or not isinstance(cores_free, (int, float)) or not math.isfinite(cores_free) \
            or cores_free < 0:
        raise ValueError(f"cores_free={cores_free!r}: use the measured parallelism, a number >= 0 "
                         "(MachineCalibration.cores_free)")
    return max(1, math.floor(cores_free + 0.5))


def pool_limit(cores: Optional[int], threads: int) -> Optional[int]:
    """The core pool's size where it can make a host part wait, else None.

    Each thread runs one host part at a time, so a pool of at least as many
    cores as the plan has threads (thread groups; the caller group's is the
    main thread) never makes a part wait: the searchers leave it out of their
    timetables then (its load still bounds the period, :func:`resource_loads`).

    Parameters
    ----------
    cores : int, optional
        ``CostModel.cores``; ``None``: unlimited.
    threads : int
        Threads that run host parts.

    Returns
    -------
    int or None

    Examples
    --------
    >>> pool_limit(1, 2), pool_limit(2, 2), pool_limit(None, 3)
    (1, None, None)
    """
    return cores if cores is not None and cores < threads else None


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


def stream_label(spec: StreamSpec) -> str:
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
