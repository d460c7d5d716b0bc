"""TorchRec's StagedTrainPipeline as a plan: N user stages, one stream each."""

from __future__ import annotations

from typing import Optional, Sequence, Union

from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.pipelines._build import TaskFns, make_plan

__all__ = ["staged"]

_DEFAULT_STAGES = ("data_copy", "gpu_postproc")


def _stage_names(stages: Optional[Union[int, str, Sequence[str]]]) -> list:
    if stages is None:
        return list(_DEFAULT_STAGES)
    if isinstance(stages, bool):
        raise ValueError(f"stages must be a count or a list of names, got {stages!r}")
    if isinstance(stages, int):
        if stages < 1:
            raise ValueError(f"stages must be >= 1, got {stages}")
        return [f"stage{k}" for k in range(stages)]
    if isinstance(stages, str):
        stages = [s.strip() for s in stages.split(",") if s.strip()]
    names = list(stages)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"stages must be a count or non-empty names, got {stages!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"stage names must be unique, got {names}")
    return names


def staged(fns: TaskFns = None, stages: Optional[Union[int, str, Sequence[str]]] = None,
           order: Optional[str] = None) -> PipelinePlan:
    """StagedTrainPipeline: N user-defined stages, stage k on its own stream, chained.

    Depth N, N streams (each named after its stage), one thread. Task k is the
    k-th ``PipelineStage``'s runnable at stage k, waiting task k-1 of the same
    batch (TorchRec passes each stage's output, with an event, to the next).
    Forward/backward/optimizer are outside TorchRec's pipeline (the user's
    loop), so they are not tasks here; add them to the plan to pipeline them.
    The same stage of consecutive batches is ordered by its stream's FIFO,
    so no inter-iteration dependency is declared.

    Parameters
    ----------
    fns : mapping of task name to function, optional
    order : {None, "torchrec", "ready_first", "stage_descending"}, optional
        The per-period enqueue order: swpipe's policy (default ready-first) or
        TorchRec's own submission order (:mod:`~swpipe_core.pipelines.orders`).
    stages : int, str or sequence of str, optional
        Stage names (a comma-separated string is split), or a count ``n`` for
        ``stage0 .. stage{n-1}``; default the two stages of
        TorchRec's own StagedTrainPipeline example, ``["data_copy", "gpu_postproc"]``.

    Returns
    -------
    PipelinePlan

    Raises
    ------
    ValueError
        For an empty or malformed ``stages``.

    Examples
    --------
    >>> plan = staged(stages=3)
    >>> plan.pipeline_depth, plan.task_names, plan.stream_of("stage2")
    (3, ['stage0', 'stage1', 'stage2'], 'stage2')
    >>> staged().intra_edges()
    [('gpu_postproc', 'data_copy')]
    """
    names = _stage_names(stages)
    return make_plan(
        "staged",
        {name: TaskSchedule(stage=k, stream=name) for k, name in enumerate(names)},
        intra=[(names[k], names[k - 1]) for k in range(1, len(names))],
        fns=fns, order=order,
    )
