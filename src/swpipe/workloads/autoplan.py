"""The demo's auto-scheduled plan: the workload's safe task graph, measured costs, the search, one plan on every rank.

:func:`auto_spec` hands :func:`safe_task_plan` (the finest task graph, with
every dependency its shared state needs) and the costs of a serial run to
``autosched.search.autoschedule.auto_schedule``, seeded with the hand-written plans of
:data:`AUTO_SEEDS`, and returns the plan found as a
:class:`~swpipe.workloads.bench.PlanSpec`: the "auto" row that ``swpipe demo``
and the benchmarks measure next to the others with
:func:`swpipe.workloads.bench.measure`.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch

from swpipe_core.plan import PipelinePlan
from swpipe_core.planfile import plan_from_dict, plan_to_dict

from swpipe.workloads.agree import check_same_plan, from_rank0, gather, slowest_rank_costs
from swpipe.workloads.bench import PlanSpec
from swpipe.workloads.dlrm import DLRMWorkload, DistEnv
from swpipe.workloads.dlrm_data import Batch, DLRMConfig, pin_for
from swpipe.workloads.tasks import plan_for

if TYPE_CHECKING:  # autosched is imported where it is used, as the rest of this module does
    from autosched.model.costs import CostModel

__all__ = ["auto_spec", "safe_task_plan", "AUTO_SEEDS", "auto_seeds", "serial_costs", "COST_ITERATIONS",
           "COST_WARMUP"]

_log = logging.getLogger(__name__)


def safe_task_plan(workload: DLRMWorkload, pipeline: str = "prefetch") -> PipelinePlan:
    """The workload's finest task graph as a plan, with every dependency its shared state needs.

    The tasks and dependencies of ``pipeline`` (default ``"prefetch"``: the id
    de-duplication ``EmbPrefetch`` is a task of its own, so a searcher can run it
    a stage ahead on its own thread, as the fastest hand-written plans do), plus
    ``ZeroGrad(i)`` waiting ``OptimizerStep(i-1)`` (TorchRec relies on the
    default stream's FIFO for that; a searcher may put the two on different
    threads). This is the input :func:`auto_spec` hands to the auto-scheduler,
    so any plan it returns computes what the serial loop computes. On several
    ranks its tasks that issue collectives are ``globally_ordered``
    (:func:`~swpipe.workloads.tasks.plan_for`), and the search keeps that mark
    on every plan it builds, so they issue their collectives in one order on
    every rank.

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


def auto_seeds(workload: DLRMWorkload, base: PipelinePlan) -> List[Tuple[str, PipelinePlan]]:
    """The seeds of :data:`AUTO_SEEDS` over ``base``'s task graph, as ``(label, plan)``."""
    from autosched.search.seeds import with_dependencies_of
    from swpipe_core.engine.workers import with_thread_map

    seeds = []
    for label in AUTO_SEEDS:
        name, _, thread_map = label.partition("+")
        plan = plan_for(name, workload)
        seeds.append((label, with_dependencies_of(with_thread_map(plan, thread_map) if thread_map else plan, base)))
    return seeds


# ---------------------------------------------------------------------------------------------
# HOOK: the auto-generated plan (room E's autosched.search.autoschedule.auto_schedule). Used whenever
# ``autosched.search.autoschedule`` imports; otherwise the demo simply has no "auto" row.
# ---------------------------------------------------------------------------------------------
def auto_spec(config: DLRMConfig, env: DistEnv, batches: Sequence[Batch], max_depth: int = 3,
              max_threads: int = 2, time_limit_s: float = 10.0, verify_rounds: int = 3) -> Optional[PlanSpec]:
    """A spec for the plan ``autosched.search.autoschedule.auto_schedule`` finds for this workload, or None.

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
    candidates (its pick, the seeds, the serial plan) and every rank runs them in the same order at once (their
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
        On a CUDA device they are pinned here, once for all these runs
        (:func:`~swpipe.workloads.dlrm_data.pin_for`; a batch already pinned is not copied).
    max_depth, max_threads : int
        The search's constraints (raised to what the seeds need).
    time_limit_s : float
        The search's budget.
    verify_rounds : int
        Rounds of the on-engine verification (0: off).

    Returns
    -------
    PlanSpec or None
        Its ``predicted_speedup`` is the model's speedup over serial of the
        plan returned, and ``predicts`` the same for the seeds' demo rows
        (:data:`AUTO_SEEDS`), so the demo can check each against its rows.

    Examples
    --------
    >>> from swpipe.workloads.dlrm import SyntheticData, init_distributed
    >>> env = init_distributed()
    >>> cfg = DLRMConfig.preset("test")
    >>> spec = auto_spec(cfg, env, SyntheticData(cfg).batches(4), time_limit_s=2.0, verify_rounds=0)
    >>> spec.label, spec.plan(DLRMWorkload(cfg, env)).unbound_tasks()
    ('auto', [])
    >>> env.close()
    """
    try:
        import autosched.search.autoschedule  # noqa: F401 - the search and its optional libraries (OR-Tools) are there
    except ImportError as exc:
        _log.info("no auto plan: autosched.search.autoschedule is not importable (%s)", exc)
        return None
    batches = pin_for(batches, env.device)  # the H2D costs measured and verified are the asynchronous copy's
    wl = DLRMWorkload(config, env)
    base = safe_task_plan(wl)
    costs = slowest_rank_costs(env, serial_costs(base, batches, env.device))
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
        label, fields, verdict = _verify_on_every_rank(config, env, candidates, batches, verify_rounds)
        # rank 0 predicts the candidates with the search's model
        speedups, how = from_rank0(env, _lockstep_predictions(candidates, costs, env) if env.rank == 0 else None)
        shared = (fields, f"{note}; {verdict} of {len(candidates)} plans on all {env.world_size} ranks in "
                          f"lockstep, the slowest rank's time counting ({label})" + (f"; {how}" if how else ""),
                  label, speedups)
    if isinstance(shared, str):
        warnings.warn(f"auto plan skipped: {shared}", RuntimeWarning)
        return None
    # speedups: the model's speedup over serial of each candidate it predicted, by candidate label
    fields, note, chosen, speedups = shared
    # a seed is a hand-written row's schedule over the searched task graph (its extra dependencies are already
    # met by that schedule): the demo measures it once, in that row, rather than twice with the machine's noise
    same_as = _row_of_seed(chosen)

    def build(workload: DLRMWorkload) -> PipelinePlan:
        fns = {t.name: t.fn for t in safe_task_plan(workload).tasks}
        return plan_from_dict(fields, source="rank 0's plan").bind(fns)

    check_same_plan(env, build(wl), "the auto plan")
    ranks = f"; searched on rank 0, costs of the slowest of {env.world_size} ranks" if env.world_size > 1 else ""
    searched, _, kept = note.partition("; ")  # what was searched; what the verification kept and why
    return PlanSpec("auto", "auto", None, {}, build=build, note=note + ranks,
                    same_as=same_as, predicted_speedup=speedups.get(chosen or "auto"),
                    predicts={row: speedups[f"seed:{row}"] for row in AUTO_SEEDS if f"seed:{row}" in speedups},
                    story=[f"auto: {searched}{ranks}", f"auto: {kept}"] if kept else [f"auto: {searched}{ranks}"])


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


def serial_costs(base: PipelinePlan, batches: Sequence[Batch], device: Any) -> CostModel:
    """Median time per task over a warm serial run (the batches cycled to :data:`COST_ITERATIONS`).

    The first iterations of a fresh model run slower (allocator, caches,
    first-touch pages: 18 % on the demo model in the first ten, measured);
    costs taken there made every prediction read that much slow, so the first
    :data:`COST_WARMUP` iterations are left out.
    """
    from autosched.model.costs import CostModel
    from swpipe_core.engine.pipeline import SWPipeline

    runs = [batches[i % len(batches)] for i in range(max(COST_ITERATIONS, len(batches)))]
    warm = min(COST_WARMUP, len(runs) - 1)
    with SWPipeline(base, device=device, record_timeline=True) as pipe:
        pipe.run_serial(iter(runs))
        events = [e for e in pipe.timeline if e.iteration >= warm]
    return CostModel.from_timeline(events, machine=f"{torch.get_num_threads()} intra-op thread(s)",
                                   notes=f"serial run of {len(runs)} iterations, the first {warm} left out (warm-up)")


def _with_calibration(costs: Any, config: DLRMConfig, env: DistEnv, batches: Sequence[Batch]) -> Any:
    """The cost model with this machine measured now (:func:`swpipe_core.measure.calibrate.calibrate`) attached.

    The search folds it in (the machine model, :mod:`autosched.model.machine`): the
    engine's cost per task, per hand-off and per period, the cores free now, and
    on one rank the tasks' CPU shares (measured by running them; with several
    ranks their collectives would wait for peers that are not running them, so
    only the machine's figures are taken).
    """
    from swpipe_core.measure.calibrate import calibrate
    from swpipe_core.engine.pipeline import SWPipeline

    if env.world_size == 1:
        wl = DLRMWorkload(config, env)  # a fresh model, restored after the measurement all the same
        with SWPipeline(safe_task_plan(wl), device=env.device) as pipe:
            calibration = calibrate(pipe, batches[0], state=wl.state)
    else:
        calibration = calibrate()
    return replace(costs, machine_calibration=calibration)


def _search(wl: DLRMWorkload, base: PipelinePlan, costs: Any, env: DistEnv, max_depth: int, max_threads: int,
            time_limit_s: float, verify_rounds: int, batches: Sequence[Batch], lockstep: bool) -> Any:
    """Rank 0's search: ``(plan dict, note, chosen label, predicted speedup over serial per candidate label)``.

    With ``lockstep``: ``(candidates, note)``, the candidates to measure on every rank (their predictions follow
    the measurement, :func:`_lockstep_predictions`).
    The candidates' labels are the verification's (``"seed:<row>"``, ``"serial"``, ...); without a
    verification, the search's plan is ``"auto"``.
    """
    from autosched.search.options import Constraints, SolverOptions
    from swpipe import auto_schedule
    from autosched.verify.loop import VerifyOptions
    from autosched.verify.predict import predicted_speedups

    seeds = auto_seeds(wl, base)
    depth = max([max_depth] + [p.pipeline_depth for _, p in seeds])
    threads = max([max_threads] + [len(p.thread_groups) for _, p in seeds])
    verify = not lockstep and verify_rounds > 0
    found, report = auto_schedule(
        base, costs, Constraints(max_depth=depth, max_threads=threads, device=env.device.type),
        solver=SolverOptions(time_limit_s=time_limit_s),
        # 40 iterations a round: the demo measures 40, and shorter runs rank plans within ~10 % noise
        seeds=seeds, verify=VerifyOptions(rounds=verify_rounds, iterations=40, device=str(env.device))
        if verify else False,
        batches=list(batches) if verify else None, state=wl.state if verify else None)
    cal = costs.machine_calibration
    note = f"auto_schedule: simulated {report.period_s * 1e3:.1f} ms/it, {report.status}" + (
        f", calibrated ({cal.cores_free:.1f} cores free)" if cal is not None else "")
    chosen_label = None
    if report.verify is not None:
        chosen = report.verify.choose()
        chosen_label = chosen.label
        speedups = report.verify.predicted_speedups()
        k, predicted = report.verify.speed_factor, chosen.predicted_s
        rescaled = (f", predicted {k * predicted * 1e3:.1f} rescaled by the serial plan"
                    if k is not None and predicted is not None else "")
        earlier = report.verify.earlier
        measured = {r.label for r in report.verify.rows + (earlier.rows if earlier is not None else [])}
        refit = ", after a round refitted to the measured cores" if earlier is not None else ""
        how = (f"{report.verify.verdict()} of {len(measured)} plans on the engine{refit} ({chosen.label}: "
               f"{chosen.period_s * 1e3:.1f} ms/it steady{rescaled}, noise band +-{report.verify.noise_pct:.0f}%)")
    else:  # nothing measured here (with lockstep, every rank measures the candidates next)
        candidates = _candidates(found, seeds)
        if lockstep:
            return [(label, plan_to_dict(plan)) for label, plan in candidates], note
        speedups = predicted_speedups(_predictions(candidates, costs, env))
        how = "not measured before the run"
    return plan_to_dict(found), f"{note}; {how}", chosen_label, speedups


def _candidates(found: PipelinePlan, seeds: Sequence[Any]) -> List[Tuple[str, PipelinePlan]]:
    """The plans rank 0 predicts, and on several ranks measures: the search's plan (``"auto"``, with the caller's
    group and the hand-offs the search chose), the seeds (``"seed:<row>"``) and the serial plan.
    """
    from autosched.verify.candidates import serial_plan

    return [("auto", found)] + [(f"seed:{label}", plan) for label, plan in seeds] + [("serial", serial_plan(found))]


def _predictions(candidates: Sequence[Any], costs: Any, env: DistEnv) -> Dict[str, float]:
    """Each candidate's predicted period, in the search's model (the calibration folded in, when measured)."""
    from autosched.verify.predict import predict_periods

    return predict_periods(candidates, costs, device=env.device.type)


def _lockstep_predictions(candidates: Sequence[Any], costs: Any,
                          env: DistEnv) -> Tuple[Dict[str, float], Optional[str]]:
    """Rank 0's predicted speedups of the shared candidates (plan dicts, :func:`~swpipe_core.planfile.plan_to_dict`), and the line that says which model
    predicted them."""
    from autosched.verify.predict import predicted_speedups

    try:
        plans = [(label, plan_from_dict(fields, source="rank 0's plan")) for label, fields in candidates]
        speedups = predicted_speedups(_predictions(plans, costs, env))
    except Exception as exc:  # noqa: BLE001 - the other ranks wait for rank 0's answer: always give one
        return {}, f"no predictions ({type(exc).__name__}: {exc})"
    calibrated = getattr(costs, "machine_calibration", None) is not None
    return speedups, "predicted by the search's model" + (" (the machine calibration folded in)" if calibrated
                                                           else "")


def _verify_on_every_rank(config: DLRMConfig, env: DistEnv, candidates: List[Any], batches: Sequence[Batch],
                          rounds: int) -> Any:
    """Run rank 0's candidates on every rank at once (their collectives pair up); the slowest rank's time counts.

    Returns ``(label, plan dict, verdict)`` of the plan chosen
    (:meth:`~autosched.verify.measure.VerifyTable.choose`: the serial plan unless a plan beats it round by round;
    of those the best, or a seed it does not measurably beat), the same on every rank.
    """
    from autosched.verify.candidates import is_known
    from autosched.verify.measure import VerifyOptions, measure_plans

    fns = {t.name: t.fn for t in safe_task_plan(DLRMWorkload(config, env)).tasks}
    plans = [(label, plan_from_dict(fields, source="rank 0's plan").bind(fns)) for label, fields in candidates]
    runs = [batches[i % len(batches)] for i in range(40)]
    # a warm-up run each, then the same rounds on every rank (no racing: the ranks' times differ), in lockstep
    table = measure_plans(plans, runs, VerifyOptions(rounds=rounds, max_rounds=rounds, device=str(env.device)),
                          known=[label for label, _ in candidates if is_known(label)], baseline="serial")
    folded = table.with_slowest(gather(env, {r.label: r.rounds_s for r in table.rows}))
    label = folded.choose().label
    return label, dict(candidates)[label], folded.verdict()
