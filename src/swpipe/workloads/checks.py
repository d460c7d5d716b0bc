"""Run the serial loops and a set of plans on one rank and return everything to compare.

:func:`run_all` is what the multi-rank tests spawn on every rank (see
:func:`swpipe.workloads.launch.spawn`): it trains the plain serial loop, the
semi-sync reference, the ``model.eval()`` loop and each requested plan (under
each thread map) on fresh copies of the model over the same batches, and
returns the losses / predictions and final parameters of each, so the caller
can assert equality across plans and across ranks.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import torch

from swpipe.workloads.distenv import DistEnv
from swpipe.workloads.dlrm import DLRMWorkload
from swpipe.workloads.dlrm_data import DLRMConfig, SyntheticData
from swpipe.workloads.reference import emb_staleness, eval_reference, semi_sync_reference, train_reference
from swpipe.workloads.tasks import EVAL_PIPELINES, plan_for

__all__ = ["run_all", "TORCHREC_SEMI_SYNC_ORDER"]

# TorchRec's semi-sync order: the next batch's lookup is started after this batch's dense backward,
# before its embedding backward (one embedding update of staleness).
TORCHREC_SEMI_SYNC_ORDER = ["H2D", "InputDistStart", "ZeroGrad", "InputDistWait", "Forward", "Backward",
                            "EmbLookup", "EmbBackward", "OptimizerStep"]


def run_all(env: DistEnv, config: DLRMConfig, names: Sequence[str], iters: int,
            thread_maps: Sequence[Optional[str]] = (None, "by_stream"), num_threads: Optional[int] = 1
            ) -> Dict[Tuple[str, Optional[str]], Any]:
    """Train/evaluate every variant on this rank; returns ``{(label, thread_map): result}``.

    A result is ``{"losses": [...], "params": {...}}`` for training and
    ``{"outputs": [...]}`` for eval. Labels are pipeline names plus
    ``"reference"``, ``"eval_reference"``, ``"semi_sync_reference_lag1"`` and
    ``"semi_sync_torchrec_order"``. Every rank must call it with the same
    arguments (the collectives must match).

    Parameters
    ----------
    env : DistEnv
    config : DLRMConfig
    names : sequence of str
        Pipeline names (eager: no torch.compile).
    iters : int
    thread_maps : sequence of (str or None)
    num_threads : int, optional
        ``torch.set_num_threads`` for the run.

    Returns
    -------
    dict

    Examples
    --------
    >>> from swpipe.workloads.dlrm import init_distributed
    >>> env = init_distributed()
    >>> out = run_all(env, DLRMConfig.preset("test"), ["sparse_dist"], iters=2, thread_maps=[None])
    >>> sorted(label for label, _ in out)[:3]
    ['eval_reference', 'reference', 'semi_sync_reference_lag1']
    >>> all(torch.equal(a, b) for a, b in zip(out[("sparse_dist", None)]["losses"], out[("reference", None)]["losses"]))
    True
    >>> env.close()
    """
    from swpipe_core.engine.pipeline import SWPipeline
    from swpipe_core.engine.workers import with_thread_map

    if num_threads is not None:
        torch.set_num_threads(num_threads)
    batches = SyntheticData(config, env.world_size, env.rank, device=env.device).batches(iters)  # pinned on CUDA
    out: Dict[Tuple[str, Optional[str]], Any] = {}

    def train_result(wl: DLRMWorkload) -> Dict[str, Any]:
        params = {k: v for k, v in wl.snapshot().items()}
        return {"losses": wl.loss_list(), "params": params}

    wl = DLRMWorkload(config, env)
    train_reference(wl, batches)
    out[("reference", None)] = train_result(wl)
    wl = DLRMWorkload(config, env)
    semi_sync_reference(wl, batches, lag=1)
    out[("semi_sync_reference_lag1", None)] = train_result(wl)
    out[("eval_reference", None)] = {"outputs": eval_reference(DLRMWorkload(config, env), batches)}

    variants = [(n, n, None) for n in names]
    if "semi_sync" in names:
        variants.append(("semi_sync_torchrec_order", "semi_sync", TORCHREC_SEMI_SYNC_ORDER))
    for label, name, order in variants:
        for tm in thread_maps:
            wl = DLRMWorkload(config, env)
            plan = plan_for(name, wl, compile_backend=None, compiled_autograd=None)
            if order is not None:
                plan = plan.replace(enqueue_order=order, pipeline_depth=plan.pipeline_depth)
                assert emb_staleness(plan) == 1
            if tm is not None:
                plan = with_thread_map(plan, tm)
            with SWPipeline(plan, device=env.device, state=wl.state) as pipe:
                pipe.run(iter(batches))
            if name in EVAL_PIPELINES:
                out[(label, tm)] = {"outputs": [wl.outputs[i] for i in range(iters)]}
            else:
                out[(label, tm)] = train_result(wl)
    return out
