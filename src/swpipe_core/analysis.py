"""Schedule analysis of a plan: the period table, the stage analysis and ``__repr__``.

Everything here is a pure function of a :class:`~swpipe_core.plan.PipelinePlan`
(no threads, no torch): it prints the tables behind ``SWPipeline.print_schedule``,
``print_stage_analysis`` and ``repr(pipe)``, and says, exactly,
how many stages the plan's enqueue order needs.

Definitions used by :func:`format_stage_analysis` and :func:`min_depth`
-----------------------------------------------------------------------
Let ``pi`` be the per-period enqueue order (a list of all tasks) and ``s`` a
stage assignment. A dependency ``v(i)`` waits ``u(i - d)`` (``d = 0`` intra,
``d = N`` inter). ``u(i - d)`` runs in period ``i - d + s(u)`` and ``v(i)`` in
period ``i + s(v)``; the wait cannot deadlock iff ``u`` runs in an earlier
period, or in the same period and ahead of ``v`` in ``pi``. So ``pi`` is
deadlock-free under ``s`` iff, for every dependency,

    ``s(v) - s(u) >= [v enqueued before u] - d``.

* **minimum depth** for ``pi``: ``1 + max s(x)`` over the smallest
  non-negative ``s`` satisfying these difference constraints, i.e. ``1 +`` the
  longest path from a virtual source in the constraint graph (networkx
  Bellman-Ford on negated weights). It is exact. The plan's own stages satisfy
  the constraints for its own enqueue order (that is what ``validate`` checks),
  so ``min_depth <= depth``.
* **LDS**: the longest subsequence ``x1, ..., xk`` of ``pi`` in which each
  ``x_{j+1}`` is an intra-iteration ancestor of ``x_j`` (``x_j`` transitively
  waits ``x_{j+1}`` in the same iteration). On the path ``x_{j+1} ~> x_j`` some
  dependency runs against ``pi``, which forces a stage step, and intra stages
  never decrease along a path (Corollary 1): so ``s(x1) > s(x2) > ... > s(xk)``
  -- the printed example is a strictly decreasing stage sequence -- and every
  deadlock-free ``s`` has at least ``k`` distinct stages. These pairs form a
  partial order; by Mirsky's theorem (the dual of Dilworth's) its longest chain
  is the fewest antichains covering it. Hence ``LDS <= min_depth <= depth``.
  LDS is **only a lower bound**: it ignores inter-iteration dependencies and
  the interplay of different chains, which ``min_depth`` accounts for.

The plain LDS of a stage sequence is *not* a lower bound: two independent
tasks at stages 1 and 0, enqueued in that order, give a decreasing pair yet
need only one stage. That is why the LDS here is taken along dependency chains.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import networkx as nx

from swpipe_core.order import enqueue_order, stage_descending_order
from swpipe_core.walk import PeriodWalk
from swpipe_core.plan import PipelinePlan, TaskRef, ref_name
from swpipe_core.validate import validate

__all__ = [
    "format_schedule",
    "format_stage_analysis",
    "format_plan_repr",
    "lds",
    "min_depth",
    "min_stages",
    "removable_boundaries",
    "LEGEND",
    "MORE_STAGES_MARK",
]

MORE_STAGES_MARK = "+"  # the verdict of a plan deeper than its order needs: a choice (overlap for memory), no error

# What the two tables' terms and marks mean, in words (``swpipe show`` prints it under them).
LEGEND = (
    ("P0 P1 ...", "periods: in each one every task runs once, on iteration i<k> (k = period - stage); -- before "
                  "its first iteration"),
    ("Thread, Stream", "the thread group and the CUDA stream a task runs on (on a CPU a stream is only a name)"),
    ("Type", "global: a globally ordered task (its collectives take turns in the enqueue order, the same on every "
             "rank); stream: any other task"),
    ("LDS", "the longest chain of dependent tasks that the enqueue order lists after what they wait for: every "
            "plan with this order needs at least that many stages"),
    ("Dilworth-optimal", "LDS == depth: no plan with this enqueue order has fewer stages"),
    ("minimum depth", "the fewest stages with which this enqueue order cannot deadlock"),
    ("✓", "the depth is the least this enqueue order allows"),
    (MORE_STAGES_MARK, "more stages than the order needs: each keeps one more iteration in flight, which lets work "
                       "of different iterations overlap (TorchRec's pipelines have them for that) and costs memory "
                       "(a batch and its context per stage); the results are the same"),
)

_SKIP = " [skip]"


def _shortcut_names(plan: PipelinePlan, shortcuts: Iterable[TaskRef]) -> set:
    names = {ref_name(s) for s in shortcuts}
    unknown = sorted(names - set(plan.task_names))
    if unknown:
        raise ValueError(f"shortcut task(s) {unknown} are not in the plan; tasks: {plan.task_names}")
    return names


def format_schedule(plan: PipelinePlan, num_iterations: int = 3, shortcuts: Iterable[TaskRef] = ()) -> str:
    """The period x task table that ``SWPipeline.print_schedule`` prints.

    One row per task in stage-descending enqueue order (the row order of
    every TorchRec schedule table in ``tests/test_analysis.py``), with its thread group and readable stream name, then one
    column per period ``P0 .. P{n-1}``: ``i{k}`` when the task works on
    iteration ``k = period - stage``, `` --`` before its first iteration, and
    `` .`` for a shortcut task (whose name gets `` [skip]``) once it would run.
    Column widths are ``max(17, task)``, ``max(7, thread)``, ``max(12, stream)``
    and ``max(5, cell)``; trailing spaces are stripped.

    Parameters
    ----------
    plan : PipelinePlan
    num_iterations : int
        Number of periods (columns) to show, ``>= 1``.
    shortcuts : iterable of TaskRef
        Tasks currently shortcut.

    Returns
    -------
    str
        The table, lines joined by ``"\\n"``, no trailing newline.

    Raises
    ------
    ValueError
        If ``num_iterations < 1`` or a shortcut names an unknown task.

    Examples
    --------
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"H2D": TaskSchedule(0, "memcpy"), "Forward": TaskSchedule(1)},
    ...                     intra_iter_deps=[("Forward", "H2D")])
    >>> print(format_schedule(plan, 3))
       #  Task               Thread   Stream        | P0    P1    P2
      --  -----------------  -------  ------------  + ----- ----- -----
       0  Forward            default  default       |  --   i0    i1
       1  H2D                default  memcpy        | i0    i1    i2
    >>> print(format_schedule(plan, 2, shortcuts=["H2D"]).splitlines()[-1])
       1  H2D [skip]         default  memcpy        |  .     .
    """
    if not isinstance(num_iterations, int) or num_iterations < 1:
        raise ValueError(f"num_iterations must be an integer >= 1, got {num_iterations!r}")
    skip = _shortcut_names(plan, shortcuts)
    walk = PeriodWalk(plan)
    # every period's iterations, data without end: iterations 0 .. period exist
    runs = [{s.task: s.iteration for s in walk.steps(period, 0, period + 1)} for period in range(num_iterations)]
    rows = []
    for name in stage_descending_order(plan):
        sched = plan.sched(name)
        cells = []
        for present in runs:
            k = present.get(name)
            if k is None:
                cells.append(" --")
            elif name in skip:
                cells.append(" .")
            else:
                cells.append(f"i{k}")
        shown = name + _SKIP if name in skip else name
        rows.append((shown, sched.thread_group, plan.stream_of(name), cells))
    labels = [f"P{p}" for p in range(num_iterations)]
    w_task = max([17] + [len(r[0]) for r in rows])
    w_thread = max([7] + [len(r[1]) for r in rows])
    w_stream = max([12] + [len(r[2]) for r in rows])
    w_cell = max([5] + [len(c) for c in labels] + [len(c) for r in rows for c in r[3]])

    def line(idx: str, task: str, thread: str, stream: str, sep: str, cells: Sequence[str]) -> str:
        text = f"{idx:>4}  {task:<{w_task}}  {thread:<{w_thread}}  {stream:<{w_stream}}  {sep} "
        return (text + " ".join(c.ljust(w_cell) for c in cells)).rstrip()

    out = [
        line("#", "Task", "Thread", "Stream", "|", labels),
        line("--", "-" * w_task, "-" * w_thread, "-" * w_stream, "+", ["-" * w_cell] * num_iterations),
    ]
    out += [line(str(i), *r[:3], "|", r[3]) for i, r in enumerate(rows)]
    return "\n".join(out)


def lds(sequence: Sequence[Any], related: Optional[Callable[[int, int], bool]] = None) -> Tuple[int, tuple]:
    """Longest strictly decreasing subsequence, with one example.

    Parameters
    ----------
    sequence : sequence of comparable values
    related : callable(i, j) -> bool, optional
        Restricts which elements may follow each other: ``sequence[j]`` may
        follow ``sequence[i]`` (``i < j``) only if ``related(i, j)``. Pass a
        transitive relation (e.g. reachability) so that the result is a chain.
        Without it the classic ``O(n log n)`` patience algorithm is used.

    Returns
    -------
    (int, tuple)
        The length and one longest subsequence (values). ``(0, ())`` for an
        empty sequence.

    Examples
    --------
    >>> lds([1, 1, 1, 0])
    (2, (1, 0))
    >>> lds([3, 1, 2, 0, 1])
    (3, (3, 2, 1))
    >>> lds([1, 0], related=lambda i, j: False)
    (1, (1,))
    """
    n = len(sequence)
    if n == 0:
        return 0, ()
    prev: List[Optional[int]] = [None] * n
    if related is None:
        # Patience sorting on negated values: a strictly decreasing run of x is
        # a strictly increasing run of -x.
        tails: List[Any] = []
        tail_idx: List[int] = []
        for j, x in enumerate(sequence):
            key = -x
            pos = bisect_left(tails, key)
            prev[j] = tail_idx[pos - 1] if pos > 0 else None
            if pos == len(tails):
                tails.append(key)
                tail_idx.append(j)
            else:
                tails[pos] = key
                tail_idx[pos] = j
        end: Optional[int] = tail_idx[-1]
        length = len(tails)
    else:
        best = [1] * n
        for j in range(n):
            for i in range(j):
                if sequence[i] > sequence[j] and best[i] + 1 > best[j] and related(i, j):
                    best[j], prev[j] = best[i] + 1, i
        end = max(range(n), key=lambda j: (best[j], -j))
        length = best[end]
    example = []
    while end is not None:
        example.append(sequence[end])
        end = prev[end]
    return length, tuple(reversed(example))


def _constraint_graph(plan: PipelinePlan, order: Sequence[TaskRef]) -> nx.DiGraph:
    pos = {ref_name(t): i for i, t in enumerate(order)}
    missing = [n for n in plan.task_names if n not in pos]
    if missing or len(pos) != len(plan.task_names):
        raise ValueError(f"order must list every task of the plan once; missing {missing}, got {list(pos)}")
    graph = nx.DiGraph()
    graph.add_nodes_from(plan.task_names)
    # a same-period dependency holds under any stages (its distance follows them): it orders the period only
    deps = [(t, d, 0) for t, d in plan.intra_edges()] + plan.declared_inter_edges()
    for t, d, dist in deps:
        weight = int(pos[t] < pos[d]) - dist
        if not graph.has_edge(d, t) or graph[d][t]["weight"] < weight:
            graph.add_edge(d, t, weight=weight)
    return graph


def min_stages(plan: PipelinePlan, order: Optional[Sequence[TaskRef]] = None) -> Dict[str, int]:
    """The smallest stage assignment under which ``order`` is deadlock-free.

    Solves ``s(v) - s(u) >= [v enqueued before u] - d`` for every dependency
    ``v`` waits ``u`` of distance ``d`` (0 intra), with ``s >= 0``, as a longest
    path from a virtual source (networkx Bellman-Ford on negated weights).
    Every feasible assignment is pointwise ``>=`` this one.

    Parameters
    ----------
    plan : PipelinePlan
    order : sequence of TaskRef, optional
        The per-period enqueue order; defaults to the plan's
        (:func:`swpipe_core.order.enqueue_order`).

    Returns
    -------
    dict
        ``{task_name: stage}``.

    Raises
    ------
    ValueError
        If ``order`` does not list every task once, or no stage assignment
        makes it deadlock-free (a dependency cycle that gains stages; the
        cycle is named).

    Examples
    --------
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, intra_iter_deps=[("B", "A")])
    >>> min_stages(plan, ["B", "A"]), min_stages(plan, ["A", "B"])
    ({'A': 0, 'B': 1}, {'A': 0, 'B': 0})
    """
    order = enqueue_order(plan) if order is None else list(order)
    graph = _constraint_graph(plan, order)
    source = object()
    graph.add_edges_from(((source, n) for n in plan.task_names), weight=0)
    try:
        dist = nx.single_source_bellman_ford_path_length(graph, source, weight=lambda u, v, e: -e["weight"])
    except nx.NetworkXUnbounded:
        cycle = nx.find_negative_cycle(graph, source, weight=lambda u, v, e: -e["weight"])
        raise ValueError(
            f"no stage assignment makes enqueue order {[ref_name(t) for t in order]} deadlock-free: the dependency "
            f"cycle {' -> '.join(map(str, cycle))} needs ever more stages; enqueue the waited-on tasks first"
        ) from None
    return {n: -dist[n] for n in plan.task_names}


def min_depth(plan: PipelinePlan, order: Optional[Sequence[TaskRef]] = None) -> int:
    """The exact minimum pipeline depth under which ``order`` is deadlock-free.

    ``1 + max(min_stages(plan, order).values())``; see the module docstring
    for why ``LDS <= min_depth <= depth`` for the plan's own order.

    Parameters
    ----------
    plan : PipelinePlan
    order : sequence of TaskRef, optional
        Defaults to the plan's enqueue order.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        As :func:`min_stages`.

    Examples
    --------
    Stage-descending enqueues Forward before CopyBatch, which it waits on, so
    two stages are needed; a serial order needs one:

    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"CopyBatch": TaskSchedule(0), "Forward": TaskSchedule(1)},
    ...                     intra_iter_deps=[("Forward", "CopyBatch")], enqueue_policy="stage_descending")
    >>> min_depth(plan), min_depth(plan, ["CopyBatch", "Forward"])
    (2, 1)
    """
    return 1 + max(min_stages(plan, order).values())


def removable_boundaries(plan: PipelinePlan, order: Optional[Sequence[TaskRef]] = None) -> List[int]:
    """Stage boundaries ``k | k+1`` whose removal keeps ``order`` deadlock-free.

    Removing boundary ``k`` merges stage ``k + 1`` into stage ``k`` (every
    stage above ``k`` moves down by one).

    Parameters
    ----------
    plan : PipelinePlan
    order : sequence of TaskRef, optional
        Defaults to the plan's enqueue order.

    Returns
    -------
    list of int
        Each ``k`` such that the merged assignment satisfies every constraint.

    Examples
    --------
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1), "C": TaskSchedule(2)},
    ...                     intra_iter_deps=[("B", "A"), ("C", "B")])
    >>> removable_boundaries(plan, ["B", "A", "C"])
    [1]
    """
    order = enqueue_order(plan) if order is None else list(order)
    graph = _constraint_graph(plan, order)
    stage = {n: plan.stage(n) for n in plan.task_names}
    out = []
    for k in range(plan.inferred_depth() - 1):
        merged = {n: s if s <= k else s - 1 for n, s in stage.items()}
        if all(merged[v] - merged[u] >= e["weight"] for u, v, e in graph.edges(data=True)):
            out.append(k)
    return out


def _topological_rows(plan: PipelinePlan) -> List[str]:
    index = {n: i for i, n in enumerate(plan.task_names)}
    graph = nx.DiGraph()
    graph.add_nodes_from(plan.task_names)
    graph.add_edges_from((d, t) for t, d in plan.intra_edges())
    return list(nx.lexicographical_topological_sort(graph, key=index.__getitem__))


def _chain_lds(plan: PipelinePlan, order: Sequence[str]) -> Tuple[int, tuple]:
    graph = nx.DiGraph()
    graph.add_nodes_from(plan.task_names)
    graph.add_edges_from((d, t) for t, d in plan.intra_edges())
    ancestors = {n: nx.ancestors(graph, n) for n in graph}
    stages = [plan.stage(n) for n in order]
    return lds(stages, related=lambda i, j: order[j] in ancestors[order[i]])


def format_stage_analysis(plan: PipelinePlan) -> str:
    """What ``SWPipeline.print_stage_analysis`` prints: topological order, stages, LDS, depth, optimality.

    Rows list the tasks in the intra-iteration topological order (ties by
    definition order): ``Pos`` is the position in it, ``Idx`` the task's index
    in ``plan.schedule``, ``Type`` is ``stream`` (``global`` for a
    ``globally_ordered`` task). Then the enqueue order the analysis is about,
    the LDS with an example (stages along a dependency chain that the order
    runs against), the depth, and the verdict:

    * ``✓  LDS == depth (Dilworth-optimal)`` when the lower bound is met;
    * ``✓  depth == minimum depth ...`` when only the exact minimum is met;
    * ``+  depth D > minimum depth M ...`` naming the stage boundaries that
      could be removed with this enqueue order still deadlock-free (extra
      stages then buy overlap and cost memory, never correctness).

    :data:`LEGEND` says what each term and mark means, in words.

    See the module docstring for the definitions and why
    ``LDS <= minimum depth <= depth``.

    Parameters
    ----------
    plan : PipelinePlan
        A plan that passes ``validate``.

    Returns
    -------
    str

    Raises
    ------
    PlanError
        If the plan does not pass :func:`~swpipe_core.validate.validate`.

    Examples
    --------
    A copy-then-compute plan (CopyBatch at stage 0 on an IO thread, Forward
    and Backward at stage 1 on a compute thread, enqueued stage-descending):

    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan(
    ...     {"CopyBatch": TaskSchedule(0, "memcpy", "io"), "Forward": TaskSchedule(1, None, "compute"),
    ...      "Backward": TaskSchedule(1, None, "compute")},
    ...     intra_iter_deps=[("Forward", "CopyBatch"), ("Backward", "Forward")],
    ...     enqueue_policy="stage_descending")
    >>> print(format_stage_analysis(plan))
    Task schedule (topological order):
      Pos  Task              Idx  Stage  Type
      --------------------------------------------------
        0  CopyBatch           0      0  stream
        1  Forward             1      1  stream
        2  Backward            2      1  stream
    Enqueue order (stage_descending): Forward, Backward, CopyBatch
    LDS = 2  (example: (1, 0))
    Pipeline depth = 2
      ✓  LDS == depth (Dilworth-optimal)
    Minimum depth for this enqueue order = 2 (exact; LDS <= minimum depth <= depth)
    """
    validate(plan)
    index = {n: i for i, n in enumerate(plan.task_names)}
    rows = _topological_rows(plan)
    w_task = max([16] + [len(n) for n in rows])
    out = [
        "Task schedule (topological order):",
        f"  {'Pos':>3}  {'Task':<{w_task}}  {'Idx':>3}  {'Stage':>5}  Type",
        "  " + "-" * (50 + w_task - 16),
    ]
    for pos, name in enumerate(rows):
        sched = plan.sched(name)
        kind = "global" if sched.globally_ordered else "stream"
        out.append(f"  {pos:>3}  {name:<{w_task}}  {index[name]:>3}  {sched.stage:>5}  {kind}")

    order = enqueue_order(plan)
    how = "explicit" if plan.enqueue_order is not None else plan.enqueue_policy
    out.append(f"Enqueue order ({how}): {', '.join(order)}")
    length, example = _chain_lds(plan, order)
    depth = plan.pipeline_depth
    minimum = min_depth(plan, order)
    out.append(f"LDS = {length}  (example: {example})")
    out.append(f"Pipeline depth = {depth}")
    if length == depth:
        out.append("  ✓  LDS == depth (Dilworth-optimal)")
    elif minimum == depth:
        out.append(f"  ✓  depth == minimum depth for this enqueue order (LDS = {length} is only a lower bound)")
    else:
        ks = removable_boundaries(plan, order)
        if ks:
            fix = "removable stage boundaries " + ", ".join(f"{k}|{k + 1}" for k in ks) + " (each alone"
        else:
            stages = min_stages(plan, order)
            fix = "no single stage boundary is removable, but stages " + ", ".join(
                f"{n}={s}" for n, s in stages.items()) + " suffice (they"
        out.append(f"  {MORE_STAGES_MARK}  depth {depth} > minimum depth {minimum} for this enqueue order: {fix} "
                   f"keeps the order deadlock-free; extra stages buy overlap and cost memory, never correctness)")
    out.append(f"Minimum depth for this enqueue order = {minimum} (exact; LDS <= minimum depth <= depth)")
    return "\n".join(out)


def format_plan_repr(plan: PipelinePlan, device: Any = 0, shortcuts: Iterable[TaskRef] = ()) -> str:
    """``repr(SWPipeline)``: a summary line, a blank line, the schedule table.

    The table shows ``pipeline_depth`` periods (the fill: every task's first
    iteration appears).

    Parameters
    ----------
    plan : PipelinePlan
    device : int, str or torch.device
        Shown as given (``str``).
    shortcuts : iterable of TaskRef
        Tasks currently shortcut.

    Returns
    -------
    str

    Raises
    ------
    ValueError
        If a shortcut names an unknown task.

    Examples
    --------
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"H2DAndShuffle": TaskSchedule(0), "MPEmbForward": TaskSchedule(0)},
    ...                     intra_iter_deps=[("MPEmbForward", "H2DAndShuffle")])
    >>> print(format_plan_repr(plan, 0, ["MPEmbForward"]))
    SWPipeline(device=0, depth=1, tasks=['H2DAndShuffle', 'MPEmbForward'], shortcuts=['MPEmbForward'])
    <BLANKLINE>
       #  Task                 Thread   Stream        | P0
      --  -------------------  -------  ------------  + -----
       0  H2DAndShuffle        default  default       | i0
       1  MPEmbForward [skip]  default  default       |  .
    """
    skip = _shortcut_names(plan, shortcuts)
    ordered_skip = [n for n in plan.task_names if n in skip]
    head = f"SWPipeline(device={device}, depth={plan.pipeline_depth}, tasks={plan.task_names}, shortcuts={ordered_skip})"
    return head + "\n\n" + format_schedule(plan, plan.pipeline_depth, ordered_skip)
