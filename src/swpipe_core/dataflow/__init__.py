"""Observed dataflow: record what each task reads and writes, infer dependencies, check a plan.

=================  ====================================================================
module             what
=================  ====================================================================
``record``         run serial iterations under a recorder (ctx attributes, tensor
                   storages via the dispatcher, named model/optimizer state, DeclaredIO)
``infer``          RAW/WAR/WAW hazards and the minimal dependencies behind them
``check``          ``check_dataflow(plan, batches)``: missing / stale / redundant
``strict``         ``SWPipeline(strict=True)``: raise on the first unordered access
``grads``          ``record_grads``: which tasks allocate, make and free the parameters' gradients
=================  ====================================================================
"""

from __future__ import annotations

from swpipe_core.dataflow.check import DataflowError, DataflowReport, Finding, check_dataflow
from swpipe_core.dataflow.infer import Hazard, InferredDeps, find_hazards, infer_deps
from swpipe_core.dataflow.record import Access, DataflowRecord, DataflowRecordError, record_dataflow, serial_order

__all__ = [
    "Access", "DataflowRecord", "DataflowRecordError", "record_dataflow", "serial_order",
    "Hazard", "InferredDeps", "find_hazards", "infer_deps",
    "DataflowError", "DataflowReport", "Finding", "check_dataflow", "infer_plan",
]


def infer_plan(tasks, batches, *, state=None, order=None, rng=None) -> InferredDeps:
    """Record ``tasks`` on ``batches`` and return the inferred dependencies (``.plan`` is the skeleton).

    Parameters
    ----------
    tasks : PipelinePlan, list of PipelineTask, or mapping ``{name: fn}``
    batches : iterable
        Two or more batches.
    state : modules/optimizers, optional
    order : list of str, optional
    rng : {None, "per_task"}
        As in :func:`record_dataflow`: with ``None`` the tasks that draw from
        one of torch's default generators are ordered as the serial loop
        orders them (their numbers then match it); with ``"per_task"`` (for
        ``SWPipeline(rng="per_task")``) they are not.

    Returns
    -------
    InferredDeps

    Examples
    --------
    >>> import torch
    >>> from swpipe import PipelineTask, infer_plan
    >>> def a(ctx): ctx.x = ctx.batch + 1
    >>> def b(ctx): ctx.y = ctx.x * 2
    >>> infer_plan([PipelineTask("A", a), PipelineTask("B", b)], [torch.ones(1)] * 2).intra
    [('B', 'A')]
    """
    from swpipe_core.plan import PipelinePlan

    seq = serial_order(tasks)
    record = record_dataflow(seq if not isinstance(tasks, PipelinePlan) else tasks, batches, state=state, order=order,
                             rng=rng)
    return infer_deps(record, seq)
