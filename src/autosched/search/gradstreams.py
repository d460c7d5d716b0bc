"""No gradient freed on another stream than the one that allocated it: the search's check and repair of a stream map.

On CUDA a gradient is allocated on the stream of the forward op whose backward
produced it (each backward op runs on its forward op's stream), not on the stream
of the task that calls ``backward()``. A task that frees gradients
(``zero_grad(set_to_none=True)``) on another stream hands their memory back to
that allocating stream's pool at once, and the next allocation there may reuse it
while the freeing stream still reads it (docs/semantics.md, "Lifetimes on CUDA").
The searchers place streams by cost alone, so after they chose, :func:`guard_found`
records who allocates and frees gradients (:func:`swpipe_core.dataflow.grads.record_grads`,
two serial iterations on the user's ``state`` and first batch, put back afterwards)
and moves each such freer onto the stream of the tasks whose forward ops allocate
them, in the chosen plan and in every candidate the verification measures, so
every figure the report gives is of a repaired plan. Without ``state`` or
``batches`` it says the plan was not checked.
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
        As for :func:`autosched.search.entry.auto_schedule`; the first batch is run once.

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
                      "batches= (with runnable tasks) to have the search record which tasks allocate and free "
                      "gradients and keep each freer on the stream where its gradients are allocated"]
    from swpipe_core.dataflow.grads import record_grads

    return record_grads(plan, list(batches)[0], state), []


def repair_plan(plan: PipelinePlan, traffic: Any) -> Tuple[PipelinePlan, List[str]]:
    """Move every task that frees gradients onto the stream where those gradients were allocated.

    That is the stream of the tasks whose forward ops allocate them (``traffic.allocators``), which need not be
    the stream of the task that calls ``backward()`` (``traffic.frees``, the makers).

    Parameters
    ----------
    plan : PipelinePlan
    traffic : GradTraffic
        From :func:`swpipe_core.dataflow.grads.record_grads`.

    Returns
    -------
    (PipelinePlan, list of str)
        The repaired plan (validated; ``plan`` itself when nothing moved) and a note per move or per freer that
        could not be moved (its gradients were allocated on several streams, or the moved plan breaks a rule).

    Examples
    --------
    Forward's ops run on ``fwd``, so the gradients Backward makes (on the default stream) live in ``fwd``'s pool:

    >>> from swpipe_core.dataflow.grads import GradTraffic
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"Forward": TaskSchedule(0, "fwd"), "Backward": TaskSchedule(0),
    ...                      "Step": TaskSchedule(1, "opt")},
    ...                     intra_iter_deps=[("Backward", "Forward"), ("Step", "Backward")])
    >>> traffic = GradTraffic(("Backward",), ("Step",), {"Step": ("Backward",)}, {"Step": ("Forward",)})
    >>> fixed, notes = repair_plan(plan, traffic)
    >>> fixed.sched("Step").stream, fixed.stage("Step")
    ('fwd', 1)
    """
    notes: List[str] = []
    for freer in traffic.freers:
        allocators = traffic.allocators.get(freer) or traffic.frees.get(freer, ())
        homes = {plan.sched(m).stream for m in allocators}
        if not allocators or plan.sched(freer).stream in homes:
            continue
        if len(homes) > 1:
            notes.append(f"{freer} frees gradients allocated on several streams (by {', '.join(allocators)}); not "
                         "repaired: the engine keeps them alive only with SWPipeline(plan, state=[model, optimizer])")
            continue
        (home,) = homes
        schedule = {k: (dataclasses.replace(v, stream=home) if ref_name(k) == freer else v)
                    for k, v in plan.schedule.items()}
        moved = plan.replace(schedule=schedule, pipeline_depth=plan.pipeline_depth)
        try:
            validate(moved)
        except Exception as exc:  # noqa: BLE001 - a rule the move breaks: keep the plan, say so
            notes.append(f"{freer} frees gradients allocated on {_stream_name(home)} (by the forward ops of "
                         f"{', '.join(allocators)}) but could not be moved there ({exc})")
            continue
        notes.append(f"{freer} moved to {_stream_name(home)}: it frees gradients allocated there (by the forward "
                     f"ops of {', '.join(allocators)}; backward runs each op on its forward op's stream); freeing "
                     f"them on {_stream_name(plan.sched(freer).stream)} lets the caching allocator reuse them while "
                     "that stream still reads them")
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
    found : autosched.search.phases.Found
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
