"""Run TorchRec's SparseDist plan on two ranks (gloo on loopback, table-wise sharded embeddings).

    python examples/two_ranks.py --iters 8                                  # spawns 2 local ranks
    torchrun --nproc-per-node 2 examples/two_ranks.py --iters 8             # the same under torchrun

Each rank owns half of the embedding tables; the input all-to-all sends ids to
the tables' owners in two phases (lengths, then ids) and the pooled rows come
back by a second all-to-all. Every rank checks its losses against a plain loop;
rank 0 prints every rank's line (under torchrun the lines are gathered to it).
"""

import argparse

from swpipe import SWPipeline, pipelines
from swpipe.workloads import (DLRMConfig, DLRMWorkload, SyntheticData, fns_for, init_distributed, same_results, spawn,
                              train_reference)
from swpipe.workloads.agree import gather
from swpipe.workloads.distenv import launcher_env


def on_rank(env, iters: int) -> str:
    config = DLRMConfig.preset("test", batch_size=16)
    batches = SyntheticData(config, env.world_size, env.rank).batches(iters)
    reference = train_reference(DLRMWorkload(config, env), batches)
    workload = DLRMWorkload(config, env)
    with SWPipeline(pipelines.get("sparse_dist", fns_for("sparse_dist", workload)), device=env.device) as pipe:
        pipe.run(iter(batches))
    same = same_results(workload.loss_list(), reference)
    return (f"rank {env.rank}/{env.world_size} ({env.backend}): owns tables {workload.model.owned_tables}, "
            f"last loss {workload.losses[iters - 1].item():.4f}, equal to the plain loop: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--world-size", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    args = parser.parse_args()
    if launcher_env() is None:
        lines = spawn(on_rank, args.world_size, args.iters)
    else:  # launched by torchrun: this process is one rank of its job
        with init_distributed() as env:
            lines = gather(env, on_rank(env, args.iters))
            if env.rank != 0:
                return
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
