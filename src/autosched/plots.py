"""Pictures of a pipeline run: Gantt charts (measured and simulated side by side) and what-if sweeps.

matplotlib is imported inside the functions, and figures are built with the
object-oriented API (:class:`matplotlib.figure.Figure` on the Agg canvas), so
no pyplot state or backend is touched: the functions work headless, in tests
and in notebooks (display the returned figure). Every function returns the
figure and writes it to ``path`` when one is given.

Tracks are one per thread group (host time) and one per stream (device time,
CUDA), as in the Chrome/Perfetto traces of :mod:`swpipe_core.measure.trace`; a task
keeps its colour across tracks and across the measured and simulated panels. A
pipeline-parallel step's timeline has a thread track per rank (``"thread rank0"``) and a
stream per rank's communication (``"stream rank0.comm"``); a GPipe step's, a track per
partition's thread.
"""

from __future__ import annotations

import zlib
from typing import Any, Iterable, List, Optional, Sequence, Tuple

__all__ = ["gantt", "compare_gantt", "sweep_plot"]


def _new_figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _colour(task: str) -> Any:
    from matplotlib import colormaps

    return colormaps["tab20"](zlib.crc32(task.encode()) % 20)


def _tracks(events: Sequence[Any]) -> List[Tuple[str, str]]:
    host = sorted({e.thread_group for e in events if e.kind == "host"})
    dev = sorted({e.stream for e in events if e.kind == "device"})
    return [("host", g) for g in host] + [("device", s) for s in dev]


def _draw(ax: Any, events: Sequence[Any], window: Optional[Tuple[float, float]], title: str,
          tracks: Optional[List[Tuple[str, str]]] = None) -> None:
    tracks = tracks or _tracks(events)
    row = {t: i for i, t in enumerate(tracks)}
    if window:
        lo, hi = window
    else:
        lo, hi = min((e.start for e in events), default=0.0), max((e.end for e in events), default=1.0)
    span = max(hi - lo, 1e-12)
    for e in events:
        if e.end < lo or e.start > hi:
            continue
        key = ("host", e.thread_group) if e.kind == "host" else ("device", e.stream)
        if key not in row:
            continue
        y = row[key]
        x0, w = e.start * 1e3, (e.end - e.start) * 1e3
        ax.broken_barh([(x0, w)], (y - 0.4, 0.8), facecolors=_colour(e.task), edgecolor="black", linewidth=0.3)
        if w > 0.06 * span * 1e3:
            ax.text(x0 + w / 2, y, f"{e.task}/{e.iteration}", ha="center", va="center", fontsize=6, clip_on=True)
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([_track_label(k, n) for k, n in tracks], fontsize=8)
    ax.set_ylim(len(tracks) - 0.5, -0.5)
    ax.set_xlim(lo * 1e3, hi * 1e3)
    ax.set_xlabel("time (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def _track_label(kind: str, name: str) -> str:
    return f"{'thread' if kind == 'host' else 'stream'} {name}"


def _events(timeline: Any) -> List[Any]:
    """The events of a timeline, or of a result that has one (``.events``: what every ``simulate`` returns)."""
    return list(getattr(timeline, "events", timeline))


def _legend(fig: Any, events: Sequence[Any]) -> None:
    """One colour per task, named below the chart (a bar's own label only shows where it is wide enough)."""
    from matplotlib.patches import Patch

    tasks = list(dict.fromkeys(e.task for e in events))
    if tasks:
        handles = [Patch(facecolor=_colour(t), edgecolor="black", linewidth=0.3, label=t) for t in tasks]
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(tasks), 6), fontsize=7, frameon=False,
                   title="task (bars read task/iteration)", title_fontsize=7)


def _save(fig: Any, path: Optional[str]) -> Any:
    if path:
        fig.savefig(path, dpi=120)
    return fig


def gantt(events: Iterable[Any], window: Optional[Tuple[float, float]] = None, title: str = "timeline",
          path: Optional[str] = None) -> Any:
    """A Gantt chart of timeline events: one row per thread group and per stream (per rank for a PP step).

    Parameters
    ----------
    events : iterable of TimelineEvent, or a result with ``.events``
        E.g. what ``simulate`` returns for a plan, a GPipe or a pipeline-parallel program (``SimResult``,
        ``StepPrediction``, ``PPSimResult``), its ``.events``, or ``SWPipeline(..., record_timeline=True).timeline``.
    window : (float, float), optional
        Seconds to show; everything by default.
    title : str
    path : str, optional
        Also write the figure there (PNG, SVG, PDF by extension).

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> from swpipe_core.measure.trace import TimelineEvent   # a measured run's events: advanced, not public
    >>> fig = gantt([TimelineEvent("A", 0, "io", "memcpy", 0.0, 0.002),
    ...              TimelineEvent("A", 0, "io", "memcpy", 0.002, 0.005, "device")])
    >>> [t.get_text() for t in fig.axes[0].get_yticklabels()], [t.get_text() for t in fig.legends[0].get_texts()]
    (['thread io', 'stream memcpy'], ['A'])
    """
    events = _events(events)
    tracks = _tracks(events)
    fig = _new_figure(10, 1.6 + 0.45 * max(1, len(tracks)))
    _draw(fig.add_subplot(1, 1, 1), events, window, title, tracks)
    _legend(fig, events)
    return _save(fig, path)


def compare_gantt(measured: Iterable[Any], simulated: Iterable[Any], window: Optional[Tuple[float, float]] = None,
                  titles: Tuple[str, str] = ("measured", "simulated"), path: Optional[str] = None) -> Any:
    """Measured and simulated timelines one above the other, on the same tracks and time axis.

    Parameters
    ----------
    measured, simulated : iterable of TimelineEvent
    window : (float, float), optional
        Seconds to show in both panels; by default the span of both.
    titles : (str, str)
    path : str, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> from swpipe_core.measure.trace import TimelineEvent   # a measured run's events: advanced, not public
    >>> m = [TimelineEvent("A", 0, "a", "default", 0.0, 0.0011)]
    >>> s = [TimelineEvent("A", 0, "a", "default", 0.0, 0.001)]
    >>> [ax.get_title() for ax in compare_gantt(m, s).axes]
    ['measured', 'simulated']
    """
    measured, simulated = _events(measured), _events(simulated)
    both = measured + simulated
    tracks = _tracks(both)
    if window is None:
        window = (min((e.start for e in both), default=0.0), max((e.end for e in both), default=1.0))
    fig = _new_figure(10, 1.6 + 0.9 * max(1, len(tracks)))
    ax0 = fig.add_subplot(2, 1, 1)
    ax1 = fig.add_subplot(2, 1, 2, sharex=ax0)
    _draw(ax0, measured, window, titles[0], tracks)
    _draw(ax1, simulated, window, titles[1], tracks)
    _legend(fig, both)
    return _save(fig, path)


def sweep_plot(table: Any, title: Optional[str] = None, path: Optional[str] = None) -> Any:
    """Predicted period (and lower bound) against one task's cost, from :func:`autosched.model.whatif.sweep`.

    Where the binding resource changes along the sweep, the new one is written next to the curve.

    Parameters
    ----------
    table : pandas.DataFrame
        Columns ``task_cost_s``, ``period_s``, ``binding`` and optionally
        ``lower_bound_s``; ``table.attrs["task"]`` names the task.
    title : str, optional
    path : str, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"task_cost_s": [0.001, 0.002], "period_s": [0.003, 0.004],
    ...                   "binding": ["thread:a", "thread:a"]})
    >>> fig = sweep_plot(t)
    >>> fig.axes[0].get_ylabel()
    'period (ms/iteration)'
    """
    task = getattr(table, "attrs", {}).get("task", "task")
    x = [v * 1e3 for v in table["task_cost_s"]]
    fig = _new_figure(6.5, 4)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(x, [v * 1e3 for v in table["period_s"]], marker="o", label="simulated period")
    if "lower_bound_s" in table:
        ax.plot(x, [v * 1e3 for v in table["lower_bound_s"]], linestyle="--", label="lower bound")
    prev = None
    for xi, yi, b in zip(x, table["period_s"], table["binding"]):
        short = str(b).split(" (")[0][:40]
        if short != prev:
            ax.annotate(short, (xi, yi * 1e3), textcoords="offset points", xytext=(4, 6), fontsize=7)
            prev = short
    ax.set_xlabel(f"{task} cost (ms)")
    ax.set_ylabel("period (ms/iteration)")
    ax.set_title(title or f"what if {task} took longer or shorter?", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
