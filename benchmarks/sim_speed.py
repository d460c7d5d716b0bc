"""The simulator's speed: milliseconds per ``simulate()`` call on fixed TorchRec plans, optionally beside another tree.

The searchers score every candidate plan with the simulator, so its speed bounds how
many plans a search can look at in its budget. Three fixed inputs, each a TorchRec
plan (:mod:`swpipe_core.pipelines`) with its hand-written cost model of
``cost_models/``:

* ``fused_sparse_dist`` on CUDA (host parts on threads, device parts on streams);
* ``sparse_dist`` on CPU;
* ``fused_sparse_dist`` on CPU with a core pool of 2 (``CostModel.cores``).

Each is simulated ``--calls`` times in ``--blocks`` blocks, timed in CPU time of
the process (``time.process_time``: on a shared machine, wall time also counts the
time other processes hold the cores); the fastest block's mean counts (what
load leaves, cache misses and a slower clock, only ever slows a block). With
``--against DIR`` (another checkout's ``src`` folder, e.g. the main branch's) the
two trees run in fresh processes in alternating order for ``--rounds`` rounds;
each round's ratio of this tree's time to the other's pairs two runs made close
together, and the median of those ratios (with the lowest and highest) is
printed: a change to the simulator must not make it slower. The load average is
printed beside the figures.

Usage::

    python benchmarks/sim_speed.py                               # this tree
    python benchmarks/sim_speed.py --against /path/to/main/src   # side by side
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
CASES: Tuple[Tuple[str, str, Optional[int]], ...] = (
    ("fused_sparse_dist", "cuda", None), ("sparse_dist", "cpu", None), ("fused_sparse_dist", "cpu", 2))


def case_label(name: str, device: str, cores: Optional[int]) -> str:
    return f"{name} {device}" + (f" cores={cores}" if cores else "")


def time_cases(calls: int, blocks: int) -> List[float]:
    """CPU seconds per ``simulate()`` call for each case (the fastest block's mean)."""
    from autosched.model.costs import CostModel
    from autosched.model.simulate import simulate
    from swpipe_core import pipelines

    out = []
    for name, device, cores in CASES:
        plan = pipelines.get(name)
        costs = dataclasses.replace(CostModel.load(str(ROOT / "cost_models" / f"{name}.json")), cores=cores)
        simulate(plan, costs, device=device)  # warm: imports, caches
        best = float("inf")
        for _ in range(blocks):
            start = time.process_time()
            for _ in range(calls):
                simulate(plan, costs, device=device)
            best = min(best, (time.process_time() - start) / calls)
        out.append(best)
    return out


def _in_process(src: str, calls: int, blocks: int) -> List[float]:
    """:func:`time_cases` in a fresh interpreter importing the tree at ``src``."""
    env = dict(os.environ, PYTHONPATH=src)
    done = subprocess.run([sys.executable, __file__, "--child", "--calls", str(calls), "--blocks", str(blocks)],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def side_by_side(trees: Dict[str, str], rounds: int, calls: int, blocks: int) -> Dict[str, List[List[float]]]:
    """Each tree's CPU seconds per call, per round (a fresh process each), the trees in alternating order."""
    times: Dict[str, List[List[float]]] = {label: [] for label in trees}
    labels = list(trees)
    for r in range(rounds):
        for label in (labels if r % 2 == 0 else labels[::-1]):
            times[label].append(_in_process(trees[label], calls, blocks))
    return times


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=40, help="simulate() calls per block")
    p.add_argument("--blocks", type=int, default=5, help="blocks per case; the fastest counts")
    p.add_argument("--against", metavar="DIR", help="another tree's src folder, timed side by side with this one")
    p.add_argument("--rounds", type=int, default=6, help="alternating rounds with --against")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(time_cases(args.calls, args.blocks)))
        return 0
    load0 = os.getloadavg()[0]
    if args.against:
        runs = side_by_side({"this": str(ROOT / "src"), "other": args.against}, args.rounds, args.calls, args.blocks)
    else:
        runs = {"this": [time_cases(args.calls, args.blocks)]}
    print(f"CPU ms per simulate() call, best block of {args.calls} calls"
          + (f", best of {args.rounds} alternating rounds" if args.against else ""))
    for k, case in enumerate(CASES):
        cells = "  ".join(f"{label} {min(r[k] for r in rounds) * 1e3:7.3f}" for label, rounds in runs.items())
        ratio = ""
        if args.against:
            ratios = sorted(a[k] / b[k] for a, b in zip(runs["this"], runs["other"]))
            ratio = f"  this/other {statistics.median(ratios):.3f} [{ratios[0]:.3f}-{ratios[-1]:.3f}]"
        print(f"  {case_label(*case):32s} {cells}{ratio}")
    print(f"load average: {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end ({os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
