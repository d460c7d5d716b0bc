"""The simulator replaying the engine: period error over random plans (the replay test's plans, seeded).

Each plan (2-3 thread groups, stages 0-2, inter-iteration dependencies of
distance 1-2, some globally ordered tasks, sleeping tasks of 2-5 ms) runs on the
engine with ``record_timeline=True``; the timeline is checked against the
contract; the simulator is given ``CostModel.from_timeline`` of that run, with
and without the engine's per-task hand-off fitted once on a separate
calibration plan. Prints each plan's measured and simulated period and the
error distribution (fastest of ``--repeats`` runs per plan), for ``caller_group=None`` and for the default caller group
(on an engine that runs the caller's group inline, the simulator models it so;
otherwise it simulates the engine as it ran: every group on a worker).

Usage::

    python benchmarks/contract_replay.py --plans 20
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from typing import Optional, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    import test_contract_replay as t

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plans", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3, help="runs per plan; the fastest counts")
    args = p.parse_args(argv)
    hand_off = t.fit_task_overhead(repeats=args.repeats)
    print(f"fitted hand-off per task: {hand_off * 1e6:.0f} us")
    print("| caller_group | plan | tasks | depth | groups | inline | measured ms | simulated ms | error | "
          "error, no hand-off |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for caller in (None, "default"):
        rng = random.Random(args.seed)
        errs, raw = [], []
        for k in range(args.plans):
            plan, sleeps = t.random_plan(rng, caller)
            # fastest of --repeats runs: a burst of load from other processes slows a run, never speeds it
            out = min((t.replay(plan, sleeps, hand_off) for _ in range(args.repeats)), key=lambda o: o["measured"])
            assert out["engine_order"] == out["sim_order"], f"plan {k}: group order differs"
            bare_err = out["simulated_bare"] / out["measured"] - 1
            errs.append(out["error"])
            raw.append(bare_err)
            groups = len({plan.sched(n).thread_group for n in plan.task_names})
            print(f"| {caller} | {k} | {len(plan.task_names)} | {plan.pipeline_depth} | {groups} | {out['inline']} | "
                  f"{out['measured'] * 1e3:.3f} | {out['simulated'] * 1e3:.3f} | {out['error']:+.1%} | {bare_err:+.1%} |")
        for label, e in (("with hand-off", errs), ("no hand-off", raw)):
            print(f"caller_group={caller} {label}: median |error| {statistics.median(abs(x) for x in e):.1%}, "
                  f"worst {max(abs(x) for x in e):.1%}, mean signed {statistics.mean(e):+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
