"""``swpipe demo``: one table (plan, shape, iter/s, measured and predicted speedup, = serial), at most 120 columns."""

from __future__ import annotations

import platform
import re
import subprocess
import sys
from typing import Dict, List

import pytest

from swpipe.cli import main
from swpipe.workloads.bench import Measurement, PlanResult, format_table
from swpipe_core.measure.trace import read_chrome_trace


def _notes(lines: List[str], header: int) -> Dict[str, str]:
    """``{plan: its whole note}``: a row's note cell, or, for a ``[k]`` cell, the text of ``[k] plan: ...`` under the
    table (its wrapped lines joined)."""
    cells, below, current = {}, {}, None
    for line in lines[header + 2:]:
        ref = re.match(r"^\[(\d+)\] (\S+): (.*)$", line)
        if ref:
            current = ref.group(1)
            below[current] = (ref.group(2), ref.group(3))
        elif current is not None and line.startswith("    "):
            below[current] = (below[current][0], below[current][1] + " " + line.strip())
        elif current is None and line.strip():
            words = line.split(None, 7)
            cells[words[0]] = words[7] if len(words) == 8 else ""
        else:
            break
    notes = {}
    for label, cell in cells.items():
        ref = re.fullmatch(r"\[(\d+)\]", cell)
        if ref:
            assert below[ref.group(1)][0] == label, (label, below)
            notes[label] = below[ref.group(1)][1]
        else:
            notes[label] = cell
    return notes


def _legend(lines: List[str]) -> Dict[str, str]:
    """``{term: words}`` of the legend under the table."""
    start = lines.index("Legend:")
    legend, key = {}, None
    for line in lines[start + 1:]:
        entry = re.match(r"^  (\S.*?)\s{2,}(\S.*)$", line)
        if entry:
            key = entry.group(1)
            legend[key] = entry.group(2)
        elif line.startswith("   ") and key is not None:
            legend[key] += " " + line.strip()
        else:
            break
    return legend


def test_a_note_too_long_for_the_table_is_shown_whole_under_it():
    long = "the schedule of prefetch+by_stream, so its runs (one plan, measured once); searched (see below)"
    m = Measurement(100.0, 200.0, [PlanResult("auto", 3, 4, 4, 150.0, 1.5, True, note=long),
                                   PlanResult("sparse_dist+by_stream", 3, 3, 3, 140.0, 1.4, True,
                                              note="one thread per stream")])
    lines = format_table(m, width=100).splitlines()
    assert max(len(line) for line in lines) <= 100
    notes = _notes(lines, 0)
    assert notes["auto"] == long and notes["sparse_dist+by_stream"] == "one thread per stream"
    assert notes["serial-eval"] == "200.0 iterations/s; eval plans compare with it"


@pytest.mark.timeout(300)
def test_demo_prints_the_table_and_writes_the_fastest_plans_trace(tmp_path, capsys):
    trace = tmp_path / "demo.trace.json"
    code = main(["demo", "--iters", "4", "--batch-size", "32", "--repeats", "1", "--no-auto",
                 "--plans", "base,sparse_dist,sparse_dist+by_stream,eval_sparse_dist", "--trace", str(trace),
                 "--no-keep-freed-memory"])  # in-process: leave this test process's malloc as it is
    out = capsys.readouterr().out
    assert code == 0, out
    assert "host allocator: as the system sets it (--no-keep-freed-memory)" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("plan "))
    assert lines[header].split()[:6] == ["plan", "depth", "streams", "threads", "speedup", "predicted"]
    assert max(len(line) for line in lines if str(trace) not in line) <= 120  # but a path the user chose
    rows = {line.split()[0]: line.split() for line in lines[header + 2:]
            if line and not line.startswith(("4/", "time", "noise", "demo"))}
    assert rows["serial"][4] == "1.00x"
    assert rows["sparse_dist"][1:4] == ["3", "3", "1"]
    assert rows["sparse_dist+by_stream"][1:4] == ["3", "3", "3"]
    for name in ("base", "sparse_dist", "sparse_dist+by_stream", "eval_sparse_dist"):
        assert rows[name][6] == "yes", rows[name]
        assert float(rows[name][4].rstrip("x")) > 0
    assert "4/4 plans reproduce the serial loop bit for bit" in out
    notes = _notes(lines, header)  # every note whole: in its cell, or under the table
    assert notes["sparse_dist+by_stream"] == "thread map by_stream"
    assert notes["serial-eval"].endswith("iterations/s; eval plans compare with it")
    assert not any(line.rstrip().endswith(("...", "…")) for line in lines)
    legend = _legend(lines)
    assert {"predicted", "-", "= serial"} <= set(legend)  # the dashes of the predicted column are explained
    assert all(rows[name][5] == "-" for name in ("serial", "base", "sparse_dist"))
    events = read_chrome_trace(trace)
    best = next(line.split("fastest training plan: ")[1] for line in lines if "fastest training plan" in line)
    assert best in ("base", "sparse_dist", "sparse_dist+by_stream")
    assert {e.task for e in events} >= {"H2D", "Forward", "Backward", "OptimizerStep"}
    assert {e.iteration for e in events} == set(range(4))


def test_demo_rejects_an_unknown_plan(capsys):
    with pytest.raises(SystemExit, match="unknown plan 'nope'"):
        main(["demo", "--plans", "nope"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_on_two_spawned_ranks(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "swpipe.cli", "demo", "--world-size", "2", "--iters", "3",
                           "--batch-size", "16", "--repeats", "1", "--no-auto", "--plans", "sparse_dist,fused_sparse_dist",
                           "--trace", ""], capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "DLRM, 2 rank(s) (gloo, spawned on loopback)" in proc.stdout
    kept = platform.libc_ver()[0] == "glibc"
    assert ("host allocator: glibc keeps freed memory" in proc.stdout) == kept, proc.stdout
    assert "2/2 plans reproduce the serial loop bit for bit" in proc.stdout
