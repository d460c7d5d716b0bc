"""How close TaskProfiler's exposed times are to the truth, and what a profile costs.

Workloads of sleeping tasks with known exposed time, run through a real
SWPipeline on the CPU:

- ``serial``: A, B, C sleep 5, 10, 20 ms one after another; each exposes all
  of its time.
- ``small``: ten 1 ms tasks; the profiler's resolution.
- ``overlap``: AsyncStart launches a 15 ms background job (a named thread),
  Compute sleeps 10 ms, AsyncWait joins the job. The job hides Compute: the
  iteration takes 15 ms, Compute exposes 0, AsyncStart and AsyncWait 5 ms
  each (SUM < baseline). This is the CPU stand-in for device work that
  overlaps host work on a GPU.

For each workload it prints true vs measured exposed time per task and the
error, for the default interleaved rounds and for the phased order (all
baseline rounds first, ``interleave=False``), side by side, and the profiler's own wall time
(absolute and in baseline iterations), at the default settings (3 warmup,
10 per round, 3 rounds).

Run: ``python benchmarks/profiler_accuracy.py [--rounds 3 --measure 10]``.
"""

from __future__ import annotations

import argparse
import platform
import threading
import time

import torch

from swpipe_core import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.measure.profiler import TaskProfiler


def _sleeper(seconds):
    def fn(ctx):
        time.sleep(seconds)
    return fn


def _chain(tasks):
    names = [t.name for t in tasks]
    return PipelinePlan(schedule={t: TaskSchedule() for t in tasks}, intra_iter_deps=list(zip(names[1:], names[:-1])))


def serial():
    costs = {"A": 0.005, "B": 0.010, "C": 0.020}
    return _chain([PipelineTask(n, _sleeper(s)) for n, s in costs.items()]), costs


def small():
    costs = {f"T{i}": 0.001 for i in range(10)}
    return _chain([PipelineTask(n, _sleeper(s)) for n, s in costs.items()]), costs


def overlap():
    def start(ctx):
        ctx.job = threading.Thread(target=time.sleep, args=(0.015,), name="bench-async-job")
        ctx.job.start()

    def wait(ctx):
        ctx.job.join()

    tasks = [PipelineTask("AsyncStart", start), PipelineTask("Compute", _sleeper(0.010)), PipelineTask("AsyncWait", wait)]
    # shortcut AsyncStart replays a finished job (wait returns at once): 15 - 10 = 5 ms;
    # Compute is hidden by the job: 0; shortcut AsyncWait leaves Compute's 10 ms: 15 - 10 = 5 ms
    return _chain(tasks), {"AsyncStart": 0.005, "Compute": 0.0, "AsyncWait": 0.005}


WORKLOADS = {"serial": serial, "small": small, "overlap": overlap}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--measure", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    print(f"# machine: {platform.machine()} {platform.system()}, torch {torch.__version__}, "
          f"settings: warmup={args.warmup} measure={args.measure} rounds={args.rounds}")
    print("# 'interleaved' = default (baseline and task rounds alternate); 'phased' = interleave=False (all baseline first)")
    print(f"{'workload':<9} {'task':<11} {'true ms':>8} {'interleaved':>11} {'error':>7} {'phased':>8} {'error':>7}")
    summary = []
    for wname, make in WORKLOADS.items():
        plan, truth = make()
        results = {}
        with SWPipeline(plan, device="cpu") as pipe:
            for mode in ("interleaved", "phased"):
                profiler = TaskProfiler(pipe, num_warmup=args.warmup, num_measure=args.measure, num_rounds=args.rounds,
                                        interleave=mode == "interleaved")
                results[mode] = profiler.profile(None)
        errs = {mode: [] for mode in results}
        for task, true_s in truth.items():
            row = f"{wname:<9} {task:<11} {true_s * 1e3:>8.2f}"
            for mode, width in (("interleaved", 11), ("phased", 8)):
                m = results[mode].exposed_s[task]
                errs[mode].append(abs(m - true_s))
                row += f" {m * 1e3:>{width}.2f} {(m - true_s) * 1e3:>+7.2f}"
            print(row)
        for mode, r in results.items():
            summary.append((wname, mode, r.baseline_s, max(errs[mode]), r.meta["wall_s"]))
    print()
    print(f"{'workload':<9} {'mode':<11} {'baseline ms':>11} {'max |err| ms':>12} {'profile wall s':>14} {'wall / baseline':>15}")
    for wname, mode, base, err, wall in summary:
        print(f"{wname:<9} {mode:<11} {base * 1e3:>11.2f} {err * 1e3:>12.2f} {wall:>14.2f} {wall / base:>15.0f}")


if __name__ == "__main__":
    main()
