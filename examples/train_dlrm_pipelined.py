"""Train the DLRM workload with TorchRec's FusedSparseDist plan and check it against a plain loop.

    python examples/train_dlrm_pipelined.py --iters 20
    torchrun --nproc-per-node 2 examples/train_dlrm_pipelined.py --iters 20   # two ranks, same script

The plan runs H2D, the input all-to-all and the embedding lookup of later
batches on their own threads (one per stream) while the current batch trains;
the losses are the plain loop's, bit for bit.
"""

import argparse

import torch

from swpipe import SWPipeline, pipelines, with_thread_map
from swpipe.workloads import (DLRMConfig, DLRMWorkload, SyntheticData, fns_for, init_distributed, same_results,
                              train_reference)
from swpipe.workloads.agree import all_ranks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the pipeline's threads are the parallelism

    env = init_distributed()  # torchrun's job when launched by it, else a gloo group of one rank (no port)
    config = DLRMConfig.preset("demo", batch_size=args.batch_size)
    batches = SyntheticData(config, env.world_size, env.rank).batches(args.iters)  # this rank's shard

    serial = DLRMWorkload(config, env)
    train_reference(serial, batches)

    workload = DLRMWorkload(config, env)  # same seed: same initial model
    plan = pipelines.get("fused_sparse_dist", fns_for("fused_sparse_dist", workload))
    plan = with_thread_map(plan, "by_stream")
    with SWPipeline(plan, device=env.device) as pipe:
        if env.rank == 0:
            pipe.print_schedule(4)
        seconds = pipe.run(iter(batches))

    same = all_ranks(env, same_results(workload.loss_list(), serial.loss_list()))  # every rank's check
    if env.rank == 0:
        print(f"{args.iters} iterations in {seconds:.2f} s on {env.world_size} rank(s); rank 0's first loss "
              f"{workload.losses[0].item():.4f}, last {workload.losses[args.iters - 1].item():.4f}; "
              f"checked on every rank, equal to the plain loop: {same}")
    env.close()


if __name__ == "__main__":
    main()
