"""From a searcher's choices to a ``PipelinePlan``: readable group names, the inline group, the enqueue order.

:func:`build_plan` turns per-task stages, thread-group keys, streams and start offsets into a plan
(``caller_group`` set when a group runs inline on the caller's thread); :func:`enqueue_order_for`
writes its enqueue order, with the hand-offs where the model starts the tasks (docs/semantics.md,
"The caller's group"); :func:`inline_key` says which group key runs inline.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import networkx as nx

from swpipe_core.plan import PipelinePlan, TaskSchedule, stream_name

from autosched.search.problem import DEFAULT_GROUP, Problem

__all__ = ["build_plan", "enqueue_order_for", "inline_key"]


def _group_names(problem: Problem, group: Mapping[str, Any], stream: Mapping[str, Any],
                 inline: Any = None) -> Dict[Any, str]:
    """Readable thread-group names: frozen names kept, the inline group (key ``inline``) named the caller's
    group, else the dominant stream's name."""
    members: Dict[Any, List[str]] = {}
    for n in problem.names:
        members.setdefault(group[n], []).append(n)
    names: Dict[Any, str] = {}
    used = set()
    if inline is not None:  # no worker's group takes its name (it would run inline)
        names[inline] = problem.caller_group
        used.add(problem.caller_group)
    for g, ms in members.items():
        if g in names:
            continue
        fixed = {problem.frozen_group[m] for m in ms if m in problem.frozen_group}
        if isinstance(g, str) and g in problem.frozen_group.values():
            fixed.add(g)
        if fixed:
            names[g] = sorted(fixed)[0]
            used.add(names[g])
    # Largest group of default-stream work first, so "default" lands where the model's compute is.
    order = sorted((g for g in members if g not in names),
                   key=lambda g: (-sum(problem.thread_time(m) for m in members[g]), str(g)))
    for g in order:
        weights: Dict[str, float] = {}
        for m in members[g]:
            key = stream_name(stream[m])
            weights[key] = weights.get(key, 0.0) + problem.thread_time(m) + 1e-12
        pref = max(sorted(weights), key=lambda k: weights[k])
        if pref != "default" and pref not in used:
            cand = pref
        elif DEFAULT_GROUP not in used:
            cand = DEFAULT_GROUP
        else:
            k = 1
            while f"worker{k}" in used:
                k += 1
            cand = f"worker{k}"
        names[g] = cand
        used.add(cand)
    return names


def inline_key(problem: Problem, group: Mapping[str, Any], inline: Any = None) -> Any:
    """Which key of ``group`` runs inline: the frozen caller's group, else ``inline`` (None: none).

    Raises ValueError when the problem rules the caller's group out (``caller_group`` None) but
    ``inline`` names one, ``inline`` is not a key of ``group``, or it is a group frozen under another
    name (which keeps its name, and its worker).
    """
    forced = problem.forced_caller
    if forced is not None:
        return forced
    if inline is None:
        return None
    if problem.caller_group is None:
        raise ValueError(f"inline={inline!r}: this problem runs no group inline (caller_group=None)")
    if inline not in set(group.values()):
        keys = sorted(map(str, set(group.values())))
        raise ValueError(f"inline={inline!r} is not one of the thread-group keys {keys}")
    if any(group[n] == inline for n in problem.frozen_group):
        raise ValueError(f"inline={inline!r}: that group holds tasks frozen to thread group(s) "
                         f"{sorted({problem.frozen_group[n] for n in problem.frozen_group if group[n] == inline})}, "
                         f"not the caller's group {problem.caller_group!r}")
    return inline


def enqueue_order_for(plan: PipelinePlan, offset: Optional[Mapping[str, float]] = None,
                      priority: Optional[Sequence[str]] = None, handoff: Optional[str] = None,
                      length: Optional[Mapping[str, float]] = None) -> List[str]:
    """The enqueue order of a searched plan: by start offset, with the hand-offs where the model starts the tasks.

    The base order sorts the period-local graph topologically by ``(offset,
    priority)``: the order in which the model starts the tasks of one period.
    Where the plan runs a group inline (its ``caller_group``) the order is
    also when the main thread hands the other groups' tasks off
    (docs/semantics.md, "The caller's group"): a worker's task placed after a
    caller's task waits until that task has run. So the tasks are walked
    again, each thread group's tasks and the globally ordered tasks keeping
    their base order (each FIFO and the sequencer see the same sequence),
    with a worker's task placed after exactly the caller's tasks that end
    (``offset + length``) by its own start in the model: it is handed off
    no later than the model starts it, and no earlier than the model's last
    caller's task before it has ended (so that it does not take a core, the
    interpreter lock or a communicator sooner than the model says).
    Without ``offset`` and ``length`` every worker's task is handed off as
    early as the graph allows, as the enqueue policies do
    (:func:`swpipe_core.order.handed_off_first`). ``handoff`` (a task of the
    caller's group) then hands off after it every worker's task that can
    wait (:func:`swpipe_core.order.hand_off_after`).

    Examples
    --------
    >>> from swpipe import TaskSchedule
    >>> plan = PipelinePlan({"Load": TaskSchedule(0, thread_group="io"), "Fwd": TaskSchedule(1),
    ...                      "Bwd": TaskSchedule(1), "Log": TaskSchedule(1, thread_group="io")},
    ...                     [("Fwd", "Load"), ("Bwd", "Fwd")])
    >>> at, length = {"Fwd": 0, "Bwd": 3, "Load": 1, "Log": 4}, {"Fwd": 3, "Bwd": 5, "Load": 1, "Log": 1}
    >>> enqueue_order_for(plan.replace(caller_group=None), at, length=length)   # by start
    ['Fwd', 'Load', 'Bwd', 'Log']
    >>> enqueue_order_for(plan, at, length=length)   # Load starts while Fwd runs, Log while Bwd does
    ['Load', 'Fwd', 'Log', 'Bwd']
    >>> enqueue_order_for(plan, {**at, "Log": 8}, length=length)   # Log starts once Bwd has ended
    ['Load', 'Fwd', 'Bwd', 'Log']
    >>> enqueue_order_for(plan, at, length=length, handoff="Fwd")
    ['Fwd', 'Load', 'Log', 'Bwd']
    """
    from swpipe_core.order import hand_off_after, period_local_graph

    pos = {n: i for i, n in enumerate(priority or plan.task_names)}
    off = offset or {}
    graph = period_local_graph(plan)
    base = list(nx.lexicographical_topological_sort(graph, key=lambda n: (off.get(n, 0.0), pos.get(n, 0), n)))
    groups = {plan.sched(n).thread_group for n in base}
    caller = plan.caller_group
    if caller is None or caller not in groups or len(groups) == 1:
        return base
    at = {n: i for i, n in enumerate(base)}
    chained = graph.copy()
    for members in ([n for n in base if plan.sched(n).thread_group == g] for g in sorted(groups)):
        chained.add_edges_from(zip(members, members[1:]))
    ordered = [n for n in base if plan.sched(n).globally_ordered]
    chained.add_edges_from(zip(ordered, ordered[1:]))

    def key(n: str) -> tuple:
        inline = plan.sched(n).thread_group == caller
        if offset is None or length is None:
            return (inline, at[n])  # as early as the graph allows
        # a caller's task at its end, a worker's task at its start: the worker's task follows the caller's
        # tasks that have ended by then (on a tie, the caller's task first)
        return (off.get(n, 0.0) + (length.get(n, 0.0) if inline else 0.0), not inline, at[n])

    order = list(nx.lexicographical_topological_sort(chained, key=key))
    if handoff is not None:
        order = hand_off_after(plan.replace(enqueue_order=order, pipeline_depth=plan.pipeline_depth), handoff)
    return order


def build_plan(problem: Problem, stage: Mapping[str, int], group: Mapping[str, Any],
               stream: Optional[Mapping[str, Any]] = None, priority: Optional[Sequence[str]] = None,
               offset: Optional[Mapping[str, float]] = None, inline: Any = None,
               handoff: Optional[str] = None) -> PipelinePlan:
    """A ``PipelinePlan`` from per-task choices.

    Parameters
    ----------
    problem : Problem
    stage, group : dict
        Stage and thread-group key per task (group keys are renamed readably).
    stream : dict, optional
        Stream per task (default: the problem's initial streams).
    priority : sequence of str, optional
        Tie-break order for the enqueue order (default: declaration order).
    offset : dict, optional
        Start offset within the period: the enqueue order sorts by it first.
    inline : optional
        The group key whose tasks run inline on the caller's thread (named
        ``problem.caller_group``); None: every group has a worker. A group
        frozen under the caller's group's name runs inline whatever this says.
    handoff : str, optional
        A task of the inline group after which the other groups' tasks that
        can wait are handed off (default: each where the offsets start it,
        or as early as it can be without them: :func:`enqueue_order_for`).

    Returns
    -------
    PipelinePlan
        With ``enqueue_order`` a topological order of its period-local graph,
        and ``caller_group`` the caller's group's name when a group runs
        inline, else None.

    Examples
    --------
    >>> from swpipe import CostModel, TaskCost
    >>> from autosched.search.problem import make_problem   # the searchers' input, not public
    >>> from swpipe import Constraints
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.003)})
    >>> p = make_problem((["A", "B"], [("B", "A")]), costs, Constraints(max_depth=2), time_unit_s=1e-3)
    >>> plan = build_plan(p, {"A": 0, "B": 1}, {"A": 1, "B": 0}, offset={"A": 1, "B": 0})
    >>> plan.enqueue_order, plan.sched("A").thread_group, plan.sched("B").thread_group, plan.caller_group
    (['B', 'A'], 'worker1', 'default', None)

    B on the caller's thread: A's worker gets A first, then the main thread runs B:

    >>> plan = build_plan(p, {"A": 0, "B": 1}, {"A": 1, "B": 0}, offset={"A": 1, "B": 0}, inline=0)
    >>> plan.enqueue_order, plan.sched("A").thread_group, plan.sched("B").thread_group, plan.caller_group
    (['A', 'B'], 'worker1', 'default', 'default')
    """
    stream = dict(problem.init_stream) if stream is None else dict(stream)
    inline = inline_key(problem, group, inline)
    gname = _group_names(problem, group, stream, inline)
    schedule = {
        problem.tasks[n]: TaskSchedule(stage=int(stage[n]), stream=stream[n], thread_group=gname[group[n]],
                                       globally_ordered=n in problem.ordered)
        for n in problem.names
    }
    plan = PipelinePlan(schedule, intra_iter_deps=list(problem.intra),
                        inter_iter_deps=[(t, d, n) for t, d, n in problem.inter],
                        caller_group=problem.caller_group if inline is not None else None)
    order = enqueue_order_for(plan, offset, priority or problem.names, handoff,
                              length={n: problem.dur(n) for n in problem.names})
    return plan.replace(enqueue_order=order, pipeline_depth=plan.pipeline_depth)
