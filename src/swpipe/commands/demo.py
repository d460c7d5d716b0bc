"""``swpipe demo``: train the DLRM workload serially and with every TorchRec plan; print one table.

The workload (:mod:`swpipe.workloads.dlrm`) runs over a real process group
(gloo on CPU, NCCL on CUDA); ``--world-size N`` spawns N ranks on loopback,
and under ``torchrun --nproc-per-node N`` (or any launcher setting ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) every process joins that job.
Either way every rank checks its own losses and rank 0 prints one table with
every rank's checks folded in (a plan matches only if it matches on every rank).
Each plan trains a fresh copy of the model on the same batches; the table
shows its depth, streams, thread groups, iterations/s, speedup over the plain
serial loop, and whether its per-iteration losses equal the serial loop's bit
for bit. The fastest training plan's timeline is written as a Chrome trace
(open it in https://ui.perfetto.dev). When :mod:`autosched.search.entry` is
importable, the plan ``auto_schedule`` finds for this workload is a row too.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any, List

from swpipe.commands._args import add_keep_freed_memory, apply_keep_freed_memory, int_at_least
from swpipe.commands._text import format_legend, wrap

__all__ = ["add_arguments", "run"]

_log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options.

    Examples
    --------
    >>> parser = argparse.ArgumentParser()
    >>> add_arguments(parser)
    >>> args = parser.parse_args(["--plans", "sparse_dist+by_stream"])
    >>> args.world_size, args.iters, args.batch_size, args.repeats, args.plans
    (None, 40, 512, 3, 'sparse_dist+by_stream')
    """
    parser.add_argument("--world-size", type=int_at_least(1), default=None,
                        help="ranks spawned on loopback (default 1); under torchrun the launcher's world size")
    parser.add_argument("--iters", type=int_at_least(1), default=40, help="training iterations per run (default 40)")
    parser.add_argument("--batch-size", type=int_at_least(1), default=512, help="per-rank batch size (default 512)")
    parser.add_argument("--plans", default="all",
                        help="comma-separated pipeline names (see 'swpipe list'), 'all' (default), "
                             "'+by_stream' variants included with 'all'")
    parser.add_argument("--repeats", type=int_at_least(1), default=3, help="rounds over all plans; the fastest counts (default 3)")
    parser.add_argument("--race", type=int_at_least(0), default=3,
                        help="more rounds for the training rows within 10%% of the fastest, with the serial loop; "
                             "their fastest run counts (default 3; 0: off)")
    parser.add_argument("--threads", type=int_at_least(1), default=1,
                        help="torch intra-op threads per rank (default 1: pipeline threads use the other cores)")
    parser.add_argument("--compile", default="none", choices=["none", "inductor", "aot_eager", "eager"],
                        help="torch.compile backend for pt2 and compiled autograd; default none (eager): "
                             "inductor compiles for 20-60 s on a 2-core CPU, longer than the demo")
    parser.add_argument("--no-auto", action="store_true", help="skip the auto-scheduled plan")
    parser.add_argument("--trace", default="swpipe_demo.trace.json",
                        help="Chrome trace of the fastest plan (default swpipe_demo.trace.json; '' to skip)")
    parser.add_argument("--seed", type=int, default=0, help="data and model seed")
    add_keep_freed_memory(parser)


def _specs(args: argparse.Namespace) -> List[Any]:
    from swpipe_core import pipelines
    from swpipe.workloads.bench import TORCHREC_PLANS, default_specs

    compile_backend = None if args.compile == "none" else args.compile
    if args.plans.strip().lower() == "all":
        return default_specs(TORCHREC_PLANS, by_stream=True, compile_backend=compile_backend)
    wanted = [p.strip() for p in args.plans.split(",") if p.strip()]
    specs = []
    for name in wanted:
        base, _, suffix = name.partition("+")
        if base not in pipelines.PIPELINES:
            raise SystemExit(f"swpipe demo: unknown plan {base!r}; known: {', '.join(pipelines.PIPELINES)}")
        spec = default_specs([base], by_stream=False, compile_backend=compile_backend)[0]
        if suffix:
            if suffix not in ("by_stream", "per_task"):
                raise SystemExit(f"swpipe demo: unknown thread map {suffix!r} in {name!r}; use +by_stream or +per_task")
            spec.label, spec.thread_map, spec.note = name, suffix, f"thread map {suffix}"
        specs.append(spec)
    return specs


def _attach_predictions(rows: List[Any], auto: Any) -> None:
    """Give the hand-written rows the search predicted (its seeds) their predicted speedup, checked like auto's.

    Examples
    --------
    >>> from swpipe.workloads.bench import PlanSpec
    >>> rows = [PlanSpec("base", "base"), PlanSpec("prefetch", "prefetch")]
    >>> _attach_predictions(rows, PlanSpec("auto", "auto", predicts={"prefetch": 1.2, "elsewhere": 1.5}))
    >>> [r.predicted_speedup for r in rows]
    [None, 1.2]
    """
    for row in rows:
        if row.label in auto.predicts and row.predicted_speedup is None:
            row.predicted_speedup = auto.predicts[row.label]


def _rank_main(env: Any, args: argparse.Namespace) -> Any:
    import torch

    from swpipe.workloads.autoplan import auto_spec
    from swpipe.workloads.bench import measure
    from swpipe.workloads.dlrm_data import DLRMConfig, SyntheticData

    torch.set_num_threads(args.threads)
    allocator = apply_keep_freed_memory(args)  # in every rank's process: spawned ranks do not inherit it
    config = DLRMConfig.preset("demo", batch_size=args.batch_size, seed=args.seed)
    specs = _specs(args)
    if not args.no_auto:
        spec = auto_spec(config, env, SyntheticData(config, env.world_size, env.rank).batches(min(args.iters, 12)))
        if spec is not None:
            _attach_predictions(specs, spec)
            specs.append(spec)
    m = measure(config, env, specs, iters=args.iters, repeats=args.repeats, progress=True,
                record_best=bool(args.trace), race_rounds=args.race)
    m.meta["allocator"] = allocator
    m.meta["story"] = [line for spec in specs for line in spec.story]
    return m


# What the table's columns and marks mean (printed under it).
LEGEND = (
    ("speedup", "the plan's iterations/s over the serial loop's, run in the same rounds"),
    ("predicted", "the speedup the search's cost model predicts: for the auto plan and the known plans the search "
                  "scored beside it"),
    ("-", "not predicted: the search did not score this plan, or did not run (--no-auto); the serial loops are "
          "the reference"),
    ("= serial", "yes: the plan's losses (an eval plan's outputs) equal the serial loop's bit for bit; close: "
                 "equal to rtol 1e-5 (a compiled plan); NO: they differ; n/a: nothing to compare"),
    ("[k]", "a note too long for its line: its whole text is under the table"),
)


def _story(m: Any, world: int, how: str, args: argparse.Namespace) -> List[str]:
    """What the demo prints, in one story: the run, the table and its legend, the search, the noise, the verdict.

    Every line is at most 120 columns: a longer sentence goes on over the next lines, never cut.
    """
    import torch

    from swpipe.workloads.bench import format_table, noise_pct
    from swpipe_core.engine.device import cuda_available

    backend = "nccl" if cuda_available() else "gloo"
    said = [f"DLRM, {world} rank(s) ({backend}, {how}), batch {args.batch_size}/rank, {args.iters} iterations x "
            f"{args.repeats} runs, {args.threads} torch thread(s), {os.cpu_count()} CPUs, torch {torch.__version__}",
            m.meta["allocator"]]
    lines = [part for line in said for part in wrap(line)] + [format_table(m), format_legend(LEGEND)]
    said = list(m.meta.get("story", []))
    noise = noise_pct(m)
    if noise is not None:
        raced = (f"; {len(m.meta['raced'])} plan(s) within {m.meta['race_band_pct']:g} % of the fastest ran "
                 f"{m.meta['race_rounds']} more" if m.meta.get("raced") else "")
        probe = m.meta.get("parallel_probe")
        ceiling = f"; 2 threads of GIL-free work: {probe:.2f}x one" if probe is not None else ""
        said.append(f"noise: one plan's runs differ by {noise:.1f} % (median over plans){raced}{ceiling}")
    matches = [r for r in m.rows if r.matches is not None]
    close = sum(1 for r in matches if not r.matches and r.close)
    said.append(f"{sum(r.matches for r in matches)}/{len(matches)} plans reproduce the serial loop bit for bit"
                + (f", {close} (compiled) to rtol 1e-5" if close else "")
                + f"; fastest training plan: {m.best_label}")
    return lines + [part for line in said for part in wrap(line)]


def _spawned(env: Any, args: argparse.Namespace) -> Any:
    m = _rank_main(env, args)
    return m if env.rank == 0 else None  # identical on every rank (folded); ship one copy back


def run(args: argparse.Namespace) -> int:
    """Run the demo; print the table; write the trace. Returns the exit code.

    0 when every plan reproduces the serial loop, 1 when one does not, 2 for
    bad options.

    Examples
    --------
    >>> parser = argparse.ArgumentParser()
    >>> add_arguments(parser)
    >>> run(argparse.Namespace(**{**vars(parser.parse_args([])), "iters": 0}))
    2
    """
    from swpipe.workloads.distenv import init_distributed, launcher_env

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # torch's profiler prints USDT lines on stderr otherwise
    try:
        launched = launcher_env()
    except ValueError as exc:
        print(f"swpipe demo: {exc}", file=sys.stderr)
        return 2
    world = args.world_size if args.world_size is not None else (launched[1] if launched else 1)
    if world < 1 or args.iters < 1 or args.batch_size < 1 or args.repeats < 1 or args.threads < 1:
        print("swpipe demo: --world-size, --iters, --batch-size, --repeats and --threads must be >= 1",
              file=sys.stderr)
        return 2
    if launched and world != launched[1]:
        print(f"swpipe demo: --world-size {world} under a launcher with WORLD_SIZE={launched[1]}; drop "
              f"--world-size (the launcher decides: torchrun --nproc-per-node N)", file=sys.stderr)
        return 2
    _specs(args)  # fail fast on a bad --plans before starting processes
    t0 = time.perf_counter()
    rank, how = 0, "spawned on loopback" if world > 1 else "one process"  # how the ranks were started
    if launched or world == 1:
        env = init_distributed()
        rank, how = env.rank, ("launched by torchrun" if launched else how)
        try:
            m = _rank_main(env, args)
        finally:
            env.close()
    else:
        from swpipe.workloads.launch import spawn

        m = spawn(_spawned, world, args, num_threads=args.threads)[0]
    code = 0 if all(r.matches or r.close for r in m.rows if r.matches is not None) else 1
    if rank != 0:
        return code  # the same table and verdict as rank 0's: every rank's checks are folded in
    for line in _story(m, world, how, args):
        print(line)
    if args.trace and m.best_timeline:
        from swpipe_core.measure.trace import write_chrome_trace

        path = write_chrome_trace(m.best_timeline, args.trace, name=f"swpipe demo: {m.best_label}")
        print(f"timeline of {m.best_label} (https://ui.perfetto.dev): {path}")
    if world > 1:
        print("\n".join(wrap(f"every check above holds on all {world} ranks (each rank compared its own losses "
                             f"with its own serial loop; a row matches only if it matches everywhere)")))
    print(f"demo finished in {time.perf_counter() - t0:.1f} s")
    return code
