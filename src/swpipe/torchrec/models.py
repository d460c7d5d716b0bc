"""TorchRec's own test models, sharded and ready to train: what the examples, tests and benchmarks drive.

:func:`sparse_nn` builds TorchRec's ``TestSparseNN`` (``EmbeddingBagCollection``
tables, optionally weighted ones too) or, with ``ec=True``, its
``TestMixedEmbeddingSparseArch`` (``EmbeddingBagCollection`` and
``EmbeddingCollection`` tables), sharded table-wise by
``DistributedModelParallel`` with fused SGD on the tables and SGD on the dense
part, combined in one ``CombinedOptimizer``; :func:`sparse_nn_batches` makes
``ModelInput.generate`` batches for it. :func:`dlrm` is TorchRec's DLRM (the
peer workload of ``swpipe.workloads.torchrec_peer``). Every build with the
same arguments starts from the same weights, so several pipelines can be
compared on one model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch

__all__ = ["SparseNNConfig", "sparse_nn", "sparse_nn_batches", "dlrm", "dlrm_batches"]


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


def dlrm(preset: str = "test", device: Optional[torch.device] = None, **changes: Any) -> Tuple[torch.nn.Module, Any]:
    """TorchRec's ``DLRMTrain(DLRM(...))`` sized like the workload preset, sharded; ``(model, optimizer)``."""
    from swpipe.workloads.dlrm_data import DLRMConfig
    from swpipe.workloads.torchrec_peer import build_model

    peer = build_model(DLRMConfig.preset(preset, **changes), device)
    return peer.model, peer.optimizer


def dlrm_batches(num: int, preset: str = "test", world_size: int = 1, rank: int = 0, **changes: Any) -> List[Any]:
    """TorchRec ``Batch`` objects for :func:`dlrm` (this rank's slice)."""
    from swpipe.workloads.dlrm_data import DLRMConfig
    from swpipe.workloads.torchrec_peer import to_torchrec_batches

    return to_torchrec_batches(DLRMConfig.preset(preset, **changes), num, world_size, rank)
