"""``swpipe pp``: PyTorch's pipeline-parallel schedules and one searched by swpipe, predicted and measured.

::

    swpipe pp                                   # 2 ranks, 4 and 8 micro-batches, every schedule
    swpipe pp --ranks 2 --microbatches 4 --schedules GPipe,1F1B,ZBVZeroBubble
    swpipe pp --model mymodels.pp:tiny          # your model (a factory returning a swpipe.pp.PPModel)
    swpipe pp --grid Interleaved1F1B --ranks 2 --microbatches 4 [--comms]   # the schedule only

It starts ``torchrun --nproc-per-node RANKS`` on the loopback with gloo
(:mod:`~swpipe.commands.pp_launch`); every rank runs :mod:`~swpipe.commands.pp_job`: every
schedule trains the same staged model on ``torch.distributed.pipelining``'s runtime. One
table gives each schedule's predicted and measured step, peak memory and bubble, and the
summary under it reads the same rows (:func:`summarise`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from autosched.results import Preference, fastest, pp_preference
from swpipe.commands._args import int_at_least, positive_float, positive_number

__all__ = ["add_arguments", "run", "format_table", "format_summary", "format_report", "summarise", "PPSummary"]


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
    parser.add_argument("--model", default=None, metavar="PKG.MODULE:FACTORY",
                        help="train your model: a factory returning a swpipe.pp.PPModel (default: the built-in MLP)")
    parser.add_argument("--width", type=int_at_least(1), default=None,
                        help="the built-in model's width (default 512)")
    parser.add_argument("--depth", type=int_at_least(2), default=None,
                        help="the built-in model's Linear+Tanh blocks, cut into ranks and 2 x ranks stages (default 8)")
    parser.add_argument("--batch", type=int_at_least(1), default=None,
                        help="the built-in model's samples per step (default 256)")
    parser.add_argument("--steps", type=int_at_least(1), default=8, help="timed steps per schedule (default 8)")
    parser.add_argument("--warmup", type=int_at_least(0), default=2, help="untimed steps first (default 2)")
    parser.add_argument("--threads", type=int_at_least(1), default=1, help="torch threads per rank (default 1)")
    parser.add_argument("--no-search", action="store_true", help="run PyTorch's schedules only")
    parser.add_argument("--memory-cap-mib", type=positive_number("MiB", "size", "512"), default=None,
                        help="the search's peak-memory cap per rank, MiB")
    parser.add_argument("--time-limit", type=positive_float, default=5.0, help="CP-SAT seconds per problem (default 5)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the whole report as JSON")
    parser.add_argument("--csv", default=None, metavar="PATH",
                        help="also write the searched schedule's order (compute-only CSV; run it with "
                             "swpipe.pp.schedule_for(swpipe.pp.read_csv(...), ...))")
    parser.add_argument("--timeout", type=positive_float, default=900.0,
                        help="stop the job after this long (s; exit status 124)")
    parser.add_argument("--grid", default=None, metavar="SCHEDULE",
                        help="print this schedule's step x rank grid (first micro-batch count) and stop")
    parser.add_argument("--comms", action="store_true", help="with --grid only: the order with sends and receives")


def _grid(args: argparse.Namespace) -> int:
    from swpipe.pp import PPError, pp_program

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
    errors += [e for e in (_unwritable(o, p) for o, p in (("--json", args.json), ("--csv", args.csv)) if p) if e]
    return errors


_BUILTIN_SIZES = {"width": 512, "depth": 8, "batch": 256}  # the built-in model's keywords, by default


def _model(args: argparse.Namespace) -> Tuple[Any, str, Dict[str, Any], List[str]]:
    """The model the job will train, loaded here first (its factory imported, called twice, checked): the model,
    its factory, the keywords it is called with, and what is wrong."""
    from swpipe.commands.pp_model import BUILTIN_MODEL, PPModelError, load_model

    given = {k: getattr(args, k) for k in _BUILTIN_SIZES if getattr(args, k) is not None}
    if args.model and given:
        return None, args.model, {}, [f"--{k}: the built-in model's, and --model {args.model} builds its own: "
                                      "drop one of them" for k in given]
    spec, options = (args.model, {}) if args.model else (BUILTIN_MODEL, {**_BUILTIN_SIZES, **given})
    try:
        model = load_model(spec, options, check_twice=True)
    except PPModelError as exc:
        return None, spec, options, [str(exc)]
    errors = []
    if not model.stage_counts(args.ranks):
        cut = (f"is cut into {len(model.stages) if model.stages is not None else len(model.split_points) + 1} stages"
               if model.model is None or model.split_points is not None else f"has {len(model.model)} children")
        errors.append(f"--ranks {args.ranks}: the model {cut}; PyTorch's schedules run {args.ranks} stages (one "
                      f"per rank) or {2 * args.ranks} (two per rank)" + ("" if args.model else ": give a larger --depth"))
    bad = [n for n in args.microbatches if model.samples % n]
    if bad:
        where = "--batch" if not args.model else "PPModel.batch"
        errors.append(f"--microbatches {','.join(map(str, bad))}: the model's batch of {model.samples} samples "
                      f"({where}) does not split into them")
    return model, spec, options, errors


def _schedules(args: argparse.Namespace, model: Any) -> Tuple[Tuple[str, ...], List[str]]:
    """The ``--schedules`` names as PyTorch spells them (any case, as ``pp_program`` reads them), and the errors:
    a name refused for every micro-batch count, by PyTorch or because of the model's cut."""
    from swpipe.pp import PPError, pp_program

    names: List[str] = []
    errors = []
    for given in (n.strip() for n in args.schedules.split(",") if n.strip()):
        refused = []
        for n_mb in args.microbatches:
            try:
                name = pp_program(given, args.ranks, n_mb).schedule
            except PPError as exc:
                refused.append(str(exc))
                continue
            why = {} if model is None else model.programs(args.ranks, n_mb)[1]
            if name in why:
                refused.append(f"{name} with {n_mb} micro-batches: {why[name]}")
            else:
                names.append(name)
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
    model, spec, options, model_errors = _model(args)
    errors += model_errors
    names, schedule_errors = _schedules(args, model)
    errors += schedule_errors
    if errors:
        print("\n".join(f"swpipe pp: {e}" for e in errors), file=sys.stderr)
        return 2
    from swpipe.commands import pp_launch
    from swpipe.commands.pp_job import PPRunConfig
    from swpipe.commands.pp_model import import_root

    cores = os.cpu_count() or 1
    cfg = PPRunConfig(model=spec, model_options=options, model_root=import_root(spec),
                      microbatches=tuple(args.microbatches), schedules=names, steps=args.steps, warmup=args.warmup,
                      search=not args.no_search,
                      memory_cap_bytes=None if args.memory_cap_mib is None else int(args.memory_cap_mib * 2**20),
                      threads=args.threads, time_limit_s=args.time_limit)
    folder = tempfile.mkdtemp(prefix="swpipe-pp-")
    log_path = os.path.join(folder, "torchrun.log")
    what = spec if args.model else (f"{options['depth']} x Linear({options['width']})+Tanh")
    print(f"torchrun --nproc-per-node {args.ranks} (gloo, CPU): {args.ranks} ranks x {args.threads} thread(s) on "
          f"{cores} cores, load {os.getloadavg()[0]:.1f}; model {what}, batch {model.samples}, "
          f"cut into {' and '.join(map(str, model.stage_counts(args.ranks)))} stages", flush=True)
    print(f"torchrun's output: {log_path}", flush=True)
    try:
        report = pp_launch.launch(cfg, args.ranks, out_path=os.path.join(folder, "report.json"),
                                  timeout_s=args.timeout, log_path=log_path)
    except pp_launch.PPJobError as exc:
        print(f"swpipe pp: {exc}", file=sys.stderr)
        return _EXIT_STATUS.get(exc.reason, 1)
    print(format_report(report))
    try:
        if args.csv and report.get("searched"):
            with open(args.csv, "w", newline="") as f:
                f.write(report["searched"]["csv"])
            print(f"searched schedule written to {args.csv} (run it on each rank with "
                  f"swpipe.pp.schedule_for(swpipe.pp.read_csv(path, ranks, stages, micro-batches), stages, loss_fn))")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1, default=str)
    except OSError as exc:  # checked before the run; removed or full since
        print(f"swpipe pp: {exc.filename}: cannot be written ({exc.strerror}); the report is in "
              f"{os.path.join(folder, 'report.json')}", file=sys.stderr)
        return 1
    if report.get("prediction_cores"):
        print(f"note: {args.ranks} ranks share {report['prediction_cores']} cores: they take turns on them, and the "
              f"prediction lets {report['prediction_cores']} compute at once (swpipe.simulate(..., cores="
              f"{report['prediction_cores']})); the costs were measured {report['prediction_cores']} ranks at a time")
    shutil.rmtree(folder, ignore_errors=True)
    return 0


# --- the report, printed ----------------------------------------------------------------------------------

def _ms(seconds: float) -> str:
    """A step time as the table and the summary print it (one format: the two must read the same)."""
    return f"{seconds * 1e3:.2f}"


def format_table(report: Dict[str, Any]) -> str:
    """One row per schedule and micro-batch count: predicted and measured step and peak, bubble, losses."""
    head = (f"{'schedule':<22}{'mb':>3}{'stages':>7}{'pred ms':>9}{'meas ms':>9}{'noise':>7}{'err':>7}"
            f"{'peak pred/meas KiB (max rank)':>31}{'bubble':>8}{'loss':>7}")
    lines = [head, "-" * len(head)]
    for r in report["results"]:
        if "refused" in r:
            lines.append(f"{r['schedule']:<22}{r['n_microbatches']:>3}  refused: {r['refused']}")
            continue
        pred, meas = r["predicted_step_s"], r["measured_step_s"]
        pp = max(int(v) for v in r["predicted_peak_bytes"].values()) / 1024
        mp = max(int(v) for v in r["measured_peak_bytes"].values()) / 1024
        bubble = max(float(v) for v in r["predicted_bubble"].values())
        ok = "ok" if r["loss_rel_err"] <= 1e-4 else f"{r['loss_rel_err']:.0e}"
        lines.append(f"{r['schedule']:<22}{r['n_microbatches']:>3}{r['n_stages']:>7}{_ms(pred):>9}{_ms(meas):>9}"
                     f"{r['noise']:>7.0%}{(pred - meas) / meas:>+7.0%}{f'{pp:.0f} / {mp:.0f}':>31}{bubble:>8.0%}{ok:>7}")
    return "\n".join(lines)


@dataclass(frozen=True)
class PPSummary:
    """What the summary under the table says, each figure one of the table's rows (the report's ``results``).

    Attributes
    ----------
    predicted_fastest, measured_fastest : dict
        The row predicted fastest (:func:`predicted_preference`'s rule: a tie within 1 % goes to the lower
        predicted peak), and the row with the least measured step.
    searched : dict or None
        The searched schedule's row (None without a search).
    fastest_pytorch : dict or None
        The row of PyTorch's schedule predicted fastest (the same rule) at the searched one's micro-batch count.
    cpsat : list of dict
        The search's CP-SAT problems (``PPCpsatRun`` fields): their makespans are CP-SAT's model's, not rows.
    worst_predicted : dict
        The row whose prediction is farthest from its measured step (relative): where to look for why.
    """

    predicted_fastest: Dict[str, Any]
    measured_fastest: Dict[str, Any]
    searched: Optional[Dict[str, Any]]
    fastest_pytorch: Optional[Dict[str, Any]]
    cpsat: List[Dict[str, Any]]
    worst_predicted: Dict[str, Any]


def predicted_preference(row: Dict[str, Any]) -> Preference:
    """A report row's prediction as :func:`autosched.results.fastest` ranks it: its predicted step, then (a tie
    within 1 %) its fullest rank's predicted peak, then fewer stages and micro-batches.

    Examples
    --------
    >>> from autosched.results import fastest
    >>> rows = [{"schedule": "GPipe", "n_stages": 2, "n_microbatches": 4, "predicted_step_s": 0.03356,
    ...          "predicted_peak_bytes": {"0": 14_000_000, "1": 9_000_000}},
    ...         {"schedule": "1F1B", "n_stages": 2, "n_microbatches": 4, "predicted_step_s": 0.03356,
    ...          "predicted_peak_bytes": {"0": 4_700_000, "1": 4_000_000}}]
    >>> fastest(rows, predicted_preference)["schedule"]
    '1F1B'
    """
    return pp_preference(row["predicted_step_s"], max(int(v) for v in row["predicted_peak_bytes"].values()),
                         row["n_stages"], row["n_microbatches"])


def summarise(report: Dict[str, Any]) -> PPSummary:
    """The summary's figures, read from the report's rows: the same rows the table prints."""
    from autosched.model.corrections import prediction_error

    rows = [r for r in report["results"] if "refused" not in r]
    searched = next((r for r in rows if r["schedule"] == "swpipe-searched"), None)
    peers = [r for r in rows if r["schedule"] != "swpipe-searched"
             and searched is not None and r["n_microbatches"] == searched["n_microbatches"]]
    return PPSummary(fastest(rows, predicted_preference), min(rows, key=lambda r: r["measured_step_s"]),
                     searched, fastest(peers, predicted_preference) if peers else None,
                     list((report.get("searched") or {}).get("cpsat", [])),
                     max(rows, key=lambda r: prediction_error([r["predicted_step_s"]], [r["measured_step_s"]])))


def _row(r: Dict[str, Any]) -> str:
    return f"{r['schedule']} ({r['n_microbatches']} micro-batches, {r['n_stages']} stages)"


def corrections_line(report: Dict[str, Any], field: str = "corrections") -> str:
    """Each correction's decision per micro-batch count (the report's ``corrections``, the rows' costs; or
    ``"search_corrections"``, the costs the search ran on, before the runs): kept or not, and the errors on the
    held-out steps that decided it; empty for a report without them.

    Examples
    --------
    >>> report = {"corrections": {"4": [{"correction": "post cost", "key": 4, "applied": False, "reason": "farther",
    ...                                  "error_without": 0.05, "error_with": 0.2, "steps": 8}]}}
    >>> corrections_line(report).split(": ")[1:]
    ['post cost at 4', 'not applied (farther', 'error 5.0% -> 20.0% on 8 held-out steps)']
    """
    from autosched.model.corrections import CorrectionDecision

    decided = [CorrectionDecision(**d) for by in report.get(field, {}).values() for d in by]
    if not decided:
        return ""
    return ("corrections" if field == "corrections" else "corrections the search ran on") + ": " + "; ".join(
        d.describe() for d in decided)


def split_line(row: Dict[str, Any]) -> str:
    """Where a row's steps went on its busiest rank (the most compute): its median step's compute, posting,
    waiting and the rest, its compute beside the prediction's (``""`` for a row without a split).

    Examples
    --------
    >>> row = {"schedule": "1F1B", "n_microbatches": 8, "n_stages": 2, "predicted_busy_s": {"0": 0.020, "1": 0.040},
    ...        "split_by_rank": {"0": {"step_s": 0.075, "compute_s": 0.021, "post_s": 0.002, "wait_s": 0.05},
    ...                          "1": {"step_s": 0.074, "compute_s": 0.045, "post_s": 0.019, "wait_s": 0.007}}}
    >>> print(split_line(row))
    where 1F1B (8 micro-batches, 2 stages)'s step went on rank 1 (the most compute), in its median step: compute 45.00 ms (40.00 predicted), posting 19.00, waiting 7.00, the rest 3.00 of 74.00 ms
    """
    from swpipe.pp import StepSplit

    splits = {str(rank): StepSplit(**split) for rank, split in (row.get("split_by_rank") or {}).items()}
    if not splits:
        return ""
    rank = max(splits, key=lambda r: splits[r].compute_s)
    s = splits[rank]
    predicted = {str(r): v for r, v in (row.get("predicted_busy_s") or {}).items()}.get(rank)
    return (f"where {_row(row)}'s step went on rank {rank} (the most compute), in its median step: compute "
            f"{_ms(s.compute_s)} ms" + (f" ({_ms(predicted)} predicted)" if predicted is not None else "")
            + f", posting {_ms(s.post_s)}, waiting {_ms(s.wait_s)}, the rest {_ms(s.other_s)} of {_ms(s.step_s)} ms")


def format_summary(report: Dict[str, Any]) -> str:
    """The lines under the table: the fastest rows, the searched one against PyTorch's, the link, CP-SAT labelled."""
    from swpipe.pp import PPCpsatRun

    s = summarise(report)
    p2p = report["p2p"]
    lines = [f"predicted fastest: {_row(s.predicted_fastest)}: {_ms(s.predicted_fastest['predicted_step_s'])} ms "
             f"predicted, {_ms(s.predicted_fastest['measured_step_s'])} ms measured",
             f"measured fastest: {_row(s.measured_fastest)}: {_ms(s.measured_fastest['measured_step_s'])} ms "
             f"measured, {_ms(s.measured_fastest['predicted_step_s'])} ms predicted"]
    found = report.get("searched") or {}
    if s.searched is not None:
        margin = (f"; a custom order only if predicted {found['margin_pct']:.1f} % faster" if "margin_pct" in found
                  else "")
        line = (f"searched ({found.get('origin', '?')}{margin}): {_row(s.searched)}: "
                f"{_ms(s.searched['predicted_step_s'])} ms predicted, {_ms(s.searched['measured_step_s'])} ms measured")
        if s.fastest_pytorch is not None:
            line += (f"; PyTorch's predicted fastest there: {s.fastest_pytorch['schedule']} "
                     f"{_ms(s.fastest_pytorch['predicted_step_s'])} ms predicted, "
                     f"{_ms(s.fastest_pytorch['measured_step_s'])} ms measured")
        lines.append(line)
    if found.get("cut"):
        lines.append(f"search: its {found['time_limit_s']:g} s time limit passed in {found['cut']} after "
                     f"{found['elapsed_s']:.1f} s; not tried: {len(found['not_tried'])} candidates")
    if s.cpsat:
        lines.append(f"{PPCpsatRun.MEANS}: " + "; ".join(str(PPCpsatRun(**run)) for run in s.cpsat))
    lines.append(f"link (gloo, measured): {p2p['latency_s'] * 1e6:.0f} us + {p2p['seconds_per_byte'] * 1e9:.3f} "
                 f"ns/byte, {p2p.get('post_s', 0.0) * 1e3:.2f} ms per post while the ranks compute; "
                 f"load {report['load'][0]:.1f} at the end")
    for field in ("search_corrections", "corrections"):
        decided = corrections_line(report, field)
        if decided:
            lines.append(decided)
    shown: List[Dict[str, Any]] = []
    for row in (s.measured_fastest, s.predicted_fastest, s.worst_predicted):  # each row once
        if all(row is not r for r in shown):
            shown.append(row)
    lines.extend(line for line in map(split_line, shown) if line)
    lines.append("step: median of the slowest rank's schedule.step(); peak: live tensor bytes above the step's start "
                 "(swpipe.pp.LiveTensorBytes); bubble: predicted idle share of the busiest rank's step; every "
                 "prediction on the costs measured before, during and after the runs")
    return "\n".join(lines)


def format_report(report: Dict[str, Any]) -> str:
    """The table and the summary under it, as ``swpipe pp`` prints them."""
    return format_table(report) + "\n" + format_summary(report)
