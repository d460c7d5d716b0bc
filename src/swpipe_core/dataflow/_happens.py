"""What a plan guarantees to run before what: the happens-before order of its events, unrolled.

An event is ``(task, iteration)``. The engine orders two events when

* a declared dependency chain links them (intra ``(T, D)``: ``D(i)`` before
  ``T(i)``; inter ``(T, D, N)``: ``D(i-N)`` before ``T(i)``);
* they share a thread group (``device="cpu"``) or a thread group and a stream
  (``"cuda"``): the group's FIFO runs period ``p`` before ``p + 1`` and, within
  a period, in enqueue order;
* on the CPU, the retire barrier: period ``r + depth`` is enqueued only after
  every task of iteration ``r`` completed (host completion, so not on CUDA);
* on the CPU, the hand-off: a worker task placed after a task of the caller's
  group in the enqueue order is handed off once the caller has run that task.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Hashable, Optional, Tuple

import networkx as nx

from swpipe_core.plan import PipelinePlan
from swpipe_core.walk import PeriodWalk

__all__: list = []

Event = Tuple[str, int]


def _enq(p: int) -> tuple:
    return ("enqueue", p, None)  # three items: never equal to a (task, iteration) event


def _retired(r: int) -> tuple:
    return ("retired", r, None)


class PlanOrder:
    """Happens-before over ``window`` iterations of a plan; ``before(a, b)`` answers one pair.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(1)},
    ...                     intra_iter_deps=[("B", "A")])
    >>> order = PlanOrder(plan)
    >>> order.before(("A", 3), ("B", 3)), order.before(("B", 2), ("A", 3))
    (True, False)
    """

    def __init__(self, plan: PipelinePlan, window: Optional[int] = None, device: str = "cpu") -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        self.plan = plan
        depth = plan.pipeline_depth
        max_n = max([n for _, _, n in plan.inter_edges()] + [1])
        self.window = window or 2 * depth + max_n + 4
        self._graph = self._build(device)
        self._reach: Dict[Hashable, FrozenSet[Hashable]] = {}

    def _build(self, device: str) -> nx.DiGraph:
        plan, w = self.plan, self.window
        walk = PeriodWalk(plan)
        periods = list(walk.periods(w))
        g = nx.DiGraph()
        for i in range(w):
            g.add_nodes_from((n, i) for n in plan.task_names)
            g.add_edges_from(((d, i), (t, i)) for t, d in plan.intra_edges())
            g.add_edges_from(((d, i - k), (t, i)) for t, d, k in plan.inter_edges() if i - k >= 0)
        lanes: Dict[tuple, list] = {}  # each thread group's FIFO (and stream's, on CUDA): the walk's order
        for _, steps in periods:
            for step in steps:
                n = step.task
                lane = (plan.sched(n).thread_group,) + ((plan.stream_of(n),) if device == "cuda" else ())
                lanes.setdefault(lane, []).append((n, step.iteration))
        for events in lanes.values():
            g.add_edges_from(zip(events, events[1:]))
        if device == "cpu":
            self._add_retire(g, periods, walk.depth)
            self._add_handoffs(g, periods)
        return g

    @staticmethod
    def _add_handoffs(g: nx.DiGraph, periods: list) -> None:
        """A worker task the walk reaches after a caller's task is handed off once that task has run."""
        for _, steps in periods:
            for step in steps:
                if step.after is not None:
                    caller = steps[step.after]
                    g.add_edge((caller.task, caller.iteration), (step.task, step.iteration))

    def _add_retire(self, g: nx.DiGraph, periods: list, depth: int) -> None:
        w = self.window
        for p in range(w + depth - 1):
            g.add_edge(_enq(p), _enq(p + 1))
        for p, steps in periods:
            for step in steps:
                g.add_edge(_enq(p), (step.task, step.iteration))
                if step.inline:  # the main thread runs it before it enqueues the next period
                    g.add_edge((step.task, step.iteration), _enq(p + 1))
        names = self.plan.task_names
        for r in range(w):
            g.add_edges_from(((n, r), _retired(r)) for n in names)
            g.add_edge(_retired(r), _enq(r + depth))

    def before(self, a: Event, b: Event) -> bool:
        """Whether the plan guarantees event ``a`` completes before event ``b`` starts."""
        if a not in self._reach:
            self._reach[a] = frozenset(nx.descendants(self._graph, a)) if a in self._graph else frozenset()
        return b in self._reach[a]
