"""Iterations/s of the DLRM workload: the plain serial loop next to every TorchRec plan, in one run.

    python benchmarks/pipelines.py                 # all plans, 60 iterations x 3 rounds
    python benchmarks/pipelines.py --plans sparse_dist,fused_sparse_dist --iters 100

Every plan trains a fresh model (same seed) on the same pre-generated batches;
rounds are interleaved (serial, plan 1, plan 2, ... then again) and the
fastest round counts, so a burst of load from other processes on a shared
machine hits every row alike. Speedup is against the plain serial loop with
the same number of intra-op threads (1 by default: the pipeline's worker
threads are the parallelism); the serial loop with 2 intra-op threads is
printed too, as the other way to use a second core. Every row also says
whether its losses equal the serial loop's bit for bit.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from swpipe.workloads.bench import TORCHREC_PLANS, auto_spec, default_specs, format_table, measure
from swpipe.workloads.dlrm import DLRMConfig, DLRMWorkload, SyntheticData, init_distributed
from swpipe.workloads.reference import train_reference


def _serial_rate(config: DLRMConfig, env, batches, threads: int, repeats: int) -> float:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        best = float("inf")
        for _ in range(repeats):
            wl = DLRMWorkload(config, env)
            t0 = time.perf_counter()
            train_reference(wl, batches)
            best = min(best, time.perf_counter() - t0)
        return len(batches) / best
    finally:
        torch.set_num_threads(before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads for every row (default 1)")
    parser.add_argument("--plans", default=",".join(TORCHREC_PLANS))
    parser.add_argument("--no-auto", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    env = init_distributed()
    config = DLRMConfig.preset("demo", batch_size=args.batch_size)
    specs = default_specs([p.strip() for p in args.plans.split(",") if p.strip()])
    if not args.no_auto:
        spec = auto_spec(config, env, SyntheticData(config).batches(12))
        if spec is not None:
            specs.append(spec)
    t0 = time.perf_counter()
    m = measure(config, env, specs, iters=args.iters, repeats=args.repeats, progress=True, record_best=False)
    two = _serial_rate(config, env, SyntheticData(config).batches(args.iters), 2, args.repeats)
    env.close()

    load = os.getloadavg() if hasattr(os, "getloadavg") else ("n/a",)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU(s), load average "
          f"{', '.join(f'{x:.1f}' for x in load)}; torch {torch.__version__}; gloo world size 1; "
          f"batch {args.batch_size}; {args.iters} iterations, best of {args.repeats} interleaved rounds; "
          f"{args.threads} intra-op thread(s)")
    print(format_table(m))
    print(f"serial loop with 2 intra-op threads: {two:.1f} iter/s ({two / m.serial_iters_per_s:.2f}x the "
          f"1-thread serial loop)")
    best = max((r for r in m.rows if not r.label.startswith("eval")), key=lambda r: r.speedup)
    print(f"fastest training plan: {best.label} at {best.speedup:.2f}x serial "
          f"({best.iters_per_s / two:.2f}x the 2-thread serial loop); measured in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
