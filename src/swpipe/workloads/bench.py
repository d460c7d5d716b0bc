"""Measure the DLRM workload: the plain serial loop next to each plan, side by side in one run.

Used by ``swpipe demo`` and ``benchmarks/pipelines.py``. Every plan runs on a
fresh workload built from the same seed over the same pre-generated batches;
its losses (or, for eval plans, predictions) are compared bit for bit with the
plain serial loop of :mod:`swpipe.workloads.reference`, and its speed with
that loop's.
"""

from __future__ import annotations

import statistics
import textwrap
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from swpipe_core.plan import PipelinePlan

from swpipe.workloads.agree import all_ranks, check_same_plan, gather
from swpipe.workloads.distenv import DistEnv
from swpipe.workloads.dlrm import DLRMWorkload
from swpipe.workloads.dlrm_data import Batch, DLRMConfig, SyntheticData
from swpipe.workloads.reference import emb_staleness, eval_reference, semi_sync_reference, train_reference
from swpipe.workloads.tasks import EVAL_PIPELINES, plan_for

__all__ = ["PlanSpec", "PlanResult", "Measurement", "default_specs", "measure", "format_table", "noise_pct",
           "parallel_probe", "TORCHREC_PLANS"]

TORCHREC_PLANS = ("base", "pt2", "sparse_dist", "sparse_dist_lite", "fused_sparse_dist", "semi_sync", "prefetch",
                  "eval_sparse_dist", "eval_fused_sparse_dist", "staged", "sparse_dist_comp_autograd")
# Plans also shown with one thread per stream: their side streams carry enough work to overlap.
_BY_STREAM = ("sparse_dist", "fused_sparse_dist", "prefetch", "semi_sync")


@dataclass
class PlanSpec:
    """One row of the comparison: a pipeline (or a plan builder) and an optional thread map.

    Examples
    --------
    >>> from swpipe.workloads.dlrm import init_distributed
    >>> env = init_distributed()
    >>> spec = PlanSpec("prefetch+by_stream", "prefetch", "by_stream")
    >>> plan = spec.plan(DLRMWorkload(DLRMConfig.preset("test"), env))
    >>> plan.sched("EmbPrefetch").thread_group, spec.is_eval
    ('prefetch', False)
    >>> env.close()
    """

    label: str
    pipeline: str
    thread_map: Optional[str] = None
    options: Dict[str, Any] = field(default_factory=dict)
    build: Optional[Callable[[DLRMWorkload], PipelinePlan]] = None
    note: str = ""
    same_as: Optional[str] = None  # the label of a row running the same schedule: measured once, shown twice
    predicted_speedup: Optional[float] = None  # a searched row: the model's speedup over the serial plan
    predicts: Dict[str, float] = field(default_factory=dict)  # the model's speedups of other rows, by label
    story: List[str] = field(default_factory=list)  # lines under the table about this row (the search's)

    def plan(self, workload: DLRMWorkload) -> PipelinePlan:
        """The runnable plan on ``workload``."""
        from swpipe_core.engine.workers import with_thread_map

        plan = self.build(workload) if self.build is not None else plan_for(self.pipeline, workload, **self.options)
        return with_thread_map(plan, self.thread_map) if self.thread_map else plan

    @property
    def is_eval(self) -> bool:
        """Whether the pipeline is an inference pipeline (compared with the eval loop)."""
        return self.pipeline in EVAL_PIPELINES


@dataclass
class PlanResult:
    """A measured row; ``matches`` is None when there was nothing to compare.

    ``matches``: bit-identical to the serial loop in every round. ``close``:
    within ``rtol=1e-5, atol=1e-6`` (what a compiled plan can promise, since
    inductor reorders float ops).

    Examples
    --------
    >>> PlanResult("base", 2, 2, 1, 80.0, 1.05, True).speedup
    1.05
    """

    label: str
    depth: int
    streams: int
    thread_groups: int
    iters_per_s: float
    speedup: float
    matches: Optional[bool]
    note: str = ""
    seconds: float = 0.0
    close: Optional[bool] = None
    predicted_speedup: Optional[float] = None
    paired_speedup: Optional[float] = None  # median over rounds of (serial loop / this row) in the same round
    spread_pct: Optional[float] = None  # its runs' (slowest - fastest) / median, in percent: run-to-run noise

    @property
    def measured_speedup(self) -> float:
        """The speedup a prediction is checked against: :attr:`paired_speedup` when known, else the table's."""
        return self.paired_speedup if self.paired_speedup is not None else self.speedup

    @property
    def prediction_error_pct(self) -> Optional[float]:
        """The predicted period's error against this row's, once rescaled by the serial runs of the same rounds.

        The model's serial and plan periods give a predicted speedup; the
        serial loop measured beside this row turns it into a period
        (``serial / predicted_speedup``), compared with the row's measured
        period: ``100 * (measured speedup / predicted_speedup - 1)``, the
        measured speedup paired by round (:attr:`paired_speedup`) when known,
        else the table's. How fast the machine ran when the costs were taken
        cancels out. None without a prediction.

        Examples
        --------
        >>> round(PlanResult("auto", 2, 1, 2, 80.0, 1.2, True, predicted_speedup=1.25).prediction_error_pct, 6)
        -4.0
        >>> round(PlanResult("auto", 2, 1, 2, 80.0, 1.2, True, predicted_speedup=1.25,
        ...                  paired_speedup=1.3).prediction_error_pct, 6)
        4.0
        """
        measured = self.measured_speedup
        if not self.predicted_speedup or not measured == measured:  # none, or a NaN speedup
            return None
        return 100.0 * (measured / self.predicted_speedup - 1.0)


@dataclass
class Measurement:
    """All rows of one run plus the serial baselines and the best plan's timeline.

    Examples
    --------
    >>> Measurement(75.0, None, []).best_label is None
    True
    """

    serial_iters_per_s: float
    eval_serial_iters_per_s: Optional[float]
    rows: List[PlanResult]
    best_label: Optional[str] = None
    best_timeline: List[Any] = field(default_factory=list)
    meta: Dict[str, Any] = field(default_factory=dict)


def default_specs(names: Sequence[str] = TORCHREC_PLANS, by_stream: bool = True,
                  compile_backend: Optional[str] = None) -> List[PlanSpec]:
    """One spec per TorchRec pipeline (as TorchRec threads it) plus ``+by_stream`` variants.

    Parameters
    ----------
    names : sequence of str
        Pipeline names of ``swpipe_core.pipelines``.
    by_stream : bool
        Add ``<name>+by_stream`` (one thread group per stream) for the plans
        whose side streams carry work worth overlapping.
    compile_backend : str, optional
        ``torch.compile`` backend for ``pt2`` and compiled-autograd backend for
        ``sparse_dist_comp_autograd``; ``None`` runs them eager.

    Returns
    -------
    list of PlanSpec

    Examples
    --------
    >>> [s.label for s in default_specs(["base", "sparse_dist"])]
    ['base', 'sparse_dist', 'sparse_dist+by_stream']
    """
    specs = []
    for name in names:
        opts: Dict[str, Any] = {}
        note = ""
        if name == "pt2":
            opts["compile_backend"] = compile_backend
            note = (f"torch.compile({compile_backend}); rate includes compiling (a fresh model per run)"
                    if compile_backend else "eager (no torch.compile)")
        elif name == "sparse_dist_comp_autograd":
            opts["compiled_autograd"] = compile_backend
            note = (f"compiled autograd ({compile_backend}); rate includes compiling"
                    if compile_backend else "eager (no compiled autograd)")
        specs.append(PlanSpec(name, name, None, opts, note=note))
        if by_stream and name in _BY_STREAM:
            specs.append(PlanSpec(f"{name}+by_stream", name, "by_stream", dict(opts), note="one thread per stream"))
    return specs


def parallel_probe(threads: int = 2, repeats: int = 3) -> float:
    """How much faster ``threads`` threads of GIL-free work run together than one after another.

    The ceiling for any multi-thread plan on this machine right now: about
    ``threads`` on idle cores, about 1 when other processes hold the cores.
    It is the calibration's own figure (:func:`swpipe_core.measure.calibrate.measure_cores`,
    what the search's pool of cores is sized from), best of ``repeats``.

    Examples
    --------
    >>> 1.0 <= parallel_probe(threads=2, repeats=1) <= 2.0
    True
    """
    from swpipe_core.measure.calibrate import measure_cores

    return max(measure_cores(threads=threads)[0] for _ in range(repeats))


def _close(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(a, b))


def _compare(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def measure(config: DLRMConfig, env: DistEnv, specs: Sequence[PlanSpec], iters: int = 40, repeats: int = 2,
            warmup: int = 4, progress: bool = False, record_best: bool = True, race_rounds: int = 0,
            race_band_pct: float = 10.0) -> Measurement:
    """Run the serial loop and every spec on the same batches; rate, speedup and equality per row.

    Each run (serial or plan) is repeated ``repeats`` times on a fresh
    workload and the fastest counts (the machine is shared; the minimum is
    the least disturbed). All ranks must call this with the same arguments; every rank gets the
    same result: a row matches only if it matches on every rank, a run lasts as long as its
    slowest rank, and each plan is checked to be the same on every rank before it runs.

    A spec whose ``same_as`` names another spec's label runs that spec's
    schedule (e.g. the auto plan when the search kept a hand-written seed): it
    is not run again, and its row shows that row's runs and checks. Two runs
    of one plan differ here by up to 10 %, which two rows would otherwise
    show as a difference between the plans.

    Racing: a machine's speed drifts by more than the plans at the top differ
    (two rows of one plan can read 10 % apart after three rounds), so the
    training rows whose fastest run is within ``race_band_pct`` of the
    fastest row's run ``race_rounds`` more rounds among themselves, with the
    serial loop, and their minimum is taken over all their runs. Measurement
    time goes where the ranking is in doubt. ``meta["raced"]`` lists them and
    ``meta["runs"]`` counts every row's runs.

    Parameters
    ----------
    config : DLRMConfig
    env : DistEnv
    specs : sequence of PlanSpec
    iters : int
        Batches per run.
    repeats : int
    warmup : int
        Serial iterations run first and discarded (allocator, lazy init).
    progress : bool
        tqdm bar over the runs.
    record_best : bool
        Re-run the fastest plan with ``record_timeline=True`` for a trace.
    race_rounds : int
        Extra rounds for the training rows within ``race_band_pct`` of the fastest (0: none).
    race_band_pct : float
        How close to the fastest row's best run a row must be to race, in percent.

    Returns
    -------
    Measurement

    Raises
    ------
    ValueError
        If ``iters < 1``, ``repeats < 1``, ``race_rounds < 0`` or ``race_band_pct < 0``.

    Examples
    --------
    >>> from swpipe.workloads.dlrm import init_distributed
    >>> env = init_distributed()
    >>> m = measure(DLRMConfig.preset("test"), env, default_specs(["sparse_dist"]), iters=3, repeats=1,
    ...             record_best=False)
    >>> [(r.label, r.matches) for r in m.rows], m.serial_iters_per_s > 0
    ([('sparse_dist', True), ('sparse_dist+by_stream', True)], True)
    >>> env.close()
    """
    from swpipe_core.engine.pipeline import SWPipeline

    if iters < 1 or repeats < 1 or race_rounds < 0 or race_band_pct < 0:
        raise ValueError(f"measure: iters and repeats must be >= 1, race_rounds and race_band_pct >= 0; got "
                         f"iters={iters}, repeats={repeats}, race_rounds={race_rounds}, race_band_pct={race_band_pct}")
    # pinned on CUDA, once here: every round reuses these batches, and the H2D task must not pay for it
    data = SyntheticData(config, env.world_size, env.rank, device=env.device)
    batches = data.batches(iters)
    train_reference(DLRMWorkload(config, env), data.batches(warmup, start=iters))
    shared = _twins(specs)
    measured = [s for s in specs if s.label not in shared]
    runs = _folded(env, _run_rounds(config, env, measured, batches, range(repeats), progress))
    raced = _contenders(measured, runs, race_band_pct) if race_rounds else []
    if len(raced) > 1:  # decided on the folded times: every rank races the same rows
        extra = _folded(env, _run_rounds(config, env, raced, batches, range(repeats, repeats + race_rounds),
                                         progress))
        runs.serial_s += extra.serial_s
        for label, times in extra.times.items():
            runs.times[label] += times
            runs.matches[label] = runs.matches[label] and extra.matches[label]
            runs.close[label] = runs.close[label] and extra.close[label]
    for label, twin in shared.items():  # the same schedule: its row's runs and checks
        runs.times[label], runs.plans[label] = list(runs.times[twin]), runs.plans[twin]
        runs.matches[label], runs.close[label] = runs.matches[twin], runs.close[twin]
    serial_rate = iters / min(runs.serial_s)
    eval_rate = iters / min(runs.eval_s) if runs.eval_s else None
    rows = _rows(config, env, specs, batches, runs, serial_rate, eval_rate)
    result = Measurement(serial_rate, eval_rate, rows, meta=dict(iters=iters, repeats=repeats,
                                                                  world_size=env.world_size,
                                                                  num_threads=torch.get_num_threads(),
                                                                  parallel_probe=parallel_probe(),
                                                                  raced=[s.label for s in raced] if len(raced) > 1
                                                                  else [], race_rounds=race_rounds,
                                                                  race_band_pct=race_band_pct,
                                                                  runs={k: len(v) for k, v in runs.times.items()}))
    train_rows = [r for r, s in zip(rows, specs) if not s.is_eval]
    if train_rows:
        best = max(train_rows, key=lambda r: r.measured_speedup)  # the speedup the table shows
        result.best_label = best.label
        if record_best:
            spec = next(s for s in specs if s.label == best.label)
            wl = DLRMWorkload(config, env)
            with SWPipeline(spec.plan(wl), device=env.device, record_timeline=True, state=wl.state) as pipe:
                pipe.run(iter(batches))
                result.best_timeline = list(pipe.timeline)
    return result


@dataclass
class _Runs:
    """What the rounds of :func:`measure` measured on this rank."""

    serial_s: List[float] = field(default_factory=list)
    eval_s: List[float] = field(default_factory=list)
    times: Dict[str, List[float]] = field(default_factory=dict)
    matches: Dict[str, bool] = field(default_factory=dict)
    close: Dict[str, bool] = field(default_factory=dict)
    plans: Dict[str, PipelinePlan] = field(default_factory=dict)
    ref_losses: List[torch.Tensor] = field(default_factory=list)


def _twins(specs: Sequence[PlanSpec]) -> Dict[str, str]:
    """``{label: the other row it shares its runs with}``: the specs whose ``same_as`` names another row here."""
    labels = {s.label for s in specs}
    return {s.label: s.same_as for s in specs if s.same_as in labels and s.same_as != s.label}


def _folded(env: DistEnv, runs: _Runs) -> _Runs:
    """Fold every rank in: a row matches only if it matches on every rank, and each run took as long as
    its slowest rank. Every rank then holds the same figures (and decides alike on them)."""
    folded = _fold_ranks(env, dict(serial_s=runs.serial_s, eval_s=runs.eval_s, times=runs.times,
                                   matches=runs.matches, close=runs.close))
    runs.serial_s, runs.eval_s, runs.times = folded["serial_s"], folded["eval_s"], folded["times"]
    runs.matches, runs.close = folded["matches"], folded["close"]
    return runs


def _contenders(specs: Sequence[PlanSpec], runs: _Runs, band_pct: float) -> List[PlanSpec]:
    """The training specs whose fastest run is within ``band_pct`` of the fastest training spec's."""
    from autosched.verify.measure import within_band

    near = set(within_band({s.label: min(runs.times[s.label]) for s in specs if not s.is_eval}, band_pct))
    return [s for s in specs if s.label in near]


def _run_rounds(config: DLRMConfig, env: DistEnv, specs: Sequence[PlanSpec], batches: List[Batch],
                rounds: Sequence[int], progress: bool) -> _Runs:
    """The serial loop (and the eval loop) and every spec, once per round, each on a fresh workload."""
    from autosched.verify.measure import turned
    from swpipe_core.engine.pipeline import SWPipeline

    iters = len(batches)
    need_eval = any(s.is_eval for s in specs)
    bar = _bar(len(rounds) * (1 + int(need_eval) + len(specs)), progress and env.rank == 0)
    runs = _Runs(times={s.label: [] for s in specs}, matches={s.label: True for s in specs},
                 close={s.label: True for s in specs})
    ref_preds: List[torch.Tensor] = []
    # Rounds outermost: every row is measured once per round, so a burst of load on the shared
    # machine disturbs one sample of every row rather than all samples of one row. The plans' order
    # turns by one each round, so no row always runs last in a round (after the most garbage).
    for r in rounds:
        wl = DLRMWorkload(config, env)
        t0 = time.perf_counter()
        runs.ref_losses = train_reference(wl, batches)
        runs.serial_s.append(time.perf_counter() - t0)
        bar.update(1)
        if need_eval:
            wl = DLRMWorkload(config, env)
            t0 = time.perf_counter()
            ref_preds = eval_reference(wl, batches)
            runs.eval_s.append(time.perf_counter() - t0)
            bar.update(1)
        for spec in turned(specs, r):
            wl = DLRMWorkload(config, env)
            plan = spec.plan(wl)
            if spec.label not in runs.plans:  # every rank must run the same plan, or collectives hang
                check_same_plan(env, plan, f"plan {spec.label!r}")
            runs.plans[spec.label] = plan
            with SWPipeline(plan, device=env.device, state=wl.state) as pipe:
                runs.times[spec.label].append(pipe.run(iter(batches)))
            got = [wl.outputs[i] for i in range(iters)] if spec.is_eval else wl.loss_list()
            want = ref_preds if spec.is_eval else runs.ref_losses
            runs.matches[spec.label] = runs.matches[spec.label] and _compare(got, want)
            runs.close[spec.label] = runs.close[spec.label] and _close(got, want)
            bar.update(1)
    bar.close()
    return runs


def _rows(config: DLRMConfig, env: DistEnv, specs: Sequence[PlanSpec], batches: List[Batch], runs: _Runs,
          serial_rate: float, eval_rate: Optional[float]) -> List[PlanResult]:
    """One table row per spec (fastest round), with the semi-sync staleness check in the note."""
    iters = len(batches)
    rows: List[PlanResult] = []
    semi_refs: Dict[int, List[torch.Tensor]] = {0: runs.ref_losses}
    twins = _twins(specs)
    for spec in specs:
        plan = runs.plans[spec.label]
        note = "searched (see below)" if spec.story else spec.note
        if spec.label in twins:
            note = f"the schedule of {twins[spec.label]}, so its runs (one plan, measured once); " + note
        lag = 0 if spec.is_eval else _lag(plan)
        if lag:
            if lag not in semi_refs:
                semi_refs[lag] = semi_sync_reference(DLRMWorkload(config, env), batches, lag)
            stale_ok = all_ranks(env, _compare(_losses_of(spec, config, env, batches), semi_refs[lag]))
            note = (note + "; " if note else "") + (f"embedding staleness {lag}: "
                                                    f"{'equals' if stale_ok else 'DIFFERS from'} the semi-sync reference")
        rate = iters / min(runs.times[spec.label])
        base_rate = eval_rate if spec.is_eval else serial_rate
        rows.append(PlanResult(spec.label, plan.pipeline_depth, len({plan.stream_of(t) for t in plan.task_names}),
                               len({plan.sched(t).thread_group for t in plan.task_names}), rate,
                               rate / base_rate if base_rate else float("nan"), runs.matches[spec.label], note,
                               min(runs.times[spec.label]), runs.close[spec.label], spec.predicted_speedup,
                               _paired(runs.eval_s if spec.is_eval else runs.serial_s, runs.times[spec.label]),
                               _spread_pct(runs.times[spec.label])))
    return rows


def _spread_pct(times: Sequence[float]) -> Optional[float]:
    """``100 * (slowest - fastest) / median`` of one row's runs (None with one run).

    Examples
    --------
    >>> round(_spread_pct([1.0, 1.1, 1.05]), 1), _spread_pct([1.0])
    (9.5, None)
    """
    if len(times) < 2:
        return None
    import statistics

    return 100.0 * (max(times) - min(times)) / statistics.median(times)


def noise_pct(m: "Measurement") -> Optional[float]:
    """The run-to-run noise of a demo run: the median over its rows of each row's spread (None with one run).

    Examples
    --------
    >>> rows = [PlanResult("a", 1, 1, 1, 10.0, 1.0, True, spread_pct=4.0),
    ...         PlanResult("b", 1, 1, 1, 10.0, 1.0, True, spread_pct=8.0)]
    >>> noise_pct(Measurement(10.0, None, rows))
    6.0
    """
    import statistics

    spreads = [r.spread_pct for r in m.rows if r.spread_pct is not None]
    return statistics.median(spreads) if spreads else None


def _paired(serial_s: Sequence[float], plan_s: Sequence[float]) -> Optional[float]:
    """Median over rounds of the serial run's time over the plan's in the same round (None without a pair).

    A row raced in extra rounds ran in every round the serial loop did, so
    run ``k`` of a row and of the serial loop belong to the same round.

    Examples
    --------
    >>> round(_paired([0.30, 0.40, 0.36], [0.20, 0.25, 0.30]), 6)  # ratios 1.5, 1.6, 1.2
    1.5
    >>> _paired([], [0.2]) is None
    True

    The machine ran twice as slow in round 1, for both: paired, the rounds agree (the fastest
    serial run over the fastest plan run, 0.30 / 0.18 = 1.67, would mix rounds 0 and 2); a row not
    raced pairs its own rounds only:

    >>> serial, plan = [0.30, 0.60, 0.36], [0.20, 0.40, 0.18]
    >>> round(_paired(serial, plan), 6), round(_paired(serial, plan[:2]), 6)   # ratios 1.5, 1.5, 2.0
    (1.5, 1.5)
    """
    ratios = [s / p for s, p in zip(serial_s, plan_s) if p > 0]
    return statistics.median(ratios) if ratios else None


def _fold_ranks(env: DistEnv, local: Dict[str, Any]) -> Dict[str, Any]:
    """Per-rank run times and checks -> the job's: slowest rank per run, pass only if every rank passes."""
    ranks = gather(env, local)
    slowest = lambda key: [max(r[key][i] for r in ranks) for i in range(len(local[key]))]  # noqa: E731
    return dict(serial_s=slowest("serial_s"), eval_s=slowest("eval_s"),
                times={k: [max(r["times"][k][i] for r in ranks) for i in range(len(v))]
                       for k, v in local["times"].items()},
                matches={k: all(r["matches"][k] for r in ranks) for k in local["matches"]},
                close={k: all(r["close"][k] for r in ranks) for k in local["close"]})


def _lag(plan: PipelinePlan) -> int:
    try:
        return emb_staleness(plan)
    except ValueError:
        return 0


def _losses_of(spec: PlanSpec, config: DLRMConfig, env: DistEnv, batches: Sequence[Batch]) -> List[torch.Tensor]:
    from swpipe_core.engine.pipeline import SWPipeline

    wl = DLRMWorkload(config, env)
    with SWPipeline(spec.plan(wl), device=env.device, state=wl.state) as pipe:
        pipe.run(iter(batches))
    return wl.loss_list()


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="swpipe demo", unit="run", leave=False)


def format_table(m: Measurement, width: int = 120) -> str:
    """The comparison as one fixed-width table, one line per plan (serial first), at most ``width`` columns.

    Columns: the plan's shape, its speedup over the serial loop measured in
    the same rounds (:attr:`PlanResult.measured_speedup`), the speedup the
    model predicted (searched rows and the seeds the search predicted; ``-``
    where nothing was predicted), whether its losses equal the serial loop's
    bit for bit, and a note (the serial loop's rate in its own). A note too
    long for the line is a numbered reference ``[k]``, its whole text under
    the table, wrapped.

    Examples
    --------
    >>> m = Measurement(10.0, None, [PlanResult("sparse_dist", 3, 3, 1, 12.5, 1.25, True, predicted_speedup=1.3),
    ...                              PlanResult("auto", 3, 4, 2, 12.0, 1.2, True, note="searched " * 12)])
    >>> print(format_table(m, width=100))  # doctest: +NORMALIZE_WHITESPACE
    plan         depth  streams  threads  speedup  predicted  = serial   note
    -----------  -----  -------  -------  -------  ---------  ---------  ----
    serial           1        1        1    1.00x          -  reference  10.0 iterations/s
    sparse_dist      3        3        1    1.25x      1.30x  yes
    auto             3        4        2    1.20x          -  yes        [1]
    [1] auto: searched searched searched searched searched searched searched searched searched searched
        searched searched
    """
    header = ["plan", "depth", "streams", "threads", "speedup", "predicted", "= serial", "note"]
    body = [["serial", "1", "1", "1", "1.00x", "-", "reference", f"{m.serial_iters_per_s:.1f} iterations/s"]]
    if m.eval_serial_iters_per_s is not None:
        body.append(["serial-eval", "1", "1", "1", "1.00x", "-", "reference",
                     f"{m.eval_serial_iters_per_s:.1f} iterations/s; eval plans compare with it"])
    for r in m.rows:
        if r.matches is None:
            match = "n/a"
        else:
            match = "yes" if r.matches else ("close" if r.close else "NO")
        predicted = "-" if r.predicted_speedup is None else f"{r.predicted_speedup:.2f}x"
        body.append([r.label, str(r.depth), str(r.streams), str(r.thread_groups), f"{r.measured_speedup:.2f}x",
                     predicted, match, r.note])
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(header)]
    right = {1, 2, 3, 4, 5}
    room = max(10, width - sum(widths[:-1]) - 2 * (len(widths) - 1))  # what is left for the note
    below: List[str] = []  # the notes too long for their line, whole, under the table

    def line(cells: Sequence[str]) -> str:
        note = cells[-1]
        if len(note) > room:
            below.append(f"[{len(below) + 1}] {cells[0]}: {note}")
            note = f"[{len(below)}]"
        out = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells[:-1], widths))]
        return "  ".join(out + [note]).rstrip()

    lines = [line(header), line(["-" * w for w in widths[:-1]] + ["----"])] + [line(r) for r in body]
    for text in below:
        lines += textwrap.wrap(text, width=width, subsequent_indent="    ", break_on_hyphens=False)
    return "\n".join(lines)
