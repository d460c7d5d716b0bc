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

from swpipe.commands._args import add_keep_freed_memory, apply_keep_freed_memory
from swpipe.workloads.autoplan import auto_spec
from swpipe.workloads.bench import TORCHREC_PLANS, default_specs, format_table, measure
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


def _utilisation(config: DLRMConfig, env, batches, specs) -> None:
    """Per thread group busy time of the multi-thread plans: how many cores the pipeline really got."""
    from swpipe_core.engine.pipeline import SWPipeline

    skip = min(5, len(batches) - 1)
    print("\nwhere the time goes (one more run each, with the timeline recorded; ms per iteration):")
    print(f"{'plan':28s} {'wall':>6s} {'busy':>6s} {'cores used':>10s}  busy per thread group")
    for spec in specs:
        wl = DLRMWorkload(config, env)
        with SWPipeline(spec.plan(wl), device=env.device, record_timeline=True) as pipe:
            wall = pipe.run(iter(batches))
            events = [e for e in pipe.timeline if e.iteration >= skip]
        n = len(batches) - skip
        per_group: dict = {}
        for e in events:
            per_group[e.thread_group] = per_group.get(e.thread_group, 0.0) + e.duration
        busy = sum(per_group.values())
        groups = ", ".join(f"{g} {v / n * 1e3:.1f}" for g, v in sorted(per_group.items(), key=lambda kv: -kv[1]))
        print(f"{spec.label:28s} {wall / len(batches) * 1e3:6.1f} {busy / n * 1e3:6.1f} "
              f"{busy / n / (wall / len(batches)):10.2f}  {groups}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads for every row (default 1)")
    parser.add_argument("--plans", default=",".join(TORCHREC_PLANS))
    parser.add_argument("--no-auto", action="store_true")
    add_keep_freed_memory(parser)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    print(apply_keep_freed_memory(args))
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
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("n/a",)

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU(s), load average "
          f"{', '.join(f'{x:.1f}' for x in load)}; torch {torch.__version__}; gloo world size 1; "
          f"batch {args.batch_size}; {args.iters} iterations, best of {args.repeats} interleaved rounds; "
          f"{args.threads} intra-op thread(s)")
    print(format_table(m))
    print(f"machine check: 2 threads of GIL-free work ran {m.meta['parallel_probe']:.2f}x faster together than "
          f"one after another (idle cores give ~2x): the ceiling of any multi-thread plan right now")
    print(f"serial loop with 2 intra-op threads: {two:.1f} iter/s ({two / m.serial_iters_per_s:.2f}x the "
          f"1-thread serial loop)")
    best = max((r for r in m.rows if not r.label.startswith("eval")), key=lambda r: r.speedup)
    print(f"fastest training plan: {best.label} at {best.speedup:.2f}x serial "
          f"({best.iters_per_s / two:.2f}x the 2-thread serial loop); measured in {time.perf_counter() - t0:.0f} s")
    single = [s for s in specs if s.label in ("sparse_dist", "prefetch", "semi_sync")]
    _utilisation(config, env, SyntheticData(config).batches(args.iters),
                 single + [s for s in specs if s.thread_map])
    env.close()


if __name__ == "__main__":
    main()
