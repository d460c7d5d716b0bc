"""The README's quick start (``Load`` waits on storage beside ``Train``) pipelined against serial.

Issue 15 asks that the README's example show a pipelined run that is not
slower than serial, or say plainly why with numbers. This prints the numbers:
the plan the README's quick start gets from ``auto_schedule``, ``pipe.run``
(pipelined) and ``pipe.run_serial`` (one iteration at a time, same tasks, same
pipeline) interleaved over paired rounds; the ratio is the median of the
rounds' ``serial time / pipelined time``. Next to it, what there is to overlap
(the ``Load`` task's own time, from a serial timeline) and what overlapping it
costs (one main<->worker thread round trip on this machine).

    python benchmarks/readme_example.py            # 15 paired rounds
    python benchmarks/readme_example.py --rounds 1 # a smoke run
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import sys
import time
from typing import Optional, Sequence

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine_overhead import thread_round_trip  # noqa: E402 - the same measure of a thread round trip
from autosched.verify.measure import turned  # noqa: E402 - the rounds' order, as everywhere
from swpipe import SWPipeline  # noqa: E402


def readme_plan() -> tuple:
    """``(plan, batches)`` from running the README's quick start code block (so this measures exactly that)."""
    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    usage = text[text.index("## Quick start"):]
    block = re.search(r"```python\n(.*?)```", usage, re.S)
    if block is None or "plan, report = auto_schedule(" not in block.group(1):
        raise SystemExit("README.md: the python block of ## Quick start no longer defines `plan`; update this script")
    namespace: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), namespace)  # noqa: S102 - our own README
    return namespace["plan"], namespace["batches"]


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    plan, batches = readme_plan()
    n = len(batches)
    load0 = os.getloadavg()[0]
    piped, serial = [], []
    with SWPipeline(plan, device="cpu", record_timeline=False) as pipe:
        pipe.run(iter(batches))  # warm-up, both ways
        pipe.run_serial(iter(batches))
        for r in range(args.rounds):
            for kind, fn in turned([("p", pipe.run), ("s", pipe.run_serial)], r):
                (piped if kind == "p" else serial).append(fn(iter(batches)) / n)
    with SWPipeline(plan, device="cpu", record_timeline=True) as pipe:
        pipe.run_serial(iter(batches))
        load_s = statistics.median(e.end - e.start for e in pipe.timeline if e.task == "Load" and e.iteration >= 2)
    ratio = statistics.median(s / p for s, p in zip(serial, piped))
    print(f"README example, {args.rounds} paired rounds of {n} iterations, 1 intra-op thread, "
          f"load average {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"  pipelined  {statistics.median(piped) * 1e3:.3f} ms/it (median)")
    print(f"  serial     {statistics.median(serial) * 1e3:.3f} ms/it (median)")
    print(f"  pipelined vs serial: x{ratio:.3f} (median of the rounds' serial/pipelined)")
    print(f"  what there is to overlap: Load {load_s * 1e6:.0f} us per iteration; what a hand-off to the io thread "
          f"costs: one thread round trip {thread_round_trip(2000) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
