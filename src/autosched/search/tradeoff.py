"""The period-vs-memory trade-off across depth caps: one point per cap, its Pareto front, a table and a plot.

:func:`autosched.search.memcap.schedule_under_cap` finds one :class:`TradeoffPoint` per depth cap;
the report keeps them with the cap (:class:`MemoryTradeoff`, ``SearchReport.tradeoff``) and shows them
(:meth:`autosched.search.report.SearchReport.tradeoff_table`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence

from autosched.model.memory import format_bytes

if TYPE_CHECKING:  # matplotlib is imported on demand
    from matplotlib.figure import Figure

__all__ = ["TradeoffPoint", "MemoryTradeoff", "pareto_front", "tradeoff_table", "tradeoff_plot"]


@dataclass(frozen=True)
class TradeoffPoint:
    """The best plan found under one depth cap: its depth, simulated period and predicted bytes."""

    max_depth: int
    depth: int
    period_s: float
    peak_bytes: float
    mean_bytes: float
    fits: bool


@dataclass
class MemoryTradeoff:
    """A search under a memory cap: the cap, and the best plan found under each depth cap (the report's
    ``tradeoff``)."""

    cap_bytes: float
    points: List[TradeoffPoint]


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


def tradeoff_plot(points: Sequence[TradeoffPoint], cap: Optional[float] = None, path: Optional[str] = None) -> "Figure":
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
