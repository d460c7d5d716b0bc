"""TorchRec's CPU submission orders: the order each pipeline's ``progress()`` issues its tasks.

A factory's ``order`` option picks the plan's per-period enqueue order:

* ``None`` (default) or ``"ready_first"``: swpipe's ready-first policy;
* ``"stage_descending"``: older iterations first;
* ``"torchrec"``: the explicit order TorchRec's ``progress()`` submits its work
  in (``TORCHREC_ORDERS``), so a run reproduces TorchRec's CPU-side order
  exactly. Each is a topological order of the plan's period-local graph
  (``validate`` checks it, ``tests/test_pipelines_torchrec_order.py`` too).

The sequences are the calls each class's ``progress()`` makes in TorchRec's
``train_pipelines.py``, read as tasks with their batch offsets (``[i]``,
``[i+1]``, ``[i+2]``) dropped: in period ``p`` every task works on iteration
``p - stage``, which is where TorchRec's ``i``, ``i+1``, ``i+2`` put them.
Where a class's ``progress()`` gives no such sequence directly, the entry says
what it is derived from; pipelines for which nothing can be derived have no
entry and ``order="torchrec"`` raises.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from swpipe_core.plan import ENQUEUE_POLICIES, PipelinePlan

__all__ = ["TORCHREC_ORDERS", "ORDERS", "apply_order", "order_label"]

_SPARSE_DIST = ("ZeroGrad", "WaitBatch", "InputDistStart", "H2D", "Forward", "InputDistWait", "Backward",
                "OptimizerStep")
_FUSED = ("EmbLookup", "ZeroGrad", "WaitBatch", "InputDistStart", "H2D", "Forward", "InputDistWait", "Backward",
          "OptimizerStep")

# {pipeline: (order, where it comes from)}
TORCHREC_ORDERS: Dict[str, Tuple[Tuple[str, ...], str]] = {
    "base": (("ZeroGrad", "WaitBatch", "Forward", "H2D", "Backward", "OptimizerStep"),
             "TrainPipelineBase.progress(): H2D of the next batch is issued after Forward"),
    "pt2": (("LoadBatch", "H2D", "InputTransform", "ZeroGrad", "Forward", "Backward", "OptimizerStep"),
            "TrainPipelinePT2.progress(): fully serial, in the listed order"),
    "sparse_dist": (_SPARSE_DIST, "TrainPipelineSparseDist.progress()"),
    "sparse_dist_lite": (("ZeroGrad", "WaitBatch", "InputDistStart", "InputDistWait", "Forward", "Backward", "H2D",
                          "OptimizerStep"),
                         "TrainPipelineSparseDistLite.progress(): H2D between Backward and OptimizerStep"),
    "fused_sparse_dist": (_FUSED, "TrainPipelineFusedSparseDist.progress(): EmbLookup first"),
    "semi_sync": (("ZeroGrad", "Forward", "Backward", "EmbBackward", "OptimizerStep", "EmbLookup", "InputDistStart",
                   "InputDistWait", "H2D"),
                  "TrainPipelineSemiSync: stage-descending (dense step of batch i, then EmbLookup, "
                  "input dist and H2D of the newer batches)"),
    "prefetch": (("ZeroGrad", "WaitBatch", "H2D", "InputDistWait", "Forward", "EmbPrefetch", "Backward",
                  "OptimizerStep", "InputDistStart"),
                 "PrefetchTrainPipelineSparseDist.progress(): _start_sparse_data_dist last"),
    "eval_fused_sparse_dist": (tuple(t for t in _FUSED if t not in ("ZeroGrad", "Backward", "OptimizerStep")),
                               "EvalPipelineFusedSparseDist inherits TrainPipelineFusedSparseDist.progress() "
                               "(no zero_grad, backward or optimizer step in eval)"),
    "sparse_dist_comp_autograd": (_SPARSE_DIST, "TrainPipelineSparseDistCompAutograd.progress() = SparseDist's"),
    "sparse_dist_t": (_SPARSE_DIST, "TrainPipelineSparseDistT.progress() = SparseDist's (the copy it submits runs on "
                                    "its executor's thread)"),
}

ORDERS = ("torchrec", *ENQUEUE_POLICIES)

_NO_ORDER = {
    "eval_sparse_dist": "EvalPipelineSparseDist issues InputDistStart of the next batch before Forward of this one, "
                        "which this plan's stages cannot express",
    "staged": "StagedTrainPipeline's order depends on the user's stages",
}


def apply_order(pipeline: str, plan: PipelinePlan, order: Optional[str]) -> PipelinePlan:
    """``plan`` with the enqueue order ``order`` names (see the module docstring).

    Parameters
    ----------
    pipeline : str
        The factory's pipeline name (the key of ``TORCHREC_ORDERS``).
    plan : PipelinePlan
    order : {None, "torchrec", "ready_first", "stage_descending"}

    Returns
    -------
    PipelinePlan

    Raises
    ------
    ValueError
        For an unknown ``order``, or ``"torchrec"`` on a pipeline without a documented order.

    Examples
    --------
    >>> from swpipe import pipelines
    >>> pipelines.get("base", order="torchrec").enqueue_order
    ['ZeroGrad', 'WaitBatch', 'Forward', 'H2D', 'Backward', 'OptimizerStep']
    >>> pipelines.get("base", order="stage_descending").enqueue_policy
    'stage_descending'
    >>> pipelines.get("staged", order="torchrec")
    Traceback (most recent call last):
    ...
    ValueError: pipeline 'staged' has no TorchRec submission order: StagedTrainPipeline's order depends on the user's stages; use order='ready_first' or 'stage_descending', or pass enqueue_order=[...] to PipelinePlan.replace
    """
    if order is None:
        return plan
    if order not in ORDERS:
        raise ValueError(f"order={order!r} for pipeline {pipeline!r}; use one of {list(ORDERS)} (None = ready_first)")
    if order != "torchrec":
        return plan.replace(enqueue_policy=order, enqueue_order=None)
    if pipeline not in TORCHREC_ORDERS:
        raise ValueError(f"pipeline {pipeline!r} has no TorchRec submission order: "
                         f"{_NO_ORDER.get(pipeline, 'none is documented')}; use order='ready_first' or "
                         f"'stage_descending', or pass enqueue_order=[...] to PipelinePlan.replace")
    names: List[str] = list(TORCHREC_ORDERS[pipeline][0])
    return plan.replace(enqueue_order=names)


def order_label(plan: PipelinePlan) -> str:
    """A short description of how ``plan`` orders a period's tasks (for ``swpipe show``).

    Examples
    --------
    >>> from swpipe import pipelines
    >>> order_label(pipelines.get("sparse_dist"))
    'ready_first policy'
    >>> order_label(pipelines.get("sparse_dist", order="torchrec"))
    'explicit enqueue_order'
    """
    return "explicit enqueue_order" if plan.enqueue_order is not None else f"{plan.enqueue_policy} policy"
