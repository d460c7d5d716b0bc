"""A DLRM-style recommendation model trained over a real ``torch.distributed`` process group.

The model has ``num_tables`` ``nn.EmbeddingBag`` tables (mode ``sum``) sharded
table-wise (rank ``r`` owns table ``t`` when ``t % world_size == r``), a bottom
MLP over dense features, an interaction (concatenation or pairwise dot
products) and a top MLP ending in one logit trained with binary cross-entropy.
Dense parameters are replicated and their gradients all-reduced (as DDP does);
embedding tables use a fused SGD update applied right after their backward
(as TorchRec's fused TBE optimizer does), so no table gradient is ever
materialised.

One training step is split into the primitive operations a pipeline schedules
(:mod:`swpipe.workloads.tasks` binds them to task names):

=========================  ================================================================
``h2d``                    host batch -> device (on CPU a real cast/copy, so it has a cost)
``input_dist_start``       phase 1 of the two-phase all-to-all: send lengths (async)
``input_dist_wait``        wait phase 1, derive value splits, start phase 2: values (async)
``input_dist_finish``      wait phase 2 and rebuild each owned table's jagged ids
``dedup``                  ``unique`` ids per owned table (the lookup plan; prefetchable)
``lookup``                 gather unique rows, pool them, all-to-all the pooled rows back
``dense_forward``          bottom MLP, interaction, top MLP, loss
``backward`` / ``sync``    autograd, dense-gradient all-reduce
``emb_update`` / ``step``  fused embedding SGD, dense optimizer step
=========================  ================================================================

Every collective runs on its own process group ("channel"), one per issuing
task kind, so the order of collectives within a group is the iteration order
on every rank whatever thread runs the task; that is all gloo needs. NCCL
also needs the order *across* communicators to be the same on every rank
(ranks that issue operations on several communicators in different orders may
deadlock on the device), which several thread groups make rank-dependent: the
plans of :func:`swpipe.workloads.tasks.plan_for` therefore mark every task
that issues a collective ``globally_ordered`` when more than one rank runs
(:func:`swpipe.workloads.tasks.collective_tasks`).

This module holds the step's operations (:class:`DLRMWorkload`); the model
and its autograd functions are in :mod:`swpipe.workloads.dlrm_model`, the
config, batches and synthetic data (pinned for CUDA where they are made) in
:mod:`swpipe.workloads.dlrm_data`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from swpipe.workloads.distenv import CHANNELS, DistEnv, init_distributed
from swpipe.workloads.dlrm_data import KJT, Batch, DLRMConfig, SyntheticData
from swpipe.workloads.dlrm_model import DLRM, ExchangePooled, PooledSum

# DLRMConfig, SyntheticData and init_distributed stay importable here: the workload's one import line
# (notebooks, benchmarks) is ``from swpipe.workloads.dlrm import DLRMConfig, DLRMWorkload, SyntheticData, ...``
__all__ = ["DLRMWorkload", "DLRMConfig", "SyntheticData", "DistEnv", "init_distributed", "CHANNELS"]


@dataclass
class _InputDist:
    """State of one batch's two-phase input all-to-all (TorchRec's splits/tensors requests)."""

    send_values: torch.Tensor
    value_send_splits: List[int]
    recv_lengths: torch.Tensor
    lengths_work: Any
    recv_values: Optional[torch.Tensor] = None
    value_recv_splits: Optional[List[int]] = None
    values_work: Any = None


@dataclass
class ShardInput:
    """The owned tables' bags over the global batch, after the input all-to-all.

    Bags are ordered (source rank, owned table, sample) — the order the
    pooled result is sent back in — and ``ids`` index the fused table storage
    (row ``j * num_embeddings + id`` for the ``j``-th owned table).

    Examples
    --------
    >>> env = init_distributed()
    >>> wl = DLRMWorkload(DLRMConfig.preset("test"), env)
    >>> shard = wl.dedup(wl.input_dist(wl.h2d(SyntheticData(wl.config)[0]).sparse))
    >>> shard.lengths.numel() == 4 * 32, torch.equal(shard.uniq[shard.inverse], shard.ids)
    (True, True)
    >>> env.close()
    """

    ids: torch.Tensor
    offsets: torch.Tensor
    lengths: torch.Tensor
    uniq: Optional[torch.Tensor] = None
    inverse: Optional[torch.Tensor] = None
    occ_bag: Optional[torch.Tensor] = None
    occ_offsets: Optional[torch.Tensor] = None


@dataclass
class Lookup:
    """Pooled embeddings for the local batch and what the fused update needs.

    Examples
    --------
    >>> env = init_distributed()
    >>> wl = DLRMWorkload(DLRMConfig.preset("test"), env)
    >>> emb = wl.lookup(wl.input_dist(wl.h2d(SyntheticData(wl.config)[0]).sparse))
    >>> tuple(emb.pooled.shape), emb.rows.shape[0] == emb.uniq.numel(), emb.rows.requires_grad
    ((32, 4, 8), True, True)
    >>> env.close()
    """

    pooled: torch.Tensor  # [B, T, D], global table order, in the autograd graph
    rows: Optional[torch.Tensor]  # gathered unique rows (an autograd leaf when training)
    uniq: torch.Tensor


class DLRMWorkload:
    """The DLRM model, its optimisers and the primitive operations of one training step.

    Parameters
    ----------
    config : DLRMConfig
    env : DistEnv
        From :func:`init_distributed`.

    Attributes
    ----------
    dense_fn : callable
        What :meth:`dense_forward` calls: the dense arch, or its
        ``torch.compile`` d version in the PT2 plan.
    losses : dict[int, Tensor]
        The local loss of each iteration, written by the forward.
    outputs : dict[int, Tensor]
        Eval predictions of each iteration.

    Examples
    --------
    >>> env = init_distributed()
    >>> wl = DLRMWorkload(DLRMConfig.preset("test"), env)
    >>> batch = SyntheticData(wl.config)[0]
    >>> loss = wl.train_step(batch, 0)
    >>> sorted(wl.losses), bool(loss > 0)
    ([0], True)
    >>> env.close()
    """

    def __init__(self, config: DLRMConfig, env: DistEnv) -> None:
        self.config = config
        self.env = env
        self.device = env.device
        self.model = DLRM(config, env.world_size, env.rank, device=self.device)
        self.dense_params = list(self.model.dense_arch.parameters())
        if config.dense_optimizer == "sgd":
            self.dense_opt: torch.optim.Optimizer = torch.optim.SGD(self.dense_params, lr=config.dense_lr)
        else:
            self.dense_opt = torch.optim.Adagrad(self.dense_params, lr=config.dense_lr)
        # what the tasks train: on CUDA the engine keeps its gradients alive across streams (SWPipeline(state=))
        self.state: List[Any] = [self.model, self.dense_opt]
        self.dense_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self.model.dense_arch
        self.losses: Dict[int, torch.Tensor] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        w = env.world_size
        self._owner_tables = [[t for t in range(config.num_tables) if t % w == r] for r in range(w)]
        order = [t for r in range(w) for t in self._owner_tables[r]]
        # received pooled blocks arrive owner by owner; this puts them back in table order
        self._to_table_order = torch.tensor([order.index(t) for t in range(config.num_tables)], device=self.device)

    # ------------------------------------------------------------------ data

    def h2d(self, batch: Batch, non_blocking: bool = True) -> Batch:
        """Copy a host batch to the device, casting to the model's dtypes.

        On CPU this is a real cast (float64 -> float32, int32 -> int64), so the
        task has a cost like a copy would; on CUDA a non-blocking copy, which
        is asynchronous only from pinned memory: pin the batches where they
        are made (:class:`SyntheticData` with ``device``, :func:`pin_for`),
        not here, where the pinning would be charged to the H2D task.
        """
        dev = self.device
        nb = non_blocking and dev.type == "cuda"
        return Batch(batch.dense.to(dev, torch.float32, non_blocking=nb),
                     batch.sparse.to(dev, torch.int64, non_blocking=nb),
                     batch.labels.to(dev, torch.float32, non_blocking=nb))

    # ---------------------------------------------------- input distribution

    def input_dist_start(self, kjt: KJT) -> _InputDist:
        """Phase 1: start the all-to-all of lengths to the tables' owners (async).

        Each destination rank receives, for the tables it owns, the lengths of
        this rank's samples; values follow in phase 2 once sizes are known.
        """
        w, b = self.env.world_size, kjt.stride()
        lengths = kjt.lengths.view(self.config.num_tables, b)
        per_key = kjt.values_per_key()
        send_lengths = torch.cat([lengths[self._owner_tables[d]].reshape(-1) for d in range(w)])
        send_values = torch.cat([per_key[t] for d in range(w) for t in self._owner_tables[d]])
        value_send_splits = [sum(int(per_key[t].numel()) for t in self._owner_tables[d]) for d in range(w)]
        own = len(self._owner_tables[self.env.rank])
        recv_lengths = send_lengths.new_empty(w * own * b)
        work = dist.all_to_all_single(
            recv_lengths, send_lengths,
            [own * b] * w, [len(self._owner_tables[d]) * b for d in range(w)],
            group=self.env.group("input_lengths"), async_op=True)
        return _InputDist(send_values, value_send_splits, recv_lengths, work)

    def input_dist_wait(self, state: _InputDist) -> _InputDist:
        """Wait phase 1, then start phase 2: the all-to-all of ids (async)."""
        state.lengths_work.wait()
        w = self.env.world_size
        per_source = state.recv_lengths.view(w, -1).sum(1)
        state.value_recv_splits = [int(x) for x in per_source.tolist()]
        state.recv_values = state.send_values.new_empty(sum(state.value_recv_splits))
        state.values_work = dist.all_to_all_single(
            state.recv_values, state.send_values, state.value_recv_splits, state.value_send_splits,
            group=self.env.group("input_values"), async_op=True)
        return state

    def input_dist_finish(self, state: _InputDist) -> ShardInput:
        """Wait phase 2 and turn the received ids into bags over the fused table storage."""
        state.values_work.wait()
        w, own = self.env.world_size, len(self._owner_tables[self.env.rank])
        lengths = state.recv_lengths
        b = lengths.numel() // max(1, w * own)
        # the j-th owned table's rows start at j * num_embeddings in the fused storage
        bag_table = torch.arange(own, device=lengths.device).view(1, own, 1).expand(w, own, b).reshape(-1)
        ids = state.recv_values + torch.repeat_interleave(bag_table * self.config.num_embeddings, lengths)
        offsets = torch.cumsum(lengths, 0) - lengths
        return ShardInput(ids, offsets, lengths)

    def input_dist(self, kjt: KJT) -> ShardInput:
        """Both phases, start to finish (what an unpipelined model does inside its forward)."""
        return self.input_dist_finish(self.input_dist_wait(self.input_dist_start(kjt)))

    # ------------------------------------------------------------ embeddings

    def dedup(self, shard: ShardInput) -> ShardInput:
        """The lookup plan (no weights are read): unique ids, inverse indices, and each unique id's bags.

        One stable sort of the ids gives the unique ids and, for each, the
        bags it occurs in (in bag order): the forward gathers the unique
        rows once, the backward sums each row's bag gradients.
        """
        ids = shard.ids
        sorted_ids, perm = torch.sort(ids, stable=True)
        shard.uniq, inverse_sorted, counts = torch.unique_consecutive(sorted_ids, return_inverse=True,
                                                                      return_counts=True)
        shard.inverse = torch.empty_like(inverse_sorted).scatter_(0, perm, inverse_sorted)
        bags = torch.arange(shard.lengths.numel(), device=ids.device)
        shard.occ_bag = torch.repeat_interleave(bags, shard.lengths)[perm]
        shard.occ_offsets = torch.cumsum(counts, 0) - counts
        return shard

    def lookup(self, shard: ShardInput, train: bool = True) -> Lookup:
        """Gather the unique rows, pool every bag, and all-to-all the pooled rows to the batch owners.

        Each pooled bag equals ``tables["t<k>"](ids, offsets)`` of the
        ``EmbeddingBag``; gathering unique rows first makes the gradient land
        on those rows, which the fused update scatters back into the tables.
        """
        if shard.uniq is None:
            self.dedup(shard)
        c, w = self.config, self.env.world_size
        own = len(self._owner_tables[self.env.rank])
        rows = self.model.emb_weights.index_select(0, shard.uniq)
        if train:
            rows.requires_grad_(True)
        local = PooledSum.apply(rows, shard.inverse, shard.offsets, shard.occ_bag, shard.occ_offsets)
        b = shard.lengths.numel() // max(1, w * own) if own else c.batch_size
        send_splits = [own * b * c.embedding_dim] * w
        recv_splits = [len(self._owner_tables[o]) * b * c.embedding_dim for o in range(w)]
        recv = ExchangePooled.apply(local.reshape(-1), send_splits, recv_splits,
                                     self.env.group("emb_fwd"), self.env.group("emb_bwd"))
        # received owner by owner as [tables of that owner, B, D]; put tables in global order
        by_table = recv.view(c.num_tables, b, c.embedding_dim).index_select(0, self._to_table_order)
        return Lookup(by_table.transpose(0, 1), rows if train else None, shard.uniq)

    @torch.no_grad()
    def emb_update(self, emb: Lookup) -> None:
        """Fused SGD on the owned tables: ``W[u] += -emb_lr * grad(rows)`` for the looked-up rows ``u``.

        Reads the rows' *current* values (another update may have landed since
        the lookup, in semi-sync training), updates them and writes them back;
        the ids are unique, so this equals ``index_add_`` bit for bit and is
        several times faster on CPU.
        """
        if emb.rows is not None and emb.rows.grad is not None:
            weights = self.model.emb_weights
            current = weights.index_select(0, emb.uniq)
            current.add_(emb.rows.grad, alpha=-self.config.emb_lr)
            weights.index_copy_(0, emb.uniq, current)

    # ----------------------------------------------------------------- dense

    def dense_forward(self, batch: Batch, pooled: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(loss, logits)`` of the dense arch on the local batch."""
        logits = self.dense_fn(batch.dense, pooled)
        return F.binary_cross_entropy_with_logits(logits, batch.labels), logits

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to differentiate: the mean over the global batch (``loss / world_size``)."""
        return loss if self.env.world_size == 1 else loss / self.env.world_size

    def sync_dense_grads(self) -> None:
        """All-reduce (sum) the dense gradients in one flat bucket, as DDP does."""
        grads = [p.grad for p in self.dense_params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.env.group("dense_grad"))
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def zero_grad(self) -> None:
        """Drop the dense gradients (``set_to_none``); tables have none (fused update)."""
        self.dense_opt.zero_grad(set_to_none=True)

    def step(self) -> None:
        """The dense optimizer step."""
        self.dense_opt.step()

    # --------------------------------------------------------------- records

    def record_loss(self, iter_idx: int, loss: torch.Tensor) -> None:
        """Keep a detached copy of iteration ``iter_idx``'s loss in :attr:`losses`."""
        self.losses[iter_idx] = loss.detach().clone()

    def record_output(self, iter_idx: int, logits: torch.Tensor) -> None:
        """Keep iteration ``iter_idx``'s predictions (``sigmoid(logits)``) in :attr:`outputs`."""
        self.outputs[iter_idx] = torch.sigmoid(logits.detach())

    def loss_list(self) -> List[torch.Tensor]:
        """Recorded losses in iteration order."""
        return [self.losses[i] for i in sorted(self.losses)]

    def snapshot(self) -> Dict[str, torch.Tensor]:
        """Clones of every parameter (``param.<name>``) and dense gradient (``grad.<name>``)."""
        out = {f"param.{k}": v.detach().clone() for k, v in self.model.named_parameters()}
        for k, v in self.model.dense_arch.named_parameters():
            if v.grad is not None:
                out[f"grad.dense_arch.{k}"] = v.grad.detach().clone()
        return out

    # -------------------------------------------------------------- compound

    def train_step(self, batch: Batch, iter_idx: int) -> torch.Tensor:
        """One plain, unpipelined training step (the reference order of operations)."""
        dev = self.h2d(batch)
        emb = self.lookup(self.dedup(self.input_dist(dev.sparse)))
        self.zero_grad()
        loss, _ = self.dense_forward(dev, emb.pooled)
        self.record_loss(iter_idx, loss)
        self.scaled(loss).backward()
        self.sync_dense_grads()
        self.emb_update(emb)
        self.step()
        return loss.detach()

    @torch.no_grad()
    def eval_step(self, batch: Batch, iter_idx: int) -> torch.Tensor:
        """One plain inference step; returns and records the predictions."""
        dev = self.h2d(batch)
        emb = self.lookup(self.dedup(self.input_dist(dev.sparse)), train=False)
        _, logits = self.dense_forward(dev, emb.pooled)
        self.record_output(iter_idx, logits)
        return self.outputs[iter_idx]
