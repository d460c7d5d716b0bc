"""PyTorch's schedules and a searched one run on ``torch.distributed.pipelining``'s runtime, beside swpipe's prediction.

:func:`launch` starts ``torchrun`` (``python -m torch.distributed.run``) on the loopback
with gloo; each rank runs :func:`run_rank`:

1. the model (a stack of ``Linear + Tanh`` blocks and an MSE loss, seeded) is cut into
   ``ranks`` stages (GPipe, 1F1B) and ``2 * ranks`` stages (the others), each rank's
   stages wrapped in ``torch.distributed.pipelining.PipelineStage``;
2. every rank measures every stage's costs in its own process at the same time
   (:func:`~autosched.pp.costs.measure_stage_costs`: the cores are as busy as during the
   run), the link on the job's gloo group (:func:`~autosched.pp.costs.measure_p2p`: the
   idle link, and what a post costs while both ranks compute, at the activation's size),
   and the runtime's own cost per action, by each rank running every stage alone
   (``ScheduleLoopedBFS`` on a one-rank group) against the model's prediction: before
   the runs, once in every round of them and after them (a shared machine's load moves
   within seconds); the prediction takes each figure's median;
3. rank 0 searches a schedule with the costs measured before the runs
   (:func:`~autosched.pp.search.pp_search`), written as the compute-only CSV that every
   rank loads into ``_PipelineScheduleRuntime``;
4. every schedule trains the same initial weights (SGD), in rounds (each schedule one
   step per round, so all share the machine's swings): each rank times ``schedule.step``
   after a barrier (the step is the slowest rank's); then one more step counts the peak
   live tensor bytes (:class:`~autosched.pp.memory.LiveTensorBytes`). The losses are
   compared with the unsplit model's, trained the same way on rank 0, and every schedule
   is predicted (:func:`~autosched.pp.simulate.pp_simulate`).

Rank 0 writes everything to a JSON file; :func:`format_table` prints it as one table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["PPRunConfig", "PPJobError", "launch", "run_rank", "format_table", "make_model"]


@dataclass
class PPRunConfig:
    """What :func:`launch` runs.

    Attributes
    ----------
    width, depth : int
        The model: ``depth`` blocks of ``Linear(width, width) + Tanh``.
    batch : int
        Samples per step, split into each micro-batch count.
    microbatches : tuple of int
    schedules : tuple of str
        PyTorch's schedules to run (empty: every one this torch has).
    steps, warmup : int
        Timed steps per schedule, after untimed ones.
    search : bool
        Also search a schedule and run it from its CSV.
    memory_cap_bytes : int or None
        The search's cap per rank.
    threads : int
        ``torch.set_num_threads`` on every rank (and for the cost measurement).
    seed : int
    cost_repeats : int
    time_limit_s : float
        CP-SAT's limit per problem.
    """

    width: int = 256
    depth: int = 8
    batch: int = 64
    microbatches: Tuple[int, ...] = (4, 8)
    schedules: Tuple[str, ...] = ()
    steps: int = 8
    warmup: int = 2
    search: bool = True
    memory_cap_bytes: Optional[int] = None
    threads: int = 1
    seed: int = 0
    cost_repeats: int = 7
    time_limit_s: float = 5.0


def make_model(cfg: PPRunConfig) -> Any:
    """The seeded model: ``depth`` blocks of ``Linear + Tanh`` as one ``torch.nn.Sequential``."""
    import torch

    torch.manual_seed(cfg.seed)
    blocks = [torch.nn.Sequential(torch.nn.Linear(cfg.width, cfg.width), torch.nn.Tanh()) for _ in range(cfg.depth)]
    return torch.nn.Sequential(*blocks)


def _data(cfg: PPRunConfig, step: int) -> Tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(10_000 + step)
    return torch.randn(cfg.batch, cfg.width, generator=g), torch.randn(cfg.batch, cfg.width, generator=g)


def _loss(output: Any, target: Any) -> Any:
    import torch

    return torch.nn.functional.mse_loss(output, target)


def _reference_losses(cfg: PPRunConfig, n_mb: int, n_steps: int) -> List[float]:
    """The unsplit model trained the same way: per step, the mean of the micro-batches' losses."""
    import torch

    model = make_model(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    for step in range(n_steps):
        x, y = _data(cfg, step)
        opt.zero_grad(set_to_none=False)
        losses = [_loss(model(xm), ym) for xm, ym in zip(x.tensor_split(n_mb), y.tensor_split(n_mb))]
        total = sum(losses) / n_mb
        total.backward()
        opt.step()
        out.append(float(total))
    return out


def _stage_modules(cfg: PPRunConfig, n_stages: int) -> List[Any]:
    from autosched.pp.costs import split_module

    return split_module(list(make_model(cfg)), n_stages)


def _measure_costs(cfg: PPRunConfig, n_stages: int, n_mb: int, repeats: int, warmup: int) -> Tuple[Any, ...]:
    from autosched.pp.costs import measure_stage_costs

    stages = _stage_modules(cfg, n_stages)
    x, y = _data(cfg, 0)
    mb = cfg.batch // n_mb
    return measure_stage_costs(stages, x[:mb], y[:mb], _loss, repeats=repeats, warmup=warmup)


def _costs_on_every_rank(cfg: PPRunConfig, n_mb: int, world: int, repeats: Optional[int] = None,
                         warmup: int = 1) -> Dict[int, List[Any]]:
    """Every rank measures every stage at once (the cores as busy as in the run); all ranks' figures."""
    import torch.distributed as dist

    mine = {k: _measure_costs(cfg, k, n_mb, repeats or cfg.cost_repeats, warmup) for k in (world, 2 * world)}
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    return {k: [g[k] for g in gathered] for k in mine}


def _combine(samples: List[Tuple[Any, ...]], p2p: Any, mb: int, note: str) -> Any:
    """Per stage and field, the median over every rank's and pass's measurement."""
    from dataclasses import fields

    from autosched.pp.costs import PPCosts, StageCost

    stages = []
    for s in range(len(samples[0])):
        values = {}
        for f in fields(StageCost):
            vals = [getattr(sample[s], f.name) for sample in samples]
            med = statistics.median(vals)
            values[f.name] = int(med) if f.type in ("int", int) else med
        stages.append(StageCost(**values))
    return PPCosts(tuple(stages), p2p, mb, note)


def _build(name: str, program: Any, cfg: PPRunConfig, n_mb: int, rank: int, csv_path: Optional[str]) -> Tuple[Any, List[Any]]:
    """This rank's stages and the schedule object, as a user writes them."""
    import torch
    from torch.distributed.pipelining import PipelineStage

    from autosched.pp import _torch

    modules = _stage_modules(cfg, program.n_stages)
    mine = [s for s in range(program.n_stages) if program.stage_to_rank[s] == rank]
    stages = [PipelineStage(modules[s], s, program.n_stages, torch.device("cpu")) for s in mine]
    if csv_path is not None:
        return _torch.runtime_from_csv(stages, n_mb, _loss, csv_path, program.n_stages), modules
    cls = _torch.schedule_class(name)
    if _torch.schedule_is_single(name):
        return cls(stages[0], n_mb, loss_fn=_loss), modules
    return cls(stages, n_mb, loss_fn=_loss), modules


class _Trainer:
    """One schedule on this rank: its stages, its optimizer, its step times, losses and memory peak."""

    def __init__(self, name: str, program: Any, cfg: PPRunConfig, n_mb: int, rank: int, csv_path: Optional[str]) -> None:
        import torch

        self.name, self.program, self.cfg, self.n_mb = name, program, cfg, n_mb
        self.schedule, modules = _build(name, program, cfg, n_mb, rank, csv_path)
        mine = [s for s in range(program.n_stages) if program.stage_to_rank[s] == rank]
        self.opt = torch.optim.SGD([p for s in mine for p in modules[s].parameters()], lr=0.05)
        self.first, self.last = 0 in mine, program.n_stages - 1 in mine
        self.step_no = 0
        self.times: List[float] = []
        self.losses: List[float] = []
        self.peak = 0

    def step(self, timed: bool = False, memory: bool = False) -> None:
        import torch.distributed as dist

        from autosched.pp.memory import LiveTensorBytes

        x, y = _data(self.cfg, self.step_no)
        args = (x,) if self.first else ()
        kwargs: Dict[str, Any] = {"target": y} if self.last else {}
        mb_losses: List[Any] = []
        self.opt.zero_grad(set_to_none=False)
        dist.barrier()
        if memory:  # counted, not timed: the counting costs a Python call per op
            with LiveTensorBytes() as mem:
                self.schedule.step(*args, losses=mb_losses if self.last else None, return_outputs=False, **kwargs)
            self.peak = mem.peak_bytes
        else:
            t0 = time.perf_counter()
            self.schedule.step(*args, losses=mb_losses if self.last else None, return_outputs=False, **kwargs)
            if timed:
                self.times.append(time.perf_counter() - t0)
        self.opt.step()
        if self.last:
            self.losses.append(float(sum(float(v) for v in mb_losses) / self.n_mb))
        self.step_no += 1

    def gather(self, world: int) -> Dict[str, Any]:
        import torch.distributed as dist

        gathered: List[Any] = [None] * world
        dist.all_gather_object(gathered, {"rank": dist.get_rank(), "times": self.times, "peak": self.peak,
                                          "losses": self.losses if self.last else None})
        step_times = [max(g["times"][i] for g in gathered) for i in range(len(self.times))]
        loss_rows = [g["losses"] for g in gathered if g["losses"] is not None]
        return {"step_times": step_times, "peak_bytes": {g["rank"]: g["peak"] for g in gathered},
                "losses": loss_rows[0] if loss_rows else []}


class _AloneProbe:
    """Every stage of a split on this rank alone: what the runtime adds per compute action, against the model.

    ``ScheduleLoopedBFS`` over all the split's stages on a one-rank group (no transfers);
    :meth:`overhead_s` is ``(median measured step - simulated step) / compute actions``,
    at least 0.
    """

    def __init__(self, cfg: PPRunConfig, n_mb: int, n_stages: int, group: Any) -> None:
        import torch
        from torch.distributed.pipelining import PipelineStage

        from autosched.pp import _torch
        from autosched.pp.program import pp_program

        self.cfg, self.n_mb = cfg, n_mb
        self.modules = _stage_modules(cfg, n_stages)
        stages = [PipelineStage(self.modules[s], s, n_stages, torch.device("cpu"), group=group)
                  for s in range(n_stages)]
        self.schedule = _torch.schedule_class("LoopedBFS")(stages, n_mb, loss_fn=_loss)
        self.opt = torch.optim.SGD([p for m in self.modules for p in m.parameters()], lr=0.05)
        self.program = pp_program("LoopedBFS", 1, n_mb, stages_per_rank=n_stages)
        self.times: List[float] = []
        self.step_no = 0
        for _ in range(cfg.warmup):
            self.step(timed=False)

    def step(self, timed: bool = True) -> None:
        x, y = _data(self.cfg, self.step_no)
        self.opt.zero_grad(set_to_none=False)
        t0 = time.perf_counter()
        self.schedule.step(x, target=y, losses=[], return_outputs=False)
        if timed:
            self.times.append(time.perf_counter() - t0)
        self.opt.step()
        self.step_no += 1

    def overhead_s(self, costs: Any) -> float:
        from autosched.pp.simulate import pp_simulate

        predicted = pp_simulate(self.program, costs.with_action_overhead(0.0)).step_s
        return max(0.0, (statistics.median(self.times) - predicted) / len(self.program.compute[0]))


def _median_on_every_rank(mine: float) -> float:
    import torch.distributed as dist

    gathered: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return statistics.median(gathered)


def _measure_link(cfg: PPRunConfig, repeats: int = 20) -> Any:
    """The link on the job's group, its busy exchange at the size of the largest activation sent."""
    from autosched.pp.costs import measure_p2p

    return measure_p2p(repeats=repeats, busy_bytes=4 * cfg.width * (cfg.batch // min(cfg.microbatches)))


def _median_link(links: List[Any]) -> Any:
    """Each figure's median over links measured at several times (the load moves between them)."""
    from dataclasses import replace

    return replace(links[0], latency_s=statistics.median(k.latency_s for k in links),
                   seconds_per_byte=statistics.median(k.seconds_per_byte for k in links),
                   post_s=statistics.median(k.post_s for k in links))


class _Calibration:
    """The costs measured again in every round of the runs, so that they share the runs' load.

    On a shared machine the load moves within seconds; figures measured only before the
    runs predict another machine. Each round every rank measures its stages once, runs
    the :class:`_AloneProbe` once and the link once; the prediction takes each figure's
    median over the rounds and the measurements before and after them.
    """

    def __init__(self, cfg: PPRunConfig, n_mb: int, world: int, probe: _AloneProbe) -> None:
        self.cfg, self.n_mb, self.world = cfg, n_mb, world
        self.probe = probe
        probe.times.clear()  # its steps from now on, in the rounds
        self.samples: Dict[int, List[Any]] = {k: [] for k in (world, 2 * world)}
        self.links: List[Any] = []

    def round(self) -> None:
        for k, v in _costs_on_every_rank(self.cfg, self.n_mb, self.world, repeats=2, warmup=0).items():
            self.samples[k].extend(v)
        self.probe.step()
        self.links.append(_measure_link(self.cfg, repeats=4))

    def costs(self, before: Dict[int, List[Any]], after: Dict[int, List[Any]], links: List[Any]) -> Tuple[Dict[int, Any], float]:
        """Every split's costs (the runtime's overhead per action included) and that overhead; every rank calls it."""
        link = _median_link(links + self.links)
        costs = {k: _combine(before[k] + self.samples[k] + after[k], link, self.cfg.batch // self.n_mb,
                             "before, during and after the runs") for k in before}
        overhead = _median_on_every_rank(self.probe.overhead_s(costs[2 * self.world]))
        return {k: c.with_action_overhead(overhead) for k, c in costs.items()}, overhead


def _noise(values: Sequence[float]) -> float:
    """The interquartile range over the median (the range, under 4 values): the run's own spread."""
    if len(values) < 2:
        return float("nan")
    if len(values) < 4:
        return (max(values) - min(values)) / statistics.median(values)
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / statistics.median(values)


def _search(cfg: PPRunConfig, costs: Dict[int, Dict[int, Any]], world: int) -> Dict[str, Any]:
    """Rank 0 searches; every rank gets the CSV and what was found."""
    import torch.distributed as dist

    from autosched.pp.search import pp_search
    from autosched.search.options import Constraints, SolverOptions

    box: List[Any] = [None]
    if dist.get_rank() == 0:
        found = pp_search(costs[cfg.microbatches[0]], world, list(cfg.microbatches),
                          constraints=Constraints(max_memory_bytes=cfg.memory_cap_bytes), costs_for_microbatches=costs,
                          solver=SolverOptions(time_limit_s=cfg.time_limit_s, cpsat_max_tasks=64))
        exp = found.exported
        box[0] = {"csv": exp.program.csv_text(), "n_mb": exp.program.n_microbatches,
                  "n_stages": exp.program.n_stages, "origin": exp.origin, "summary": found.summary(),
                  "predicted_step_s": exp.result.step_s, "best_origin": found.best.origin,
                  "best_seed": found.best_seed.program.schedule if found.best_seed else None,
                  "best_seed_step_s": found.best_seed.result.step_s if found.best_seed else None}
    dist.broadcast_object_list(box, src=0)
    return box[0]


def run_rank(cfg: PPRunConfig, out_path: Optional[str]) -> Optional[Dict[str, Any]]:
    """One rank's side of :func:`launch` (the process group is set up here); rank 0 returns and writes the results."""
    import torch
    import torch.distributed as dist

    from autosched.pp.program import builtin_programs, read_csv
    from autosched.pp.simulate import pp_simulate

    torch.set_num_threads(cfg.threads)
    dist.init_process_group("gloo", timeout=timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    # in torchrun's output (launch's log_path): which processes the job is, once each has joined the group
    print(f"rank {rank} of {world}: in the process group (pid {os.getpid()})", flush=True)
    try:
        p2p = _measure_link(cfg)
        alone = [dist.new_group([r]) for r in range(world)]  # every rank creates every group, in the same order
        samples = {n: _costs_on_every_rank(cfg, n, world) for n in cfg.microbatches}
        costs = {n: {k: _combine(v, p2p, cfg.batch // n, "before the runs") for k, v in by.items()}
                 for n, by in samples.items()}
        probes = {n: _AloneProbe(cfg, n, 2 * world, alone[rank]) for n in cfg.microbatches}
        for n, probe in probes.items():
            for _ in range(max(3, cfg.cost_repeats)):
                probe.step()
        overhead = {n: _median_on_every_rank(probes[n].overhead_s(costs[n][2 * world])) for n in cfg.microbatches}
        costs = {n: {k: c.with_action_overhead(overhead[n]) for k, c in by.items()} for n, by in costs.items()}
        searched = _search(cfg, costs, world) if cfg.search else {}
        results: List[Dict[str, Any]] = []
        for n_mb in cfg.microbatches:
            programs, refused = builtin_programs(world, n_mb)
            names = [n for n in (cfg.schedules or tuple(programs)) if n in programs]
            trainers = [_Trainer(n, programs[n], cfg, n_mb, rank, None) for n in names]
            if searched and searched["n_mb"] == n_mb:
                path = os.path.join(tempfile.gettempdir(), f"swpipe-pp-{os.getpid()}.csv")
                with open(path, "w") as f:
                    f.write(searched["csv"])
                program = read_csv(path, world, searched["n_stages"], n_mb, "swpipe-searched")
                trainers.append(_Trainer("swpipe-searched", program, cfg, n_mb, rank, path))
            for t in trainers:
                for _ in range(cfg.warmup):
                    t.step()
            calibration = _Calibration(cfg, n_mb, world, probes[n_mb])
            for _ in range(cfg.steps):  # rounds: every schedule once per round, so they share the load's swings
                for t in trainers:
                    t.step(timed=True)
                calibration.round()  # and the costs too
            after = _costs_on_every_rank(cfg, n_mb, world)
            both, overhead[n_mb] = calibration.costs(samples[n_mb], after, [p2p, _measure_link(cfg)])
            for t in trainers:
                t.step(memory=True)
            gathered = [t.gather(world) for t in trainers]
            if rank != 0:
                continue
            costs[n_mb] = both
            ref = _reference_losses(cfg, n_mb, cfg.warmup + cfg.steps + 1)
            for t, measured in zip(trainers, gathered):
                pred = pp_simulate(t.program, both[t.program.n_stages])
                err = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(measured["losses"], ref)), default=0.0)
                results.append({
                    "schedule": t.name, "n_microbatches": n_mb, "n_stages": t.program.n_stages,
                    "predicted_step_s": pred.step_s, "measured_step_s": statistics.median(measured["step_times"]),
                    "noise": _noise(measured["step_times"]), "step_times_s": measured["step_times"],
                    "predicted_peak_bytes": pred.peak_bytes, "measured_peak_bytes": measured["peak_bytes"],
                    "predicted_bubble": pred.bubble_fraction, "losses": measured["losses"],
                    "reference_losses": ref, "loss_rel_err": err})
            results.extend({"schedule": n, "n_microbatches": n_mb, "refused": why} for n, why in refused.items())
        if rank != 0:
            return None
        report = {"config": asdict(cfg), "world_size": world, "p2p": asdict(p2p), "searched": searched,
                  "action_overhead_s": overhead,
                  "costs": {str(n): {str(k): c.to_dict() for k, c in by.items()} for n, by in costs.items()},
                  "results": results, "torch": torch.__version__, "threads": cfg.threads,
                  "load": os.getloadavg(), "cores": os.cpu_count()}
        if out_path:
            with open(out_path, "w") as f:
                json.dump(report, f, indent=1, default=str)
        return report
    finally:
        dist.destroy_process_group()


def format_table(report: Dict[str, Any]) -> str:
    """One row per schedule and micro-batch count: predicted and measured step and peak, bubble, losses."""
    head = (f"{'schedule':<22}{'mb':>3}{'stages':>7}{'pred ms':>9}{'meas ms':>9}{'noise':>7}{'err':>7}"
            f"{'peak pred/meas KiB (max rank)':>31}{'bubble':>8}{'loss':>7}")
    lines = [head, "-" * len(head)]
    for r in report["results"]:
        if "refused" in r:
            lines.append(f"{r['schedule']:<22}{r['n_microbatches']:>3}  refused by PyTorch: {r['refused']}")
            continue
        pred, meas = r["predicted_step_s"] * 1e3, r["measured_step_s"] * 1e3
        pp = max(int(v) for v in r["predicted_peak_bytes"].values()) / 1024
        mp = max(int(v) for v in r["measured_peak_bytes"].values()) / 1024
        bubble = max(float(v) for v in r["predicted_bubble"].values())
        ok = "ok" if r["loss_rel_err"] <= 1e-4 else f"{r['loss_rel_err']:.0e}"
        lines.append(f"{r['schedule']:<22}{r['n_microbatches']:>3}{r['n_stages']:>7}{pred:>9.2f}{meas:>9.2f}"
                     f"{r['noise']:>7.0%}{(pred - meas) / meas:>+7.0%}{f'{pp:.0f} / {mp:.0f}':>31}{bubble:>8.0%}{ok:>7}")
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_JOB_VAR = "SWPIPE_PP_JOB"  # in the environment of every process a launch starts: how its stop finds them
_SIGNAL_REASONS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hangup"}
_POLL_S = 0.05  # how often a wait looks again at torchrun, the signals and /proc


class PPJobError(RuntimeError):
    """The torchrun job of :func:`launch` ended without a report; every process it started has been stopped.

    Attributes
    ----------
    reason : str
        ``"interrupted"`` (SIGINT, Ctrl-C), ``"terminated"`` (SIGTERM), ``"hangup"`` (SIGHUP), ``"timeout"`` (past
        ``timeout_s``), ``"torchrun_died"`` (torchrun killed by a signal), ``"failed"``
        (torchrun exited non-zero: a rank failed), ``"no_report"`` (it exited 0 without one).
    line : str
        One line saying what happened and where torchrun's output is.
    returncode : int or None
        torchrun's exit status (negative: the signal that killed it); None when it was
        still running.
    stopped : int
        The processes of the job (torchrun, its ranks) still running that were stopped.
    log_path : str
        torchrun's and the ranks' output.
    output_tail : str
        The output's last lines, for ``"failed"`` and ``"no_report"`` ("" otherwise).
    """

    def __init__(self, reason: str, line: str, returncode: Optional[int] = None, stopped: int = 0,
                 log_path: str = "", output_tail: str = "") -> None:
        super().__init__(f"{line}\n{output_tail}" if output_tail else line)
        self.reason, self.line, self.returncode = reason, line, returncode
        self.stopped, self.log_path, self.output_tail = stopped, log_path, output_tail


def _job_pids(token: str) -> set:
    """The live processes whose environment holds ``SWPIPE_PP_JOB=token`` (Linux's /proc; empty elsewhere).

    torchrun starts each rank in a session of its own, and a rank whose torchrun died
    belongs to no one: the environment every process of the job inherits is what finds
    them all. A zombie's environment reads empty: it counts as gone.
    """
    mark = f"{_JOB_VAR}={token}".encode()
    try:
        names = os.listdir("/proc")
    except OSError:
        return set()
    found = set()
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    found.add(int(name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def _stop_job(proc: "subprocess.Popen[bytes]", token: str, grace_s: float) -> int:
    """SIGTERM to torchrun's process group and to every process of the job, SIGKILL to what is left after
    ``grace_s``; returns when none is left (or ``grace_s`` after the SIGKILL). How many were running."""
    seen: set = set()
    signalled: set = set()
    sig, deadline = signal.SIGTERM, time.monotonic() + grace_s
    while True:
        torchrun = proc.poll() is None
        left = _job_pids(token) | ({proc.pid} if torchrun else set())
        seen |= left
        if not left:
            return len(seen)
        if time.monotonic() > deadline:
            if sig == signal.SIGKILL:
                return len(seen)
            sig, deadline, signalled = signal.SIGKILL, time.monotonic() + grace_s, set()
        for pid in sorted(left - signalled):
            try:
                if pid == proc.pid:
                    os.killpg(pid, sig)  # torchrun and whatever it started in its own group
                else:
                    os.kill(pid, sig)  # a rank: torchrun starts each in a session of its own
            except (ProcessLookupError, PermissionError):
                pass
            signalled.add(pid)
        if torchrun:
            try:
                proc.wait(timeout=_POLL_S)
            except subprocess.TimeoutExpired:
                pass
        else:
            threading.Event().wait(_POLL_S)  # a poll interval: processes that are not our children cannot be waited on


class _Signals:
    """While the job runs, SIGINT, SIGTERM and SIGHUP (the terminal closed) are recorded (the wait looks at them) instead of raising or killing
    this process at once, so that the job is stopped first. Only on the main thread, and only where the handler
    is Python's default (a caller's own handler stays)."""

    def __init__(self) -> None:
        self.received: List[int] = []
        self._previous: Dict[int, Any] = {}

    def __enter__(self) -> "_Signals":
        if threading.current_thread() is threading.main_thread():
            for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL),
                                 (signal.SIGHUP, signal.SIG_DFL)):
                if signal.getsignal(sig) == default:
                    self._previous[sig] = signal.signal(sig, lambda signum, frame: self.received.append(signum))
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tail(path: str, n_chars: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - n_chars))
            return f.read().decode(errors="replace")
    except OSError as exc:
        return f"(torchrun's output {path} could not be read: {exc.strerror})"


def launch(cfg: PPRunConfig, nproc: int = 2, out_path: Optional[str] = None, timeout_s: float = 600.0,
           log_path: Optional[str] = None, grace_s: float = 5.0) -> Dict[str, Any]:
    """Run :func:`run_rank` under ``torchrun --nproc-per-node nproc`` (gloo, loopback); the rank-0 report.

    torchrun runs in a session of its own, its output (and the ranks') goes to
    ``log_path`` (default: a new temporary folder's ``torchrun.log``). When the job
    ends without a report, every process it started (torchrun and its ranks, each in a
    session of its own) is sent SIGTERM, SIGKILL after ``grace_s`` seconds, and
    :class:`PPJobError` is raised once none is left: on SIGINT (Ctrl-C) or SIGTERM to
    this process while the job runs, past ``timeout_s``, when torchrun dies, and when it
    fails. The ranks are found by a variable in their environment (``/proc``: on a
    system without it only torchrun's group is signalled, and torchrun stops its ranks).

    Raises
    ------
    PPJobError
        ``reason`` says which of those ended the job.
    """
    folder = tempfile.mkdtemp(prefix="swpipe-pp-") if out_path is None or log_path is None else None
    out_path = out_path or os.path.join(folder, "report.json")
    log_path = log_path or os.path.join(folder, "torchrun.log")
    token = f"{os.getpid()}-{uuid.uuid4().hex}"
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, OMP_NUM_THREADS=str(cfg.threads), **{_JOB_VAR: token},
               PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--nnodes=1",
           "--master-addr=127.0.0.1", f"--master-port={_free_port()}", "--max-restarts=0",
           "-m", "autosched.pp.runtime", "--config", json.dumps(asdict(cfg)), "--out", out_path]
    where = f"torchrun's output: {log_path}"
    with _Signals() as signals, open(log_path, "wb") as log:
        # the output goes to a file, not a pipe: a rank that outlives torchrun would hold a pipe open
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        reason = None
        try:
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None:
                if signals.received:
                    reason = _SIGNAL_REASONS[signals.received[0]]
                    break
                if time.monotonic() >= deadline:
                    reason = "timeout"
                    break
                try:
                    proc.wait(timeout=min(_POLL_S, max(0.0, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    pass
        except KeyboardInterrupt:  # SIGINT with a handler of the caller's that raises it
            reason = "interrupted"
        except BaseException:
            _stop_job(proc, token, grace_s)
            raise
        stopped = _stop_job(proc, token, grace_s)  # a rank torchrun left running, too
    if reason is not None:
        what = {"interrupted": "interrupted (SIGINT, Ctrl-C)", "terminated": "terminated (SIGTERM)",
                "hangup": "the terminal closed (SIGHUP)",
                "timeout": f"the job ran past its timeout of {timeout_s:g} s"}[reason]
        raise PPJobError(reason, f"{what}: stopped {stopped} process(es) of the job (torchrun and its ranks); "
                                 f"{where}", None, stopped, log_path)
    if proc.returncode < 0:
        raise PPJobError("torchrun_died", f"torchrun died ({_signal_name(-proc.returncode)}) before the job "
                                          f"finished: stopped the {stopped} process(es) it left; {where}",
                         proc.returncode, stopped, log_path)
    if proc.returncode != 0:
        raise PPJobError("failed", f"torchrun failed (exit {proc.returncode}); {where}; its last lines:",
                         proc.returncode, stopped, log_path, _tail(log_path, 6000))
    try:
        with open(out_path) as f:
            report = json.load(f)
    except (OSError, ValueError) as exc:
        raise PPJobError("no_report", f"torchrun exited 0 but the report {out_path} cannot be read ({exc}); "
                                      f"{where}; its last lines:", 0, stopped, log_path, _tail(log_path, 6000)) from exc
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The entry point each rank runs (``torchrun -m autosched.pp.runtime --config JSON --out PATH``)."""
    parser = argparse.ArgumentParser(prog="autosched.pp.runtime")
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    data = json.loads(args.config)
    data["microbatches"] = tuple(data.get("microbatches", ()))
    data["schedules"] = tuple(data.get("schedules", ()))
    run_rank(PPRunConfig(**data), args.out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
