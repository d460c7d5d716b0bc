"""Recording overhead of the dataflow recorder, measured side by side in one run.

For the README MLP and the DLRM workload (``test`` and ``demo`` presets, the
``fused_sparse_dist`` tasks), the wall time per serial iteration of the
plain tasks against the same iterations under
``swpipe_core.dataflow.record_dataflow`` (ctx watching, the dispatch mode,
named-state snapshots before and after each task). Also the time of
``check_dataflow`` on top of the record (hazards, happens-before order,
redundancy). The recorder runs once, before training, never in the loop.

    python benchmarks/dataflow_overhead.py            # full
    python benchmarks/dataflow_overhead.py --quick    # fewer iterations
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any, Callable, List, Tuple

import torch

from swpipe_core.dataflow import check_dataflow, find_hazards, record_dataflow
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule


def _mlp() -> Tuple[PipelinePlan, List[Any], Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(256, 64, dtype=torch.float64), torch.randn(256, 1)) for _ in range(8)]

    def load(ctx):
        x, y = ctx.batch
        ctx.x, ctx.y = x.to(torch.float32), y

    def forward(ctx):
        ctx.loss = torch.nn.functional.mse_loss(model(ctx.x), ctx.y)

    def backward(ctx):
        opt.zero_grad()
        ctx.loss.backward()

    def step(ctx):
        opt.step()

    plan = PipelinePlan({PipelineTask("Load", load): TaskSchedule(0, thread_group="io"),
                         PipelineTask("Forward", forward): TaskSchedule(1),
                         PipelineTask("Backward", backward): TaskSchedule(1),
                         PipelineTask("Step", step): TaskSchedule(1)},
                        intra_iter_deps=[("Forward", "Load"), ("Backward", "Forward"), ("Step", "Backward")],
                        inter_iter_deps=[("Forward", "Step")])
    return plan, batches, [model, opt]


def _dlrm(preset: str, env: Any) -> Tuple[PipelinePlan, List[Any], Any]:
    from swpipe.workloads import DLRMConfig, DLRMWorkload, SyntheticData, fns_for
    from swpipe_core import pipelines
    cfg = DLRMConfig.preset(preset)
    wl = DLRMWorkload(cfg, env)
    plan = pipelines.get("fused_sparse_dist", fns_for("fused_sparse_dist", wl))
    return plan, SyntheticData(cfg).batches(8), [wl.model, wl.dense_opt]


def _plain(plan: PipelinePlan, batches: List[Any]) -> None:
    from swpipe_core.dataflow.record import serial_order
    from swpipe_core.plan import IterContext
    seq = serial_order(plan)
    for i, b in enumerate(batches):
        ctx = IterContext(b, i)
        for t in seq:
            t.fn(ctx)


def _best(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats, iters = (3, 3) if args.quick else (7, 6)
    from swpipe.workloads import init_distributed
    env = init_distributed()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}; "
          f"load {os.getloadavg()[0]:.2f}; {iters} iterations x {repeats} repeats (median)")
    print("| workload | plain ms/it | recorded ms/it | ratio | check on top ms | hazards |")
    print("|---|---:|---:|---:|---:|---:|")
    cases = [("README MLP", _mlp), ("DLRM test (fused_sparse_dist)", lambda: _dlrm("test", env)),
             ("DLRM demo (fused_sparse_dist)", lambda: _dlrm("demo", env))]
    for label, make in cases:
        plan, batches, state = make()
        data = batches[:iters]
        _plain(plan, data[:1])  # warm-up
        plain = _best(lambda: _plain(plan, data), repeats) / iters
        rec_time = _best(lambda: record_dataflow(plan, data, state=state), repeats) / iters
        record = record_dataflow(plan, data, state=state)
        check = _best(lambda: check_dataflow(plan, record=record), repeats)
        print(f"| {label} | {plain * 1e3:.2f} | {rec_time * 1e3:.2f} | {rec_time / plain:.1f}x | "
              f"{check * 1e3:.0f} | {len(find_hazards(record))} |")
    env.close()


if __name__ == "__main__":
    main()
