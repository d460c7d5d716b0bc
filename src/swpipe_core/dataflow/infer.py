"""Infer dependencies from a :class:`~.record.DataflowRecord`.

Walking the accesses in serial order, every pair of accesses to one thing
by two different tasks, at least one a write, is a hazard that a pipelined
run must keep in serial order:

* **RAW** (read after write): ``reader`` needs ``writer``'s result;
* **WAR** (write after read): ``writer`` must not overwrite before ``reader`` read;
* **WAW** (write after write): the later write must land last.

A hazard between tasks of one iteration is an intra dependency
``(second, first)``; one across iterations is an inter dependency
``(second, first, distance)``. A task against itself in another iteration
is left out: one task runs on one thread group and one stream, whose FIFO
orders its iterations. :func:`infer_deps` keeps the minimal set (a
transitive reduction, intra and inter together) and returns it as a plan
skeleton with every task at stage 0, plus a readable table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Hashable, List, Optional, Sequence, Set, Tuple

import networkx as nx

from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.dataflow.record import Access, DataflowRecord

__all__ = ["Hazard", "find_hazards", "InferredDeps", "infer_deps", "edge_implied"]


@dataclass
class Hazard:
    """An observed ordering constraint: ``second`` of iteration ``i`` after ``first`` of ``i - distance``.

    ``kind`` is ``"RAW"``, ``"WAR"`` or ``"WAW"``; ``objects`` the readable
    names of what is shared. As a dependency it reads ``(second, first)``
    (``distance == 0``) or ``(second, first, distance)``.
    """

    second: str
    first: str
    distance: int
    kind: str
    objects: List[str] = field(default_factory=list)

    @property
    def edge(self) -> tuple:
        """The dependency tuple that enforces this hazard."""
        return (self.second, self.first) if self.distance == 0 else (self.second, self.first, self.distance)

    def what(self, keep: int = 3) -> str:
        """The shared things, the first ``keep`` by name."""
        more = len(self.objects) - keep
        return ", ".join(self.objects[:keep]) + (f" (+{more} more)" if more > 0 else "")

    def __str__(self) -> str:
        return f"{self.edge!s:<36} {self.kind}  {self.what()}"


def find_hazards(record: DataflowRecord) -> List[Hazard]:
    """Every RAW/WAR/WAW hazard between two different tasks, one per (edge, kind), smallest distance.

    Parameters
    ----------
    record : DataflowRecord

    Returns
    -------
    list of Hazard
        In the order first seen.

    Examples
    --------
    >>> from swpipe_core.dataflow import Access
    >>> rec = DataflowRecord(["W", "R"], 2, [
    ...     Access(0, "W", "x", "x", "write", "ctx"), Access(0, "R", "x", "x", "read", "ctx"),
    ...     Access(1, "W", "x", "x", "write", "ctx"), Access(1, "R", "x", "x", "read", "ctx")])
    >>> [(h.edge, h.kind) for h in find_hazards(rec)]
    [(('R', 'W'), 'RAW'), (('W', 'R', 1), 'WAR')]
    """
    last_write: Dict[Hashable, Tuple[int, str]] = {}
    readers: Dict[Hashable, List[Tuple[int, str]]] = {}
    found: Dict[Tuple[str, str, str], Hazard] = {}

    def add(second: str, i: int, first: str, j: int, kind: str, name: str) -> None:
        if second == first:
            return
        key = (second, first, kind)
        d = i - j
        h = found.get(key)
        if h is None or d < h.distance:  # the nearest iteration is the one to wait for
            h = found[key] = Hazard(second, first, d, kind, [])
        if d == h.distance and name not in h.objects:
            h.objects.append(name)

    for a in record.accesses:
        if a.mode == "read":
            w = last_write.get(a.obj)
            if w is not None:
                add(a.task, a.iteration, w[1], w[0], "RAW", a.name)
            readers.setdefault(a.obj, []).append((a.iteration, a.task))
        else:
            for j, r in readers.get(a.obj, []):
                add(a.task, a.iteration, r, j, "WAR", a.name)
            w = last_write.get(a.obj)
            if w is not None:
                add(a.task, a.iteration, w[1], w[0], "WAW", a.name)
            last_write[a.obj] = (a.iteration, a.task)
            readers[a.obj] = []
    return list(found.values())


def _unrolled(tasks: Sequence[str], intra: Set[Tuple[str, str]], inter: Set[Tuple[str, str, int]],
              window: int) -> nx.DiGraph:
    g = nx.DiGraph()
    for i in range(window):
        g.add_nodes_from((t, i) for t in tasks)
        g.add_edges_from(((d, i), (t, i)) for t, d in intra)
        g.add_edges_from(((d, i - n), (t, i)) for t, d, n in inter if i - n >= 0)
    return g


def edge_implied(edge: tuple, tasks: Sequence[str], intra: Set[Tuple[str, str]],
                 inter: Set[Tuple[str, str, int]]) -> bool:
    """Whether dependency ``edge`` follows from the others by a chain (steady state).

    Parameters
    ----------
    edge : tuple
        ``(task, dep)`` or ``(task, dep, N)``.
    tasks : sequence of str
    intra, inter : sets of dependency tuples
        The dependencies to chain (``edge`` itself is left out).

    Returns
    -------
    bool

    Examples
    --------
    >>> edge_implied(("C", "A"), "ABC", {("B", "A"), ("C", "B")}, set())
    True
    >>> edge_implied(("B", "C", 1), "ABC", {("B", "A"), ("C", "B")}, {("A", "C", 1)})
    True
    """
    n = edge[2] if len(edge) > 2 else 0
    others_intra = intra - {edge} if n == 0 else intra
    others_inter = inter - {edge} if n > 0 else inter
    depth = max([n] + [e[2] for e in others_inter]) + 2
    window = depth * (len(tasks) + 1)
    g = _unrolled(tasks, others_intra, others_inter, window)
    i = window - 1
    return nx.has_path(g, (edge[1], i - n), (edge[0], i))


@dataclass
class InferredDeps:
    """The minimal dependencies behind a record, with the hazards each one covers.

    ``plan`` is a ready-to-use skeleton: every task at stage 0 with these
    dependencies (assign stages, streams and thread groups, or hand the
    tasks to ``auto_schedule``). ``str()`` is the readable table.
    """

    intra: List[Tuple[str, str]]
    inter: List[Tuple[str, str, int]]
    hazards: List[Hazard]
    plan: PipelinePlan
    notes: List[str] = field(default_factory=list)

    def rows(self) -> List[Tuple[tuple, str, str, str]]:
        """``(edge, kept, kind, objects)`` per hazard; ``kept`` is ``"dep"`` or ``"implied"``."""
        kept = set(self.intra) | set(self.inter)
        out = []
        for h in self.hazards:
            out.append((h.edge, "dep" if h.edge in kept else "implied", h.kind, ", ".join(h.objects)))
        return out

    def __str__(self) -> str:
        lines = [f"{'edge':<36} {'kept':<7} kind what"]
        kept = set(self.intra) | set(self.inter)
        for h in self.hazards:
            lines.append(f"{h.edge!s:<36} {'dep' if h.edge in kept else 'implied':<7} {h.kind}  {h.what()}")
        lines.append(f"intra_iter_deps={self.intra}")
        lines.append(f"inter_iter_deps={self.inter}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def infer_deps(record: DataflowRecord, tasks: Optional[Sequence[PipelineTask]] = None) -> InferredDeps:
    """The minimal intra and inter dependencies that keep every observed hazard in serial order.

    Parameters
    ----------
    record : DataflowRecord
    tasks : list of PipelineTask, optional
        Bound tasks for the plan skeleton (default: unbound tasks named as in the record).

    Returns
    -------
    InferredDeps

    Examples
    --------
    >>> import torch
    >>> from swpipe import PipelineTask
    >>> from swpipe_core.dataflow import record_dataflow
    >>> w = torch.zeros(2)
    >>> def load(ctx): ctx.x = ctx.batch * 2
    >>> def fwd(ctx): ctx.y = ctx.x * w
    >>> def step(ctx): w.add_(ctx.y)
    >>> tasks = [PipelineTask("Load", load), PipelineTask("Fwd", fwd), PipelineTask("Step", step)]
    >>> deps = infer_deps(record_dataflow(tasks, [torch.ones(2)] * 2, state={"w": w}), tasks)
    >>> deps.intra, deps.inter
    ([('Fwd', 'Load'), ('Step', 'Fwd')], [('Fwd', 'Step', 1)])
    >>> deps.plan.pipeline_depth
    1
    """
    hazards = find_hazards(record)
    names = list(record.tasks)
    intra = {(h.second, h.first) for h in hazards if h.distance == 0}
    inter = {(h.second, h.first, h.distance) for h in hazards if h.distance > 0}
    notes = []
    graph = nx.DiGraph([(d, t) for t, d in intra])
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        notes.append(f"the intra-iteration hazards form a cycle {cycle}: the record is not of one serial order")
    else:
        reduced = nx.transitive_reduction(graph)
        intra = {(t, d) for d, t in reduced.edges}
    # keep an inter edge only if no chain of the others implies it; longer distances and later tasks first
    pos = {n: k for k, n in enumerate(names)}
    for e in sorted(inter, key=lambda e: (-e[2], -pos.get(e[0], 0), pos.get(e[1], 0))):
        if edge_implied(e, names, intra, inter):
            inter.discard(e)
    intra_l = sorted(intra, key=lambda e: (pos.get(e[0], 0), pos.get(e[1], 0)))
    inter_l = sorted(inter, key=lambda e: (pos.get(e[0], 0), pos.get(e[1], 0), e[2]))
    bound = {t.name: t for t in tasks or []}
    schedule = {bound.get(n, PipelineTask(n)): TaskSchedule(stage=0) for n in names}
    plan = PipelinePlan(schedule, intra_iter_deps=list(intra_l), inter_iter_deps=list(inter_l))
    return InferredDeps(intra_l, inter_l, hazards, plan, notes + list(record.notes))
