"""Peak bytes in flight of every TorchRec plan over the DLRM workload: measured next to predicted.

    python benchmarks/memory.py                      # all plans, 40 iterations, batch 512
    python benchmarks/memory.py --plans base,semi_sync --iters 60

For each plan, on a fresh workload (same seed, same pre-generated batches):

1. **Figures.** ``swpipe_core.measure.memory.measure_task_memory``: three serial
   iterations, per task the bytes it adds to and frees from the context, and
   the batch's bytes.
2. **Measured.** A pipelined run with the timeline recorded; whenever a
   function called by a task returns (``sys.setprofile`` on the task's
   thread) and after every task, a sampler (under a lock) walks every live
   context (in flight, and on CUDA retired but waiting for the device) and
   counts the tensor bytes reachable from them, each storage once; the peak
   is the largest sample. (``--task-ends-only``: after every task only.) The
   process's resident set (RSS, ``/proc/self/statm``) is sampled too, for
   reference: it includes the model, the allocator's caches and the autograd
   graph, which a context's tensors do not.
3. **Predicted.** ``CostModel.from_timeline`` of that run (median time per
   task) with the figures of (1), simulated (``autosched.model.simulate``) for the
   same number of iterations; ``SimResult.memory.peak_bytes``.

The table shows both peaks, their ratio and the least memory any plan of the
tasks needs (``autosched.model.memory.min_memory``). Target: predicted within 10 %
of measured for every plan. The sampler reads the engine's private run state
(``pipe._run``): a benchmark may, the library does not.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
from typing import Any, Dict, List, Tuple

import torch

from autosched.model.costs import CostModel
from autosched.model.memory import format_bytes, min_memory
from autosched.model.simulate import simulate
from swpipe.workloads.bench import TORCHREC_PLANS, default_specs
from swpipe.workloads.dlrm import DLRMConfig, DLRMWorkload, SyntheticData, init_distributed
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.measure.memory import live_bytes, measure_task_memory


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):  # not Linux
        return 0


class _Sampler:
    """A task wrapper for ``pipe.instrument``: after every task, and (``within``) whenever a function
    a task calls returns, the bytes reachable from all live contexts.

    Sampling inside tasks sees what a context holds only while a task runs (the
    ``.grad`` backward puts on context tensors before the task deletes them);
    it slows the run, and the prediction is made from that same run's timing.
    """

    def __init__(self, pipe: SWPipeline, within: bool = True) -> None:
        self.pipe = pipe
        self.lock = threading.Lock()
        self.peak = 0
        self.peak_contexts = 0
        self.rss0 = _rss()
        self.rss_peak = self.rss0
        self.samples = 0
        self.within = within

    def _profile_hook(self, frame: Any, event: str, arg: Any) -> None:
        if event in ("return", "c_return"):
            self.sample()

    def __call__(self, run_task: Any, task: Any, ctx: Any) -> None:
        if self.within:
            sys.setprofile(self._profile_hook)  # this worker thread, this task only
        try:
            run_task(task, ctx)
        finally:
            if self.within:
                sys.setprofile(None)
        self.sample()

    def sample(self) -> None:
        run = self.pipe._run
        if run is None:
            return
        with self.lock:
            states = list(run.iters.values()) + list(run.device.pending.values())
            contexts = [st.ctx for st in states if st.ctx is not None]
            nbytes = live_bytes(contexts)
            self.samples += 1
            if nbytes > self.peak:
                self.peak, self.peak_contexts = nbytes, len(contexts)
            self.rss_peak = max(self.rss_peak, _rss())


def measure_plan(spec: Any, config: DLRMConfig, env: Any, batches: List[Any], skip: int,
                 within: bool = True) -> Dict[str, Any]:
    """Figures, measured peak and predicted peak of one plan."""
    wl = DLRMWorkload(config, env)
    plan = spec.plan(wl)
    with SWPipeline(plan, device=env.device) as pipe:
        figures = measure_task_memory(pipe, batches[0], num_iterations=3, iter_start=0)
    wl = DLRMWorkload(config, env)  # a fresh model for the measured run, as every plan gets
    plan = spec.plan(wl)
    with SWPipeline(plan, device=env.device, record_timeline=True) as pipe:
        sampler = _Sampler(pipe, within)
        with pipe.instrument(sampler):
            pipe.run(iter(batches))
        events = [e for e in pipe.timeline if e.iteration >= skip]
    costs = CostModel.from_timeline(events).with_memory(figures)
    sim = simulate(plan, costs, num_iterations=len(batches), device=env.device)
    least = min_memory(plan.task_names, plan.intra_edges(), costs, period_s=sim.period_s, device=env.device)
    return {"plan": spec.label, "depth": plan.pipeline_depth, "measured": sampler.peak,
            "contexts": sampler.peak_contexts, "predicted": sim.memory.peak_bytes,
            "predicted_contexts": sim.memory.iterations_at_peak, "mean": sim.memory.mean_bytes,
            "least": least.value, "rss": sampler.rss_peak - sampler.rss0, "samples": sampler.samples,
            "period_ms": sim.period_s * 1e3}


def format_rows(rows: List[Dict[str, Any]]) -> Tuple[str, List[str]]:
    """The side-by-side table and the plans whose prediction misses by more than 10 %."""
    head = (f"{'plan':26s} {'depth':>5s} {'measured peak':>14s} {'ctx':>3s} {'predicted peak':>14s} {'ctx':>3s} "
            f"{'pred/meas':>9s} {'pred. mean':>11s} {'least any':>10s} {'RSS growth':>11s}")
    lines, misses = [head, "-" * len(head)], []
    for r in rows:
        ratio = r["predicted"] / r["measured"] if r["measured"] else float("nan")
        if not 0.9 <= ratio <= 1.1:
            misses.append(r["plan"])
        lines.append(f"{r['plan']:26s} {r['depth']:5d} {format_bytes(r['measured']):>14s} {r['contexts']:3d} "
                     f"{format_bytes(r['predicted']):>14s} {r['predicted_contexts']:3d} {ratio:9.3f} "
                     f"{format_bytes(r['mean']):>11s} {format_bytes(r['least']):>10s} {format_bytes(r['rss']):>11s}")
    return "\n".join(lines), misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--plans", default=",".join(TORCHREC_PLANS))
    parser.add_argument("--by-stream", action="store_true", help="also the one-thread-per-stream variants")
    parser.add_argument("--task-ends-only", action="store_true",
                        help="sample only after each task (faster; misses what a context holds during a task)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    env = init_distributed()
    config = DLRMConfig.preset("demo", batch_size=args.batch_size)
    batches = SyntheticData(config).batches(args.iters)
    specs = default_specs([p.strip() for p in args.plans.split(",") if p.strip()], by_stream=args.by_stream)
    rows = [measure_plan(spec, config, env, batches, skip=min(5, args.iters // 4), within=not args.task_ends_only)
            for spec in specs]
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU(s), load average "
          f"{', '.join(f'{x:.1f}' for x in load)}; torch {torch.__version__}; device {env.device}; "
          f"batch {args.batch_size}; {args.iters} iterations; {args.threads} intra-op thread(s)")
    table, misses = format_rows(rows)
    print(table)
    when = "after every task" if args.task_ends_only else "whenever a function a task calls returns, and after every task"
    print(f"ctx: contexts alive at the peak. measured: tensor bytes reachable from live contexts, sampled {when}; "
          "predicted: simulated from the run's median task times and per-task bytes of 3 serial "
          "iterations; least any: autosched.model.memory.min_memory at the predicted period; RSS growth: process "
          "resident set over the run, for reference")
    print("within 10 %: all plans" if not misses else f"outside 10 %: {', '.join(misses)}")
    env.close()


if __name__ == "__main__":
    main()
