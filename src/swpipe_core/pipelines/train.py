"""TorchRec's training pipelines as plans.

Each factory writes one class of TorchRec's ``train_pipelines.py`` as a plan:
the task names, stages, streams and dependencies that class's ``progress()``
implies, so that ``format_schedule`` prints each class's schedule table (the
tables are checked in ``tests/test_analysis.py``). Streams are
names (``None`` is the default stream); every task runs on the one
``"default"`` thread group, as TorchRec's ``progress()`` does. Pass ``fns``
(``{task_name: fn(ctx)}``) to get a runnable plan; without it the plan is
analysis-only.
"""

from __future__ import annotations

from typing import Optional

from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.pipelines._build import TaskFns, make_plan

__all__ = [
    "base",
    "pt2",
    "sparse_dist",
    "sparse_dist_lite",
    "fused_sparse_dist",
    "semi_sync",
    "prefetch",
    "sparse_dist_comp_autograd",
    "EMB_LOOKUP_STREAMS",
]

# TorchRec's ``emb_lookup_stream`` argument -> the stream EmbLookup runs on.
EMB_LOOKUP_STREAMS = {"new": "emb_lookup", "data_dist": "data_dist", "current": None}

_SPARSE_DIST_INTRA = [
    ("InputDistStart", "H2D"),
    ("InputDistWait", "InputDistStart"),
    ("WaitBatch", "InputDistWait"),
    ("Forward", "InputDistWait"),
    ("WaitBatch", "ZeroGrad"),
    ("Forward", "WaitBatch"),
    ("Backward", "Forward"),
    ("OptimizerStep", "Backward"),
]


def _sparse_dist_schedule(globally_ordered: bool = True) -> dict:
    return {
        "H2D": TaskSchedule(stage=0, stream="memcpy"),
        "InputDistStart": TaskSchedule(stage=1, stream="data_dist", globally_ordered=globally_ordered),
        "InputDistWait": TaskSchedule(stage=1, stream="data_dist"),
        "ZeroGrad": TaskSchedule(stage=2),
        "WaitBatch": TaskSchedule(stage=2),
        "Forward": TaskSchedule(stage=2),
        "Backward": TaskSchedule(stage=2),
        "OptimizerStep": TaskSchedule(stage=2),
    }


def base(fns: TaskFns = None, order: Optional[str] = None) -> PipelinePlan:
    """TrainPipelineBase: 2 stages, H2D of the next batch on a memcpy stream.

    Depth 2, streams ``memcpy`` + default, one thread. Forward(i) reads the
    weights OptimizerStep(i-1) wrote (inter dependency); all of stage 1 is on
    the default stream, so its FIFO orders it.

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
    >>> plan = base()
    >>> plan.pipeline_depth, plan.task_names[0], plan.stream_of("H2D")
    (2, 'H2D', 'memcpy')
    """
    return make_plan(
        "base",
        {
            "H2D": TaskSchedule(stage=0, stream="memcpy"),
            "ZeroGrad": TaskSchedule(stage=1),
            "WaitBatch": TaskSchedule(stage=1),
            "Forward": TaskSchedule(stage=1),
            "Backward": TaskSchedule(stage=1),
            "OptimizerStep": TaskSchedule(stage=1),
        },
        intra=[
            ("WaitBatch", "H2D"),
            ("WaitBatch", "ZeroGrad"),
            ("Forward", "WaitBatch"),
            ("Backward", "Forward"),
            ("OptimizerStep", "Backward"),
        ],
        inter=[("Forward", "OptimizerStep")],
        fns=fns, order=order,
    )


def pt2(fns: TaskFns = None, order: Optional[str] = None) -> PipelinePlan:
    """TrainPipelinePT2: torch.compile'd model, fully serial (depth 1, default stream).

    TorchRec runs the seven tasks in one step (all at stage 0) and declares
    no dependencies between them; assumed here:
    the natural chain LoadBatch -> H2D -> InputTransform -> Forward, ZeroGrad
    before Forward, then Backward -> OptimizerStep, and Forward(i) reading
    OptimizerStep(i-1)'s weights. H2D is a blocking copy (``non_blocking=False``)
    on the default stream, so nothing overlaps.

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
    >>> plan = pt2()
    >>> plan.pipeline_depth, {plan.stream_of(t) for t in plan.task_names}
    (1, {'default'})
    """
    names = ["LoadBatch", "H2D", "InputTransform", "ZeroGrad", "Forward", "Backward", "OptimizerStep"]
    return make_plan(
        "pt2",
        {n: TaskSchedule(stage=0) for n in names},
        intra=[
            ("H2D", "LoadBatch"),
            ("InputTransform", "H2D"),
            ("Forward", "InputTransform"),
            ("Forward", "ZeroGrad"),
            ("Backward", "Forward"),
            ("OptimizerStep", "Backward"),
        ],
        inter=[("Forward", "OptimizerStep")],
        fns=fns, order=order,
    )


def sparse_dist(fns: TaskFns = None, order: Optional[str] = None) -> PipelinePlan:
    """TrainPipelineSparseDist: the classic 3 stages H2D | InputDist | FWD/BWD/OPT.

    Depth 3, streams ``memcpy``, ``data_dist`` and default, one thread.
    InputDistStart (the splits all-to-all) is ``globally_ordered``; the
    embedding lookup runs inside Forward (PipelinedForward).

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
    >>> plan = sparse_dist()
    >>> plan.pipeline_depth, plan.sched("InputDistStart").globally_ordered
    (3, True)
    """
    return make_plan("sparse_dist", _sparse_dist_schedule(), _SPARSE_DIST_INTRA,
                     inter=[("Forward", "OptimizerStep")], fns=fns, order=order)


def sparse_dist_lite(fns: TaskFns = None, order: Optional[str] = None) -> PipelinePlan:
    """TrainPipelineSparseDistLite: 2 stages, InputDist on the default stream (critical path).

    Depth 2, streams ``memcpy`` + default (TorchRec sets ``data_dist_stream``
    to None), one thread; about 2/3 of SparseDist's batch memory.
    InputDistStart stays ``globally_ordered`` (it is still a collective).

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
    >>> plan = sparse_dist_lite()
    >>> plan.pipeline_depth, plan.stream_of("InputDistStart")
    (2, 'default')
    """
    return make_plan(
        "sparse_dist_lite",
        {
            "H2D": TaskSchedule(stage=0, stream="memcpy"),
            "ZeroGrad": TaskSchedule(stage=1),
            "WaitBatch": TaskSchedule(stage=1),
            "InputDistStart": TaskSchedule(stage=1, globally_ordered=True),
            "InputDistWait": TaskSchedule(stage=1),
            "Forward": TaskSchedule(stage=1),
            "Backward": TaskSchedule(stage=1),
            "OptimizerStep": TaskSchedule(stage=1),
        },
        intra=[
            ("WaitBatch", "H2D"),
            ("WaitBatch", "ZeroGrad"),
            ("InputDistStart", "WaitBatch"),
            ("InputDistWait", "InputDistStart"),
            ("Forward", "InputDistWait"),
            ("Backward", "Forward"),
            ("OptimizerStep", "Backward"),
        ],
        inter=[("Forward", "OptimizerStep")],
        fns=fns, order=order,
    )


def _fused_schedule(emb_lookup: str, training: bool = True) -> dict:
    if emb_lookup not in EMB_LOOKUP_STREAMS:
        raise ValueError(f"emb_lookup must be one of {sorted(EMB_LOOKUP_STREAMS)}, got {emb_lookup!r}")
    sched = {
        "H2D": TaskSchedule(stage=0, stream="memcpy"),
        "InputDistStart": TaskSchedule(stage=1, stream="data_dist", globally_ordered=True),
        "InputDistWait": TaskSchedule(stage=1, stream="data_dist"),
        "EmbLookup": TaskSchedule(stage=2, stream=EMB_LOOKUP_STREAMS[emb_lookup]),
        "ZeroGrad": TaskSchedule(stage=2),
        "WaitBatch": TaskSchedule(stage=2),
        "Forward": TaskSchedule(stage=2),
        "Backward": TaskSchedule(stage=2),
        "OptimizerStep": TaskSchedule(stage=2),
    }
    if not training:
        for name in ("ZeroGrad", "Backward", "OptimizerStep"):
            del sched[name]
    return sched


def fused_sparse_dist(fns: TaskFns = None, emb_lookup: str = "new", order: Optional[str] = None) -> PipelinePlan:
    """TrainPipelineFusedSparseDist: SparseDist with the embedding lookup on its own stream.

    Depth 3, streams ``memcpy``, ``data_dist``, the lookup stream and default
    (3-4 streams), one thread. EmbLookup(i) waits Backward(i-1) (TBE updates
    embedding weights in backward) and Forward(i) waits OptimizerStep(i-1).

    ``emb_lookup`` picks EmbLookup's stream like TorchRec's
    ``emb_lookup_stream``: ``"new"`` (stream ``"emb_lookup"``, the default
    here because the FusedSparseDist schedule table in
    ``tests/test_analysis.py`` shows a separate lookup stream), ``"data_dist"`` (reuse the
    data_dist stream; **TorchRec's own default**) or ``"current"`` (the
    default stream: no overlap, SparseDist-equivalent).

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
    >>> fused_sparse_dist().stream_of("EmbLookup"), fused_sparse_dist(emb_lookup="current").stream_of("EmbLookup")
    ('emb_lookup', 'default')
    """
    return make_plan(
        "fused_sparse_dist",
        _fused_schedule(emb_lookup),
        intra=[
            ("InputDistStart", "H2D"),
            ("InputDistWait", "InputDistStart"),
            ("EmbLookup", "InputDistWait"),
            ("Forward", "EmbLookup"),
            ("WaitBatch", "ZeroGrad"),
            ("Forward", "WaitBatch"),
            ("Backward", "Forward"),
            ("OptimizerStep", "Backward"),
        ],
        inter=[("EmbLookup", "Backward"), ("Forward", "OptimizerStep")],
        fns=fns, order=order,
    )


def semi_sync(fns: TaskFns = None, order: Optional[str] = None) -> PipelinePlan:
    """TrainPipelineSemiSync: the embedding lookup one stage ahead of dense forward/backward.

    Depth 4 (H2D, input distribution, embedding lookup and dense
    forward/backward each a stage; the depth of 3 sometimes quoted for this
    class counts only the sparse stages), streams ``memcpy``, ``data_dist`` and default, one thread.
    EmbLookup(i) waits Backward(i-1) (declared, as TorchRec's class orders
    them; both run in the same period). The embedding tables themselves are
    written by EmbBackward(i-1); whether the lookup sees that update depends
    on the per-period order on the one thread: swpipe's policy and TorchRec's
    submission order both queue EmbBackward first, so the lookup reads fresh
    tables (no staleness, as ``swpipe check`` and the workload's
    ``emb_staleness`` agree); an order that queues EmbLookup before
    EmbBackward reads them one iteration stale, the trade TorchRec's
    semi-sync is known for. Forward(i) uses the dense weights
    OptimizerStep(i-1) wrote one period earlier on the same thread (not
    declared: the thread's FIFO orders them).

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
    >>> plan = semi_sync()
    >>> plan.pipeline_depth, plan.stage("EmbLookup")
    (4, 2)
    """
    return make_plan(
        "semi_sync",
        {
            "H2D": TaskSchedule(stage=0, stream="memcpy"),
            "InputDistStart": TaskSchedule(stage=1, stream="data_dist", globally_ordered=True),
            "InputDistWait": TaskSchedule(stage=1, stream="data_dist"),
            "EmbLookup": TaskSchedule(stage=2),
            "ZeroGrad": TaskSchedule(stage=3),
            "Forward": TaskSchedule(stage=3),
            "Backward": TaskSchedule(stage=3),
            "EmbBackward": TaskSchedule(stage=3),
            "OptimizerStep": TaskSchedule(stage=3),
        },
        intra=[
            ("InputDistStart", "H2D"),
            ("InputDistWait", "InputDistStart"),
            ("EmbLookup", "InputDistWait"),
            ("Forward", "EmbLookup"),
            ("Forward", "ZeroGrad"),
            ("Backward", "Forward"),
            ("EmbBackward", "Backward"),
            ("OptimizerStep", "EmbBackward"),
        ],
        inter=[("EmbLookup", "Backward")],
        fns=fns, order=order,
    )


def prefetch(fns: TaskFns = None, order: Optional[str] = None) -> PipelinePlan:
    """PrefetchTrainPipelineSparseDist: SparseDist plus an embedding-cache prefetch stream.

    Depth 3, streams ``memcpy``, ``data_dist``, ``prefetch`` and default, one
    thread. InputDistStart shares stage 0 with H2D (``globally_ordered``);
    EmbPrefetch(i) waits Forward(i-1), which consumed the previous prefetch,
    and Forward(i) waits OptimizerStep(i-1).

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
    >>> plan = prefetch()
    >>> plan.stage("InputDistStart"), plan.stream_of("EmbPrefetch")
    (0, 'prefetch')
    """
    return make_plan(
        "prefetch",
        {
            "H2D": TaskSchedule(stage=0, stream="memcpy"),
            "InputDistStart": TaskSchedule(stage=0, stream="data_dist", globally_ordered=True),
            "InputDistWait": TaskSchedule(stage=1, stream="data_dist"),
            "EmbPrefetch": TaskSchedule(stage=1, stream="prefetch"),
            "ZeroGrad": TaskSchedule(stage=2),
            "WaitBatch": TaskSchedule(stage=2),
            "Forward": TaskSchedule(stage=2),
            "Backward": TaskSchedule(stage=2),
            "OptimizerStep": TaskSchedule(stage=2),
        },
        intra=[
            ("InputDistStart", "H2D"),
            ("InputDistWait", "InputDistStart"),
            ("EmbPrefetch", "InputDistWait"),
            ("WaitBatch", "EmbPrefetch"),
            ("WaitBatch", "ZeroGrad"),
            ("Forward", "WaitBatch"),
            ("Backward", "Forward"),
            ("OptimizerStep", "Backward"),
        ],
        inter=[("EmbPrefetch", "Forward"), ("Forward", "OptimizerStep")],
        fns=fns, order=order,
    )


def sparse_dist_comp_autograd(fns: TaskFns = None, order: Optional[str] = None) -> PipelinePlan:
    """TrainPipelineSparseDistCompAutograd: SparseDist with forward/backward under compiled autograd.

    The schedule is SparseDist's (depth 3, streams ``memcpy``, ``data_dist``,
    default); only the task functions differ. InputDistStart is marked
    ``globally_ordered`` here as in SparseDist, because the
    all-to-all is still a collective that every rank must issue in one order.

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
    >>> sparse_dist_comp_autograd().schedule == sparse_dist().schedule
    True
    """
    return make_plan("sparse_dist_comp_autograd", _sparse_dist_schedule(), _SPARSE_DIST_INTRA,
                     inter=[("Forward", "OptimizerStep")], fns=fns, order=order)
