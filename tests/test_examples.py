"""Every script in examples/ runs as users run it (a fresh ``python`` process) and reports success."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import schedule_rows, word_after

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(script: str, *args: str, timeout: float = 240) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=EXAMPLES.parent)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _equalities(out: str) -> list:
    """What each ``...equal to ...: True|False`` check the script prints came out as, in order."""
    return [line.rsplit(": ", 1)[1] for line in out.splitlines() if "equal" in line.split() and ": " in line]


def test_examples_folder_has_only_tested_scripts():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(
        ["train_dlrm_pipelined.py", "custom_plan.py", "two_ranks.py", "torchrec_dropin.py"])


@pytest.mark.timeout(300)
def test_train_dlrm_pipelined_matches_the_plain_loop():
    out = _run("train_dlrm_pipelined.py", "--iters", "5", "--batch-size", "64")
    assert schedule_rows(out)[1]["EmbLookup"][:2] == ("emb_lookup", "emb_lookup")  # one thread per stream
    assert _equalities(out) == ["True"]  # against the plain loop


@pytest.mark.timeout(300)
def test_custom_plan_validates_runs_and_matches():
    out = _run("custom_plan.py", "--iters", "6")
    assert word_after(out, "depth") == "4," and word_after(out, "threads") == "['default',"
    assert "['default', 'io', 'sparse']" in out and _equalities(out) == ["True"]  # the losses, against the plain loop


@pytest.mark.peer
@pytest.mark.timeout(300)
def test_torchrec_dropin_matches_torchrecs_pipeline_and_the_loop():
    from conftest import torchrec_usable

    if not torchrec_usable():
        pytest.skip("TorchRec not installed (the [peer] extra)")
    out = _run("torchrec_dropin.py", "--batches", "8")
    assert "'sparse_dist'" in out and "TrainPipelineSparseDist" in out  # the plan and TorchRec's class it replaces
    assert _equalities(out) == ["True", "True"] and "(TTTTEETT)" in out  # against TorchRec's, then the loop


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ranks_each_match_their_plain_loop():
    out = _run("two_ranks.py", "--iters", "4")
    owned = {line.split()[1]: line[line.index("["):line.index("]") + 1] for line in out.splitlines()
             if line.startswith("rank ") and "[" in line}
    assert owned == {"0/2": "[0, 2]", "1/2": "[1, 3]"}  # each rank's tables
    assert _equalities(out) == ["True", "True"]
