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

from ..order import enqueue_order
from ..plan import PipelinePlan

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
    >>> from swpipe_core.plan import TaskSchedule
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
        g = nx.DiGraph()
        names = plan.task_names
        stage = {n: plan.stage(n) for n in names}
        for i in range(w):
            g.add_nodes_from((n, i) for n in names)
            g.add_edges_from(((d, i), (t, i)) for t, d in plan.intra_edges())
            g.add_edges_from(((d, i - k), (t, i)) for t, d, k in plan.inter_edges() if i - k >= 0)
        pos = {n: k for k, n in enumerate(enqueue_order(plan))}
        lanes: Dict[tuple, list] = {}
        for n in names:
            lane = (plan.sched(n).thread_group,) + ((plan.stream_of(n),) if device == "cuda" else ())
            lanes.setdefault(lane, []).append(n)
        for members in lanes.values():
            events = sorted(((i + stage[n], pos[n], n, i) for n in members for i in range(w)))
            g.add_edges_from(((a[2], a[3]), (b[2], b[3])) for a, b in zip(events, events[1:]))
        if device == "cpu":
            self._add_retire(g, names, stage)
            self._add_handoffs(g, stage)
        return g

    def _add_handoffs(self, g: nx.DiGraph, stage: Dict[str, int]) -> None:
        """A worker task the walk reaches after a caller's task is handed off once that task has run."""
        plan, w = self.plan, self.window
        caller = plan.caller_group
        if caller is None:
            return
        order = enqueue_order(plan)
        for p in range(w + plan.pipeline_depth):
            last = None
            for n in order:
                i = p - stage[n]
                if not 0 <= i < w:
                    continue
                if plan.sched(n).thread_group == caller:
                    last = (n, i)
                elif last is not None:
                    g.add_edge(last, (n, i))

    def _add_retire(self, g: nx.DiGraph, names: list, stage: Dict[str, int]) -> None:
        plan, w, depth = self.plan, self.window, self.plan.pipeline_depth
        periods = w + depth
        for p in range(periods):
            if p + 1 < periods:
                g.add_edge(_enq(p), _enq(p + 1))
            for n in names:
                i = p - stage[n]
                if 0 <= i < w:
                    g.add_edge(_enq(p), (n, i))
                    if plan.caller_group is not None and plan.sched(n).thread_group == plan.caller_group:
                        g.add_edge((n, i), _enq(p + 1))
        for r in range(w):
            g.add_edges_from(((n, r), _retired(r)) for n in names)
            g.add_edge(_retired(r), _enq(r + depth))

    def before(self, a: Event, b: Event) -> bool:
        """Whether the plan guarantees event ``a`` completes before event ``b`` starts."""
        if a not in self._reach:
            self._reach[a] = frozenset(nx.descendants(self._graph, a)) if a in self._graph else frozenset()
        return b in self._reach[a]
