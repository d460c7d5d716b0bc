"""The simulator on device-bound (and host-bound) CUDA plans: simulated period / analytic period.

Two plans whose steady period is known in closed form, swept over the host:device
ratio from 1:1e-6 (a light host launching long kernels, the common GPU case) to
1e6:1 (host-bound):

* **chain** - A -> B -> C on one thread and one stream, C a stage later, depth 2,
  device 30/20/50 ms; every task's host part is ``ratio`` times its device part.
  Analytic period: ``max(host total, device total)``.
* **two streams** - H2D (stage 0, thread ``io``, stream ``memcpy``) feeding
  Forward (stage 1, caller group, default stream), device 40/60 ms. Analytic
  period: the busiest of the two threads and two streams.

For each it prints the simulated period, the analytic one, their ratio, the
binding resource, the number of iterations the simulator needed (asked: 20) and
its run time. The simulator is deterministic, so the figures do not depend on
machine load (the run time does).

Usage::

    python benchmarks/sim_device_bound.py
"""

from __future__ import annotations

import argparse
import time
from typing import Dict, List, Optional, Sequence, Tuple

from autosched.model.costs import CostModel, TaskCost
from autosched.model.simulate import simulate
from swpipe_core.plan import PipelinePlan, TaskSchedule

RATIOS = (1e-6, 1e-4, 1e-2, 0.1, 0.5, 2.0, 10.0, 1e2, 1e4, 1e6)


def _chain(ratio: float) -> Tuple[PipelinePlan, CostModel, float]:
    dev = {"A": 0.030, "B": 0.020, "C": 0.050}
    plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0), "C": TaskSchedule(1)},
                        intra_iter_deps=[("B", "A"), ("C", "B")])
    costs = CostModel({k: TaskCost(ratio * v, v) for k, v in dev.items()})
    return plan, costs, max(ratio * 0.1, 0.1)


def _two_streams(ratio: float) -> Tuple[PipelinePlan, CostModel, float]:
    dev = {"H2D": 0.040, "Forward": 0.060}
    plan = PipelinePlan({"H2D": TaskSchedule(0, stream="memcpy", thread_group="io"), "Forward": TaskSchedule(1)},
                        intra_iter_deps=[("Forward", "H2D")])
    costs = CostModel({k: TaskCost(ratio * v, v) for k, v in dev.items()})
    return plan, costs, max(ratio * 0.040, ratio * 0.060, 0.040, 0.060)


def run(iterations: int = 20) -> List[Dict[str, object]]:
    """Simulate both plans at every ratio; one row per (plan, ratio)."""
    rows: List[Dict[str, object]] = []
    for label, make in (("chain", _chain), ("two streams", _two_streams)):
        for ratio in RATIOS:
            plan, costs, analytic = make(ratio)
            t0 = time.perf_counter()
            r = simulate(plan, costs, num_iterations=iterations, device="cuda")
            rows.append({"plan": label, "host:device": ratio, "simulated_s": r.period_s, "analytic_s": analytic,
                         "ratio": r.period_s / analytic, "binding": r.binding, "iterations": r.num_iterations,
                         "sim_ms": (time.perf_counter() - t0) * 1e3})
    return rows


def _markdown(rows: Sequence[Dict[str, object]]) -> str:
    out = ["| plan | host:device | simulated period | analytic period | simulated / analytic | binding | "
           "iterations simulated | simulate() ms |",
           "|---|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        out.append(f"| {r['plan']} | {r['host:device']:g}:1 | {r['simulated_s']:.6g} s | {r['analytic_s']:.6g} s | "
                   f"{r['ratio']:.6f} | {r['binding']} | {r['iterations']} | {r['sim_ms']:.1f} |")
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=20, help="iterations asked of the simulator")
    args = p.parse_args(argv)
    rows = run(args.iters)
    print(_markdown(rows))
    worst = max(abs(float(r["ratio"]) - 1.0) for r in rows)
    print(f"\nworst |simulated / analytic - 1| = {worst:.2e}")
    return 0 if worst < 1e-6 else 1


if __name__ == "__main__":
    raise SystemExit(main())
