"""Pipeline parallelism across ranks: swpipe's prediction of PyTorch's schedules against the runtime, in one run.

    python benchmarks/pp.py                          # 2 ranks, 4 and 8 micro-batches, every schedule + searched
    python benchmarks/pp.py --ranks 2 --microbatches 4 --steps 6 --json out.json
    python benchmarks/pp.py --model unseen_models:unequal_mlp --memory-cap-mib 2   # a factory (benchmarks/)

One ``torchrun`` job (``swpipe.commands.pp_launch.launch``: gloo on the loopback, one torch
thread per rank) trains the same staged model (``--depth`` blocks of Linear + Tanh) with
every PyTorch schedule and the one swpipe searched, in interleaved rounds, and prints:

1. **Step time**, predicted (``pp_simulate`` on costs measured beside the runs) against
   measured (median of the slowest rank's ``schedule.step``), per schedule and micro-batch
   count; the median |error| over the built-in schedules, with the run's own noise (the
   median interquartile range of the steps over their median) beside it; whether the
   configuration predicted fastest runs within 5 % of the one measured fastest.
2. **Peak memory** per rank, predicted against measured (live tensor bytes above the
   step's start, ``autosched.pp.memory.LiveTensorBytes``); the median |error|.
3. **Searched against the best built-in** (under ``--memory-cap-mib``, the best whose measured
   peak fits the cap), both measured in the same rounds: the ratio, whether it is within the
   noise, and the lower bound on any order of the best built-in's stages on its ranks: where
   the bound leaves less than the noise below its prediction, no order can win measurably.
4. **PyTorch's dry run against swpipe**: what ``_simulate_comms_compute`` (unit steps, no
   time for transfers, no memory) and PyTorch's printed ``pipeline_order`` get wrong that
   swpipe's program and prediction get right.

Targets (issue 41): step time median |error| <= 10 %, peak memory <= 10 %, the searched
schedule never slower than the best built-in beyond the noise. ``uptime``'s load is
printed before and after: on a shared 2-core machine the figures move with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence

from autosched.pp import _torch
from autosched.pp.program import PPError, builtin_programs, pp_program
from autosched.results import fastest
from swpipe.commands.pp import corrections_line, format_table, predicted_preference
from swpipe.commands.pp_job import PPRunConfig
from swpipe.commands.pp_launch import launch


def _spearman(a: List[float], b: List[float]) -> float:
    def ranks(v: List[float]) -> List[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        for r, i in enumerate(order):
            out[i] = float(r)
        return out
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    if n < 2:
        return float("nan")
    d2 = sum((x - y) ** 2 for x, y in zip(ra, rb))
    return 1 - 6 * d2 / (n * (n * n - 1))


def _dry_run_steps(name: str, n_ranks: int, n_mb: int) -> Optional[int]:
    """PyTorch's dry run of the schedule: its unit steps (None when it cannot run it)."""
    program = pp_program(name, n_ranks, n_mb)
    lowered = program.lowered
    if lowered is None:  # single-stage: PyTorch's visualiser lowers the printed pipeline_order
        try:
            lowered = _torch.lower_compute_order({r: [a for a in program.printed[r] if a and "REDUCE" not in a]
                                                  for r in program.printed}, n_mb, program.stage_to_rank)
        except (AssertionError, ValueError, KeyError, RuntimeError):
            return None
    try:
        sim = _torch.torch_dry_run({r: list(v) for r, v in lowered.items()}, program.stage_to_rank)
    except (AssertionError, ValueError, KeyError, RuntimeError):
        return None
    return max(len(v) for v in sim.values())


def step_error(r: Dict[str, Any]) -> float:
    """A row's step error, ``predicted / measured - 1``."""
    return r["predicted_step_s"] / r["measured_step_s"] - 1


def fastest_pick(rows: List[Dict[str, Any]], tolerance: float = 0.05) -> Dict[str, Any]:
    """Whether the configuration predicted fastest runs within ``tolerance`` of the one measured fastest.

    The predicted fastest is ``swpipe pp``'s (:func:`~swpipe.commands.pp.predicted_preference`: a tie within 1 %
    goes to the lower predicted peak). ``pick_ratio`` is its measured step over the measured fastest's (1.0 when
    they are the same row); ``pick_within`` says whether it is at most ``1 + tolerance``.
    """
    predicted = fastest(rows, predicted_preference)
    measured = min(rows, key=lambda r: r["measured_step_s"])
    ratio = predicted["measured_step_s"] / measured["measured_step_s"]
    return {"predicted_fastest": _label(predicted), "measured_fastest": _label(measured), "pick_ratio": ratio,
            "pick_within": ratio <= 1 + tolerance}


def _label(r: Dict[str, Any]) -> str:
    return f"{r['schedule']}/{r['n_microbatches']}"


def _max_peak(r: Dict[str, Any], key: str = "measured_peak_bytes") -> int:
    return max(int(v) for v in r[key].values())


def best_fitting(rows: List[Dict[str, Any]], cap_bytes: Optional[int]) -> Optional[Dict[str, Any]]:
    """The row measured fastest among those whose every rank's measured peak is within ``cap_bytes`` (None: all);
    None when none fits."""
    fits = [r for r in rows if cap_bytes is None or _max_peak(r) <= cap_bytes]
    return min(fits, key=lambda r: r["measured_step_s"]) if fits else None


VERDICTS = {"faster": "faster beyond the noise", "slower": "SLOWER beyond the noise",
            "cannot_win": "cannot win measurably: the bound leaves less than the noise",
            "not_shown": "not shown faster (within the noise), though the bound leaves room",
            "no_noise": "no noise band (one timed step): nothing shown"}  # what search_verdict's keys print


def search_verdict(ratio: float, noise: float, headroom: float) -> str:
    """What the searched order's measured step over the best built-in's (``ratio``) shows, against the run's
    ``noise`` band and the ``headroom`` the lower bound leaves below the best built-in's prediction: a key of
    :data:`VERDICTS`."""
    if math.isnan(noise):
        return "no_noise"
    if ratio < 1 - noise:
        return "faster"
    if ratio > 1 + noise:
        return "slower"
    if headroom <= noise:
        return "cannot_win"
    return "not_shown"


def bound_headroom(report: Dict[str, Any], row: Dict[str, Any]) -> Dict[str, Any]:
    """The least step any custom order of ``row``'s stages on its ranks could take (``pp_lower_bounds`` on the run's
    costs with a custom order's path cost per action, ``PPCosts.custom_path``), how far below ``row``'s prediction
    that is, and the same bound without the path's cost (``bare_bound_s``)."""
    from autosched.pp import PPCosts
    from autosched.pp.bounds import pp_lower_bounds

    costs = PPCosts.from_dict(report["costs"][str(row["n_microbatches"])][str(row["n_stages"])])
    program = pp_program(row["schedule"], report["world_size"], row["n_microbatches"])
    bound = pp_lower_bounds(costs.custom_path(), row["n_microbatches"], program.stage_to_rank)
    bare = pp_lower_bounds(costs, row["n_microbatches"], program.stage_to_rank)
    return {"bound_s": bound.value, "binding": bound.binding, "bare_bound_s": bare.value,
            "headroom": 1 - bound.value / row["predicted_step_s"]}


def analyse(report: Dict[str, Any]) -> Dict[str, Any]:
    """Print the four parts from a ``launch`` report; return the figures."""
    rows = [r for r in report["results"] if "refused" not in r]
    builtin = [r for r in rows if r["schedule"] != "swpipe-searched"]
    figures: Dict[str, Any] = {}
    print(format_table(report))
    print()
    errs = [abs(step_error(r)) for r in builtin]
    noise = [r["noise"] for r in builtin]
    figures["step_median_abs_error"] = statistics.median(errs) if errs else float("nan")
    figures["step_median_noise"] = statistics.median(noise) if noise else float("nan")
    unchecked = [abs(r["predicted_unchecked_step_s"] / r["measured_step_s"] - 1) for r in builtin
                 if "predicted_unchecked_step_s" in r]
    figures["step_median_abs_error_unchecked"] = statistics.median(unchecked) if unchecked else float("nan")
    print(f"(1) step time: median |error| {figures['step_median_abs_error']:.1%} over {len(errs)} built-in runs "
          f"(target 10 %); the run's noise (median IQR/median) {figures['step_median_noise']:.1%}; "
          f"with every correction kept unchecked {figures['step_median_abs_error_unchecked']:.1%}")
    for n in sorted({r["n_microbatches"] for r in builtin}):
        e = [abs(step_error(r)) for r in builtin if r["n_microbatches"] == n]
        print(f"    {n} micro-batches: median |error| {statistics.median(e):.1%} over {len(e)}")
    if builtin:
        figures.update(fastest_pick(builtin))
        print(f"    predicted fastest {figures['predicted_fastest']}, measured fastest {figures['measured_fastest']}: "
              f"ratio {figures['pick_ratio']:.3f} ({'within' if figures['pick_within'] else 'NOT within'} 5 %)")
    merr = [abs(int(r["predicted_peak_bytes"][k]) - int(v)) / int(v) for r in rows
            for k, v in r["measured_peak_bytes"].items() if int(v) > 0]
    figures["memory_median_abs_error"] = statistics.median(merr) if merr else float("nan")
    figures["memory_max_abs_error"] = max(merr) if merr else float("nan")
    print(f"(2) peak memory per rank: median |error| {figures['memory_median_abs_error']:.1%}, "
          f"worst {figures['memory_max_abs_error']:.1%} over {len(merr)} (schedule, rank) pairs (target 10 %)")
    searched = [r for r in rows if r["schedule"] == "swpipe-searched"]
    if searched:
        s = searched[0]
        cap = (report.get("config") or {}).get("memory_cap_bytes")
        best = best_fitting([r for r in builtin if r["n_microbatches"] == s["n_microbatches"]], cap)
        within = "" if cap is None else f" within the cap of {cap / 2**20:.2f} MiB (measured peaks)"
        if best is None:
            figures.update(best_builtin=None, searched_over_best_builtin=float("nan"))
            print(f"(3) searched ({report['searched'].get('origin')}): no built-in at {s['n_microbatches']} "
                  f"micro-batches fits{within}; searched peak {_max_peak(s) / 2**20:.2f} MiB measured")
        else:
            ratio = s["measured_step_s"] / best["measured_step_s"]
            band = max(s["noise"], best["noise"])
            room = bound_headroom(report, best)
            verdict = search_verdict(ratio, band, room["headroom"])
            figures.update(searched_over_best_builtin=ratio, searched_noise=band, best_builtin=best["schedule"],
                           bound_s=room["bound_s"], bare_bound_s=room["bare_bound_s"],
                           bound_headroom=room["headroom"], search_verdict=verdict,
                           searched_builtin=(report.get("searched") or {}).get("builtin"),
                           searched_fits=cap is None or _max_peak(s) <= cap)
            print(f"(3) searched ({report['searched'].get('origin')}) vs the best built-in measured{within} "
                  f"({best['schedule']}, {s['n_microbatches']} micro-batches): {ratio:.3f}x the step time, "
                  f"noise band {band:.0%}: {VERDICTS[verdict]}; predicted "
                  f"{s['predicted_step_s'] * 1e3:.1f} vs {best['predicted_step_s'] * 1e3:.1f} ms; bound for any "
                  f"custom order on {best['schedule']}'s ranks {room['bound_s'] * 1e3:.1f} ms ({room['binding']}; "
                  f"{room['bare_bound_s'] * 1e3:.1f} ms without its path's cost per action), "
                  f"headroom {room['headroom']:.1%}; peak {_max_peak(s) / 2**20:.2f} vs "
                  f"{_max_peak(best) / 2**20:.2f} MiB measured; losses "
                  f"{'equal' if max(s['loss_rel_err'], best['loss_rel_err']) <= 1e-4 else 'DIFFER'}")
    _dry_run_table(report, builtin, figures)
    return figures


def _dry_run_table(report: Dict[str, Any], builtin: List[Dict[str, Any]], figures: Dict[str, Any]) -> None:
    world = report["world_size"]
    n = min(r["n_microbatches"] for r in builtin)
    at_n = [r for r in builtin if r["n_microbatches"] == n]
    dry = {r["schedule"]: _dry_run_steps(r["schedule"], world, n) for r in at_n}
    ok = [r for r in at_n if dry[r["schedule"]] is not None]
    measured = [r["measured_step_s"] for r in ok]
    rho_dry = _spearman([float(dry[r["schedule"]]) for r in ok], measured)
    rho_sw = _spearman([r["predicted_step_s"] for r in ok], measured)
    measured_fastest = min(at_n, key=lambda r: r["measured_step_s"])["schedule"]
    dry_pick = min(ok, key=lambda r: dry[r["schedule"]])["schedule"] if ok else "-"
    sw_pick = fastest(at_n, predicted_preference)["schedule"]
    printed_bad = []
    for name in builtin_programs(world, n)[0]:
        p = pp_program(name, world, n)
        mbs = {int(a.split("F")[-1]) for r in p.printed.values() for a in r
               if a and "F" in a and a.split("F")[-1].isdigit() and "SEND" not in a and "RECV" not in a}
        if mbs and max(mbs) >= n:
            printed_bad.append(name)
    cant = [name for name, v in dry.items() if v is None]
    figures.update(dry_run_spearman=rho_dry, swpipe_spearman=rho_sw)
    print(f"(4) PyTorch's dry run vs swpipe ({world} ranks, {n} micro-batches; measured fastest: {measured_fastest})")
    table = [
        ("what", "PyTorch's dry run / printed order", "swpipe"),
        ("step time", "unit steps (every action 1, transfers 0)", "seconds from measured costs and the link"),
        ("rank correlation with measured", f"{rho_dry:+.2f}", f"{rho_sw:+.2f}"),
        ("picks the fastest schedule", f"{dry_pick}", f"{sw_pick}"),
        ("peak memory per rank", "not modelled", "bytes (activations, held sends, transients)"),
        ("bubble per rank", "idle unit steps", "seconds and share of the step"),
        ("single-stage schedules' order", "pipeline_order" + (f" (names a micro-batch >= {n} in: "
                                                              f"{', '.join(printed_bad)})" if printed_bad else ""),
         "the order their step loop runs (traced)"),
        ("schedules it cannot dry-run", ", ".join(cant) or "none", "none"),
    ]
    width = [max(len(r[i]) for r in table) for i in range(3)]
    for row in table:
        print("    " + "  ".join(c.ljust(w) for c, w in zip(row, width)))


def run_job(model: Optional[str] = None, model_options: Optional[Dict[str, Any]] = None, ranks: int = 2,
            microbatches: Sequence[int] = (4, 8), steps: int = 10, warmup: int = 2, time_limit: float = 5.0,
            search: bool = True, memory_cap_bytes: Optional[int] = None, schedules: Sequence[str] = (),
            timeout_s: float = 1800) -> Dict[str, Any]:
    """One ``torchrun`` job (what ``swpipe pp [--model SPEC]`` runs): the report.

    ``model`` is a ``pkg.module:factory`` importable here (its folder goes on the ranks' ``PYTHONPATH``); None:
    the built-in MLP with ``model_options``. ``schedules``: PyTorch's names as it spells them (empty: all).
    """
    from swpipe.commands.pp_model import BUILTIN_MODEL, import_root, load_model

    spec = model or BUILTIN_MODEL
    load_model(spec, model_options)  # imported here first: where the ranks will find it
    cfg = PPRunConfig(model=spec, model_options=dict(model_options or {}), model_root=import_root(spec),
                      microbatches=tuple(microbatches), steps=steps, warmup=warmup, time_limit_s=time_limit,
                      search=search, memory_cap_bytes=memory_cap_bytes, schedules=tuple(schedules))
    return launch(cfg, ranks, timeout_s=timeout_s)


def print_link(report: Dict[str, Any]) -> None:
    """The link, the runtime's cost per action as measured, and per micro-batch count and stage count what the
    prediction used: the post cost and the cost per action kept by the check, a custom order's path's cost."""
    print(f"link: {report['p2p']['latency_s'] * 1e6:.0f} us + {report['p2p']['seconds_per_byte'] * 1e9:.3f} ns/B; "
          f"runtime per action as measured: "
          f"{', '.join(f'{k} mb {v * 1e3:.2f} ms' for k, v in report.get('action_overhead_s', {}).items())}"
          + (f"; predicted on {report['prediction_cores']} shared cores" if report.get("prediction_cores") else ""))
    for n, by in report.get("costs", {}).items():
        print(f"  {n} mb, as predicted: " + "; ".join(
            f"{k} stages: post {c['p2p'].get('post_s', 0.0) * 1e3:.2f} ms, per action "
            f"{c.get('action_overhead_s', 0.0) * 1e3:.2f} ms, a custom order's path +"
            f"{c.get('custom_overhead_s', 0.0) * 1e3:.2f} ms" for k, c in by.items()))
    for field in ("search_corrections", "corrections"):
        decided = corrections_line(report, field)
        if decided:
            print(decided)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--microbatches", default="4,8")
    parser.add_argument("--model", default=None, help="pkg.module:factory (default: the built-in MLP)")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--time-limit", type=float, default=5.0)
    parser.add_argument("--memory-cap-mib", type=float, default=None, help="the search's cap per rank")
    parser.add_argument("--report", default=None, help="analyse a saved report instead of running")
    parser.add_argument("--json", default=None, help="write the report and the figures here")
    args = parser.parse_args(argv)
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} "
          f"({os.cpu_count()} cores)", flush=True)
    if args.report:
        with open(args.report) as f:
            report = json.load(f)
    else:
        options = None if args.model else {"width": args.width, "depth": args.depth, "batch": args.batch}
        report = run_job(args.model, options, args.ranks, [int(v) for v in args.microbatches.split(",")],
                         args.steps, args.warmup, args.time_limit,
                         memory_cap_bytes=None if args.memory_cap_mib is None else int(args.memory_cap_mib * 2**20))
    print_link(report)
    figures = analyse(report)
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"report": report, "figures": figures}, f, indent=1, default=str)
    return figures


if __name__ == "__main__":
    main()
    sys.exit(0)
