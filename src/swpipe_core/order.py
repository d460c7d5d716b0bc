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

The order is also *when* a task starts where a caller's group runs inline:
the engine walks it, handing each worker task off when reached and running
each caller's task then, so a worker task placed after a caller's task waits
for it. Both policies therefore put first, ahead of their own key, every
ready task of a group with a worker (:func:`handed_off_first`): with either
policy a worker task is handed off as early as the graph allows. An explicit
``enqueue_order`` may place one later on purpose, as TorchRec's
``progress()`` issues the next batch's copy after the forward pass.
"""

from __future__ import annotations

import heapq
from typing import Dict, List

import networkx as nx

from swpipe_core.planparts import ref_name

# "PipelinePlan" in the annotations below is swpipe_core.plan.PipelinePlan, left unimported: plan.py builds on this
# module (through validate), which reads a plan's fields only.

__all__ = ["period_local_graph", "stall_cost", "handed_off_first", "ready_first_order", "stage_descending_order",
           "enqueue_order", "hand_off_after"]


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
    >>> from swpipe import PipelinePlan, TaskSchedule
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
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"Q": TaskSchedule(1, "Y"), "A": TaskSchedule(0, "Z")}, inter_iter_deps=[("A", "Q")])
    >>> stall_cost(plan)
    {'Q': 0, 'A': 1}
    """
    graph = period_local_graph(plan) if graph is None else graph
    streams = nx.get_node_attributes(graph, "stream")
    return {t: sum(1 for d in graph.predecessors(t) if streams[d] != streams[t]) for t in graph.nodes}


def handed_off_first(plan: PipelinePlan, graph: nx.DiGraph = None) -> Dict[str, int]:
    """1 for a task the caller runs inline while other groups have workers, else 0: the policies' first key.

    The engine hands a worker's task off when its walk of the enqueue order
    reaches it, after running the caller's tasks placed before it. Ordering
    every ready worker task before any ready caller's task makes that
    hand-off as early as the graph allows: a worker task then follows a
    caller's task only if it depends on it within the period.

    Parameters
    ----------
    plan : PipelinePlan
    graph : networkx.DiGraph, optional
        The plan's period-local graph, if already built.

    Returns
    -------
    dict
        ``{task_name: 0 or 1}``.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> s = {"compute": TaskSchedule(1), "io": TaskSchedule(0, thread_group="io")}
    >>> handed_off_first(PipelinePlan(s, [("compute", "io")]))
    {'compute': 1, 'io': 0}
    >>> handed_off_first(PipelinePlan(s, [("compute", "io")], caller_group=None))
    {'compute': 0, 'io': 0}
    """
    graph = period_local_graph(plan) if graph is None else graph
    group = nx.get_node_attributes(graph, "thread_group")
    caller = plan.caller_group
    inline = caller is not None and caller in group.values() and len(set(group.values())) > 1
    return {t: int(inline and g == caller) for t, g in group.items()}


def ready_first_order(plan: PipelinePlan) -> List[str]:
    """Topological order of the period-local graph by ``(handed_off_first, stall_cost, ready_at, name)``.

    Kahn's algorithm: among the tasks whose same-period dependencies are all
    enqueued, take a task of a group with a worker before one the caller runs
    inline (:func:`handed_off_first`), then the one with the fewest
    cross-stream waits, then the one that became ready earliest, then by name
    (deterministic across ranks).

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

    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> s = {"P": TaskSchedule(0, "X"), "Q": TaskSchedule(1, "Y"), "R": TaskSchedule(0, "X"), "A": TaskSchedule(0, "Z")}
    >>> plan = PipelinePlan(s, inter_iter_deps=[("A", "Q")])
    >>> ready_first_order(plan)
    ['P', 'Q', 'R', 'A']
    """
    graph = period_local_graph(plan)
    cost = stall_cost(plan, graph)
    last = handed_off_first(plan, graph)
    indegree = dict(graph.in_degree())
    ready = [(last[n], cost[n], 0, n) for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order: List[str] = []
    while ready:
        name = heapq.heappop(ready)[-1]
        order.append(name)
        for succ in graph.successors(name):
            indegree[succ] -= 1
            if indegree[succ] == 0:
                heapq.heappush(ready, (last[succ], cost[succ], len(order), succ))
    if len(order) != len(indegree):
        raise nx.NetworkXUnfeasible("the period-local graph has a cycle; validate() names it")
    return order


def stage_descending_order(plan: PipelinePlan) -> List[str]:
    """Topological order of the period-local graph by ``(handed_off_first, -stage, stall_cost, name)``.

    Parameters
    ----------
    plan : PipelinePlan

    Returns
    -------
    list of str

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> s = {"P": TaskSchedule(0, "X"), "Q": TaskSchedule(1, "Y"), "R": TaskSchedule(0, "X"), "A": TaskSchedule(0, "Z")}
    >>> stage_descending_order(PipelinePlan(s, inter_iter_deps=[("A", "Q")]))
    ['Q', 'P', 'R', 'A']
    """
    graph = period_local_graph(plan)
    cost = stall_cost(plan, graph)
    last = handed_off_first(plan, graph)
    stage = nx.get_node_attributes(graph, "stage")
    return list(nx.lexicographical_topological_sort(graph, key=lambda n: (last[n], -stage[n], cost[n], n)))


def hand_off_after(plan: PipelinePlan, task: str) -> List[str]:
    """The plan's enqueue order with every worker task that can wait moved after the caller's ``task``.

    Where the caller's group runs inline, a worker task is handed off when
    the main thread's walk of the order reaches it. This order hands off
    after ``task`` every worker task placed before it that neither ``task``
    nor a caller's task before it waits for within the period; the rest
    keeps its place. E.g. after ``Forward``: on a CPU host the side threads'
    Python work then runs beside the backward pass, which holds no
    interpreter lock, not beside the forward pass, which mostly does (as
    TorchRec's ``enqueue_batch_after_forward`` issues the next batch's copy
    after the forward pass so that it does not compete with it).

    Parameters
    ----------
    plan : PipelinePlan
    task : str
        A task of the caller's group.

    Returns
    -------
    list of str
        A topological order of the period-local graph, for ``enqueue_order``.

    Raises
    ------
    ValueError
        If ``task`` is not a task of the plan's caller's group.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"Load": TaskSchedule(0, thread_group="io"), "Dist": TaskSchedule(1, thread_group="io"),
    ...                      "Fwd": TaskSchedule(2), "Bwd": TaskSchedule(2)},
    ...                     [("Dist", "Load"), ("Fwd", "Dist"), ("Bwd", "Fwd")])
    >>> enqueue_order(plan), hand_off_after(plan, "Fwd")
    (['Dist', 'Load', 'Fwd', 'Bwd'], ['Fwd', 'Dist', 'Load', 'Bwd'])
    """
    group = plan.sched(task).thread_group if task in plan.task_names else None
    if group is None or group != plan.caller_group:
        raise ValueError(f"hand_off_after: {task!r} is not a task of the caller's group {plan.caller_group!r} "
                         f"(tasks: {plan.task_names}); name a task that runs on the caller's thread")
    order = enqueue_order(plan)
    graph = period_local_graph(plan)
    at = order.index(task)
    waited = set()
    for t in order[:at + 1]:
        if plan.sched(t).thread_group == group:
            waited |= nx.ancestors(graph, t)
    moved = [t for t in order[:at] if plan.sched(t).thread_group != group and t not in waited]
    kept = [t for t in order if t not in moved]
    k = kept.index(task) + 1
    return kept[:k] + moved + kept[k:]


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
    >>> from swpipe import PipelinePlan, TaskSchedule
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
