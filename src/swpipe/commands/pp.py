"""``swpipe pp``: PyTorch's pipeline-parallel schedules and one searched by swpipe, predicted and measured.

::

    swpipe pp                                   # 2 ranks, 4 and 8 micro-batches, every schedule
    swpipe pp --ranks 2 --microbatches 4 --schedules GPipe,1F1B,ZBVZeroBubble
    swpipe pp --grid Interleaved1F1B --ranks 2 --microbatches 4 [--comms]   # the schedule only

It starts ``torchrun --nproc-per-node RANKS`` on the loopback with gloo; every schedule
trains the same staged model on ``torch.distributed.pipelining``'s runtime, and one
table gives each schedule's predicted and measured step, peak memory and bubble.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List

from swpipe.commands._args import int_at_least, positive_float

__all__ = ["add_arguments", "run"]


def _int_list(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers >= 1 separated by commas, e.g. 4,8") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers >= 1 separated by commas, e.g. 4,8")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``swpipe pp``."""
    parser.add_argument("--ranks", type=int_at_least(2), default=2, help="processes torchrun starts (default 2)")
    parser.add_argument("--microbatches", type=_int_list, default=[4, 8], metavar="N[,N...]",
                        help="micro-batch counts (default 4,8)")
    parser.add_argument("--schedules", default="", metavar="NAME[,NAME...]",
                        help="PyTorch schedules to run (default: every one this torch has)")
    parser.add_argument("--width", type=int_at_least(1), default=512, help="the model's width (default 512)")
    parser.add_argument("--depth", type=int_at_least(2), default=8,
                        help="Linear+Tanh blocks, cut into ranks and 2 x ranks stages (default 8)")
    parser.add_argument("--batch", type=int_at_least(1), default=256, help="samples per step (default 256)")
    parser.add_argument("--steps", type=int_at_least(1), default=8, help="timed steps per schedule (default 8)")
    parser.add_argument("--warmup", type=int_at_least(0), default=2, help="untimed steps first (default 2)")
    parser.add_argument("--threads", type=int_at_least(1), default=1, help="torch threads per rank (default 1)")
    parser.add_argument("--no-search", action="store_true", help="run PyTorch's schedules only")
    parser.add_argument("--memory-cap-mib", type=positive_float, default=None,
                        help="the search's peak-memory cap per rank, MiB")
    parser.add_argument("--time-limit", type=positive_float, default=5.0, help="CP-SAT seconds per problem (default 5)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the whole report as JSON")
    parser.add_argument("--csv", default=None, metavar="PATH",
                        help="also write the searched schedule (compute-only CSV, _PipelineScheduleRuntime._load_csv)")
    parser.add_argument("--timeout", type=positive_float, default=900.0, help="kill the job after this long (s)")
    parser.add_argument("--grid", default=None, metavar="SCHEDULE",
                        help="print this schedule's step x rank grid (first micro-batch count) and stop")
    parser.add_argument("--comms", action="store_true", help="with --grid: the order with sends and receives")


def _grid(args: argparse.Namespace) -> int:
    from autosched.pp.program import PPError, pp_program

    try:
        program = pp_program(args.grid, args.ranks, args.microbatches[0])
    except PPError as exc:
        print(f"swpipe pp: {exc}", file=sys.stderr)
        return 2
    print(f"{program.schedule}: {program.n_ranks} ranks, {program.n_stages} stages (stage -> rank "
          f"{list(program.stage_to_rank)}), {program.n_microbatches} micro-batches")
    print(program.grid(comms=args.comms), end="")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the job and print the table; 2 on bad input, 1 when the job fails."""
    if args.grid:
        return _grid(args)
    from autosched._fields import schedule_name
    from autosched.pp.program import builtin_programs
    from autosched.pp.runtime import PPRunConfig, format_table, launch

    known = builtin_programs(args.ranks, max(args.microbatches))[0].keys() | builtin_programs(
        args.ranks, min(args.microbatches))[0].keys()
    # PyTorch's names in any case, spelt as PyTorch spells them (the one rule of a schedule's name)
    names = tuple(schedule_name(n.strip(), sorted(known)) or n.strip() for n in args.schedules.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"swpipe pp: --schedules: unknown or refused for these sizes: {', '.join(unknown)} "
              f"(known: {', '.join(sorted(known))})", file=sys.stderr)
        return 2
    if args.depth < 2 * args.ranks:
        print(f"swpipe pp: --depth {args.depth}: the model needs at least 2 x ranks = {2 * args.ranks} blocks",
              file=sys.stderr)
        return 2
    bad = [n for n in args.microbatches if args.batch % n]
    if bad:
        print(f"swpipe pp: --batch {args.batch} does not split into {bad} micro-batches", file=sys.stderr)
        return 2
    cores = os.cpu_count() or 1
    cfg = PPRunConfig(width=args.width, depth=args.depth, batch=args.batch, microbatches=tuple(args.microbatches),
                      schedules=names, steps=args.steps, warmup=args.warmup, search=not args.no_search,
                      memory_cap_bytes=None if args.memory_cap_mib is None else int(args.memory_cap_mib * 2**20),
                      threads=args.threads, time_limit_s=args.time_limit)
    print(f"torchrun --nproc-per-node {args.ranks} (gloo, CPU): {args.ranks} ranks x {args.threads} thread(s) on "
          f"{cores} cores, load {os.getloadavg()[0]:.1f}; model {args.depth} x Linear({args.width})+Tanh, "
          f"batch {args.batch}", flush=True)
    try:
        report = launch(cfg, args.ranks, timeout_s=args.timeout)
    except (RuntimeError, TimeoutError) as exc:
        print(f"swpipe pp: {exc}", file=sys.stderr)
        return 1
    print(format_table(report))
    p2p = report["p2p"]
    print(f"link (gloo, measured): {p2p['latency_s'] * 1e6:.0f} us + {p2p['seconds_per_byte'] * 1e9:.3f} ns/byte, "
          f"{p2p.get('post_s', 0.0) * 1e3:.2f} ms per post while the ranks compute; "
          f"load {report['load'][0]:.1f} at the end")
    print("step: median of the slowest rank's schedule.step(); peak: live tensor bytes above the step's start "
          "(autosched.pp.memory.LiveTensorBytes); bubble: predicted idle share of the busiest rank's step")
    if report.get("searched"):
        print(report["searched"]["summary"])
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                f.write(report["searched"]["csv"])
            print(f"searched schedule written to {args.csv} (load it with _PipelineScheduleRuntime._load_csv)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    if args.ranks > cores:
        print(f"note: {args.ranks} ranks share {cores} cores: measured steps include time-slicing the model "
              "does not predict")
    return 0
