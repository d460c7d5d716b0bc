"""Real workloads for swpipe: a DLRM-style model over ``torch.distributed`` and its pipeline task functions.

=====================  ================================================================
module                 what
=====================  ================================================================
``dlrm``               the workload: the step's primitives (``DLRMWorkload``)
``dlrm_model``         the model: sharded tables, dense arch, the lookup's autograd functions
``dlrm_data``          config, batches, synthetic data, pinning for CUDA
``distenv``            ``init_distributed``: join torchrun's job (or one rank), groups, timeouts
``agree``              what ranks must agree on: folded checks, one plan, slowest-rank costs
``tasks``              task functions by name for every TorchRec plan (``fns_for``)
``reference``          plain serial loops every plan is checked against
``launch``             ``spawn``: run a function on N loopback ranks
``bench``              serial vs each plan, side by side (``swpipe demo``, benchmarks)
``autoplan``           the demo's auto-scheduled plan: safe task graph, measured costs, search
``checks``             everything a multi-rank equivalence test compares
=====================  ================================================================
"""

from __future__ import annotations

from swpipe.workloads.distenv import DistEnv, init_distributed
from swpipe.workloads.dlrm import DLRMWorkload
from swpipe.workloads.dlrm_data import KJT, Batch, DLRMConfig, SyntheticData
from swpipe.workloads.dlrm_model import DLRM
from swpipe.workloads.launch import spawn
from swpipe.workloads.reference import emb_staleness, eval_reference, same_results, semi_sync_reference, train_reference
from swpipe.workloads.tasks import fns_for, plan_for, task_fns

__all__ = [
    "DLRM", "KJT", "Batch", "DistEnv", "DLRMConfig", "DLRMWorkload", "SyntheticData", "init_distributed",
    "spawn", "emb_staleness", "eval_reference", "same_results", "semi_sync_reference", "train_reference",
    "fns_for", "plan_for", "task_fns",
]
