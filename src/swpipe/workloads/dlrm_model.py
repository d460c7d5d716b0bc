"""The DLRM model: sharded embedding tables, the dense arch, and the autograd functions of the lookup.

:class:`DLRM` holds the rank's owned tables (table-wise sharding: rank ``r``
owns table ``t`` when ``t % world_size == r``) in one fused tensor and the
replicated :class:`DenseArch` (bottom MLP, interaction, top MLP). The two
autograd functions are what :meth:`DLRMWorkload.lookup
<swpipe.workloads.dlrm.DLRMWorkload.lookup>` builds its graph from: a
sum-pool of gathered rows whose backward pools row gradients the same way,
and the all-to-all of pooled embeddings (gradients back on another group).
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from swpipe.workloads.dlrm_data import DLRMConfig

__all__ = ["DLRM", "DenseArch", "PooledSum", "ExchangePooled"]


def _mlp(sizes: Sequence[int], last_activation: bool) -> nn.Sequential:
    layers: List[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if last_activation or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseArch(nn.Module):
    """Bottom MLP, interaction and top MLP: ``(dense [B, F], pooled [B, T, D]) -> logits [B]``.

    This is the part ``torch.compile`` compiles in the PT2 variant.

    Examples
    --------
    >>> cfg = DLRMConfig.preset("test")
    >>> arch = DenseArch(cfg)
    >>> arch(torch.zeros(5, cfg.num_dense), torch.zeros(5, cfg.num_tables, cfg.embedding_dim)).shape
    torch.Size([5])
    """

    def __init__(self, config: DLRMConfig) -> None:
        super().__init__()
        c = config
        self.interaction = c.interaction
        self.bottom = _mlp((c.num_dense, *c.bottom_mlp, c.embedding_dim), last_activation=True)
        n = c.num_tables + 1
        inter = c.embedding_dim + (n * (n - 1) // 2 if c.interaction == "dot" else c.num_tables * c.embedding_dim)
        self.top = _mlp((inter, *c.top_mlp, 1), last_activation=False)
        if c.interaction == "dot":
            rows, cols = torch.tril_indices(n, n, offset=-1)
            self.register_buffer("_tri_rows", rows, persistent=False)
            self.register_buffer("_tri_cols", cols, persistent=False)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits ``[B]`` from dense features ``[B, F]`` and pooled embeddings ``[B, T, D]``."""
        z = self.bottom(dense)
        if self.interaction == "dot":
            feats = torch.cat([z.unsqueeze(1), pooled], dim=1)
            dots = torch.bmm(feats, feats.transpose(1, 2))
            inter = torch.cat([z, dots[:, self._tri_rows, self._tri_cols]], dim=1)
        else:
            inter = torch.cat([z, pooled.flatten(1)], dim=1)
        return self.top(inter).squeeze(1)


class DLRM(nn.Module):
    """The rank-local model: owned embedding tables plus the replicated dense arch.

    The owned tables live in one fused ``[num_owned * num_embeddings, dim]``
    tensor (``emb_weights``, as FBGEMM's table-batched embedding stores
    them), and each ``tables["t<k>"]`` is an ``nn.EmbeddingBag`` whose weight
    is a view of its rows, so one lookup and one update serve all tables.
    Table ``t`` is initialised from ``(seed, t)`` and the dense arch from
    ``seed`` alone, so every world size starts from the same global model.

    Examples
    --------
    >>> m = DLRM(DLRMConfig.preset("test"), world_size=2, rank=1)
    >>> m.owned_tables, type(m.tables["t1"]).__name__, m.tables["t1"].mode
    ([1, 3], 'EmbeddingBag', 'sum')
    >>> m.tables["t3"].weight.data_ptr() == m.emb_weights[200:].data_ptr()
    True
    """

    def __init__(self, config: DLRMConfig, world_size: int = 1, rank: int = 0,
                 device: Optional[torch.device] = None) -> None:
        super().__init__()
        self.config = config
        self.owned_tables = [t for t in range(config.num_tables) if t % world_size == rank]
        e, d = config.num_embeddings, config.embedding_dim
        weights = torch.empty(len(self.owned_tables) * e, d)
        for j, t in enumerate(self.owned_tables):
            g = torch.Generator().manual_seed(config.seed * 7919 + 1 + t)
            bound = 1.0 / math.sqrt(d)
            weights[j * e:(j + 1) * e] = torch.rand(e, d, generator=g) * 2 * bound - bound
        # Created on the device first: the table modules are views, which Module.to() would not keep.
        self.register_buffer("emb_weights", weights.to(device or "cpu"))
        self.tables = nn.ModuleDict()
        for j, t in enumerate(self.owned_tables):
            view = self.emb_weights[j * e:(j + 1) * e]
            bag = nn.EmbeddingBag(e, d, mode="sum", _weight=view, device=view.device)
            # Tables are updated by the fused SGD in DLRMWorkload.emb_update, never through .grad.
            bag.weight.requires_grad_(False)
            self.tables[f"t{t}"] = bag
        # fork_rng: building the model must not move the caller's global RNG
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.dense_arch = DenseArch(config).to(device or "cpu")


class ExchangePooled(torch.autograd.Function):
    """All-to-all of pooled embeddings (forward on one group, gradient back on another)."""

    @staticmethod
    def forward(ctx: Any, send: torch.Tensor, send_splits: List[int], recv_splits: List[int],
                fwd_group: Any, bwd_group: Any) -> torch.Tensor:
        ctx.send_splits, ctx.recv_splits, ctx.bwd_group = send_splits, recv_splits, bwd_group
        recv = send.new_empty(sum(recv_splits))
        dist.all_to_all_single(recv, send.contiguous(), recv_splits, send_splits, group=fwd_group)
        return recv

    @staticmethod
    def backward(ctx: Any, grad_recv: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        grad_send = grad_recv.new_empty(sum(ctx.send_splits))
        dist.all_to_all_single(grad_send, grad_recv.contiguous(), ctx.send_splits, ctx.recv_splits,
                               group=ctx.bwd_group)
        return grad_send, None, None, None, None


class PooledSum(torch.autograd.Function):
    """Sum-pool bags of gathered rows; the backward pools each row's bag gradients the same way.

    Same values as ``F.embedding_bag(..., mode="sum")`` and its gradient. The
    gradient of unique row ``u`` is the sum of the gradients of the bags that
    contain ``u``: itself an embedding-bag sum, over "bags" made of each row's
    occurrences (``occ_bag`` grouped by ``occ_offsets``, prepared by
    :meth:`~swpipe.workloads.dlrm.DLRMWorkload.dedup` before the lookup, so
    the sort is off the backward's path). That is what a table-batched
    embedding's backward does, and on CPU it is several times faster than
    ``index_add_``.
    """

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor,
                occ_bag: torch.Tensor, occ_offsets: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(occ_bag, occ_offsets)
        return F.embedding_bag(inverse, rows, offsets, mode="sum")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        occ_bag, occ_offsets = ctx.saved_tensors
        return F.embedding_bag(occ_bag, grad.contiguous(), occ_offsets, mode="sum"), None, None, None, None
