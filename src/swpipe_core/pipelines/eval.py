"""TorchRec's evaluation pipelines as plans: no backward, no optimizer step."""

from __future__ import annotations

from typing import Optional

from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.pipelines._build import TaskFns, make_plan
from swpipe_core.pipelines.train import _fused_schedule

__all__ = ["eval_sparse_dist", "eval_fused_sparse_dist"]


def eval_sparse_dist(fns: TaskFns = None, order: Optional[str] = None) -> PipelinePlan:
    """EvalPipelineSparseDist: 2 stages, H2D on a background loader thread.

    Depth 2, streams ``memcpy``, ``data_dist`` and default, two threads: H2D
    runs on thread group ``"loader"`` (TorchRec's DataLoadingThread), the rest
    on ``"default"``. TorchRec fixes the schedule (which task runs at which stage, on
    which stream and thread) but declares no dependencies; assumed here:
    the natural chain H2D -> InputDistStart -> InputDistWait -> WaitBatch ->
    Forward, and no inter-iteration dependency (eval does not update weights).

    Parameters
    ----------
    fns : mapping of task name to function, optional
    order : {None, "torchrec", "ready_first", "stage_descending"}, optional
        The per-period enqueue order: swpipe's policy (default ready-first) or
        TorchRec's own submission order (:mod:`~swpipe_core.pipelines.orders`).

    Returns
    -------
    PipelinePlan

    Examples
    --------
    >>> plan = eval_sparse_dist()
    >>> plan.pipeline_depth, plan.sched("H2D").thread_group
    (2, 'loader')
    """
    return make_plan(
        "eval_sparse_dist",
        {
            "H2D": TaskSchedule(stage=0, stream="memcpy", thread_group="loader"),
            "InputDistStart": TaskSchedule(stage=1, stream="data_dist", globally_ordered=True),
            "InputDistWait": TaskSchedule(stage=1, stream="data_dist"),
            "WaitBatch": TaskSchedule(stage=1),
            "Forward": TaskSchedule(stage=1),
        },
        intra=[
            ("InputDistStart", "H2D"),
            ("InputDistWait", "InputDistStart"),
            ("WaitBatch", "InputDistWait"),
            ("Forward", "WaitBatch"),
        ],
        fns=fns, order=order,
    )


def eval_fused_sparse_dist(fns: TaskFns = None, emb_lookup: str = "new", order: Optional[str] = None) -> PipelinePlan:
    """EvalPipelineFusedSparseDist: FusedSparseDist's schedule for inference.

    Depth 3, streams as :func:`~swpipe_core.pipelines.train.fused_sparse_dist`
    (``emb_lookup`` picks the lookup stream the same way), one thread.
    Assumed from TorchRec's ``progress()``: Forward runs under
    ``torch.no_grad()``, and ZeroGrad, Backward and OptimizerStep are absent
    (TorchRec calls ``zero_grad`` only when the model is training), hence no
    inter-iteration dependencies. WaitBatch waits InputDistWait (it waits the
    data_dist stream). TorchRec's optional lookup prefetch mode is not modelled.

    Parameters
    ----------
    fns : mapping of task name to function, optional
    order : {None, "torchrec", "ready_first", "stage_descending"}, optional
        The per-period enqueue order: swpipe's policy (default ready-first) or
        TorchRec's own submission order (:mod:`~swpipe_core.pipelines.orders`).
    emb_lookup : {"new", "data_dist", "current"}

    Returns
    -------
    PipelinePlan

    Raises
    ------
    ValueError
        For another ``emb_lookup``.

    Examples
    --------
    >>> plan = eval_fused_sparse_dist()
    >>> plan.pipeline_depth, plan.task_names
    (3, ['H2D', 'InputDistStart', 'InputDistWait', 'EmbLookup', 'WaitBatch', 'Forward'])
    """
    return make_plan(
        "eval_fused_sparse_dist",
        _fused_schedule(emb_lookup, training=False),
        intra=[
            ("InputDistStart", "H2D"),
            ("InputDistWait", "InputDistStart"),
            ("EmbLookup", "InputDistWait"),
            ("WaitBatch", "InputDistWait"),
            ("Forward", "EmbLookup"),
            ("Forward", "WaitBatch"),
        ],
        fns=fns, order=order,
    )
