"""TorchRec as a peer: its pipelines and our equivalent plans driving one and the same TorchRec model.

The model is TorchRec's own ``DLRMTrain(DLRM(EmbeddingBagCollection))`` under
``DistributedModelParallel`` with table-wise sharding, a fused SGD embedding
optimizer and SGD on the dense parameters (TorchRec's standard
``CombinedOptimizer`` setup). The data are our :class:`SyntheticData` batches
converted to TorchRec's ``Batch``/``KeyedJaggedTensor``. :func:`run_torchrec`
drives the model with ``TrainPipelineBase``, ``TrainPipelineSparseDist`` or
``TrainPipelineSparseDistLite``; :func:`run_swpipe` drives a fresh copy with
our ``base``, ``sparse_dist`` or ``sparse_dist_lite`` plan, whose input-dist
tasks call the same TorchRec machinery (``start_sparse_data_dist`` /
``wait_sparse_data_dist`` and the FX-rewritten ``PipelinedForward``) that
TorchRec's ``progress()`` calls.

TorchRec is optional (the ``[peer]`` extra): this module imports without it,
and :func:`peer_available` says whether it can run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from swpipe.workloads.dlrm_data import DLRMConfig, SyntheticData, pins_batches

__all__ = ["PEERS", "peer_available", "PeerModel", "build_model", "to_torchrec_batches", "run_torchrec",
           "swpipe_plan", "run_swpipe", "run_plain"]

# our plan name -> TorchRec pipeline class (in torchrec.distributed.train_pipeline.train_pipelines)
PEERS = {"base": "TrainPipelineBase", "sparse_dist": "TrainPipelineSparseDist",
         "sparse_dist_lite": "TrainPipelineSparseDistLite"}


def peer_available() -> bool:
    """Whether ``swpipe.torchrec`` imports here: TorchRec and FBGEMM installed and loadable (the ``[peer]`` extra).

    The library's own check (:mod:`swpipe.torchrec` raises ``ModuleNotFoundError`` saying how to install them).

    Examples
    --------
    >>> isinstance(peer_available(), bool)
    True
    """
    try:
        import swpipe.torchrec  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class PeerModel:
    """A sharded TorchRec DLRM and its combined (fused embedding + dense) optimizer (see :func:`run_swpipe`)."""

    model: Any
    optimizer: Any
    device: torch.device


def build_model(config: DLRMConfig, device: Optional[torch.device] = None) -> PeerModel:
    """TorchRec's DLRM sized like ``config``, sharded table-wise by ``DistributedModelParallel``.

    :func:`swpipe.torchrec.models.dlrm` at this workload's sizes and learning rates; needs an initialised default
    process group (gloo on CPU). Two builds start from the same weights.
    """
    from swpipe.torchrec import models

    c = config
    sizes = models.DLRMConfig(num_tables=c.num_tables, num_embeddings=c.num_embeddings, embedding_dim=c.embedding_dim,
                              num_dense=c.num_dense, bottom_mlp=tuple(c.bottom_mlp), top_mlp=tuple(c.top_mlp),
                              batch_size=c.batch_size, max_ids=c.max_bag, dense_lr=c.dense_lr, emb_lr=c.emb_lr,
                              seed=c.seed)
    device = device or torch.device("cpu")
    model, optimizer = models.dlrm(sizes, device)
    return PeerModel(model, optimizer, device)


def to_torchrec_batches(config: DLRMConfig, num: int, world_size: int = 1, rank: int = 0,
                        device: Optional[torch.device] = None) -> List[Any]:
    """Our synthetic batches as TorchRec ``Batch`` objects (float32 dense, int64 ids, int labels).

    Parameters
    ----------
    config : DLRMConfig
    num : int
        How many batches.
    world_size, rank : int
        This rank's slice of each global batch.
    device : torch.device, optional
        The device the pipelines copy them to (the model's, ``PeerModel.device``): on CUDA each batch is
        pinned here, once, as TorchRec's data loaders pin theirs (``pin_memory=True``): both our H2D task
        and TorchRec's pipelines copy with ``non_blocking=True``, which blocks the host from pageable
        memory (:func:`swpipe.workloads.dlrm_data.pins_batches`).

    Returns
    -------
    list of torchrec.datasets.utils.Batch
    """
    from torchrec import KeyedJaggedTensor
    from torchrec.datasets.utils import Batch

    out = []
    for b in SyntheticData(config, world_size, rank).batches(num):
        kjt = KeyedJaggedTensor(keys=list(b.sparse.keys), values=b.sparse.values.long(), lengths=b.sparse.lengths)
        batch = Batch(dense_features=b.dense.float(), sparse_features=kjt, labels=b.labels.long())
        out.append(batch.pin_memory() if pins_batches(device) else batch)
    return out


def run_torchrec(name: str, peer: PeerModel, batches: List[Any]) -> Tuple[List[torch.Tensor], float]:
    """Drive ``peer`` with TorchRec's pipeline for our plan ``name``; returns (per-step logits, seconds)."""
    from torchrec.distributed.train_pipeline import train_pipelines

    pipeline = getattr(train_pipelines, PEERS[name])(peer.model, peer.optimizer, peer.device)
    it = iter(batches)
    logits = []
    t0 = time.perf_counter()
    while True:
        try:
            _, out_logits, _ = pipeline.progress(it)
        except StopIteration:
            break
        logits.append(out_logits)
    return logits, time.perf_counter() - t0


def _tasks(name: str, peer: PeerModel, logits: Dict[int, torch.Tensor]) -> Dict[str, Any]:
    from torchrec.distributed.train_pipeline.runtime_forwards import PipelinedForward
    from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSparseDist

    model, opt, device = peer.model, peer.optimizer, peer.device
    # A TorchRec pipeline object used only as a toolbox: FX rewrite, per-batch contexts, input dist.
    tool = TrainPipelineSparseDist(model, opt, device) if name != "base" else None

    def h2d(ctx: Any) -> None:
        if tool is not None:
            ctx.tr_ctx = tool._create_context()
        ctx.dev = ctx.batch.to(device, non_blocking=True)

    def input_dist_start(ctx: Any) -> None:
        if not tool._pipelined_modules:
            tool._pipeline_model(ctx.dev, ctx.tr_ctx, PipelinedForward)  # rewrites, then starts the dist
        else:
            tool.start_sparse_data_dist(ctx.dev, ctx.tr_ctx)

    def input_dist_wait(ctx: Any) -> None:
        tool.wait_sparse_data_dist(ctx.tr_ctx)

    def forward(ctx: Any) -> None:
        if tool is not None:
            tool._set_module_context(ctx.tr_ctx)
        ctx.losses, (_, out_logits, _) = model(ctx.dev)
        logits[ctx.iter_idx] = out_logits

    fns = {
        "H2D": h2d,
        "ZeroGrad": lambda ctx: opt.zero_grad(),
        "WaitBatch": lambda ctx: None,  # the engine's dependency waits are the synchronisation
        "Forward": forward,
        "Backward": lambda ctx: torch.sum(ctx.losses, dim=0).backward(),
        "OptimizerStep": lambda ctx: opt.step(),
    }
    if tool is not None:
        fns.update({"InputDistStart": input_dist_start, "InputDistWait": input_dist_wait})
    return fns


def swpipe_plan(name: str, peer: PeerModel, logits: Dict[int, torch.Tensor],
                thread_map: Optional[str] = None, hand_off_after: Optional[str] = None) -> Any:
    """Our plan ``name`` bound to ``peer``'s model; each step's logits go into ``logits`` by iteration.

    ``thread_map`` and ``hand_off_after`` as in :func:`run_swpipe`.
    """
    import torch.distributed as dist

    from swpipe_core import order, pipelines
    from swpipe_core.engine.workers import with_thread_map

    from swpipe.workloads.tasks import with_collectives_ordered

    plan = pipelines.get(name, _tasks(name, peer, logits))
    if dist.is_initialized() and dist.get_world_size() > 1:
        # TorchRec's work under these task names issues the collectives ours does (input dist in InputDist*,
        # the pooled all-to-all in Forward, its gradient and DDP's all-reduce in Backward), so the
        # workload's list of collective tasks holds for it: one issue order on every rank.
        plan = with_collectives_ordered(plan)
    plan = with_thread_map(plan, thread_map) if thread_map else plan
    if hand_off_after is not None:
        late = order.hand_off_after(plan, hand_off_after)
        plan = plan.replace(enqueue_order=late, pipeline_depth=plan.pipeline_depth)
    return plan


def run_swpipe(name: str, peer: PeerModel, batches: List[Any], thread_map: Optional[str] = None,
               hand_off_after: Optional[str] = None) -> Tuple[List[torch.Tensor], float]:
    """Drive ``peer`` with our plan ``name`` (``base``, ``sparse_dist``, ``sparse_dist_lite``).

    Parameters
    ----------
    name : str
        A key of :data:`PEERS`.
    peer : PeerModel
        From :func:`build_model` (a fresh one per run: the plan rewrites its forward).
    batches : list of torchrec Batch
        From :func:`to_torchrec_batches`.
    thread_map : str, optional
        E.g. ``"by_stream"``. TorchRec issues all its collectives on the
        default process group, so at world size > 1 the tasks that issue them
        are globally ordered (:func:`swpipe_plan`), one order on every rank;
        compared with TorchRec at world size 1 only.
    hand_off_after : str, optional
        With ``thread_map``: a task of the caller's thread (``"Forward"``)
        after which the side threads' tasks are handed off
        (:func:`swpipe_core.order.hand_off_after`); by default they are
        handed off first.

    Returns
    -------
    (list of Tensor, float)
        Per-step logits and wall seconds.

    Examples
    --------
    Runs where the ``[peer]`` extra is installed (``tests/test_vs_torchrec.py`` does the same):

    >>> from swpipe.workloads.dlrm import init_distributed
    >>> if peer_available():
    ...     env = init_distributed()
    ...     cfg = DLRMConfig.preset("test")
    ...     batches = to_torchrec_batches(cfg, 3)
    ...     ours, _ = run_swpipe("sparse_dist", build_model(cfg), batches)
    ...     theirs, _ = run_torchrec("sparse_dist", build_model(cfg), batches)
    ...     env.close()
    ...     assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    """
    from swpipe_core.engine.pipeline import SWPipeline

    logits: Dict[int, torch.Tensor] = {}
    plan = swpipe_plan(name, peer, logits, thread_map, hand_off_after)
    with SWPipeline(plan, device=peer.device) as pipe:
        seconds = pipe.run(iter(batches))
    return [logits[i] for i in range(len(batches))], seconds


def run_plain(peer: PeerModel, batches: List[Any]) -> Tuple[List[torch.Tensor], float]:
    """The non-pipelined loop TorchRec's ``test_equal_to_non_pipelined`` compares against."""
    logits = []
    t0 = time.perf_counter()
    for b in batches:
        peer.optimizer.zero_grad()
        loss, (_, out_logits, _) = peer.model(b.to(peer.device))
        loss.backward()
        peer.optimizer.step()
        logits.append(out_logits)
    return logits, time.perf_counter() - t0
