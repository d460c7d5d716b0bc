"""Search under a memory cap: the fastest plan whose predicted peak bytes fit, and the period-vs-memory trade-off.

``auto_schedule(..., Constraints(max_memory_bytes=cap))`` comes here. Deeper
pipelines overlap more and keep more iterations' contexts alive, so the
search runs once per depth cap ``1 .. max_depth`` (each with its share of the
time budget), predicts each best plan's peak bytes in flight from a
simulated run (:func:`autosched.model.memory.predict_memory`), and returns the
fastest plan that fits (ties: less memory). The cap is refused up front when
it is below the least memory any plan needs
(:func:`autosched.model.memory.min_memory`, one iteration's own high-water mark),
and after the search when no plan found fits; both errors name the minimum.
Each depth cap's search is an ``auto_schedule`` of its own (the cap removed): :func:`cap_search` says which
before ``auto_schedule`` runs them, :func:`fastest_under_cap` picks among them after. The report carries the trade-off
(``SearchReport.tradeoff``: the cap and a :class:`autosched.search.tradeoff.TradeoffPoint` per depth cap) as a
table and a Pareto-front plot (:mod:`autosched.search.tradeoff`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan

from autosched.model.costs import CostModel
from autosched.model.memory import MemoryBound, MemoryPrediction, format_bytes, min_memory, predict_memory
from autosched.model.simulate import simulate
from autosched.search.options import Constraints, SolverOptions
from autosched.search.problem import GraphInput, make_problem
from autosched.search.report import SearchReport
from autosched.search.tradeoff import MemoryTradeoff, TradeoffPoint, tradeoff_table

__all__ = ["MemoryCapError", "CapSearch", "cap_search", "fastest_under_cap"]


class MemoryCapError(ValueError):
    """No plan fits ``Constraints.max_memory_bytes``.

    Attributes
    ----------
    min_bytes : float
        The least memory any plan needs (one iteration's own peak).
    cap_bytes : float or None
        The cap asked for.
    leanest_bytes : float or None
        What the leanest plan found needs, when plans were found (none fit).

    Examples
    --------
    >>> e = MemoryCapError("cap 1.00 KiB is below ...", min_bytes=4096.0, cap_bytes=1024.0)
    >>> e.min_bytes, e.cap_bytes
    (4096.0, 1024.0)
    """

    def __init__(self, message: str, min_bytes: float, cap_bytes: Optional[float] = None,
                 leanest_bytes: Optional[float] = None) -> None:
        super().__init__(message)
        self.min_bytes, self.cap_bytes, self.leanest_bytes = min_bytes, cap_bytes, leanest_bytes


@dataclass
class CapSearch:
    """The search under a memory cap, before it searches: the cap, the depth caps to search (each an
    ``auto_schedule`` of its own, :meth:`constraints_at`, with :attr:`solver`'s share of the budget) and the least
    memory any plan needs."""

    cap: float
    depths: range
    least: MemoryBound
    figures: str                # "context" (bytes reachable from ctx) or "device" (the CUDA allocator's)
    device: str
    constraints: Constraints    # as given, the cap included
    solver: SolverOptions       # one depth cap's share of the time budget

    def constraints_at(self, depth: int) -> Constraints:
        """The constraints of the search at one depth cap: that depth, the cap removed."""
        return dataclasses.replace(self.constraints, max_depth=depth, max_memory_bytes=None)


def cap_search(tasks_or_graph: GraphInput, costs: CostModel, constraints: Constraints,
               solver: SolverOptions) -> CapSearch:
    """``auto_schedule`` under ``constraints.max_memory_bytes``, before it searches (see the module docstring).

    Parameters
    ----------
    tasks_or_graph, costs
        As for :func:`autosched.search.autoschedule.auto_schedule`.
    constraints : Constraints
        Its ``max_memory_bytes`` is the cap; each depth cap ``1 .. constraints.max_depth`` is searched (from the
        least depth its frozen stages allow).
    solver : SolverOptions
        Each depth's search takes an equal share of ``solver.time_limit_s`` (at least a second).

    Returns
    -------
    CapSearch

    Raises
    ------
    ValueError
        If the cost model has no memory figures.
    MemoryCapError
        If the cap is below the least memory any plan needs.
    """
    cap = float(constraints.max_memory_bytes)
    if not getattr(costs, "has_bytes", False):
        raise ValueError("Constraints.max_memory_bytes needs memory figures in the cost model (batch_bytes, "
                         "add_bytes/free_bytes); profile with TaskProfiler(...).profile(batch) and build the model "
                         "with CostModel.from_profile, or add them with CostModel.with_memory")
    problem = make_problem(tasks_or_graph, costs, dataclasses.replace(constraints, max_memory_bytes=None),
                           time_unit_s=solver.time_unit_s)
    figures = "device" if problem.device == "cuda" and any(t.device_alloc_bytes for t in costs.tasks.values()) \
        else "context"
    least = min_memory(list(problem.names), list(problem.intra), costs, device=problem.device, figures=figures)
    if cap < least.value:
        raise MemoryCapError(
            f"max_memory_bytes={cap:.0f} ({format_bytes(cap)}) is infeasible: every plan needs at least "
            f"{least.value:.0f} bytes ({format_bytes(least.value)}), one iteration's own peak (after "
            f"{least.task or 'its batch'}). Raise the cap to at least that, or make an iteration hold less",
            least.value, cap)
    # a task frozen to stage k needs depth k + 1: shallower caps are not plans the constraints allow
    depths = range(1 + max(problem.frozen_stage.values(), default=0), constraints.max_depth + 1)
    share = dataclasses.replace(solver, time_limit_s=max(1.0, solver.time_limit_s / len(depths)))
    return CapSearch(cap, depths, least, figures, problem.device, constraints, share)


def fastest_under_cap(under: CapSearch, searched: Sequence[Tuple[PipelinePlan, SearchReport]], costs: CostModel,
                      num_iterations: int) -> Tuple[PipelinePlan, SearchReport]:
    """The fastest plan that fits the cap (ties: less memory), its report carrying the trade-off.

    Parameters
    ----------
    under : CapSearch
    searched : sequence of (PipelinePlan, SearchReport)
        Each depth cap's search, in the order of ``under.depths``.
    costs : CostModel
        Its memory figures give each plan's predicted peak bytes.
    num_iterations : int
        Iterations simulated per plan.

    Raises
    ------
    MemoryCapError
        If no plan found fits.
    """
    cap, least = under.cap, under.least
    found: List[Tuple[TradeoffPoint, PipelinePlan, SearchReport]] = []
    for d, (plan, report) in zip(under.depths, searched):
        mem = simulate(plan, costs, num_iterations=num_iterations, device=under.device).memory \
            if under.figures == "context" else _device_memory(plan, costs, num_iterations, under.device)
        point = TradeoffPoint(d, plan.pipeline_depth, report.period_s, mem.peak_bytes, mem.mean_bytes,
                              mem.peak_bytes <= cap)
        found.append((point, plan, report))
    points = [f[0] for f in found]
    fitting = [f for f in found if f[0].fits]
    if not fitting:
        lean = min(points, key=lambda p: (p.peak_bytes, p.period_s))
        raise MemoryCapError(
            f"max_memory_bytes={cap:.0f} ({format_bytes(cap)}) is infeasible for the plans found: the leanest "
            f"(depth {lean.depth}) needs {lean.peak_bytes:.0f} bytes ({format_bytes(lean.peak_bytes)}); no plan "
            f"needs less than {least.value:.0f} bytes ({format_bytes(least.value)}). Raise the cap to at least "
            f"{format_bytes(lean.peak_bytes)}.\n{tradeoff_table(points, cap)}", max(least.value, 0.0), cap,
            lean.peak_bytes)
    point, plan, report = min(fitting, key=lambda f: (round(f[0].period_s, 12), f[0].peak_bytes))
    why = dataclasses.replace(report.why, max_depth=under.constraints.max_depth)
    report = dataclasses.replace(report, tradeoff=MemoryTradeoff(cap, points), peak_bytes=point.peak_bytes,
                                 min_memory_bytes=least.value, why=why)
    faster = [p for p in points if p.period_s < point.period_s * (1 - 1e-9)]
    if faster:
        best = min(faster, key=lambda p: p.period_s)
        report.notes.append(f"memory cap {format_bytes(cap)}: a depth-{best.depth} plan runs at "
                            f"{best.period_s * 1e3:.3f} ms but needs {format_bytes(best.peak_bytes)}")
        report.why.depth_reason = (f"the memory cap {format_bytes(cap)}: the faster depth-{best.depth} plan needs "
                               f"{format_bytes(best.peak_bytes)} in flight, this one {format_bytes(point.peak_bytes)}")
    return plan, report


def _device_memory(plan: PipelinePlan, costs: CostModel, num_iterations: int, device: str) -> MemoryPrediction:
    return predict_memory(simulate(plan, costs, num_iterations=num_iterations, device=device),
                          figures="device")
