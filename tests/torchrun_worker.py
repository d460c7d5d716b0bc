"""One rank of the torchrun test (``tests/test_torchrun.py`` launches it; not a test module itself).

Run as ``python -m torch.distributed.run --nproc-per-node 2 tests/torchrun_worker.py OUT_DIR``.
Each rank joins torchrun's job with :func:`init_distributed` (no arguments),
records the order of the collectives it issues on each process group, trains
a TorchRec plan (one thread per stream, data wrapped by ``agree_on_end``) and
the shared auto plan, compares every loss with its own serial loop, and
writes what it saw to ``OUT_DIR/rank<R>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import timedelta
from typing import Any, Dict, List

TIMEOUT_S = 60  # every group's timeout: a dead peer fails the job in a minute, never hangs CI
ITERS = 6


def _record_collectives(names: Dict[int, str], log: List[List[str]]) -> None:
    """Wrap the collectives the workload calls so each call appends ``[group name, op]`` in issue order."""
    import torch.distributed as dist

    lock = threading.Lock()
    for op in ("all_to_all_single", "all_reduce"):
        original = getattr(dist, op)

        def wrapped(*args: Any, _original: Any = original, _op: str = op, **kwargs: Any) -> Any:
            with lock:
                log.append([names.get(id(kwargs.get("group")), "other"), _op])
            return _original(*args, **kwargs)

        setattr(dist, op, wrapped)


def main(out_dir: str) -> None:
    import torch

    from swpipe_core import pipelines
    from swpipe_core.distributed import agree_on_end
    from swpipe_core.engine.pipeline import SWPipeline
    from swpipe_core.plan import PipelinePlan, TaskSchedule
    from swpipe_core.engine.workers import with_thread_map
    from swpipe.workloads import DLRMConfig, DLRMWorkload, SyntheticData, fns_for, train_reference
    from swpipe.workloads.agree import PlanMismatchError, check_same_plan
    from swpipe_core.planfile import plan_to_dict
    from swpipe.workloads.autoplan import auto_spec
    from swpipe.workloads.distenv import group_timeout, init_distributed

    torch.set_num_threads(1)
    env = init_distributed(timeout=timedelta(seconds=TIMEOUT_S))
    out: Dict[str, Any] = dict(rank=env.rank, world_size=env.world_size, local_rank=env.local_rank,
                               launcher=env.launcher, backend=env.backend)
    config = DLRMConfig.preset("test", batch_size=16)
    batches = SyntheticData(config, env.world_size, env.rank).batches(ITERS)
    reference = train_reference(DLRMWorkload(config, env), batches)
    out["reference_losses"] = [x.item() for x in reference]

    log: List[List[str]] = []
    names = {id(g): name for name, g in env.groups.items()}
    _record_collectives(names, log)
    workload = DLRMWorkload(config, env)
    plan = with_thread_map(pipelines.get("sparse_dist", fns_for("sparse_dist", workload)), "by_stream")
    data = agree_on_end(iter(batches))
    names[id(data.group)] = "agree_on_end"
    with SWPipeline(plan, device=env.device) as pipe:
        pipe.run(data)
    out["agreed_batches"] = data.batches
    out["torchrec_equal"] = len(workload.loss_list()) == ITERS and all(
        torch.equal(a, b) for a, b in zip(workload.loss_list(), reference))
    out["collectives"] = log[:]

    spec = auto_spec(config, env, batches[:4], time_limit_s=5.0)
    workload = DLRMWorkload(config, env)
    auto = spec.plan(workload)
    out["auto_plan"] = repr(sorted(plan_to_dict(auto).items()))
    out["auto_note"] = spec.note
    out["auto_predicted_speedup"] = spec.predicted_speedup
    out["auto_predicts"] = spec.predicts
    with SWPipeline(auto, device=env.device) as pipe:
        pipe.run(iter(batches))
    out["auto_equal"] = len(workload.loss_list()) == ITERS and all(
        torch.equal(a, b) for a, b in zip(workload.loss_list(), reference))

    # A plan that differs on rank 1 must fail on every rank, naming the field.
    odd = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1 + env.rank)}, [("B", "A")])
    try:
        check_same_plan(env, odd, "odd plan")
        out["mismatch_error"] = None
    except PlanMismatchError as exc:
        out["mismatch_error"] = {"differences": exc.differences, "tasks": exc.tasks}

    out["timeouts_s"] = sorted({group_timeout(g).total_seconds()
                                for g in [env.control, data.group, *env.groups.values()]})
    env.close()
    with open(os.path.join(out_dir, f"rank{out['rank']}.json"), "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main(sys.argv[1])
