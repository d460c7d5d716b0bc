"""``swpipe demo``: one table (plan, shape, iter/s, measured and predicted speedup, = serial), at most 120 columns."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest
from conftest import word_after

from swpipe.cli import main
from swpipe_core.measure.trace import read_chrome_trace


@pytest.mark.timeout(300)
def test_demo_prints_the_table_and_writes_the_fastest_plans_trace(tmp_path, capsys):
    trace = tmp_path / "demo.trace.json"
    code = main(["demo", "--iters", "4", "--batch-size", "32", "--repeats", "1", "--no-auto",
                 "--plans", "base,sparse_dist,sparse_dist+by_stream,eval_sparse_dist", "--trace", str(trace),
                 "--no-keep-freed-memory"])  # in-process: leave this test process's malloc as it is
    out = capsys.readouterr().out
    assert code == 0, out
    assert "(--no-keep-freed-memory)" in _line(out, "allocator:")  # the allocator left as the system sets it
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
    assert _line(out, "reproduce").split()[0] == "4/4"  # every plan reproduces the serial loop
    events = read_chrome_trace(trace)
    best = next(line.split("fastest training plan: ")[1] for line in lines if "fastest training plan" in line)
    assert best in ("base", "sparse_dist", "sparse_dist+by_stream")
    assert {e.task for e in events} >= {"H2D", "Forward", "Backward", "OptimizerStep"}
    assert {e.iteration for e in events} == set(range(4))


def test_demo_rejects_an_unknown_plan(capsys):
    with pytest.raises(SystemExit, match="'nope'"):
        main(["demo", "--plans", "nope"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_on_two_spawned_ranks(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "swpipe.cli", "demo", "--world-size", "2", "--iters", "3",
                           "--batch-size", "16", "--repeats", "1", "--no-auto", "--plans", "sparse_dist,fused_sparse_dist",
                           "--trace", ""], capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert word_after(proc.stdout, "DLRM,") == "2" and word_after(proc.stdout, "rank(s)") == "(gloo,"
    assert "spawned" in proc.stdout.split()  # on loopback, not launched by torchrun
    kept = platform.libc_ver()[0] == "glibc"
    assert (word_after(_line(proc.stdout, "allocator:"), "allocator:") == "glibc") == kept, proc.stdout
    assert _line(proc.stdout, "reproduce").split()[0] == "2/2"


def _line(out: str, word: str) -> str:
    """The first printed line holding ``word``."""
    return next(line for line in out.splitlines() if word in line.split())
