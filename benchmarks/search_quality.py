"""Search quality: auto-generated plans next to the hand-written ones and the lower bound, in one run.

Three parts, each printing a table:

1. **TorchRec pipelines, hand-written costs** (``cost_models/<name>.json``, GPU
   numbers, CUDA semantics): the hand plan's simulated period, the auto plan's
   (``auto_schedule`` with the hand plan as input, so it is one candidate), the
   improvement, the lower bound and the gap. Compute tasks (ZeroGrad, Forward,
   Backward, EmbBackward, OptimizerStep) stay on the default stream, as in TorchRec's own pipelines.
2. **DLRM, measured costs** (``--dlrm``): for each TorchRec training plan on the
   DLRM workload of :mod:`swpipe.workloads` (one rank, CPU), the cost model
   measured from a serial run of that plan's tasks (median per task), the hand
   plan's simulated period next to the auto plan's. ``--measure`` also runs room
   F's side-by-side measurement (``swpipe.workloads.bench.measure``): measured
   iterations/s of the auto plan next to the TorchRec plans, in one run.
3. **Search time on random graphs** of 10, 20, 50, 100, 200 tasks
   (:func:`swpipe.testing.plan_space.random_graph`): beam search (10 s budget) and
   CP-SAT (30 s budget, up to 20 tasks): period, lower bound, gap, status, time.
   Targets (issue 8): beam <= 10 s at 200 tasks; CP-SAT proves optimality up to
   20 tasks within 30 s.

Usage::

    python benchmarks/search_quality.py                  # parts 1 and 3
    python benchmarks/search_quality.py --dlrm --measure # all three
    python benchmarks/search_quality.py --sizes 10,20 --pipelines sparse_dist
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from typing import List, Optional, Sequence

import torch

from swpipe.testing.plan_space import random_graph
from autosched.search.problem import make_problem
from autosched.search.beam import beam_search
from autosched.search.scoring import sim_scorer
from autosched.model.costs import CostModel
from autosched.search.cpsat import model_lower_bound, solve_cpsat
from autosched.search.options import Constraints, SolverOptions
from swpipe import auto_schedule
from autosched.model.simulate import simulate

COMPUTE = ("ZeroGrad", "Forward", "Backward", "EmbBackward", "OptimizerStep")
HERE = os.path.dirname(os.path.abspath(__file__))


def _table(header: Sequence[str], rows: List[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def torchrec_part(names: Sequence[str], time_limit: float, max_threads: int) -> str:
    """Part 1: hand plan vs auto plan per TorchRec pipeline with its hand-written cost model."""
    from swpipe_core import pipelines

    rows = []
    for name in names:
        path = os.path.join(HERE, "..", "cost_models", f"{name}.json")
        if not os.path.exists(path):
            rows.append([name, "no cost model", "", "", "", "", "", "", ""])
            continue
        costs = CostModel.load(path)
        hand = pipelines.get(name)
        hand_period = simulate(hand, costs, 60, device="cuda").period_s
        frozen = {n: {"stream": None} for n in hand.task_names if n in COMPUTE and hand.sched(n).stream is None}
        c = Constraints(device="cuda", max_depth=max(3, hand.pipeline_depth), max_threads=max_threads, frozen=frozen)
        t0 = time.perf_counter()
        plan, rep = auto_schedule(hand, costs, c, solver=SolverOptions(time_limit_s=time_limit))
        took = time.perf_counter() - t0
        rows.append([name, f"{hand_period * 1e3:.3f}", f"{rep.period_s * 1e3:.3f}",
                     f"{100 * (1 - rep.period_s / hand_period):.1f}%", f"{rep.lower_bound_s * 1e3:.3f}",
                     f"{rep.gap_pct:.1f}%", f"{plan.pipeline_depth}/{rep.threads}", rep.status, f"{took:.1f}s"])
    return _table(["pipeline", "hand ms", "auto ms", "better", "bound ms", "gap", "depth/thr", "status", "search"],
                  rows)


def dlrm_part(time_limit: float, max_threads: int, measure_runs: bool, iters: int) -> str:
    """Part 2: TorchRec plans on the DLRM workload with measured costs; optionally measured iter/s."""
    from swpipe.workloads.autoplan import auto_spec
    from swpipe.workloads.bench import TORCHREC_PLANS, default_specs, format_table, measure
    from swpipe.workloads.dlrm import DLRMConfig, DLRMWorkload, SyntheticData, init_distributed
    from swpipe.workloads.tasks import EVAL_PIPELINES, plan_for
    from swpipe_core.engine.pipeline import SWPipeline

    torch.set_num_threads(1)
    env = init_distributed()
    config = DLRMConfig.preset("demo")
    batches = SyntheticData(config).batches(12)
    rows = []
    train = [p for p in TORCHREC_PLANS if p not in EVAL_PIPELINES]
    for name in train:
        try:
            wl = DLRMWorkload(config, env)
            hand = plan_for(name, wl)
            with SWPipeline(hand, device=env.device, record_timeline=True) as pipe:
                pipe.run_serial(iter(batches))
                events = [e for e in pipe.timeline if e.iteration >= 2]
            costs = CostModel.from_timeline(events, machine=f"{platform.machine()}, 1 intra-op thread")
            unbound = hand.replace(schedule={t.name: s for t, s in hand.schedule.items()},
                                   pipeline_depth=hand.pipeline_depth)
            hand_period = simulate(unbound, costs, 60).period_s
            c = Constraints(max_depth=max(3, hand.pipeline_depth), max_threads=max_threads)
            plan, rep = auto_schedule(unbound, costs, c, solver=SolverOptions(time_limit_s=time_limit))
        except Exception as exc:  # one plan failing must not hide the others
            rows.append([name, f"error: {type(exc).__name__}: {exc}"[:60], "", "", "", "", ""])
            continue
        rows.append([name, f"{hand_period * 1e3:.3f}", f"{rep.period_s * 1e3:.3f}",
                     f"{100 * (1 - rep.period_s / hand_period):.1f}%", f"{rep.lower_bound_s * 1e3:.3f}",
                     f"{rep.gap_pct:.1f}%", rep.status])
    out = _table(["plan (measured costs)", "hand ms", "auto ms", "better", "bound ms", "gap", "status"], rows)
    if measure_runs:
        specs = default_specs([p for p in train if p in ("sparse_dist", "fused_sparse_dist", "prefetch")])
        spec = auto_spec(config, env, batches, time_limit_s=time_limit)
        if spec is not None:
            specs.append(spec)
        m = measure(config, env, specs, iters=iters, repeats=2, progress=False, record_best=False)
        out += "\n\nmeasured on this machine (iterations/s, one run, best of 2):\n" + format_table(m)
    env.close()
    return out


def random_part(sizes: Sequence[int], beam_limit: float, cpsat_limit: float, cpsat_max: int) -> str:
    """Part 3: search time and quality on random graphs."""
    rows = []
    for n in sizes:
        graph, costs = random_graph(n, n)
        problem = make_problem(graph, costs, Constraints(max_depth=3, max_threads=2))
        lb = model_lower_bound(problem) * problem.unit_s
        t0 = time.perf_counter()
        res = beam_search(problem, time_limit_s=beam_limit, seed=0)
        beam_s = time.perf_counter() - t0
        beam_p = sim_scorer(problem, 60)(res.plan)[0]
        cp_cells = ["-", "-", "-"]
        if n <= cpsat_max:
            t0 = time.perf_counter()
            cp = solve_cpsat(problem, time_limit_s=cpsat_limit, hint=res.candidate, upper=res.candidate.ii or None)
            cp_s = time.perf_counter() - t0
            if cp.plan is not None:
                cp_p = sim_scorer(problem, 60)(cp.plan)[0]
                lb = max(lb, cp.bound)
                cp_cells = [f"{cp_p * 1e3:.3f}", cp.status, f"{cp_s:.1f}s"]
            else:
                cp_cells = ["-", cp.status, f"{cp_s:.1f}s"]
        rows.append([str(n), f"{lb * 1e3:.3f}", f"{beam_p * 1e3:.3f}", f"{100 * (beam_p / lb - 1):.1f}%",
                     f"{beam_s:.1f}s", str(res.tried["beam rounds"]), *cp_cells])
    return _table(["tasks", "bound ms", "beam ms", "beam gap", "beam time", "rounds", "cpsat ms", "cpsat", "cpsat time"],
                  rows)


def main(argv: Optional[Sequence[str]] = None) -> None:
    from swpipe_core import pipelines

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default=",".join(pipelines.PIPELINES))
    parser.add_argument("--sizes", default="10,20,50,100,200")
    parser.add_argument("--time-limit", type=float, default=20.0, help="auto_schedule budget per pipeline")
    parser.add_argument("--max-threads", type=int, default=2)
    parser.add_argument("--beam-limit", type=float, default=10.0)
    parser.add_argument("--cpsat-limit", type=float, default=30.0)
    parser.add_argument("--dlrm", action="store_true", help="part 2: DLRM workload with measured costs")
    parser.add_argument("--measure", action="store_true", help="part 2 also measures iterations/s (slow)")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--skip-torchrec", action="store_true")
    parser.add_argument("--skip-random", action="store_true")
    args = parser.parse_args(argv)

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU(s); torch {torch.__version__}; "
          f"{datetime.date.today()}")
    if not args.skip_torchrec:
        print("\n1. TorchRec pipelines, hand-written GPU costs (CUDA semantics), "
              f"auto_schedule {args.time_limit:.0f}s, max_threads={args.max_threads}")
        print(torchrec_part([p.strip() for p in args.pipelines.split(",") if p.strip()], args.time_limit,
                            args.max_threads))
    if args.dlrm:
        print("\n2. DLRM workload (1 rank, CPU), costs measured from a serial run of each plan")
        print(dlrm_part(args.time_limit, args.max_threads, args.measure, args.iters))
    if not args.skip_random:
        print(f"\n3. random graphs (max_depth 3, max_threads 2): beam {args.beam_limit:.0f}s budget, "
              f"CP-SAT {args.cpsat_limit:.0f}s budget up to 20 tasks")
        print(random_part([int(s) for s in args.sizes.split(",")], args.beam_limit, args.cpsat_limit, 20))


if __name__ == "__main__":
    main()
