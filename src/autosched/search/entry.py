"""``auto_schedule``: the best PipelinePlan for a task graph and a cost model, and why it is best.

The search space is stage x thread group x stream x enqueue order, and the
group run inline on the caller's thread with where its hand-offs go (see
:mod:`autosched.search.problem`). Two searchers cover it:

* :mod:`autosched.search.beam` — beam search with stages derived by modulo list
  scheduling, scored by the simulator; any size;
* :mod:`autosched.search.cpsat` — the exact joint CP-SAT model, for graphs up to
  ``Constraints.cpsat_max_tasks`` tasks, hinted by the beam's best plan; it
  proves the minimum period of its model (``OPTIMAL``) or reports the gap.

Whatever the searchers say, the returned plan is the one with the best
*simulated* period (the simulator models the engine: progress barrier, FIFO
thread queues, sequencer, the caller's group and its hand-offs), it passes
``validate`` and never deadlocks. It carries the caller's group the search
chose (``caller_group``; None when every group has a worker) and the
enqueue order that places its hand-offs. When
the input is a plan (e.g. a hand-written TorchRec pipeline) that plan, as
given, is a candidate too, so the result is never worse than it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan

from autosched.search.problem import Problem, make_problem

__all__ = ["Constraints", "SearchReport", "auto_schedule"]

log = logging.getLogger(__name__)


@dataclass
class Constraints:
    """What the searcher may choose, and how long it may take.

    Parameters
    ----------
    max_depth : int
        Most iterations in flight (memory): stages ``0 .. max_depth - 1``.
    max_threads : int
        Most CPU thread groups.
    streams : list of (str or None), optional
        Streams available (``None`` = default stream). Default: the streams the
        input plan uses (only the default stream for a bare graph). Streams are
        searched only for ``device="cuda"``; on CPU a stream is just a name.
    frozen : dict
        ``{task: {"stage": s, "stream": x, "thread_group": g}}`` (any subset),
        or ``{task: TaskSchedule}`` to freeze all three.
    globally_ordered : list of str, optional
        Collective tasks run in one global sequence. Default: the input plan's
        flags, or for a bare graph the tasks with a ``comm:`` cost tag.
    time_limit_s : float
        Wall-clock budget of the whole search.
    seed : int
        Makes the beam's sampling and CP-SAT's search reproducible.
    device : {"cpu", "cuda"}
        Which semantics the simulator (and the models) use.
    method : {"auto", "cpsat", "beam"}
        ``auto``: beam, then CP-SAT when the graph has at most
        ``cpsat_max_tasks`` tasks.
    cpsat_max_tasks : int
    beam_width, beam_rounds : int
    num_workers : int
        CP-SAT worker threads.
    num_iterations : int
        Simulated iterations for the final score.
    time_unit_s : float, optional
        The models' integer clock (default: about 1e-5 of a serial iteration).
    progress : bool
        tqdm progress bar over beam rounds.
    max_memory_bytes : float, optional
        Cap on the predicted peak bytes in flight (needs memory figures in the
        cost model): the search returns the fastest plan whose peak fits,
        trying every depth up to ``max_depth``, or raises
        :class:`autosched.search.memcap.MemoryCapError` naming the least memory a
        plan needs (:mod:`autosched.search.memcap`).

    Examples
    --------
    >>> Constraints(max_depth=2, frozen={"Forward": {"stream": None}}).max_threads
    2
    """

    max_depth: int = 3
    max_threads: int = 2
    streams: Optional[Sequence[Optional[str]]] = None
    frozen: Dict[Any, Any] = field(default_factory=dict)
    globally_ordered: Optional[Sequence[str]] = None
    time_limit_s: float = 30.0
    seed: int = 0
    device: str = "cpu"
    method: str = "auto"
    cpsat_max_tasks: int = 20
    beam_width: int = 6
    beam_rounds: int = 20
    num_workers: int = 2
    num_iterations: int = 60
    time_unit_s: Optional[float] = None
    progress: bool = False
    max_memory_bytes: Optional[float] = None

    def __post_init__(self) -> None:
        from autosched._fields import check_fields, flag, integer, mapping, names, number, one_of, optional

        check_fields(self, {
            "max_depth": integer(1), "max_threads": integer(1), "streams": optional(names(allow_none=True)),
            "frozen": mapping(expected="a dict {task: {'stage'|'stream'|'thread_group': value}} or {task: TaskSchedule}"),
            "globally_ordered": optional(names()), "time_limit_s": number(0, strict=True), "seed": integer(0),
            "device": one_of(("cpu", "cuda")), "method": one_of(("auto", "cpsat", "beam")),
            "cpsat_max_tasks": integer(0), "beam_width": integer(1), "beam_rounds": integer(1),
            "num_workers": integer(1), "num_iterations": integer(2), "time_unit_s": optional(number(0, strict=True)),
            "progress": flag(), "max_memory_bytes": optional(number(0, strict=True)),
        })


@dataclass
class SearchReport:
    """What ``auto_schedule`` found, how good it is, and why.

    Times are seconds. ``period_s``/``latency_s`` are simulated (steady state);
    ``binding`` is what the simulator says limits this plan and
    ``utilisation`` how busy each resource is. ``lower_bound_s`` is a period
    no plan in the space can beat (``bound_binding`` says why); ``gap_pct`` =
    ``100 * (period / bound - 1)``. ``status`` is ``OPTIMAL`` when CP-SAT proved
    its model's minimum and the simulated plan reaches it, ``FEASIBLE`` when
    CP-SAT ran out of time, ``HEURISTIC`` for beam search alone. Print it
    (``str(report)``) for the summary, the schedule table and the stage
    analysis; :meth:`explain` says it in words.

    Examples
    --------
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    >>> _, report = auto_schedule((["Load", "Step"], [("Step", "Load")]), costs, Constraints(max_depth=2, time_limit_s=10))
    >>> print(report.summary().splitlines()[0])
    auto_schedule (cpsat, model OPTIMAL, device=cpu): simulated period 3.000 ms, latency 6.000 ms - NOT VERIFIED
    >>> print(report.explain().splitlines()[-1])
    What would make it faster: halving Step (the largest task on thread:default): simulated period 2.000 ms (33.3% faster).
    """

    plan: PipelinePlan
    period_s: float
    latency_s: float
    lower_bound_s: float
    gap_pct: float
    binding: str
    bound_binding: str
    depth: int
    max_depth: int
    depth_reason: str
    threads: int
    method: str
    status: str
    model_period_s: Optional[float]
    proven_bound_s: Optional[float]
    solver_time_s: float
    search_time_s: float
    tried: Dict[str, int]
    device: str
    serial_period_s: float
    baseline_period_s: Optional[float] = None
    utilisation: Dict[str, float] = field(default_factory=dict)
    what_if: List[Tuple[str, float]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    # memory (when the cost model has bytes): predicted peak, the least any plan needs, and under a cap
    # the best plan per depth cap (autosched.search.memcap.TradeoffPoint)
    peak_bytes: Optional[float] = None
    min_memory_bytes: Optional[float] = None
    max_memory_bytes: Optional[float] = None
    memory_tradeoff: List[Any] = field(default_factory=list)

    def tradeoff_table(self) -> str:
        """The period-vs-memory trade-off across depth caps (searched under ``max_memory_bytes``)."""
        from autosched.search.memcap import tradeoff_table

        return tradeoff_table(self.memory_tradeoff, self.max_memory_bytes)

    def plot_tradeoff(self, path: Optional[str] = None) -> Any:
        """Peak bytes against period per depth cap with the Pareto front and the cap (matplotlib figure)."""
        from autosched.search.memcap import tradeoff_plot

        return tradeoff_plot(self.memory_tradeoff, self.max_memory_bytes, path)
    verify: Optional[Any] = None  # autosched.verify.loop.VerifyTable when the plans were measured on the engine
    iterations_run: int = 0  # iterations of the user's tasks the call ran (verification, recording)
    state_restored: bool = False  # state= was given and restored after those runs
    inferred: Optional[Any] = None  # deps="infer": the swpipe_core.dataflow.InferredDeps the search used

    @property
    def measured(self) -> Optional[Any]:
        """The chosen plan's measurement on the engine (``verify``'s row), or ``None`` when unverified."""
        return None if self.verify is None else self.verify.choose()

    def _machine_model(self) -> str:
        folded = [n for n in self.notes if n.startswith("searched with the machine calibration")]
        return folded[0] if folded else "searched with the cost model as given (no machine calibration)"

    def _headline(self) -> List[str]:
        """The first lines: measured figures when verified, else the simulated ones marked unverified."""
        chosen = self.measured
        if chosen is None:
            return [f"auto_schedule ({self.method}, model {self.status}, device={self.device}): simulated period "
                    f"{_ms(self.period_s)}, latency {_ms(self.latency_s)} - NOT VERIFIED",
                    f"  {self._machine_model()}; pass batches=[...] to measure the candidates on the engine",
                    f"  serial {_ms(self.serial_period_s)} simulated -> x{self.serial_period_s / max(self.period_s, 1e-30):.2f}"]
        table = self.verify
        serial = table["serial"].period_s if "serial" in table else None
        speedup = f", x{serial / chosen.period_s:.2f} the serial loop measured in the same rounds" if serial else ""
        return [f"auto_schedule ({self.method}, device={self.device}): measured period {_ms(chosen.period_s)}{speedup} "
                f"({chosen.label}, {table.verdict()})",
                f"  simulated period {_ms(self.period_s)} (model {self.status}), latency {_ms(self.latency_s)}"]

    def _against_input(self) -> Optional[str]:
        """How the result compares with the input plan: measured when both were measured."""
        table, chosen = self.verify, self.measured
        if table is not None and "input" in table:
            given = table["input"]
            if chosen is given:
                return f"  input plan {_ms(given.period_s)} measured: kept (nothing measured beats it)"
            if table.beats(chosen, given):
                return (f"  input plan {_ms(given.period_s)} measured -> "
                        f"{100 * (1 - chosen.period_s / given.period_s):.1f}% faster (measured)")
            return (f"  input plan {_ms(given.period_s)} measured: no measurable difference (within the noise band "
                    f"+-{table.noise_pct:.1f}%)")
        if self.baseline_period_s is None or self.baseline_period_s <= 0:
            return None
        gain = 100 * (1 - self.period_s / self.baseline_period_s)
        word = "faster" if gain >= 0 else "slower"
        return f"  input plan {_ms(self.baseline_period_s)} simulated -> {abs(gain):.1f}% {word} (simulated)"

    def summary(self) -> str:
        """A few lines: the period (measured when verified), what binds, bound and gap, depth, what was tried."""
        lines = self._headline() + [
            f"  binding (model): {self.binding}",
            f"  lower bound {_ms(self.lower_bound_s)} ({self.bound_binding}); model gap {self.gap_pct:.1f}%",
        ]
        against = self._against_input()
        if against:
            lines.append(against)
        lines.append(f"  depth {self.depth} of max {self.max_depth}: {self.depth_reason}")
        caller = self.plan.caller_group
        inline = f" ({caller} on the caller's thread)" if caller in self.plan.thread_groups else " (each with a worker)"
        lines.append(f"  thread groups {self.threads}{inline}")
        if self.model_period_s is not None:
            bound = "" if self.proven_bound_s is None else f", proven bound {_ms(self.proven_bound_s)}"
            lines.append(f"  CP-SAT model period {_ms(self.model_period_s)}{bound}, solver {self.solver_time_s:.2f}s")
        tried = ", ".join(f"{k} {v}" for k, v in self.tried.items() if v)
        lines.append(f"  tried: {tried}; search {self.search_time_s:.2f}s")
        if self.iterations_run:
            restored = ("your model was restored afterwards" if self.state_restored else
                        "they trained your model (pass state= to restore it)")
            lines.append(f"  ran your tasks {self.iterations_run} iterations on batches=: {restored}")
        if self.peak_bytes is not None:
            from autosched.model.memory import format_bytes

            cap = "" if self.max_memory_bytes is None else f" (cap {format_bytes(self.max_memory_bytes)})"
            least = "" if self.min_memory_bytes is None else f"; any plan needs >= {format_bytes(self.min_memory_bytes)}"
            lines.append(f"  predicted peak bytes in flight {format_bytes(self.peak_bytes)}{cap}{least}")
        if self.memory_tradeoff:
            lines += ["  " + row for row in self.tradeoff_table().splitlines()]
        lines += [f"  note: {n}" for n in self.notes]
        if self.verify is not None:
            lines.append(self.verify.format(indent="  "))
        return "\n".join(lines)

    def format(self, num_iterations: int = 3) -> str:
        """Summary, schedule table and stage analysis of the plan."""
        return "\n".join([self.summary(), "", _plan_tables(self.plan, num_iterations)])

    def __str__(self) -> str:
        return self.format()

    def explain(self) -> str:
        """Why the plan is fast and what would make it faster, in plain words.

        Returns
        -------
        str
        """
        groups: Dict[str, List[str]] = {}
        for n in self.plan.task_names:
            groups.setdefault(self.plan.sched(n).thread_group, []).append(n)
        members = "; ".join(f"{g}: " + ", ".join(v) for g, v in groups.items())
        chosen = self.measured
        if chosen is not None and "serial" in self.verify:
            serial = self.verify["serial"].period_s
            out = [f"Measured on the engine, this plan finishes one iteration every {_ms(chosen.period_s)}, "
                   f"x{serial / max(chosen.period_s, 1e-30):.2f} the serial loop ({_ms(serial)}) in the same rounds "
                   f"({self.verify.verdict()}); the model predicts {_ms(self.period_s)}."]
        else:
            out = [f"The model predicts this plan finishes one iteration every {_ms(self.period_s)} in steady state, "
                   f"x{self.serial_period_s / max(self.period_s, 1e-30):.2f} the serial loop "
                   f"({_ms(self.serial_period_s)}); not verified (pass batches= to measure it)."]
        if self.depth > 1:
            by_stage: Dict[int, List[str]] = {}
            for n in self.plan.task_names:
                by_stage.setdefault(self.plan.stage(n), []).append(n)
            stages = "; ".join(f"stage {s}: {', '.join(v)}" for s, v in sorted(by_stage.items()))
            out.append(f"It is fast because {self.depth} iterations are in flight ({stages}), so work of different "
                       f"iterations overlaps across {len(groups)} thread group(s) ({members}). "
                       f"Depth {self.depth}: {self.depth_reason}.")
        else:
            out.append(f"One iteration is in flight at a time, on {len(groups)} thread group(s) ({members}): "
                       f"{self.depth_reason}.")
        out.append(f"What limits it in the model: {self.binding}.")
        if self.gap_pct <= 0.05:
            out.append(f"In the model it reaches the lower bound {_ms(self.lower_bound_s)} ({self.bound_binding}): "
                       "no plan with these costs and constraints is faster.")
        else:
            proof = " CP-SAT proved no plan in its model is faster." if self.status == "OPTIMAL" else ""
            out.append(f"In the model it is {self.gap_pct:.1f}% above the lower bound {_ms(self.lower_bound_s)} "
                       f"({self.bound_binding}).{proof}")
        limit = self.verify.machine_limit() if self.verify is not None else None
        if limit:
            out.append(limit[0].upper() + limit[1:] + ".")
        for text, period in self.what_if:
            gain = 100 * (1 - period / self.period_s) if self.period_s > 0 else 0.0
            out.append(f"What would make it faster: {text}: simulated period {_ms(period)} ({gain:.1f}% faster).")
        if not self.what_if:
            out.append("What would make it faster: cheaper tasks on what limits it.")
        return "\n".join(out)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _plan_tables(plan: PipelinePlan, num_iterations: int) -> str:
    from swpipe_core.analysis import format_schedule, format_stage_analysis

    return format_schedule(plan, num_iterations) + "\n\n" + format_stage_analysis(plan)


# --------------------------------------------------------------------------- analysis of the result


def _serial_period(problem: Problem, plan: PipelinePlan) -> float:
    """The serial plan's period in the call's model (the tasks one after the other, plus the engine's time)."""
    from autosched.verify.loop import serial_plan

    try:
        return float(problem.simulate(serial_plan(plan)).period)
    except Exception:  # noqa: BLE001 - a plan outside the simulator's rules: the sum of the tasks
        return sum(problem.host[n] + problem.dev[n] for n in problem.names)


def _tasks_on(problem: Problem, plan: PipelinePlan, resource: str) -> List[str]:
    """Tasks that use a simulator resource name (``thread:<g>``, ``stream:<s>``, ``comm:<c>``, ``pcie``)."""
    return [n for n in problem.names if resource in _holds(problem.parts(n, plan.sched(n).thread_group, plan.sched(n).stream))]


def _holds(parts: Any) -> Tuple[str, ...]:
    return parts.host_holds + parts.device_holds


def _what_ifs(problem: Problem, plan: PipelinePlan, sim: Any, num_iterations: int) -> List[Tuple[str, float]]:
    """Simulated effect (same plan) of halving the largest task on what binds it."""
    from autosched.model.machine import simulate_folded

    if not hasattr(problem.costs, "scaled"):
        return []
    util = dict(sim.utilisation)
    resource = max(util, key=lambda k: (util[k], k)) if util else ""
    on = _tasks_on(problem, plan, resource) if util and util[resource] >= 0.999 else []
    where = f"the largest task on {resource}"
    if not on:
        on = sorted({step[0] for step in sim.critical_cycle.steps})
        where = "the largest task on the critical cycle"
    if not on:
        return []
    task = max(on, key=lambda n: (problem.host[n] + problem.dev[n], n))
    try:
        res = simulate_folded(plan, problem.costs.scaled(task, 0.5), problem.calibration,
                              num_iterations=num_iterations, device=problem.device)
    except Exception as exc:  # what-if is advice, never a failure of the search
        log.debug("what-if failed: %s", exc)
        return []
    return [(f"halving {task} ({where})", float(res.period))]


def _lower_bound(problem: Problem, model_lb_s: float, proven_s: Optional[float]) -> Tuple[float, str]:
    """The best lower bound: autosched.search.bounds', the model's, or CP-SAT's proof, with what sets it."""
    from autosched.search.bounds import lower_bounds
    from autosched.model.graph import task_graph

    value, why = model_lb_s, "resource, recurrence and depth-limited critical path bounds of the model"
    graph = task_graph(list(problem.names), list(problem.intra), list(problem.inter))
    b = lower_bounds(graph, problem.costs, max_threads=problem.max_threads, max_depth=problem.max_depth,
                     device=problem.device)
    if float(b.value) >= value * (1 - 1e-9):
        value, why = max(value, float(b.value)), str(b.binding)
    if proven_s is not None and proven_s > value * (1 + 1e-9):
        value, why = proven_s, f"CP-SAT proof: every shorter period is infeasible (analytic bounds give {_ms(value)})"
    return value, why


def _depth_reason(tasks_or_graph: Any, costs: Any, c: "Constraints", depth: int, period: float,
                  depth_proven: bool, budget_s: float, calibration: Any = None) -> str:
    """Why this depth: the best period a quick search finds with one iteration fewer in flight."""
    import dataclasses

    from autosched.search import beam as beam_mod

    if depth == 1:
        return "one iteration in flight already reaches this period (least memory)"
    proven = "; CP-SAT proved no shallower plan reaches this period" if depth_proven else ""
    try:
        shallow = make_problem(tasks_or_graph, costs, dataclasses.replace(c, max_depth=depth - 1))
        shallow.calibration = calibration  # the same machine model
        got = beam_mod.beam_search(shallow, width=4, rounds=4, time_limit_s=budget_s, seed=c.seed).best
        p = beam_mod.sim_scorer(shallow, c.num_iterations)(got.plan)[0]
    except (ValueError, RuntimeError) as exc:
        return f"depth {depth - 1} admits no plan ({exc})"
    if p <= period * (1 + 1e-9):
        return f"depth {depth - 1} reaches the same period in a quick search{proven}"
    return f"the best plan found with {depth - 1} in flight runs at {_ms(p)} (+{100 * (p / period - 1):.1f}%){proven}"


# --------------------------------------------------------------------------- entry point


def auto_schedule(tasks_or_graph: Any, costs: Any, constraints: Optional[Constraints] = None, *,
                  seeds: Optional[Sequence[Any]] = None, verify: Any = None,
                  batches: Optional[Sequence[Any]] = None, deps: Optional[str] = None,
                  state: Any = None, calibrated: bool = True) -> Tuple[PipelinePlan, SearchReport]:
    """Search the best plan: stages, thread groups, streams and enqueue order, jointly.

    Parameters
    ----------
    tasks_or_graph : networkx.DiGraph, PipelinePlan or tuple
        A task graph from ``autosched.model.graph.task_graph(tasks, intra, inter)``
        (edges ``dep -> task`` with ``distance`` 0 or N); a plan (its tasks and
        dependencies, its schedule as a starting point and a baseline, its
        ``caller_group`` the name a group run on the caller's thread takes, or
        None: every group on a worker); or
        ``(tasks, intra_deps[, inter_deps])`` with ``(task, dep)`` /
        ``(task, dep, N)`` pairs. ``PipelineTask`` objects keep their
        functions, so the returned plan runs as is.
    costs : CostModel
        A cost for every task (``host_s``, ``device_s``, ``comm:``/``pcie`` tags).
    constraints : Constraints, optional
    seeds : list of PipelinePlan (or of (label, plan)), optional
        Known plans over the same tasks and dependencies (e.g. TorchRec's),
        scored beside the search's own and verified with them
        (:mod:`autosched.search.seeds`).
    verify : None, bool, int or autosched.verify.loop.VerifyOptions
        Run the top candidates, the input plan and the serial plan on the
        engine in interleaved rounds and return the one measured fastest
        (:mod:`autosched.verify.loop`); ``None`` (default): on when the tasks are
        runnable and ``batches`` are given; an int is the number of rounds.
    batches : sequence, optional
        Batches for the verification runs (and, with ``deps="infer"``, for
        recording the tasks' dataflow): with them the candidates are measured
        on the engine and every figure the report gives is the measured one.
        The tasks really run on them: pass ``state`` to have the model put
        back afterwards (the report counts the iterations either way).
    deps : {None, "infer"}
        ``"infer"``: ignore declared dependencies and infer them from a run of
        the bound tasks on ``batches`` (``state`` names the model's tensors);
        the report's notes list the inferred edges the plan honours
        (:mod:`autosched.search.inferred`).
    state : modules, optimizers, or a list of them, optional
        What the tasks train. With ``batches``, restored exactly after the
        call ran the tasks (parameters, buffers, gradients, optimizer state,
        random generators: :func:`swpipe_core.measure.state.restore_state`); without
        it a ``RuntimeWarning`` says how many iterations trained the model.
        With ``deps="infer"`` also the tensors the recorder names
        (:func:`swpipe_core.dataflow.record_dataflow`).
    calibrated : bool
        When ``costs`` carries a machine calibration
        (``TaskProfiler.profile(calibrate=True)``, or ``machine_calibration=``),
        search with the machine model folded in (:mod:`autosched.model.machine`,
        docs/semantics.md "The machine model"): the engine's cost per task,
        per hand-off and per period, and the free cores as a core pool (the
        tasks measured off the CPU take none). It is one model for the whole
        call: the searchers' simulator scores, the report's figures and the
        verification's predictions all come from it
        (:meth:`autosched.search.problem.Problem.simulate`). False: the tasks'
        costs as given.

    Returns
    -------
    (PipelinePlan, SearchReport)
        The plan (validated; ``enqueue_order`` set, with the hand-offs the
        search placed; ``caller_group`` the group it runs on the caller's
        thread, None when every group has a worker: docs/semantics.md, "The
        caller's group") and the report.

    Raises
    ------
    CostModelError
        A task has no cost.
    ValueError
        Bad input (dependency cycle, unknown task in constraints, impossible caps, ``batches`` with
        tasks that have no function).
    RuntimeError
        No plan satisfies the constraints.

    Examples
    --------
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    >>> plan, report = auto_schedule((["Load", "Step"], [("Step", "Load")]), costs,
    ...                              Constraints(max_depth=2, max_threads=2, time_limit_s=10))
    >>> plan.stage("Load"), plan.stage("Step"), round(report.period_s * 1e3, 3), report.status
    (0, 1, 3.0, 'OPTIMAL')

    A machine measured with one free core runs the two tasks one after the other, whatever the plan:

    >>> from swpipe_core.measure.calibrate import MachineCalibration
    >>> one_core = CostModel(costs.tasks, machine_calibration=MachineCalibration(cores_free=1.0, cpu_count=2))
    >>> plan, report = auto_schedule((["Load", "Step"], [("Step", "Load")]), one_core,
    ...                              Constraints(max_depth=2, max_threads=2, time_limit_s=10))
    >>> round(report.period_s * 1e3, 3), report.notes[0]
    (5.0, 'searched with the machine calibration folded in: engine costs per task, per hand-off and per period, 1 free core(s)')
    """
    snapshot = None
    if state is not None and batches is not None:
        from swpipe_core.measure.state import snapshot_state

        snapshot = snapshot_state(state)
    try:
        plan, report = _auto_schedule(tasks_or_graph, costs, constraints, seeds=seeds, verify=verify,
                                      batches=batches, deps=deps, state=state, calibrated=calibrated)
    finally:
        if snapshot is not None:
            from swpipe_core.measure.state import restore_state

            restore_state(state, snapshot)
    ran = _iterations_run(report, batches if deps == "infer" else None)
    report = dataclasses.replace(report, iterations_run=ran, state_restored=snapshot is not None)
    if ran and snapshot is None:
        warnings.warn(f"auto_schedule ran your tasks {ran} iterations on batches=: they trained your model (pass "
                      "state=[model, optimizer] to have it restored)", RuntimeWarning, stacklevel=2)
    return plan, report


def _iterations_run(report: "SearchReport", recorded: Optional[Sequence[Any]]) -> int:
    """Iterations of the user's tasks a call ran: every verification table's runs, and a dataflow recording."""
    n = len(recorded) if isinstance(recorded, Sequence) else 0
    table = report.verify
    while table is not None:
        n += table.iterations_run
        table = table.earlier
    return n


def _auto_schedule(tasks_or_graph: Any, costs: Any, constraints: Optional[Constraints], *, seeds: Any, verify: Any,
                   batches: Optional[Sequence[Any]], deps: Optional[str], state: Any,
                   calibrated: bool) -> Tuple[PipelinePlan, "SearchReport"]:
    """:func:`auto_schedule` without the snapshot of the user's state around it."""
    if deps is not None:  # observed dependencies: record, infer, then search (src/autosched/search/inferred.py)
        if deps != "infer":
            raise ValueError(f"deps must be None or 'infer', got {deps!r}")
        from autosched.search.inferred import auto_schedule_inferred

        return auto_schedule_inferred(tasks_or_graph, costs, constraints, batches=batches, state=state,
                                      seeds=seeds, verify=verify)
    from autosched.model.costs import as_cost_model

    c = constraints or Constraints()
    if c.method not in ("auto", "cpsat", "beam"):
        raise ValueError(f"method must be 'auto', 'cpsat' or 'beam', got {c.method!r}")
    costs = as_cost_model(costs)
    if not calibrated and costs.machine_calibration is not None:
        costs = dataclasses.replace(costs, machine_calibration=None)
    if c.max_memory_bytes is not None:  # one search per depth cap (each folds the calibration), keep the fastest that fits
        from autosched.search.memcap import schedule_under_cap

        if seeds or verify or batches is not None:
            raise ValueError("max_memory_bytes: the search under a memory cap ranks plans by the simulator only; "
                             "seeds, verify and batches are not supported with it yet - drop them, or drop the cap "
                             "and check the report's peak_bytes")

        return schedule_under_cap(tasks_or_graph, costs, c)
    # the machine model of this call (autosched.model.machine): the calibration folded into the costs once; the problem
    # keeps it for the per-hand-off and per-period terms, so every simulation below (search, report, verification)
    # is of one model
    calibration, folded_note = costs.machine_calibration, None
    if calibration is not None:
        from autosched.model.machine import searched_costs

        costs = searched_costs(costs, device=c.device)
        folded_note = ("searched with the machine calibration folded in: engine costs per task, per hand-off and per "
                       "period" + costs.notes.rpartition("calibrated: engine costs per task")[2])
    t0 = time.perf_counter()
    problem = make_problem(tasks_or_graph, costs, c)
    problem.calibration = calibration
    use_cpsat = c.method == "cpsat" or (c.method == "auto" and len(problem.names) <= c.cpsat_max_tasks)
    # budget: beam 30% then CP-SAT up to 70% (its depth refinement may add a fifth of that), or beam 85%;
    # the depth explanation takes at most 10%
    found = _search_beam(problem, c, c.time_limit_s * (0.3 if use_cpsat else 0.85))
    if use_cpsat:
        _search_cpsat(problem, c, found, left_s=max(1.0, c.time_limit_s * 0.7 - (time.perf_counter() - t0)))
    _search_seeds(problem, found, seeds)
    if folded_note is not None:
        found.notes.insert(0, folded_note)
    report = _judge(tasks_or_graph, costs, problem, c, found, t0)
    # phase 4, verify in the loop (autosched.verify.loop): measured on the engine, the fastest wins
    from autosched.verify import loop as verify_mod

    if verify_mod.wanted(verify, problem, batches):
        plan, report = verify_mod.verify_search(report, found.pool, problem, batches, verify, c.num_iterations)
        report = _refit_round(tasks_or_graph, problem, c, seeds, report, batches, verify)
    return _with_enqueue_order(report)


def _refit_round(tasks_or_graph: Any, problem: Problem, c: Constraints, seeds: Optional[Sequence[Any]],
                 report: SearchReport, batches: Sequence[Any], verify: Any) -> SearchReport:
    """Phase 5: refit the core pool to the measurements (:mod:`autosched.verify.refit`) and, if it moved, search once more.

    The new search's plan is measured against the verified choice (and the
    serial plan) in fresh interleaved rounds and returned only if measured
    faster; either way the report's verification table says what happened.
    """
    from autosched.verify import loop as verify_mod
    from autosched.verify.refit import fit_core_pool

    table = report.verify
    fit = fit_core_pool(table, problem.costs, c.num_iterations, problem.device, problem.calibration)
    if fit is None:
        return report
    table.notes.append(f"refit: {fit.describe()}")
    if not fit.changed:
        return report
    t0 = time.perf_counter()
    refit_problem = make_problem(tasks_or_graph, fit.applied_to(problem.costs), c)
    refit_problem.calibration = problem.calibration
    use_cpsat = c.method == "cpsat" or (c.method == "auto" and len(refit_problem.names) <= c.cpsat_max_tasks)
    budget = c.time_limit_s / 2  # a second look, hinted by what is known: half the first search's time
    found = _search_beam(refit_problem, c, budget * (0.3 if use_cpsat else 0.85))
    if use_cpsat:
        _search_cpsat(refit_problem, c, found, left_s=max(1.0, budget * 0.7 - (time.perf_counter() - t0)))
    _search_seeds(refit_problem, found, seeds)
    measured = {verify_mod.plan_key(r.plan): r.label for r in table.rows if r.plan is not None}
    if verify_mod.plan_key(found.plan) in measured:
        table.notes.append(f"refit: the search with {fit.cores} core(s) picks a plan already measured "
                           f"({measured[verify_mod.plan_key(found.plan)]}); the choice stands")
        return report
    chosen = table.choose()
    try:
        chosen_s = float(found.scorer(chosen.plan)[0])
    except Exception:  # noqa: BLE001 - a measured plan the simulator rejects: let the measurement decide
        chosen_s = math.inf
    if found.period >= chosen_s - refit_problem.unit_s:
        table.notes.append(f"refit: with {fit.cores} core(s) the search's best plan simulates at {_ms(found.period)}, "
                           f"no faster than {chosen.label} ({_ms(chosen_s)}); the choice stands")
        return report
    return verify_mod.measure_refit(report, chosen, found.plan, refit_problem, batches, verify, c.num_iterations)


def _with_enqueue_order(report: SearchReport) -> Tuple[PipelinePlan, SearchReport]:
    """The report's plan with its enqueue order written out (a seed or the serial plan may leave it to the engine)."""
    import dataclasses

    from swpipe_core.order import enqueue_order

    plan = report.plan
    if plan.enqueue_order is None:
        plan = plan.replace(enqueue_order=enqueue_order(plan), pipeline_depth=plan.pipeline_depth)
        report = dataclasses.replace(report, plan=plan)
    return plan, report


@dataclass
class _Found:
    """What the searchers found so far: the chosen plan, its simulated figures and how it was found."""

    plan: PipelinePlan
    period: float
    latency: float
    method: str
    best: Any                                   # the beam's best Scored (hints CP-SAT)
    scorer: Any
    tried: Dict[str, int]
    status: str = "HEURISTIC"
    model_period: Optional[float] = None
    proven: Optional[float] = None
    solver_time: float = 0.0
    depth_proven: bool = False
    notes: List[str] = field(default_factory=list)
    pool: List[Tuple[str, Any]] = field(default_factory=list)  # (label, plan) candidates for verification


def _search_beam(problem: Problem, c: Constraints, budget_s: float) -> _Found:
    """Phase 1: beam search (any size), then the shallowest depth that keeps its period."""
    from autosched.search import beam as beam_mod
    from autosched.search.bounds import recurrence_bound

    scorer = beam_mod.sim_scorer(problem, c.num_iterations)
    beam = beam_mod.beam_search(problem, width=c.beam_width, rounds=c.beam_rounds, time_limit_s=budget_s,
                                seed=c.seed, progress=c.progress)
    best = beam.best
    best.period, best.latency = scorer(best.plan)
    best, _ = beam_mod.reduce_depth(problem, best, scorer, recurrence_bound(problem))
    bc = beam.counts
    tried = {"beam candidates": bc["candidates"], "beam distinct": bc["unique"], "beam simulated": bc["simulated"],
             "beam stage vectors tried": bc["stage_enumerated"], "beam rounds": bc["rounds"]}
    found = _Found(best.plan, best.period, best.latency, "beam", best, scorer, tried)
    found.pool = [("beam", best.plan), ("beam (deeper)", beam.best.plan)]
    return found


def _search_cpsat(problem: Problem, c: Constraints, found: _Found, left_s: float) -> None:
    """Phase 2 (small graphs): CP-SAT, exact in its model, hinted by the beam; the simulator has the last word."""
    from autosched.search.cpsat import solve_cpsat

    best = found.best
    upper = best.ii if best.ii else int(math.ceil(best.period / problem.unit_s))
    res = solve_cpsat(problem, time_limit_s=left_s, num_workers=c.num_workers, seed=c.seed, hint=best, upper=upper,
                      scorer=found.scorer)
    found.tried["CP-SAT solves"] = len(res.tried)
    found.solver_time, found.proven = res.solve_time_s, res.bound_s
    if res.plan is not None:
        found.pool.insert(0, ("cpsat", res.plan))
        found.model_period = res.period_s
        cp_period, cp_latency = found.scorer(res.plan)

        def rank(plan: PipelinePlan, period: float, latency: float) -> tuple:  # as the beam ranks (worker threads last)
            workers = len(plan.thread_groups) - (plan.caller_group in plan.thread_groups)
            return (round(period / problem.unit_s, 3), plan.pipeline_depth, round(latency / problem.unit_s, 3), workers)

        if rank(res.plan, cp_period, cp_latency) <= rank(found.plan, found.period, found.latency):
            found.plan, found.period, found.latency, found.method = res.plan, cp_period, cp_latency, "cpsat"
            found.depth_proven = res.refined == "OPTIMAL"
        elif round(cp_period / problem.unit_s, 3) > round(found.period / problem.unit_s, 3):
            found.notes.append(f"CP-SAT's plan simulates at {_ms(cp_period)}, the beam's at {_ms(found.period)}: "
                               f"the model approximates {problem.device} semantics")
        else:
            found.notes.append("CP-SAT's plan ties on period; the beam's needs less depth or latency")
    found.status = res.status if res.plan is not None else "HEURISTIC"
    if found.status == "OPTIMAL" and found.period > res.period_s * (1 + 1e-6) + problem.unit_s:
        found.status = "FEASIBLE"


def _search_seeds(problem: Problem, found: _Found, seeds: Optional[Sequence[Any]]) -> None:
    """Phase 2b: seed plans (:mod:`autosched.search.seeds`), scored by the same simulator and verified alongside."""
    from autosched.search.seeds import best_seed, check_seeds

    seed_plans, seed_notes = check_seeds(seeds, problem)
    found.notes += seed_notes
    found.plan, found.period, found.latency, found.method = best_seed(
        seed_plans, found.scorer, (found.plan, found.period, found.latency, found.method), problem.unit_s,
        found.notes)
    found.pool += seed_plans


def _judge(tasks_or_graph: Any, costs: Any, problem: Problem, c: Constraints, found: _Found,
           t0: float) -> SearchReport:
    """Phase 3: simulate the chosen plan, bound it, and say why it is what it is."""
    from swpipe_core.validate import validate

    from autosched.search.cpsat import model_lower_bound

    plan = found.plan
    validate(plan)
    sim = problem.simulate(plan, c.num_iterations)
    period, latency = float(sim.period), float(sim.latency)
    lb, bound_why = _lower_bound(problem, model_lower_bound(problem) * problem.unit_s, found.proven)
    lb = min(lb, period)
    remaining = c.time_limit_s - (time.perf_counter() - t0)
    depth_reason = _depth_reason(tasks_or_graph, costs, c, plan.pipeline_depth, period, found.depth_proven,
                                 budget_s=max(0.5, min(3.0, 0.1 * c.time_limit_s, remaining)),
                                 calibration=problem.calibration)
    baseline = None
    if problem.base_plan is not None:
        try:
            baseline = found.scorer(problem.base_plan)[0]
        except Exception as exc:  # an input plan outside the engine's rules has no baseline
            found.notes.append(f"input plan could not be simulated as given: {exc}")
    report = SearchReport(
        plan=plan, period_s=period, latency_s=latency, lower_bound_s=lb,
        gap_pct=100.0 * (period / lb - 1.0) if lb > 0 else 0.0, binding=str(sim.binding),
        bound_binding=bound_why, depth=plan.pipeline_depth, max_depth=problem.max_depth,
        depth_reason=depth_reason, threads=len(plan.thread_groups),
        method=found.method, status=found.status, model_period_s=found.model_period, proven_bound_s=found.proven,
        solver_time_s=found.solver_time, search_time_s=time.perf_counter() - t0, tried=found.tried,
        device=problem.device, serial_period_s=_serial_period(problem, plan), baseline_period_s=baseline,
        utilisation=dict(sim.utilisation), what_if=_what_ifs(problem, plan, sim, c.num_iterations), notes=found.notes,
    )
    if getattr(problem.costs, "has_bytes", False):
        from autosched.model.memory import min_memory

        report.peak_bytes = sim.memory.peak_bytes
        report.min_memory_bytes = min_memory(list(problem.names), list(problem.intra), problem.costs,
                                             device=problem.device).value
    return report
