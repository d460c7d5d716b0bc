"""Bytes in flight: predicted from a simulated run, and the least any plan of a given period needs.

:func:`predict_memory` turns a :class:`~autosched.model.simulate.SimResult` and the
memory figures of its cost model (``CostModel.batch_bytes``, per task
``add_bytes`` / ``free_bytes``, see :mod:`autosched.model.costs`) into live bytes
over time, by the engine's lifetime rules:

* an iteration's context is created, holding its batch (``batch_bytes``), when
  its first period is enqueued (``SimResult.entry``);
* each task's ``add_bytes - free_bytes`` is applied at the end of its host
  part (where the engine runs ``fn(ctx)``); a context never holds less than
  nothing (figures that free more than was added are clipped at 0); with
  ``transient_bytes`` (context figures: measured above the higher of the
  levels before and after the task), the context holds that much more than
  the higher of the two from the task's start to its end;
* the context and everything left in it is released when the iteration
  retires: ``progress()`` retires iterations in order, so at the latest CPU
  completion of it and every older iteration; on CUDA not before the device
  work of its tasks completed (``SimResult.completion``), as the engine keeps
  retired contexts until their device events complete.

At one instant a task end comes before a retirement and a retirement before
a new context, as in the engine (a task's signal retires the iteration, then
``progress`` enqueues the next period). The peak is over the whole run (the
fill included, as a measured run sees it); the mean is time-weighted over the
simulator's steady-state window.

:func:`min_memory` is the companion of :func:`autosched.search.bounds.lower_bounds`:
no plan that runs at period ``P`` holds fewer bytes at its peak than

``max(M1, F * L / P)`` where

* ``M1`` — one iteration's own high-water mark, which any plan reaches (the
  same reasoning while a task with ``transient_bytes`` runs). With
  ``net = add_bytes - free_bytes``, a context holds ``batch + Σ_{ended} net``
  and the set of ended tasks is always closed under dependencies (a
  *downset*). When task ``k`` ends the ended set contains ``k`` and its
  ancestors and none of its descendants (they start after it ends), so the
  context holds at least ``batch`` plus the least ``Σ net`` over such
  downsets; ``M1`` is the largest of these over ``k``.
* ``F * L / P`` — Little's law: the mean bytes in flight equal the byte-seconds
  one iteration holds divided by the period. A context never holds less than
  ``F = max(0, batch + least Σ net over all downsets)`` and lives at least its
  critical path ``L`` (the longest chain of intra-iteration dependencies; on
  CUDA of host time, as retirement waits CPU signals), and the peak is at
  least the mean.

The least ``Σ net`` over downsets is a minimum-weight closure, solved exactly
as a minimum cut (networkx).
"""

from __future__ import annotations

import bisect
from itertools import islice
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Sequence, Tuple

import networkx as nx

from swpipe_core.measure.trace import TimelineEvent
from swpipe_core.plan import PipelinePlan

from autosched.model.costs import CostModel
from autosched.model.memcurve import MemoryChanges

if TYPE_CHECKING:  # for the annotations only: matplotlib is imported in plot()
    from matplotlib.axes import Axes

__all__ = ["MemoryPrediction", "MemoryBound", "SimulatedRun", "predict_memory", "min_memory", "format_bytes"]


class SimulatedRun(Protocol):
    """What :func:`predict_memory` reads of a simulated run: a :class:`~autosched.model.simulate.SimResult` has it.

    The memory model reads a timeline and its cost model; it needs no simulator (the simulator's result offers
    ``.memory`` through this module, so this module names no simulator type).
    """

    plan: PipelinePlan
    costs: CostModel
    device: str
    entry: List[float]        # per iteration: when its first period was enqueued
    completion: List[float]   # per iteration: when it completed
    events: List[TimelineEvent]
    window: Tuple[int, int]   # the steady-state iterations

_TASK_END, _RELEASE, _ENTRY, _TASK_START = 0, 1, 2, 3  # order of simultaneous changes (module docstring)


def format_bytes(num_bytes: float) -> str:
    """Bytes in readable units (powers of 1024).

    Examples
    --------
    >>> format_bytes(512), format_bytes(3 * 1024 ** 2), format_bytes(1.5 * 1024 ** 3)
    ('512 B', '3.00 MiB', '1.50 GiB')
    """
    for unit, scale in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes:.0f} B"


@dataclass
class MemoryPrediction:
    """Live bytes over a simulated run.

    Attributes
    ----------
    peak_bytes : float
        Most bytes in flight at any instant of the run.
    peak_time : float
        When the peak was first reached (seconds from the start).
    mean_bytes : float
        Time-weighted mean over the steady-state window.
    iterations_at_peak : int
        Contexts alive at the peak.
    curve : list of (float, float)
        ``(time, live bytes from that time on)``, a step function.
    figures : str
        ``"context"`` or ``"device"``: which per-task figures were used.
    """

    peak_bytes: float
    peak_time: float
    mean_bytes: float
    iterations_at_peak: int
    curve: List[Tuple[float, float]] = field(repr=False, default_factory=list)
    figures: str = "context"

    def at(self, seconds: float) -> float:
        """Live bytes at time ``seconds`` (after every change at that time).

        Examples
        --------
        >>> MemoryPrediction(10, 1.0, 5, 1, [(0.0, 4.0), (1.0, 10.0), (2.0, 0.0)]).at(1.5)
        10.0
        """
        times = [c[0] for c in self.curve]
        j = bisect.bisect_right(times, seconds) - 1
        return self.curve[j][1] if j >= 0 else 0.0

    def summary(self) -> str:
        """One line: peak (when, how many contexts) and mean bytes in flight."""
        return (f"predicted bytes in flight ({self.figures}): peak {format_bytes(self.peak_bytes)} at "
                f"{self.peak_time * 1e3:.3f} ms ({self.iterations_at_peak} context(s) alive), "
                f"mean {format_bytes(self.mean_bytes)}")

    def plot(self, ax: Optional[Axes] = None, label: Optional[str] = None) -> Axes:
        """The live-bytes step curve on ``ax`` (or a new headless figure's axes); returns the axes.

        matplotlib is imported here; no pyplot state is touched.
        """
        if ax is None:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure

            fig = Figure(figsize=(7, 3), layout="constrained")
            FigureCanvasAgg(fig)
            ax = fig.add_subplot()
        xs = [t * 1e3 for t, _ in self.curve]
        ax.step(xs, [b / 2 ** 20 for _, b in self.curve], where="post", label=label)
        ax.set_xlabel("time (ms)")
        ax.set_ylabel("live MiB")
        return ax


def _net(costs: CostModel, name: str, figures: str) -> float:
    c = costs[name]
    if figures == "device":
        return c.device_alloc_bytes - c.device_free_bytes
    return c.add_bytes - c.free_bytes


def predict_memory(sim: SimulatedRun, figures: str = "context") -> MemoryPrediction:
    """Live bytes over the simulated run of a plan, from its cost model's memory figures.

    Parameters
    ----------
    sim : SimResult
        A result of :func:`autosched.model.simulate.simulate` (any :class:`SimulatedRun`); its ``costs`` carry
        the bytes.
    figures : {"context", "device"}
        Per-task ``add_bytes``/``free_bytes`` (tensors reachable from the
        context) or ``device_alloc_bytes``/``device_free_bytes`` (CUDA allocator).

    Returns
    -------
    MemoryPrediction

    Raises
    ------
    ValueError
        For an unknown ``figures``.

    Examples
    --------
    Load adds 100 bytes, Step frees them; with Step one stage later two
    contexts overlap:

    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> from swpipe import CostModel, TaskCost
    >>> from swpipe import simulate
    >>> costs = CostModel({"Load": TaskCost(0.001, add_bytes=100), "Step": TaskCost(0.002, free_bytes=100)},
    ...                   batch_bytes=10)
    >>> plan = PipelinePlan({"Load": TaskSchedule(0, thread_group="a"), "Step": TaskSchedule(1, thread_group="b")},
    ...                     intra_iter_deps=[("Step", "Load")])
    >>> m = predict_memory(simulate(plan, costs, num_iterations=20))
    >>> m.peak_bytes, m.iterations_at_peak
    (220.0, 2)
    """
    if figures not in ("context", "device"):
        raise ValueError(f"figures={figures!r}: use 'context' (bytes reachable from ctx) or 'device' (CUDA allocator)")
    costs: CostModel = sim.costs
    n = len(sim.entry)
    net = {name: _net(costs, name, figures) for name in sim.plan.task_names}
    batch = float(costs.batch_bytes)
    cpu_done = [0.0] * n
    # each context is an owner; at one instant (kind, bytes) orders the changes (module docstring: frees first)
    mem = MemoryChanges(clip=True)
    extra = {name: costs[name].transient_bytes if figures == "context" else 0.0 for name in net}
    for e in sim.events:
        if e.kind != "host":
            continue
        cpu_done[e.iteration] = max(cpu_done[e.iteration], e.end)
        if extra[e.task]:  # transient is measured above both ends: the adds are held from the start too
            early = extra[e.task] + max(0.0, net[e.task])
            mem.add(e.start, early, order=(_TASK_START, early), owner=e.iteration)
            mem.add(e.end, net[e.task] - early, order=(_TASK_END, net[e.task] - early), owner=e.iteration)
        elif net[e.task]:
            mem.add(e.end, net[e.task], order=(_TASK_END, net[e.task]), owner=e.iteration)
    retired = 0.0
    cuda = sim.device == "cuda"
    for i in range(n):
        retired = max(retired, cpu_done[i])  # progress() retires in order
        release = max(retired, sim.completion[i]) if cuda else retired
        mem.add(sim.entry[i], batch, order=(_ENTRY, batch), owner=i)
        mem.release(release, i, order=(_RELEASE, 0.0))
    top = mem.peak()
    alive = 0  # contexts alive when the peak was reached
    for c, _, _ in islice(mem.walk(), top.applied):
        alive += 1 if c.order[0] == _ENTRY else -1 if c.release else 0
    curve = [(t, float(level)) for t, level in mem.curve()]
    peak, peak_t, peak_alive = float(top.bytes), top.time, alive
    w0, w1 = sim.window
    t0, t1 = sim.completion[w0], sim.completion[w1]
    mean = _time_mean(curve, t0, t1) if t1 > t0 else (curve[-1][1] if curve else 0.0)
    return MemoryPrediction(peak, peak_t, mean, peak_alive, curve, figures)


def _time_mean(curve: Sequence[Tuple[float, float]], t0: float, t1: float) -> float:
    total = 0.0
    for (t, level), nxt in zip(curve, list(curve[1:]) + [(float("inf"), 0.0)]):
        a, b = max(t, t0), min(nxt[0], t1)
        if b > a:
            total += level * (b - a)
    return total / (t1 - t0)


@dataclass(frozen=True)
class MemoryBound:
    """The least memory any plan needs (see the module docstring for the formula).

    Attributes
    ----------
    value : float
        ``max(single_iteration, littles_law)``: bytes no plan at ``period_s`` stays under.
    single_iteration : float
        ``M1``: one iteration's own high-water mark (reached by every plan, at any period).
    littles_law : float
        ``F * L / P`` (0 without a period).
    floor_bytes, critical_path_s, period_s : float
        ``F``, ``L`` and ``P``.
    task : str
        The task at whose end ``M1`` is reached.
    """

    value: float
    single_iteration: float
    littles_law: float
    floor_bytes: float
    critical_path_s: float
    period_s: Optional[float]
    task: str

    def __str__(self) -> str:
        per = f" at period {self.period_s * 1e3:.3f} ms" if self.period_s else ""
        return (f"least memory any plan needs{per}: {format_bytes(self.value)} (one iteration's own peak, after "
                f"{self.task or 'its batch'}: {format_bytes(self.single_iteration)}; Little's law "
                f"{format_bytes(self.floor_bytes)} held for the {self.critical_path_s * 1e3:.3f} ms critical path / "
                f"period: {format_bytes(self.littles_law)})")


def min_memory(tasks: Sequence[str], intra: Sequence[Tuple[str, str]], costs: CostModel,
               period_s: Optional[float] = None, device: str = "cpu", figures: str = "context") -> MemoryBound:
    """The least peak bytes in flight of any plan of these tasks running at ``period_s``.

    Parameters
    ----------
    tasks : list of str
    intra : list of (task, dep)
        Intra-iteration dependencies.
    costs : CostModel
        With memory figures.
    period_s : float, optional
        The plan's period; None gives the single-iteration bound only.
    device : {"cpu", "cuda"}
    figures : {"context", "device"}

    Returns
    -------
    MemoryBound

    Examples
    --------
    >>> from swpipe import TaskCost
    >>> costs = CostModel({"Load": TaskCost(0.001, add_bytes=100), "Step": TaskCost(0.002, free_bytes=100)},
    ...                   batch_bytes=10)
    >>> b = min_memory(["Load", "Step"], [("Step", "Load")], costs, period_s=0.001)
    >>> b.single_iteration, b.floor_bytes, round(b.littles_law, 6), b.value
    (110.0, 10.0, 30.0, 110.0)
    """
    cuda = str(device).startswith("cuda")
    net = {t: _net(costs, t, figures) for t in tasks}
    batch = float(costs.batch_bytes)
    dag = nx.DiGraph()
    dag.add_nodes_from(tasks)
    dag.add_edges_from((d, t) for t, d in intra)
    best, best_task = batch, ""
    for k in tasks:
        # k's descendants start after k ends: the state just after k's end has none of them
        sub = dag.subgraph(set(dag.nodes) - nx.descendants(dag, k))
        level = batch + _min_closure(sub, net, nx.ancestors(dag, k) | {k})
        if level > best + 1e-9:
            best, best_task = level, k
        transient = costs[k].transient_bytes if figures == "context" else 0.0
        if transient:  # while k runs: its ancestors ended, k and its descendants not; held above both ends
            during = (batch + transient + max(0.0, net[k])
                      + _min_closure(sub.subgraph(set(sub.nodes) - {k}), net, nx.ancestors(dag, k)))
            if during > best + 1e-9:
                best, best_task = during, k
    floor = max(0.0, batch + _min_closure(dag, net, set()))
    length: Dict[str, float] = {}
    for t in nx.topological_sort(dag):
        c = costs[t]
        own = c.host_s if cuda else c.cpu_s
        length[t] = own + max((length[d] for d in dag.predecessors(t)), default=0.0)
    crit = max(length.values(), default=0.0)
    if period_s is not None and not period_s > 0:
        raise ValueError(f"period_s={period_s!r}: use a period > 0 in seconds (or None)")
    little = floor * crit / period_s if period_s else 0.0
    return MemoryBound(max(best, little), best, little, floor, crit, period_s, best_task)


def _min_closure(dag: nx.DiGraph, weight: Dict[str, float], forced: set) -> float:
    """Least ``Σ weight`` over sets containing ``forced`` and closed under predecessors (a minimum cut).

    Maximise the closure weight of ``-weight``: source -> v with capacity
    ``-weight(v)`` when positive, v -> sink with ``weight(v)`` when positive,
    v -> each predecessor uncapacitated (taking v takes its dependencies),
    source -> forced uncapacitated; the source side of a minimum cut is the best set.
    """
    g = nx.DiGraph()
    g.add_nodes_from(["^s", "^t"])
    for v in dag.nodes:
        w = -weight[v]
        if v in forced:
            g.add_edge("^s", v)  # no capacity: infinite
        elif w > 0:
            g.add_edge("^s", v, capacity=w)
        if w < 0:
            g.add_edge(v, "^t", capacity=-w)
        for u in dag.predecessors(v):
            g.add_edge(v, u)
    _, (side, _) = nx.minimum_cut(g, "^s", "^t")
    return sum(weight[v] for v in side if v != "^s")
