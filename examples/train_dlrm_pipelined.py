"""Train the DLRM workload with TorchRec's FusedSparseDist plan and check it against a plain loop.

    python examples/train_dlrm_pipelined.py --iters 20

The plan runs H2D, the input all-to-all and the embedding lookup of later
batches on their own threads (one per stream) while the current batch trains;
the losses are the plain loop's, bit for bit.
"""

import argparse

import torch

from swpipe import SWPipeline, pipelines
from swpipe.workloads import (DLRMConfig, DLRMWorkload, SyntheticData, fns_for, init_distributed, same_results,
                              train_reference)
from swpipe_core.workers import with_thread_map


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the pipeline's threads are the parallelism

    env = init_distributed()  # a real gloo process group of one rank (file store, no port)
    config = DLRMConfig.preset("demo", batch_size=args.batch_size)
    batches = SyntheticData(config).batches(args.iters)

    serial = DLRMWorkload(config, env)
    train_reference(serial, batches)

    workload = DLRMWorkload(config, env)  # same seed: same initial model
    plan = pipelines.get("fused_sparse_dist", fns_for("fused_sparse_dist", workload))
    plan = with_thread_map(plan, "by_stream")
    with SWPipeline(plan, device=env.device) as pipe:
        pipe.print_schedule(4)
        seconds = pipe.run(iter(batches))

    same = same_results(workload.loss_list(), serial.loss_list())
    print(f"{args.iters} iterations in {seconds:.2f} s; first loss {workload.losses[0].item():.4f}, "
          f"last {workload.losses[args.iters - 1].item():.4f}; equal to the plain loop: {same}")
    env.close()


if __name__ == "__main__":
    main()
