"""``auto_schedule``: the best PipelinePlan for a task graph and a cost model, and why it is best.

The search space is stage x thread group x stream x enqueue order (see
:mod:`autosched._problem`). Two searchers cover it:

* :mod:`autosched.beam` — beam search with stages derived by modulo list
  scheduling, scored by the simulator; any size;
* :mod:`autosched.cpsat` — the exact joint CP-SAT model, for graphs up to
  ``Constraints.cpsat_max_tasks`` tasks, hinted by the beam's best plan; it
  proves the minimum period of its model (``OPTIMAL``) or reports the gap.

Whatever the searchers say, the returned plan is the one with the best
*simulated* period (the simulator models the engine: progress barrier, FIFO
thread queues, sequencer), it passes ``validate`` and never deadlocks. When
the input is a plan (e.g. a hand-written TorchRec pipeline) that plan, as
given, is a candidate too, so the result is never worse than it.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan, stream_name

from ._problem import Problem, make_problem

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
    >>> from autosched.costs import CostModel, TaskCost
    >>> costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    >>> _, report = auto_schedule((["Load", "Step"], [("Step", "Load")]), costs, Constraints(max_depth=2, time_limit_s=10))
    >>> print(report.summary().splitlines()[0])
    auto_schedule (cpsat, OPTIMAL, device=cpu): period 3.000 ms  latency 6.000 ms
    >>> print(report.explain().splitlines()[-1])
    What would make it faster: halving Step (the largest task on thread:default): period 2.000 ms (33.3% faster).
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

    def summary(self) -> str:
        """A few lines: period, what binds, bound and gap, depth, status, what was tried."""
        lines = [
            f"auto_schedule ({self.method}, {self.status}, device={self.device}): "
            f"period {_ms(self.period_s)}  latency {_ms(self.latency_s)}",
            f"  binding: {self.binding}",
            f"  lower bound {_ms(self.lower_bound_s)} ({self.bound_binding}); gap {self.gap_pct:.1f}%",
            f"  serial {_ms(self.serial_period_s)} -> x{self.serial_period_s / max(self.period_s, 1e-30):.2f}",
        ]
        if self.baseline_period_s is not None:
            gain = 100 * (1 - self.period_s / self.baseline_period_s) if self.baseline_period_s > 0 else 0.0
            lines.append(f"  input plan {_ms(self.baseline_period_s)} -> {gain:.1f}% faster")
        lines.append(f"  depth {self.depth} of max {self.max_depth}: {self.depth_reason}")
        lines.append(f"  thread groups {self.threads}")
        if self.model_period_s is not None:
            bound = "" if self.proven_bound_s is None else f", proven bound {_ms(self.proven_bound_s)}"
            lines.append(f"  CP-SAT model period {_ms(self.model_period_s)}{bound}, solver {self.solver_time_s:.2f}s")
        tried = ", ".join(f"{k} {v}" for k, v in self.tried.items() if v)
        lines.append(f"  tried: {tried}; search {self.search_time_s:.2f}s")
        lines += [f"  note: {n}" for n in self.notes]
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
        out = [f"This plan finishes one iteration every {_ms(self.period_s)} in steady state, "
               f"x{self.serial_period_s / max(self.period_s, 1e-30):.2f} the serial loop ({_ms(self.serial_period_s)})."]
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
        out.append(f"What limits it: {self.binding}.")
        if self.gap_pct <= 0.05:
            out.append(f"It reaches the lower bound {_ms(self.lower_bound_s)} ({self.bound_binding}): "
                       "no plan with these costs and constraints is faster.")
        else:
            proof = " CP-SAT proved no plan in its model is faster." if self.status == "OPTIMAL" else ""
            out.append(f"It is {self.gap_pct:.1f}% above the lower bound {_ms(self.lower_bound_s)} "
                       f"({self.bound_binding}).{proof}")
        for text, period in self.what_if:
            gain = 100 * (1 - period / self.period_s) if self.period_s > 0 else 0.0
            out.append(f"What would make it faster: {text}: period {_ms(period)} ({gain:.1f}% faster).")
        if not self.what_if:
            out.append("What would make it faster: cheaper tasks on what limits it.")
        return "\n".join(out)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _plan_tables(plan: PipelinePlan, num_iterations: int) -> str:
    try:
        from swpipe_core.analysis import format_schedule, format_stage_analysis
    except ImportError:  # analysis is another room's module; the summary stays useful without it
        rows = [f"  {n:<24} stage {plan.stage(n)}  stream {plan.stream_of(n):<10} thread {plan.sched(n).thread_group}"
                for n in plan.enqueue_order or plan.task_names]
        return "enqueue order:\n" + "\n".join(rows)
    return format_schedule(plan, num_iterations) + "\n\n" + format_stage_analysis(plan)


# --------------------------------------------------------------------------- analysis of the result


def _serial_period(problem: Problem) -> float:
    return sum(problem.host[n] + problem.dev[n] for n in problem.names)


def _tasks_on(problem: Problem, plan: PipelinePlan, resource: str) -> List[str]:
    """Tasks that use a simulator resource name (``thread:<g>``, ``stream:<s>``, ``comm:<c>``, ``pcie``)."""
    out = []
    for n in problem.names:
        s = plan.sched(n)
        if (resource == f"thread:{s.thread_group}" or resource == f"stream:{stream_name(s.stream)}"
                or resource == f"comm:{problem.comm[n]}" or (resource == "pcie" and n in problem.pcie)):
            out.append(n)
    return out


def _what_ifs(problem: Problem, plan: PipelinePlan, sim: Any, num_iterations: int) -> List[Tuple[str, float]]:
    """Simulated effect (same plan) of halving the largest task on what binds it."""
    from .simulate import simulate

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
        res = simulate(plan, problem.costs.scaled(task, 0.5), num_iterations=num_iterations, device=problem.device)
    except Exception as exc:  # what-if is advice, never a failure of the search
        log.debug("what-if failed: %s", exc)
        return []
    return [(f"halving {task} ({where})", float(res.period))]


def _lower_bound(problem: Problem, model_lb_s: float, proven_s: Optional[float]) -> Tuple[float, str]:
    """The best lower bound: autosched.bounds', the model's, or CP-SAT's proof, with what sets it."""
    value, why = model_lb_s, "resource, recurrence and depth-limited critical path bounds of the model"
    try:
        from .bounds import lower_bounds
        from .graph import task_graph

        graph = task_graph(list(problem.names), list(problem.intra), list(problem.inter))
        b = lower_bounds(graph, problem.costs, max_threads=problem.max_threads, max_depth=problem.max_depth,
                         device=problem.device)
        if float(b.value) >= value * (1 - 1e-9):
            value, why = max(value, float(b.value)), str(b.binding)
    except Exception as exc:  # bounds belong to another module; the model bound stands alone
        log.debug("autosched.bounds unavailable: %s", exc)
    if proven_s is not None and proven_s > value * (1 + 1e-9):
        value, why = proven_s, f"CP-SAT proof: every shorter period is infeasible (analytic bounds give {_ms(value)})"
    return value, why


def _depth_reason(tasks_or_graph: Any, costs: Any, c: "Constraints", depth: int, period: float,
                  depth_proven: bool, budget_s: float) -> str:
    """Why this depth: the best period a quick search finds with one iteration fewer in flight."""
    import dataclasses

    from . import beam as beam_mod

    if depth == 1:
        return "one iteration in flight already reaches this period (least memory)"
    proven = "; CP-SAT proved no shallower plan reaches this period" if depth_proven else ""
    try:
        shallow = make_problem(tasks_or_graph, costs, dataclasses.replace(c, max_depth=depth - 1))
        got = beam_mod.beam_search(shallow, width=4, rounds=4, time_limit_s=budget_s, seed=c.seed).best
        p = beam_mod.sim_scorer(shallow, c.num_iterations)(got.plan)[0]
    except (ValueError, RuntimeError) as exc:
        return f"depth {depth - 1} admits no plan ({exc})"
    if p <= period * (1 + 1e-9):
        return f"depth {depth - 1} reaches the same period in a quick search{proven}"
    return f"the best plan found with {depth - 1} in flight runs at {_ms(p)} (+{100 * (p / period - 1):.1f}%){proven}"


# --------------------------------------------------------------------------- entry point


def auto_schedule(tasks_or_graph: Any, costs: Any, constraints: Optional[Constraints] = None, *,
                  deps: Optional[str] = None, batches: Any = None, state: Any = None
                  ) -> Tuple[PipelinePlan, SearchReport]:
    """Search the best plan: stages, thread groups, streams and enqueue order, jointly.

    Parameters
    ----------
    tasks_or_graph : networkx.DiGraph, PipelinePlan or tuple
        A task graph from ``autosched.graph.task_graph(tasks, intra, inter)``
        (edges ``dep -> task`` with ``distance`` 0 or N); a plan (its tasks and
        dependencies, its schedule as a starting point and a baseline); or
        ``(tasks, intra_deps[, inter_deps])`` with ``(task, dep)`` /
        ``(task, dep, N)`` pairs. ``PipelineTask`` objects keep their
        functions, so the returned plan runs as is.
    costs : CostModel
        A cost for every task (``host_s``, ``device_s``, ``comm:``/``pcie`` tags).
    constraints : Constraints, optional
    deps : {None, "infer"}
        ``"infer"``: ignore declared dependencies and infer them from a run of
        the bound tasks on ``batches`` (``state`` names the model's tensors);
        the report's notes list the inferred edges the plan honours
        (:mod:`autosched.inferred`).

    Returns
    -------
    (PipelinePlan, SearchReport)
        The plan (validated; ``enqueue_order`` set) and the report.

    Raises
    ------
    KeyError
        A task has no cost.
    ValueError
        Bad input (dependency cycle, unknown task in constraints, impossible caps).
    RuntimeError
        No plan satisfies the constraints.

    Examples
    --------
    >>> from autosched.costs import CostModel, TaskCost
    >>> costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    >>> plan, report = auto_schedule((["Load", "Step"], [("Step", "Load")]), costs,
    ...                              Constraints(max_depth=2, max_threads=2, time_limit_s=10))
    >>> plan.stage("Load"), plan.stage("Step"), round(report.period_s * 1e3, 3), report.status
    (0, 1, 3.0, 'OPTIMAL')
    """
    if deps is not None:  # observed dependencies: record, infer, then search (autosched/inferred.py)
        if deps != "infer":
            raise ValueError(f"deps must be None or 'infer', got {deps!r}")
        from .inferred import auto_schedule_inferred
        return auto_schedule_inferred(tasks_or_graph, costs, constraints, batches=batches, state=state)
    from swpipe_core.validate import validate

    from . import beam as beam_mod
    from .costs import as_cost_model
    from .cpsat import model_lower_bound, solve_cpsat
    from .simulate import simulate

    c = constraints or Constraints()
    if c.method not in ("auto", "cpsat", "beam"):
        raise ValueError(f"method must be 'auto', 'cpsat' or 'beam', got {c.method!r}")
    t0 = time.perf_counter()
    costs = as_cost_model(costs)
    problem = make_problem(tasks_or_graph, costs, c)
    use_cpsat = c.method == "cpsat" or (c.method == "auto" and len(problem.names) <= c.cpsat_max_tasks)
    final_scorer = beam_mod.sim_scorer(problem, c.num_iterations)

    # 1. beam search (any size); its best plan hints CP-SAT
    # budget: beam 30% then CP-SAT up to 70% (its depth refinement may add a fifth of that), or beam 85%;
    # the depth explanation takes at most 10%
    beam_budget = c.time_limit_s * (0.3 if use_cpsat else 0.85)
    beam = beam_mod.beam_search(problem, width=c.beam_width, rounds=c.beam_rounds, time_limit_s=beam_budget,
                                seed=c.seed, progress=c.progress)
    best = beam.best
    best.period, best.latency = final_scorer(best.plan)
    shallower, _ = beam_mod.reduce_depth(problem, best, final_scorer, beam_mod.recurrence_bound(problem))
    best = shallower
    chosen_plan, period, latency, method = best.plan, best.period, best.latency, "beam"
    bc = beam.counts
    tried = {"beam candidates": bc["candidates"], "beam distinct": bc["unique"], "beam simulated": bc["simulated"],
             "beam stage vectors tried": bc["stage_enumerated"], "beam rounds": bc["rounds"]}
    status, model_period, proven, solver_time, depth_proven = "HEURISTIC", None, None, 0.0, False
    notes: List[str] = []

    # 2. CP-SAT (small graphs): exact in its model; the simulator has the last word
    if use_cpsat:
        left = max(1.0, c.time_limit_s * 0.7 - (time.perf_counter() - t0))
        upper = best.ii if best.ii else int(math.ceil(best.period / problem.unit_s))
        res = solve_cpsat(problem, time_limit_s=left, num_workers=c.num_workers, seed=c.seed, hint=best, upper=upper)
        tried["CP-SAT solves"] = len(res.tried)
        solver_time, proven = res.solve_time_s, res.bound_s
        if res.plan is not None:
            model_period = res.period_s
            cp_period, cp_latency = final_scorer(res.plan)
            rank = lambda p, d, l: (round(p / problem.unit_s, 3), d, round(l / problem.unit_s, 3))  # noqa: E731
            if rank(cp_period, res.plan.pipeline_depth, cp_latency) <= rank(period, chosen_plan.pipeline_depth, latency):
                chosen_plan, period, latency, method = res.plan, cp_period, cp_latency, "cpsat"
                depth_proven = res.refined == "OPTIMAL"
            elif round(cp_period / problem.unit_s, 3) > round(period / problem.unit_s, 3):
                notes.append(f"CP-SAT's plan simulates at {_ms(cp_period)}, the beam's at {_ms(period)}: "
                             f"the model approximates {problem.device} semantics")
            else:
                notes.append("CP-SAT's plan ties on period; the beam's needs less depth or latency")
        status = res.status if res.plan is not None else "HEURISTIC"
        if status == "OPTIMAL" and period > res.period_s * (1 + 1e-6) + problem.unit_s:
            status = "FEASIBLE"

    # 3. judge the chosen plan with the simulator, and say why
    validate(chosen_plan)
    sim = simulate(chosen_plan, problem.costs, num_iterations=c.num_iterations, device=problem.device)
    period, latency = float(sim.period), float(sim.latency)
    lb, bound_why = _lower_bound(problem, model_lower_bound(problem) * problem.unit_s, proven)
    lb = min(lb, period)
    gap = 100.0 * (period / lb - 1.0) if lb > 0 else 0.0
    remaining = c.time_limit_s - (time.perf_counter() - t0)
    depth_reason = _depth_reason(tasks_or_graph, costs, c, chosen_plan.pipeline_depth, period, depth_proven,
                                 budget_s=max(0.5, min(3.0, 0.1 * c.time_limit_s, remaining)))
    baseline = None
    if problem.base_plan is not None:
        try:
            baseline = final_scorer(problem.base_plan)[0]
        except Exception as exc:  # an input plan outside the engine's rules has no baseline
            notes.append(f"input plan could not be simulated as given: {exc}")
    report = SearchReport(
        plan=chosen_plan, period_s=period, latency_s=latency, lower_bound_s=lb, gap_pct=gap, binding=str(sim.binding),
        bound_binding=bound_why, depth=chosen_plan.pipeline_depth, max_depth=problem.max_depth,
        depth_reason=depth_reason, threads=len({chosen_plan.sched(n).thread_group for n in chosen_plan.task_names}),
        method=method, status=status, model_period_s=model_period, proven_bound_s=proven, solver_time_s=solver_time,
        search_time_s=time.perf_counter() - t0, tried=tried, device=problem.device,
        serial_period_s=_serial_period(problem), baseline_period_s=baseline, utilisation=dict(sim.utilisation),
        what_if=_what_ifs(problem, chosen_plan, sim, c.num_iterations), notes=notes,
    )
    return chosen_plan, report
