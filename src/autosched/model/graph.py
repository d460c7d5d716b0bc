"""Dependency graphs of a pipeline: the task graph, the period-local graph, the unrolled graph; JSON files.

The *task graph* is what the user declares before any scheduling: tasks and
their data dependencies. It is a :class:`networkx.DiGraph` whose nodes are
task names and whose edges run ``dep -> task`` with a ``distance``: 0 for an
intra-iteration dependency (``task(i)`` waits ``dep(i)``) and ``N`` for an
inter-iteration one (``task(i)`` waits ``dep(i - N)``). When one pair is
declared more than once, the edge keeps the smallest distance (it implies the
others: a task's iterations run in order on one thread) and lists all of them
in ``distances`` so a plan round-trips.

A plan's graph (:func:`plan_to_graph`) is the same graph with the schedule on
the nodes (``stage``, ``stream``, ``thread_group``, ``globally_ordered``).
Plans are saved as JSON in their dict form (:mod:`swpipe_core.planfile`:
``"format": "swpipe-plan"``, ``"version": 2``; files of version 1 still load),
task graphs as ``"format": "swpipe-task-graph"``, ``"version": 1``; task
functions are not stored but bound back by name on load (``fns``).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import networkx as nx

from swpipe_core.order import period_local_graph
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule, ref_name, stream_name
from swpipe_core.planfile import (PlanFileError, check_fns, check_header, check_keys, deps_from_dict, plan_from_dict,
                                  plan_to_dict)

__all__ = [
    "task_graph", "task_graph_deps",
    "plan_to_graph",
    "graph_to_plan",
    "period_local_graph",
    "unroll",
    "save_plan",
    "load_plan",
    "save_task_graph",
    "load_task_graph",
    "GraphFileError",
]

_GRAPH_FORMAT = "swpipe-task-graph"
_GRAPH_VERSION = 1
PathLike = Union[str, os.PathLike]


class GraphFileError(PlanFileError):
    """A plan or task-graph JSON file is malformed; names the file, the field and the fix.

    Examples
    --------
    >>> print(GraphFileError("p.json", "tasks[0]", "missing 'name'", "give every task a name"))
    p.json: tasks[0]: missing 'name'. Fix: give every task a name
    """

    @property
    def path(self) -> str:
        """The file."""
        return self.source


def _add_dep(graph: nx.DiGraph, task: str, dep: str, distance: int) -> None:
    for end in (task, dep):
        if end not in graph:
            raise ValueError(f"dependency ({task}, {dep}) names {end!r}, which is not a task; tasks: {sorted(graph)}")
    if graph.has_edge(dep, task):
        data = graph.edges[dep, task]
        data["distances"].append(distance)
        data["distance"] = min(data["distances"])
    else:
        graph.add_edge(dep, task, distance=distance, distances=[distance])
    data = graph.edges[dep, task]
    data["kind"] = "intra" if data["distance"] == 0 else "inter"


def task_graph(tasks: Iterable[Any], intra_deps: Iterable[Sequence[Any]] = (),
               inter_deps: Iterable[Sequence[Any]] = ()) -> nx.DiGraph:
    """The task graph: nodes are task names, edges ``dep -> task`` carry ``distance``.

    Parameters
    ----------
    tasks : iterable of str or PipelineTask
        A ``PipelineTask`` is kept as the node attribute ``task`` (its function travels along).
    intra_deps : iterable of (task, depends_on)
        Edges of distance 0.
    inter_deps : iterable of (task, depends_on) or (task, depends_on, N)
        Edges of distance ``N`` (default 1).

    Returns
    -------
    networkx.DiGraph

    Raises
    ------
    ValueError
        For a dependency on an unknown task, a distance < 1 or a malformed entry.

    Examples
    --------
    >>> g = task_graph(["Fwd", "Bwd", "Opt"], [("Bwd", "Fwd"), ("Opt", "Bwd")], [("Fwd", "Opt")])
    >>> sorted(g.edges(data="distance"))
    [('Bwd', 'Opt', 0), ('Fwd', 'Bwd', 0), ('Opt', 'Fwd', 1)]
    """
    graph = nx.DiGraph()
    for t in tasks:
        name = ref_name(t)
        if name in graph:
            raise ValueError(f"task {name!r} appears twice; task names must be unique")
        graph.add_node(name, task=t if isinstance(t, PipelineTask) else PipelineTask(name))
    for dep in intra_deps:
        if len(dep) != 2:
            raise ValueError(f"intra dependency {dep!r} is not a (task, depends_on) pair")
        _add_dep(graph, ref_name(dep[0]), ref_name(dep[1]), 0)
    for dep in inter_deps:
        if len(dep) not in (2, 3):
            raise ValueError(f"inter dependency {dep!r} is not (task, depends_on) or (task, depends_on, N)")
        n = dep[2] if len(dep) == 3 else 1
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"inter dependency {dep!r} has distance {n!r}; use an integer N >= 1")
        _add_dep(graph, ref_name(dep[0]), ref_name(dep[1]), n)
    return graph


def task_graph_deps(graph: nx.DiGraph) -> Tuple[List[Tuple[str, str]], List[Tuple[str, str, int]]]:
    """Decode a task graph's edges into ``(task, dep)`` intra and ``(task, dep, N)`` inter dependencies.

    The one edge decoder: an edge ``dep -> task`` holds every declared distance in
    ``distances`` (else its ``distance``, 0 when absent).

    Examples
    --------
    >>> g = task_graph(["A", "B"], intra_deps=[("B", "A")], inter_deps=[("A", "B", 2)])
    >>> task_graph_deps(g)
    ([('B', 'A')], [('A', 'B', 2)])
    """
    intra, inter = [], []
    for dep, task, data in graph.edges(data=True):
        for n in data.get("distances", [data.get("distance", 0)]):
            if n == 0:
                intra.append((task, dep))
            else:
                inter.append((task, dep, n))
    return intra, inter


def plan_to_graph(plan: PipelinePlan) -> nx.DiGraph:
    """The plan's task graph with the schedule as node attributes and plan fields as graph attributes.

    Parameters
    ----------
    plan : PipelinePlan

    Returns
    -------
    networkx.DiGraph
        Nodes carry ``stage``, ``stream`` (readable name), ``thread_group``,
        ``globally_ordered`` and ``task``; ``graph.graph`` holds ``pipeline_depth``,
        ``enqueue_order`` and ``enqueue_policy``.

    Examples
    --------
    >>> plan = PipelinePlan({"H2D": TaskSchedule(0, "memcpy"), "Fwd": TaskSchedule(1)}, [("Fwd", "H2D")])
    >>> g = plan_to_graph(plan)
    >>> g.nodes["H2D"]["stream"], g.graph["pipeline_depth"], list(g.edges)
    ('memcpy', 2, [('H2D', 'Fwd')])
    """
    _no_same_period(plan, "a task graph")
    graph = task_graph(plan.tasks, plan.intra_edges(), plan.inter_edges())
    for key, sched in plan.schedule.items():
        graph.nodes[ref_name(key)].update(stage=sched.stage, stream=stream_name(sched.stream),
                                          stream_obj=sched.stream, thread_group=sched.thread_group,
                                          globally_ordered=sched.globally_ordered)
    graph.graph.update(pipeline_depth=plan.pipeline_depth, enqueue_policy=plan.enqueue_policy,
                       enqueue_order=None if plan.enqueue_order is None else [ref_name(r) for r in plan.enqueue_order])
    return graph


def graph_to_plan(graph: nx.DiGraph, schedule: Optional[Mapping[Any, TaskSchedule]] = None, *,
                  enqueue_order: Optional[Sequence[str]] = None, enqueue_policy: Optional[str] = None,
                  fns: Optional[Mapping[str, Callable]] = None) -> PipelinePlan:
    """Build a :class:`PipelinePlan` from a task graph and a schedule.

    Parameters
    ----------
    graph : networkx.DiGraph
        A task graph (:func:`task_graph`) or a plan graph (:func:`plan_to_graph`).
    schedule : dict, optional
        ``{task: TaskSchedule}``; tasks missing from it take the node attributes of a
        plan graph, else ``TaskSchedule()`` (stage 0, default stream and thread).
    enqueue_order, enqueue_policy : optional
        Default to the graph's attributes (a plan graph), else ready-first.
    fns : dict, optional
        ``{task_name: fn}`` bound into the tasks.

    Returns
    -------
    PipelinePlan
        Not validated (call :func:`swpipe_core.validate.validate`).

    Raises
    ------
    ValueError
        If ``schedule`` or ``fns`` names a task that is not in the graph.

    Examples
    --------
    >>> g = task_graph(["A", "B"], [("B", "A")])
    >>> plan = graph_to_plan(g, {"B": TaskSchedule(stage=1)})
    >>> plan.pipeline_depth, plan.intra_edges()
    (2, [('B', 'A')])
    >>> graph_to_plan(plan_to_graph(plan)).schedule["B"]
    TaskSchedule(stage=1, stream=None, thread_group='default', globally_ordered=False)
    """
    schedule = {ref_name(k): v for k, v in (schedule or {}).items()}
    unknown = sorted(set(schedule) - set(graph.nodes))
    if unknown:
        raise ValueError(f"schedule names task(s) {unknown} that are not in the graph; tasks: {sorted(graph.nodes)}")
    sched: Dict[PipelineTask, TaskSchedule] = {}
    for name, data in graph.nodes(data=True):
        task = data.get("task") if isinstance(data.get("task"), PipelineTask) else PipelineTask(name)
        if name in schedule:
            s = schedule[name]
        elif "stage" in data:
            stream = data.get("stream_obj", data.get("stream"))
            s = TaskSchedule(stage=data["stage"], stream=None if stream == "default" else stream,
                             thread_group=data.get("thread_group", "default"),
                             globally_ordered=bool(data.get("globally_ordered", False)))
        else:
            s = TaskSchedule()
        sched[task] = s
    intra, inter = task_graph_deps(graph)
    if enqueue_order is None:
        enqueue_order = graph.graph.get("enqueue_order")
    plan = PipelinePlan(sched, intra, inter, enqueue_order=None if enqueue_order is None else list(enqueue_order),
                        enqueue_policy=enqueue_policy or graph.graph.get("enqueue_policy", "ready_first"))
    if fns:
        check_fns(fns, plan.task_names, "")
        plan = plan.bind(dict(fns))
    return plan


def unroll(graph: Any, k: int) -> nx.DiGraph:
    """The dependency DAG over ``k`` iterations: nodes ``(task, i)``, edges ``(dep, i - N) -> (task, i)``.

    Parameters
    ----------
    graph : networkx.DiGraph or PipelinePlan
        A task graph (a plan is converted with :func:`plan_to_graph`).
    k : int
        Number of iterations, ``>= 1``.

    Returns
    -------
    networkx.DiGraph
        Nodes carry ``task`` (name) and ``iteration``; edges ``distance``.

    Raises
    ------
    ValueError
        For ``k < 1``.

    Examples
    --------
    >>> g = task_graph(["Fwd", "Opt"], [("Opt", "Fwd")], [("Fwd", "Opt")])
    >>> sorted(unroll(g, 2).edges)
    [(('Fwd', 0), ('Opt', 0)), (('Fwd', 1), ('Opt', 1)), (('Opt', 0), ('Fwd', 1))]
    """
    if isinstance(graph, PipelinePlan):
        graph = plan_to_graph(graph)
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r}: unroll needs at least one iteration")
    out = nx.DiGraph(iterations=k)
    for i in range(k):
        for name in graph.nodes:
            out.add_node((name, i), task=name, iteration=i)
    for dep, task, n in graph.edges(data="distance"):
        for i in range(n, k):
            out.add_edge((dep, i - n), (task, i), distance=n)
    return out


def _no_same_period(plan: PipelinePlan, what: str) -> None:
    """Refuse a plan with ``same_period_deps`` where they cannot be kept (their distance follows the stages)."""
    if plan.same_period_deps:
        raise ValueError(f"the plan has same_period_deps {[(ref_name(t), ref_name(d)) for t, d in plan.same_period_deps]}"
                         f", which {what} cannot hold (their distance follows the stages); declare each as "
                         "(task, dep, N) in inter_iter_deps at the distance the plan's stages give it")


# -- JSON files ---------------------------------------------------------------------------------------------------


def save_plan(plan: PipelinePlan, path: PathLike) -> None:
    """Write a plan as JSON (:func:`~swpipe_core.planfile.plan_to_dict`: format ``swpipe-plan``, version 2);
    functions are not stored.

    Stream objects are stored by their readable name (:func:`~swpipe_core.plan.stream_name`),
    which is how the engine names streams anyway.

    Parameters
    ----------
    plan : PipelinePlan
    path : str or path-like

    Examples
    --------
    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "plan.json")
    >>> plan = PipelinePlan({"H2D": TaskSchedule(0, "memcpy"), "Fwd": TaskSchedule(1)}, [("Fwd", "H2D")])
    >>> save_plan(plan, p)
    >>> load_plan(p, fns={"Fwd": print}).task("Fwd").fn is print
    True
    """
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(plan_to_dict(plan), fh, indent=2)
        fh.write("\n")


def _read_json(path: PathLike) -> Tuple[str, Any]:
    path = os.fspath(path)
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        return path, json.loads(text)
    except json.JSONDecodeError as exc:
        raise GraphFileError(path, "", f"not valid JSON ({exc})", "fix the syntax", line=exc.lineno) from None


@contextmanager
def _file_errors(path: str) -> Iterator[None]:
    """What is wrong with a file's dict form, raised as a :class:`GraphFileError` of the file."""
    try:
        yield
    except PlanFileError as exc:
        if isinstance(exc, GraphFileError):
            raise
        raise GraphFileError(path, exc.field, exc.what, exc.fix, task=exc.task, value=exc.value) from None


def load_plan(path: PathLike, fns: Optional[Mapping[str, Callable]] = None) -> PipelinePlan:
    """Read a plan saved by :func:`save_plan` (version 2, or 1 as written before), bind task functions by name and
    validate it (:func:`~swpipe_core.planfile.plan_from_dict`).

    Parameters
    ----------
    path : str or path-like
    fns : dict, optional
        ``{task_name: fn}``; tasks without a function stay unbound (analysis only).

    Returns
    -------
    PipelinePlan

    Raises
    ------
    GraphFileError
        For invalid JSON, a wrong format or version, an unknown or missing field, a bad dependency.
    swpipe_core.validate.PlanError
        If the plan in the file breaks a rule.
    ValueError
        If ``fns`` names a task that is not in the plan.

    Examples
    --------
    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "plan.json")
    >>> _ = open(p, "w").write('{"format": "swpipe-plan", "version": 1, "tasks": [{"stage": 0}]}')
    >>> load_plan(p)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    autosched.model.graph.GraphFileError: ...plan.json: tasks[0]: missing field(s) ['name']. Fix: add ['name'] to tasks[0]
    """
    path, doc = _read_json(path)
    with _file_errors(path):
        return plan_from_dict(doc, fns, source=path)


def save_task_graph(graph: nx.DiGraph, path: PathLike) -> None:
    """Write a task graph as JSON (format ``swpipe-task-graph``, version 1): tasks and dependencies.

    Parameters
    ----------
    graph : networkx.DiGraph
        A task graph (node attributes other than the name are not stored).
    path : str or path-like

    Examples
    --------
    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "g.json")
    >>> save_task_graph(task_graph(["A", "B"], [("B", "A")], [("A", "B", 2)]), p)
    >>> sorted(load_task_graph(p).edges(data="distance"))
    [('A', 'B', 0), ('B', 'A', 2)]
    """
    intra, inter = task_graph_deps(graph)
    doc = {"format": _GRAPH_FORMAT, "version": _GRAPH_VERSION, "tasks": list(graph.nodes),
           "intra_iter_deps": [list(d) for d in intra], "inter_iter_deps": [list(d) for d in inter]}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")


def load_task_graph(path: PathLike, fns: Optional[Mapping[str, Callable]] = None) -> nx.DiGraph:
    """Read a task graph saved by :func:`save_task_graph`.

    Parameters
    ----------
    path : str or path-like
    fns : dict, optional
        ``{task_name: fn}`` bound into the nodes' ``task`` attribute.

    Returns
    -------
    networkx.DiGraph

    Raises
    ------
    GraphFileError
        For invalid JSON, a wrong format or version, an unknown field, a bad dependency.

    Examples
    --------
    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "g.json")
    >>> doc = '{"format": "swpipe-task-graph", "version": 1, "tasks": ["A"], "intra_iter_deps": [["A", "Z"]]}'
    >>> _ = open(p, "w").write(doc)
    >>> load_task_graph(p)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    autosched.model.graph.GraphFileError: ...g.json: intra_iter_deps[0]: names unknown task 'Z'. Fix: tasks are ['A']
    """
    path, doc = _read_json(path)
    with _file_errors(path):
        check_header(path, doc, _GRAPH_FORMAT, (_GRAPH_VERSION,))
        check_keys(path, "top level", doc, {"format", "version", "tasks", "intra_iter_deps", "inter_iter_deps"},
                   {"tasks"})
        names = doc["tasks"]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise GraphFileError(path, "tasks", f"{names!r} is not a non-empty list of task names",
                                 'write "tasks": ["H2D", "Forward", ...]', value=names)
        if len(set(names)) != len(names):
            raise GraphFileError(path, "tasks", "task names repeat", "give every task a unique name",
                                 value=sorted({n for n in names if names.count(n) > 1}))
        intra, inter = deps_from_dict(path, doc, names)
    if fns:
        check_fns(fns, names, path)
    return task_graph([PipelineTask(n, (fns or {}).get(n)) for n in names], intra, inter)
