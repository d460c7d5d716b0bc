"""Re-planning on two ranks: PyTorch's pipelining schedule next to AdaptiveSchedule when one rank gets slowed.

Two gloo ranks (spawned by the script on the loopback, one torch thread each) train a two-stage model under
``torch.distributed.pipelining``, one stage per rank, ``--batch`` samples a step. Each stage is a small Linear
(+ Tanh) and a **workload that sleeps** (so the figures hold on a shared, loaded machine: the work takes no core and
lasts the same whatever else runs): ``--rank0-ms`` (rank 0) or ``--rank1-ms`` (rank 1) per sample in the forward,
twice that in the backward. At first rank 0's stage is the light one (a fifth of rank 1's).

From step ``--change`` on, **rank 0 is slowed by a co-running job**, modelled as a deterministic slowdown: its
stage's forward sleeps ``--slow-ms`` more per sample (the backward twice that), which makes rank 0 twice as heavy as
rank 1. Why the schedule should change then: with two micro-batches, GPipe's last stage runs both forwards before
its first backward, so the first stage waits for the last stage's second forward and first backward before it can
start its backwards; 1F1B's last stage sends the first backward right after the first forward. While the first
stage is the light one, that wait is hidden (both schedules are predicted, and measured, about as fast: GPipe is a
fair static choice); once the first stage is the heavy one it is on the critical path, and 1F1B is about 13 %
faster. The counts offered are ``--microbatches`` (PyTorch's GPipe and 1F1B for each: the schedules of this stage
layout); more micro-batches shorten the fill but add the runtime's cost per action, which the calibration measures.

The costs ``AdaptiveSchedule`` starts from are measured ahead on the unslowed stages, as a user would
(``calibrate_pp``: the stages, the link, the runtime's cost per action); on drift it refreshes them from the
stages' timed actions on both ranks. In one run, side by side:

1. **every candidate tried** for ``--trial-steps`` steps, at first and with rank 0 slowed (the median step of each,
   after two warm-up steps), beside its prediction on the calibrated costs; the best slowed one is "the best for the
   new costs";
2. **gap recovered**: the same drifting run (rank 0 slowed from step ``--change``) under the static schedule
   (``--schedule`` over the first count), under the best one found in (1), and under ``AdaptiveSchedule`` starting
   from the static one; each one's mean step over steps ``change + K`` to the end; the fraction of the static
   schedule's gap to the best that the adaptive run closed (goal >= 80 %); the losses of each run against the
   static run's, step by step (equal within float rounding: the loss averages over samples, so the micro-batch
   count changes only the rounding), asserted;
3. **overhead** when nothing drifts: PyTorch's plain schedule, ``AdaptiveSchedule(replan=None)`` (its actions timed,
   nothing watched nor exchanged) and ``AdaptiveSchedule`` watching, in ``--rounds`` rounds of
   ``--overhead-steps`` steps (each kind first in turn); the median over the rounds of each one's median step over
   the plain one's (goal <= 1 %); the rounds' ratios show the noise the machine adds;
4. **false switches** over a long idle run (goal 0), and the decisions taken.

    python benchmarks/replan_ranks.py            # about five minutes
    python benchmarks/replan_ranks.py --quick    # the smoke run of the tests

Record ``uptime``'s load average: the machine may be shared (the script prints it before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence

import torch

MS = 1e-3
HIDDEN = 16


# ------------------------------------------------------------------ the workload


class SleepWork(torch.autograd.Function):
    """The workload: identity on the tensor; sleeps ``forward_s`` in the forward and ``backward_s`` in the backward."""

    @staticmethod
    def forward(ctx: Any, x: Any, forward_s: float, backward_s: float) -> Any:
        time.sleep(forward_s)
        ctx.backward_s = backward_s
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        time.sleep(ctx.backward_s)
        return grad, None, None


def stage_module(rank: int, cfg: Dict[str, Any]) -> Any:
    """Rank ``rank``'s stage: Linear, the sleeping work, Tanh (rank 0) -- the same weights for every run."""

    class Stage(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(rank)
            self.linear = torch.nn.Linear(HIDDEN, HIDDEN if rank == 0 else 4)
            self.per_sample_s = cfg["rank0_ms" if rank == 0 else "rank1_ms"] * MS
            self.extra_per_sample_s = 0.0  # the co-running job's share, set by the loop

        def forward(self, x: Any) -> Any:
            seconds = (self.per_sample_s + self.extra_per_sample_s) * x.shape[0]
            y = SleepWork.apply(self.linear(x), seconds, 2 * seconds)
            return torch.tanh(y) if rank == 0 else y

    return Stage()


def programs(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """The static program (``--schedule`` over the first count) and the candidates: PyTorch's schedules on one
    stage per rank, for each count."""
    from autosched.pp.program import pp_program
    from swpipe.replan.schedule import same_layout_programs, schedule_label

    static = pp_program(cfg["schedule"], 2, cfg["microbatches"][0])
    candidates = same_layout_programs(static, cfg["microbatches"])
    return {"candidates": candidates, "static": static, "labels": [schedule_label(p) for p in candidates],
            "static_label": schedule_label(static)}


def batch(cfg: Dict[str, Any], step: int) -> Any:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(cfg["batch"], HIDDEN, generator=g), torch.randn(cfg["batch"], 4, generator=g)


# ------------------------------------------------------------------ one rank


class Rank:
    """One rank's runs: each on fresh stages of the same weights, its iteration ends timed on this rank."""

    def __init__(self, rank: int, cfg: Dict[str, Any], decisions_group: Any, costs: Any) -> None:
        self.rank, self.cfg, self.group, self.costs = rank, cfg, decisions_group, costs

    def run(self, program: Any, steps: int, change: Optional[int], adaptive: Optional[Any] = None) -> Dict[str, Any]:
        """``steps`` steps of ``program`` (the slowed rank slowed from ``change``); ``adaptive``: AdaptiveSchedule's
        options (from ``program``, on the calibrated costs)."""
        from torch.distributed.pipelining import PipelineStage

        from swpipe.replan.schedule import AdaptiveSchedule, schedule_label

        cfg, rank = self.cfg, self.rank
        module = stage_module(rank, cfg)
        stage = PipelineStage(module, rank, 2, torch.device("cpu"))
        opt = torch.optim.SGD(module.parameters(), lr=cfg["lr"])
        loss_fn = torch.nn.functional.mse_loss
        if adaptive is None:
            sched, runner = None, program.torch_schedule([stage], loss_fn)
        else:  # "unwatched": AdaptiveSchedule(replan=None), its actions timed but no watch and no exchange
            sched = AdaptiveSchedule([stage], loss_fn, program, self.costs, microbatches=cfg["microbatches"],
                                     replan=None if adaptive == "unwatched" else adaptive, group=self.group)
            runner = sched
        ends, losses, used = [], [], []
        t0 = time.perf_counter()
        try:
            for i in range(steps):
                if rank == cfg["slow_rank"]:
                    module.extra_per_sample_s = cfg["slow_ms"] * MS if change is not None and i >= change else 0.0
                x, y = batch(cfg, i)
                opt.zero_grad(set_to_none=False)
                used.append(schedule_label(sched.program if sched is not None else program))
                mb: List[Any] = []
                runner.step(*((x,) if rank == 0 else ()), target=y if rank == 1 else None,
                            losses=mb if rank == 1 else None, return_outputs=False)
                opt.step()
                ends.append(time.perf_counter() - t0)
                if rank == 1:
                    losses.append(float(sum(float(v.detach()) for v in mb) / len(mb)))
        finally:
            if sched is not None:
                sched.close()
        decisions = [] if sched is None else [
            {"step": d.step, "swapped": d.swapped, "starts_at": d.starts_at, "running": d.running,
             "chosen": d.chosen, "reference_s": d.reference_s, "measured_s": d.measured_s, "noise": d.noise,
             "predicted": d.predicted, "predicted_old_s": d.predicted_old_s, "predicted_new_s": d.predicted_new_s,
             "measured_after_s": d.measured_after_s} for d in sched.decisions]
        return {"ends": ends, "losses": losses, "used": used, "decisions": decisions}


def rank_main(rank: int, store: str, out_path: str, cfg: Dict[str, Any]) -> None:
    """One rank of the benchmark: every part in order, its results written to ``out_path`` as JSON."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.distributed as dist

    from autosched.pp.rolling import calibrate_pp
    from swpipe.replan import ReplanOptions
    from swpipe.replan.schedule import choose_schedule

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=cfg["timeout_s"]))
    alone = [dist.new_group([r], backend="gloo") for r in range(2)]
    decisions = dist.new_group(backend="gloo")
    progs = programs(cfg)
    # the costs, calibrated ahead on the first (unslowed) stages, as a user would: rank 0's decide
    x, y = batch(cfg, -1)
    mb = cfg["batch"] // progs["static"].n_microbatches
    costs = [calibrate_pp([stage_module(0, cfg), stage_module(1, cfg)], x[:mb], y[:mb], torch.nn.functional.mse_loss,
                          alone_group=alone[rank], n_microbatches=progs["static"].n_microbatches)]
    dist.broadcast_object_list(costs, src=0)
    me = Rank(rank, cfg, decisions, costs[0])
    opts = ReplanOptions(**cfg["replan"])
    out: Dict[str, Any] = {"rank": rank, "action_overhead_s": costs[0].action_overhead_s,
                           "predicted_first": choose_schedule(progs["static"], progs["candidates"], costs[0],
                                                              noise=0.0).predicted}
    # (1) every candidate, the slowed rank as at first and slowed throughout
    out["trials"] = {"first": {}, "slowed": {}}
    for label, program in zip(progs["labels"], progs["candidates"]):
        for kind, change in (("first", None), ("slowed", 0)):
            ends = me.run(program, cfg["trial_steps"], change=change)["ends"]
            out["trials"][kind][label] = statistics.median(b - a for a, b in zip(ends[2:], ends[3:]))
    told = [min(out["trials"]["slowed"], key=out["trials"]["slowed"].get)]
    dist.broadcast_object_list(told, src=0)  # rank 0's clock decides which is the best
    best = progs["candidates"][progs["labels"].index(told[0])]
    # (2) the drifting run under the static, the best and the adaptive schedule
    out["drift"] = {"static": me.run(progs["static"], cfg["iters"], cfg["change"]),
                    "best": me.run(best, cfg["iters"], cfg["change"]),
                    "adaptive": me.run(progs["static"], cfg["iters"], cfg["change"], adaptive=opts)}
    out["best"] = told[0]
    # (3) no drift: plain, AdaptiveSchedule unwatched and watched, in rounds, each kind first in turn
    out["overhead"] = []
    kinds = {"plain": None, "unwatched": "unwatched", "adaptive": opts}
    for r in range(cfg["rounds"]):
        pair = {}
        order = list(kinds)[r % 3:] + list(kinds)[:r % 3]  # each kind first in turn
        for kind in order:
            pair[kind] = me.run(progs["static"], cfg["overhead_steps"], None, adaptive=kinds[kind])["ends"]
        out["overhead"].append(pair)
    # (4) the long idle run
    out["idle"] = me.run(progs["static"], cfg["idle_steps"], None, adaptive=opts)
    dist.destroy_process_group()
    with open(out_path, "w") as fh:
        json.dump(out, fh)


# ------------------------------------------------------------------ the launcher and the figures


def spawn_ranks(cfg: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Both ranks as processes of this script (``--rank``); their results, or an error with the failing rank's log."""
    import swpipe

    src = os.path.dirname(os.path.dirname(os.path.abspath(swpipe.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
               OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="swpipe-replan-ranks-") as tmp:
        procs, logs = [], []
        for rank in range(2):
            log = open(os.path.join(tmp, f"rank{rank}.log"), "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--rank", str(rank), "--store", os.path.join(tmp, "store"),
                 "--out", os.path.join(tmp, f"rank{rank}.json"), "--config", json.dumps(cfg)],
                stdout=log, stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + cfg["deadline_s"]
        try:
            for p in procs:
                p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            for log in logs:
                log.close()
        out = []
        for rank, p in enumerate(procs):
            path = os.path.join(tmp, f"rank{rank}.json")
            if p.returncode != 0 or not os.path.exists(path):
                with open(os.path.join(tmp, f"rank{rank}.log")) as fh:
                    tail = fh.read()[-4000:]
                raise RuntimeError(f"replan_ranks: rank {rank} ended with exit status {p.returncode} (killed after "
                                   f"--deadline {cfg['deadline_s']} s if negative) and no results; its output:\n{tail}")
            with open(path) as fh:
                out.append(json.load(fh))
    return out


def mean_step(ends: Sequence[float], start: int) -> float:
    """The mean step from step ``start`` to the end (iteration ends on one rank)."""
    return (ends[-1] - ends[start - 1]) / (len(ends) - start)


def median_step(ends: Sequence[float], start: int) -> float:
    """The median step from step ``start`` on (robust to the stalls a loaded machine adds to some steps)."""
    return statistics.median(b - a for a, b in zip(ends[start - 1:], ends[start:]))


def max_rel_diff(a: Sequence[float], b: Sequence[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b))


def figures(cfg: Dict[str, Any], rank0: Dict[str, Any], rank1: Dict[str, Any]) -> Dict[str, Any]:
    start = cfg["change"] + cfg["k"]
    drift = {kind: mean_step(rank0["drift"][kind]["ends"], start) for kind in ("static", "best", "adaptive")}
    gap = drift["static"] - drift["best"]
    static_losses = rank1["drift"]["static"]["losses"]
    ratios = [median_step(p["adaptive"], 5) / median_step(p["plain"], 5) for p in rank0["overhead"]]
    unwatched = [median_step(p["unwatched"], 5) / median_step(p["plain"], 5) for p in rank0["overhead"]]
    idle = rank0["idle"]["decisions"]
    return {
        "trials": rank0["trials"], "best": rank0["best"], "drift": drift, "predicted_first": rank0["predicted_first"],
        "action_overhead_s": rank0["action_overhead_s"],
        "recovered": (drift["static"] - drift["adaptive"]) / gap if gap > 0 else float("nan"),
        "decisions": rank0["drift"]["adaptive"]["decisions"],
        "rank1_decisions": rank1["drift"]["adaptive"]["decisions"],
        "used": [rank0["drift"]["adaptive"]["used"], rank1["drift"]["adaptive"]["used"]],
        "loss_diff": {kind: max_rel_diff(rank1["drift"][kind]["losses"], static_losses) for kind in ("best", "adaptive")},
        "overhead": {"ratios": ratios, "median": statistics.median(ratios) - 1.0,
                     "unwatched": statistics.median(unwatched) - 1.0,
                     "plain": statistics.median(median_step(p["plain"], 5) for p in rank0["overhead"]),
                     "adaptive": statistics.median(median_step(p["adaptive"], 5) for p in rank0["overhead"])},
        "idle": {"steps": cfg["idle_steps"], "seconds": rank0["idle"]["ends"][-1], "decisions": idle,
                 "switches": sum(d["swapped"] for d in idle),
                 "rank1_switches": len(rank1["idle"]["decisions"])},
    }


def config(args: argparse.Namespace) -> Dict[str, Any]:
    replan = {"warmup": 5, "window": 20, "patience": 20, "min_noise": args.min_noise}
    cfg = {"batch": args.batch, "microbatches": args.microbatches, "schedule": args.schedule,
           "rank0_ms": args.rank0_ms, "rank1_ms": args.rank1_ms, "slow_rank": args.slow_rank, "slow_ms": args.slow_ms,
           "lr": args.lr, "change": args.change, "k": args.k, "iters": args.iters, "trial_steps": args.trial_steps,
           "rounds": args.rounds, "overhead_steps": args.overhead_steps, "idle_steps": args.idle_steps,
           "replan": replan, "timeout_s": 120, "deadline_s": args.deadline}
    if args.quick:
        cfg.update(change=30, k=25, iters=80, trial_steps=5, rounds=1, overhead_steps=15, idle_steps=50,
                   deadline_s=min(args.deadline, 280), replan=dict(replan, warmup=2, window=8, patience=5))
    return cfg


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--batch", type=int, default=32, help="samples per step")
    ap.add_argument("--microbatches", type=int, nargs="+", default=[2, 4],
                    help="the counts offered; the static schedule runs the first")
    ap.add_argument("--schedule", default="GPipe", help="the static schedule (PyTorch's name)")
    ap.add_argument("--rank0-ms", type=float, default=0.06, help="rank 0's stage: forward sleep per sample (ms)")
    ap.add_argument("--rank1-ms", type=float, default=0.3, help="rank 1's stage: forward sleep per sample (ms)")
    ap.add_argument("--slow-rank", type=int, default=0, choices=(0, 1), help="the rank the co-running job slows")
    ap.add_argument("--slow-ms", type=float, default=0.54, help="the co-running job's share, per sample (ms)")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--change", type=int, default=100, help="the step the slowdown starts at")
    ap.add_argument("--k", type=int, default=60, help="steps after the change before the gap is measured")
    ap.add_argument("--iters", type=int, default=400, help="steps of each drifting run")
    ap.add_argument("--trial-steps", type=int, default=14, help="steps of each candidate's trial")
    ap.add_argument("--rounds", type=int, default=15, help="paired rounds of the overhead measurement")
    ap.add_argument("--overhead-steps", type=int, default=40, help="steps of each run of a round")
    ap.add_argument("--idle-steps", type=int, default=1500)
    ap.add_argument("--min-noise", type=float, default=0.05, help="ReplanOptions.min_noise")
    ap.add_argument("--deadline", type=float, default=1800.0, help="seconds before the ranks are killed")
    ap.add_argument("--quick", action="store_true", help="small counts: the smoke run of the tests")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank is not None:  # a spawned rank
        rank_main(args.rank, args.store, args.out, json.loads(args.config))
        return {}
    cfg = config(args)
    progs = programs(cfg)
    static_label, slowed = progs["static_label"], cfg["slow_rank"]
    per_sample = [cfg["rank0_ms"], cfg["rank1_ms"]]
    load_before = os.getloadavg()
    print(f"replan_ranks: 2 gloo ranks, one stage each, {cfg['batch']} samples a step; sleeps per sample in the "
          f"forward (twice that in the backward): rank 0 {per_sample[0]:g} ms, rank 1 {per_sample[1]:g} ms; rank "
          f"{slowed} {per_sample[slowed]:g} -> {per_sample[slowed] + cfg['slow_ms']:g} ms from step {cfg['change']} "
          f"(the co-running job); candidates {', '.join(progs['labels'])}; static {static_label}; K = {cfg['k']}; "
          "load average %.2f, %.2f, %.2f; %d CPUs" % (*load_before, os.cpu_count()))
    rank0, rank1 = spawn_ranks(cfg)
    fig = figures(cfg, rank0, rank1)
    print(f"\n(1) every candidate tried, median step (ms): measured at first / predicted at first (calibrated costs, "
          f"runtime overhead {fig['action_overhead_s'] / MS:.2f} ms an action) / measured with rank {slowed} slowed")
    for label in progs["labels"]:
        mark = "  <- best slowed" if label == fig["best"] else ""
        mark += "  <- static" if label == static_label else ""
        print(f"    {label:>12} {fig['trials']['first'][label] / MS:8.2f} / {fig['predicted_first'][label] / MS:7.2f} "
              f"/ {fig['trials']['slowed'][label] / MS:8.2f}{mark}")
    d = fig["drift"]
    print(f"\n(2) mean step over steps {cfg['change'] + cfg['k']}..{cfg['iters'] - 1} (ms), rank {slowed} slowed from "
          f"{cfg['change']}")
    print(f"    {'static':>10} {'adaptive':>10} {'best':>10}   recovered  (goal >= 80 %)")
    print(f"    {d['static'] / MS:10.2f} {d['adaptive'] / MS:10.2f} {d['best'] / MS:10.2f}   {fig['recovered']:9.0%}"
          f"   ({static_label} / AdaptiveSchedule / {fig['best']})")
    for dec in fig["decisions"]:
        after = (f", measured after {dec['measured_after_s'] / MS:.2f} ms" if dec["measured_after_s"] is not None
                 else "")
        print(f"    step {dec['step']}: {'switch' if dec['swapped'] else 'keep'} {dec['running']} -> {dec['chosen']} "
              f"(step {dec['measured_s'] / MS:.2f} ms vs {dec['reference_s'] / MS:.2f} ms +- {dec['noise']:.0%}; "
              f"predicted {dec['predicted_old_s'] / MS:.2f} -> {dec['predicted_new_s'] / MS:.2f} ms{after})")
        print("        predicted: " + ", ".join(f"{k} {v / MS:.2f}" for k, v in dec["predicted"].items()))
    if not fig["decisions"]:
        print("    no drift detected")
    print(f"    switched at step(s): rank 0 {[dec['starts_at'] for dec in fig['decisions'] if dec['swapped']]}, rank 1 "
          f"{[dec['starts_at'] for dec in fig['rank1_decisions']]}; losses against the static run's, max relative "
          f"difference: adaptive {fig['loss_diff']['adaptive']:.1e}, best {fig['loss_diff']['best']:.1e}")
    o = fig["overhead"]
    print(f"\n(3) no drift: PyTorch's {static_label} {o['plain'] / MS:.2f} ms, AdaptiveSchedule {o['adaptive'] / MS:.2f} "
          f"ms a step; overhead {o['median']:+.2%} (median of {cfg['rounds']} paired rounds; goal <= 1 %)")
    print(f"    of which the actions' timing (AdaptiveSchedule with replan=None: no watch, no exchange) "
          f"{o['unwatched']:+.2%}; each round's ratio: {', '.join(f'{r:.3f}' for r in o['ratios'])}")
    i = fig["idle"]
    print(f"\n(4) idle run: {i['steps']} steps in {i['seconds']:.1f} s: {len(i['decisions'])} decision(s), "
          f"{i['switches']} false switch(es) (goal 0)")
    for dec in i["decisions"]:
        print(f"    step {dec['step']}: {'switch' if dec['swapped'] else 'keep'} {dec['running']} -> {dec['chosen']} "
              f"(step {dec['measured_s'] / MS:.2f} ms vs {dec['reference_s'] / MS:.2f} ms +- {dec['noise']:.0%})")
    print("\nload average before %.2f, %.2f, %.2f; after %.2f, %.2f, %.2f" % (*load_before, *os.getloadavg()))
    assert fig["loss_diff"]["adaptive"] <= 1e-5 and fig["loss_diff"]["best"] <= 1e-5, fig["loss_diff"]
    fig["static"], fig["labels"] = static_label, progs["labels"]
    return fig


if __name__ == "__main__":
    main(sys.argv[1:])
