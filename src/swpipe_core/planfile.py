"""A plan's dict form: the one versioned schema for plan files, the plan ranks share, and a plan's identity.

:func:`plan_to_dict` writes every field of a :class:`~swpipe_core.plan.PipelinePlan`
but the task functions; :func:`plan_from_dict` reads it back (binding functions
by name), checks its form and validates the plan. ``save_plan``/``load_plan``
(:mod:`autosched.model.graph`) store it as JSON, rank 0 hands it to the other
ranks (:mod:`swpipe.workloads.autoplan`), and the verification's identity of a
plan (:func:`autosched.verify.candidates.plan_key`) is built from it.

Schema (``"format": "swpipe-plan"``, ``"version": 2``)::

    {"format": "swpipe-plan", "version": 2,
     "tasks": [{"name": str, "stage": int, "stream": str or null, "thread_group": str,
                "globally_ordered": bool}, ...],
     "intra_iter_deps": [[task, depends_on], ...],
     "inter_iter_deps": [[task, depends_on, N], ...],
     "same_period_deps": [[task, depends_on], ...],
     "pipeline_depth": int, "enqueue_order": [task, ...] or null,
     "enqueue_policy": str, "caller_group": str or null}

A stream is ``null`` for the device's default stream and its name otherwise (a
stream object is stored by :func:`~swpipe_core.plan.stream_name`). Only
``tasks`` (and in each task ``name``) is required; the other fields default as
in :class:`~swpipe_core.plan.PipelinePlan`. Version 1 (written before
``same_period_deps`` could be stored) is read as well.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule, ref_name, stream_name
from swpipe_core.validate import validate

__all__ = ["PLAN_FORMAT", "PLAN_VERSION", "PlanFileError", "plan_to_dict", "plan_from_dict", "check_header",
           "check_keys", "deps_from_dict", "check_fns"]

PLAN_FORMAT = "swpipe-plan"
PLAN_VERSION = 2
_TOP = {"format", "version", "tasks", "intra_iter_deps", "inter_iter_deps", "same_period_deps", "pipeline_depth",
        "enqueue_order", "enqueue_policy", "caller_group"}
_TOP_BY_VERSION = {1: _TOP - {"same_period_deps"}, 2: _TOP}
_TASK = {"name", "stage", "stream", "thread_group", "globally_ordered"}
# field -> allowed lengths of one dependency ([task, depends_on] or [task, depends_on, N])
_DEPS = {"intra_iter_deps": (2,), "inter_iter_deps": (2, 3), "same_period_deps": (2,)}


class PlanFileError(ValueError):
    """A plan's dict form (or a file holding it) is malformed; names the source, the field and the fix.

    Examples
    --------
    >>> print(PlanFileError("p.json", "tasks[0]", "missing 'name'", "give every task a name"))
    p.json: tasks[0]: missing 'name'. Fix: give every task a name
    """

    def __init__(self, source: str, where: str, what: str, fix: str = "") -> None:
        self.source, self.where, self.what, self.fix = source, where, what, fix
        msg = ": ".join(x for x in (source, where, what) if x)
        if fix:
            msg += f". Fix: {fix}"
        super().__init__(msg)


def plan_to_dict(plan: PipelinePlan) -> Dict[str, Any]:
    """A plan's dict form (JSON-ready, picklable, comparable): every field but the task functions.

    Parameters
    ----------
    plan : PipelinePlan

    Returns
    -------
    dict
        The schema of this module, version 2; tasks and dependencies in the plan's order.

    Examples
    --------
    >>> plan = PipelinePlan({"P": TaskSchedule(0, "copy"), "B": TaskSchedule(1)}, [("B", "P")],
    ...                     same_period_deps=[("B", "P")], caller_group=None)
    >>> d = plan_to_dict(plan)
    >>> d["tasks"][0], d["same_period_deps"], d["caller_group"]
    ({'name': 'P', 'stage': 0, 'stream': 'copy', 'thread_group': 'default', 'globally_ordered': False}, [['B', 'P']], None)
    >>> plan_from_dict(d) == plan
    True
    """
    tasks = [{"name": ref_name(key), "stage": s.stage, "stream": None if s.stream is None else stream_name(s.stream),
              "thread_group": s.thread_group, "globally_ordered": s.globally_ordered}
             for key, s in plan.schedule.items()]
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "tasks": tasks,
        "intra_iter_deps": [list(d) for d in plan.intra_edges()],
        "inter_iter_deps": [list(d) for d in plan.declared_inter_edges()],
        "same_period_deps": [[ref_name(t), ref_name(d)] for t, d in plan.same_period_deps],
        "pipeline_depth": plan.pipeline_depth,
        "enqueue_order": None if plan.enqueue_order is None else [ref_name(r) for r in plan.enqueue_order],
        "enqueue_policy": plan.enqueue_policy,
        "caller_group": plan.caller_group,
    }


def plan_from_dict(doc: Any, fns: Optional[Mapping[str, Callable]] = None, *, source: str = "plan") -> PipelinePlan:
    """The plan a dict form describes (:func:`plan_to_dict`, or a file's, version 1 or 2), validated.

    Parameters
    ----------
    doc : dict
    fns : dict, optional
        ``{task_name: fn}``; tasks without a function stay unbound (analysis only).
    source : str
        Where ``doc`` came from (a file's path, ``"rank 0's plan"``), named in errors.

    Returns
    -------
    PipelinePlan

    Raises
    ------
    PlanFileError
        A wrong format or version, an unknown or missing field, a field of the wrong kind, a
        dependency naming an unknown task; the message names the field.
    swpipe_core.validate.PlanError
        The plan breaks a rule (a stage, a policy, the depth, the enqueue order).
    ValueError
        ``fns`` names a task that is not in the plan, or holds something not callable.

    Examples
    --------
    >>> plan_from_dict({"format": "swpipe-plan", "version": 2, "tasks": [{"name": "A", "stage": "0"}]})
    Traceback (most recent call last):
    ...
    swpipe_core.validate.PlanError: [stage] stage of A is '0'; stages are integers >= 0 (tasks: A). Fix: set TaskSchedule(stage=k) with k >= 0 for A
    >>> plan_from_dict({"format": "swpipe-plan", "version": 2, "tasks": [{"name": "A"}], "caller_group": 3})
    Traceback (most recent call last):
    ...
    swpipe_core.planfile.PlanFileError: plan: caller_group: 3 is not a string or null. Fix: name the thread group run on the caller's thread ("default"), or null for none
    """
    check_header(source, doc, PLAN_FORMAT, tuple(_TOP_BY_VERSION))
    check_keys(source, "top level", doc, _TOP_BY_VERSION[doc["version"]], {"tasks"})
    schedule = _schedule_from_dict(source, doc["tasks"])
    names = list(schedule)
    intra, inter, same = deps_from_dict(source, doc, names, ("intra_iter_deps", "inter_iter_deps", "same_period_deps"))
    order = doc.get("enqueue_order")
    if order is not None and not isinstance(order, list):
        raise PlanFileError(source, "enqueue_order", f"{order!r} is not a list or null",
                            "list every task name once in enqueue order, or null to use enqueue_policy")
    caller = doc.get("caller_group", "default")
    if caller is not None and not isinstance(caller, str):
        raise PlanFileError(source, "caller_group", f"{caller!r} is not a string or null",
                            'name the thread group run on the caller\'s thread ("default"), or null for none')
    if fns:
        check_fns(fns, names, source)
    tasks = {n: PipelineTask(n, (fns or {}).get(n)) for n in names}
    plan = PipelinePlan({tasks[n]: s for n, s in schedule.items()}, intra, inter,
                        pipeline_depth=doc.get("pipeline_depth"), enqueue_order=order,
                        enqueue_policy=doc.get("enqueue_policy", "ready_first"), caller_group=caller,
                        same_period_deps=same)
    validate(plan)
    return plan


def check_header(source: str, doc: Any, fmt: str = PLAN_FORMAT, versions: Sequence[int] = (1, 2)) -> None:
    """Raise :class:`PlanFileError` unless ``doc`` is a dict of format ``fmt`` in one of ``versions``.

    Examples
    --------
    >>> check_header("p.json", {"format": "swpipe-plan", "version": 9})
    Traceback (most recent call last):
    ...
    swpipe_core.planfile.PlanFileError: p.json: version: version 9 is not supported (this swpipe reads 1, 2). Fix: re-save the file with this swpipe
    """
    if not isinstance(doc, dict):
        raise PlanFileError(source, "", f"top level is {type(doc).__name__}, not an object",
                            f'the file holds one JSON object {{"format": "{fmt}", "version": {max(versions)}, ...}}')
    if doc.get("format") != fmt:
        raise PlanFileError(source, "format", f"format is {doc.get('format')!r}, expected {fmt!r}",
                            f"load a {fmt} file (save_plan writes swpipe-plan, save_task_graph swpipe-task-graph)")
    version = doc.get("version")
    if isinstance(version, bool) or version not in versions:
        raise PlanFileError(source, "version", f"version {version!r} is not supported (this swpipe reads "
                            f"{', '.join(map(str, versions))})", "re-save the file with this swpipe")


def _schedule_from_dict(source: str, entries: Any) -> Dict[str, TaskSchedule]:
    """``{name: TaskSchedule}`` of the ``tasks`` field (kinds of the values are left to ``validate``)."""
    if not isinstance(entries, list) or not entries:
        raise PlanFileError(source, "tasks", f"{entries!r} is not a non-empty list",
                            'write "tasks": [{"name": "H2D", "stage": 0}, ...]')
    schedule: Dict[str, TaskSchedule] = {}
    for j, entry in enumerate(entries):
        where = f"tasks[{j}]"
        check_keys(source, where, entry, _TASK, {"name"})
        name = entry["name"]
        if not isinstance(name, str) or not name:
            raise PlanFileError(source, where, f"name {name!r} is not a non-empty string",
                                "give every task a non-empty string name")
        if name in schedule:
            raise PlanFileError(source, where, f"task {name!r} appears twice", "give every task a unique name")
        schedule[name] = TaskSchedule(stage=entry.get("stage", 0), stream=entry.get("stream"),
                                      thread_group=entry.get("thread_group", "default"),
                                      globally_ordered=entry.get("globally_ordered", False))
    return schedule


def check_keys(source: str, where: str, obj: Any, allowed: set, required: set) -> None:
    """Raise :class:`PlanFileError` unless ``obj`` is a dict with only ``allowed`` keys and every ``required`` one.

    Examples
    --------
    >>> check_keys("p.json", "tasks[0]", {"name": "A", "speed": 1}, {"name", "stage"}, {"name"})
    Traceback (most recent call last):
    ...
    swpipe_core.planfile.PlanFileError: p.json: tasks[0]: unknown field(s) ['speed']. Fix: allowed fields: ['name', 'stage']
    """
    if not isinstance(obj, dict):
        raise PlanFileError(source, where, f"{obj!r} is not an object", f"write {where} as a JSON object {{...}}")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise PlanFileError(source, where, f"unknown field(s) {unknown}", f"allowed fields: {sorted(allowed)}")
    missing = sorted(required - set(obj))
    if missing:
        raise PlanFileError(source, where, f"missing field(s) {missing}", f"add {missing} to {where}")


def deps_from_dict(source: str, doc: Mapping[str, Any], names: Sequence[str],
                   fields: Sequence[str] = ("intra_iter_deps", "inter_iter_deps")) -> List[List[Tuple]]:
    """The dependency lists ``fields`` of a plan's or task graph's dict form, checked against the task ``names``.

    Parameters
    ----------
    source : str
    doc : dict
    names : sequence of str
    fields : sequence of str
        Among ``intra_iter_deps``, ``inter_iter_deps`` (``[task, dep]`` or
        ``[task, dep, N]``, ``N >= 1``) and ``same_period_deps``; a missing one is empty.

    Returns
    -------
    list
        One list of tuples per field.

    Examples
    --------
    >>> deps_from_dict("g", {"inter_iter_deps": [["A", "B", 2]]}, ["A", "B"])
    [[], [('A', 'B', 2)]]
    >>> deps_from_dict("g", {"same_period_deps": [["A", "C"]]}, ["A", "B"], ["same_period_deps"])
    Traceback (most recent call last):
    ...
    swpipe_core.planfile.PlanFileError: g: same_period_deps[0]: names unknown task 'C'. Fix: tasks are ['A', 'B']
    """
    return [_deps(source, field, doc.get(field, []), set(names), names) for field in fields]


def _deps(source: str, field: str, deps: Any, known: set, names: Sequence[str]) -> List[Tuple]:
    sizes = _DEPS[field]
    if not isinstance(deps, list):
        raise PlanFileError(source, field, f"{deps!r} is not a list",
                            f'write "{field}": [[task, depends_on], ...] (or [] for none)')
    parsed = []
    for j, dep in enumerate(deps):
        where = f"{field}[{j}]"
        if not isinstance(dep, list) or len(dep) not in sizes:
            raise PlanFileError(source, where, f"{dep!r} is not a list of {' or '.join(map(str, sizes))} items",
                                "write [task, depends_on]" + (" or [task, depends_on, N]" if 3 in sizes else ""))
        for end in dep[:2]:
            if end not in known:
                raise PlanFileError(source, where, f"names unknown task {end!r}", f"tasks are {list(names)}")
        if len(dep) == 3 and (not isinstance(dep[2], int) or isinstance(dep[2], bool) or dep[2] < 1):
            raise PlanFileError(source, where, f"distance {dep[2]!r} is not an integer >= 1",
                                "use N >= 1 iterations back; a same-iteration dependency goes in intra_iter_deps")
        parsed.append(tuple(dep))
    return parsed


def check_fns(fns: Mapping[str, Any], names: Sequence[str], source: str = "") -> None:
    """Raise ``ValueError`` unless every entry of ``fns`` names one of the tasks ``names`` and is callable.

    Examples
    --------
    >>> check_fns({"C": print}, ["A", "B"], "p.json")
    Traceback (most recent call last):
    ...
    ValueError: p.json: fns names task(s) ['C'] that are not in the plan; tasks: ['A', 'B']
    """
    unknown = sorted(set(fns) - set(names))
    if unknown:
        raise ValueError(f"{source + ': ' if source else ''}fns names task(s) {unknown} that are not in the plan; "
                         f"tasks: {list(names)}")
    bad = sorted(k for k, v in fns.items() if not callable(v))
    if bad:
        raise ValueError(f"fns[{bad[0]!r}] is not callable")
