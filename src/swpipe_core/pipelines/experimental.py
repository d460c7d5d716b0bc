"""TorchRec's experimental pipelines (``experimental_pipelines.py``) that are schedules of the same tasks.

Only the classes whose ``progress()`` runs the tasks of the pipelines in
:mod:`~swpipe_core.pipelines.train` on other stages, streams or threads are
plans here. The others change what a task does, not where it runs, so they
are not schedules: ``TrainPipelineSparseDistBwdOpt`` moves the optimizer step
into a backward hook, ``TrainPipelineSparseDistOptStash`` /
``TrainPipelineSparseDistEmbStash`` / ``TrainPipelinePrefetchEMS`` stash and
restore memory, ``EvalPipelineCPUSparse`` looks embeddings up on the host and
pins them, ``TrainEvalHybridPipelineBase`` interleaves its own eval batches.
"""

from __future__ import annotations

from typing import Optional

from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.pipelines._build import TaskFns, make_plan
from swpipe_core.pipelines.train import _SPARSE_DIST_INTRA, _sparse_dist_schedule

__all__ = ["sparse_dist_t", "COPY_THREAD"]

#: the thread group of TorchRec's one-worker copy executor (``ThreadPoolExecutor(max_workers=1)``)
COPY_THREAD = "copy"


def sparse_dist_t(fns: TaskFns = None, order: Optional[str] = None) -> PipelinePlan:
    """TrainPipelineSparseDistT: SparseDist with the host-to-device copy on its own thread.

    Depth 3, streams ``memcpy``, ``data_dist`` and default, two threads: H2D
    runs on thread group ``"copy"`` (TorchRec's one-worker copy executor), so
    the main thread does not block submitting the copy; everything else as
    :func:`~swpipe_core.pipelines.train.sparse_dist`. TorchRec fetches the
    batch on the main thread and resolves the copy's future before the
    input dist of that batch starts: InputDistStart(i) waits H2D(i).

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
    >>> plan = sparse_dist_t()
    >>> plan.pipeline_depth, plan.sched("H2D").thread_group, plan.sched("Forward").thread_group
    (3, 'copy', 'default')
    """
    schedule = _sparse_dist_schedule()
    schedule["H2D"] = TaskSchedule(stage=0, stream="memcpy", thread_group=COPY_THREAD)
    return make_plan("sparse_dist_t", schedule, _SPARSE_DIST_INTRA, inter=[("Forward", "OptimizerStep")],
                     fns=fns, order=order)
