"""A plan's two forms, dict and text, over one field list: the versioned schema of plan files, the short text a
plan prints as, their readers and the checks of their form.

This module sits below :mod:`swpipe_core.plan`: it reads a plan's fields and writes its forms, and turns a form
into the arguments of :class:`~swpipe_core.plan.PipelinePlan` (:func:`plan_arguments`), but builds and validates
no plan, so that ``str(plan)`` (:func:`plan_to_text`) and ``PipelinePlan.from_text`` can use it.
:mod:`swpipe_core.planfile` is the public entry point: it re-exports every name here and adds the readers that
return a validated plan (``plan_from_dict``, ``plan_from_text``).

:func:`plan_to_dict` writes every field of a plan but the task functions. ``save_plan``/``load_plan``
(:mod:`autosched.model.graph`) store it as JSON, rank 0 hands it to the other ranks
(:mod:`swpipe.workloads.autoplan`), and the verification's identity of a plan
(:func:`autosched.verify.candidates.plan_key`) is built from it. :func:`plan_to_text` (``str(plan)``) writes the
same fields as short text, one line per task, and :func:`text_to_dict` reads that text into the dict form: the two
forms share one list of fields (:data:`PLAN_FIELDS`, :data:`TASK_FIELDS`, :data:`DEP_FIELDS`) and one reader
(:func:`plan_arguments`).

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

Text form::

    plan depth=2 caller=default policy=ready_first
    0 H2D     on io      stream memcpy
    1 Forward on default stream default after H2D
    1 Optim   on default stream default after Forward Optim[i-1] H2D[period]
    order H2D Forward Optim

The first line holds the plan's fields (``keyword=value``); then one line per task, in the schedule's order:
its stage, its name, ``on`` its thread group, ``stream`` its stream (``default``: the device's default
stream), ``global`` when it is globally ordered, and ``after`` the tasks it waits: ``X`` in the same
iteration, ``X[i-N]`` ``N`` iterations back, ``X[period]`` in the same period. An ``order`` line lists an
explicit enqueue order. A name that is not one word (letters, digits, ``_.:/+-``) is written as a JSON
string (``"my task"``); ``none`` is the caller group ``None``; blank lines and lines starting with ``#``
are skipped.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from swpipe_core.planparts import PipelineTask, TaskRef, TaskSchedule, ref_name, stream_name

__all__ = ["PLAN_FORMAT", "PLAN_VERSION", "PLAN_FIELDS", "TASK_FIELDS", "DEP_FIELDS", "PlanFileError",
           "plan_to_dict", "plan_arguments", "plan_to_text", "text_to_dict", "check_header", "check_keys",
           "deps_from_dict", "check_fns"]

# "PipelinePlan" in the annotations below is swpipe_core.plan.PipelinePlan, left unimported: plan.py builds on this
# module (str(plan), PipelinePlan.from_text), which reads a plan's fields and never builds one.

PLAN_FORMAT = "swpipe-plan"
PLAN_VERSION = 2


class Field(NamedTuple):
    """One field of a plan's forms: its key in the dict form, its keyword in the text form, its default."""

    key: str
    keyword: str
    default: Any


# The fields of both forms, in the order both write them.
PLAN_FIELDS = (Field("pipeline_depth", "depth", None), Field("enqueue_order", "order", None),
               Field("enqueue_policy", "policy", "ready_first"), Field("caller_group", "caller", "default"))
TASK_FIELDS = (Field("name", "", None), Field("stage", "", 0), Field("stream", "stream", None),
               Field("thread_group", "on", "default"), Field("globally_ordered", "global", False))
# a dependency list: its keyword is the suffix of a dependency on its task's line; its default the lengths of one entry
DEP_FIELDS = (Field("intra_iter_deps", "", (2,)), Field("inter_iter_deps", "[i-N]", (2, 3)),
              Field("same_period_deps", "[period]", (2,)))
_TOP = {"format", "version", "tasks"} | {f.key for f in PLAN_FIELDS + DEP_FIELDS}
_TOP_BY_VERSION = {1: _TOP - {"same_period_deps"}, 2: _TOP}
_TASK = {f.key for f in TASK_FIELDS}
_DEFAULT = {f.key: f.default for f in PLAN_FIELDS + TASK_FIELDS}
# field -> allowed lengths of one dependency ([task, depends_on] or [task, depends_on, N])
_DEPS = {f.key: f.default for f in DEP_FIELDS}


class PlanFileError(ValueError):
    """A plan's dict or text form (or a file holding it) is malformed; the facts of the message are attributes.

    Attributes
    ----------
    source : str
        Where the form came from (a file's path, ``"plan"``, ``"rank 0's plan"``).
    field : str
        The field at fault, as a path into the dict form (``"tasks[0]"``, ``"caller_group"``,
        ``"inter_iter_deps[2]"``), ``""`` for the form as a whole.
    line : int or None
        The line of the text form (1-based), ``None`` for the dict form.
    task : str or None
        The task the field belongs to, where one does.
    value : object
        The offending value where there is one.
    what, fix : str
        What is wrong and how to fix it, in words.

    Examples
    --------
    >>> e = PlanFileError("p.json", "tasks[0]", "missing 'name'", "give every task a name")
    >>> print(e)
    p.json: tasks[0]: missing 'name'. Fix: give every task a name
    >>> e.source, e.field, e.line
    ('p.json', 'tasks[0]', None)
    """

    def __init__(self, source: str, where: str, what: str, fix: str = "", *, line: Optional[int] = None,
                 task: Optional[str] = None, value: object = None) -> None:
        self.source, self.field, self.what, self.fix = source, where, what, fix
        self.line, self.task, self.value = line, task, value
        place = source if line is None else f"{source}, line {line}"
        msg = ": ".join(x for x in (place, where, what) if x)
        if fix:
            msg += f". Fix: {fix}"
        super().__init__(msg)

    def at_line(self, line: Optional[int]) -> "PlanFileError":
        """The same error, found on ``line`` of a plan's text form."""
        return PlanFileError(self.source, self.field, self.what, self.fix, line=line, task=self.task, value=self.value)

    @property
    def where(self) -> str:
        """The field path (the name it had before ``field``)."""
        return self.field


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
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"P": TaskSchedule(0, "copy"), "B": TaskSchedule(1)}, [("B", "P")],
    ...                     same_period_deps=[("B", "P")], caller_group=None)
    >>> d = plan_to_dict(plan)
    >>> d["tasks"][0], d["same_period_deps"], d["caller_group"]
    ({'name': 'P', 'stage': 0, 'stream': 'copy', 'thread_group': 'default', 'globally_ordered': False}, [['B', 'P']], None)
    >>> PipelinePlan(**plan_arguments(d)) == plan
    True
    """
    def task_field(key: TaskRef, sched: TaskSchedule, name: str) -> Any:
        if name == "name":
            return ref_name(key)
        if name == "stream":
            return None if sched.stream is None else stream_name(sched.stream)
        return getattr(sched, name)

    def plan_field(name: str) -> Any:
        if name == "enqueue_order":
            return None if plan.enqueue_order is None else [ref_name(r) for r in plan.enqueue_order]
        return getattr(plan, name)

    deps = {"intra_iter_deps": [list(d) for d in plan.intra_edges()],
            "inter_iter_deps": [list(d) for d in plan.declared_inter_edges()],
            "same_period_deps": [[ref_name(t), ref_name(d)] for t, d in plan.same_period_deps]}
    return {"format": PLAN_FORMAT, "version": PLAN_VERSION,
            "tasks": [{f.key: task_field(key, sched, f.key) for f in TASK_FIELDS} for key, sched in plan.schedule.items()],
            **{f.key: deps[f.key] for f in DEP_FIELDS}, **{f.key: plan_field(f.key) for f in PLAN_FIELDS}}


def plan_arguments(doc: Any, fns: Optional[Mapping[str, Callable]] = None, *, source: str = "plan") -> Dict[str, Any]:
    """The arguments of the :class:`~swpipe_core.plan.PipelinePlan` a dict form describes (:func:`plan_to_dict`, or
    a file's, version 1 or 2), its form checked; the plan they build is not validated here
    (:func:`swpipe_core.planfile.plan_from_dict` and ``PipelinePlan.from_text`` validate it).

    Parameters
    ----------
    doc : dict
    fns : dict, optional
        ``{task_name: fn}``; tasks without a function stay unbound (analysis only).
    source : str
        Where ``doc`` came from (a file's path, ``"rank 0's plan"``), named in errors.

    Returns
    -------
    dict
        ``schedule`` (keyed by ``PipelineTask``), the three dependency lists and the plan's fields, by the names
        of ``PipelinePlan``'s parameters.

    Raises
    ------
    PlanFileError
        A wrong format or version, an unknown or missing field, a field of the wrong kind, a
        dependency naming an unknown task; the message names the field.
        ``fns`` naming a task that is not in the plan, or holding something not callable (field ``fns``).

    Examples
    --------
    >>> args = plan_arguments({"format": "swpipe-plan", "version": 2, "tasks": [{"name": "A", "stage": 1}]})
    >>> args["schedule"], args["pipeline_depth"], args["caller_group"]
    ({PipelineTask('A', unbound): TaskSchedule(stage=1, stream=None, thread_group='default', globally_ordered=False)}, None, 'default')
    >>> plan_arguments({"format": "swpipe-plan", "version": 2, "tasks": [{"name": "A"}], "caller_group": 3})
    Traceback (most recent call last):
    ...
    swpipe_core.planform.PlanFileError: plan: caller_group: 3 is not a string or null. Fix: name the thread group run on the caller's thread ("default"), or null for none
    """
    check_header(source, doc, PLAN_FORMAT, tuple(_TOP_BY_VERSION))
    check_keys(source, "top level", doc, _TOP_BY_VERSION[doc["version"]], {"tasks"})
    schedule = _schedule_from_dict(source, doc["tasks"])
    names = list(schedule)
    intra, inter, same = deps_from_dict(source, doc, names, ("intra_iter_deps", "inter_iter_deps", "same_period_deps"))
    order = doc.get("enqueue_order", _DEFAULT["enqueue_order"])
    if order is not None and not isinstance(order, list):
        raise PlanFileError(source, "enqueue_order", f"{order!r} is not a list or null",
                            "list every task name once in enqueue order, or null to use enqueue_policy", value=order)
    caller = doc.get("caller_group", _DEFAULT["caller_group"])
    if caller is not None and not isinstance(caller, str):
        raise PlanFileError(source, "caller_group", f"{caller!r} is not a string or null",
                            'name the thread group run on the caller\'s thread ("default"), or null for none',
                            value=caller)
    if fns:
        check_fns(fns, names, source)
    tasks = {n: PipelineTask(n, (fns or {}).get(n)) for n in names}
    return dict(schedule={tasks[n]: s for n, s in schedule.items()}, intra_iter_deps=intra, inter_iter_deps=inter,
                pipeline_depth=doc.get("pipeline_depth", _DEFAULT["pipeline_depth"]), enqueue_order=order,
                enqueue_policy=doc.get("enqueue_policy", _DEFAULT["enqueue_policy"]), caller_group=caller,
                same_period_deps=same)


_WORD = re.compile(r"[\w.:/+\-]+")
_TOKEN = re.compile(r'\s*(?:("(?:[^"\\]|\\.)*")|([^\s"\[\]=]+)|(=))(\[[^\]\s]*\])?')
_INTER = re.compile(r"\[i-(\d+)\]")
_NONE = {"caller_group": "none", "stream": "default"}  # the word that stands for None in a field
_TASK_LINE = "STAGE NAME [on GROUP] [stream STREAM] [global] [after DEP ...]"


class _Token(NamedTuple):
    word: str
    suffix: str  # a dependency's kind: "", "[i-N]", "[period]"
    quoted: bool  # written as a JSON string: a name, never the word standing for None


def _word(value: str, field: str = "") -> str:
    """``value`` as one token: bare when it is a plain word (and not the word standing for ``None``), else JSON."""
    plain = _WORD.fullmatch(value) is not None and value != _NONE.get(field)
    return value if plain else json.dumps(value)


def plan_to_text(plan: PipelinePlan) -> str:
    """A plan's text form: its fields on the first line, one line per task (the module docstring's grammar).

    ``str(plan)`` is this text, and ``PipelinePlan.from_text`` reads it back:
    ``PipelinePlan.from_text(str(plan)) == plan``.

    Parameters
    ----------
    plan : PipelinePlan

    Returns
    -------
    str
        Lines aligned in columns; the tasks in the schedule's order, each task's dependencies on its line.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"H2D": TaskSchedule(0, "memcpy", "io"), "Fwd": TaskSchedule(1, globally_ordered=True)},
    ...                     intra_iter_deps=[("Fwd", "H2D")], inter_iter_deps=[("H2D", "Fwd")])
    >>> print(plan_to_text(plan))
    plan depth=2 policy=ready_first caller=default
    0 H2D on io      stream memcpy         after Fwd[i-1]
    1 Fwd on default stream default global after H2D
    """
    doc = plan_to_dict(plan)
    head = " ".join(f"{f.keyword}={_field_word(doc[f.key], f.key)}" for f in PLAN_FIELDS if f.key != "enqueue_order")
    waits: Dict[str, List[str]] = {t["name"]: [] for t in doc["tasks"]}
    stray: List[str] = []
    for f in DEP_FIELDS:
        for dep in doc[f.key]:
            suffix = f.keyword.replace("N", str(dep[2])) if len(dep) > 2 else f.keyword
            waits.setdefault(dep[0], stray).append(_word(dep[1]) + suffix)
    columns = [[str(t["stage"]), _word(t["name"]), f"{_keyword('thread_group')} {_word(t['thread_group'])}",
                f"{_keyword('stream')} {_field_word(t['stream'], 'stream')}",
                _keyword("globally_ordered") if t["globally_ordered"] is True else "",
                " ".join(["after"] + waits[t["name"]]) if waits[t["name"]] else ""] for t in doc["tasks"]]
    widths = [max((len(row[k]) for row in columns), default=0) for k in range(len(columns[0]) if columns else 0)]
    lines = [f"plan {head}"]
    for row in columns:
        lines.append(" ".join(cell.rjust(w) if k == 0 else cell.ljust(w)
                              for k, (cell, w) in enumerate(zip(row, widths)) if w).rstrip())
    if doc["enqueue_order"] is not None:
        lines.append(" ".join([_keyword("enqueue_order")] + [_word(n) for n in doc["enqueue_order"]]))
    if stray:
        lines.append("# dependencies of tasks not in the schedule: " + " ".join(stray))
    return "\n".join(lines)


def _keyword(key: str) -> str:
    return next(f.keyword for f in PLAN_FIELDS + TASK_FIELDS if f.key == key)


def _field_word(value: object, field: str) -> str:
    if value is None:
        return _NONE.get(field, "none")
    return _word(value, field) if isinstance(value, str) else str(value)


def text_to_dict(text: str, source: str = "plan text") -> Tuple[Dict[str, Any], Dict[str, int]]:
    """The dict form of a plan's text form (its form unchecked: :func:`plan_arguments` checks it) and the line of
    each field path (``""``: the first line, ``"task NAME"``: a task's line).

    Parameters
    ----------
    text : str
        The text form (the module docstring's grammar).
    source : str
        Where ``text`` came from, named in errors.

    Returns
    -------
    (dict, dict)
        The dict form, and ``{field path: line}`` (1-based).

    Raises
    ------
    PlanFileError
        A line that does not parse; ``line`` and ``field`` say where.

    Examples
    --------
    >>> doc, lines = text_to_dict("plan depth=2\\n0 Load on io\\n1 Step after Load")
    >>> doc["tasks"][0], doc["intra_iter_deps"], lines["task Step"]
    ({'name': 'Load', 'stage': 0, 'thread_group': 'io'}, [['Step', 'Load']], 3)
    """
    doc: Dict[str, Any] = {"format": PLAN_FORMAT, "version": PLAN_VERSION, "tasks": [],
                           **{f.key: [] for f in DEP_FIELDS}}
    where: Dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        tokens = _tokens(raw, source, number)
        if "" not in where:
            _read_head(tokens, doc, source, number)
            where[""] = number
            where.update({f.key: number for f in PLAN_FIELDS})
        elif tokens[0].word == _keyword("enqueue_order") and not tokens[0].quoted:
            doc["enqueue_order"] = [_plain(t, source, number, "enqueue_order") for t in tokens[1:]]
            where["enqueue_order"] = number
        else:
            _read_task(tokens, doc, where, source, number)
    if "" not in where:
        raise PlanFileError(source, "", "the text is empty", "start with a line 'plan depth=N ...', then one line "
                            "per task", line=1)
    return doc, where


def _tokens(line: str, source: str, number: int) -> List[_Token]:
    """The tokens of a line; a JSON string is unquoted, ``=`` is a token of its own."""
    out, pos = [], 0
    while pos < len(line.rstrip()):
        match = _TOKEN.match(line, pos)
        if match is None or match.end() == pos:
            raise PlanFileError(source, "", f"cannot read {line[pos:].strip()!r}",
                                "write names as plain words or JSON strings", line=number)
        quoted, bare, equals, suffix = match.groups()
        try:
            word = json.loads(quoted) if quoted else (bare or equals)
        except ValueError:
            raise PlanFileError(source, "", f"{quoted} is not a JSON string", 'write "a name" with \\" for a quote',
                                line=number) from None
        out.append(_Token(word, suffix or "", quoted is not None))
        pos = match.end()
    return out


def _plain(token: _Token, source: str, number: int, field: str) -> str:
    if token.suffix:
        raise PlanFileError(source, field, f"{token.word}{token.suffix} has a suffix here", "write the name alone",
                            line=number, value=token.word + token.suffix)
    return token.word


def _or_none(token: _Token, field: str, source: str, number: int) -> Optional[str]:
    word = _plain(token, source, number, field)
    return None if word == _NONE[field] and not token.quoted else word


def _read_head(tokens: List[_Token], doc: Dict[str, Any], source: str, number: int) -> None:
    """The first line: ``plan keyword=value ...``."""
    fields = {f.keyword: f.key for f in PLAN_FIELDS if f.key != "enqueue_order"}
    if tokens[0].word != "plan" or tokens[0].quoted:
        raise PlanFileError(source, "", f"the first line starts with {tokens[0].word!r}, not 'plan'",
                            f"start with 'plan {' '.join(k + '=...' for k in fields)}'", line=number)
    rest = tokens[1:]
    while rest:
        if len(rest) < 3 or rest[1].word != "=" or rest[0].word not in fields:
            raise PlanFileError(source, "", f"{rest[0].word!r} is not keyword=value of a plan field",
                                f"the first line takes {', '.join(k + '=...' for k in fields)}", line=number,
                                value=rest[0].word)
        key = fields[rest[0].word]
        if key == "pipeline_depth":
            word = _plain(rest[2], source, number, key)
            if not word.isdigit():
                raise PlanFileError(source, key, f"depth {word!r} is not an integer", "write depth=N with N >= 1",
                                    line=number, value=word)
            doc[key] = int(word)
        else:
            doc[key] = _or_none(rest[2], key, source, number) if key in _NONE else _plain(rest[2], source, number, key)
        rest = rest[3:]


def _read_task(tokens: List[_Token], doc: Dict[str, Any], where: Dict[str, int], source: str,
               number: int) -> None:
    """A task line: ``STAGE NAME [on GROUP] [stream STREAM] [global] [after DEP ...]``."""
    j = len(doc["tasks"])
    field = f"tasks[{j}]"
    if not tokens[0].word.isdigit() or tokens[0].suffix:
        raise PlanFileError(source, f"{field}.stage", f"{tokens[0].word!r} is not a stage",
                            f"a task line is {_TASK_LINE}", line=number, value=tokens[0].word)
    if len(tokens) < 2:
        raise PlanFileError(source, f"{field}.name", "the task has no name", f"a task line is {_TASK_LINE}",
                            line=number)
    name = _plain(tokens[1], source, number, field)
    entry: Dict[str, Any] = {"name": name, "stage": int(tokens[0].word)}
    where[field] = where[f"task {name}"] = number
    rest = tokens[2:]
    keywords = {f.keyword: f.key for f in TASK_FIELDS if f.keyword}
    while rest:
        word = _plain(rest[0], source, number, field)
        key = keywords.get(word)
        if key == "globally_ordered":
            entry[key], rest = True, rest[1:]
        elif key is not None and len(rest) > 1:
            entry[key] = _or_none(rest[1], key, source, number) if key in _NONE \
                else _plain(rest[1], source, number, field)
            rest = rest[2:]
        elif key is not None:
            raise PlanFileError(source, field, f"{word!r} has no value", f"write {word} and its value, e.g. {word} "
                                f"{_DEFAULT[key] or 'default'}", line=number, task=name, value=word)
        elif word == "after":
            for dep in rest[1:]:
                _read_dep(dep, name, doc, where, source, number, field)
            rest = []
        else:
            raise PlanFileError(source, field, f"{word!r} is not a field of a task line", f"a task line is {_TASK_LINE}",
                                line=number, task=name, value=word)
    doc["tasks"].append(entry)


def _read_dep(dep: _Token, task: str, doc: Dict[str, Any], where: Dict[str, int], source: str,
              number: int, field: str) -> None:
    word, suffix = dep.word, dep.suffix
    inter = _INTER.fullmatch(suffix)
    if not suffix:
        key, entry = "intra_iter_deps", [task, word]
    elif inter is not None:
        key, entry = "inter_iter_deps", [task, word, int(inter.group(1))]
    elif suffix == "[period]":
        key, entry = "same_period_deps", [task, word]
    else:
        raise PlanFileError(source, field, f"dependency {word}{suffix}: {suffix} is not a kind of dependency",
                            "write X (same iteration), X[i-N] (N iterations back) or X[period] (same period)",
                            line=number, task=task, value=word + suffix)
    where[f"{key}[{len(doc[key])}]"] = number
    doc[key].append(entry)


def check_header(source: str, doc: Any, fmt: str = PLAN_FORMAT, versions: Sequence[int] = (1, 2)) -> None:
    """Raise :class:`PlanFileError` unless ``doc`` is a dict of format ``fmt`` in one of ``versions``.

    Examples
    --------
    >>> check_header("p.json", {"format": "swpipe-plan", "version": 9})
    Traceback (most recent call last):
    ...
    swpipe_core.planform.PlanFileError: p.json: version: version 9 is not supported (this swpipe reads 1, 2). Fix: re-save the file with this swpipe
    """
    if not isinstance(doc, dict):
        raise PlanFileError(source, "", f"top level is {type(doc).__name__}, not an object",
                            f'the file holds one JSON object {{"format": "{fmt}", "version": {max(versions)}, ...}}')
    if doc.get("format") != fmt:
        raise PlanFileError(source, "format", f"format is {doc.get('format')!r}, expected {fmt!r}",
                            f"load a {fmt} file (save_plan writes swpipe-plan, save_task_graph swpipe-task-graph)",
                            value=doc.get("format"))
    version = doc.get("version")
    if isinstance(version, bool) or version not in versions:
        raise PlanFileError(source, "version", f"version {version!r} is not supported (this swpipe reads "
                            f"{', '.join(map(str, versions))})", "re-save the file with this swpipe", value=version)


def _schedule_from_dict(source: str, entries: Any) -> Dict[str, TaskSchedule]:
    """``{name: TaskSchedule}`` of the ``tasks`` field (kinds of the values are left to ``validate``)."""
    if not isinstance(entries, list) or not entries:
        raise PlanFileError(source, "tasks", f"{entries!r} is not a non-empty list",
                            'write "tasks": [{"name": "H2D", "stage": 0}, ...]', value=entries)
    schedule: Dict[str, TaskSchedule] = {}
    for j, entry in enumerate(entries):
        where = f"tasks[{j}]"
        check_keys(source, where, entry, _TASK, {"name"})
        name = entry["name"]
        if not isinstance(name, str) or not name:
            raise PlanFileError(source, where, f"name {name!r} is not a non-empty string",
                                "give every task a non-empty string name", value=name)
        if name in schedule:
            raise PlanFileError(source, where, f"task {name!r} appears twice", "give every task a unique name",
                                task=name, value=name)
        schedule[name] = TaskSchedule(**{f.key: entry.get(f.key, f.default) for f in TASK_FIELDS if f.key != "name"})
    return schedule


def check_keys(source: str, where: str, obj: Any, allowed: set, required: set) -> None:
    """Raise :class:`PlanFileError` unless ``obj`` is a dict with only ``allowed`` keys and every ``required`` one.

    Examples
    --------
    >>> check_keys("p.json", "tasks[0]", {"name": "A", "speed": 1}, {"name", "stage"}, {"name"})
    Traceback (most recent call last):
    ...
    swpipe_core.planform.PlanFileError: p.json: tasks[0]: unknown field(s) ['speed']. Fix: allowed fields: ['name', 'stage']
    """
    if not isinstance(obj, dict):
        raise PlanFileError(source, where, f"{obj!r} is not an object", f"write {where} as a JSON object {{...}}")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise PlanFileError(source, where, f"unknown field(s) {unknown}", f"allowed fields: {sorted(allowed)}",
                            value=unknown)
    missing = sorted(required - set(obj))
    if missing:
        raise PlanFileError(source, where, f"missing field(s) {missing}", f"add {missing} to {where}", value=missing)


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
    swpipe_core.planform.PlanFileError: g: same_period_deps[0]: names unknown task 'C'. Fix: tasks are ['A', 'B']
    """
    return [_deps(source, field, doc.get(field, []), set(names), names) for field in fields]


def _deps(source: str, field: str, deps: Any, known: set, names: Sequence[str]) -> List[Tuple]:
    sizes = _DEPS[field]
    if not isinstance(deps, list):
        raise PlanFileError(source, field, f"{deps!r} is not a list",
                            f'write "{field}": [[task, depends_on], ...] (or [] for none)', value=deps)
    parsed = []
    for j, dep in enumerate(deps):
        where = f"{field}[{j}]"
        if not isinstance(dep, list) or len(dep) not in sizes:
            raise PlanFileError(source, where, f"{dep!r} is not a list of {' or '.join(map(str, sizes))} items",
                                "write [task, depends_on]" + (" or [task, depends_on, N]" if 3 in sizes else ""),
                                value=dep)
        for end in dep[:2]:
            if end not in known:
                raise PlanFileError(source, where, f"names unknown task {end!r}", f"tasks are {list(names)}",
                                    task=dep[0] if dep[0] in known else None, value=end)
        if len(dep) == 3 and (not isinstance(dep[2], int) or isinstance(dep[2], bool) or dep[2] < 1):
            raise PlanFileError(source, where, f"distance {dep[2]!r} is not an integer >= 1",
                                "use N >= 1 iterations back; a same-iteration dependency goes in intra_iter_deps",
                                task=dep[0], value=dep[2])
        parsed.append(tuple(dep))
    return parsed


def check_fns(fns: Mapping[str, Any], names: Sequence[str], source: str = "") -> None:
    """Raise :class:`PlanFileError` (field ``fns``) unless every entry of ``fns`` names one of the tasks ``names``
    and is callable.

    Examples
    --------
    >>> check_fns({"C": print}, ["A", "B"], "p.json")
    Traceback (most recent call last):
    ...
    swpipe_core.planform.PlanFileError: p.json: fns: names task(s) ['C'] that are not in the plan. Fix: tasks are ['A', 'B']
    """
    unknown = sorted(set(fns) - set(names))
    if unknown:
        raise PlanFileError(source, "fns", f"names task(s) {unknown} that are not in the plan",
                            f"tasks are {list(names)}", value=unknown)
    bad = sorted(k for k, v in fns.items() if not callable(v))
    if bad:
        raise PlanFileError(source, "fns", f"fns[{bad[0]!r}] is not callable", "give a function of the context",
                            task=bad[0], value=fns[bad[0]])
