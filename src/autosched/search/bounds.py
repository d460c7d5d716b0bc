"""Lower bounds on the period of a plan, or of every plan a task graph allows, each naming what binds.

Every bound is the ratio ``Σ time / Σ distance`` of a cycle of constraints
``start(v, i + δ) >= start(u, i) + w`` (an edge ``u -> v`` of weight ``w`` and
distance ``δ``): a schedule repeating every ``λ`` seconds satisfies all of them
only if ``λ >= Σw / Σδ`` around every cycle. The maximum ratio is found without
enumerating cycles: ``λ`` is feasible iff the weights ``λ·δ - w`` leave no
negative cycle (networkx Bellman-Ford), so a binary search on ``λ`` brackets
the maximum and the negative cycle found just below it names the binding
cycle (:func:`max_cycle_ratio`).

The bounds:

* **ResMII** — each resource does all of its work once per iteration: the host
  time of a thread group, the device time of a stream (CUDA), the time of
  every task on a communicator or on PCIe, the host time of the globally
  ordered tasks (the sequencer's turn is held while they run); with a core pool
  (``CostModel.cores``), total host time / ``cores``. For a task graph with ``T``
  allowed threads: total host time / ``T``, and the longest single task.
* **RecMII** — cycles of data dependencies (intra edges distance 0, inter
  edges distance ``N``); on CUDA, host and device cycles separately (the host
  waits CPU signals, a stream waits device events).
* **Critical path** — ``progress()`` admits iteration ``i + depth`` only once
  iteration ``i`` retired, and retiring takes at least the longest chain of
  intra-iteration dependencies, so ``period >= critical path / depth``.
* **Schedule cycle** (plans only) — the max cycle ratio over everything a plan
  fixes: data dependencies, the FIFO order of each thread group (and, on CUDA,
  of each stream's work submitted by one thread), the sequencer's turn order
  and the progress barrier. It is at least as large as the thread and
  recurrence bounds and the critical-path bound, and can exceed them all when
  a thread's FIFO order chains with a dependency.

None of these exceeds the period the simulator (or the engine) achieves.
For a valid plan every cycle has positive distance: each edge moves forward
in periods (``δ + stage(v) - stage(u) >= 0``) and the zero-period edges follow
the enqueue order, a topological order of the period-local graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

import networkx as nx

from swpipe_core.order import enqueue_order
from swpipe_core.plan import PipelinePlan, ref_name
from swpipe_core.validate import validate

from autosched.search.problem import Problem
from autosched.model.costs import CostModel, as_cost_model
from autosched.model.graph import task_graph_deps
from autosched.model.taskmodel import CORES, critical_path, plan_parts, resource_loads, task_parts

__all__ = ["Bounds", "lower_bounds", "max_cycle_ratio", "event_graph", "recurrence_bound", "critical_path_units",
           "plan_resource_bound"]


@dataclass(frozen=True)
class Bounds:
    """Lower bounds on the period (seconds per iteration) and what binds.

    Attributes
    ----------
    res_mii, rec_mii, critical_path, schedule_cycle : float
        The four bounds (``schedule_cycle`` is 0 for a task graph).
    value : float
        Their maximum: no plan (or no run of this plan) has a shorter period.
    binding : str
        The largest bound's resource (``"thread:<group>"``, ``"stream:<name>"``,
        ``"comm:<name>"``, ``"pcie"``, ``"sequencer"``, ``"cores"``, ``"host work / T threads"``,
        ``"longest task <name>"``) or cycle (``"recurrence: ..."``,
        ``"critical path: ..."``, ``"schedule cycle: ..."``).
    components : tuple of (kind, value, what)
        Every bound with its description.
    memory : MemoryBound, optional
        When the cost model has memory figures: the least peak bytes any plan
        running at ``value`` needs (:func:`autosched.model.memory.min_memory`);
        ``memory.value`` bytes, with how it is derived.

    Examples
    --------
    >>> from swpipe import TaskCost
    >>> from autosched.model.graph import task_graph   # graphs in networkx form: advanced, not public
    >>> g = task_graph(["A", "B"], [("B", "A")])
    >>> print(lower_bounds(g, CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002)}), max_depth=1).summary())
    lower bound 3.000 ms/iter, binding: critical path: A -> B (3.000 ms) / depth 1
      resource             2.000 ms  longest task B (2.000 ms of work per iteration)
      recurrence           0.000 ms  (no cycle)
      critical path        3.000 ms  A -> B (3.000 ms) / depth 1
      schedule cycle       0.000 ms  task graph: no schedule fixed
    """

    res_mii: float
    rec_mii: float
    critical_path: float
    schedule_cycle: float
    value: float
    binding: str
    components: Tuple[Tuple[str, float, str], ...]
    memory: Any = None

    @property
    def period_s(self) -> float:
        """:attr:`value`, the least period (the verbs' common name for a bound's time, :mod:`autosched.results`)."""
        return self.value

    def summary(self) -> str:
        """One line per bound, the binding one marked."""
        lines = [f"lower bound {self.value * 1e3:.3f} ms/iter, binding: {self.binding}"]
        for kind, value, what in self.components:
            lines.append(f"  {kind:<15} {value * 1e3:10.3f} ms  {what}")
        if self.memory is not None:
            lines.append(f"  memory: {self.memory}")
        return "\n".join(lines)


# -- max cycle ratio --------------------------------------------------------------------------------------------


_Pairs = Dict[Tuple[Hashable, Hashable], List[Tuple[float, int, Any]]]


def _collapse(graph: nx.DiGraph, weight: str, distance: str) -> _Pairs:
    """``{(u, v): [(weight, distance, data), ...]}`` over all (parallel) edges."""
    pairs: _Pairs = {}
    if graph.is_multigraph():
        edges = ((u, v, d) for u, v, _, d in graph.edges(keys=True, data=True))
    else:
        edges = graph.edges(data=True)
    for u, v, data in edges:
        pairs.setdefault((u, v), []).append((float(data.get(weight, 0.0)), int(data.get(distance, 0)), data))
    return pairs


def max_cycle_ratio(graph: nx.DiGraph, weight: str = "weight", distance: str = "distance",
                    rel_tol: float = 1e-12) -> Tuple[float, List[Hashable]]:
    """The maximum over cycles of ``Σ weight / Σ distance``, and a cycle attaining it.

    An edge ``u -> v`` with weight ``w`` and distance ``δ`` is the constraint
    ``start(v, i + δ) >= start(u, i) + w``. ``λ`` is feasible iff no cycle has
    ``Σ (w - λ·δ) > 0``, i.e. iff the weights ``λ·δ - w`` leave no negative cycle
    (Bellman-Ford); a binary search brackets the maximum, and the negative cycle
    found just below it is returned with its exact ratio. Cycles are never
    enumerated. Parallel edges (a multigraph) are allowed.

    Parameters
    ----------
    graph : networkx.DiGraph or MultiDiGraph
    weight, distance : str
        Edge attribute names (missing = 0).
    rel_tol : float
        Relative width at which the search stops.

    Returns
    -------
    (float, list)
        The ratio (0 with ``[]`` if no cycle has positive weight; ``inf`` if a cycle of
        positive weight has distance <= 0, i.e. the constraints deadlock) and the
        cycle's nodes in order.

    Examples
    --------
    A 2-cycle of weight 3 over distance 1 and a self-loop of weight 5 over distance 2:

    >>> g = nx.DiGraph()
    >>> g.add_edge("a", "b", weight=1.0, distance=0)
    >>> g.add_edge("b", "a", weight=2.0, distance=1)
    >>> g.add_edge("c", "c", weight=5.0, distance=2)
    >>> ratio, cycle = max_cycle_ratio(g)
    >>> ratio, sorted(cycle)
    (3.0, ['a', 'b'])
    """
    pairs = _collapse(graph, weight, distance)
    if not pairs:
        return 0.0, []
    nodes = list(graph.nodes)
    source = ("__source__",)
    aux = nx.DiGraph()
    aux.add_nodes_from(nodes)
    aux.add_edges_from(pairs)
    aux.add_edges_from((source, n) for n in nodes)

    def weight_at(lam: float):
        def w(u: Hashable, v: Hashable, _: Any) -> float:
            lst = pairs.get((u, v))  # None for the helper source edges (ours and networkx's)
            return 0.0 if lst is None else min(lam * d - wt for wt, d, _ in lst)
        return w

    def infeasible(lam: float) -> bool:
        return nx.negative_edge_cycle(aux, weight=weight_at(lam), heuristic=True)

    total = sum(max(0.0, wt) for lst in pairs.values() for wt, _, _ in lst)
    hi = total + 1.0
    if infeasible(hi):
        cycle = nx.find_negative_cycle(aux, source, weight=weight_at(hi))
        return math.inf, [n for n in cycle[:-1] if n != source]
    lo = 0.0
    if not infeasible(lo + 1e-15 * hi):
        return 0.0, []
    for _ in range(200):
        if hi - lo <= rel_tol * hi:
            break
        mid = (lo + hi) / 2
        if infeasible(mid):
            lo = mid
        else:
            hi = mid
    cycle = nx.find_negative_cycle(aux, source, weight=weight_at(lo))
    cycle = [n for n in cycle if n != source]
    if len(cycle) > 1 and cycle[0] == cycle[-1]:
        cycle = cycle[:-1]
    return _cycle_ratio(pairs, cycle, lo), cycle


def _cycle_ratio(pairs: Dict, cycle: Sequence[Hashable], lam: float) -> float:
    """Exact ratio of a cycle, taking on each step the parallel edge that binds at ``lam``."""
    w_sum, d_sum = 0.0, 0
    for u, v in zip(cycle, list(cycle[1:]) + [cycle[0]]):
        wt, d, _ = min(pairs[(u, v)], key=lambda e: lam * e[1] - e[0])
        w_sum += wt
        d_sum += d
    return w_sum / d_sum if d_sum > 0 else (math.inf if w_sum > 0 else 0.0)


def _cycle_edges(graph: nx.DiGraph, cycle: Sequence[Hashable], lam: float) -> List[Dict[str, Any]]:
    pairs = _collapse(graph, "weight", "distance")
    out = []
    for u, v in zip(cycle, list(cycle[1:]) + [cycle[0]]):
        out.append(min(pairs[(u, v)], key=lambda e: lam * e[1] - e[0])[2])
    return out


# -- the constraint graphs ----------------------------------------------------------------------------------------


def _label(node: Hashable) -> str:
    if isinstance(node, tuple) and len(node) == 2 and node[0] in ("h", "d"):
        return node[1] if node[0] == "h" else f"{node[1]}@dev"
    return str(node)


def _describe(graph: nx.DiGraph, cycle: Sequence[Hashable], ratio: float) -> str:
    if not cycle:
        return "(no cycle)"
    edges = _cycle_edges(graph, cycle, ratio)
    total_w = sum(e.get("weight", 0.0) for e in edges)
    total_d = sum(e.get("distance", 0) for e in edges)
    parts = [f"{_label(n)} -{e.get('kind', 'dep')}->" for n, e in zip(cycle, edges)]
    return (" ".join(parts) + f" {_label(cycle[0])} ({total_w * 1e3:.3f} ms over {total_d} iteration(s))")


def _times(costs: CostModel, name: str, cuda: bool) -> Tuple[float, float]:
    p = task_parts(costs[name].host_s, costs[name].device_s, (), "", "", False, cuda)
    return p.host, p.device


def _dep_graph(tasks: Sequence[str], intra: Sequence[Tuple[str, str]], inter: Sequence[Tuple[str, str, int]],
               costs: CostModel, cuda: bool) -> nx.MultiDiGraph:
    g = nx.MultiDiGraph()
    for t in tasks:
        g.add_node(("h", t))
        if cuda:
            g.add_node(("d", t))
    for t, d, n in [(t, d, 0) for t, d in intra] + list(inter):
        host, dev = _times(costs, d, cuda)
        g.add_edge(("h", d), ("h", t), weight=host, distance=n, kind="dep")
        if cuda:
            g.add_edge(("d", d), ("d", t), weight=dev, distance=n, kind="event")
    if cuda:
        for t in tasks:
            g.add_edge(("h", t), ("d", t), weight=_times(costs, t, True)[0], distance=0, kind="submit")
    return g


def event_graph(plan: PipelinePlan, costs: CostModel, device: str = "cpu") -> nx.MultiDiGraph:
    """Every constraint a plan fixes, as edges ``u -> v`` with ``weight`` and ``distance``.

    Nodes are ``("h", task)`` (host part), ``("d", task)`` (device part, CUDA) and
    ``"retire"``. Edge ``kind``: ``"dep"`` / ``"event"`` (data dependencies),
    ``"submit"``, ``"thread:<g>"`` (FIFO order of a thread group across periods),
    ``"stream:<s>"`` (device FIFO of work one thread submits to one stream),
    ``"sequencer"``, ``"barrier"`` (``retire(i) -> start of period i + depth``).

    Parameters
    ----------
    plan : PipelinePlan
    costs : CostModel
    device : {"cpu", "cuda"}

    Returns
    -------
    networkx.MultiDiGraph

    Examples
    --------
    >>> from swpipe import TaskSchedule
    >>> from swpipe import TaskCost
    >>> plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, [("B", "A")])
    >>> g = event_graph(plan, CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002)}))
    >>> sorted((_label(u), _label(v), d["kind"], d["distance"])
    ...        for u, v, d in g.edges(data=True) if d["kind"] != "barrier")
    [('A', 'B', 'dep', 0), ('A', 'B', 'thread:default', -1), ('B', 'A', 'thread:default', 2)]
    """
    cuda = str(device).startswith("cuda")
    names = plan.task_names
    g = _dep_graph(names, plan.intra_edges(), plan.inter_edges(), costs, cuda)
    stage = {t: plan.stage(t) for t in names}
    order = enqueue_order(plan)

    def chain(seq: Sequence[str], kind: str, part: str) -> None:
        # consecutive tasks in one FIFO within a period, and the last of a period before the first of the next
        for a, b in zip(seq, list(seq[1:]) + [seq[0]]):
            wrap = 1 if b == seq[0] else 0
            w = _times(costs, a, cuda)[0 if part == "h" else 1]
            g.add_edge((part, a), (part, b), weight=w, distance=stage[a] - stage[b] + wrap, kind=kind)

    for group in sorted({plan.sched(t).thread_group for t in names}):
        seq = [t for t in order if plan.sched(t).thread_group == group]
        chain(seq, f"thread:{group}", "h")
        if cuda:
            for stream in sorted({plan.stream_of(t) for t in seq}):
                chain([t for t in seq if plan.stream_of(t) == stream], f"stream:{stream}", "d")
    ordered = [t for t in order if plan.sched(t).globally_ordered]
    if ordered:
        chain(ordered, "sequencer", "h")
    depth = plan.pipeline_depth
    for t in names:
        g.add_edge(("h", t), "retire", weight=_times(costs, t, cuda)[0], distance=0, kind="barrier")
        g.add_edge("retire", ("h", t), weight=0.0, distance=depth - stage[t], kind="barrier")
    return g


def _busiest_resource(plan: Optional[PipelinePlan], tasks: Sequence[str], costs: CostModel, cuda: bool,
                      max_threads: Optional[int]) -> Tuple[str, float]:
    """ResMII: the resource with the most work per iteration, and that work (seconds).

    For a plan, its threads, streams and shared resources; for a task graph (``plan`` None), no threads
    or streams are fixed yet: the shared resources (comm:, pcie), the core pool, host work over
    ``max_threads`` threads and the longest task.
    """
    if plan is not None:
        load = resource_loads(plan_parts(plan, costs, cuda).values(), costs.cores)
    else:
        parts = [task_parts(costs[t].host_s, costs[t].device_s, costs[t].resources, "", "", False, cuda) for t in tasks]
        load = {k: v for k, v in resource_loads(parts, costs.cores).items()
                if not k.startswith(("thread:", "stream:"))}
        total_host = sum(_times(costs, t, cuda)[0] for t in tasks)
        if max_threads is not None:
            load[f"host work / {max_threads} thread(s)"] = total_host / max_threads
        longest = max(tasks, key=lambda t: (max(_times(costs, t, cuda)), t))
        load[f"longest task {longest}"] = max(_times(costs, longest, cuda))
    return max(load.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0.0))


# -- the public entry point ---------------------------------------------------------------------------------------


def lower_bounds(plan_or_graph: Any, costs: CostModel, max_threads: Optional[int] = None,
                 max_depth: Optional[int] = None, device: str = "cpu") -> Bounds:
    """Lower bounds on the steady-state period, for one plan or for every plan of a task graph.

    Parameters
    ----------
    plan_or_graph : PipelinePlan or networkx.DiGraph
        A plan (its threads, streams, stages and order are fixed) or a task graph
        (:func:`autosched.model.graph.task_graph`; any plan the constraints allow).
    costs : CostModel
        Must cost every task.
    max_threads : int, optional
        Task graph only: thread groups a plan may use (bounds host work / T).
    max_depth : int, optional
        Task graph only: the deepest pipeline allowed (bounds critical path / depth).
    device : {"cpu", "cuda"}
        As in :func:`autosched.model.simulate.simulate`.

    Returns
    -------
    Bounds

    Raises
    ------
    swpipe_core.validate.PlanError
        For an invalid plan.
    autosched.model.costs.CostModelError
        If a task has no cost.
    ValueError
        For ``max_threads`` or ``max_depth`` < 1.

    Examples
    --------
    >>> from swpipe import TaskSchedule
    >>> from swpipe import TaskCost
    >>> costs = CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002)})
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
    ...                     intra_iter_deps=[("B", "A")])
    >>> b = lower_bounds(plan, costs)
    >>> round(b.value * 1e3, 6), b.binding
    (2.0, 'thread:b')
    >>> from autosched.model.graph import task_graph   # graphs in networkx form: advanced, not public
    >>> g = task_graph(["A", "B"], [("B", "A")], [("A", "B")])
    >>> b = lower_bounds(g, costs, max_threads=2)
    >>> round(b.rec_mii * 1e3, 6), b.binding
    (3.0, 'recurrence: A -dep-> B -dep-> A (3.000 ms over 1 iteration(s))')

    One free core (``CostModel.cores``) runs all host work in turn:

    >>> b = lower_bounds(plan, CostModel(costs.tasks, cores=1))
    >>> round(b.value * 1e3, 6), b.binding
    (3.0, 'cores')
    """
    costs = as_cost_model(costs)
    cuda = str(device).startswith("cuda")
    if str(device) != "cpu" and not cuda:
        raise ValueError(f"device={device!r}: use 'cpu' or 'cuda'")
    for name, value in (("max_threads", max_threads), ("max_depth", max_depth)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name}={value!r}: use an integer >= 1 or None")
    is_plan = isinstance(plan_or_graph, PipelinePlan)
    if is_plan:
        validate(plan_or_graph)
        plan: PipelinePlan = plan_or_graph
        tasks, intra, inter = plan.task_names, plan.intra_edges(), plan.inter_edges()
    else:
        tasks = list(plan_or_graph.nodes)
        intra, inter = task_graph_deps(plan_or_graph)
    costs.check(tasks)
    components: List[Tuple[str, float, str]] = []

    # ResMII: each resource's work per iteration
    res_name, res = _busiest_resource(plan if is_plan else None, tasks, costs, cuda, max_threads)
    per = f" per core, {costs.cores} core(s)" if res_name == CORES else ""
    components.append(("resource", res, f"{res_name} ({res * 1e3:.3f} ms of work per iteration{per})"))

    # RecMII: data-dependency cycles
    dep = _dep_graph(tasks, intra, inter, costs, cuda)
    rec, rec_cycle = max_cycle_ratio(dep)
    rec_what = _describe(dep, rec_cycle, rec)
    components.append(("recurrence", rec, rec_what))

    # critical path over the deepest pipeline allowed
    depth = plan.pipeline_depth if is_plan else max_depth
    cp_len, cp_path = critical_path(tasks, intra, lambda t: _times(costs, t, cuda)[0])
    cp = cp_len / depth if depth else 0.0
    cp_what = (f"{' -> '.join(cp_path)} ({cp_len * 1e3:.3f} ms) / depth {depth}" if depth
               else "unbounded depth: no critical-path bound")
    components.append(("critical path", cp, cp_what))

    sched_cycle, sched_what = 0.0, "task graph: no schedule fixed"
    if is_plan:
        eg = event_graph(plan, costs, device)
        sched_cycle, cyc = max_cycle_ratio(eg)
        sched_what = _describe(eg, cyc, sched_cycle)
    components.append(("schedule cycle", sched_cycle, sched_what))

    value = max(c[1] for c in components)
    # the first component within rounding of the maximum binds (resource before cycles)
    kind, _, what = next(c for c in components if c[1] >= value * (1 - 1e-9))
    if kind == "resource":
        binding = res_name
    else:
        binding = f"{kind}: {what}"
    memory = None
    if costs.has_bytes:  # the companion figure: the least memory of any plan at this period
        from autosched.model.memory import min_memory

        memory = min_memory(tasks, intra, costs, value if value > 0 else None, device=device)
    return Bounds(res_mii=res, rec_mii=rec, critical_path=cp, schedule_cycle=sched_cycle, value=value,
                  binding=binding, components=tuple(components), memory=memory)


# -- bounds of a search problem (time units), used by the searchers ---------------------------------------------


def recurrence_bound(problem: Problem) -> int:
    """RecMII in time units: the smallest ``II`` leaving no positive cycle of ``time - II * distance``.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> from swpipe import Constraints
    >>> c = NS(tasks={n: NS(host_s=0.001, device_s=0.0, resources=()) for n in "AB"})
    >>> p = make_problem((["A", "B"], [("B", "A")], [("A", "B", 1)]), c, Constraints(), time_unit_s=1e-6)
    >>> recurrence_bound(p)
    2000
    """
    graph = nx.MultiDiGraph()
    graph.add_edges_from((d, t, {"weight": problem.dur(d), "distance": 0}) for t, d in problem.intra)
    graph.add_edges_from((d, t, {"weight": problem.dur(d), "distance": n}) for t, d, n in problem.inter)
    ratio, _ = max_cycle_ratio(graph)
    if math.isinf(ratio):
        raise ValueError("a dependency cycle has zero total distance; the intra-iteration graph must be a DAG")
    # durations are whole time units, so the smallest feasible integer II is the ratio rounded up
    return max(0, math.ceil(ratio * (1 - 1e-9)))


def critical_path_units(problem: Problem) -> int:
    """Longest chain of the intra DAG in time units (thread time).

    Examples
    --------
    >>> from swpipe import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> from swpipe import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2), time_unit_s=1e-3)
    >>> critical_path_units(p)
    5
    """
    return int(critical_path(problem.names, problem.intra, problem.dur)[0])


def plan_resource_bound(problem: Problem, plan: PipelinePlan) -> float:
    """Seconds of work per iteration on the plan's busiest resource: no steady state is faster.

    Threads (and on CUDA streams), the sequencer, each communicator, PCIe, the
    core pool's work per core (``CostModel.cores``) and the main thread (the
    per-period engine time, and the caller's group when one runs inline).

    Parameters
    ----------
    problem : Problem
    plan : PipelinePlan
        A plan of the problem's tasks.

    Returns
    -------
    float

    Examples
    --------
    >>> from swpipe import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> from swpipe import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2), time_unit_s=1e-3)
    >>> from autosched.search.plans import build_plan   # the searchers' plan builder, not public
    >>> plan = build_plan(p, {"A": 0, "B": 1}, {"A": "x", "B": "x"})
    >>> round(plan_resource_bound(p, plan) * 1e3, 6)   # both on one thread
    5.0
    >>> two = build_plan(p, {"A": 0, "B": 1}, {"A": "x", "B": "y"})
    >>> round(plan_resource_bound(p, two) * 1e3, 6)
    3.0
    >>> one_core = make_problem((["A", "B"], [("B", "A")]), CostModel(costs.tasks, cores=1),
    ...                         Constraints(max_depth=2), time_unit_s=1e-3)
    >>> round(plan_resource_bound(one_core, two) * 1e3, 6)   # one core runs both threads' work
    5.0
    """
    sched = {ref_name(k): v for k, v in plan.schedule.items()}
    load = resource_loads((problem.parts(n, sched[n].thread_group, sched[n].stream) for n in problem.names),
                          problem.cores)
    main = problem.period_overhead_s + (load.get(f"thread:{plan.caller_group}", 0.0)
                                        if plan.caller_group in plan.thread_groups else 0.0)
    return max([main, *load.values()])
