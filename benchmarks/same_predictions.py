"""The simulators' predictions on fixed inputs, beside another tree's: which are equal, bit for bit.

A change to the engine or to how a simulation is reached must not move a
prediction; when a re-run figure of docs/results.md comes out worse, this
says whether the model or the measurement moved. No timing: each tree runs
in a fresh interpreter importing its ``src`` folder, on the same seeded inputs:

* ``plan``: :func:`autosched.model.simulate.simulate` on 60 random sleep plans of
  ``benchmarks/sim_fidelity.py`` (bare, with task and period overheads, and with
  a machine calibration at 1.0, 1.6 and 2.0 free cores of 2), and on the
  TorchRec plans of ``cost_models/`` (CUDA): the period;
* ``pp``: :func:`autosched.pp.simulate.pp_simulate` on the 7 built-in schedules
  x 4 and 8 micro-batches x 6 random cost sets (with and without a post cost):
  the step, the bubble per rank, the peak bytes per rank;
* ``gpipe``: :func:`swpipe.gpipe.predict.predict_step` on 40 random layer models
  (with and without a co-run slowdown), GPipe x 3 checkpoint modes and 1F1B x 2,
  chunks 4 and 8: the step, the bubble, the activation bytes.

Usage::

    python benchmarks/same_predictions.py --against /path/to/other/checkout/src
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = [("GPipe", 2), ("1F1B", 2), ("Interleaved1F1B", 4), ("LoopedBFS", 4), ("InterleavedZeroBubble", 4),
             ("ZBVZeroBubble", 4), ("DualPipeV", 4)]


def _period(result: Any) -> float:
    # a tree before SimResult.period_s names it period
    return result.period_s if "period_s" in getattr(result, "__dataclass_fields__", {}) else result.period


def plan_cases() -> Dict[str, Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sim_fidelity import random_plan

    import autosched.model.machine as machine
    from autosched.model.costs import CostModel, TaskCost
    from autosched.model.simulate import simulate
    from swpipe_core.measure.calibrate import MachineCalibration
    from swpipe_core.pipelines import get

    out: Dict[str, Any] = {}
    rng = random.Random(0)
    for k in range(60):
        plan, secs = random_plan(rng)
        costs = CostModel({n: TaskCost(s) for n, s in secs.items()})
        out[f"bare {k}"] = _period(simulate(plan, costs, num_iterations=40))
        out[f"overheads {k}"] = _period(simulate(plan, costs, num_iterations=40, task_overhead_s=7e-5,
                                                 period_overhead_s=2e-5))
        for free in (1.0, 1.6, 2.0):
            cal = MachineCalibration(task_s=2e-6, dep_s=1.5e-5, period_s=3e-5, serial_task_s=5e-7,
                                     serial_iter_s=4e-6, cores_free=free, cpu_count=2)
            if hasattr(machine, "simulate_calibrated"):  # a tree where simulate did not fold a calibration
                got = machine.simulate_calibrated(plan, costs, cal, num_iterations=60)
            else:
                got = simulate(plan, dataclasses.replace(costs, machine_calibration=cal), num_iterations=60)
            out[f"calibrated {k} cores_free={free}"] = _period(got)
    for path in sorted(glob.glob(str(ROOT / "cost_models" / "*.json"))):
        name = Path(path).stem
        try:
            out[f"torchrec {name}"] = _period(simulate(get(name), CostModel.load(path), 60, device="cuda"))
        except KeyError:  # a cost model of no built-in plan
            continue
    return out


def pp_cases() -> Dict[str, Any]:
    from autosched.pp.costs import P2PCost, PPCosts, StageCost
    from autosched.pp.program import pp_program
    from autosched.pp.simulate import pp_simulate

    out: Dict[str, Any] = {}
    rng = random.Random(0)
    for trial in range(6):
        for name, n_stages in SCHEDULES:
            for mb in (4, 8):
                stages = []
                for s in range(n_stages):
                    f = rng.uniform(1e-3, 5e-3)
                    b = f * rng.uniform(1.5, 2.5)
                    i = b * rng.uniform(0.3, 0.7)
                    stages.append(StageCost(
                        forward_s=f, backward_s=b, backward_input_s=i, backward_weight_s=b - i,
                        loss_s=rng.uniform(1e-4, 1e-3) if s == n_stages - 1 else 0.0,
                        reduce_grad_s=rng.uniform(0, 5e-4), activation_bytes=rng.randrange(1, 10**6),
                        weight_keep_bytes=rng.randrange(1, 10**6), output_bytes=rng.randrange(1, 10**5),
                        grad_input_bytes=rng.randrange(1, 10**5) if s else 0,
                        forward_peak_bytes=rng.randrange(0, 10**5), backward_peak_bytes=rng.randrange(0, 10**5)))
                p2p = P2PCost(latency_s=rng.uniform(0, 2e-4), seconds_per_byte=rng.uniform(0, 1e-9), backend="gloo",
                              post_s=rng.uniform(0, 1e-3) if trial % 2 else 0.0)
                r = pp_simulate(pp_program(name, 2, mb), PPCosts(tuple(stages), p2p))
                out[f"{name} mb={mb} costs {trial}"] = [r.step_s, [r.bubble_s[k] for k in sorted(r.bubble_s)],
                                                        [r.peak_bytes[k] for k in sorted(r.peak_bytes)]]
    return out


def gpipe_cases() -> Dict[str, Any]:
    import inspect

    from swpipe.gpipe.predict import LayerModel, predict_step

    # a tree before the schedules were spelt as PyTorch spells them took "gpipe" and "1f1b"
    lower = inspect.signature(predict_step).parameters["schedule"].default == "gpipe"
    out: Dict[str, Any] = {}
    rng = random.Random(1)
    for trial in range(40):
        n = 8
        layers = LayerModel(forward=[(rng.uniform(0, 1e-4), rng.uniform(1e-5, 1e-4)) for _ in range(n)],
                            backward=[(rng.uniform(0, 1e-4), rng.uniform(2e-5, 2e-4)) for _ in range(n)],
                            saved_per_sample=[float(rng.choice([4096, 8192, 0])) for _ in range(n)],
                            output_per_sample=[4096.0] * n)
        slowdown = ({f"{k}{j}": rng.uniform(1.0, 2.5) for k in ("F", "B", "C") for j in range(2)}
                    if trial % 2 else None)
        for schedule, modes in (("GPipe", ("never", "except_last", "always")), ("1F1B", ("never", "always"))):
            for mode in modes:
                for chunks in (4, 8):
                    p = predict_step(layers, [4, 4], 256, chunks, mode, schedule.lower() if lower else schedule,
                                     slowdown=slowdown)
                    out[f"{schedule} {mode} chunks={chunks} model {trial}"] = [p.step_s, p.bubble, p.activation_bytes]
    return out


def in_process(src: str) -> Dict[str, Dict[str, Any]]:
    """Every case's prediction in a fresh interpreter importing the tree at ``src``."""
    done = subprocess.run([sys.executable, __file__, "--child"], env=dict(os.environ, PYTHONPATH=src),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", metavar="DIR", help="another tree's src folder")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps({"plan": plan_cases(), "pp": pp_cases(), "gpipe": gpipe_cases()}))
        return 0
    this = in_process(str(ROOT / "src"))
    if not args.against:
        print({kind: len(cases) for kind, cases in this.items()})
        return 0
    other = in_process(args.against)
    differ = 0
    for kind, cases in this.items():
        theirs = other.get(kind, {})
        moved = [k for k in cases if k in theirs and cases[k] != theirs[k]]
        missing = sum(k not in theirs for k in cases)
        print(f"{kind:6s} {len(cases) - len(moved) - missing} of {len(cases)} equal bit for bit"
              + (f"; {missing} not run by the other tree" if missing else ""))
        for k in moved[:10]:
            print(f"    {k}: this {cases[k]}, other {theirs[k]}")
        differ += len(moved)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
