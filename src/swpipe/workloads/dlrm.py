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

Host batches bound for a CUDA device are pinned (page-locked) where they are
made, :class:`SyntheticData` with ``device`` or :func:`pin_for`: a
``non_blocking`` copy from pageable memory blocks the host, so the H2D task
would not overlap anything, while the simulator models it as asynchronous.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from swpipe.workloads.distenv import CHANNELS, DistEnv, init_distributed

__all__ = [
    "DLRMConfig",
    "KJT",
    "Batch",
    "SyntheticData",
    "DistEnv",
    "init_distributed",
    "DLRM",
    "DLRMWorkload",
    "CHANNELS",
    "pins_batches",
    "pin_for",
]



@dataclass(frozen=True)
class DLRMConfig:
    """Sizes, optimisers and seed of the workload.

    ``batch_size`` is the per-rank batch; the global batch is
    ``batch_size * world_size`` and rank ``r`` trains rows
    ``[r * batch_size, (r + 1) * batch_size)`` of it, so a run at any world
    size sees the same global data.

    Examples
    --------
    >>> cfg = DLRMConfig.preset("test")
    >>> cfg.num_tables, cfg.batch_size, cfg.interaction
    (4, 32, 'dot')
    >>> DLRMConfig(num_tables=0)
    Traceback (most recent call last):
    ...
    ValueError: DLRMConfig.num_tables must be >= 1, got 0
    """

    num_tables: int = 8
    num_embeddings: int = 4000
    embedding_dim: int = 16
    num_dense: int = 13
    bottom_mlp: Tuple[int, ...] = (128, 64)
    top_mlp: Tuple[int, ...] = (128, 64)
    interaction: str = "dot"
    batch_size: int = 512
    max_bag: int = 24
    id_skew: float = 2.0
    dense_optimizer: str = "sgd"
    dense_lr: float = 0.05
    emb_lr: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_tables", "num_embeddings", "embedding_dim", "num_dense", "batch_size", "max_bag"):
            if getattr(self, name) < 1:
                raise ValueError(f"DLRMConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.interaction not in ("dot", "cat"):
            raise ValueError(f"DLRMConfig.interaction must be 'dot' or 'cat', got {self.interaction!r}")
        if self.dense_optimizer not in ("sgd", "adagrad"):
            raise ValueError(f"DLRMConfig.dense_optimizer must be 'sgd' or 'adagrad', got {self.dense_optimizer!r}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "DLRMConfig":
        """A named size: ``"test"`` (tiny, for unit tests) or ``"demo"`` (the demo and benchmarks).

        Raises
        ------
        ValueError
            For an unknown preset name.
        """
        presets = {
            "test": dict(num_tables=4, num_embeddings=200, embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(16,),
                         batch_size=32, max_bag=6),
            "demo": dict(),
        }
        if name not in presets:
            raise ValueError(f"unknown DLRMConfig preset {name!r}; choose one of {sorted(presets)}")
        return replace(cls(**presets[name]), **overrides)


class KJT:
    """A keyed jagged tensor: for each key (table) and sample, a bag of ids.

    ``lengths`` is key-major (all samples of key 0, then key 1, ...) and
    ``values`` holds the ids in the same order, as in TorchRec's
    ``KeyedJaggedTensor``.

    Examples
    --------
    >>> kjt = KJT(["t0", "t1"], values=torch.tensor([1, 2, 3, 4]), lengths=torch.tensor([2, 0, 1, 1]))
    >>> kjt.stride(), kjt.length_per_key()
    (2, [2, 2])
    >>> kjt.offsets().tolist()
    [0, 2, 2, 3, 4]
    >>> [v.tolist() for v in kjt.values_per_key()]
    [[1, 2], [3, 4]]
    """

    def __init__(self, keys: Sequence[str], values: torch.Tensor, lengths: torch.Tensor) -> None:
        self.keys = list(keys)
        self.values = values
        self.lengths = lengths
        if lengths.numel() % max(1, len(self.keys)):
            raise ValueError(f"KJT: {lengths.numel()} lengths do not split evenly over {len(self.keys)} keys")

    def stride(self) -> int:
        """Samples per key (the batch size)."""
        return self.lengths.numel() // max(1, len(self.keys))

    def offsets(self) -> torch.Tensor:
        """``[0, cumsum(lengths)]``."""
        return torch.cat([self.lengths.new_zeros(1), torch.cumsum(self.lengths, 0)])

    def length_per_key(self) -> List[int]:
        """Number of ids of each key."""
        return self.lengths.view(len(self.keys), -1).sum(1).tolist()

    def values_per_key(self) -> List[torch.Tensor]:
        """The ids of each key (views into ``values``)."""
        return list(torch.split(self.values, self.length_per_key()))

    def to(self, device: torch.device, dtype: Optional[torch.dtype] = None, non_blocking: bool = False) -> "KJT":
        """A copy on ``device`` with integer tensors cast to ``dtype``."""
        return KJT(self.keys, self.values.to(device, dtype, non_blocking=non_blocking),
                   self.lengths.to(device, dtype, non_blocking=non_blocking))

    def pin_memory(self) -> "KJT":
        """A copy in page-locked memory (for non-blocking host-to-GPU copies; needs CUDA)."""
        return KJT(self.keys, self.values.pin_memory(), self.lengths.pin_memory())

    def __repr__(self) -> str:
        return f"KJT(keys={self.keys}, stride={self.stride()}, values={self.values.numel()})"


@dataclass
class Batch:
    """One rank's batch: dense features, sparse features and labels.

    Host batches carry compact dtypes (float64 dense, int32 ids, uint8
    labels) as a loader would produce; :meth:`DLRMWorkload.h2d` casts them to
    the model's dtypes on the device.

    Examples
    --------
    >>> b = SyntheticData(DLRMConfig.preset("test"))[0]
    >>> b.dense.shape[0] == b.labels.shape[0] == b.sparse.stride() == 32
    True
    """

    dense: torch.Tensor
    sparse: KJT
    labels: torch.Tensor

    def pin_memory(self) -> "Batch":
        """A copy in page-locked memory (for non-blocking host-to-GPU copies; needs CUDA)."""
        return Batch(self.dense.pin_memory(), self.sparse.pin_memory(), self.labels.pin_memory())


def pins_batches(device: Union[str, torch.device, None]) -> bool:
    """Whether host batches bound for ``device`` are pinned: on CUDA only.

    A ``non_blocking`` copy to a CUDA device is asynchronous only from
    page-locked memory; from pageable memory it blocks the host. Elsewhere
    pinning is of no use (and the CPU build of torch raises on it).

    Parameters
    ----------
    device : str, torch.device or None
        ``None`` means the batches stay on the host (no device copy).

    Returns
    -------
    bool

    Examples
    --------
    >>> pins_batches("cuda:1"), pins_batches(torch.device("cpu")), pins_batches(None)
    (True, False, False)
    """
    return device is not None and torch.device(device).type == "cuda"


def pin_for(batches: Sequence[Batch], device: Union[str, torch.device, None]) -> List[Batch]:
    """``batches`` made ready for the H2D copy to ``device``: each pinned once on CUDA, as they are elsewhere.

    Call it where the batches are made or handed in, once, and reuse the
    result for every run: pinning copies each batch into page-locked memory,
    which is not the H2D task's work (and a batch already pinned is not
    copied again).

    Parameters
    ----------
    batches : sequence of Batch
    device : str, torch.device or None
        The device the H2D task copies to (:func:`pins_batches`).

    Returns
    -------
    list of Batch
        The same objects when ``device`` is not CUDA.

    Examples
    --------
    >>> data = SyntheticData(DLRMConfig.preset("test")).batches(2)
    >>> all(a is b for a, b in zip(pin_for(data, "cpu"), data))
    True
    """
    if not pins_batches(device):
        return list(batches)
    return [b.pin_memory() for b in batches]


class SyntheticData:
    """A deterministic synthetic dataset: global batch ``i`` depends only on ``(seed, i)``.

    Ids follow a skewed distribution (``u ** id_skew`` scaled to the table
    size) so that bags repeat hot ids, as real click logs do. Labels come from
    a fixed logistic teacher over the dense features and the parity of the
    first id of each bag, so the loss can fall.

    Parameters
    ----------
    config : DLRMConfig
    world_size, rank : int
        The rank's slice of each global batch is returned.
    device : str or torch.device, optional
        The device the batches are copied to (the workload's,
        ``env.device``): on CUDA every batch is returned pinned
        (:func:`pins_batches`), so its H2D copy is asynchronous. Default: not
        pinned.

    Examples
    --------
    >>> data = SyntheticData(DLRMConfig.preset("test"))
    >>> b = data[0]
    >>> b.dense.shape, b.dense.dtype, b.sparse.values.dtype, b.labels.shape
    (torch.Size([32, 13]), torch.float64, torch.int32, torch.Size([32]))
    >>> torch.equal(data[3].sparse.values, data[3].sparse.values)
    True
    """

    def __init__(self, config: DLRMConfig, world_size: int = 1, rank: int = 0,
                 device: Union[str, torch.device, None] = None) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"SyntheticData: rank {rank} is not in [0, {world_size})")
        self.config = config
        self.world_size = world_size
        self.rank = rank
        self.device = device

    def global_batch(self, index: int) -> Batch:
        """The whole global batch ``index`` (all ranks' rows)."""
        c = self.config
        n = c.batch_size * self.world_size
        g = torch.Generator().manual_seed(c.seed * 1_000_003 + index)
        dense = torch.randn(n, c.num_dense, generator=g, dtype=torch.float64)
        lengths = torch.randint(0, c.max_bag + 1, (c.num_tables, n), generator=g, dtype=torch.int32)
        u = torch.rand(int(lengths.sum()), generator=g, dtype=torch.float64)
        values = (u.pow(c.id_skew) * c.num_embeddings).to(torch.int32).clamp_(max=c.num_embeddings - 1)
        teacher = torch.Generator().manual_seed(c.seed)
        w = torch.randn(c.num_dense, generator=teacher, dtype=torch.float64)
        first = torch.zeros(c.num_tables, n, dtype=torch.float64)
        starts = torch.cumsum(lengths.reshape(-1), 0) - lengths.reshape(-1)
        nonempty = lengths.reshape(-1) > 0
        first.view(-1)[nonempty] = (values[starts[nonempty].long()] % 2).to(torch.float64) * 2 - 1
        logit = dense @ w / math.sqrt(c.num_dense) + first.sum(0) / math.sqrt(c.num_tables)
        labels = (torch.rand(n, generator=g, dtype=torch.float64) < torch.sigmoid(2 * logit)).to(torch.uint8)
        keys = [f"t{t}" for t in range(c.num_tables)]
        return Batch(dense, KJT(keys, values, lengths.reshape(-1)), labels)

    def __getitem__(self, index: int) -> Batch:
        """This rank's slice of global batch ``index``, pinned when ``device`` is CUDA."""
        batch = self._slice(index)
        return batch.pin_memory() if pins_batches(self.device) else batch

    def _slice(self, index: int) -> Batch:
        whole = self.global_batch(index)
        b, r, n = self.config.batch_size, self.rank, self.config.batch_size * self.world_size
        lengths = whole.sparse.lengths.view(self.config.num_tables, n)
        rows = lengths[:, r * b:(r + 1) * b]
        starts = torch.cumsum(lengths, 1) - lengths  # per table, where each sample's ids begin
        chunks = []
        table_base = 0
        for t, per_key in enumerate(whole.sparse.length_per_key()):
            lo = int(starts[t, r * b]) if b else 0
            hi = lo + int(rows[t].sum())
            chunks.append(whole.sparse.values[table_base + lo:table_base + hi])
            table_base += per_key
        sparse = KJT(whole.sparse.keys, torch.cat(chunks), rows.reshape(-1).contiguous())
        return Batch(whole.dense[r * b:(r + 1) * b].contiguous(), sparse, whole.labels[r * b:(r + 1) * b].contiguous())

    def batches(self, num: int, start: int = 0) -> List[Batch]:
        """``num`` consecutive batches, materialised (so timing never includes generation, nor pinning)."""
        return [self[i] for i in range(start, start + num)]


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


class _ExchangePooled(torch.autograd.Function):
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


class _PooledSum(torch.autograd.Function):
    """Sum-pool bags of gathered rows; the backward pools each row's bag gradients the same way.

    Same values as ``F.embedding_bag(..., mode="sum")`` and its gradient. The
    gradient of unique row ``u`` is the sum of the gradients of the bags that
    contain ``u``: itself an embedding-bag sum, over "bags" made of each row's
    occurrences (``occ_bag`` grouped by ``occ_offsets``, prepared by
    :meth:`DLRMWorkload.dedup` before the lookup, so the sort is off the
    backward's path). That is what a table-batched embedding's backward does,
    and on CPU it is several times faster than ``index_add_``.
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
        local = _PooledSum.apply(rows, shard.inverse, shard.offsets, shard.occ_bag, shard.occ_offsets)
        b = shard.lengths.numel() // max(1, w * own) if own else c.batch_size
        send_splits = [own * b * c.embedding_dim] * w
        recv_splits = [len(self._owner_tables[o]) * b * c.embedding_dim for o in range(w)]
        recv = _ExchangePooled.apply(local.reshape(-1), send_splits, recv_splits,
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
