"""``plan="auto"``: measure the model on its first batches, search, verify on the engine, restore the model.

:func:`choose_plan` is what :class:`~swpipe.torchrec.TrainPipeline` runs
before its first pass with ``plan="auto"``:

1. snapshot the model, the optimizer and the random generators
   (:func:`swpipe_core.measure.state.snapshot_state`); every measurement below really
   trains on the batches;
2. measure each task's cost over a serial run of the finest task graph of a
   TorchRec model (:func:`task_graph`: ``fused_sparse_dist``'s tasks, the
   embedding lookup a task of its own), optionally the machine
   (:func:`swpipe_core.measure.calibrate.calibrate`) and, with ``max_memory_bytes``,
   each task's bytes (:func:`swpipe_core.measure.memory.measure_task_memory`); on
   several ranks the slowest rank's cost of each task counts;
3. search (:func:`autosched.search.entry.auto_schedule`) once per pipeline depth,
   the forward and the tasks after it in the last stage (the drop-in's
   ``progress`` returns that batch's output), with TorchRec's plans over the
   same graph as seeds (:func:`seeds`), or under the memory cap;
4. verify: the searched plans, the seeds, TorchRec's ``base`` plan (the
   model's own forward: no input-dist tasks, so not a seed of the search; the
   sharded modules get their forward back for its runs) and the serial loop run
   on the engine in interleaved rounds (:func:`autosched.verify.measure.measure_plans`); the
   fastest is chosen, a seed (a TorchRec plan) unless another plan beats it
   measurably; on several ranks every rank runs the candidates at once and the
   slowest rank's time of each round counts;
5. restore the snapshot (and each module's train/eval flag): training then
   starts from the state the user handed over, on the same batches.

Rank 0 searches and shares its candidates, so every rank runs one plan.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from swpipe_core import pipelines
from swpipe_core.plan import PipelinePlan
from swpipe_core.planfile import plan_from_dict, plan_to_dict
from swpipe_core.measure.state import restore_state, snapshot_state

from swpipe.torchrec.plans import check_shape, runnable
from swpipe.torchrec.tasks import MODE_TASKS, TorchRecTasks

__all__ = ["AutoOptions", "AutoChoice", "task_graph", "seeds", "choose_plan"]


@dataclass
class AutoOptions:
    """How ``plan="auto"`` measures, searches and verifies (``TrainPipeline(..., plan="auto", **options)``).

    Parameters
    ----------
    profile_batches : int
        The first batches of the first pass it measures on (they are trained on afterwards, from the restored state).
    cost_iterations : int
        Serial iterations (the batches cycled) whose per-task medians are the costs; the first third is warm-up.
    max_memory_bytes : float, optional
        Cap on the predicted peak bytes in flight (each task's bytes measured,
        :func:`swpipe_core.measure.memory.measure_task_memory`; each candidate's peak
        simulated, :mod:`autosched.model.memory`): only the candidates that fit are
        verified, and if none does, :class:`autosched.search.memcap.MemoryCapError`
        says how much the leanest needs.
    max_depth, max_threads : int
        The search's bounds.
    time_limit_s : float
        The search's budget (shared by the depths searched).
    verify_rounds, verify_iterations : int
        Interleaved rounds, and iterations per run, of the verification on the engine.
    calibrate : bool
        Measure the machine (the engine's cost per task, per hand-off and per period, the cores free, each task's
        CPU share) and search with it.

    Examples
    --------
    >>> AutoOptions(time_limit_s=2).max_depth
    3
    """

    profile_batches: int = 8
    cost_iterations: int = 18
    max_memory_bytes: Optional[float] = None
    max_depth: int = 3
    max_threads: int = 2
    time_limit_s: float = 6.0
    verify_rounds: int = 3
    verify_iterations: int = 24
    calibrate: bool = True

    @classmethod
    def fields(cls) -> List[str]:
        """The option names."""
        return [f.name for f in dataclasses.fields(cls)]


@dataclass
class AutoChoice:
    """What ``plan="auto"`` chose and why (``TrainPipeline.report`` prints it).

    Attributes
    ----------
    label : str
        The chosen candidate (``"seed:fused_sparse_dist"``, ``"auto:depth3"``, ``"serial"``, ...).
    plan : PipelinePlan
        Unbound: the drop-in binds it.
    verdict : str
        How the verification decided.
    lines : list of str
        The search per depth, the verification table, notes.
    seconds : float
        Time spent measuring, searching and verifying.
    """

    label: str
    plan: PipelinePlan
    verdict: str
    lines: List[str] = field(default_factory=list)
    seconds: float = 0.0

    def __str__(self) -> str:
        head = (f"plan='auto' chose {self.label} ({self.verdict}); measured, searched and verified in "
                f"{self.seconds:.1f} s on the first batches, the model restored exactly afterwards")
        return "\n".join([head, *self.lines])


#: the candidate label of TorchRec's ``TrainPipelineBase`` plan (the model's own forward, no input-dist tasks)
BASE = "seed:base"


def task_graph(fns: Optional[Dict[str, Any]] = None) -> PipelinePlan:
    """The finest task graph of a TorchRec model: ``fused_sparse_dist``'s tasks and dependencies, plus
    ``ZeroGrad(i)`` after ``OptimizerStep(i-1)`` (TorchRec relies on one thread's order for it; a searched plan
    may put them on different threads).

    Examples
    --------
    >>> g = task_graph()
    >>> "EmbLookup" in g.task_names, ("ZeroGrad", "OptimizerStep", 1) in g.inter_edges()
    (True, True)
    """
    plan = pipelines.get("fused_sparse_dist", fns)
    inter = list(plan.inter_iter_deps) + [("ZeroGrad", "OptimizerStep", 1)]
    return plan.replace(inter_iter_deps=inter, pipeline_depth=plan.pipeline_depth)


def seeds(graph: PipelinePlan) -> List[Tuple[str, PipelinePlan]]:
    """TorchRec's plans over ``graph``'s tasks and dependencies, as ``(label, plan)``.

    ``fused_sparse_dist`` (TorchRec's ``TrainPipelineFusedSparseDist``), the
    lookup in the forward's period on the default stream
    (``TrainPipelineSparseDist``'s schedule), everything after the copy in
    one stage (``TrainPipelineSparseDistLite``'s), the copy on its own thread
    (``TrainPipelineSparseDistT``'s), one thread per stream, and the same with
    the side threads' tasks handed off after the forward.

    Examples
    --------
    >>> [label for label, _ in seeds(task_graph())][3:]
    ['sparse_dist_t', 'fused_sparse_dist+by_stream', 'sparse_dist+by_stream, after Forward']
    """
    from autosched.search.seeds import with_dependencies_of
    from swpipe_core.order import hand_off_after
    from swpipe_core.pipelines.experimental import COPY_THREAD
    from swpipe_core.engine.workers import with_thread_map

    fused = pipelines.get("fused_sparse_dist")
    sparse = pipelines.get("fused_sparse_dist", emb_lookup="current")
    lite = fused.replace(schedule={k: dataclasses.replace(v, stage=0 if fused.task(k).name == "H2D" else 1)
                                   for k, v in fused.schedule.items()})
    copy_thread = fused.replace(schedule={k: dataclasses.replace(v, thread_group=COPY_THREAD)
                                          if fused.task(k).name == "H2D" else v for k, v in fused.schedule.items()},
                                pipeline_depth=fused.pipeline_depth)
    out = [("fused_sparse_dist", fused), ("sparse_dist", sparse), ("sparse_dist_lite", lite),
           ("sparse_dist_t", copy_thread), ("fused_sparse_dist+by_stream", with_thread_map(fused, "by_stream"))]
    out = [(label, with_dependencies_of(plan, graph)) for label, plan in out]
    # the side threads' Python handed off after the forward, beside the backward that holds no interpreter lock
    # (the fastest hand-written row of benchmarks/vs_torchrec.py on a 2-core CPU, docs/results.md)
    by_stream = with_dependencies_of(with_thread_map(sparse, "by_stream"), graph)
    late = by_stream.replace(enqueue_order=hand_off_after(by_stream, "Forward"), pipeline_depth=by_stream.pipeline_depth)
    return out + [("sparse_dist+by_stream, after Forward", late)]


def _serial_costs(plan: PipelinePlan, batches: Sequence[Any], device: Any, iterations: int) -> Any:
    """Median host time per task over a serial run (the batches cycled), the first third left out (warm-up)."""
    from autosched.model.costs import CostModel
    from swpipe_core.engine.pipeline import SWPipeline

    runs = [batches[i % len(batches)] for i in range(max(iterations, len(batches)))]
    warm = min(len(runs) // 3, len(runs) - 1)
    with SWPipeline(plan, device=device, record_timeline=True) as pipe:
        pipe.run_serial(iter(runs))
        events = [e for e in pipe.timeline if e.iteration >= warm]
    return CostModel.from_timeline(events, machine=f"{torch.get_num_threads()} intra-op thread(s)",
                                   notes=f"swpipe.torchrec auto: serial run of {len(runs)} iterations, the first "
                                         f"{warm} left out")


def _measure_costs(graph: PipelinePlan, batches: Sequence[Any], device: Any, opts: AutoOptions,
                   world: int, state: Any) -> Any:
    from swpipe_core.engine.pipeline import SWPipeline

    costs = _serial_costs(graph, batches, device, opts.cost_iterations)
    if opts.max_memory_bytes is not None:
        from swpipe_core.measure.memory import measure_task_memory

        with SWPipeline(graph, device=device) as pipe:
            costs = costs.with_memory(measure_task_memory(pipe, batches[0], num_iterations=2))
    if opts.calibrate:
        from swpipe_core.measure.calibrate import calibrate

        if world == 1:
            with SWPipeline(graph, device=device) as pipe:
                cal = calibrate(pipe, batches[0], iterations=100, repeats=3, cpu_iterations=3, state=state)
        else:  # the tasks' own shares would run collectives the other ranks do not: the machine's figures only
            cal = calibrate(iterations=100, repeats=3)
        costs = dataclasses.replace(costs, machine_calibration=cal)
    return costs


def _search(graph: PipelinePlan, costs: Any, device: Any, opts: AutoOptions,
            known: List[Tuple[str, PipelinePlan]]) -> Tuple[List[Tuple[str, PipelinePlan]], List[str]]:
    """One search per depth, the mode tasks frozen in the last stage; ``(label, plan)`` found and report lines."""
    from autosched.search.options import Constraints, SolverOptions
    from autosched.search.entry import auto_schedule

    depths = list(range(2, max(2, opts.max_depth) + 1))
    solver = SolverOptions(time_limit_s=opts.time_limit_s / len(depths))
    found: List[Tuple[str, PipelinePlan]] = []
    lines: List[str] = []
    for d in depths:
        frozen = {t: {"stage": d - 1} for t in MODE_TASKS if t in graph.task_names}
        c = Constraints(max_depth=d, max_threads=opts.max_threads, device=device.type, frozen=frozen)
        usable = [(label, p) for label, p in known if p.pipeline_depth <= d]
        try:
            plan, report = auto_schedule(graph, costs, c, solver=solver, verify=False, seeds=usable or None)
        except Exception as exc:  # noqa: BLE001 - one depth failing leaves the others
            lines.append(f"  depth {d}: no plan ({type(exc).__name__}: {exc})")
            continue
        lines.append(f"  depth {d}: simulated {report.period_s * 1e3:.3f} ms/it ({report.status}, bound "
                     f"{report.lower_bound_s * 1e3:.3f} ms, binding {report.binding.split(' (')[0][:120]})")
        try:
            check_shape(plan)
        except ValueError as exc:
            lines.append(f"    not runnable by the drop-in: {exc}")
            continue
        found.append((f"auto:depth{d}", plan))
    return found, lines


def _candidates(graph: PipelinePlan, found: List[Tuple[str, PipelinePlan]],
                known: List[Tuple[str, PipelinePlan]]) -> List[Tuple[str, PipelinePlan]]:
    from autosched.verify.candidates import plan_key, serial_plan

    out: List[Tuple[str, PipelinePlan]] = []
    seen = set()
    for label, plan in found + [(f"seed:{label}", p) for label, p in known] + [("serial", serial_plan(graph))]:
        key = plan_key(plan)
        if key not in seen:
            seen.add(key)
            out.append((label, plan))
    return out


def _under_cap(cands: List[Tuple[str, PipelinePlan]], costs: Any, device: torch.device,
               cap: float) -> Tuple[List[Tuple[str, PipelinePlan]], List[str]]:
    """The candidates whose simulated peak bytes in flight fit ``cap``; a line per candidate.

    Raises
    ------
    autosched.search.memcap.MemoryCapError
        None fits: the message names the leanest candidate's peak and the least any plan needs.
    """
    from autosched.model.memory import format_bytes, min_memory
    from autosched.search.memcap import MemoryCapError
    from autosched.model.simulate import simulate

    peaks = {label: simulate(plan, costs, device=device.type).memory.peak_bytes for label, plan in cands}
    lines = [f"memory cap {format_bytes(cap)}: predicted peak bytes in flight per candidate"]
    lines += [f"  {label}: {format_bytes(peak)}{'' if peak <= cap else '  (over the cap)'}"
              for label, peak in peaks.items()]
    fitting = [(label, plan) for label, plan in cands if peaks[label] <= cap]
    if not fitting:
        graph = cands[-1][1]
        least = min_memory(list(graph.task_names), list(graph.intra_edges()), costs, device=device.type)
        lean = min(peaks, key=peaks.get)
        raise MemoryCapError(f"plan='auto', max_memory_bytes={cap:.0f} ({format_bytes(cap)}): no candidate fits; the "
                             f"leanest ({lean}) needs {format_bytes(peaks[lean])}, no plan less than "
                             f"{format_bytes(least.value)}. Raise max_memory_bytes, or make a batch hold less\n"
                             + "\n".join(lines), least.value)
    return fitting, lines


def _gather(group: Any, obj: Any, world: int) -> List[Any]:
    import torch.distributed as dist

    out: List[Any] = [None] * world
    dist.all_gather_object(out, obj, group=group)
    return out


def _broadcast(group: Any, obj: Any, rank: int) -> Any:
    import torch.distributed as dist

    box = [obj if rank == 0 else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    return box[0]


def _predictions(plans: Sequence[Tuple[str, PipelinePlan]], costs: Any, device: torch.device) -> Dict[str, float]:
    """Each candidate's simulated period (the calibrated model's when the costs carry a calibration)."""
    from autosched.verify.predict import predict_periods

    try:
        return predict_periods(plans, costs, device=device.type)
    except Exception:  # noqa: BLE001 - a prediction is a comment on the table, never a reason to fail
        return {}


def _slowest_costs(costs: Any, group: Any, world: int) -> Any:
    """Every rank's measured costs, the slowest of each figure kept (the same model on every rank)."""
    from autosched.model.costs import CostModel
    from swpipe.workloads.agree import combine_slowest

    docs = _gather(group, costs.to_dict(), world)
    cal = costs.machine_calibration
    costs = combine_slowest([CostModel.from_dict(d, where=f"rank {r}") for r, d in enumerate(docs)])
    return costs if cal is None else dataclasses.replace(costs, machine_calibration=cal)


def _searched_candidates(graph: PipelinePlan, costs: Any, device: torch.device, opts: AutoOptions, world: int,
                         rank: int, group: Any) -> Tuple[List[Tuple[str, Dict[str, Any]]], List[str]]:
    """Rank 0 searches and picks the candidates; every rank gets them: ``([(label, plan as dict)], report lines)``.

    Raises
    ------
    Exception
        The search's own error on rank 0; a ``RuntimeError`` saying so on every other rank.
    """
    known = seeds(graph)
    shared: Any = None
    failure: Optional[BaseException] = None
    if rank == 0:
        try:
            found, search_lines = _search(graph, costs, device, opts, known)
            cands = _candidates(graph, found, known)
            if opts.max_memory_bytes is not None:
                cands, cap_lines = _under_cap(cands, costs, device, float(opts.max_memory_bytes))
                search_lines += cap_lines
            else:  # TorchRec's TrainPipelineBase: the model's own forward (its bytes are not measured)
                cands.append((BASE, pipelines.get("base")))
            shared = ([(label, plan_to_dict(p)) for label, p in cands], search_lines)
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or the others wait forever
            failure, shared = exc, f"{type(exc).__name__}: {exc}"
    if world > 1:
        shared = _broadcast(group, shared, rank)
    if failure is not None:
        raise failure
    if isinstance(shared, str):
        raise RuntimeError(f"plan='auto': rank 0's search failed, so every rank stops: {shared}")
    return shared


def _verify(plans: List[Tuple[str, PipelinePlan]], batches: Sequence[Any], costs: Any, device: torch.device,
            opts: AutoOptions, world: int, group: Any) -> Any:
    """The candidates run in interleaved rounds, each paired with TorchRec's base plan (else the serial plan) in its
    round; on several ranks every rank runs them at once, the slowest rank's time of each round counting."""
    from autosched.verify.measure import VerifyOptions, measure_plans

    runs = list(itertools.islice(itertools.cycle(batches), max(opts.verify_iterations, 2 * len(batches), 4)))
    known_labels = [label for label, _ in plans if label.startswith("seed:")]
    rounds = max(1, opts.verify_rounds)
    verify = VerifyOptions(rounds=rounds, max_rounds=2 * rounds if world == 1 else rounds, device=str(device))
    baseline = BASE if BASE in dict(plans) else "serial"
    table = measure_plans(plans, runs, verify, known=known_labels, baseline=baseline,
                          predicted=_predictions([(k, p) for k, p in plans if k != BASE], costs, device))
    if world == 1:
        return table
    return table.with_slowest(_gather(group, {r.label: r.rounds_s for r in table.rows}, world))


def choose_plan(tasks: TorchRecTasks, batches: Sequence[Any], device: torch.device, opts: AutoOptions,
                world: int = 1, rank: int = 0, group: Any = None) -> AutoChoice:
    """Measure, search and verify on ``batches``, leave the model as it was; return the choice.

    Parameters
    ----------
    tasks : TorchRecTasks
        Built for the ``"fused"`` machinery (:func:`task_graph`'s tasks).
    batches : sequence
        The first batches of the pass (at least 2).
    device : torch.device
    opts : AutoOptions
    world, rank : int
        The job; with ``world > 1`` every rank calls this at once.
    group : torch.distributed.ProcessGroup, optional
        A gloo group for the exchanges (needed with ``world > 1``).

    Returns
    -------
    AutoChoice
    """
    t0 = time.perf_counter()
    model, optimizer = tasks.model, tasks.optimizer
    flags = [(m, m.training) for m in model.modules()]
    keep = tasks.keep_outputs
    snap = snapshot_state([model, optimizer])
    lines: List[str] = []
    try:
        model.train()
        tasks.keep_outputs = False
        tasks.reset()
        fns = tasks.functions(task_graph().task_names)
        graph = task_graph(fns)
        bound = runnable(graph, fns, world)
        costs = _measure_costs(bound, batches, device, opts, world, [model, optimizer])
        if world > 1:
            costs = _slowest_costs(costs, group, world)
        cand_fields, search_lines = _searched_candidates(graph, costs, device, opts, world, rank, group)
        lines += [f"costs: {costs.method or 'measured'} ({costs.notes.split(';')[0]})",
                  "search, one per depth (the forward and the tasks after it in the last stage):", *search_lines]
        plans = []
        for label, f in cand_fields:
            plan = plan_from_dict(f)
            plans.append((label, runnable(plan, tasks.functions(plan.task_names), world)))
        table = _verify(plans, batches, costs, device, opts, world, group)
        if world > 1:
            lines.append(f"verified on all {world} ranks at once, the slowest rank's time of each round counting")
        chosen = table.choose()
        lines += table.format().splitlines()
        plan = dict(cand_fields)[chosen.label]
        return AutoChoice(chosen.label, plan_from_dict(plan), table.verdict(), lines, time.perf_counter() - t0)
    finally:
        restore_state([model, optimizer], snap)
        for m, flag in flags:
            m.training = flag
        tasks.reset()
        tasks.keep_outputs = keep
