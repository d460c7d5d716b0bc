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
The report carries the trade-off (:class:`TradeoffPoint` per depth cap) as a
table and a Pareto-front plot.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from autosched.model.memory import format_bytes, min_memory

__all__ = ["MemoryCapError", "TradeoffPoint", "schedule_under_cap", "tradeoff_table", "pareto_front",
           "tradeoff_plot"]


class MemoryCapError(ValueError):
    """No plan fits ``Constraints.max_memory_bytes``; ``min_bytes`` is the least memory a plan needs.

    Examples
    --------
    >>> e = MemoryCapError("cap 1.00 KiB is below ...", min_bytes=4096.0)
    >>> e.min_bytes
    4096.0
    """

    def __init__(self, message: str, min_bytes: float) -> None:
        super().__init__(message)
        self.min_bytes = min_bytes


@dataclass(frozen=True)
class TradeoffPoint:
    """The best plan found under one depth cap: its depth, simulated period and predicted bytes."""

    max_depth: int
    depth: int
    period_s: float
    peak_bytes: float
    mean_bytes: float
    fits: bool


def pareto_front(points: Sequence[TradeoffPoint]) -> List[TradeoffPoint]:
    """The points no other beats on both period and peak bytes, fastest first.

    Examples
    --------
    >>> p = [TradeoffPoint(1, 1, 3.0, 10, 10, True), TradeoffPoint(2, 2, 2.0, 20, 15, True),
    ...      TradeoffPoint(3, 2, 2.0, 25, 15, True)]
    >>> [x.max_depth for x in pareto_front(p)]
    [2, 1]
    """
    front: List[TradeoffPoint] = []
    for p in sorted(points, key=lambda x: (x.period_s, x.peak_bytes)):
        if not front or p.peak_bytes < front[-1].peak_bytes:
            front.append(p)
    return front


def tradeoff_table(points: Sequence[TradeoffPoint], cap: Optional[float] = None) -> str:
    """The period-vs-memory trade-off across depth caps as a small text table.

    Examples
    --------
    >>> print(tradeoff_table([TradeoffPoint(1, 1, 0.003, 1024, 900, True),
    ...                       TradeoffPoint(2, 2, 0.002, 2048, 1500, False)], cap=1500))
    max depth  depth      period         peak         mean  fits 1.46 KiB  pareto
            1      1    3.000 ms     1.00 KiB        900 B           yes       *
            2      2    2.000 ms     2.00 KiB     1.46 KiB            no       *
    """
    front = set(pareto_front(points))
    cap_label = f"fits {format_bytes(cap)}" if cap is not None else "fits"
    lines = [f"{'max depth':>9} {'depth':>6} {'period':>11} {'peak':>12} {'mean':>12}  {cap_label}  pareto"]
    for p in points:
        lines.append(f"{p.max_depth:>9} {p.depth:>6} {p.period_s * 1e3:>8.3f} ms {format_bytes(p.peak_bytes):>12} "
                     f"{format_bytes(p.mean_bytes):>12} {'yes' if p.fits else 'no':>{len(cap_label)}}  "
                     f"{'*' if p in front else '':>6}")
    return "\n".join(lines)


def tradeoff_plot(points: Sequence[TradeoffPoint], cap: Optional[float] = None, path: Optional[str] = None) -> Any:
    """Peak bytes against period for each depth cap, the Pareto front joined, the cap as a line.

    matplotlib is imported here (headless figure, no pyplot state).

    Returns
    -------
    matplotlib.figure.Figure
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    mib = 2.0 ** 20
    ax.scatter([p.period_s * 1e3 for p in points], [p.peak_bytes / mib for p in points], color="grey")
    for p in points:
        ax.annotate(f"depth {p.depth}", (p.period_s * 1e3, p.peak_bytes / mib), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)
    front = pareto_front(points)
    ax.plot([p.period_s * 1e3 for p in front], [p.peak_bytes / mib for p in front], "o-", label="Pareto front")
    if cap is not None:
        ax.axhline(cap / mib, color="red", linestyle="--", label=f"cap {cap / mib:.3g} MiB")  # the axis's unit
    ax.set_xlabel("period (ms/iter)")
    ax.set_ylabel("predicted peak MiB in flight")
    ax.legend(fontsize=8)
    if path is not None:
        fig.savefig(path)
    return fig


def schedule_under_cap(tasks_or_graph: Any, costs: Any, constraints: Any) -> Tuple[Any, Any]:
    """:func:`autosched.search.entry.auto_schedule` under ``constraints.max_memory_bytes`` (see the module docstring).

    Raises
    ------
    ValueError
        If the cost model has no memory figures.
    MemoryCapError
        If the cap is below the least memory any plan needs, or no plan found fits.
    """
    from autosched.search.problem import make_problem
    from autosched.search.entry import auto_schedule
    from autosched.model.simulate import simulate

    cap = float(constraints.max_memory_bytes)
    if not getattr(costs, "has_bytes", False):
        raise ValueError("Constraints.max_memory_bytes needs memory figures in the cost model (batch_bytes, "
                         "add_bytes/free_bytes); profile with TaskProfiler(...).profile(batch) and build the model "
                         "with CostModel.from_profile, or add them with CostModel.with_memory")
    problem = make_problem(tasks_or_graph, costs, dataclasses.replace(constraints, max_memory_bytes=None))
    figures = "device" if problem.device == "cuda" and any(c.device_alloc_bytes for c in costs.tasks.values()) \
        else "context"
    least = min_memory(list(problem.names), list(problem.intra), costs, device=problem.device, figures=figures)
    if cap < least.value:
        raise MemoryCapError(
            f"max_memory_bytes={cap:.0f} ({format_bytes(cap)}) is infeasible: every plan needs at least "
            f"{least.value:.0f} bytes ({format_bytes(least.value)}), one iteration's own peak (after "
            f"{least.task or 'its batch'}). Raise the cap to at least that, or make an iteration hold less",
            least.value)
    depths = range(1, constraints.max_depth + 1)
    share = max(1.0, constraints.time_limit_s / len(depths))
    found: List[Tuple[TradeoffPoint, Any, Any]] = []
    for d in depths:
        c = dataclasses.replace(constraints, max_depth=d, max_memory_bytes=None, time_limit_s=share)
        plan, report = auto_schedule(tasks_or_graph, costs, c)
        mem = simulate(plan, costs, num_iterations=constraints.num_iterations, device=problem.device).memory \
            if figures == "context" else _device_memory(plan, costs, constraints, problem.device)
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
            f"{format_bytes(lean.peak_bytes)}.\n{tradeoff_table(points, cap)}", max(least.value, 0.0))
    point, plan, report = min(fitting, key=lambda f: (round(f[0].period_s, 12), f[0].peak_bytes))
    report.memory_tradeoff = points
    report.max_memory_bytes = cap
    report.peak_bytes = point.peak_bytes
    report.min_memory_bytes = least.value
    report.max_depth = constraints.max_depth
    faster = [p for p in points if p.period_s < point.period_s * (1 - 1e-9)]
    if faster:
        best = min(faster, key=lambda p: p.period_s)
        report.notes.append(f"memory cap {format_bytes(cap)}: a depth-{best.depth} plan runs at "
                            f"{best.period_s * 1e3:.3f} ms but needs {format_bytes(best.peak_bytes)}")
        report.depth_reason = (f"the memory cap {format_bytes(cap)}: the faster depth-{best.depth} plan needs "
                               f"{format_bytes(best.peak_bytes)} in flight, this one {format_bytes(point.peak_bytes)}")
    return plan, report


def _device_memory(plan: Any, costs: Any, constraints: Any, device: str) -> Any:
    from autosched.model.memory import predict_memory
    from autosched.model.simulate import simulate

    return predict_memory(simulate(plan, costs, num_iterations=constraints.num_iterations, device=device),
                          figures="device")
