"""What each rank of ``swpipe pp``'s torchrun job runs: every schedule and the searched one on the model, beside
swpipe's prediction.

Built on the public API only (:mod:`swpipe.pp` and ``torch.distributed.pipelining``).
Each rank (:func:`run_rank`):

1. loads the model (:func:`~swpipe.commands.pp_model.load_model`: the ``--model`` factory,
   or the built-in MLP) and cuts it into the stage counts PyTorch's schedules run on
   these ranks (one stage per rank for GPipe and 1F1B, two for the others) that it offers;
2. measures every stage's costs in its own process while the other ranks do the same
   (:func:`~swpipe.pp.measure_stage_costs`: the cores as busy as during the run; with more
   ranks than cores, at most as many ranks at once as there are cores, :func:`prediction_cores`), the
   link on the job's gloo group (:func:`~swpipe.pp.measure_p2p`: the idle link, and what
   a post costs while both ranks compute, at the largest activation's size), and the
   runtime's own cost per action, by running every stage alone (``ScheduleLoopedBFS`` on a
   one-rank group) against the prediction, and what a custom order's path adds per action (per stage
   count, 1F1B's or Interleaved1F1B's order run by PyTorch's class and by :func:`~swpipe.pp.schedule_for`'s path
   for a custom order, in paired rounds: the library's :class:`~swpipe.pp.CustomPathProbe`, what
   :func:`~swpipe.pp.calibrate_pp` measures too): before the runs, once in every round of them
   and after them (a shared machine's load moves within seconds); each figure's median; then, per stage count,
   each correction (the runtime's cost per action, the post cost) is kept only where it predicts that count's
   probe's steps by PyTorch's own class better than without it (:func:`~swpipe.pp.check_pp_corrections`): for the
   search, its steps before the runs; for the runs' predictions (the report's ``corrections``), only its steps in
   their rounds, the conditions the rows ran in, the post cost fitted on every other one
   (:func:`~swpipe.pp.fitted_post_s`) and the corrections judged on the rest;
3. rank 0 searches a schedule on the costs measured before the runs
   (:func:`~swpipe.pp.pp_search`; a custom order predicted with its path's cost per action, and chosen
   only where predicted faster than PyTorch's best by more than the prediction's largest error on the
   held-out steps, :func:`~swpipe.pp.held_out_error_pct`, the search's ``margin_pct``): one of
   PyTorch's is run by its own class, a custom order is written as the compute-only CSV every rank
   reads back (:func:`~swpipe.pp.read_csv`, PyTorch's loader) and runs with :func:`~swpipe.pp.schedule_for`;
4. every schedule trains the same initial weights (SGD), in rounds (each schedule one step
   per round, so all share the machine's swings; each round starts one schedule later,
   :func:`round_order`): each rank times ``schedule.step`` after a
   barrier (the step is the slowest rank's) and its split into compute, posting and waiting
   (:class:`~swpipe.pp.RollingStepCosts`); then one more step counts the peak live tensor
   bytes (:class:`~swpipe.pp.LiveTensorBytes`). The losses are compared with the unsplit
   model's, trained the same way on rank 0, and every schedule is predicted
   (:func:`swpipe.simulate`) on the costs of step 2; with more ranks than cores, on the cores
   the ranks share (``cores=``: the ranks take turns on them).

Rank 0 writes the report (a dict, as JSON) that :mod:`swpipe.commands.pp` prints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from swpipe.commands.pp_model import BUILTIN_MODEL, PPModel, load_model

__all__ = ["PPRunConfig", "prediction_cores", "round_order", "run_rank", "main"]


@dataclass
class PPRunConfig:
    """What :func:`~swpipe.commands.pp_launch.launch` runs.

    Attributes
    ----------
    model : str
        The factory, ``"pkg.module:factory"`` (default: the built-in MLP).
    model_options : dict
        Keywords the factory is called with (the built-in's ``width``, ``depth``, ``batch``).
    model_root : str
        The folder the factory's package was imported from, put on the ranks' ``PYTHONPATH``.
    microbatches : tuple of int
    schedules : tuple of str
        PyTorch's schedules to run (empty: every one this torch has that the model runs).
    steps, warmup : int
        Timed steps per schedule, after untimed ones.
    search : bool
        Also search a schedule and run it from its CSV.
    memory_cap_bytes : int or None
        The search's cap per rank.
    threads : int
        ``torch.set_num_threads`` on every rank (and for the cost measurement).
    cost_repeats : int
    time_limit_s : float
        The search's time limit.
    cores : int or None
        The cores the ranks share, for the prediction (``simulate(..., cores=)``) and the measurements (at most
        that many ranks measure at once); None: :func:`prediction_cores` decides.
    """

    model: str = BUILTIN_MODEL
    model_options: Dict[str, Any] = field(default_factory=dict)
    model_root: str = ""
    microbatches: Tuple[int, ...] = (4, 8)
    schedules: Tuple[str, ...] = ()
    steps: int = 8
    warmup: int = 2
    search: bool = True
    memory_cap_bytes: Optional[int] = None
    threads: int = 1
    cost_repeats: int = 7
    time_limit_s: float = 5.0
    cores: Optional[int] = None

    def load(self) -> PPModel:
        """A fresh model (the factory called again: the same initial weights every time)."""
        return load_model(self.model, self.model_options)


def prediction_cores(world: int, cpu_count: int, given: Optional[int] = None) -> Optional[int]:
    """The core pool the job's prediction gives its ranks: ``given``, else the machine's cores when the ranks
    outnumber them (they take turns on the cores), else None (a core per rank, the simulator without a pool).

    Examples
    --------
    >>> prediction_cores(2, 2), prediction_cores(4, 2), prediction_cores(4, 16), prediction_cores(2, 16, given=1)
    (None, 2, None, 1)
    """
    if given is not None:
        return given
    return cpu_count if world > cpu_count else None


def _in_turns(cores: Optional[int], work: Callable[[], Any]) -> Any:
    """``work()`` on every rank, at most ``cores`` ranks at once (all at once when None): a rank's measurement sees
    the cores as busy as the prediction assumes (each computing rank on a core of its own), not more."""
    import torch.distributed as dist

    if cores is None:
        return work()
    rank, world = dist.get_rank(), dist.get_world_size()
    out = None
    for turn in range(-(-world // cores)):
        if rank // cores == turn:
            out = work()
        dist.barrier()
    return out


def round_order(items: Sequence[Any], round_index: int) -> List[Any]:
    """The order the schedules step in round ``round_index``: each round starts one later, so every schedule runs
    in every place after the costs' measurements between rounds (the steps right after them ran slower: the same
    1F1B order measured 53 ms second in every round and 45 ms last).

    Examples
    --------
    >>> [round_order("abc", r) for r in range(4)]
    [['a', 'b', 'c'], ['b', 'c', 'a'], ['c', 'a', 'b'], ['a', 'b', 'c']]
    """
    k = round_index % len(items) if items else 0
    return list(items[k:]) + list(items[:k])


def _reference_losses(cfg: PPRunConfig, n_mb: int, n_steps: int) -> List[float]:
    """The unsplit model trained the same way: per step, the mean of the micro-batches' losses."""
    import torch

    model = cfg.load()
    whole = model.model if model.model is not None else torch.nn.Sequential(*model.stages)
    opt = torch.optim.SGD(whole.parameters(), lr=model.lr)
    out = []
    xs, ys = model.microbatches(n_mb)
    for _ in range(n_steps):
        opt.zero_grad(set_to_none=False)
        total = sum(model.loss_fn(whole(x), y) for x, y in zip(xs, ys)) / n_mb
        total.backward()
        opt.step()
        out.append(float(total.detach()))
    return out


def _measure_costs(cfg: PPRunConfig, n_stages: int, n_mb: int, repeats: int, warmup: int) -> Tuple[Any, ...]:
    from swpipe.pp import measure_stage_costs

    model = cfg.load()
    xs, ys = model.microbatches(n_mb)
    return measure_stage_costs(model.cut(n_stages), xs[0], ys[0], model.loss_fn, repeats=repeats, warmup=warmup)


def _costs_on_every_rank(cfg: PPRunConfig, n_mb: int, splits: Sequence[int], repeats: Optional[int] = None,
                         warmup: int = 1) -> Dict[int, List[Any]]:
    """Every rank measures every stage at once (the cores as busy as in the run; with more ranks than cores, as
    many at once as the prediction's cores); all ranks' figures."""
    import torch.distributed as dist

    mine = _in_turns(cfg.cores, lambda: {k: _measure_costs(cfg, k, n_mb, repeats or cfg.cost_repeats, warmup)
                                         for k in splits})
    gathered: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {k: [g[k] for g in gathered] for k in mine}


def _combine(samples: List[Tuple[Any, ...]], p2p: Any, mb: int, note: str) -> Any:
    """Per stage and field, the median over every rank's and pass's measurement."""
    from swpipe.pp import PPCosts, StageCost

    stages = []
    for s in range(len(samples[0])):
        values = {}
        for f in fields(StageCost):
            vals = [getattr(sample[s], f.name) for sample in samples]
            med = statistics.median(vals)
            values[f.name] = int(med) if f.type in ("int", int) else med
        stages.append(StageCost(**values))
    return PPCosts(tuple(stages), p2p, mb, note)


class _Trainer:
    """One schedule on this rank: its stages, its optimizer, its step times and their split (compute, posting,
    waiting: :class:`~swpipe.pp.RollingStepCosts`), losses and memory peak."""

    def __init__(self, name: str, program: Any, cfg: PPRunConfig, n_mb: int, rank: int) -> None:
        import torch
        from torch.distributed.pipelining import PipelineStage

        from swpipe.pp import RollingStepCosts

        self.name, self.program, self.n_mb = name, program, n_mb
        self.model = cfg.load()
        modules = self.model.cut(program.n_stages)
        mine = [s for s in range(program.n_stages) if program.stage_to_rank[s] == rank]
        stages = [PipelineStage(modules[s], s, program.n_stages, torch.device("cpu")) for s in mine]
        self.schedule = program.torch_schedule(stages, self.model.loss_fn)
        self.opt = torch.optim.SGD([p for s in mine for p in modules[s].parameters()], lr=self.model.lr)
        self.first, self.last = 0 in mine, program.n_stages - 1 in mine
        self.times: List[float] = []
        self.losses: List[float] = []
        self.peak = 0
        # the timed steps' split on this rank (compute, posting, waiting), entered around the rounds; the window
        # holds every timed step
        self.timing = RollingStepCosts(self.schedule, stages, window=max(1, cfg.steps))

    def step(self, timed: bool = False, memory: bool = False) -> None:
        import torch.distributed as dist

        from swpipe.pp import LiveTensorBytes

        args = (self.model.batch,) if self.first else ()
        kwargs: Dict[str, Any] = {"target": self.model.target} if self.last else {}
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

    def gather(self, world: int) -> Dict[str, Any]:
        import torch.distributed as dist

        gathered: List[Any] = [None] * world
        split = self.timing.split()
        dist.all_gather_object(gathered, {"rank": dist.get_rank(), "times": self.times, "peak": self.peak,
                                          "losses": self.losses if self.last else None,
                                          "split": asdict(split) if split is not None else None})
        step_times = [max(g["times"][i] for g in gathered) for i in range(len(self.times))]
        loss_rows = [g["losses"] for g in gathered if g["losses"] is not None]
        return {"step_times": step_times, "peak_bytes": {g["rank"]: g["peak"] for g in gathered},
                "losses": loss_rows[0] if loss_rows else [],
                "split_by_rank": {g["rank"]: g["split"] for g in gathered if g["split"] is not None}}


class _AloneProbe:
    """Every stage of a split on this rank alone: what the runtime adds per compute action, against the model.

    ``ScheduleLoopedBFS`` over all the split's stages on a one-rank group (no transfers);
    :meth:`overhead_s` is ``(median measured step - simulated step) / compute actions``,
    at least 0.
    """

    def __init__(self, cfg: PPRunConfig, n_mb: int, n_stages: int, group: Any) -> None:
        import torch
        from torch.distributed.pipelining import PipelineStage

        from swpipe.pp import pp_program

        self.model = cfg.load()
        modules = self.model.cut(n_stages)
        stages = [PipelineStage(modules[s], s, n_stages, torch.device("cpu"), group=group) for s in range(n_stages)]
        self.program = pp_program("LoopedBFS", 1, n_mb, stages_per_rank=n_stages)
        self.schedule = self.program.torch_schedule(stages, self.model.loss_fn)
        self.opt = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=self.model.lr)
        self.n_stages = n_stages
        self.times: List[float] = []
        for _ in range(cfg.warmup):
            self.step(timed=False)

    def step(self, timed: bool = True) -> None:
        self.opt.zero_grad(set_to_none=False)
        t0 = time.perf_counter()
        self.schedule.step(self.model.batch, target=self.model.target, losses=[], return_outputs=False)
        if timed:
            self.times.append(time.perf_counter() - t0)
        self.opt.step()

    def overhead_s(self, costs: Any) -> float:
        from swpipe import simulate

        predicted = simulate(self.program, costs.with_action_overhead(0.0)).period_s
        return max(0.0, (statistics.median(self.times) - predicted) / len(self.program.compute[0]))


def _path_probes(cfg: PPRunConfig, splits: Sequence[int]) -> Dict[int, Dict[int, Any]]:
    """Per micro-batch count, a :class:`~swpipe.pp.CustomPathProbe` per stage count, each on a fresh model cut into
    those stages (1F1B's order with one stage per rank, Interleaved1F1B's with several), warmed up; a count whose
    order does not run (too few micro-batches) is left out. Every rank calls it."""
    from swpipe.pp import CustomPathProbe, PPError

    out: Dict[int, Dict[int, Any]] = {}
    for n in cfg.microbatches:
        out[n] = {}
        for k in splits:
            fresh = cfg.load()
            xs, ys = fresh.microbatches(n)
            try:
                out[n][k] = CustomPathProbe(fresh.cut(k), xs[0], ys[0], fresh.loss_fn, n_microbatches=n,
                                            warmup=cfg.warmup)
            except PPError:
                pass
    return out


def _checked_costs(by_split: Dict[int, Any], probes: Dict[int, Any], n_mb: int, world: int, cores: Optional[int],
                   fit_post: bool = False) -> Tuple[Dict[int, Any], List[Any], Dict[int, List[float]]]:
    """Every split's costs with the custom path's cost per action its probe measured, and with each correction kept
    only where it predicts that probe's steps by PyTorch's own class better than without
    (:func:`~swpipe.pp.check_pp_corrections`, decided per stage count: a correction right for 2 stages may be wrong
    for 4, whose schedules post twice the transfers); every rank calls it. A split without a probe (too few
    micro-batches for its order) has nothing to check its corrections: none is kept. ``fit_post``: the post cost
    fitted on half the probe's steps, judged on the other half (``check_pp_corrections``' ``fit_post``). Also
    returns, per split, the held-out steps (the slowest rank's, seconds)."""
    from swpipe.pp import check_pp_corrections, pp_program

    out: Dict[int, Any] = {}
    decisions: List[Any] = []
    held: Dict[int, List[float]] = {}
    for k, costs in sorted(by_split.items()):
        result = probes[k].result() if k in probes else None
        # without a probe no step judges a program: any that runs on these stages does
        program = result.program if result else pp_program("GPipe", world, n_mb, None if k == world else k // world)
        kept, decided = check_pp_corrections(costs, program, result.builtin_steps_s if result else (), cores=cores,
                                             key=f"{n_mb} mb, {k} stages", fit_post=fit_post)
        out[k] = replace(kept, custom_overhead_s=result.overhead_s if result else 0.0)
        decisions.extend(decided)
        held[k] = list(result.builtin_steps_s) if result else []
    return out, decisions, held


def _median_on_every_rank(mine: float) -> float:
    import torch.distributed as dist

    gathered: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return statistics.median(gathered)


def _median_link(links: List[Any]) -> Any:
    """Each figure's median over links measured at several times (the load moves between them)."""
    from dataclasses import replace

    return replace(links[0], latency_s=statistics.median(k.latency_s for k in links),
                   seconds_per_byte=statistics.median(k.seconds_per_byte for k in links),
                   post_s=statistics.median(k.post_s for k in links))


class _HeldOutSteps:
    """Every stage count's :class:`~swpipe.pp.CustomPathProbe` stepped as one more schedule of the runs' rounds."""

    def __init__(self, paths: Dict[int, Any]) -> None:
        self.paths = paths

    def step(self, timed: bool = True) -> None:  # a schedule's signature: the probe's steps are always timed
        for path in self.paths.values():
            path.round()


class _Calibration:
    """The costs measured again in every round of the runs, so that they share the runs' load.

    On a shared machine the load moves within seconds; figures measured only before the
    runs predict another machine. Each round every rank measures its stages once, runs
    the :class:`_AloneProbe` once and the link once; the prediction takes each figure's
    median over the rounds and the measurements before and after them.
    """

    def __init__(self, cfg: PPRunConfig, n_mb: int, splits: Sequence[int], probe: _AloneProbe,
                 busy_bytes: int, paths: Dict[int, Any]) -> None:
        self.cfg, self.n_mb, self.splits, self.busy_bytes = cfg, n_mb, splits, busy_bytes
        self.probe, self.paths = probe, paths
        probe.times.clear()  # its steps from now on, in the rounds
        for path in paths.values():  # and the held-out steps too: those before the runs fell on other conditions
            path.drop_rounds()
        self.samples: Dict[int, List[Any]] = {k: [] for k in splits}
        self.links: List[Any] = []
        #: the probes' held-out steps, one more schedule of each round (their steps judge the rows' corrections)
        self.held_out = _HeldOutSteps(paths)
        #: every split's costs with every correction kept, unchecked (set by :meth:`costs`): the report's comparison
        self.unchecked: Dict[int, Any] = {}
        #: per split, the held-out steps that judged its corrections (set by :meth:`costs`)
        self.held_out_steps: Dict[int, List[float]] = {}

    def round(self) -> None:
        from swpipe.pp import measure_p2p

        for k, v in _costs_on_every_rank(self.cfg, self.n_mb, self.splits, repeats=2, warmup=0).items():
            self.samples[k].extend(v)
        _in_turns(self.cfg.cores, self.probe.step)
        self.links.append(measure_p2p(repeats=4, busy_bytes=self.busy_bytes))

    def costs(self, before: Dict[int, List[Any]], after: Dict[int, List[Any]], links: List[Any]
              ) -> Tuple[Dict[int, Any], float, float, List[Any]]:
        """Every split's costs (the runtime's overhead per action, the post cost and a custom order's path's, each
        correction kept where the held-out steps say so), those two overheads as measured, and the corrections'
        decisions; every rank calls it."""
        import torch.distributed as dist

        link = _median_link(links + self.links)
        samples = self.cfg.load().samples
        costs = {k: _combine(before[k] + self.samples[k] + after[k], link, samples // self.n_mb,
                             "before, during and after the runs") for k in before}
        overhead = _median_on_every_rank(self.probe.overhead_s(costs[self.probe.n_stages]))
        # the path probe's steps in every round: the held-out steps that judge the rows' corrections
        self.unchecked = {k: c.with_action_overhead(overhead) for k, c in costs.items()}
        # the post cost fitted on half the rounds' held-out steps: a post inside the steps costs what the wake-ups
        # and gloo's threads take from the cores, which the busy exchange of two ranks alone does not see
        checked, decisions, self.held_out_steps = _checked_costs(self.unchecked, self.paths, self.n_mb,
                                                                 dist.get_world_size(), self.cfg.cores, fit_post=True)
        return checked, overhead, {k: c.custom_overhead_s for k, c in checked.items()}, decisions


def _noise(values: Sequence[float]) -> float:
    """The interquartile range over the median (the range, under 4 values): the run's own spread."""
    if len(values) < 2:
        return float("nan")
    if len(values) < 4:
        return (max(values) - min(values)) / statistics.median(values)
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / statistics.median(values)


def _search(cfg: PPRunConfig, costs: Dict[int, Dict[int, Any]], world: int, margin_pct: float) -> Dict[str, Any]:
    """Rank 0 searches (a custom order only where predicted faster than PyTorch's best by more than
    ``margin_pct``); every rank gets the CSV and what was found."""
    import torch.distributed as dist

    from autosched.pp.search import pp_search
    from swpipe import Constraints, SolverOptions

    box: List[Any] = [None]
    if dist.get_rank() == 0:
        found = pp_search(costs[cfg.microbatches[0]], world, list(cfg.microbatches),
                          constraints=Constraints(max_memory_bytes=cfg.memory_cap_bytes), costs_for_microbatches=costs,
                          solver=SolverOptions(time_limit_s=cfg.time_limit_s, cpsat_max_tasks=64),
                          margin_pct=margin_pct)
        best = found.best  # one of PyTorch's schedules where no custom order is predicted faster, its path included
        # what the search predicted is on the costs measured before the runs: the report's rows predict every
        # schedule again on the costs of the whole run, and the command's summary reads those rows only
        box[0] = {"csv": best.program.csv_text(), "n_mb": best.program.n_microbatches,
                  "n_stages": best.program.n_stages, "origin": best.origin,
                  "builtin": best.program.schedule if best.program.source == "pytorch" else None,
                  "search_step_s": best.result.step_s, "bound_s": found.bound_s,
                  "cpsat": [asdict(run) for run in found.cpsat], "cut": found.cut,
                  "not_tried": list(found.not_tried), "elapsed_s": found.elapsed_s, "margin_pct": margin_pct,
                  "time_limit_s": found.time_limit_s}
    dist.broadcast_object_list(box, src=0)
    return box[0]


def run_rank(cfg: PPRunConfig, out_path: Optional[str]) -> Optional[Dict[str, Any]]:
    """One rank's side of the job (the process group is set up here); rank 0 returns and writes the report."""
    import torch
    import torch.distributed as dist

    from swpipe import simulate
    from swpipe.pp import held_out_error_pct, measure_p2p, pp_program, read_csv

    torch.set_num_threads(cfg.threads)
    dist.init_process_group("gloo", timeout=timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    # in torchrun's output (launch's log_path): which processes the job is, once each has joined the group
    print(f"rank {rank} of {world}: in the process group (pid {os.getpid()})", flush=True)
    try:
        cfg = replace(cfg, cores=prediction_cores(world, os.cpu_count() or 1, cfg.cores))
        model = cfg.load()
        splits = model.stage_counts(world)
        alone = [dist.new_group([r]) for r in range(world)]  # every rank creates every group, in the same order
        samples = {n: _costs_on_every_rank(cfg, n, splits) for n in cfg.microbatches}
        # the busy exchange at the size of the largest activation sent (the fewest micro-batches: the largest)
        busy = max(c.output_bytes for by in samples[min(cfg.microbatches)].values() for c in by[0])
        p2p = measure_p2p(repeats=20, busy_bytes=busy)
        costs = {n: {k: _combine(v, p2p, model.samples // n, "before the runs") for k, v in by.items()}
                 for n, by in samples.items()}
        probes = {n: _AloneProbe(cfg, n, max(splits), alone[rank]) for n in cfg.microbatches}
        for n, probe in probes.items():
            for _ in range(max(3, cfg.cost_repeats)):
                _in_turns(cfg.cores, probe.step)
        overhead = {n: _median_on_every_rank(probes[n].overhead_s(costs[n][max(splits)])) for n in cfg.microbatches}
        # what a custom order's path costs (for the search), and PyTorch's own class's steps on the same stages:
        # the held-out steps that decide whether each correction is kept
        paths = _path_probes(cfg, splits)
        for _ in range(max(3, cfg.cost_repeats)):
            for by_split in paths.values():
                for path in by_split.values():
                    path.round()
        # the search's costs keep the busy exchange's post cost: halves of these few steps fit one that moves with the
        # noise (a run's 4-stage costs fitted on 4 steps once made the search pick a schedule that ran 1.5x 1F1B)
        checked = {n: _checked_costs({k: c.with_action_overhead(overhead[n]) for k, c in by.items()}, paths[n], n,
                                     world, cfg.cores) for n, by in costs.items()}
        costs = {n: by for n, (by, _, _) in checked.items()}
        before_search = {n: [asdict(d) for d in decided] for n, (_, decided, _) in checked.items()}
        custom = {n: {k: c.custom_overhead_s for k, c in by.items()} for n, by in costs.items()}
        margin = held_out_error_pct([d for _, decided, _ in checked.values() for d in decided])
        searched = _search(cfg, costs, world, margin) if cfg.search else {}
        results: List[Dict[str, Any]] = []
        corrections: Dict[int, List[Dict[str, Any]]] = {}
        held_out: Dict[int, Dict[int, List[float]]] = {}
        for n_mb in cfg.microbatches:
            programs, refused = model.programs(world, n_mb)
            names = [n for n in (cfg.schedules or tuple(programs)) if n in programs]
            trainers = [_Trainer(n, programs[n], cfg, n_mb, rank) for n in names]
            if searched and searched["n_mb"] == n_mb:
                if searched.get("builtin"):  # PyTorch's own class: no custom order was predicted to beat it
                    program = pp_program(searched["builtin"], world, n_mb, searched["n_stages"] // world)
                else:
                    with tempfile.TemporaryDirectory(prefix="swpipe-pp-") as folder:  # read back by PyTorch's loader
                        path = os.path.join(folder, "searched.csv")
                        with open(path, "w") as f:
                            f.write(searched["csv"])
                        program = read_csv(path, world, searched["n_stages"], n_mb, "swpipe-searched")
                trainers.append(_Trainer("swpipe-searched", program, cfg, n_mb, rank))
            for t in trainers:
                for _ in range(cfg.warmup):
                    t.step()
            calibration = _Calibration(cfg, n_mb, splits, probes[n_mb], busy, paths[n_mb])
            with contextlib.ExitStack() as timing:  # the timed steps' split; entered once, not around each step
                for t in trainers:
                    timing.enter_context(t.timing)
                # rounds: every schedule once per round, so they share the load's swings; the held-out steps too,
                # in the same rotation (stepped right after the measurements below, they ran up to a quarter faster
                # than the same schedule's row on a loaded machine)
                for r in range(cfg.steps):
                    for t in round_order([*trainers, calibration.held_out], r):
                        t.step(timed=True)
                    calibration.round()  # and the costs too
            after = _costs_on_every_rank(cfg, n_mb, splits)
            both, overhead[n_mb], custom[n_mb], decided = calibration.costs(
                samples[n_mb], after, [p2p, measure_p2p(repeats=20, busy_bytes=busy)])
            corrections[n_mb] = [asdict(d) for d in decided]
            held_out[n_mb] = calibration.held_out_steps
            for path in paths[n_mb].values():
                path.close()  # its rounds are counted: the snapshot of its model let go
            for t in trainers:
                t.step(memory=True)
            gathered = [t.gather(world) for t in trainers]
            if rank != 0:
                continue
            costs[n_mb] = both
            ref = _reference_losses(cfg, n_mb, cfg.warmup + cfg.steps + 1)
            for t, measured in zip(trainers, gathered):
                pred = simulate(t.program, both[t.program.n_stages], cores=cfg.cores)
                # beside it, every correction kept unchecked: what the check changed, on the same run
                unchecked = replace(calibration.unchecked[t.program.n_stages],
                                    custom_overhead_s=both[t.program.n_stages].custom_overhead_s)
                err = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(measured["losses"], ref)), default=0.0)
                results.append({
                    "schedule": t.name, "n_microbatches": n_mb, "n_stages": t.program.n_stages,
                    "predicted_step_s": pred.step_s,
                    "predicted_unchecked_step_s": simulate(t.program, unchecked, cores=cfg.cores).step_s,
                    "measured_step_s": statistics.median(measured["step_times"]),
                    "noise": _noise(measured["step_times"]), "step_times_s": measured["step_times"],
                    "predicted_peak_bytes": pred.peak_bytes, "measured_peak_bytes": measured["peak_bytes"],
                    "split_by_rank": measured["split_by_rank"], "predicted_busy_s": pred.busy_s,
                    "predicted_bubble": pred.bubble_fraction, "losses": measured["losses"],
                    "reference_losses": ref, "loss_rel_err": err})
            results.extend({"schedule": n, "n_microbatches": n_mb, "refused": why} for n, why in refused.items()
                           if not cfg.schedules or n in cfg.schedules)
        if rank != 0:
            return None
        report = {"config": asdict(cfg), "world_size": world, "stage_counts": list(splits), "p2p": asdict(p2p),
                  "searched": searched, "action_overhead_s": overhead, "custom_overhead_s": custom,
                  "corrections": corrections, "search_corrections": before_search, "held_out_steps_s": held_out,
                  "costs": {str(n): {str(k): c.to_dict() for k, c in by.items()} for n, by in costs.items()},
                  "results": results, "torch": torch.__version__, "threads": cfg.threads,
                  "load": os.getloadavg(), "cores": os.cpu_count(),
                  "prediction_cores": cfg.cores}
        if out_path:
            with open(out_path, "w") as f:
                json.dump(report, f, indent=1, default=str)
        return report
    finally:
        dist.destroy_process_group()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The entry point each rank runs (``torchrun -m swpipe.commands.pp_job --config JSON --out PATH``)."""
    parser = argparse.ArgumentParser(prog="swpipe.commands.pp_job")
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
