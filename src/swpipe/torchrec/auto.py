"""``plan="auto"``: measure the model on its first batches, search, verify on the engine, restore the model.

:func:`choose_plan` is what :class:`~swpipe.torchrec.TrainPipeline` runs
before its first pass with ``plan="auto"``:

1. snapshot the model, the optimizer and the random generators
   (:func:`swpipe_core.measure.state.snapshot_state`); every measurement below really
   trains on the batches;
2. measure each task's cost over a serial run of the finest task graph of a
   TorchRec model (:func:`task_graph`: ``fused_sparse_dist``'s tasks, the
   embedding lookup a task of its own), with ``VerifyOptions(calibrate=True)``
   the machine (:func:`swpipe_core.measure.calibrate.calibrate`) and, with
   ``Constraints(max_memory_bytes=...)``, each task's bytes
   (:func:`swpipe_core.measure.memory.measure_task_memory`); on several ranks
   the slowest rank's cost of each task counts;
3. search (:func:`swpipe.auto_schedule`) once per pipeline depth up to
   ``Constraints.max_depth``, the forward and the tasks after it in the last
   stage (the drop-in's ``progress`` returns that batch's output), with
   TorchRec's plans over the same graph as seeds (:func:`seeds`), under the
   memory cap if one is given; ``SolverOptions.time_limit_s`` is shared by the
   depths;
4. verify: the searched plans, the seeds, TorchRec's ``base`` plan (the
   model's own forward: no input-dist tasks, so not a seed of the search; the
   sharded modules get their forward back for its runs) and the serial loop run
   on the engine in interleaved rounds (:func:`autosched.verify.measure.measure_plans`),
   each paired with ``base``'s run in its round (under a memory cap, whose
   bytes ``base`` does not measure, the serial plan's): ``base``, the simplest,
   is chosen unless a plan beats it beyond the rounds' noise; of those the best,
   a seed (a TorchRec plan) unless another plan beats it measurably; on several
   ranks every rank runs the candidates at once and the slowest rank's time of
   each round counts;
5. restore the snapshot (and each module's train/eval flag): training then
   starts from the state the user handed over, on the same batches.

Rank 0 searches and shares its candidates, so every rank runs one plan.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from swpipe_core import pipelines
from swpipe_core.plan import PipelinePlan
from swpipe_core.planfile import plan_from_dict, plan_to_dict
from swpipe_core.measure.state import restore_state, snapshot_state

from autosched.search.options import Constraints, SolverOptions
from autosched.verify.measure import VerifyOptions

from swpipe.torchrec.plans import at_depth, check_shape, runnable
from swpipe.torchrec.tasks import MODE_TASKS, TorchRecTasks

__all__ = ["AutoChoice", "auto_options", "task_graph", "seeds", "choose_plan"]

#: the search's budget when ``solver=`` is not given (shared by the depths searched)
DEFAULT_TIME_LIMIT_S = 6.0
#: serial iterations of the cost measurement, and batches per verification run, when ``VerifyOptions.iterations``
#: is not given
DEFAULT_ITERATIONS = 24


def auto_options(constraints: Optional[Constraints], solver: Optional[SolverOptions], verify: Optional[VerifyOptions],
                 device: torch.device) -> Tuple[Constraints, SolverOptions, VerifyOptions]:
    """``plan="auto"``'s options, checked, with the drop-in's defaults; ``(constraints, solver, verify)``.

    The device is the pipeline's: ``Constraints.device`` becomes its type, and ``VerifyOptions.device``, when
    given, must name it. The forward and the tasks after it run in the last stage of every depth searched, so
    ``Constraints.frozen`` may fix their stream or thread group, not their stage.

    Raises
    ------
    TypeError
        An option of another type (naming the argument and the type it takes).
    ValueError
        A device other than the pipeline's, or a frozen stage of a task that must run in the last one.

    Examples
    --------
    >>> import torch
    >>> from swpipe import Constraints, SolverOptions
    >>> c, s, v = auto_options(Constraints(max_depth=2), None, None, torch.device("cpu"))
    >>> c.max_depth, s.time_limit_s, v.rounds
    (2, 6.0, 5)
    >>> auto_options(SolverOptions(), None, None, torch.device("cpu"))
    Traceback (most recent call last):
    ...
    TypeError: TrainPipeline(constraints=...): expected a Constraints or None, got SolverOptions
    """
    for name, value, cls in (("constraints", constraints, Constraints), ("solver", solver, SolverOptions),
                             ("verify", verify, VerifyOptions)):
        if value is not None and not isinstance(value, cls):
            raise TypeError(f"TrainPipeline({name}=...): expected a {cls.__name__} or None, got "
                            f"{type(value).__name__}")
    constraints = constraints or Constraints()
    if constraints.device != device.type and constraints.device != "cpu":
        raise ValueError(f"Constraints(device={constraints.device!r}) for a pipeline on {device}: the plan runs on "
                         "the pipeline's device; drop the field")
    measured_on = torch.device(verify.device) if verify is not None and verify.device is not None else device
    if measured_on.type != device.type or None not in (measured_on.index, device.index) and measured_on != device:
        raise ValueError(f"VerifyOptions(device={verify.device!r}) for a pipeline on {device}: the candidates are "
                         "measured on the pipeline's device; drop the field")
    # a TaskSchedule fixes all three (stage, stream, thread group); a dict the ones it names
    staged = sorted(t for t, fixed in constraints.frozen.items()
                    if t in MODE_TASKS and (not isinstance(fixed, Mapping) or "stage" in fixed))
    if staged:
        raise ValueError(f"Constraints(frozen=...) fixes the stage of {staged}; plan='auto' runs "
                         f"{', '.join(MODE_TASKS)} in the last stage of every depth it searches (progress() returns "
                         "that batch's output): freeze their stream or thread group only")
    solver = solver or SolverOptions(time_limit_s=DEFAULT_TIME_LIMIT_S)
    return dataclasses.replace(constraints, device=device.type), solver, verify or VerifyOptions()


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
    table : VerifyTable, optional
        What the verification measured: per candidate its periods by round and
        (``table.paired(label)``) its median ratio to TorchRec's ``base`` plan
        in the same rounds, with the middle half of those ratios.
    """

    label: str
    plan: PipelinePlan
    verdict: str
    lines: List[str] = field(default_factory=list)
    seconds: float = 0.0
    table: Optional[Any] = None

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


def _measure_costs(graph: PipelinePlan, batches: Sequence[Any], device: Any, memory: bool, verify: VerifyOptions,
                   world: int, state: Any) -> Any:
    from swpipe_core.engine.pipeline import SWPipeline

    costs = _serial_costs(graph, batches, device, verify.iterations or DEFAULT_ITERATIONS)
    if memory:
        from swpipe_core.measure.memory import measure_task_memory

        with SWPipeline(graph, device=device) as pipe:
            costs = costs.with_memory(measure_task_memory(pipe, batches[0], num_iterations=2))
    if verify.calibrate:
        from swpipe_core.measure.calibrate import calibrate

        if world == 1:
            with SWPipeline(graph, device=device) as pipe:
                cal = calibrate(pipe, batches[0], iterations=100, repeats=3, cpu_iterations=3, state=state)
        else:  # the tasks' own shares would run collectives the other ranks do not: the machine's figures only
            cal = calibrate(iterations=100, repeats=3)
        costs = dataclasses.replace(costs, machine_calibration=cal)
    return costs


def _search(graph: PipelinePlan, costs: Any, constraints: Constraints, solver: SolverOptions,
            known: List[Tuple[str, PipelinePlan]]) -> Tuple[List[Tuple[str, PipelinePlan]], List[str]]:
    """One search per depth, the mode tasks frozen in the last stage; ``(label, plan)`` found and report lines."""
    from swpipe import auto_schedule

    depths = list(range(2, max(2, constraints.max_depth) + 1))
    per_depth = dataclasses.replace(solver, time_limit_s=solver.time_limit_s / len(depths))
    found: List[Tuple[str, PipelinePlan]] = []
    lines: List[str] = []
    for d in depths:
        searched = at_depth(constraints, graph.task_names, d, graph.caller_group)
        # under a memory cap the search ranks by the simulator alone and takes no seeds: the seeds are still
        # candidates (``_candidates``), each kept only if its predicted peak fits (``_under_cap``)
        usable = [(label, p) for label, p in known if p.pipeline_depth <= d and constraints.max_memory_bytes is None]
        try:
            plan, report = auto_schedule(graph, costs, searched, solver=per_depth, verify=False, seeds=usable or None)
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
        found.append((f"auto:depth{d}", plan, report.period_s))
    found.sort(key=lambda f: f[2])  # the best simulated first: VerifyOptions.top of them are measured
    return [(label, plan) for label, plan, _ in found], lines


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
                             + "\n".join(lines), least.value, cap, peaks[lean])
    return fitting, lines


def _gather(group: Any, obj: Any) -> List[Any]:
    import torch.distributed as dist

    out: List[Any] = [None] * dist.get_world_size(group)
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


def _slowest_costs(costs: Any, group: Any) -> Any:
    """Every rank's measured costs, the slowest of each figure kept (the same model on every rank)."""
    from autosched.model.costs import CostModel, combine_slowest

    docs = _gather(group, costs.to_dict())
    cal = costs.machine_calibration
    costs = combine_slowest([CostModel.from_dict(d, where=f"rank {r}") for r, d in enumerate(docs)])
    return costs if cal is None else dataclasses.replace(costs, machine_calibration=cal)


def _searched_candidates(graph: PipelinePlan, costs: Any, constraints: Constraints, solver: SolverOptions,
                         top: int, rank: int, group: Any) -> Tuple[List[Tuple[str, Dict[str, Any]]], List[str]]:
    """Rank 0 searches and picks the candidates (its ``top`` best searched plans, the seeds, the serial plan and
    TorchRec's base plan); every rank gets them: ``([(label, plan as dict)], report lines)``.

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
            found, search_lines = _search(graph, costs, constraints, solver, known)
            cands = _candidates(graph, found[:top], known)
            cap = constraints.max_memory_bytes
            if cap is not None:
                cands, cap_lines = _under_cap(cands, costs, torch.device(constraints.device), float(cap))
                search_lines += cap_lines
            else:  # TorchRec's TrainPipelineBase: the model's own forward (its bytes are not measured)
                cands.append((BASE, pipelines.get("base")))
            shared = ([(label, plan_to_dict(p)) for label, p in cands], search_lines)
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or the others wait forever
            failure, shared = exc, f"{type(exc).__name__}: {exc}"
    if group is not None:
        shared = _broadcast(group, shared, rank)
    if failure is not None:
        raise failure
    if isinstance(shared, str):
        raise RuntimeError(f"plan='auto': rank 0's search failed, so every rank stops: {shared}")
    return shared


def _verify(plans: List[Tuple[str, PipelinePlan]], batches: Sequence[Any], costs: Any, device: torch.device,
            verify: VerifyOptions, group: Any) -> Any:
    """The candidates run in interleaved rounds, each paired with TorchRec's base plan (else the serial plan) in its
    round; on several ranks every rank runs them at once (the same rounds: no racing), the slowest rank's time of
    each round counting."""
    from autosched.verify.measure import measure_plans

    runs = list(itertools.islice(itertools.cycle(batches),
                                 max(verify.iterations or DEFAULT_ITERATIONS, 2 * len(batches), 4)))
    known = [label for label, _ in plans if label.startswith("seed:")] if verify.keep_known else []
    lockstep = group is not None
    opts = dataclasses.replace(verify, device=str(device), max_rounds=verify.rounds if lockstep else verify.max_rounds)
    baseline = BASE if BASE in dict(plans) else "serial"
    table = measure_plans(plans, runs, opts, known=known, baseline=baseline,
                          predicted=_predictions([(k, p) for k, p in plans if k != BASE], costs, device))
    if not lockstep:
        return table
    return table.with_slowest(_gather(group, {r.label: r.rounds_s for r in table.rows}))


def choose_plan(tasks: TorchRecTasks, batches: Sequence[Any], constraints: Constraints, solver: SolverOptions,
                verify: VerifyOptions, group: Any = None) -> AutoChoice:
    """Measure, search and verify on ``batches``, leave the model as it was; return the choice.

    Parameters
    ----------
    tasks : TorchRecTasks
        Built for the ``"fused"`` machinery (:func:`task_graph`'s tasks), on the pipeline's device.
    batches : sequence
        The first batches of the pass (at least 2).
    constraints, solver, verify : Constraints, SolverOptions, VerifyOptions
        As :func:`auto_options` returns them.
    group : torch.distributed.ProcessGroup, optional
        With several ranks, a gloo group of them all for the exchanges: every rank calls this at once, rank 0
        searches, every rank measures the candidates.

    Returns
    -------
    AutoChoice
    """
    import torch.distributed as dist

    t0 = time.perf_counter()
    world, rank = (dist.get_world_size(group), dist.get_rank(group)) if group is not None else (1, 0)
    model, optimizer, device = tasks.model, tasks.optimizer, tasks.device
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
        costs = _measure_costs(bound, batches, device, constraints.max_memory_bytes is not None, verify, world,
                               [model, optimizer])
        if world > 1:
            costs = _slowest_costs(costs, group)
        cand_fields, search_lines = _searched_candidates(graph, costs, constraints, solver, verify.top, rank, group)
        lines += [f"costs: {costs.method or 'measured'} ({costs.notes.split(';')[0]})",
                  "search, one per depth (the forward and the tasks after it in the last stage):", *search_lines]
        plans = []
        for label, f in cand_fields:
            plan = plan_from_dict(f)
            plans.append((label, runnable(plan, tasks.functions(plan.task_names), world)))
        table = _verify(plans, batches, costs, device, verify, group)
        if world > 1:
            lines.append(f"verified on all {world} ranks at once, the slowest rank's time of each round counting")
        chosen = table.choose()
        lines += table.format().splitlines()
        plan = dict(cand_fields)[chosen.label]
        return AutoChoice(chosen.label, plan_from_dict(plan), table.verdict(), lines, time.perf_counter() - t0, table)
    finally:
        restore_state([model, optimizer], snap)
        for m, flag in flags:
            m.training = flag
        tasks.reset()
        tasks.keep_outputs = keep
