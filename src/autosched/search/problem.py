"""The search problem, normalised once: tasks, dependencies, costs and what may be chosen.

``auto_schedule`` accepts a task graph, a plan or ``(tasks, intra, inter)``;
the CP-SAT model, the beam search and the brute-force enumerator all work on
this one :class:`Problem` so they search exactly the same plan space:

* ``stage[t]`` in ``0 .. max_depth - 1`` (or frozen),
* ``thread_group[t]``: at most ``max_threads`` distinct groups (or frozen),
* ``stream[t]`` from ``stream_choices[t]`` (matters only on CUDA),
* the enqueue order: a topological order of the period-local graph,
* the caller's group (:attr:`Problem.caller_group`, docs/semantics.md "The
  caller's group"): which group, if any, runs inline on the thread calling
  ``progress()``, and after which of its tasks the other groups' tasks are
  handed off.

The caller's group is a choice like the thread map. ``caller_group`` is the
name it carries (the input plan's ``caller_group``, ``"default"`` for a bare
graph); ``None`` rules it out: every group then has a worker. A group frozen
under that name always runs inline. Otherwise each searcher decides whether
one of its groups runs inline and which: the main thread is then one resource
that runs that group's tasks of a period and the per-period engine time
(:attr:`Problem.period_overhead_s`), and a worker's task placed after an
inline task in the enqueue order is handed off only once that task has run.

It also holds the timing the models use (:meth:`Problem.thread_time` etc.);
:func:`autosched.search.plans.build_plan` turns a choice of these into a
``PipelinePlan`` (``caller_group`` set when a group runs inline, the
hand-offs written into its ``enqueue_order``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Hashable, Iterable, List, Mapping, Optional,
                    Sequence, Tuple, Union)

import networkx as nx

from swpipe_core.plan import PipelinePlan, PipelineTask, StreamSpec, TaskSchedule, ref_name
from swpipe_core.stage_rules import stage_rule_holds

from autosched.model.costs import CostModel, TaskCost
from autosched.model.taskmodel import NOCORE, TaskParts, stream_label, task_parts
from autosched.search.options import Constraints, SolverOptions

if TYPE_CHECKING:  # annotations only
    from swpipe_core.measure.calibrate import MachineCalibration

    from autosched.model.simulate import SimResult

__all__ = ["Problem", "GraphInput", "make_problem", "searched_problem", "stage_assignments", "DEFAULT_GROUP"]

DEFAULT_GROUP = "default"

#: what ``auto_schedule`` searches: a task graph (``autosched.model.graph.task_graph``), a plan, or
#: ``(tasks, intra_deps[, inter_deps])``
GraphInput = Union["nx.DiGraph", PipelinePlan, Tuple[Sequence[Any], ...]]


@dataclass
class Problem:
    """Everything a searcher needs, with names as keys (see the module docstring)."""

    names: Tuple[str, ...]
    tasks: Dict[str, PipelineTask]
    intra: Tuple[Tuple[str, str], ...]
    inter: Tuple[Tuple[str, str, int], ...]
    costs: CostModel
    device: str
    host: Dict[str, float]
    dev: Dict[str, float]
    comm: Dict[str, Optional[str]]
    pcie: FrozenSet[str]
    ordered: FrozenSet[str]
    frozen_stage: Dict[str, int]
    frozen_stream: Dict[str, StreamSpec]
    frozen_group: Dict[str, str]
    stream_choices: Dict[str, Tuple[StreamSpec, ...]]
    init_stream: Dict[str, StreamSpec]
    max_depth: int
    max_threads: int
    unit_s: float = 1e-6
    base_plan: Optional[PipelinePlan] = None
    nocore: FrozenSet[str] = frozenset()   # tasks whose host part holds no core of the pool (cost tag "nocore")
    # the machine calibration ``costs`` has folded in (autosched.model.machine.searched_costs), or None: its per-hand-off
    # and per-period engine costs are added to every plan simulated (:meth:`simulate`), one model for the whole call
    calibration: Optional[MachineCalibration] = None
    # the name of the group that may run inline on the caller's thread (None: every group has a worker)
    caller_group: Optional[str] = DEFAULT_GROUP
    # what the problem was made from (:meth:`remade` makes it again with other costs or constraints)
    source: Optional[GraphInput] = field(default=None, repr=False)
    constraints: Optional[Constraints] = field(default=None, repr=False)
    time_unit_request: Optional[float] = field(default=None, repr=False)
    notes: List[str] = field(default_factory=list)   # what the report says of the problem (the machine model)
    _dag: Optional[nx.DiGraph] = field(default=None, repr=False)
    _preds: Optional[Dict[str, List[Tuple[str, int]]]] = field(default=None, repr=False)
    _dur: Optional[Dict[str, int]] = field(default=None, repr=False)
    _ddur: Optional[Dict[str, int]] = field(default=None, repr=False)
    _memo: Dict[Any, Any] = field(default_factory=dict, repr=False)

    # -- timing ------------------------------------------------------------

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def cores(self) -> Optional[int]:
        """The cost model's core pool (``CostModel.cores``; None: unlimited, :mod:`autosched.model.taskmodel`)."""
        return getattr(self.costs, "cores", None)

    def thread_time(self, name: str) -> float:
        """Seconds the task holds its thread (on CPU all of its time is host time)."""
        return self.host[name] if self.cuda else self.host[name] + self.dev[name]

    def units(self, seconds: float) -> int:
        """Seconds as integer time units (the models' clock)."""
        return int(round(seconds / self.unit_s))

    def dur(self, name: str) -> int:
        """Thread time of a task in time units."""
        if self._dur is None:
            self._dur = {n: self.units(self.thread_time(n)) for n in self.names}
            self._ddur = {n: (self.units(self.dev[n]) if self.cuda else 0) for n in self.names}
        return self._dur[name]

    def ddur(self, name: str) -> int:
        """Device (stream) time of a task in time units; 0 on CPU."""
        if self._ddur is None:
            self.dur(name)
        return self._ddur[name]

    def tags(self, name: str) -> Tuple[str, ...]:
        """The task's cost tags the models use (``comm:<name>``, ``pcie``, ``nocore``)."""
        comm = self.comm[name]
        return ((f"comm:{comm}",) if comm is not None else ()) + (("pcie",) if name in self.pcie else ()) \
            + ((NOCORE,) if name in self.nocore else ())

    def parts(self, name: str, group: str, stream: StreamSpec, units: bool = False) -> TaskParts:
        """The task's host and device parts under a choice of group and stream (seconds, or time units).

        Examples
        --------
        >>> from swpipe import CostModel, TaskCost
        >>> from swpipe import Constraints
        >>> p = make_problem((["A"], []), CostModel({"A": TaskCost(0.001, 0.002, ("pcie",))}),
        ...                  Constraints(device="cuda"), time_unit_s=1e-3)
        >>> p.parts("A", "io", "memcpy", units=True)
        TaskParts(host=1, device=2, host_holds=('thread:io', 'cores'), device_holds=('stream:memcpy', 'pcie'))
        """
        if units:  # dur already holds all of a CPU task's time, rounded once
            host, dev = self.dur(name), self.ddur(name)
        else:
            host, dev = self.host[name], self.dev[name]
        return task_parts(host, dev, self.tags(name), group, stream_label(stream), name in self.ordered, self.cuda)

    # -- the caller's thread -------------------------------------------------

    @property
    def forced_caller(self) -> Optional[str]:
        """The caller's group when tasks are frozen into it (it then always runs inline), else None."""
        caller = self.caller_group
        return caller if caller is not None and caller in self.frozen_group.values() else None

    @property
    def period_overhead_s(self) -> float:
        """The main thread's engine time per period: ``period_s`` of the machine calibration the search folded
        in (:attr:`calibration`), else 0.

        The main thread spends it each period, before it enqueues the period
        (the simulator's ``period_overhead_s``), on the same thread as the
        caller's group when one runs inline.
        """
        return float(getattr(self.calibration, "period_s", 0.0) or 0.0)

    def period_units(self) -> int:
        """:attr:`period_overhead_s` in time units."""
        return self.units(self.period_overhead_s)

    def simulate(self, plan: PipelinePlan, num_iterations: int = 40) -> "SimResult":
        """The simulator's result for a plan of this problem: the machine model of the call
        (:func:`autosched.model.simulate.simulate_folded`: its costs, device, and the calibration's engine time per
        hand-off and per period), which is what :func:`autosched.model.simulate.simulate` gives for the costs
        the search was given.

        Examples
        --------
        >>> from swpipe import CostModel, TaskCost
        >>> from swpipe import Constraints
        >>> from swpipe_core.measure.calibrate import MachineCalibration   # the measured machine: advanced, not public
        >>> from autosched.search.plans import build_plan   # the searchers' plan builder, not public
        >>> p = make_problem((["A"], []), CostModel({"A": TaskCost(0.001)}), Constraints(max_depth=1))
        >>> plan = build_plan(p, {"A": 0}, {"A": "g"}, inline="g")
        >>> round(p.simulate(plan).period_s * 1e3, 6)
        1.0
        >>> p.calibration = MachineCalibration(period_s=2e-4)
        >>> round(p.simulate(plan).period_s * 1e3, 6)   # the main thread runs A and the engine's 0.2 ms per period
        1.2
        """
        from autosched.model.simulate import simulate_folded

        return simulate_folded(plan, self.costs, self.calibration, num_iterations, self.device)

    def remade(self, costs: Optional[CostModel] = None, **constraints: Any) -> "Problem":
        """The same input made a problem again, with other costs or other constraints, in the same machine model.

        A refitted core pool (``costs``), a shallower depth (``max_depth=...``): the calibration's engine costs
        per hand-off and per period stay.

        Examples
        --------
        >>> from swpipe import Constraints, CostModel, TaskCost
        >>> p = make_problem((["A", "B"], [("B", "A")]), CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)}),
        ...                  Constraints(max_depth=3))
        >>> p.remade(max_depth=2).max_depth, p.remade(CostModel(p.costs.tasks, cores=1)).cores
        (2, 1)
        """
        changed = dataclasses.replace(self.constraints, **constraints)
        problem = make_problem(self.source, self.costs if costs is None else costs, changed,
                               time_unit_s=self.time_unit_request)
        problem.calibration = self.calibration
        return problem

    def memo(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """A value computed once per problem (presets, fire orders, levels)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    # -- structure ---------------------------------------------------------

    @property
    def dag(self) -> nx.DiGraph:
        """The intra-iteration dependency DAG (``dep -> task``)."""
        if self._dag is None:
            g = nx.DiGraph()
            g.add_nodes_from(self.names)
            g.add_edges_from((d, t) for t, d in self.intra)
            self._dag = g
        return self._dag

    def preds(self, name: str) -> List[Tuple[str, int]]:
        """``(dep, distance)`` for every dependency of ``name`` (distance 0 = intra)."""
        if self._preds is None:
            table: Dict[str, List[Tuple[str, int]]] = {n: [] for n in self.names}
            for t, d in self.intra:
                table[t].append((d, 0))
            for t, d, n in self.inter:
                table[t].append((d, n))
            self._preds = table
        return self._preds[name]

    def stage_ok(self, stage: Mapping[str, int]) -> bool:
        """The stage rules (docs/semantics.md), the depth cap and frozen stages."""
        if any(not 0 <= stage[n] < self.max_depth for n in self.names):
            return False
        if any(stage[n] != s for n, s in self.frozen_stage.items()):
            return False
        return (all(stage_rule_holds(stage[t], stage[d]) for t, d in self.intra)
                and all(stage_rule_holds(stage[t], stage[d], n) for t, d, n in self.inter))


def stage_assignments(problem: Problem, limit: Optional[int] = None) -> Iterable[Dict[str, int]]:
    """Every stage assignment the stage rules, the depth cap and frozen stages allow.

    Assignments whose smallest stage is above 0 are skipped when no stage is
    frozen: they only relabel periods (same timing, deeper pipeline).

    Parameters
    ----------
    problem : Problem
    limit : int, optional
        Stop after this many.

    Yields
    ------
    dict
        ``{task: stage}``.

    Examples
    --------
    >>> from swpipe import Constraints, CostModel, TaskCost
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2), time_unit_s=1e-3)
    >>> list(stage_assignments(p))   # B may not run in an earlier stage than A (the stage rule)
    [{'A': 0, 'B': 0}, {'A': 0, 'B': 1}]
    """
    names = list(nx.topological_sort(problem.dag))
    inter_by_task: Dict[str, List[Tuple[str, int]]] = {}
    for t, d, n in problem.inter:
        inter_by_task.setdefault(t, []).append((d, n))
        inter_by_task.setdefault(d, []).append((t, -n))
    count = 0
    stage: Dict[str, int] = {}

    def rec(i: int) -> Iterable[Dict[str, int]]:
        nonlocal count
        if limit is not None and count >= limit:
            return
        if i == len(names):
            if problem.frozen_stage or min(stage.values(), default=0) == 0:
                count += 1
                yield dict(stage)
            return
        n = names[i]
        lo = max((stage[p] for p in problem.dag.predecessors(n)), default=0)
        options = [problem.frozen_stage[n]] if n in problem.frozen_stage else range(lo, problem.max_depth)
        for s in options:
            if s < lo:
                continue
            ok = True
            for other, k in inter_by_task.get(n, ()):
                if other in stage:
                    # k > 0: n waits `other` k earlier -> stage[other] - s <= k; k < 0: other waits n -> s - stage[other] <= -k
                    if not (stage_rule_holds(s, stage[other], k) if k > 0 else stage_rule_holds(stage[other], s, -k)):
                        ok = False
                        break
            if ok:
                stage[n] = s
                yield from rec(i + 1)
                del stage[n]

    yield from rec(0)


def _auto_unit(times: Sequence[float]) -> float:
    """The models' clock: a sixth of the costs' common grain when they have one, else ~1e-4 of an iteration.

    Costs written by hand (1 ms, 2.5 ms, ...) share a grain ``g``; with ``g / 6``
    as the unit every task time is exact and so is any period of the form
    ``k * g / d`` for ``d`` in 1, 2, 3, 6 (cycles spanning 2 or 3 iterations).
    Measured costs have no useful grain: then about 1e4..1e5 units per serial
    iteration keep CP-SAT's domains small at a 1e-4 relative resolution.

    Examples
    --------
    >>> round(_auto_unit([0.001, 0.002, 0.0035]) * 1e6, 3)   # grain 0.5 ms
    83.333
    >>> _auto_unit([0.0123457, 0.0234568])
    1e-06
    """
    total = sum(times)
    if total <= 0:
        return 1e-6
    ticks = [int(round(t * 1e9)) for t in times if t > 0]
    grain = 0
    for t in ticks:
        grain = math.gcd(grain, t)
    if grain and total * 1e9 / grain <= 2e3:
        return grain * 1e-9 / 6
    return 10.0 ** math.floor(math.log10(total / 1e4))


def _cost_of(costs: CostModel, name: str) -> TaskCost:
    table = getattr(costs, "tasks", None)
    if isinstance(table, Mapping):
        if name not in table:
            from autosched.model.costs import CostModelError

            raise CostModelError(f"no cost for task {name!r} (the model covers {sorted(table)})", where="tasks",
                                 fix=f"add a TaskCost for {name!r}, e.g. costs.tasks[{name!r}] = TaskCost(host_s=...)")
        return table[name]
    return costs[name]


def _as_graph_parts(tasks_or_graph: GraphInput) -> Tuple[List[Any], List[tuple], List[tuple], Optional[PipelinePlan]]:
    """``(task refs, intra (task, dep), inter (task, dep, N), plan or None)`` from any accepted input."""
    if isinstance(tasks_or_graph, PipelinePlan):
        plan = tasks_or_graph
        if plan.same_period_deps:
            raise ValueError(f"same_period_deps {plan.same_period_deps}: the search chooses stages, and a same-period "
                             "dependency's distance follows them; declare each as (task, dep, N) in inter_iter_deps "
                             "at the distance you want, or schedule this plan by hand")
        return list(plan.schedule), plan.intra_edges(), plan.inter_edges(), plan
    if isinstance(tasks_or_graph, nx.DiGraph):
        from autosched.model.graph import task_graph_deps

        g = tasks_or_graph
        refs = [g.nodes[n].get("task", n) for n in g.nodes]
        intra, inter = task_graph_deps(g)
        return refs, intra, [(t, d, int(n)) for t, d, n in inter], None
    if isinstance(tasks_or_graph, tuple) and len(tasks_or_graph) in (2, 3):
        refs = list(tasks_or_graph[0])
        intra = [(ref_name(t), ref_name(d)) for t, d in tasks_or_graph[1]]
        inter_raw = tasks_or_graph[2] if len(tasks_or_graph) == 3 else []
        inter = [(ref_name(d[0]), ref_name(d[1]), int(d[2]) if len(d) > 2 else 1) for d in inter_raw]
        return refs, intra, inter, None
    raise TypeError(
        "auto_schedule takes a task graph (networkx.DiGraph from autosched.model.graph.task_graph), a PipelinePlan, "
        f"or a tuple (tasks, intra_deps[, inter_deps]); got {type(tasks_or_graph).__name__}"
    )


def _frozen_fields(value: Any) -> Dict[str, Any]:
    if isinstance(value, TaskSchedule):
        return {"stage": value.stage, "stream": value.stream, "thread_group": value.thread_group}
    if isinstance(value, Mapping):
        unknown = set(value) - {"stage", "stream", "thread_group"}
        if unknown:
            raise ValueError(f"frozen fields must be among stage/stream/thread_group, got {sorted(unknown)}")
        return dict(value)
    raise TypeError(f"a frozen entry is a dict of stage/stream/thread_group or a TaskSchedule, got {value!r}")


def _tasks_of(refs: Sequence[Any]) -> Dict[str, PipelineTask]:
    """The input's tasks by name (a bare name becomes an unbound PipelineTask)."""
    tasks: Dict[str, PipelineTask] = {}
    for r in refs:
        t = r if isinstance(r, PipelineTask) else PipelineTask(ref_name(r))
        if t.name in tasks:
            raise ValueError(f"task {t.name!r} appears twice in the input")
        tasks[t.name] = t
    return tasks


def _check_deps(names: Sequence[str], intra: Sequence[Tuple[str, str]],
                inter: Sequence[Tuple[str, str, int]]) -> nx.DiGraph:
    """Dependencies name known tasks, inter distances are >= 1; return the intra DAG (an error if cyclic)."""
    known = set(names)
    for t, d in intra:
        if t not in known or d not in known:
            raise ValueError(f"dependency ({t!r} waits {d!r}) names a task that is not in the task set {list(names)}")
    for t, d, n in inter:
        if t not in known or d not in known:
            raise ValueError(f"dependency ({t!r} waits {d!r} of {n} earlier) names an unknown task")
        if n < 1:
            raise ValueError(f"inter-iteration dependency ({t!r}, {d!r}) needs a distance >= 1, got {n}")
    dag = nx.DiGraph()
    dag.add_nodes_from(names)
    dag.add_edges_from((d, t) for t, d in intra)
    if not nx.is_directed_acyclic_graph(dag):
        cycle = [u for u, _ in nx.find_cycle(dag)]
        raise ValueError(f"intra-iteration dependencies form a cycle {' -> '.join(cycle + cycle[:1])}; "
                         "no plan can run it (remove one dependency)")
    return dag


def _task_costs(names: Sequence[str], costs: CostModel) -> Tuple[Dict[str, float], Dict[str, float],
                                                           Dict[str, Optional[str]], set, set]:
    """Each task's host and device seconds, its communicator (or None), the PCIe users and the "nocore" ones."""
    host, dev, comm, pcie, nocore = {}, {}, {}, set(), set()
    for n in names:
        cost = _cost_of(costs, n)
        host[n], dev[n] = float(cost.host_s), float(getattr(cost, "device_s", 0.0) or 0.0)
        if host[n] < 0 or dev[n] < 0:
            raise ValueError(f"task {n!r} has a negative cost (host_s={host[n]}, device_s={dev[n]})")
        tags = tuple(getattr(cost, "resources", ()) or ())
        comms = [t.split(":", 1)[1] for t in tags if t.startswith("comm:")]
        comm[n] = comms[0] if comms else None
        if "pcie" in tags:
            pcie.add(n)
        if NOCORE in tags:
            nocore.add(n)
    return host, dev, comm, pcie, nocore


def make_problem(tasks_or_graph: GraphInput, costs: CostModel, constraints: Constraints,
                 time_unit_s: Optional[float] = None) -> Problem:
    """Normalise the inputs of :func:`autosched.search.autoschedule.auto_schedule`.

    Parameters
    ----------
    tasks_or_graph : networkx.DiGraph, PipelinePlan or tuple
        See :func:`autosched.search.autoschedule.auto_schedule`.
    costs : CostModel
        Must cover every task.
    constraints : Constraints
    time_unit_s : float, optional
        The models' integer clock (``SolverOptions.time_unit_s``; default: about 1e-5 of a serial iteration).

    Returns
    -------
    Problem

    Raises
    ------
    KeyError
        A task has no cost.
    ValueError
        Bad constraints: unknown task named, too many frozen thread groups, an
        intra-iteration cycle, a dependency on an unknown task.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> costs = NS(tasks={"A": NS(host_s=1.0, device_s=0.0, resources=()), "B": NS(host_s=2.0, device_s=0.0, resources=())})
    >>> from swpipe import Constraints
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2))
    >>> p.names, p.intra, p.thread_time("B")
    (('A', 'B'), (('B', 'A'),), 2.0)
    """
    refs, intra, inter, plan = _as_graph_parts(tasks_or_graph)
    tasks = _tasks_of(refs)
    names = tuple(tasks)
    dag = _check_deps(names, intra, inter)

    if constraints.max_depth < 1 or constraints.max_threads < 1:
        raise ValueError(f"max_depth and max_threads must be >= 1, got {constraints.max_depth} and "
                         f"{constraints.max_threads}")
    device = constraints.device
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")

    host, dev, comm, pcie, nocore = _task_costs(names, costs)
    frozen_stage, frozen_stream, frozen_group = _frozen(constraints, names)
    ordered = _ordered(constraints, names, plan, comm)
    choices, init_stream = _stream_choices(constraints, names, plan, frozen_stream)
    unit = float(time_unit_s) if time_unit_s is not None else _auto_unit(list(host.values()) + list(dev.values()))
    caller = plan.caller_group if plan is not None else DEFAULT_GROUP
    return Problem(
        names=names, tasks=tasks, intra=tuple(intra), inter=tuple(inter), costs=costs, device=device,
        host=host, dev=dev, comm=comm, pcie=frozenset(pcie), ordered=frozenset(ordered),
        frozen_stage=frozen_stage, frozen_stream=frozen_stream, frozen_group=frozen_group,
        stream_choices=choices, init_stream=init_stream, max_depth=constraints.max_depth,
        max_threads=constraints.max_threads,
        unit_s=unit, base_plan=plan, nocore=frozenset(nocore), caller_group=caller, source=tasks_or_graph,
        constraints=constraints, time_unit_request=time_unit_s, _dag=dag,
    )


def searched_problem(tasks_or_graph: GraphInput, costs: CostModel, constraints: Constraints,
                     solver: SolverOptions) -> Problem:
    """The problem of one ``auto_schedule`` call: its machine model folded into the costs once.

    When ``costs`` carries a machine calibration, it is folded in (:func:`autosched.model.machine.searched_costs`)
    and the problem keeps it for the per-hand-off and per-period terms, so every simulation of the call (search,
    report, verification) is of one model; ``notes`` says so.

    Examples
    --------
    >>> from swpipe import Constraints, CostModel, SolverOptions, TaskCost
    >>> from swpipe_core.measure.calibrate import MachineCalibration   # the machine, measured: advanced, not public
    >>> costs = CostModel({"A": TaskCost(0.002)}, machine_calibration=MachineCalibration(cores_free=1.0, cpu_count=2))
    >>> p = searched_problem((["A"], []), costs, Constraints(), SolverOptions())
    >>> p.calibration is costs.machine_calibration, p.costs.cores, p.notes[0][:44]
    (True, 1, 'searched with the machine calibration folded')
    """
    calibration = costs.machine_calibration
    notes = []
    if calibration is not None:
        from autosched.model.machine import searched_costs

        costs = searched_costs(costs, device=constraints.device)
        notes.append("searched with the machine calibration folded in: engine costs per task, per hand-off and per "
                     "period" + costs.notes.rpartition("calibrated: engine costs per task")[2])
    problem = make_problem(tasks_or_graph, costs, constraints, time_unit_s=solver.time_unit_s)
    problem.calibration, problem.notes = calibration, notes
    return problem


def _frozen(constraints: Constraints,
            names: Sequence[str]) -> Tuple[Dict[str, int], Dict[str, StreamSpec], Dict[str, str]]:
    """The constraints' frozen stages, streams and thread groups by task name, checked against the caps."""
    frozen = {ref_name(k): _frozen_fields(v) for k, v in (constraints.frozen or {}).items()}
    unknown = sorted(set(frozen) - set(names))
    if unknown:
        raise ValueError(f"frozen names unknown task(s) {unknown}; tasks: {list(names)}")
    frozen_stage = {n: int(f["stage"]) for n, f in frozen.items() if "stage" in f}
    frozen_stream = {n: f["stream"] for n, f in frozen.items() if "stream" in f}
    frozen_group = {n: str(f["thread_group"]) for n, f in frozen.items() if "thread_group" in f}
    for n, s in frozen_stage.items():
        if not 0 <= s < constraints.max_depth:
            raise ValueError(f"{n!r} is frozen to stage {s}, outside 0..max_depth-1 = 0..{constraints.max_depth - 1}")
    if len(set(frozen_group.values())) > constraints.max_threads:
        raise ValueError(f"frozen thread groups {sorted(set(frozen_group.values()))} exceed max_threads={constraints.max_threads}")
    return frozen_stage, frozen_stream, frozen_group


def _ordered(constraints: Constraints, names: Sequence[str], plan: Optional[PipelinePlan],
             comm: Mapping[str, Optional[str]]) -> set:
    """The globally ordered tasks: as constrained, else the input plan's flags, else the tasks with a communicator."""
    if constraints.globally_ordered is not None:
        ordered = {ref_name(r) for r in constraints.globally_ordered}
        if ordered - set(names):
            raise ValueError(f"globally_ordered names unknown task(s) {sorted(ordered - set(names))}")
        return ordered
    if plan is not None:
        return {ref_name(k) for k, v in plan.schedule.items() if v.globally_ordered}
    return {n for n in names if comm[n] is not None}


def _stream_choices(constraints: Constraints, names: Sequence[str], plan: Optional[PipelinePlan],
                    frozen_stream: Mapping[str, StreamSpec]) -> Tuple[Dict[str, Tuple[StreamSpec, ...]],
                                                                      Dict[str, StreamSpec]]:
    """Each task's stream choices and its initial stream (the input plan's or frozen one, if it is a choice)."""
    init_stream = {n: (plan.sched(n).stream if plan is not None else None) for n in names}
    init_stream.update(frozen_stream)
    if constraints.streams is None:
        allowed: List[StreamSpec] = []
        for s in init_stream.values():
            if s not in allowed:
                allowed.append(s)
    else:
        allowed = list(constraints.streams)
        if not allowed:
            raise ValueError("constraints.streams is empty; list at least one stream (None = default stream)")
    choices = {}
    for n in names:
        if n in frozen_stream:
            choices[n] = (frozen_stream[n],)
        elif constraints.device != "cuda":
            # On CPU a stream is only a name: keep the given one, searching it gains nothing.
            choices[n] = (init_stream[n] if init_stream[n] in allowed else allowed[0],)
        else:
            choices[n] = tuple(allowed)
    for n in names:
        if init_stream[n] not in choices[n]:
            init_stream[n] = choices[n][0]
    return choices, init_stream
