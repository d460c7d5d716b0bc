"""One rank of ``tests/test_torchrec_torchrun.py`` (not a test module): the drop-in on uneven data under torchrun.

Run as ``python -m torch.distributed.run --nproc-per-node 2 tests/torchrun_torchrec_worker.py OUT_DIR``.
Rank ``r`` holds ``COUNTS[r]`` batches; each rank trains them with
``swpipe.torchrec.TrainPipeline`` (plan ``sparse_dist``) until ``StopIteration``,
compares every output with its own non-pipelined loop over the batches every
rank has, and writes what it saw to ``OUT_DIR/rank<R>.json``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from datetime import timedelta

COUNTS = (6, 4)


def main(out_dir: str) -> None:
    import torch

    from swpipe.torchrec import TrainPipeline, models
    from swpipe.workloads.distenv import init_distributed

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    env = init_distributed(timeout=timedelta(seconds=60))  # a hang would fail the job in a minute
    cfg = models.SparseNNConfig(batch_size=8)
    batches = models.sparse_nn_batches(cfg, COUNTS[env.rank], world_size=env.world_size, rank=env.rank)
    model, opt = models.sparse_nn(cfg, env.device)
    reference = []
    for b in batches[:min(COUNTS)]:
        opt.zero_grad()
        loss, pred = model(b)
        loss.backward()
        opt.step()
        reference.append(pred)
    model, opt = models.sparse_nn(cfg, env.device)
    outputs = []
    with TrainPipeline(model, opt, env.device, plan="sparse_dist") as pipeline:
        it = iter(batches)
        while True:
            try:
                outputs.append(pipeline.progress(it))
            except StopIteration:
                break
        leftover = len(pipeline.leftover)
    equal = len(outputs) == len(reference) and all(torch.equal(a, b) for a, b in zip(outputs, reference))
    out = dict(rank=env.rank, world_size=env.world_size, launcher=env.launcher, batches=len(batches),
               trained=len(outputs), leftover=leftover, equal=equal)
    env.close()
    with open(os.path.join(out_dir, f"rank{out['rank']}.json"), "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main(sys.argv[1])
