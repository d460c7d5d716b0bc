"""The order in which a period's tasks are enqueued onto their thread groups.

Within one period every task of stage ``s`` works on iteration ``p - s``.
The *period-local graph* holds the dependencies that interact inside one
period: an intra dependency whose two ends share a stage, and an inter
dependency of distance ``N`` with ``stage(dep) == stage(task) + N``.
Every other dependency was satisfied in an earlier period. Any topological
order of this graph is deadlock-free (in every FIFO a task only waits for
tasks enqueued before it; see "Period-local graph" in docs/semantics.md);
among them

* **ready-first** (default) picks, among ready tasks, the smallest
  ``(stall_cost, ready_at, name)``: tasks whose stream need not wait on
  another stream go first, so they do not sit behind a ``wait_event`` on a
  FIFO stream; among those, the task that became ready first (``ready_at`` =
  how many tasks had been enqueued when its last same-period dependency was),
  then the name. The ``ready_at`` term gives SparseDist the order
  [H2D, InputDistStart, ZeroGrad, InputDistWait, ...] (checked in
  ``tests/test_order.py``): the newer batch's input distribution is started
  before the older batch's compute. Re-sorting the whole ready list by
  ``(stall_cost, name)`` after each release instead would put InputDistWait
  before ZeroGrad;
* **stage-descending** picks the smallest ``(-stage, stall_cost, name)``:
  older iterations first.

``stall_cost(T)`` is the number of period-local in-edges of ``T`` whose
dependency runs on a different stream.
"""

from __future__ import annotations

import heapq
from typing import Dict, List

import networkx as nx

from .plan import PipelinePlan, ref_name

__all__ = ["period_local_graph", "stall_cost", "ready_first_order", "stage_descending_order", "enqueue_order"]


def period_local_graph(plan: PipelinePlan) -> nx.DiGraph:
    """The dependencies that interact within one period, as ``dep -> task`` edges.

    Parameters
    ----------
    plan : PipelinePlan

    Returns
    -------
    networkx.DiGraph
        Every task is a node (attributes ``stage``, ``stream``, ``thread_group``);
        each edge carries ``kind`` (``"intra"`` or ``"inter"``) and ``distance``.

    Examples
    --------
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1), "C": TaskSchedule(1)},
    ...                     intra_iter_deps=[("B", "A"), ("C", "B")], inter_iter_deps=[("A", "C")])
    >>> sorted(period_local_graph(plan).edges)
    [('B', 'C'), ('C', 'A')]
    """
    graph = nx.DiGraph()
    for key, sched in plan.schedule.items():
        graph.add_node(ref_name(key), stage=sched.stage, stream=plan.stream_of(key), thread_group=sched.thread_group)
    stage = nx.get_node_attributes(graph, "stage")
    for t, d in plan.intra_edges():
        if stage[d] == stage[t]:
            graph.add_edge(d, t, kind="intra", distance=0)
    for t, d, n in plan.inter_edges():
        if stage[d] == stage[t] + n:
            graph.add_edge(d, t, kind="inter", distance=n)
    return graph


def stall_cost(plan: PipelinePlan, graph: nx.DiGraph = None) -> Dict[str, int]:
    """Number of cross-stream period-local in-edges of each task.

    Parameters
    ----------
    plan : PipelinePlan
    graph : networkx.DiGraph, optional
        The plan's period-local graph, if already built.

    Returns
    -------
    dict
        ``{task_name: stall_cost}``.

    Examples
    --------
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"Q": TaskSchedule(1, "Y"), "A": TaskSchedule(0, "Z")}, inter_iter_deps=[("A", "Q")])
    >>> stall_cost(plan)
    {'Q': 0, 'A': 1}
    """
    graph = period_local_graph(plan) if graph is None else graph
    streams = nx.get_node_attributes(graph, "stream")
    return {t: sum(1 for d in graph.predecessors(t) if streams[d] != streams[t]) for t in graph.nodes}


def ready_first_order(plan: PipelinePlan) -> List[str]:
    """Topological order of the period-local graph by ``(stall_cost, ready_at, name)``.

    Kahn's algorithm: among the tasks whose same-period dependencies are all
    enqueued, take the one with the fewest cross-stream waits, then the one
    that became ready earliest, then by name (deterministic across ranks).

    Parameters
    ----------
    plan : PipelinePlan

    Returns
    -------
    list of str

    Raises
    ------
    networkx.NetworkXUnfeasible
        If the period-local graph has a cycle (``validate`` rejects such plans).

    Examples
    --------
    A cross-iteration example (P, R on stream X at stage 0; Q on Y at stage 1; A on Z waits Q of the previous iteration):

    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> s = {"P": TaskSchedule(0, "X"), "Q": TaskSchedule(1, "Y"), "R": TaskSchedule(0, "X"), "A": TaskSchedule(0, "Z")}
    >>> plan = PipelinePlan(s, inter_iter_deps=[("A", "Q")])
    >>> ready_first_order(plan)
    ['P', 'Q', 'R', 'A']
    """
    graph = period_local_graph(plan)
    cost = stall_cost(plan, graph)
    indegree = dict(graph.in_degree())
    ready = [(cost[n], 0, n) for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order: List[str] = []
    while ready:
        _, _, name = heapq.heappop(ready)
        order.append(name)
        for succ in graph.successors(name):
            indegree[succ] -= 1
            if indegree[succ] == 0:
                heapq.heappush(ready, (cost[succ], len(order), succ))
    if len(order) != len(indegree):
        raise nx.NetworkXUnfeasible("the period-local graph has a cycle; validate() names it")
    return order


def stage_descending_order(plan: PipelinePlan) -> List[str]:
    """Topological order of the period-local graph by ``(-stage, stall_cost, name)``.

    Parameters
    ----------
    plan : PipelinePlan

    Returns
    -------
    list of str

    Examples
    --------
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> s = {"P": TaskSchedule(0, "X"), "Q": TaskSchedule(1, "Y"), "R": TaskSchedule(0, "X"), "A": TaskSchedule(0, "Z")}
    >>> stage_descending_order(PipelinePlan(s, inter_iter_deps=[("A", "Q")]))
    ['Q', 'P', 'R', 'A']
    """
    graph = period_local_graph(plan)
    cost = stall_cost(plan, graph)
    stage = nx.get_node_attributes(graph, "stage")
    return list(nx.lexicographical_topological_sort(graph, key=lambda n: (-stage[n], cost[n], n)))


def enqueue_order(plan: PipelinePlan) -> List[str]:
    """The plan's per-period enqueue order: explicit if given, else by its policy.

    Parameters
    ----------
    plan : PipelinePlan

    Returns
    -------
    list of str

    Raises
    ------
    ValueError
        For an unknown ``enqueue_policy``.

    Examples
    --------
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"B": TaskSchedule(0), "A": TaskSchedule(0)}, enqueue_order=["B", "A"])
    >>> enqueue_order(plan), enqueue_order(plan.replace(enqueue_order=None))
    (['B', 'A'], ['A', 'B'])
    """
    if plan.enqueue_order is not None:
        return [ref_name(r) for r in plan.enqueue_order]
    if plan.enqueue_policy == "ready_first":
        return ready_first_order(plan)
    if plan.enqueue_policy == "stage_descending":
        return stage_descending_order(plan)
    raise ValueError(f"unknown enqueue_policy {plan.enqueue_policy!r}; use 'ready_first' or 'stage_descending'")
