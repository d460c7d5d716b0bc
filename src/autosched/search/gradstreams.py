"""No gradient freed on another stream than the one that made it: the search's check and repair of a stream map.

On CUDA, a task that frees gradients (``zero_grad(set_to_none=True)``) on a stream
other than the backward's that allocated them hands their memory back to that
backward's stream at once, and its next backward may reuse it while the freeing
stream still reads it (docs/semantics.md, "Lifetimes on CUDA"). The searchers
place streams by cost alone, so after they chose, :func:`guard_found` records who
makes and frees gradients (:func:`swpipe_core.dataflow.grads.record_grads`, one
serial iteration on the user's ``state`` and first batch, put back afterwards)
and moves each such freer onto its makers' stream, in the chosen plan and in
every candidate the verification measures, so every figure the report gives is
of a repaired plan. Without ``state`` or ``batches`` it says the plan was not
checked.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan, ref_name
from swpipe_core.validate import validate

__all__ = ["record_for", "repair_plan", "guard_found", "frozen_overrides"]


def _streams(plan: PipelinePlan) -> set:
    return {plan.sched(n).stream for n in plan.task_names}


def _stream_name(stream: Any) -> str:
    return "the default stream" if stream is None else f"stream {stream!r}"


def record_for(plan: PipelinePlan, c: Any, state: Any, batches: Optional[Sequence[Any]]) -> Tuple[Any, List[str]]:
    """The gradient traffic to check ``plan``'s candidates against, or None, and the notes saying why not.

    Parameters
    ----------
    plan : PipelinePlan
        Any candidate (they share the tasks and dependencies).
    c : Constraints
        Only a ``device="cuda"`` search is checked.
    state, batches
        As for :func:`autosched.search.autoschedule.auto_schedule`; the first batch is run once.

    Returns
    -------
    (GradTraffic or None, list of str)
    """
    if c.device != "cuda" or len(set(c.streams or ()) | _streams(plan)) < 2:
        return None, []
    if state is None or not batches or not all(callable(t.fn) for t in plan.tasks):
        if len(_streams(plan)) < 2:
            return None, []
        return None, ["streams not checked for cross-stream gradient frees: pass state=[model, optimizer] and "
                      "batches= (with runnable tasks) to have the search record which tasks make and free gradients "
                      "and keep each freer on its makers' stream"]
    from swpipe_core.dataflow.grads import record_grads

    return record_grads(plan, list(batches)[0], state), []


def repair_plan(plan: PipelinePlan, traffic: Any) -> Tuple[PipelinePlan, List[str]]:
    """Move every task that frees gradients onto the stream of the tasks that made them.

    Parameters
    ----------
    plan : PipelinePlan
    traffic : GradTraffic
        From :func:`swpipe_core.dataflow.grads.record_grads`.

    Returns
    -------
    (PipelinePlan, list of str)
        The repaired plan (validated; ``plan`` itself when nothing moved) and a note per move or per freer that
        could not be moved (its makers run on several streams, or the moved plan breaks a rule).

    Examples
    --------
    >>> from swpipe_core.dataflow.grads import GradTraffic
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"Backward": TaskSchedule(0, "bwd"), "Step": TaskSchedule(1, "opt")},
    ...                     intra_iter_deps=[("Step", "Backward")])
    >>> fixed, notes = repair_plan(plan, GradTraffic(("Backward",), ("Step",), {"Step": ("Backward",)}))
    >>> fixed.sched("Step").stream, fixed.stage("Step")
    ('bwd', 1)
    """
    notes: List[str] = []
    for freer, makers in traffic.frees.items():
        homes = {plan.sched(m).stream for m in makers}
        if not makers or plan.sched(freer).stream in homes:
            continue
        if len(homes) > 1:
            notes.append(f"{freer} frees gradients made on several streams ({', '.join(makers)}); not repaired: "
                         "the engine keeps them alive only with SWPipeline(plan, state=[model, optimizer])")
            continue
        (home,) = homes
        schedule = {k: (dataclasses.replace(v, stream=home) if ref_name(k) == freer else v)
                    for k, v in plan.schedule.items()}
        moved = plan.replace(schedule=schedule, pipeline_depth=plan.pipeline_depth)
        try:
            validate(moved)
        except Exception as exc:  # noqa: BLE001 - a rule the move breaks: keep the plan, say so
            notes.append(f"{freer} frees gradients {', '.join(makers)} make(s) on {_stream_name(home)} but could "
                         f"not be moved there ({exc})")
            continue
        notes.append(f"{freer} moved to {_stream_name(home)}: it frees gradients {', '.join(makers)} make(s) on "
                     f"{_stream_name(home)}; freeing them on {_stream_name(plan.sched(freer).stream)} lets the caching "
                     "allocator reuse them while that stream still reads them")
        plan = moved
    return plan, notes


def frozen_overrides(c: Any, before: PipelinePlan, after: PipelinePlan) -> List[str]:
    """A note per task whose stream ``Constraints(frozen=...)`` fixed and the repair moved.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> from swpipe_core.plan import TaskSchedule
    >>> before = PipelinePlan({"Backward": TaskSchedule(0), "Step": TaskSchedule(0, "side")})
    >>> after = PipelinePlan({"Backward": TaskSchedule(0), "Step": TaskSchedule(0)})
    >>> frozen_overrides(SimpleNamespace(frozen={"Step": {"stream": "side"}}), before, after)
    ["Step: Constraints(frozen=...) put it on stream 'side'; the gradient repair overrides that"]
    """
    notes = []
    for task, choice in c.frozen.items():
        name = ref_name(task)
        wanted = choice.get("stream", ...) if isinstance(choice, dict) else getattr(choice, "stream", ...)
        if wanted is not ... and name in after.task_names and after.sched(name).stream != before.sched(name).stream:
            notes.append(f"{name}: Constraints(frozen=...) put it on {_stream_name(wanted)}; the gradient repair "
                         "overrides that")
    return notes


def guard_found(found: Any, traffic: Any) -> Any:
    """The searchers' result with its plan and its verification candidates repaired (:func:`repair_plan`).

    Parameters
    ----------
    found : autosched.search.found.Found
    traffic : GradTraffic or None
        None: ``found`` as is.

    Returns
    -------
    Found
        A copy: a moved plan re-scored by ``found.scorer``, the chosen plan's notes added to ``found.notes``.
    """
    if traffic is None:
        return found
    plan, notes = repair_plan(found.plan, traffic)
    pool = [(label, p if p is None else repair_plan(p, traffic)[0]) for label, p in found.pool]
    if plan is found.plan:
        return dataclasses.replace(found, pool=pool, notes=list(found.notes) + notes)
    period, latency = found.scorer(plan)
    return dataclasses.replace(found, plan=plan, period=period, latency=latency, pool=pool,
                               notes=list(found.notes) + notes)
