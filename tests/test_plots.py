"""Gantt charts and what-if sweep plots: built headless, written to files, pyplot untouched."""

from __future__ import annotations

import json
import subprocess
import sys

from autosched.model.costs import CostModel, TaskCost
from autosched.plots import compare_gantt, gantt, sweep_plot
from autosched.model.simulate import simulate
from autosched.model.whatif import sweep
from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.measure.trace import TimelineEvent

MS = 1e-3
PLAN = PipelinePlan({"H2D": TaskSchedule(0, "memcpy", "io"), "Fwd": TaskSchedule(1)}, intra_iter_deps=[("Fwd", "H2D")])
COSTS = CostModel({"H2D": TaskCost(0.1 * MS, 1 * MS), "Fwd": TaskCost(0.5 * MS, 2 * MS)})


def _labels(ax):
    return [t.get_text() for t in ax.get_yticklabels()]


def test_gantt_has_a_row_per_thread_group_and_stream_and_a_bar_per_event(tmp_path):
    r = simulate(PLAN, COSTS, num_iterations=10, device="cuda")
    path = tmp_path / "g.png"
    fig = gantt(r.events, title="sim", path=str(path))
    ax = fig.axes[0]
    assert _labels(ax) == ["thread default", "thread io", "stream default", "stream memcpy"]
    assert len(ax.collections) == len(r.events)
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


def test_gantt_window_limits_the_time_axis():
    r = simulate(PLAN, COSTS, num_iterations=10)
    ax = gantt(r.events, window=(0.004, 0.008)).axes[0]
    assert ax.get_xlim() == (4.0, 8.0)
    assert len(ax.collections) < len(r.events)


def test_compare_gantt_puts_measured_and_simulated_on_the_same_tracks_and_axis(tmp_path):
    measured = [TimelineEvent("H2D", 0, "io", "memcpy", 0.0, 0.0011),
                TimelineEvent("Fwd", 0, "default", "default", 0.0012, 0.0030)]
    simulated = [TimelineEvent("H2D", 0, "io", "memcpy", 0.0, 0.0010)]
    fig = compare_gantt(measured, simulated, path=str(tmp_path / "c.svg"))
    top, bottom = fig.axes
    assert (top.get_title(), bottom.get_title()) == ("measured", "simulated")
    assert _labels(top) == _labels(bottom) == ["thread default", "thread io"]
    assert top.get_xlim() == bottom.get_xlim()
    assert (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")


def test_sweep_plot_draws_period_and_bound_against_the_task_cost(tmp_path):
    table = sweep(PLAN, COSTS, "Fwd", [0.5, 1, 2])
    fig = sweep_plot(table, path=str(tmp_path / "s.png"))
    ax = fig.axes[0]
    assert ax.get_xlabel().split()[::2] == ["Fwd", "(ms)"]  # the task swept, in ms
    period_line = ax.get_lines()[0]
    assert list(period_line.get_ydata()) == [p * 1e3 for p in table["period_s"]]
    assert len(ax.get_lines()) == 2  # period and lower bound


def test_plotting_imports_no_pyplot():
    code = ("import sys, json\n"
            "from autosched.plots import gantt\n"
            "from swpipe_core.measure.trace import TimelineEvent\n"
            "gantt([TimelineEvent('A', 0, 'g', 'default', 0.0, 1.0)])\n"
            "print(json.dumps(['matplotlib' in sys.modules, 'matplotlib.pyplot' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, False]
