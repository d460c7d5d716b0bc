"""Every script in examples/ runs as users run it (a fresh ``python`` process) and reports success."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(script: str, *args: str, timeout: float = 240) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=EXAMPLES.parent)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_examples_folder_has_only_tested_scripts():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(
        ["train_dlrm_pipelined.py", "custom_plan.py", "two_ranks.py", "torchrec_dropin.py"])


@pytest.mark.timeout(300)
def test_train_dlrm_pipelined_matches_the_plain_loop():
    out = _run("train_dlrm_pipelined.py", "--iters", "5", "--batch-size", "64")
    assert "EmbLookup          emb_lookup  emb_lookup" in out  # one thread per stream
    assert "equal to the plain loop: True" in out


@pytest.mark.timeout(300)
def test_custom_plan_validates_runs_and_matches():
    out = _run("custom_plan.py", "--iters", "6")
    assert "depth 4, threads ['default', 'io', 'sparse']" in out
    assert "losses equal to the plain loop: True" in out


@pytest.mark.peer
@pytest.mark.timeout(300)
def test_torchrec_dropin_matches_torchrecs_pipeline_and_the_loop():
    from conftest import torchrec_usable

    if not torchrec_usable():
        pytest.skip("TorchRec not installed (the [peer] extra)")
    out = _run("torchrec_dropin.py", "--batches", "8")
    assert "plan 'sparse_dist', TorchRec's TrainPipelineSparseDist" in out
    assert "outputs equal to TorchRec's TrainPipelineSparseDist: True" in out
    assert "train/eval/train (TTTTEETT): outputs equal to the non-pipelined loop: True" in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ranks_each_match_their_plain_loop():
    out = _run("two_ranks.py", "--iters", "4")
    assert "rank 0/2 (gloo): owns tables [0, 2]" in out and "rank 1/2 (gloo): owns tables [1, 3]" in out
    assert out.count("equal to the plain loop: True") == 2
