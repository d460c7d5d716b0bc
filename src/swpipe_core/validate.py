"""Every rule a plan must satisfy, each failure naming the rule, the tasks and the fix.

``validate(plan)`` is public and is called by ``SWPipeline`` at construction;
a plan it accepts never deadlocks at run time (see the deadlock-freedom argument
under "Period-local graph" in docs/semantics.md, and the property tests of the
engine). The rules:

======================  ==================================================================
rule                    meaning
======================  ==================================================================
``schedule-type``       the schedule is a dict of ``TaskRef -> TaskSchedule``
``task-ref``            every key and dependency end is a name or a ``PipelineTask``
``unique-names``        no two schedule keys share a name
``unknown-task``        dependencies name only scheduled tasks
``foreign-task``        a ``PipelineTask`` in a dependency is the scheduled object, not another one with that name
``self-dependency``     a task never waits on itself within an iteration
``dep-format``          inter deps are ``(task, dep)`` or ``(task, dep, N)`` with integer ``N >= 1``; same-period deps are pairs
``stage``               stages are integers ``>= 0``
``stream-type``         a stream is ``None``, a name, or a torch stream object
``stream_name``         the name ``"default"`` is not a stream name (``None`` is the default stream)
``thread-group``        a thread group is a non-empty string
``globally-ordered``    ``globally_ordered`` is a bool
``cycle``               intra-iteration dependencies form a DAG (the cycle is named)
``corollary-1``         intra dep: ``stage(dep) <= stage(task)``
``corollary-3``         inter dep of distance N: ``stage(dep) - stage(task) <= N``
``depth-mismatch``      an explicit ``pipeline_depth`` equals ``max(stage) + 1``
``period-local-cycle``  the period-local graph (same-period deps included) is a DAG
``enqueue-policy``      the policy is one of ``ready_first`` / ``stage_descending``
``enqueue-order``       an explicit enqueue order lists every task once, in a topological order of the period-local graph
======================  ==================================================================
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, List, Optional, Sequence

import networkx as nx

from swpipe_core.order import period_local_graph
from swpipe_core.planparts import ENQUEUE_POLICIES, PipelineTask, TaskSchedule, ref_name
from swpipe_core.stage_rules import stage_rule_holds

# "PipelinePlan" in the annotations below is swpipe_core.plan.PipelinePlan, left unimported: plan.py builds on this
# module (PipelinePlan.from_text validates), which reads a plan's fields and the parts of swpipe_core.planparts.

__all__ = ["PlanError", "validate", "RULES"]

RULES = (
    "schedule-type", "task-ref", "unique-names", "unknown-task", "foreign-task",
    "self-dependency", "dep-format", "stage", "stream-type", "stream_name", "thread-group",
    "globally-ordered", "cycle", "corollary-1", "corollary-3", "depth-mismatch",
    "period-local-cycle", "enqueue-policy", "enqueue-order",
)


class PlanError(ValueError):
    """A plan breaks a rule; the facts of the message are attributes.

    Attributes
    ----------
    rule : str
        The rule broken (the module docstring's table, or ``"unbound-task"`` when a plan without
        functions is run).
    tasks : list of str
        The tasks involved, the one to change first.
    task : str or None
        ``tasks[0]``, or ``None`` when the rule concerns the plan as a whole.
    field : str or None
        The field to change: a ``PipelinePlan`` field (``"intra_iter_deps"``, ``"enqueue_order"``,
        ``"pipeline_depth"``, ...) or a ``TaskSchedule`` field of ``task`` (``"stage"``, ``"stream"``, ...).
    value : object
        The offending value where there is one (a stage, a stream, a distance, a depth), else ``None``.
    what : str
        What is wrong, in words.
    fix : str
        How to fix it, in words.
    line : int or None
        The line of the plan's text form (``PipelinePlan.from_text``) the rule is broken on, else ``None``.

    Examples
    --------
    >>> from swpipe import PlanError
    >>> e = PlanError("corollary-1", "R waits Q within an iteration but Q runs in a later stage", ["R", "Q"],
    ...               "move Q to stage <= 0")
    >>> print(e)
    [corollary-1] R waits Q within an iteration but Q runs in a later stage (tasks: R, Q). Fix: move Q to stage <= 0
    >>> e.rule, e.task, e.field
    ('corollary-1', 'R', 'intra_iter_deps')
    """

    def __init__(self, rule: str, what: str, tasks: Sequence[str] = (), fix: str = "", *,
                 field: Optional[str] = None, value: object = None, line: Optional[int] = None) -> None:
        self.rule = rule
        self.what = what
        self.tasks = list(tasks)
        self.fix = fix
        self.field = field if field is not None else _RULE_FIELDS.get(rule)
        self.value = value
        self.line = line
        msg = f"[{rule}] {what}" if line is None else f"[{rule}] line {line}: {what}"
        if self.tasks:
            msg += f" (tasks: {', '.join(self.tasks)})"
        if fix:
            msg += f". Fix: {fix}"
        super().__init__(msg)

    @property
    def task(self) -> Optional[str]:
        """The task to change first (``tasks[0]``), ``None`` for a rule of the whole plan."""
        return self.tasks[0] if self.tasks else None

    def at_line(self, line: Optional[int]) -> "PlanError":
        """The same error, found on ``line`` of a plan's text form."""
        return PlanError(self.rule, self.what, self.tasks, self.fix, field=self.field, value=self.value, line=line)

    def __reduce__(self):  # keep the fields through pickling (ranks, worker processes)
        return (_rebuild_plan_error, (self.rule, self.what, self.tasks, self.fix, self.field, self.value, self.line))


def _rebuild_plan_error(rule: str, what: str, tasks: Sequence[str], fix: str, field: Optional[str],
                        value: object, line: Optional[int]) -> PlanError:
    return PlanError(rule, what, tasks, fix, field=field, value=value, line=line)


# the field a rule is about, where the rule alone says it (the dependency rules name their list where raised)
_RULE_FIELDS = {
    "schedule-type": "schedule", "unique-names": "schedule", "stage": "stage", "stream-type": "stream",
    "stream_name": "stream", "thread-group": "thread_group", "globally-ordered": "globally_ordered",
    "cycle": "intra_iter_deps", "corollary-1": "intra_iter_deps", "corollary-3": "inter_iter_deps",
    "depth-mismatch": "pipeline_depth", "enqueue-policy": "enqueue_policy", "enqueue-order": "enqueue_order",
    "unbound-task": "fn",
}


def _is_stream(stream: Any) -> bool:
    """A stream spec: ``None``, a name, or a stream object (a torch stream, or any with ``stream_id`` and ``wait_event``)."""
    if stream is None or isinstance(stream, str):
        return True
    return hasattr(stream, "stream_id") and hasattr(stream, "wait_event")


def _check_ref(ref: Any, where: str) -> str:
    if not isinstance(ref, (str, PipelineTask)):
        raise PlanError(
            "task-ref",
            f"{where} refers to {ref!r} of type {type(ref).__name__}",
            [],
            "refer to tasks by name (str) or by their PipelineTask object",
            field="schedule" if where == "a schedule key" else where, value=ref,
        )
    return ref_name(ref)


def _check_schedule(plan: PipelinePlan) -> dict:
    if not isinstance(plan.schedule, dict) or not plan.schedule:
        raise PlanError("schedule-type", "schedule must be a non-empty dict {TaskRef: TaskSchedule}", [],
                        "pass schedule={task: TaskSchedule(...), ...}")
    names = [_check_ref(k, "a schedule key") for k in plan.schedule]
    dup = [n for n, c in Counter(names).items() if c > 1]
    if dup:
        clash = " and ".join(repr(k) for k in plan.schedule if ref_name(k) == dup[0])
        raise PlanError("unique-names", f"task name(s) {dup} appear more than once in the schedule ({clash})", dup,
                        "give every task a unique name (two tasks with one name would merge into one)")
    objects = {}
    for key, sched in plan.schedule.items():
        name = ref_name(key)
        objects[name] = key
        if not isinstance(sched, TaskSchedule):
            raise PlanError("schedule-type", f"schedule[{name!r}] is {type(sched).__name__}, not TaskSchedule",
                            [name], "use TaskSchedule(stage=..., stream=..., thread_group=...)")
        if not isinstance(sched.stage, int) or isinstance(sched.stage, bool) or sched.stage < 0:
            raise PlanError("stage", f"stage of {name} is {sched.stage!r}; stages are integers >= 0",
                            [name], f"set TaskSchedule(stage=k) with k >= 0 for {name}", value=sched.stage)
        if not _is_stream(sched.stream):
            raise PlanError("stream-type", f"stream of {name} is {sched.stream!r} of type {type(sched.stream).__name__}",
                            [name], "use None (default stream), a stream name such as 'memcpy', or a torch stream object",
                            value=sched.stream)
        if sched.stream == "default":  # a pooled stream *named* default is not the default stream
            raise PlanError("stream_name", f"stream of {name} is the string 'default', which would create a new "
                            "stream that merely prints like the device's default stream", [name],
                            f"use stream=None for the default stream (or another name for a separate stream) in "
                            f"{name}'s TaskSchedule", value=sched.stream)
        if not isinstance(sched.thread_group, str) or not sched.thread_group:
            raise PlanError("thread-group", f"thread_group of {name} is {sched.thread_group!r}", [name],
                            "use a non-empty string such as 'default' or 'io'", value=sched.thread_group)
        if not isinstance(sched.globally_ordered, bool):
            raise PlanError("globally-ordered", f"globally_ordered of {name} is {sched.globally_ordered!r}", [name],
                            "use True or False", value=sched.globally_ordered)
    return objects


def _check_dep_end(ref: Any, objects: dict, where: str) -> str:
    name = _check_ref(ref, where)
    if name not in objects:
        raise PlanError("unknown-task", f"{where} names {name!r}, which is not in the schedule", [name],
                        f"add {name} to the schedule or fix the name; scheduled tasks: {sorted(objects)}",
                        field=where, value=name)
    known = objects[name]
    if isinstance(ref, PipelineTask) and isinstance(known, PipelineTask) and ref is not known and ref.fn is not known.fn:
        raise PlanError("foreign-task", f"{where} uses a PipelineTask named {name!r} that is not the scheduled one "
                        "(a different object with a different function)", [name],
                        "refer to the task object that is in the schedule, or by name", field=where)
    return name


def _pair(dep: Any, where: str, objects: dict, itself: str, once_per: str) -> tuple:
    """A ``(task, depends_on)`` pair of ``where`` as names: well formed, scheduled, not a task waiting itself."""
    if not isinstance(dep, (tuple, list)) or len(dep) != 2:
        raise PlanError("dep-format", f"{where} entry {dep!r} is not a (task, depends_on) pair", [],
                        f"write {where}=[(task, depends_on), ...]", field=where, value=dep)
    t = _check_dep_end(dep[0], objects, where)
    d = _check_dep_end(dep[1], objects, where)
    if t == d:
        raise PlanError("self-dependency", f"{t} {itself}", [t], f"remove the dependency (a task runs once per {once_per})",
                        field=where)
    return t, d


def _normalised_deps(plan: PipelinePlan, objects: dict):
    intra = [_pair(dep, "intra_iter_deps", objects, "depends on itself within an iteration", "iteration")
             for dep in plan.intra_iter_deps]
    inter: List[tuple] = []
    for dep in plan.inter_iter_deps:
        if not isinstance(dep, (tuple, list)) or len(dep) not in (2, 3):
            raise PlanError("dep-format", f"inter_iter_deps entry {dep!r} is not (task, depends_on) or (task, depends_on, N)",
                            [], "write inter_iter_deps=[(task, depends_on), (task, depends_on, N), ...]",
                            field="inter_iter_deps", value=dep)
        t = _check_dep_end(dep[0], objects, "inter_iter_deps")
        d = _check_dep_end(dep[1], objects, "inter_iter_deps")
        n = dep[2] if len(dep) == 3 else 1
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise PlanError("dep-format", f"inter dependency ({t}, {d}) has distance {n!r}; distances are integers >= 1",
                            [t, d], "use N >= 1, or put a same-iteration dependency in intra_iter_deps",
                            field="inter_iter_deps", value=n)
        inter.append((t, d, n))
    for dep in plan.same_period_deps:
        _pair(dep, "same_period_deps", objects, "waits itself in the same period", "period")
    return intra, inter


def _check_corollaries(plan: PipelinePlan, intra: Iterable[tuple], inter: Iterable[tuple]) -> None:
    stage = {ref_name(k): v.stage for k, v in plan.schedule.items()}
    for t, d in intra:
        if not stage_rule_holds(stage[t], stage[d]):
            raise PlanError(
                "corollary-1",
                f"{t} (stage {stage[t]}) waits {d} (stage {stage[d]}) within an iteration, but {d} runs on that "
                f"iteration {stage[d] - stage[t]} period(s) later, so {t} would wait forever",
                [t, d],
                f"move {d} to stage <= {stage[t]}, move {t} to stage >= {stage[d]}, "
                f"or declare ({t}, {d}) in inter_iter_deps if {t} needs an earlier iteration's {d}",
            )
    for t, d, n in inter:
        if not stage_rule_holds(stage[t], stage[d], n):
            raise PlanError(
                "corollary-3",
                f"{t} (stage {stage[t]}) waits {d} (stage {stage[d]}) of {n} iteration(s) earlier, but that {d} runs "
                f"in a later period (stage gap {stage[d] - stage[t]} > distance {n}), a structural deadlock",
                [t, d],
                f"move {t} to stage >= {stage[d] - n}, move {d} to stage <= {stage[t] + n}, "
                f"or raise the distance to >= {stage[d] - stage[t]}",
            )


def _check_intra_cycle(intra: Iterable[tuple], names: Iterable[str]) -> None:
    graph = nx.DiGraph()
    graph.add_nodes_from(names)
    graph.add_edges_from((d, t) for t, d in intra)
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return
    path = [u for u, _ in cycle] + [cycle[0][0]]
    raise PlanError("cycle", f"intra-iteration dependencies form a cycle: {' -> '.join(path)}", path[:-1],
                    "remove one dependency of the cycle; within an iteration dependencies must form a DAG")


def _cycle_field(plan: PipelinePlan, cycle: Sequence[tuple]) -> str:
    """The dependency list a period-local cycle runs through besides the intra-iteration DAG."""
    same = {(d, t) for t, d, _ in plan.same_period_edges()}
    return "same_period_deps" if any((u, v) in same for u, v in cycle) else "inter_iter_deps"


def validate(plan: PipelinePlan) -> None:
    """Check every rule a runnable plan must satisfy.

    Parameters
    ----------
    plan : PipelinePlan

    Returns
    -------
    None

    Raises
    ------
    PlanError
        The first broken rule, with ``rule``, ``tasks`` and ``fix``. See the
        module docstring for the rules.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule, validate
    >>> ok = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, intra_iter_deps=[("B", "A")])
    >>> validate(ok)
    >>> bad = PipelinePlan({"A": TaskSchedule(1), "B": TaskSchedule(0)}, intra_iter_deps=[("B", "A")])
    >>> validate(bad)
    Traceback (most recent call last):
    ...
    swpipe_core.validate.PlanError: [corollary-1] B (stage 0) waits A (stage 1) within an iteration, ...
    """
    objects = _check_schedule(plan)
    intra, inter = _normalised_deps(plan, objects)
    _check_intra_cycle(intra, objects)
    _check_corollaries(plan, intra, inter)

    inferred = plan.inferred_depth()
    if plan.pipeline_depth != inferred:
        raise PlanError("depth-mismatch",
                        f"pipeline_depth={plan.pipeline_depth!r} but max(stage) + 1 = {inferred}", [],
                        f"set pipeline_depth={inferred} or omit it to have it inferred", value=plan.pipeline_depth)

    graph = period_local_graph(plan)
    try:
        cycle = nx.find_cycle(graph)
        names = [u for u, _ in cycle]
        raise PlanError("period-local-cycle", f"the period-local graph has a cycle: {' -> '.join(names + names[:1])}",
                        names, "break the cycle; same-period dependencies must form a DAG",
                        field=_cycle_field(plan, cycle))
    except nx.NetworkXNoCycle:
        pass

    if plan.enqueue_order is None:
        if plan.enqueue_policy not in ENQUEUE_POLICIES:
            raise PlanError("enqueue-policy", f"enqueue_policy={plan.enqueue_policy!r} is unknown", [],
                            f"use one of {list(ENQUEUE_POLICIES)}, or give an explicit enqueue_order",
                            value=plan.enqueue_policy)
        return
    order = [_check_ref(r, "enqueue_order") for r in plan.enqueue_order]
    missing = [n for n in objects if n not in order]
    extra = [n for n in order if n not in objects]
    dup = [n for n, c in Counter(order).items() if c > 1]
    if missing or extra or dup:
        raise PlanError("enqueue-order",
                        f"enqueue_order must list every task exactly once (missing {missing}, unknown {extra}, repeated {dup})",
                        missing + extra + dup, "list each scheduled task once, or omit enqueue_order")
    pos = {n: i for i, n in enumerate(order)}
    for d, t in graph.edges:
        if pos[d] > pos[t]:
            raise PlanError(
                "enqueue-order",
                f"enqueue_order puts {t} before {d}, but {t} waits {d} in the same period, so {t} would block "
                f"the head of its thread's queue",
                [t, d],
                f"enqueue {d} before {t} (the order must be a topological order of the period-local graph)",
            )
