"""Re-planning on drift (issue 48): a static plan next to AdaptivePipeline when the load task doubles in cost.

The workload is three tasks whose work is a sleep (so the figures hold on a shared, loaded machine: the tasks take
no core): Load 2 ms (4 ms from iteration ``--change`` on), Forward 1 ms, Step 3 ms; a plan has two thread groups.
The plan searched for the first costs runs Load and Forward on one thread (3 ms, beside Step's 3 ms); once Load
doubles, the best plan runs Load alone (4 ms beside Forward + Step).

In one run, side by side:

1. **gap recovered**: the same drifting run under the static plan, under the best plan for the new costs, and under
   ``AdaptivePipeline`` starting from the static plan; each one's mean period over iterations ``change + K`` to
   the end; the fraction of the static plan's gap to the best plan that the adaptive run closed (goal >= 80 %);
2. **overhead** when nothing drifts: ``SWPipeline`` and ``AdaptivePipeline`` on the same plan, paired round by
   round, the median ratio of their periods (goal <= 1 %);
3. **false swaps** over a long idle run (goal 0), and the searches started.

    python benchmarks/replan.py            # about a minute
    python benchmarks/replan.py --quick    # the smoke run of the tests

Record ``uptime``'s load average: the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from swpipe import (Constraints, CostModel, PipelinePlan, PipelineTask, SolverOptions, SWPipeline, TaskCost,
                    auto_schedule)
from swpipe.replan import AdaptivePipeline, ReplanOptions, predicted_period

MS = 1e-3
NOCORE = ("nocore",)
CONSTRAINTS = Constraints(max_depth=3, max_threads=2)


class Sleeps:
    """The three tasks; Load sleeps twice as long from batch ``change`` on (the batch is the global index)."""

    def __init__(self, load_ms: float, forward_ms: float, step_ms: float, change: Optional[int]) -> None:
        self.seconds = {"Load": load_ms * MS, "Forward": forward_ms * MS, "Step": step_ms * MS}
        self.change = change

    def task(self, name: str) -> PipelineTask:
        def run(ctx: Any) -> None:
            doubled = name == "Load" and self.change is not None and ctx.batch >= self.change
            time.sleep(self.seconds[name] * (2.0 if doubled else 1.0))
        return PipelineTask(name, run)

    def graph(self) -> tuple:
        return ([self.task(n) for n in ("Load", "Forward", "Step")], [("Forward", "Load"), ("Step", "Forward")])

    def costs(self, load_factor: float = 1.0) -> CostModel:
        return CostModel({n: TaskCost(s * (load_factor if n == "Load" else 1.0), resources=NOCORE)
                          for n, s in self.seconds.items()})


def searched(work: Sleeps, costs: CostModel) -> PipelinePlan:
    plan, _ = auto_schedule(work.graph(), costs, CONSTRAINTS, SolverOptions(time_limit_s=5))
    return plan


def timed(pipe: Any, n: int) -> List[float]:
    """The time each of ``n`` iterations retired at (seconds from the fill's end)."""
    it = pipe.fill_pipeline(range(n))
    t0, times = time.perf_counter(), []
    while True:
        try:
            pipe.progress(it)
        except StopIteration:
            return times
        times.append(time.perf_counter() - t0)


def mean_period(times: Sequence[float], start: int) -> float:
    return (times[-1] - times[start - 1]) / (len(times) - start)


def gap_recovered(args: argparse.Namespace, opts: ReplanOptions) -> Dict[str, Any]:
    work = Sleeps(args.load_ms, args.forward_ms, args.step_ms, change=args.change)
    static, best = searched(work, work.costs()), searched(work, work.costs(2.0))
    start = args.change + args.k
    row: Dict[str, Any] = {}
    with SWPipeline(static, "cpu") as pipe:
        row["static"] = mean_period(timed(pipe, args.iters), start)
    with SWPipeline(best, "cpu") as pipe:
        row["best"] = mean_period(timed(pipe, args.iters), start)
    with AdaptivePipeline(static, work.costs(), "cpu", replan=opts) as pipe:
        row["adaptive"] = mean_period(timed(pipe, args.iters), start)
        row["decisions"] = list(pipe.decisions)
        row["band"] = (pipe.reference_s, pipe.noise)
    gap = row["static"] - row["best"]
    row["recovered"] = (row["static"] - row["adaptive"]) / gap if gap > 0 else float("nan")
    row["predicted"] = {"static": predicted_period(static, work.costs(2.0)),
                        "best": predicted_period(best, work.costs(2.0))}
    return row


def overhead(args: argparse.Namespace, opts: ReplanOptions) -> Dict[str, Any]:
    work = Sleeps(args.load_ms, args.forward_ms, args.step_ms, change=None)
    plan = searched(work, work.costs())
    ratios, plain, adaptive = [], [], []
    for _ in range(args.rounds):
        with SWPipeline(plan, "cpu") as pipe:
            p = mean_period(timed(pipe, args.overhead_iters), 10)
        with AdaptivePipeline(plan, work.costs(), "cpu", replan=opts) as pipe:
            a = mean_period(timed(pipe, args.overhead_iters), 10)
        plain.append(p)
        adaptive.append(a)
        ratios.append(a / p)
    return {"plain": statistics.median(plain), "adaptive": statistics.median(adaptive),
            "overhead": statistics.median(ratios) - 1.0}


def false_swaps(args: argparse.Namespace, opts: ReplanOptions) -> Dict[str, Any]:
    work = Sleeps(args.load_ms, args.forward_ms, args.step_ms, change=None)
    plan = searched(work, work.costs())
    with AdaptivePipeline(plan, work.costs(), "cpu", replan=opts) as pipe:
        seconds = pipe.run(range(args.idle_iters))
        return {"iterations": args.idle_iters, "seconds": seconds, "searches": len(pipe.decisions),
                "swaps": len(pipe.swaps)}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--load-ms", type=float, default=2.0)
    ap.add_argument("--forward-ms", type=float, default=1.0)
    ap.add_argument("--step-ms", type=float, default=3.0)
    ap.add_argument("--change", type=int, default=300, help="the iteration Load doubles at")
    ap.add_argument("--k", type=int, default=200, help="iterations after the change before the gap is measured")
    ap.add_argument("--iters", type=int, default=900)
    ap.add_argument("--rounds", type=int, default=5, help="paired rounds of the overhead measurement")
    ap.add_argument("--overhead-iters", type=int, default=300)
    ap.add_argument("--idle-iters", type=int, default=4000)
    ap.add_argument("--time-limit", type=float, default=0.3, help="the re-planner's search budget (s)")
    ap.add_argument("--quick", action="store_true", help="small counts: the smoke run of the tests")
    args = ap.parse_args(argv)
    if args.quick:
        args.change, args.k, args.iters, args.rounds, args.overhead_iters, args.idle_iters = 60, 120, 240, 1, 60, 200
    opts = ReplanOptions(time_limit_s=args.time_limit, constraints=CONSTRAINTS)
    print(f"replan: Load {args.load_ms:g} ms -> {2 * args.load_ms:g} ms at iteration {args.change}, Forward "
          f"{args.forward_ms:g} ms, Step {args.step_ms:g} ms (sleeps); K = {args.k}; search {args.time_limit:g} s; "
          "load average %.2f, %.2f, %.2f; %d CPUs" % (*os.getloadavg(), os.cpu_count()))
    gap = gap_recovered(args, opts)
    print(f"\n(1) mean period over iterations {args.change + args.k}..{args.iters - 1} (ms), after the drift")
    print(f"    {'static':>10} {'adaptive':>10} {'best':>10}   recovered  (goal >= 80 %)")
    print(f"    {gap['static'] / MS:10.3f} {gap['adaptive'] / MS:10.3f} {gap['best'] / MS:10.3f}   "
          f"{gap['recovered']:9.0%}")
    print(f"    predicted on the new costs: static {gap['predicted']['static'] / MS:.3f} ms, best "
          f"{gap['predicted']['best'] / MS:.3f} ms")
    for d in gap["decisions"]:
        print(f"    {d}")
    if not gap["decisions"]:
        reference, noise = gap["band"]
        print(f"    no drift detected: reference {reference / MS:.3f} ms +- {noise:.0%} at the end")
    over = overhead(args, opts)
    print(f"\n(2) no drift: SWPipeline {over['plain'] / MS:.3f} ms, AdaptivePipeline {over['adaptive'] / MS:.3f} ms "
          f"per iteration; overhead {over['overhead']:+.2%} (median of {args.rounds} paired rounds; goal <= 1 %)")
    idle = false_swaps(args, opts)
    print(f"\n(3) idle run: {idle['iterations']} iterations in {idle['seconds']:.1f} s: {idle['searches']} search(es), "
          f"{idle['swaps']} false swap(s) (goal 0)")
    return {"gap": gap, "overhead": over, "idle": idle}


if __name__ == "__main__":
    main(sys.argv[1:])
