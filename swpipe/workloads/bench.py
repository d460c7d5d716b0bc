"""Measure the DLRM workload: the plain serial loop next to each plan, side by side in one run.

Used by ``swpipe demo`` and ``benchmarks/pipelines.py``. Every plan runs on a
fresh workload built from the same seed over the same pre-generated batches;
its losses (or, for eval plans, predictions) are compared bit for bit with the
plain serial loop of :mod:`swpipe.workloads.reference`, and its speed with
that loop's.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from swpipe_core.plan import PipelinePlan, ref_name

from .agree import all_ranks, check_same_plan, from_rank0, gather, plan_fields, slowest_rank_costs
from .dlrm import Batch, DLRMConfig, DLRMWorkload, DistEnv, SyntheticData
from .reference import emb_staleness, eval_reference, semi_sync_reference, train_reference
from .tasks import EVAL_PIPELINES, plan_for

__all__ = ["PlanSpec", "PlanResult", "Measurement", "default_specs", "measure", "format_table",
           "auto_spec", "safe_task_plan", "AUTO_SEEDS", "parallel_probe", "TORCHREC_PLANS"]

_log = logging.getLogger(__name__)

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

    def plan(self, workload: DLRMWorkload) -> PipelinePlan:
        """The runnable plan on ``workload``."""
        from swpipe_core.workers import with_thread_map

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


def safe_task_plan(workload: DLRMWorkload, pipeline: str = "prefetch") -> PipelinePlan:
    """The workload's finest task graph as a plan, with every dependency its shared state needs.

    The tasks and dependencies of ``pipeline`` (default ``"prefetch"``: the id
    de-duplication ``EmbPrefetch`` is a task of its own, so a searcher can run it
    a stage ahead on its own thread, as the fastest hand-written plans do), plus
    ``ZeroGrad(i)`` waiting ``OptimizerStep(i-1)`` (TorchRec relies on the
    default stream's FIFO for that; a searcher may put the two on different
    threads). This is the input :func:`auto_spec` hands to the auto-scheduler,
    so any plan it returns computes what the serial loop computes.

    Examples
    --------
    >>> from swpipe.workloads.dlrm import init_distributed
    >>> env = init_distributed()
    >>> plan = safe_task_plan(DLRMWorkload(DLRMConfig.preset("test"), env))
    >>> ("ZeroGrad", "OptimizerStep", 1) in plan.inter_edges(), "EmbPrefetch" in plan.task_names
    (True, True)
    >>> plan.unbound_tasks()
    []
    >>> env.close()
    """
    plan = plan_for(pipeline, workload)
    extra = ("ZeroGrad", "OptimizerStep", 1)
    deps = list(plan.inter_iter_deps) + ([extra] if extra not in plan.inter_edges() else [])
    return plan.replace(inter_iter_deps=deps, pipeline_depth=plan.pipeline_depth)


#: the hand-written plans handed to the search as seeds (scored, and measured when verifying)
AUTO_SEEDS = ("prefetch", "prefetch+by_stream")


def _auto_seeds(workload: DLRMWorkload, base: PipelinePlan) -> List[Any]:
    """The seeds of :data:`AUTO_SEEDS` over ``base``'s task graph, as ``(label, plan)``."""
    from autosched.seeds import with_dependencies_of
    from swpipe_core.workers import with_thread_map

    seeds = []
    for label in AUTO_SEEDS:
        name, _, thread_map = label.partition("+")
        plan = plan_for(name, workload)
        seeds.append((label, with_dependencies_of(with_thread_map(plan, thread_map) if thread_map else plan, base)))
    return seeds


# ---------------------------------------------------------------------------------------------
# HOOK: the auto-generated plan (room E's autosched.search.auto_schedule). Used whenever
# ``autosched.search`` imports; otherwise the demo simply has no "auto" row.
# ---------------------------------------------------------------------------------------------
def auto_spec(config: DLRMConfig, env: DistEnv, batches: Sequence[Batch], max_depth: int = 3,
              max_threads: int = 2, time_limit_s: float = 10.0, verify_rounds: int = 3) -> Optional[PlanSpec]:
    """A spec for the plan ``autosched.search.auto_schedule`` finds for this workload, or None.

    Every rank measures a serial run's timeline (median time per task) on its
    own batches; the
    per-rank cost models are combined so that the slowest rank's cost of each
    task decides (:func:`~swpipe.workloads.agree.slowest_rank_costs`).
    Rank 0 searches (the search has a time budget, so it is not
    deterministic) and shares the plan; every rank then checks that it holds
    the same plan. The task graph is :func:`safe_task_plan`; the hand-written
    plans of :data:`AUTO_SEEDS` are seeds, so the search never returns a plan
    it simulates slower than them. On one rank the search then checks its
    answer on the engine (``verify``): its candidates, the seeds, the input
    plan and the serial plan run in interleaved rounds on ``batches`` and the
    one measured fastest is returned. With several ranks, rank 0 shares its
    candidates (its pick, the pick with its busiest group inline, the seeds,
    the serial plan) and every rank runs them in the same order at once (their
    collectives pair up); the slowest rank's time of each round counts and
    every rank chooses the same plan from the folded table. Returns None on every rank (with a warning saying
    why) when autosched is unavailable or the search fails, so the demo
    still runs. A collective: every rank calls it.

    Parameters
    ----------
    config : DLRMConfig
    env : DistEnv
    batches : sequence of Batch
        The serial run that measures the costs, and the verification runs.
    max_depth, max_threads : int
        The search's constraints (raised to what the seeds need).
    time_limit_s : float
        The search's budget.
    verify_rounds : int
        Rounds of the on-engine verification (0: off).

    Returns
    -------
    PlanSpec or None

    Examples
    --------
    >>> from swpipe.workloads.dlrm import init_distributed
    >>> env = init_distributed()
    >>> cfg = DLRMConfig.preset("test")
    >>> spec = auto_spec(cfg, env, SyntheticData(cfg).batches(4), time_limit_s=2.0, verify_rounds=0)
    >>> spec.label, spec.plan(DLRMWorkload(cfg, env)).unbound_tasks()
    ('auto', [])
    >>> env.close()
    """
    try:
        import autosched.search  # noqa: F401 - the search and its optional libraries (OR-Tools) are there
    except ImportError as exc:
        _log.info("no auto plan: autosched.search is not importable (%s)", exc)
        return None
    wl = DLRMWorkload(config, env)
    base = safe_task_plan(wl)
    costs = slowest_rank_costs(env, _serial_costs(base, batches, env.device))
    lockstep = env.world_size > 1 and verify_rounds > 0  # every rank measures the candidates together
    shared: Any = None
    if env.rank == 0:
        try:
            costs = _with_calibration(costs, config, env, batches)
            shared = _search(wl, base, costs, env, max_depth, max_threads, time_limit_s, verify_rounds, batches,
                             lockstep)
        except Exception as exc:  # noqa: BLE001 - the hook must never break the demo
            shared = f"auto_schedule failed ({type(exc).__name__}: {exc})"
    shared = from_rank0(env, shared)
    if lockstep and not isinstance(shared, str):
        candidates, note = shared
        label, fields = _verify_on_every_rank(config, env, candidates, batches, verify_rounds)
        shared = (fields, f"{note}; measured fastest of {len(candidates)} plans on all {env.world_size} ranks in "
                          f"lockstep, the slowest rank's time counting ({label})", label)
    if isinstance(shared, str):
        warnings.warn(f"auto plan skipped: {shared}", RuntimeWarning)
        return None
    fields, note, chosen = shared
    # a seed is a hand-written row's schedule over the searched task graph (its extra dependencies are already
    # met by that schedule): the demo measures it once, in that row, rather than twice with the machine's noise
    same_as = _row_of_seed(chosen)

    def build(workload: DLRMWorkload) -> PipelinePlan:
        fns = {t.name: t.fn for t in safe_task_plan(workload).tasks}
        return _plan_from_fields(fields).bind(fns)

    check_same_plan(env, build(wl), "the auto plan")
    return PlanSpec("auto", "auto", None, {}, build=build, note=note + (
        f"; searched on rank 0, costs of the slowest of {env.world_size} ranks" if env.world_size > 1 else ""),
        same_as=same_as)


def _row_of_seed(label: Optional[str]) -> Optional[str]:
    """The demo row whose schedule a verified pick runs: a seed's (``"seed:<row>"``), else None.

    Examples
    --------
    >>> _row_of_seed("seed:prefetch+by_stream"), _row_of_seed("beam"), _row_of_seed(None)
    ('prefetch+by_stream', None, None)
    """
    return label.partition(":")[2] if label and label.startswith("seed:") else None


#: serial iterations run (batches cycled) to measure the search's costs, and how many of them are warm-up
COST_ITERATIONS, COST_WARMUP = 36, 12


def _serial_costs(base: PipelinePlan, batches: Sequence[Batch], device: Any) -> Any:
    """Median time per task over a warm serial run (the batches cycled to :data:`COST_ITERATIONS`).

    The first iterations of a fresh model run slower (allocator, caches,
    first-touch pages: 18 % on the demo model in the first ten, measured);
    costs taken there made every prediction read that much slow, so the first
    :data:`COST_WARMUP` iterations are left out.
    """
    from autosched.costs import CostModel
    from swpipe_core.engine import SWPipeline

    runs = [batches[i % len(batches)] for i in range(max(COST_ITERATIONS, len(batches)))]
    warm = min(COST_WARMUP, len(runs) - 1)
    with SWPipeline(base, device=device, record_timeline=True) as pipe:
        pipe.run_serial(iter(runs))
        events = [e for e in pipe.timeline if e.iteration >= warm]
    return CostModel.from_timeline(events, machine=f"{torch.get_num_threads()} intra-op thread(s)",
                                   notes=f"serial run of {len(runs)} iterations, the first {warm} left out (warm-up)")


def _with_calibration(costs: Any, config: DLRMConfig, env: DistEnv, batches: Sequence[Batch]) -> Any:
    """The cost model with this machine measured now (:func:`swpipe_core.calibrate.calibrate`) attached.

    The search folds it in: the engine's cost per task, the cores free now, and
    on one rank the tasks' GIL and CPU shares (measured by running them; with
    several ranks their collectives would wait for peers that are not
    running them, so only the machine's figures are taken).
    """
    from swpipe_core.calibrate import calibrate
    from swpipe_core.engine import SWPipeline

    if env.world_size == 1:
        with SWPipeline(safe_task_plan(DLRMWorkload(config, env)), device=env.device) as pipe:
            calibration = calibrate(pipe, batches[0])
    else:
        calibration = calibrate()
    return replace(costs, machine_calibration=calibration)


def _search(wl: DLRMWorkload, base: PipelinePlan, costs: Any, env: DistEnv, max_depth: int, max_threads: int,
            time_limit_s: float, verify_rounds: int, batches: Sequence[Batch], lockstep: bool) -> Any:
    """Rank 0's search: ``(plan fields, note)``; with ``lockstep``, ``(candidates, note)`` to measure on every rank."""
    from autosched.search import Constraints, auto_schedule
    from autosched.verify import VerifyOptions, inline_variant, serial_plan

    seeds = _auto_seeds(wl, base)
    depth = max([max_depth] + [p.pipeline_depth for _, p in seeds])
    threads = max([max_threads] + [len({p.sched(n).thread_group for n in p.task_names}) for _, p in seeds])
    verify = not lockstep and verify_rounds > 0
    found, report = auto_schedule(
        base, costs, Constraints(max_depth=depth, max_threads=threads, time_limit_s=time_limit_s,
                                 device=env.device.type),
        # 40 iterations a round: the demo measures 40, and shorter runs rank plans within ~10 % noise
        seeds=seeds, verify=VerifyOptions(rounds=verify_rounds, iterations=40, device=str(env.device))
        if verify else False,
        batches=list(batches) if verify else None)
    cal = costs.machine_calibration
    note = f"auto_schedule: simulated {report.period_s * 1e3:.1f} ms/it, {report.status}" + (
        f", calibrated ({cal.cores_free:.1f} cores free)" if cal is not None else "")
    if lockstep:
        inline = inline_variant(found, costs)
        candidates = [("auto", found)] + ([inline] if inline else [])
        candidates += [(f"seed:{label}", plan) for label, plan in seeds] + [("serial", serial_plan(found))]
        return [(label, plan_fields(plan)) for label, plan in candidates], note
    chosen_label = None
    if report.verify is not None:
        chosen = report.verify.choose()
        chosen_label = chosen.label
        k = report.verify.speed_factor
        rescaled = f", {k * report.period_s * 1e3:.1f} rescaled by the serial plan" if k is not None else ""
        how = (f"measured fastest of {len(report.verify.rows)} plans on the engine ({chosen.label}: "
               f"{chosen.period_s * 1e3:.1f} ms/it steady{rescaled}, noise band +-{report.verify.noise_pct:.0f}%)")
    else:
        how = "not measured before the run"
    return plan_fields(found), f"{note}; {how}", chosen_label


def _verify_on_every_rank(config: DLRMConfig, env: DistEnv, candidates: List[Any], batches: Sequence[Batch],
                          rounds: int) -> Any:
    """Run rank 0's candidates on every rank at once (their collectives pair up); the slowest rank's time counts.

    Returns ``(label, plan fields)`` of the plan measured fastest, the same on every rank.
    """
    from autosched.verify import PlanMeasurement, VerifyTable, measure_plans

    fns = {t.name: t.fn for t in safe_task_plan(DLRMWorkload(config, env)).tasks}
    plans = [(label, _plan_from_fields(fields).bind(fns)) for label, fields in candidates]
    runs = [batches[i % len(batches)] for i in range(40)]
    table = measure_plans(plans, runs, rounds, device=str(env.device))
    every = gather(env, {r.label: r.rounds_s for r in table.rows})
    folded = VerifyTable([PlanMeasurement(r.label, r.plan, [max(rank[r.label][k] for rank in every)
                                                            for k in range(len(r.rounds_s))])
                          for r in table.rows], table.rounds, table.iterations)
    label = folded.choose().label
    return label, dict(candidates)[label]


def _plan_from_fields(fields: Dict[str, Any]) -> PipelinePlan:
    """Rebuild an unbound plan from :func:`~swpipe.workloads.agree.plan_fields` (what rank 0 shares)."""
    from swpipe_core.plan import TaskSchedule

    sched = {n: TaskSchedule(stage, None if stream == "default" else stream, group, ordered)
             for n, (stage, stream, group, ordered) in fields["schedule"].items()}
    return PipelinePlan(sched, intra_iter_deps=list(fields["intra_iter_deps"]),
                        inter_iter_deps=list(fields["inter_iter_deps"]), pipeline_depth=fields["pipeline_depth"],
                        enqueue_order=fields["enqueue_order"], enqueue_policy=fields["enqueue_policy"],
                        caller_group=fields["caller_group"], same_period_deps=list(fields.get("same_period_deps", [])))


def parallel_probe(threads: int = 2, repeats: int = 3) -> float:
    """How much faster ``threads`` threads of GIL-free work run together than one after another.

    The ceiling for any multi-thread plan on this machine right now: about
    ``threads`` on idle cores, about 1 when other processes hold the cores.
    It is the calibration's own figure (:func:`swpipe_core.calibrate.measure_cores`,
    what the search's pool of cores is sized from), best of ``repeats``.

    Examples
    --------
    >>> 1.0 <= parallel_probe(threads=2, repeats=1) <= 2.0
    True
    """
    from swpipe_core.calibrate import measure_cores

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
    from swpipe_core.engine import SWPipeline

    if iters < 1 or repeats < 1 or race_rounds < 0 or race_band_pct < 0:
        raise ValueError(f"measure: iters and repeats must be >= 1, race_rounds and race_band_pct >= 0; got "
                         f"iters={iters}, repeats={repeats}, race_rounds={race_rounds}, race_band_pct={race_band_pct}")
    data = SyntheticData(config, env.world_size, env.rank)
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
        best = max(train_rows, key=lambda r: r.speedup)
        result.best_label = best.label
        if record_best:
            spec = next(s for s in specs if s.label == best.label)
            wl = DLRMWorkload(config, env)
            with SWPipeline(spec.plan(wl), device=env.device, record_timeline=True) as pipe:
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
    from autosched.verify import within_band

    near = set(within_band({s.label: min(runs.times[s.label]) for s in specs if not s.is_eval}, band_pct))
    return [s for s in specs if s.label in near]


def _run_rounds(config: DLRMConfig, env: DistEnv, specs: Sequence[PlanSpec], batches: List[Batch],
                rounds: Sequence[int], progress: bool) -> _Runs:
    """The serial loop (and the eval loop) and every spec, once per round, each on a fresh workload."""
    from autosched.verify import turned
    from swpipe_core.engine import SWPipeline

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
            with SWPipeline(plan, device=env.device) as pipe:
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
        note = spec.note
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
                               min(runs.times[spec.label]), runs.close[spec.label]))
    return rows


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
    from swpipe_core.engine import SWPipeline

    wl = DLRMWorkload(config, env)
    with SWPipeline(spec.plan(wl), device=env.device) as pipe:
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


def format_table(m: Measurement) -> str:
    """The comparison as a fixed-width table (one line per row, serial first).

    Examples
    --------
    >>> m = Measurement(10.0, None, [PlanResult("sparse_dist", 3, 3, 1, 12.5, 1.25, True)])
    >>> print(format_table(m))  # doctest: +NORMALIZE_WHITESPACE
    plan         depth  streams  threads  iter/s  speedup  loss = serial  note
    -----------  -----  -------  -------  ------  -------  -------------  ----
    serial           1        1        1    10.0    1.00x  (reference)
    sparse_dist      3        3        1    12.5    1.25x  yes
    """
    header = ["plan", "depth", "streams", "threads", "iter/s", "speedup", "loss = serial", "note"]
    body = [["serial", "1", "1", "1", f"{m.serial_iters_per_s:.1f}", "1.00x", "(reference)", ""]]
    if m.eval_serial_iters_per_s is not None:
        body.append(["serial-eval", "1", "1", "1", f"{m.eval_serial_iters_per_s:.1f}", "1.00x", "(reference)",
                     "model.eval() loop; eval plans compare with it"])
    for r in m.rows:
        if r.matches is None:
            match = "n/a"
        else:
            match = "yes" if r.matches else ("close (1e-5)" if r.close else "no")
        body.append([r.label, str(r.depth), str(r.streams), str(r.thread_groups), f"{r.iters_per_s:.1f}",
                     f"{r.speedup:.2f}x", match, r.note])
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(header)]
    right = {1, 2, 3, 4, 5}

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(out).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths[:-1]] + ["----"])] + [line(r) for r in body])
