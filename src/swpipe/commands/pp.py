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
import shutil
import sys
import tempfile
from typing import List, Optional, Tuple

from swpipe.commands._args import int_at_least, positive_float, positive_number

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
                        help="PyTorch schedules to run, in any case (default: every one this torch has)")
    parser.add_argument("--width", type=int_at_least(1), default=512, help="the model's width (default 512)")
    parser.add_argument("--depth", type=int_at_least(2), default=8,
                        help="Linear+Tanh blocks, cut into ranks and 2 x ranks stages (default 8)")
    parser.add_argument("--batch", type=int_at_least(1), default=256, help="samples per step (default 256)")
    parser.add_argument("--steps", type=int_at_least(1), default=8, help="timed steps per schedule (default 8)")
    parser.add_argument("--warmup", type=int_at_least(0), default=2, help="untimed steps first (default 2)")
    parser.add_argument("--threads", type=int_at_least(1), default=1, help="torch threads per rank (default 1)")
    parser.add_argument("--no-search", action="store_true", help="run PyTorch's schedules only")
    parser.add_argument("--memory-cap-mib", type=positive_number("MiB", "size", "512"), default=None,
                        help="the search's peak-memory cap per rank, MiB")
    parser.add_argument("--time-limit", type=positive_float, default=5.0, help="CP-SAT seconds per problem (default 5)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the whole report as JSON")
    parser.add_argument("--csv", default=None, metavar="PATH",
                        help="also write the searched schedule (compute-only CSV, _PipelineScheduleRuntime._load_csv)")
    parser.add_argument("--timeout", type=positive_float, default=900.0,
                        help="stop the job after this long (s; exit status 124)")
    parser.add_argument("--grid", default=None, metavar="SCHEDULE",
                        help="print this schedule's step x rank grid (first micro-batch count) and stop")
    parser.add_argument("--comms", action="store_true", help="with --grid only: the order with sends and receives")


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


# the command's exit status when the job is stopped (PPJobError.reason), as shells count them; 1 otherwise
_EXIT_STATUS = {"interrupted": 130, "terminated": 143, "hangup": 129, "timeout": 124}


def _unwritable(option: str, path: str) -> Optional[str]:
    """Why ``path`` cannot be written (None if it can), found before the job runs rather than after."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{option} {path}: is a folder: give a file's path"
    if not os.path.isdir(folder):
        return f"{option} {path}: the folder {folder} does not exist: create it or give another path"
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"{option} {path}: not writable: give a path you can write"
    return None


def _flag_errors(args: argparse.Namespace) -> List[str]:
    """What is wrong with the options, before anything is started."""
    errors = []
    if args.comms and not args.grid:
        errors.append("--comms: it adds the sends and receives to --grid's table: give it with --grid SCHEDULE")
    if args.no_search:
        errors += [f"{option}: the search's, which --no-search skips: drop one of them"
                   for option, given in (("--csv", args.csv), ("--memory-cap-mib", args.memory_cap_mib))
                   if given is not None]
    if args.depth < 2 * args.ranks:
        errors.append(f"--depth {args.depth}: the model needs at least 2 x ranks = {2 * args.ranks} blocks")
    bad = [n for n in args.microbatches if args.batch % n]
    if bad:
        errors.append(f"--batch {args.batch} does not split into {bad} micro-batches")
    errors += [e for e in (_unwritable(o, p) for o, p in (("--json", args.json), ("--csv", args.csv)) if p) if e]
    return errors


def _schedules(args: argparse.Namespace) -> Tuple[Tuple[str, ...], List[str]]:
    """The ``--schedules`` names as PyTorch spells them (any case, as ``pp_program`` reads them), and the errors."""
    from autosched.pp.program import PPError, pp_program

    names: List[str] = []
    errors = []
    for given in (n.strip() for n in args.schedules.split(",") if n.strip()):
        refused = []
        for n_mb in args.microbatches:
            try:
                names.append(pp_program(given, args.ranks, n_mb).schedule)
            except PPError as exc:
                refused.append(exc)
        if len(refused) == len(args.microbatches):  # unknown, or refused for every micro-batch count
            errors.append(f"--schedules: {refused[0]}")
    return tuple(dict.fromkeys(names)), errors


def run(args: argparse.Namespace) -> int:
    """Run the job and print the table; 2 on bad input, 1 when the job fails, 130/143/129/124 when it is stopped."""
    try:
        return _run(args)
    except KeyboardInterrupt:  # before or after the job: nothing of ours is running
        print("swpipe pp: interrupted (SIGINT, Ctrl-C)", file=sys.stderr)
        return _EXIT_STATUS["interrupted"]


def _run(args: argparse.Namespace) -> int:
    if args.grid:
        return _grid(args)
    errors = _flag_errors(args)
    names, schedule_errors = _schedules(args)
    errors += schedule_errors
    if errors:
        print("\n".join(f"swpipe pp: {e}" for e in errors), file=sys.stderr)
        return 2
    from autosched.pp.runtime import PPJobError, PPRunConfig, format_table, launch

    cores = os.cpu_count() or 1
    cfg = PPRunConfig(width=args.width, depth=args.depth, batch=args.batch, microbatches=tuple(args.microbatches),
                      schedules=names, steps=args.steps, warmup=args.warmup, search=not args.no_search,
                      memory_cap_bytes=None if args.memory_cap_mib is None else int(args.memory_cap_mib * 2**20),
                      threads=args.threads, time_limit_s=args.time_limit)
    folder = tempfile.mkdtemp(prefix="swpipe-pp-")
    log_path = os.path.join(folder, "torchrun.log")
    print(f"torchrun --nproc-per-node {args.ranks} (gloo, CPU): {args.ranks} ranks x {args.threads} thread(s) on "
          f"{cores} cores, load {os.getloadavg()[0]:.1f}; model {args.depth} x Linear({args.width})+Tanh, "
          f"batch {args.batch}", flush=True)
    print(f"torchrun's output: {log_path}", flush=True)
    try:
        report = launch(cfg, args.ranks, out_path=os.path.join(folder, "report.json"), timeout_s=args.timeout,
                        log_path=log_path)
    except PPJobError as exc:
        print(f"swpipe pp: {exc}", file=sys.stderr)
        return _EXIT_STATUS.get(exc.reason, 1)
    print(format_table(report))
    p2p = report["p2p"]
    print(f"link (gloo, measured): {p2p['latency_s'] * 1e6:.0f} us + {p2p['seconds_per_byte'] * 1e9:.3f} ns/byte, "
          f"{p2p.get('post_s', 0.0) * 1e3:.2f} ms per post while the ranks compute; "
          f"load {report['load'][0]:.1f} at the end")
    print("step: median of the slowest rank's schedule.step(); peak: live tensor bytes above the step's start "
          "(autosched.pp.memory.LiveTensorBytes); bubble: predicted idle share of the busiest rank's step")
    if report.get("searched"):
        print(report["searched"]["summary"])
    try:
        if args.csv and report.get("searched"):
            with open(args.csv, "w", newline="") as f:
                f.write(report["searched"]["csv"])
            print(f"searched schedule written to {args.csv} (load it with _PipelineScheduleRuntime._load_csv)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1, default=str)
    except OSError as exc:  # checked before the run; removed or full since
        print(f"swpipe pp: {exc.filename}: cannot be written ({exc.strerror}); the report is in "
              f"{os.path.join(folder, 'report.json')}", file=sys.stderr)
        return 1
    if args.ranks > cores:
        print(f"note: {args.ranks} ranks share {cores} cores: measured steps include time-slicing the model "
              "does not predict")
    shutil.rmtree(folder, ignore_errors=True)
    return 0
