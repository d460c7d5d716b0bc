"""One action order, every way PyTorch can run it: Schedule1F1B's own loop against the paths a custom order takes.

    python benchmarks/pp_runtime_paths.py                       # the unequal MLP, 1F1B's order, 4 and 8 micro-batches
    python benchmarks/pp_runtime_paths.py --rounds 30 --microbatches 8
    python benchmarks/pp_runtime_paths.py --model pp_model:mlp  # any PPModel factory importable from benchmarks/

Two gloo ranks (``torch.multiprocessing`` spawned, a ``FileStore``, one torch thread each) train the same
stages (``--model``, default ``unseen_models:unequal_mlp``) with the same compute order, 1F1B's, run by:

(a) ``Schedule1F1B``: PyTorch's class, its own step loop (sends and receives fused, each send waited at the next);
(b) ``csv``: ``_PipelineScheduleRuntime`` given the compute-only order (what a CSV holds), PyTorch lowering
    the communication (``_add_send_recv``: every receive posted as early as possible, every send kept to the
    step's end);
(c) ``lockstep``: ``PipelineScheduleMulti`` with ``pipeline_order`` the order padded into lock-step steps
    (``autosched.pp._torch.lockstep_order``), run by its own step loop, which posts and waits each step's sends
    and receives;
(d) ``csv-defer``: (b) with ``defer_pp_recv=True`` (every receive posted just before the action that reads it);
(e) ``swpipe``: what ``swpipe.pp.schedule_for`` builds for the program (a custom order's fastest path).

Rounds are interleaved (each path one step per round, in a fresh seeded order each round), every step timed
after a barrier on every rank, the step being the slowest rank's. Printed: each path's median step, its noise
(IQR / median), its ratio to ``Schedule1F1B``, the per-action cost that ratio implies, the fastest step and its
ratio (the least disturbed by a shared machine's load), whether the last stage's losses equal ``Schedule1F1B``'s,
and ``uptime``'s load before and after.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)

PATHS = ("Schedule1F1B", "csv", "lockstep", "csv-defer", "swpipe")


def _builders() -> Dict[str, Callable[..., Any]]:
    from autosched.pp import _torch

    def builtin(program: Any, stages: List[Any], loss_fn: Any) -> Any:
        return _torch.schedule_class("1F1B")(stages[0], program.n_microbatches, loss_fn=loss_fn)

    def csv(program: Any, stages: List[Any], loss_fn: Any) -> Any:
        return _torch.runtime_from_order(stages, program.n_microbatches, loss_fn, program.compute)

    def defer(program: Any, stages: List[Any], loss_fn: Any) -> Any:
        return _torch.runtime_from_order(stages, program.n_microbatches, loss_fn, program.compute, defer_recv=True)

    def lockstep(program: Any, stages: List[Any], loss_fn: Any) -> Any:
        order = _torch.lockstep_order(program.compute, program.stage_to_rank)
        return _torch.lockstep_schedule(stages, program.n_microbatches, loss_fn, order, program.stage_to_rank)

    def swpipe(program: Any, stages: List[Any], loss_fn: Any) -> Any:
        from swpipe.pp import schedule_for

        return schedule_for(program, stages, loss_fn)

    return {"Schedule1F1B": builtin, "csv": csv, "lockstep": lockstep, "csv-defer": defer, "swpipe": swpipe}


class _Path:
    """One path on this rank: fresh stages (the same initial weights), its schedule and optimizer, its record."""

    def __init__(self, name: str, build: Callable[..., Any], spec: str, program: Any, rank: int) -> None:
        import torch
        from torch.distributed.pipelining import PipelineStage

        from swpipe.commands.pp_model import load_model

        self.name = name
        self.model = load_model(spec)
        modules = self.model.cut(program.n_stages)
        mine = program.rank_stages(rank)
        stages = [PipelineStage(modules[s], s, program.n_stages, torch.device("cpu")) for s in mine]
        self.schedule = build(program, stages, self.model.loss_fn)
        self.opt = torch.optim.SGD([p for s in mine for p in modules[s].parameters()], lr=self.model.lr)
        self.first, self.last = 0 in mine, program.n_stages - 1 in mine
        self.times: List[float] = []
        self.losses: List[List[float]] = []

    def step(self, timed: bool) -> None:
        import torch.distributed as dist

        args = (self.model.batch,) if self.first else ()
        kwargs: Dict[str, Any] = {"target": self.model.target} if self.last else {}
        losses: List[Any] = []
        self.opt.zero_grad(set_to_none=False)
        dist.barrier()
        t0 = time.perf_counter()
        self.schedule.step(*args, losses=losses if self.last else None, return_outputs=False, **kwargs)
        elapsed = time.perf_counter() - t0
        self.opt.step()
        if timed:
            self.times.append(elapsed)
        if self.last:
            self.losses.append([float(v) for v in losses])


def _rank(rank: int, world: int, store_path: str, cfg: Dict[str, Any], out: Any) -> None:
    import torch
    import torch.distributed as dist

    from autosched.pp.program import pp_program

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=timedelta(minutes=3))
    try:
        builders = _builders()
        result: Dict[str, Any] = {}
        for n_mb in cfg["microbatches"]:
            program = pp_program("1F1B", world, n_mb)
            paths = [_Path(n, builders[n], cfg["model"], program, rank) for n in cfg["paths"]]
            for _ in range(cfg["warmup"]):
                for p in paths:
                    p.step(timed=False)
            shuffle = random.Random(n_mb)  # the same order on every rank
            for _ in range(cfg["rounds"]):
                order = list(paths)
                shuffle.shuffle(order)
                for p in order:
                    p.step(timed=True)
            gathered: List[Any] = [None] * world
            dist.all_gather_object(gathered, {p.name: (p.times, p.losses if p.last else None) for p in paths})
            if rank == 0:
                actions = sum(len(v) for v in program.compute.values()) // world
                result[n_mb] = {"actions_per_rank": actions, "paths": {}}
                for p in paths:
                    times = [max(g[p.name][0][i] for g in gathered) for i in range(cfg["rounds"])]
                    losses = next(g[p.name][1] for g in gathered if g[p.name][1] is not None)
                    result[n_mb]["paths"][p.name] = {"times": times, "losses": losses}
        if rank == 0:
            out.put(result)
    finally:
        dist.destroy_process_group()


def _noise(values: List[float]) -> float:
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / statistics.median(values)


def run(model: str, microbatches: List[int], rounds: int, warmup: int, paths: List[str]) -> Dict[int, Any]:
    """Spawn the two ranks; rank 0's figures per micro-batch count."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    cfg = {"model": model, "microbatches": microbatches, "rounds": rounds, "warmup": warmup, "paths": paths}
    # the ranks import this script by name (benchmarks/ is on sys.path): hand them that module's function
    rank_main = _rank if __name__ == "__main__" else importlib.import_module(__name__)._rank
    with tempfile.TemporaryDirectory(prefix="swpipe-paths-") as folder:
        mp.start_processes(rank_main, args=(2, os.path.join(folder, "store"), cfg, queue), nprocs=2, join=True,
                           start_method="spawn")
    return queue.get()


def report(result: Dict[int, Any]) -> Dict[str, Any]:
    """Print the table; return ``{n_mb: {path: ratio}}`` and whether every path's losses equal 1F1B's."""
    figures: Dict[str, Any] = {"ratio": {}, "losses_equal": True, "per_action_s": {}}
    for n_mb, r in sorted(result.items()):
        base = r["paths"]["Schedule1F1B"]
        t0 = statistics.median(base["times"])
        print(f"\n{n_mb} micro-batches, {r['actions_per_rank']} compute actions per rank")
        print(f"    {'path':<14}{'median ms':>10}{'noise':>8}{'x 1F1B':>9}{'per action us':>15}{'min ms':>9}"
              f"{'x 1F1B':>9}  losses")
        figures["ratio"][n_mb], figures["per_action_s"][n_mb] = {}, {}
        for name, p in r["paths"].items():
            t = statistics.median(p["times"])
            same = all(abs(a - b) <= 1e-5 * max(abs(b), 1e-12) for xs, ys in zip(p["losses"], base["losses"])
                       for a, b in zip(xs, ys)) and len(p["losses"]) == len(base["losses"])
            figures["losses_equal"] &= same
            per = (t - t0) / r["actions_per_rank"]
            figures["ratio"][n_mb][name], figures["per_action_s"][n_mb][name] = t / t0, per
            low = min(p["times"])
            print(f"    {name:<14}{t * 1e3:>10.2f}{_noise(p['times']):>8.0%}{t / t0:>9.3f}{per * 1e6:>15.0f}"
                  f"{low * 1e3:>9.2f}{low / min(base['times']):>9.3f}  {'equal' if same else 'DIFFER'}")
    return figures


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="unseen_models:unequal_mlp")
    parser.add_argument("--microbatches", default="4,8")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--paths", default=",".join(PATHS))
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(f"load before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores); model {args.model}; "
          f"order 1F1B on 2 gloo ranks; {args.rounds} interleaved rounds", flush=True)
    result = run(args.model, [int(v) for v in args.microbatches.split(",")], args.rounds, args.warmup,
                 args.paths.split(","))
    figures = report(result)
    load = os.getloadavg()
    print(f"\nload after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return figures


if __name__ == "__main__":
    main()
