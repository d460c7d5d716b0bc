"""TorchRec's twelve TrainPipeline classes as :class:`~swpipe_core.plan.PipelinePlan` factories.

Every factory takes ``fns`` (``{task_name: fn(ctx)}``; omitted = an unbound,
analysis-only plan) plus its own options, and returns a plan that passes
``validate``. ``get(name, fns, **options)`` looks a factory up by name.
Every factory takes ``order``: ``None``/``"ready_first"``/``"stage_descending"``
(swpipe's enqueue policies) or ``"torchrec"`` (TorchRec's own CPU submission
order, :data:`~swpipe_core.pipelines.orders.TORCHREC_ORDERS`).

=============================  ==============================================================
name                           TorchRec class
=============================  ==============================================================
``base``                       TrainPipelineBase
``pt2``                        TrainPipelinePT2
``sparse_dist``                TrainPipelineSparseDist
``sparse_dist_lite``           TrainPipelineSparseDistLite
``fused_sparse_dist``          TrainPipelineFusedSparseDist (``emb_lookup``)
``semi_sync``                  TrainPipelineSemiSync
``prefetch``                   PrefetchTrainPipelineSparseDist
``eval_sparse_dist``           EvalPipelineSparseDist
``eval_fused_sparse_dist``     EvalPipelineFusedSparseDist (``emb_lookup``)
``staged``                     StagedTrainPipeline (``stages``)
``sparse_dist_comp_autograd``  TrainPipelineSparseDistCompAutograd
``sparse_dist_t``              TrainPipelineSparseDistT (experimental: H2D on its own thread)
=============================  ==============================================================
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict

from swpipe_core.plan import PipelinePlan
from swpipe_core.pipelines._build import TaskFns
from swpipe_core.pipelines.eval import eval_fused_sparse_dist, eval_sparse_dist
from swpipe_core.pipelines.experimental import sparse_dist_t
from swpipe_core.pipelines.staged import staged
from swpipe_core.pipelines.train import (
    base,
    fused_sparse_dist,
    prefetch,
    pt2,
    semi_sync,
    sparse_dist,
    sparse_dist_comp_autograd,
    sparse_dist_lite,
)

__all__ = ["PIPELINES", "get", "describe"]

PIPELINES: Dict[str, Callable[..., PipelinePlan]] = {
    "base": base,
    "pt2": pt2,
    "sparse_dist": sparse_dist,
    "sparse_dist_lite": sparse_dist_lite,
    "fused_sparse_dist": fused_sparse_dist,
    "semi_sync": semi_sync,
    "prefetch": prefetch,
    "eval_sparse_dist": eval_sparse_dist,
    "eval_fused_sparse_dist": eval_fused_sparse_dist,
    "staged": staged,
    "sparse_dist_comp_autograd": sparse_dist_comp_autograd,
    "sparse_dist_t": sparse_dist_t,
}


def _factory(name: str) -> Callable[..., PipelinePlan]:
    key = name.strip().lower().replace("-", "_")
    if key not in PIPELINES:
        raise KeyError(f"unknown pipeline {name!r}; known: {', '.join(PIPELINES)}")
    return PIPELINES[key]


def get(name: str, fns: TaskFns = None, **options: Any) -> PipelinePlan:
    """Build one of TorchRec's pipelines as a plan.

    Parameters
    ----------
    name : str
        A key of ``PIPELINES`` (case and ``-``/``_`` are forgiven).
    fns : mapping of task name to function, optional
        Binds the tasks; without it the plan is analysis-only.
    **options
        The factory's options: ``order`` for every one (``"torchrec"`` for
        TorchRec's submission order), ``emb_lookup`` for the fused pipelines,
        ``stages`` for ``staged``.

    Returns
    -------
    PipelinePlan

    Raises
    ------
    KeyError
        For an unknown pipeline name (the known names are listed).
    ValueError
        For an option the factory does not take, or a bad option value.

    Examples
    --------
    >>> get("fused_sparse_dist", emb_lookup="data_dist").stream_of("EmbLookup")
    'data_dist'
    >>> get("base", stages=2)
    Traceback (most recent call last):
    ...
    ValueError: pipeline 'base' takes no option(s) ['stages']; its options: order
    """
    factory = _factory(name)
    accepted = [p for p in inspect.signature(factory).parameters if p != "fns"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"pipeline {factory.__name__!r} takes no option(s) {unknown}; "
                         f"its options: {', '.join(accepted) or 'none'}")
    return factory(fns, **options)


def describe(name: str) -> str:
    """The one-line description of a pipeline (its factory's docstring summary).

    Parameters
    ----------
    name : str

    Returns
    -------
    str

    Raises
    ------
    KeyError
        For an unknown pipeline name.

    Examples
    --------
    >>> describe("staged")
    'StagedTrainPipeline: N user-defined stages, stage k on its own stream, chained.'
    """
    return inspect.getdoc(_factory(name)).splitlines()[0]
