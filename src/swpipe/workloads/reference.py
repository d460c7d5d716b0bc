"""Plain, unpipelined loops over the DLRM workload: what every pipelined plan is checked against.

``train_reference`` is the ordinary training loop; ``semi_sync_reference`` is
the same loop with the embedding lookup of each batch made ``lag`` embedding
updates early (the staleness of a semi-synchronous pipeline, see
:func:`emb_staleness`); ``eval_reference`` is ``model.eval()`` inference.
Each loop calls the workload's primitives one after another in the plain
order, with no tasks, contexts or threads.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from swpipe_core.plan import PipelinePlan

from swpipe.workloads.dlrm import DLRMWorkload
from swpipe.workloads.dlrm_data import Batch

__all__ = ["train_reference", "semi_sync_reference", "eval_reference", "emb_staleness", "same_results"]


def train_reference(workload: DLRMWorkload, batches: Sequence[Batch]) -> List[torch.Tensor]:
    """Train on ``batches`` in a plain loop; returns the per-iteration (local) losses.

    Parameters
    ----------
    workload : DLRMWorkload
        Trained in place; ``workload.losses`` is filled too.
    batches : sequence of Batch

    Returns
    -------
    list of Tensor

    Examples
    --------
    >>> from swpipe.workloads.dlrm import DLRMConfig, SyntheticData, init_distributed
    >>> env = init_distributed()
    >>> cfg = DLRMConfig.preset("test")
    >>> losses = train_reference(DLRMWorkload(cfg, env), SyntheticData(cfg).batches(3))
    >>> again = train_reference(DLRMWorkload(cfg, env), SyntheticData(cfg).batches(3))
    >>> len(losses), all(torch.equal(a, b) for a, b in zip(losses, again))
    (3, True)
    >>> env.close()
    """
    return [workload.train_step(b, i) for i, b in enumerate(batches)]


def semi_sync_reference(workload: DLRMWorkload, batches: Sequence[Batch], lag: int = 1) -> List[torch.Tensor]:
    """Train with embeddings looked up ``lag`` updates early (semi-synchronous training).

    Batch ``i``'s embedding rows are gathered after the embedding updates of
    batches ``<= i - 1 - lag`` and before that of batch ``i - lag``; dense
    weights are never stale. ``lag=0`` is :func:`train_reference`.

    Parameters
    ----------
    workload : DLRMWorkload
    batches : sequence of Batch
    lag : int
        Number of missed embedding updates (``>= 0``).

    Returns
    -------
    list of Tensor
        Per-iteration losses.

    Raises
    ------
    ValueError
        If ``lag < 0``.

    Examples
    --------
    >>> from swpipe.workloads.dlrm import DLRMConfig, SyntheticData, init_distributed
    >>> env = init_distributed()
    >>> cfg = DLRMConfig.preset("test")
    >>> data = SyntheticData(cfg).batches(3)
    >>> plain = train_reference(DLRMWorkload(cfg, env), data)
    >>> same = semi_sync_reference(DLRMWorkload(cfg, env), data, lag=0)
    >>> stale = semi_sync_reference(DLRMWorkload(cfg, env), data, lag=1)
    >>> all(torch.equal(a, b) for a, b in zip(plain, same)), torch.equal(plain[0], stale[0]), torch.equal(plain[2], stale[2])
    (True, True, False)
    >>> env.close()
    """
    if lag < 0:
        raise ValueError(f"semi_sync_reference: lag must be >= 0, got {lag}")
    wl, n = workload, len(batches)
    dev: Dict[int, Batch] = {}
    embs: Dict[int, object] = {}

    def lookup(j: int) -> None:
        dev[j] = wl.h2d(batches[j])
        embs[j] = wl.lookup(wl.dedup(wl.input_dist(dev[j].sparse)))

    for j in range(min(lag + 1, n)):
        lookup(j)
    losses = []
    for i in range(n):
        if i >= 1 and i + lag < n:
            lookup(i + lag)
        emb = embs.pop(i)
        wl.zero_grad()
        leaf = emb.pooled.detach().requires_grad_(True)
        loss, _ = wl.dense_forward(dev.pop(i), leaf)
        wl.record_loss(i, loss)
        wl.scaled(loss).backward()
        wl.sync_dense_grads()
        torch.autograd.backward(emb.pooled, leaf.grad)
        wl.emb_update(emb)
        wl.step()
        losses.append(loss.detach())
    return losses


def eval_reference(workload: DLRMWorkload, batches: Sequence[Batch]) -> List[torch.Tensor]:
    """``model.eval()`` inference over ``batches``; returns the predictions per batch.

    Examples
    --------
    >>> from swpipe.workloads.dlrm import DLRMConfig, SyntheticData, init_distributed
    >>> env = init_distributed()
    >>> cfg = DLRMConfig.preset("test")
    >>> preds = eval_reference(DLRMWorkload(cfg, env), SyntheticData(cfg).batches(2))
    >>> preds[0].shape, bool(((preds[0] > 0) & (preds[0] < 1)).all())
    (torch.Size([32]), True)
    >>> env.close()
    """
    workload.model.eval()
    return [workload.eval_step(b, i) for i, b in enumerate(batches)]


def emb_staleness(plan: PipelinePlan) -> int:
    """How many embedding updates a plan's lookup of batch ``i`` misses (its semi-sync lag).

    The reader is EmbLookup (or Forward when the plan has no EmbLookup); the
    writer is EmbBackward (or Backward). With both on one thread group, the
    reader of iteration ``i`` runs in period ``i + stage(reader)``, the writer
    of ``j`` in period ``j + stage(writer)``, and within a period the
    enqueue order decides. The result is what :func:`semi_sync_reference`
    takes as ``lag``.

    Parameters
    ----------
    plan : PipelinePlan

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If reader and writer run on different thread groups (their order
        would then depend on timing unless dependencies fix it).

    Examples
    --------
    >>> from swpipe import pipelines
    >>> emb_staleness(pipelines.get("sparse_dist")), emb_staleness(pipelines.get("semi_sync"))
    (0, 0)
    >>> torchrec_order = ["H2D", "InputDistStart", "ZeroGrad", "InputDistWait", "Forward", "Backward",
    ...                   "EmbLookup", "EmbBackward", "OptimizerStep"]
    >>> emb_staleness(pipelines.get("semi_sync").replace(enqueue_order=torchrec_order))
    1
    """
    from swpipe_core.order import enqueue_order

    names = set(plan.task_names)
    reader = "EmbLookup" if "EmbLookup" in names else "Forward"
    writer = "EmbBackward" if "EmbBackward" in names else "Backward"
    if reader not in names or writer not in names:
        return 0
    if plan.sched(reader).thread_group != plan.sched(writer).thread_group:
        raise ValueError(f"{reader} and {writer} run on different thread groups "
                         f"({plan.sched(reader).thread_group!r}, {plan.sched(writer).thread_group!r}); "
                         "their order is not fixed by the plan")
    d = plan.stage(writer) - plan.stage(reader)
    if d < 1:
        return 0
    order = enqueue_order(plan)
    reader_first = order.index(reader) < order.index(writer)
    return (d - 1) + (1 if reader_first else 0)


def same_results(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    """Whether two runs' per-iteration results agree: bit for bit on CPU, to ``rtol=1e-5`` on CUDA.

    On CPU the pipelined and serial runs execute the same ops in the same
    order, so they are compared with ``torch.equal``. CUDA's ``index_add_``
    (the embedding backward and update) accumulates with atomics, whose order
    varies from run to run, so there the comparison allows float rounding.

    Examples
    --------
    >>> same_results([torch.tensor(1.0)], [torch.tensor(1.0)]), same_results([torch.tensor(1.0)], [torch.tensor(1.0 + 1e-7)])
    (True, False)
    """
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.is_cuda or y.is_cuda:
            if not torch.allclose(x, y, rtol=1e-5, atol=1e-6):
                return False
        elif not torch.equal(x, y):
            return False
    return True
