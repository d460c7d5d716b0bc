"""TorchRec's own test models, sharded and ready to train: what the examples, tests and benchmarks drive.

:func:`sparse_nn` builds TorchRec's ``TestSparseNN`` (``EmbeddingBagCollection``
tables, optionally weighted ones too) or, with ``ec=True``, its
``TestMixedEmbeddingSparseArch`` (``EmbeddingBagCollection`` and
``EmbeddingCollection`` tables), sharded table-wise by
``DistributedModelParallel`` with fused SGD on the tables and SGD on the dense
part, combined in one ``CombinedOptimizer``; :func:`sparse_nn_batches` makes
``ModelInput.generate`` batches for it. :func:`dlrm` is TorchRec's
``DLRMTrain(DLRM(...))`` sized by a :class:`DLRMConfig` (the same build drives
``benchmarks/vs_torchrec.py``), and :func:`dlrm_batches` makes TorchRec
``RandomRecDataset`` batches for it. Every build with the same arguments starts
from the same weights, so several pipelines can be compared on one model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch

__all__ = ["SparseNNConfig", "sparse_nn", "sparse_nn_batches", "DLRMConfig", "dlrm", "dlrm_batches"]


@dataclass(frozen=True)
class SparseNNConfig:
    """The size of a :func:`sparse_nn` model and its batches.

    Examples
    --------
    >>> SparseNNConfig().num_tables, SparseNNConfig(weighted=False).weighted
    (3, False)
    """

    num_tables: int = 3
    num_weighted_tables: int = 2
    num_embeddings: int = 100
    embedding_dim: int = 8
    num_float_features: int = 10
    batch_size: int = 32
    weighted: bool = True
    ec: bool = False
    seed: int = 0


def _tables(config: SparseNNConfig) -> Tuple[List[Any], List[Any]]:
    from torchrec import EmbeddingBagConfig, EmbeddingConfig

    tables: List[Any] = [EmbeddingBagConfig(num_embeddings=config.num_embeddings, embedding_dim=config.embedding_dim,
                                            name=f"table_{i}", feature_names=[f"feature_{i}"])
                         for i in range(config.num_tables)]
    if config.ec:  # TestMixedEmbeddingSparseArch: the same features through an EmbeddingCollection too
        tables += [EmbeddingConfig(num_embeddings=config.num_embeddings, embedding_dim=config.embedding_dim,
                                   name=f"ec_table_{i}", feature_names=[f"ec_feature_{i}"]) for i in range(2)]
        return tables, []
    weighted = [EmbeddingBagConfig(num_embeddings=config.num_embeddings // 2, embedding_dim=config.embedding_dim // 2,
                                   name=f"weighted_table_{i}", feature_names=[f"weighted_feature_{i}"])
                for i in range(config.num_weighted_tables)] if config.weighted else []
    return tables, weighted


def sparse_nn(config: SparseNNConfig = SparseNNConfig(), device: Optional[torch.device] = None,
              lr: float = 0.1) -> Tuple[torch.nn.Module, Any]:
    """TorchRec's ``TestSparseNN`` (or, ``ec=True``, ``TestMixedEmbeddingSparseArch``), sharded; ``(model, optimizer)``.

    Needs an initialised default process group (gloo on CPU). Table-wise
    sharding over the group's ranks, fused SGD on the tables
    (``EmbeddingComputeKernel.FUSED``), SGD on the dense parameters.
    """
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.test_utils.emb_sharder import TestEBCSharder, TestECSharder
    from torchrec.distributed.test_utils.test_model import TestMixedEmbeddingSparseArch, TestSparseNN
    from torchrec.distributed.types import ShardingEnv, ShardingType
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    device = device or torch.device("cpu")
    tables, weighted = _tables(config)
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": lr}
    kind, kernel = ShardingType.TABLE_WISE.value, EmbeddingComputeKernel.FUSED.value
    sharders: List[Any] = [TestEBCSharder(kind, kernel, fused)] + ([TestECSharder(kind, kernel, fused)]
                                                                  if config.ec else [])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        if config.ec:
            module = TestMixedEmbeddingSparseArch(tables=tables, num_float_features=config.num_float_features,
                                                  dense_device=device, sparse_device=torch.device("meta"))
        else:
            module = TestSparseNN(tables=tables, weighted_tables=weighted, num_float_features=config.num_float_features,
                                  dense_device=device, sparse_device=torch.device("meta"))
        model = DistributedModelParallel(module=copy.deepcopy(module), device=device, sharders=sharders,
                                         env=ShardingEnv.from_process_group(dist.GroupMember.WORLD))
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                  lambda params: torch.optim.SGD(params, lr=lr))
    return model, CombinedOptimizer([model.fused_optimizer, dense])


def sparse_nn_batches(config: SparseNNConfig, num: int, world_size: int = 1, rank: int = 0,
                      start: int = 0) -> List[Any]:
    """``num`` of TorchRec's ``ModelInput.generate`` batches (this rank's slice), seeded by their index.

    Examples
    --------
    Needs TorchRec; ``tests/test_torchrec_dropin.py`` uses them.
    """
    from torchrec.distributed.test_utils.test_model import ModelInput

    tables, weighted = _tables(config)
    out = []
    with torch.random.fork_rng(devices=[]):
        for i in range(start, start + num):
            _, local = ModelInput.generate(batch_size=config.batch_size, world_size=world_size,
                                           num_float_features=config.num_float_features, tables=tables,
                                           weighted_tables=weighted, random_seed=config.seed * 1000 + i)
            out.append(local[rank])
    return out


@dataclass(frozen=True)
class DLRMConfig:
    """The size of a :func:`dlrm` model, its optimizers and its :func:`dlrm_batches`.

    ``num_tables`` tables of ``num_embeddings`` rows, one feature each (``t0``, ``t1``, ...); ``bottom_mlp``
    and ``top_mlp`` are the dense and over arch's hidden sizes (the dense arch ends in ``embedding_dim``, the
    over arch in 1). ``batch_size`` is per rank; a batch has up to ``max_ids`` ids per feature and sample.

    Examples
    --------
    >>> DLRMConfig().num_tables, DLRMConfig(batch_size=512).batch_size
    (4, 512)
    """

    num_tables: int = 4
    num_embeddings: int = 200
    embedding_dim: int = 8
    num_dense: int = 13
    bottom_mlp: Tuple[int, ...] = (16, 8)
    top_mlp: Tuple[int, ...] = (16,)
    batch_size: int = 32
    max_ids: int = 6
    dense_lr: float = 0.05
    emb_lr: float = 1.0
    seed: int = 0


def dlrm(config: DLRMConfig = DLRMConfig(), device: Optional[torch.device] = None) -> Tuple[torch.nn.Module, Any]:
    """TorchRec's ``DLRMTrain(DLRM(EmbeddingBagCollection))``, sharded table-wise; ``(model, optimizer)``.

    Needs an initialised default process group (gloo on CPU). TorchRec's
    sharding planner places the tables table-wise over the group's ranks;
    fused exact SGD on the tables, SGD on the dense parameters, combined in one
    ``CombinedOptimizer``. Built under ``torch.manual_seed(config.seed)`` (the
    global generator left as it was), so two builds start from the same weights.
    """
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingType
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    device = device or torch.device("cpu")
    c = config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(c.seed)
        tables = [EmbeddingBagConfig(name=f"t{t}", embedding_dim=c.embedding_dim, num_embeddings=c.num_embeddings,
                                     feature_names=[f"t{t}"]) for t in range(c.num_tables)]
        ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        module = DLRMTrain(DLRM(embedding_bag_collection=ebc, dense_in_features=c.num_dense,
                                dense_arch_layer_sizes=[*c.bottom_mlp, c.embedding_dim],
                                over_arch_layer_sizes=[*c.top_mlp, 1], dense_device=device))
        sharders = [EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD,
                                                                "learning_rate": c.emb_lr})]
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=dist.get_world_size(), compute_device=device.type),
            constraints={f"t{t}": ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value])
                         for t in range(c.num_tables)})
        plan = planner.collective_plan(module, sharders, dist.GroupMember.WORLD)
        model = DistributedModelParallel(module=module, device=device, plan=plan, sharders=sharders)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                  lambda params: torch.optim.SGD(params, lr=c.dense_lr))
    return model, CombinedOptimizer([model.fused_optimizer, dense])


def dlrm_batches(config: DLRMConfig, num: int, rank: int = 0) -> List[Any]:
    """``num`` TorchRec ``Batch`` objects for :func:`dlrm` from TorchRec's ``RandomRecDataset``, seeded by
    ``config.seed`` and ``rank`` (each rank its own batches).

    Examples
    --------
    Needs TorchRec; ``tests/test_torchrec_dropin.py`` uses them.
    """
    from torchrec.datasets.random import RandomRecDataset

    with torch.random.fork_rng(devices=[]):
        return list(RandomRecDataset(keys=[f"t{t}" for t in range(config.num_tables)], batch_size=config.batch_size,
                                     hash_size=config.num_embeddings, ids_per_feature=config.max_ids,
                                     min_ids_per_feature=0, num_dense=config.num_dense,
                                     manual_seed=config.seed * 1000 + rank, num_batches=num,
                                     num_generated_batches=num))
