"""Every notebook in notebooks/ executes top to bottom on a fresh kernel, and what it shows is real.

Each notebook runs with nbclient on a ``python3`` kernel whose spec this test
writes itself (``ipykernel.kernelspec.write_kernel_spec``: this interpreter,
whatever ``python`` is on PATH), so CI needs no ``jupyter kernelspec install``.
After the notebook's own cells, a probe cell appended by the test re-checks the
notebook's results with library calls of its own (the plan validates, the
simulator predicts a period > 0, the pipelined run reproduced the serial loop).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
from conftest import key_values, word_after

from swpipe_core import pipelines

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
kernelspec = pytest.importorskip("ipykernel.kernelspec")

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
ALL = sorted(NOTEBOOKS.glob("*.ipynb"))

# Probes run in the notebook's kernel after its last cell; each prints one JSON line.
PROBES = {
    "01_profile_to_plan.ipynb": """\
import json, math
from swpipe import validate, simulate, PipelinePlan
validate(auto)                                   # raises PlanError if the generated plan broke a rule
again = simulate(auto, costs)
print("PROBE " + json.dumps({
    "is_plan": isinstance(auto, PipelinePlan),
    "bound": auto.unbound_tasks() == [],
    "tasks": sorted(auto.task_names),
    "serial_tasks": sorted(serial.task_names),
    "intra": sorted(map(list, auto.intra_edges())),
    "serial_intra": sorted(map(list, serial.intra_edges())),
    "inter": sorted(map(list, auto.inter_edges())),
    "serial_inter": sorted(map(list, serial.inter_edges())),
    "predicted_s": report.period_s,
    "resimulated_s": again.period_s,
    "lower_bound_s": report.lower_bound_s,
    "serial_simulated_s": sim_serial.period_s,
    "measured_s": [r["ms/it"] / 1e3 for r in runs],
    "losses": [len(r["losses"]) for r in runs],
    "losses_match": bool(losses_match),
    "profiled": sorted(profile.exposed_s),
    "host_timed": sorted(profile.host_s or {}),
    "what_if_rows": list(what_if_table.index),
    "what_if_periods": [float(p) for p in what_if_table["period_s"]],
    "sweep_rows": len(sweep_table),
}))
""",
    "02_stage_analysis.ipynb": """\
import json
from swpipe import validate, PlanError
from swpipe_core.analysis import min_depth
from swpipe_core import pipelines
from swpipe_core.analysis import removable_boundaries
checked = []
for row in table.to_dict("records"):
    plan = pipelines.get(row["pipeline"], order=row["order"])
    checked.append({"pipeline": row["pipeline"], "order": row["order"], "depth": plan.pipeline_depth,
                    "lds": int(row["LDS"]), "min_depth": min_depth(plan), "table_min_depth": int(row["min depth"]),
                    "removable": removable_boundaries(plan), "verdict": row["verdict"]})
try:
    validate(broken)
    broken_rule = None
except PlanError as err:
    broken_rule = err.rule
validate(flat)
print("PROBE " + json.dumps({"rows": checked, "removable_line": removable_line, "broken_rule": broken_rule,
                             "shown_rule": error.rule, "flat_depth": flat.pipeline_depth}))
""",
    "03_what_if.ipynb": """\
import json
from swpipe import simulate, validate
from autosched.model.whatif import apply_changes
for plan in plans.values():
    validate(plan)
a2a_at = float(first_change(a2a_sweep)["factor"])
before = float(a2a_sweep[a2a_sweep["factor"] < a2a_at]["factor"].max())
scaled = lambda f: apply_changes(costs, {"InputDistStart": f, "InputDistWait": f})
print("PROBE " + json.dumps({
    "periods": {k: simulate(p, costs).period_s for k, p in plans.items()},
    "table_periods": {k: float(v) for k, v in compared["period_s"].items()},
    "bindings_around_change": [simulate(two, scaled(before)).binding, simulate(two, scaled(a2a_at)).binding],
    "h2d_rows": len(h2d_sweep),
    "gpu_periods": [simulate(torchrec, cuda_costs, device="cuda").period_s, simulate(torchrec, cuda_costs).period_s],
    "shown_overlap": overlap,
    "measured_tasks": sorted({e.task for e in events}),
    "plan_tasks": sorted(two.task_names),
    "depths": {k: p.pipeline_depth for k, p in plans.items()},
}))
""",
    "04_dataflow_and_memory.ipynb": """\
import json
from swpipe import simulate, validate
validate(fixed)
again = check_dataflow(fixed, record=report.record)
print("PROBE " + json.dumps({
    "inferred_inter": sorted(map(list, inferred.inter)),
    "inferred_intra": sorted(map(list, inferred.intra)),
    "table_edges": sorted(edges["edge"]),
    "missing": [list(f.tasks) for f in report.missing],
    "missing_text": [str(f) for f in report.missing],
    "fixed_ok": again.ok,
    "staleness": {k: [int(v["embedding staleness (checker)"]), int(v["emb_staleness (model)"])]
                  for k, v in staleness.to_dict("index").items()},
    "peaks": {k: [int(v["depth"]), float(v["peak bytes"])] for k, v in by_depth.to_dict("index").items()},
    "least": least.value,
    "cap": float(cap),
    "chosen_peak": simulate(fitting, costs, num_iterations=40).memory.peak_bytes,
    "chosen_depth": fitting.pipeline_depth,
    "tradeoff_fits": [p.fits for p in capped.tradeoff.points],
    "impossible_min": impossible.min_bytes,
}))
""",
    "05_gpipe.ipynb": """\
import json
from swpipe import simulate, validate
validate(never.plan)
print("PROBE " + json.dumps({
    "resimulated": simulate(never.plan, never.costs, num_iterations=chunks, lengthen=False).makespan,
    "predicted": {f"{s}/{c}": [p.step_s, p.activation_bytes] for (s, c), p in predicted.items()},
    "measured": {f"{s}/{c}": [m.step_s, m.activation_bytes, m.activation_by] for (s, c), m in measured.items()},
    "predicted_by": {f"{s}/{c}": p.activation_by for (s, c), p in predicted.items()},
    "what_if_chunks": [r.chunks for r in rows],
    "measured_tasks": sorted({e.task for e in m.events}),
}))
""",
}


def _kernel_env(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point Jupyter at a ``python3`` kernelspec that launches this very interpreter."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.parent.mkdir(parents=True)
    kernelspec.write_kernel_spec(path=str(spec_dir))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))


def _execute(path: pathlib.Path, extra: str = "") -> "nbformat.NotebookNode":
    nb = nbformat.read(path, as_version=4)
    if extra:
        nb.cells.append(nbformat.v4.new_code_cell(extra))
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=240,
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    return nb


def _text(cell: "nbformat.NotebookNode") -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(out.data.get("text/plain", ""))
    return "".join(parts)


def _probe(nb: "nbformat.NotebookNode") -> dict:
    lines = [ln for ln in _text(nb.cells[-1]).splitlines() if ln.startswith("PROBE ")]
    assert len(lines) == 1, f"the probe cell printed no result: {_text(nb.cells[-1])!r}"
    return json.loads(lines[0][len("PROBE "):])


def test_the_python3_kernelspec_written_for_the_tests_runs_this_interpreter(tmp_path, monkeypatch):
    _kernel_env(tmp_path, monkeypatch)
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.argv[0] == sys.executable
    assert pathlib.Path(spec.resource_dir) == tmp_path / "jupyter" / "kernels" / "python3"


def test_notebooks_folder_has_the_users_path():
    names = {p.name for p in ALL}
    assert {"01_profile_to_plan.ipynb", "02_stage_analysis.ipynb", "03_what_if.ipynb",
            "04_dataflow_and_memory.ipynb", "05_gpipe.ipynb"} <= names
    assert set(PROBES) == names, "every notebook needs a probe re-checking its results"


@pytest.mark.parametrize("path", ALL, ids=[p.name for p in ALL])
def test_committed_notebook_carries_its_outputs_and_a_plot(path):
    """A reader browsing the repository sees every cell's output, at least one plot, and no error."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code cell"
    unrun = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and not c.execution_count]
    assert not unrun, f"{path.name}: cells {unrun} were not executed; run `python notebooks/_build.py`"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"], f"{path.name} shows an error"
    assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs), f"{path.name} shows no plot"
    assert nb.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", ALL, ids=[p.name for p in ALL])
def test_committed_outputs_hold_no_machine_paths_or_run_timestamps(path):
    nb = nbformat.read(path, as_version=4)
    root = str(NOTEBOOKS.parent)
    for i, cell in enumerate(nb.cells):
        assert "execution" not in cell.metadata, f"{path.name} cell {i} records execution timestamps"
        for out in cell.get("outputs", []):
            text = out.get("text", "") + "".join(v for k, v in out.get("data", {}).items() if k.startswith("text/"))
            for marker in (root, "/tmp/", "/root/", "/home/"):
                assert marker not in text, f"{path.name} cell {i} shows the machine path {marker!r}"


def test_committed_notebooks_equal_what_the_generator_writes(tmp_path):
    """notebooks/_build.py is the source; a hand edit to an .ipynb (or a stale one) fails here."""
    script = NOTEBOOKS / "_build.py"
    code = (f"import sys, pathlib; sys.path.insert(0, {str(NOTEBOOKS)!r}); import _build, nbformat\n"
            f"for name, cells in _build.NOTEBOOKS.items():\n"
            f"    nbformat.write(_build.build(cells), pathlib.Path({str(tmp_path)!r}) / name)\n")
    subprocess.run([sys.executable, "-B", "-c", code], check=True, timeout=60)
    assert script.exists()
    assert sorted(p.name for p in tmp_path.glob("*.ipynb")) == [p.name for p in ALL], \
        "a notebook the generator writes is not committed (or the other way round)"
    for path in ALL:
        fresh = tmp_path / path.name
        assert fresh.exists(), f"{path.name} is not produced by notebooks/_build.py"
        cells = lambda nb: [(c.cell_type, c.source) for c in nb.cells]  # noqa: E731 - not bytes: nbformat versions differ
        assert cells(nbformat.read(fresh, as_version=4)) == cells(nbformat.read(path, as_version=4)), \
            f"{path.name} differs from notebooks/_build.py's cells; run `python notebooks/_build.py`"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", ALL, ids=[p.name for p in ALL])
def test_notebook_executes_and_its_results_hold(path, tmp_path, monkeypatch):
    _kernel_env(tmp_path, monkeypatch)
    probe_src = PROBES.get(path.name, "")
    nb = _execute(path, probe_src)
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code_cells), "a cell did not run"
    errors = [o for c in code_cells for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    CHECKS[path.name](code_cells, _probe(nb))


def _check_profile_to_plan(code_cells, p):
    text = "\n".join(_text(c) for c in code_cells)
    # what the user is meant to see, printed by the library's own formatters
    assert word_after(text, "Baseline", "serial", "iteration:") and "SUM" in text  # ProfileResult.print_report
    assert "auto_schedule" in text and word_after(text, "lower", "bound")          # SearchReport
    assert {"pipeline_depth", "lds"} <= set(key_values(text))                      # stage analysis
    assert any(line.split()[:3] == ["simulated", "50", "iterations"] for line in text.splitlines())  # SimResult
    images = [o for c in code_cells for o in c.outputs if "data" in o and "image/png" in o.data]
    assert len(images) >= 2, "the Gantt chart and the sweep plot were not displayed"

    assert p["is_plan"] and p["bound"], "auto_schedule did not return a runnable PipelinePlan"
    # the searcher chose the schedule, not the semantics: same tasks, every declared dependency kept
    assert p["tasks"] == p["serial_tasks"]
    assert p["intra"] == p["serial_intra"] and p["inter"] == p["serial_inter"]
    assert p["predicted_s"] > 0 and p["resimulated_s"] == pytest.approx(p["predicted_s"], rel=1e-9)
    assert 0 < p["lower_bound_s"] <= p["predicted_s"] * (1 + 1e-9)
    assert p["predicted_s"] <= p["serial_simulated_s"] * (1 + 1e-9), "the auto plan is predicted slower than serial"
    assert all(m > 0 for m in p["measured_s"]) and len(p["measured_s"]) == 2
    assert p["losses"] == [30, 30] and p["losses_match"], "the auto plan did not reproduce the serial loop"
    assert {"InputDistStart", "InputDistWait"}.isdisjoint(p["profiled"]) and "EmbLookup" in p["profiled"]
    assert {"InputDistStart", "InputDistWait"} <= set(p["host_timed"])
    assert p["what_if_rows"] == ["before", "after"]
    assert p["what_if_periods"][1] > p["what_if_periods"][0], "a slower EmbLookup did not slow the plan"
    assert p["sweep_rows"] == 7


def _check_stage_analysis(code_cells, p):
    rows = p["rows"]
    assert {(r["pipeline"], r["order"]) for r in rows} >= {(n, o) for n in pipelines.PIPELINES
                                                          for o in ("ready_first", "stage_descending")}
    for r in rows:
        where = f"{r['pipeline']} / {r['order']}"
        assert r["table_min_depth"] == r["min_depth"], where
        assert 1 <= r["lds"] <= r["min_depth"] <= r["depth"], where
        if r["lds"] == r["depth"]:
            assert r["verdict"] == "✓ Dilworth-optimal", where
        elif r["min_depth"] == r["depth"]:
            assert r["verdict"] == "✓ minimal", where
        else:
            assert r["removable"] and r["verdict"].startswith("+ removable"), where
    assert any(r["verdict"].startswith("+") for r in rows) and any(r["verdict"] == "✓ minimal" for r in rows)
    assert p["removable_line"].startswith("+") and "0|1, 1|2" in p["removable_line"]  # the removable boundaries
    assert p["flat_depth"] == 1
    assert p["broken_rule"] == p["shown_rule"] == "corollary-1"
    text = "\n".join(_text(c) for c in code_cells)
    assert "PlanError: [corollary-1]" in text and "Fix: " in text


def _check_what_if(code_cells, p):
    for label, period in p["periods"].items():
        assert p["table_periods"][label] == pytest.approx(period, rel=1e-9), label
    assert p["depths"]["io thread, depth 2"] == 2
    assert p["periods"]["io thread (2 threads, depth 3)"] < p["periods"]["TorchRec (1 thread, depth 3)"], \
        "moving the input pipeline to a second thread did not shorten the simulated period"
    assert p["bindings_around_change"][0] != p["bindings_around_change"][1], "the sweep shows no change of binding"
    assert p["h2d_rows"] == 8
    cuda_period, serial_period = p["gpu_periods"]
    assert 0 < cuda_period < serial_period and p["shown_overlap"] == pytest.approx(serial_period / cuda_period)
    assert p["measured_tasks"] == p["plan_tasks"], "the measured run did not record every task"
    images = [o for c in code_cells for o in c.outputs if "data" in o and "image/png" in o.data]
    assert len(images) >= 4, "the sweeps, the measured/simulated Gantt and the CUDA Gantt were not all shown"


def _check_dataflow_and_memory(code_cells, p):
    # the inference found the weights' read-after-write across iterations, and the table shows every edge
    assert ["Forward", "OptimizerStep", 1] in p["inferred_inter"]
    assert {str(tuple(e)) for e in p["inferred_intra"] + p["inferred_inter"]} <= set(p["table_edges"])
    # the moved OptimizerStep: one error, the exact tuple to add, and the fix makes the plan clean
    assert p["missing"] == [["ZeroGrad", "OptimizerStep"]]
    assert "('ZeroGrad', 'OptimizerStep', 1)" in p["missing_text"][0] and p["fixed_ok"]
    # semi-sync: the checker's staleness equals the workload's model, and only the lookup-first order is stale
    assert p["staleness"] == {"swpipe's order": [0, 0], "lookup first": [1, 1]}
    # memory: deeper plans hold more; no plan holds less than the bound; the cap is met, an impossible one named
    depths = sorted(p["peaks"].values())
    assert len(depths) >= 2 and all(a[1] < b[1] for a, b in zip(depths, depths[1:]))
    assert 0 < p["least"] <= depths[0][1]
    assert p["chosen_peak"] <= p["cap"] < depths[-1][1] and p["chosen_depth"] < depths[-1][0]
    assert any(p["tradeoff_fits"]) and p["impossible_min"] == pytest.approx(p["least"])
    images = [o for c in code_cells for o in c.outputs if "data" in o and "image/png" in o.data]
    assert images, "the trade-off plot was not shown"


def _check_gpipe(code_cells, p):
    text = "\n".join(_text(c) for c in code_cells)
    assert "GPipe training step (fill, drain): 4 micro-batches, 2 partitions" in text   # the plan's table
    pred, meas = p["predicted"], p["measured"]
    assert abs(p["resimulated"] - pred["GPipe/never"][0]) < 1e-12
    assert pred["GPipe/always"][1] < pred["GPipe/never"][1] and pred["1F1B/never"][1] < pred["GPipe/never"][1]
    # without checkpointing every partition's peak is set by its own thread's order: measured = predicted
    for key in ("GPipe/never", "1F1B/never"):
        assert meas[key][2] == p["predicted_by"][key]
    assert all(m[0] > 0 for m in meas.values())
    assert p["what_if_chunks"] == [4, 8, 4, 4, 8]
    assert p["measured_tasks"] == ["B0", "B1", "F0", "F1"]


CHECKS = {
    "05_gpipe.ipynb": _check_gpipe,
    "01_profile_to_plan.ipynb": _check_profile_to_plan,
    "02_stage_analysis.ipynb": _check_stage_analysis,
    "03_what_if.ipynb": _check_what_if,
    "04_dataflow_and_memory.ipynb": _check_dataflow_and_memory,
}
