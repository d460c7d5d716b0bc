"""A plan's files and forms, the public entry point: the versioned schema for plan files, the plan ranks share,
a plan's identity, and the short text a plan prints as and parses from.

The forms themselves (their fields, writers, text reader and form checks) are in :mod:`swpipe_core.planform`,
below :mod:`swpipe_core.plan`, and every name of it is re-exported here; this module adds the readers that return
a validated plan, which build on :class:`~swpipe_core.plan.PipelinePlan` and :func:`~swpipe_core.validate.validate`:
:func:`plan_from_dict` (a file's or rank 0's dict form) and :func:`plan_from_text` (``PipelinePlan.from_text``).
The schema and the text form's grammar: :mod:`swpipe_core.planform`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from swpipe_core.plan import PipelinePlan
from swpipe_core.planform import (DEP_FIELDS, PLAN_FIELDS, PLAN_FORMAT, PLAN_VERSION, TASK_FIELDS, PlanFileError,
                                  check_fns, check_header, check_keys, deps_from_dict, plan_arguments, plan_to_dict,
                                  plan_to_text, text_to_dict)
from swpipe_core.validate import validate

__all__ = ["PLAN_FORMAT", "PLAN_VERSION", "PLAN_FIELDS", "TASK_FIELDS", "DEP_FIELDS", "PlanFileError",
           "plan_to_dict", "plan_from_dict", "plan_to_text", "plan_from_text", "check_header", "check_keys",
           "deps_from_dict", "check_fns", "plan_arguments", "text_to_dict"]


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
        dependency naming an unknown task; the message names the field (:func:`plan_arguments`).
        ``fns`` naming a task that is not in the plan, or holding something not callable (field ``fns``).
    swpipe_core.validate.PlanError
        The plan breaks a rule (a stage, a policy, the depth, the enqueue order).

    Examples
    --------
    >>> plan_from_dict({"format": "swpipe-plan", "version": 2, "tasks": [{"name": "A", "stage": "0"}]})
    Traceback (most recent call last):
    ...
    swpipe_core.validate.PlanError: [stage] stage of A is '0'; stages are integers >= 0 (tasks: A). Fix: set TaskSchedule(stage=k) with k >= 0 for A
    >>> plan_from_dict({"format": "swpipe-plan", "version": 2, "tasks": [{"name": "A"}], "caller_group": 3})
    Traceback (most recent call last):
    ...
    swpipe_core.planform.PlanFileError: plan: caller_group: 3 is not a string or null. Fix: name the thread group run on the caller's thread ("default"), or null for none
    """
    plan = PipelinePlan(**plan_arguments(doc, fns, source=source))
    validate(plan)
    return plan


def plan_from_text(text: str, fns: Optional[Mapping[str, Callable]] = None, *,
                   source: str = "plan text") -> PipelinePlan:
    """The plan a text form describes (:func:`plan_to_text`), validated.

    ``PipelinePlan.from_text`` as a function: the text is read into the dict form (:func:`text_to_dict`) and that
    through :func:`plan_arguments`, as :func:`plan_from_dict` reads it: both forms take the same fields and
    defaults, and a field the text leaves out takes its default.

    Parameters
    ----------
    text : str
        The text form (the module docstring's grammar).
    fns : dict, optional
        ``{task_name: fn}``; tasks without a function stay unbound (analysis only).
    source : str
        Where ``text`` came from, named in errors.

    Returns
    -------
    PipelinePlan

    Raises
    ------
    PlanFileError
        A line that does not parse, or a field the dict form refuses; ``line`` and ``field`` say where.
    swpipe_core.validate.PlanError
        The plan breaks a rule; ``line`` is the line of its task (or the first line for the plan's fields).

    Examples
    --------
    >>> from swpipe import PipelinePlan
    >>> plan = PipelinePlan.from_text('''
    ... plan depth=2
    ... 0 Load on io
    ... 1 Step after Load Step[i-1]
    ... ''')
    >>> plan.stage("Step"), plan.sched("Load").thread_group, plan.inter_edges()
    (1, 'io', [('Step', 'Step', 1)])
    >>> PipelinePlan.from_text(str(plan)) == plan
    True
    >>> PipelinePlan.from_text("plan\\n0 Load\\n1 Step after Lod")
    Traceback (most recent call last):
    ...
    swpipe_core.planform.PlanFileError: plan text, line 3: intra_iter_deps[0]: names unknown task 'Lod'. Fix: tasks are ['Load', 'Step']
    """
    return PipelinePlan.from_text(text, fns, source=source)
