"""Which plans the verification measures: the search's candidates, the known plans, the serial plan, each once.

The candidates are the search's pick (``"auto"``), the other searchers' bests
up to ``VerifyOptions.top``, every seed, the input plan (``"input"``) and the
serial plan (``"serial"``, :func:`serial_plan`: every task at stage 0 on one
thread group, the caller's; no overlap, what ``run_serial`` computes). Plans
that run alike on the engine (:func:`plan_key`) are measured once. Known plans
(:func:`is_known`: the seeds and the input plan) are what the user would run
without the search; the verification keeps one unless a searched plan beats
it measurably (:meth:`autosched.verify.measure.VerifyTable.choose`).
"""

from __future__ import annotations

import json
from typing import List, Optional, Sequence, Tuple

from swpipe_core.order import enqueue_order
from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.planfile import plan_to_dict

__all__ = ["serial_plan", "plan_key", "is_known", "search_candidates", "refit_candidates"]


def serial_plan(plan: PipelinePlan, group: str = "default") -> PipelinePlan:
    """The serial version of a plan: every task at stage 0 on one thread group and the device's default stream
    (as the serial loop, ``SWPipeline.run_serial``, runs them), same tasks and dependencies.

    Parameters
    ----------
    plan : PipelinePlan
    group : str
        The one thread group (the caller's group, so an engine that runs the
        caller's group inline starts no thread for it).

    Returns
    -------
    PipelinePlan

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> p = PipelinePlan({"A": TaskSchedule(0, thread_group="io"), "B": TaskSchedule(1, "s1", "compute")},
    ...                  intra_iter_deps=[("B", "A")])
    >>> s = serial_plan(p)
    >>> s.pipeline_depth, {s.sched(n).thread_group for n in s.task_names}, s.stream_of("B")
    (1, {'default'}, 'default')
    """
    sched = {k: TaskSchedule(0, None, group, v.globally_ordered) for k, v in plan.schedule.items()}
    return PipelinePlan(sched, list(plan.intra_iter_deps), list(plan.inter_iter_deps), enqueue_policy="ready_first",
                        caller_group=group, same_period_deps=list(plan.same_period_deps))


def is_known(label: str) -> bool:
    """Whether a candidate's label names a known plan (a seed, ``"seed..."``, or the input plan, ``"input"``):
    what the user would run without the search, kept unless measurably beaten
    (:meth:`autosched.verify.measure.VerifyTable.choose`).

    Examples
    --------
    >>> [is_known(label) for label in ("seed:prefetch", "input", "auto", "beam", "serial")]
    [True, True, False, False, False]
    """
    return label == "input" or label.startswith("seed")


def plan_key(plan: PipelinePlan) -> str:
    """What makes two plans run alike on the engine: the plan's dict form (:func:`~swpipe_core.planfile.plan_to_dict`)
    with its dependencies and tasks sorted and the enqueue order resolved (functions aside).

    Two plans with the same key are measured once. The order the plan declares
    its tasks and dependencies in, and whether its enqueue order is given or
    follows from its policy, change nothing the engine runs.

    Parameters
    ----------
    plan : PipelinePlan

    Returns
    -------
    str
        Comparable and hashable.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> a = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, intra_iter_deps=[("B", "A")])
    >>> plan_key(a) == plan_key(a.replace(pipeline_depth=2)), plan_key(a) == plan_key(serial_plan(a))
    (True, False)
    >>> plan_key(a) == plan_key(a.replace(enqueue_order=["A", "B"]))
    True
    """
    doc = plan_to_dict(plan)
    for deps in ("intra_iter_deps", "inter_iter_deps", "same_period_deps"):
        doc[deps] = sorted(doc[deps])
    doc["tasks"] = sorted(doc["tasks"], key=lambda t: t["name"])
    doc["enqueue_order"] = enqueue_order(plan)
    del doc["enqueue_policy"]  # what it decides is the enqueue order, resolved above
    return json.dumps(doc, sort_keys=True)


def search_candidates(plan: PipelinePlan, pool: Sequence[Tuple[str, Optional[PipelinePlan]]], top: int,
                      base: Optional[PipelinePlan]) -> List[Tuple[str, PipelinePlan]]:
    """The plans a verification measures after a search, each once: the search's pick, the others, the serial plan.

    Parameters
    ----------
    plan : PipelinePlan
        The search's pick, labelled ``"auto"``.
    pool : list of (label, plan or None)
        The other searchers' bests (measured up to ``top`` searched plans in
        all) and the seeds (``"seed..."``, all measured), best first.
    top : int
        Most searched plans measured, the search's pick included.
    base : PipelinePlan, optional
        The input plan (``"input"``), measured when every task is bound.

    Returns
    -------
    list of (label, PipelinePlan)
        Ending with ``("serial", serial_plan(plan))``.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> a = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, intra_iter_deps=[("B", "A")])
    >>> b = a.replace(schedule={"A": TaskSchedule(0, thread_group="io"), "B": TaskSchedule(1)})
    >>> [label for label, _ in search_candidates(a, [("beam", a), ("cpsat", b), ("seed:x", b)], 3, None)]
    ['auto', 'cpsat', 'serial']
    """
    cands: List[Tuple[str, PipelinePlan]] = [("auto", plan)]
    seen = {plan_key(plan)}
    searched = 1
    for label, other in pool:
        is_seed = label.startswith("seed")
        if other is None or (not is_seed and searched >= top):
            continue
        if plan_key(other) not in seen:
            searched += 0 if is_seed else 1
            seen.add(plan_key(other))
            cands.append((label, other))
    if base is not None and not base.unbound_tasks() and plan_key(base) not in seen:
        cands.append(("input", base))
    cands.append(("serial", serial_plan(plan)))
    return cands


def refit_candidates(chosen: Tuple[str, PipelinePlan], refit: PipelinePlan,
                     serial: PipelinePlan) -> List[Tuple[str, PipelinePlan]]:
    """The plans a refit round measures: the first verification's choice, the refitted search's plan, the serial plan.

    Parameters
    ----------
    chosen : (label, PipelinePlan)
        What the first verification chose.
    refit : PipelinePlan
        The plan the search found with the refitted model (``"refit"``).
    serial : PipelinePlan
        The serial plan the first verification measured (left out when it is the choice).

    Returns
    -------
    list of (label, PipelinePlan)

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> a = PipelinePlan({"A": TaskSchedule(0)})
    >>> [label for label, _ in refit_candidates(("serial", a), a, a)]
    ['serial', 'refit']
    """
    cands = [chosen, ("refit", refit)]
    if chosen[0] != "serial":
        cands.append(("serial", serial))
    return cands
