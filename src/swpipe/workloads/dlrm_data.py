"""The DLRM workload's sizes and data: its config, keyed jagged ids, batches, and a synthetic dataset.

:class:`DLRMConfig` fixes the model's sizes, optimisers and seed;
:class:`SyntheticData` makes deterministic batches (:class:`Batch`, sparse
features as a :class:`KJT`) for any world size. Host batches bound for a
CUDA device are pinned (page-locked) where they are made
(:class:`SyntheticData` with ``device``, or :func:`pin_for`): a
``non_blocking`` copy from pageable memory blocks the host, so the H2D task
would not overlap anything, while the simulator models it as asynchronous.
The model and the step's operations are in :mod:`swpipe.workloads.dlrm`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch

__all__ = ["DLRMConfig", "KJT", "Batch", "SyntheticData", "pins_batches", "pin_for"]


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
    labels) as a loader would produce; :meth:`DLRMWorkload.h2d
    <swpipe.workloads.dlrm.DLRMWorkload.h2d>` casts them to the model's
    dtypes on the device.

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
