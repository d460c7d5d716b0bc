"""Which plans the drop-in runs, and how a plan is made runnable for a TorchRec model.

:data:`TORCHREC_CLASSES` maps each plan name of :mod:`swpipe_core.pipelines`
the drop-in runs to the TorchRec class it stands for; :data:`UNSUPPORTED`
says for every other name why not. :func:`runnable` turns any plan over the
drop-in's task names into one the drop-in can drive: bound to the model's
task functions, its forward on the caller's thread (so ``progress`` returns
with the batch's output computed), its collectives globally ordered on
several ranks.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from autosched.search.options import Constraints
from swpipe_core import pipelines
from swpipe_core.order import hand_off_after as _hand_off_after
from swpipe_core.plan import PipelinePlan
from swpipe_core.engine.workers import with_thread_map

from swpipe.torchrec.tasks import COLLECTIVE_TASKS, MODE_TASKS, TASK_NAMES

__all__ = ["TORCHREC_CLASSES", "CLASS_NOTES", "UNSUPPORTED", "named_plan", "runnable", "check_shape",
           "at_depth"]

#: plan name -> the TorchRec class whose ``progress()`` it schedules (checked equal in tests/test_torchrec_dropin.py)
TORCHREC_CLASSES: Dict[str, str] = {
    "base": "TrainPipelineBase",
    "sparse_dist": "TrainPipelineSparseDist",
    "sparse_dist_lite": "TrainPipelineSparseDistLite",
    "fused_sparse_dist": "TrainPipelineFusedSparseDist",
    "semi_sync": "TrainPipelineSemiSync",
    "sparse_dist_t": "TrainPipelineSparseDistT",
}

#: where a plan is TorchRec's class only in part (said in the pipeline's report)
CLASS_NOTES: Dict[str, str] = {
    "semi_sync": "as TorchRec runs it before start_batch (900 by default): the lookup of batch i+1 after the "
                 "embedding update of batch i; TorchRec's stale lookup from start_batch on is not reproduced",
}

#: the other names of swpipe_core.pipelines, and why the drop-in does not run them
UNSUPPORTED: Dict[str, str] = {
    "pt2": "TrainPipelinePT2 compiles the model and transforms its input (LoadBatch, InputTransform): not the "
           "tasks of a sharded model's input distribution",
    "prefetch": "PrefetchTrainPipelineSparseDist needs embedding modules with a prefetching cache (UVM caching "
                "kernels, GPU only)",
    "eval_sparse_dist": "for evaluation call model.eval() between progress() calls: any training plan then runs the "
                        "forward only",
    "eval_fused_sparse_dist": "for evaluation call model.eval() between progress() calls: plan='fused_sparse_dist' "
                              "then runs the forward only",
    "staged": "StagedTrainPipeline runs the user's own stages, not a model's tasks",
    "sparse_dist_comp_autograd": "compiled autograd is not wired into the drop-in's backward yet; "
                                 "plan='sparse_dist' runs the same schedule eagerly",
}


def named_plan(name: str, **factory_options: Any) -> PipelinePlan:
    """The unbound plan ``name`` (a key of :data:`TORCHREC_CLASSES`), with the factory's options.

    Raises
    ------
    ValueError
        A name the drop-in does not run (why, and what to use), or an unknown name (the known ones listed).

    Examples
    --------
    >>> named_plan("sparse_dist").pipeline_depth
    3
    >>> named_plan("prefetch")
    Traceback (most recent call last):
    ...
    ValueError: plan='prefetch' is not run by swpipe.torchrec: PrefetchTrainPipelineSparseDist needs embedding modules with a prefetching cache (UVM caching kernels, GPU only); use one of base, sparse_dist, sparse_dist_lite, fused_sparse_dist, semi_sync, sparse_dist_t, 'auto' or a PipelinePlan
    """
    key = name.strip().lower().replace("-", "_")
    choices = f"use one of {', '.join(TORCHREC_CLASSES)}, 'auto' or a PipelinePlan"
    if key in UNSUPPORTED:
        raise ValueError(f"plan={name!r} is not run by swpipe.torchrec: {UNSUPPORTED[key]}; {choices}")
    if key not in TORCHREC_CLASSES:
        raise ValueError(f"unknown plan {name!r}; {choices}")
    return pipelines.get(key, **factory_options)


def check_shape(plan: PipelinePlan) -> None:
    """Raise unless the drop-in can drive ``plan``: its tasks are known and its forward is in the last stage.

    ``progress()`` returns the output of the batch whose forward ran in its
    period, in the mode the model was in when the call began; so the forward
    and the tasks that depend on the mode (:data:`~swpipe.torchrec.tasks.MODE_TASKS`)
    run in the last stage, where a batch's ``progress`` call runs them.

    Raises
    ------
    ValueError
        Naming the tasks and the fix.

    Examples
    --------
    >>> from swpipe_core.plan import TaskSchedule
    >>> check_shape(PipelinePlan({"H2D": TaskSchedule(0), "Forward": TaskSchedule(0), "Backward": TaskSchedule(1)},
    ...                          [("Forward", "H2D"), ("Backward", "Forward")]))
    Traceback (most recent call last):
    ...
    ValueError: swpipe.torchrec runs a plan whose Forward, Backward, EmbBackward, OptimizerStep are in its last stage (1, where progress() runs the batch it returns); this plan puts Forward at stage 0. Move them to stage 1 or drop the later stages
    """
    unknown = [n for n in plan.task_names if n not in TASK_NAMES]
    if unknown:
        raise ValueError(f"the plan has task(s) {unknown} the drop-in has no function for; a plan for a TorchRec "
                         f"model uses {', '.join(TASK_NAMES)}")
    if "Forward" not in plan.task_names:
        raise ValueError("the plan has no Forward task: swpipe.torchrec returns the output of each batch's Forward")
    last = plan.pipeline_depth - 1
    early = [f"{n} at stage {plan.stage(n)}" for n in MODE_TASKS if n in plan.task_names and plan.stage(n) != last]
    if early:
        raise ValueError(f"swpipe.torchrec runs a plan whose {', '.join(MODE_TASKS)} are in its last stage ({last}, "
                         f"where progress() runs the batch it returns); this plan puts {', '.join(early)}. Move them "
                         f"to stage {last} or drop the later stages")


def at_depth(constraints: Constraints, names: Any, depth: int, caller_group: Optional[str] = "default") -> Constraints:
    """``constraints`` for a search at ``depth`` whose answer the drop-in can drive as it was predicted.

    The plan may be ``depth`` stages deep at most, and the forward and the tasks after it
    (:data:`~swpipe.torchrec.tasks.MODE_TASKS`, those of ``names``) are frozen in its last stage, ``depth - 1``
    (their stream as ``constraints.frozen`` says). The forward's thread group is frozen to ``caller_group``, the
    searched plan's caller group, unless ``constraints.frozen`` names one: the drop-in runs the forward's group
    on the caller's thread (:func:`runnable`), and a search that put another group there would predict a period
    the drop-in does not run (the caller hands the other groups' tasks off in its own order). ``plan="auto"``
    searches at each depth with it, re-planning at the running plan's depth.

    Examples
    --------
    >>> c = at_depth(Constraints(frozen={"Forward": {"stream": None}}), ["H2D", "Forward", "Backward"], 3)
    >>> c.max_depth, c.frozen["Forward"], c.frozen["Backward"]
    (3, {'stream': None, 'stage': 2, 'thread_group': 'default'}, {'stage': 2})
    >>> at_depth(Constraints(frozen={"Forward": {"thread_group": "main"}}), ["Forward"], 2).frozen["Forward"]
    {'thread_group': 'main', 'stage': 1}
    """
    frozen = dict(constraints.frozen)
    frozen.update({t: {**dict(frozen.get(t, {})), "stage": depth - 1} for t in MODE_TASKS if t in set(names)})
    if "Forward" in frozen and caller_group is not None:
        frozen["Forward"].setdefault("thread_group", caller_group)
    return dataclasses.replace(constraints, max_depth=depth, frozen=frozen)


def runnable(plan: PipelinePlan, fns: Dict[str, Any], world_size: int = 1, thread_map: Optional[str] = None,
             hand_off_after: Optional[str] = None) -> PipelinePlan:
    """``plan`` bound to ``fns``, ready for the drop-in's engine.

    The thread map applies first (``"by_stream"``: one thread per stream);
    then the caller's group becomes Forward's thread group (the engine runs
    that group's tasks inline, so ``progress`` returns with the forward done),
    and on several ranks every task of :data:`~swpipe.torchrec.tasks.COLLECTIVE_TASKS`
    is globally ordered (one issue order on every rank).

    Examples
    --------
    >>> plan = runnable(named_plan("sparse_dist"), {}, world_size=2, thread_map="by_stream")
    >>> plan.caller_group, plan.sched("H2D").thread_group, plan.sched("InputDistWait").globally_ordered
    ('default', 'memcpy', True)
    """
    check_shape(plan)
    if thread_map:
        plan = with_thread_map(plan, thread_map)
    if hand_off_after is not None:
        plan = plan.replace(enqueue_order=_hand_off_after(plan, hand_off_after), pipeline_depth=plan.pipeline_depth)
    group = plan.sched("Forward").thread_group
    if plan.caller_group != group:
        plan = plan.replace(caller_group=group, pipeline_depth=plan.pipeline_depth)
    if world_size > 1:
        schedule = {k: dataclasses.replace(v, globally_ordered=True) if plan.task(k).name in COLLECTIVE_TASKS else v
                    for k, v in plan.schedule.items()}
        plan = plan.replace(schedule=schedule, pipeline_depth=plan.pipeline_depth)
    return plan.bind(fns) if fns else plan
