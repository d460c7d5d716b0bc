"""``torchrun --nproc-per-node 2`` (gloo, 127.0.0.1, a free port) runs the workload as one two-rank job.

The launcher is started with ``sys.executable -m torch.distributed.run`` (the
interpreter running the tests) in its own process group, bounded by a wall
clock: on overrun the whole group is killed and the test fails with the
output, it never hangs. Each rank (``tests/torchrun_worker.py``) writes what
it saw; the tests compare ranks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port, word_after

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("torchrun_worker.py")
WALL_S = 300


def torchrun(nproc: int, *target: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run ``target`` (a script and its arguments, or ``-m module ...``) under torchrun on loopback; kill the whole process group after WALL_S seconds."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)  # the launcher sets them per rank
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--nnodes=1",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--max-restarts=0", *target]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=WALL_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish within {WALL_S} s (killed):\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("torchrun")
    proc = torchrun(2, str(WORKER), str(out_dir))
    assert proc.returncode == 0, f"torchrun failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}"
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(2)]


def test_torchrun_gives_two_distinct_ranks_of_one_job(ranks):
    assert [(r["rank"], r["world_size"], r["local_rank"], r["launcher"]) for r in ranks] == [
        (0, 2, 0, True), (1, 2, 1, True)]
    assert ranks[0]["reference_losses"] != ranks[1]["reference_losses"]  # each rank trains its own shard


def test_every_rank_issues_the_same_collectives_in_the_same_order_on_each_group(ranks):
    def per_group(log):
        groups = {}
        for group, op in log:
            groups.setdefault(group, []).append(op)
        return groups

    a, b = per_group(ranks[0]["collectives"]), per_group(ranks[1]["collectives"])
    assert a == b
    assert {"input_lengths", "input_values", "emb_fwd", "emb_bwd", "dense_grad", "agree_on_end"} <= set(a)
    assert len(a["dense_grad"]) == 6  # one all-reduce per iteration
    assert ranks[0]["agreed_batches"] == ranks[1]["agreed_batches"] == 6


def test_pipelined_losses_equal_the_serial_loop_on_every_rank(ranks):
    for r in ranks:
        assert r["torchrec_equal"], f"rank {r['rank']}: sparse_dist+by_stream differs from its serial loop"
        assert r["auto_equal"], f"rank {r['rank']}: the auto plan differs from its serial loop"


def test_one_auto_plan_is_shared_by_both_ranks(ranks):
    assert ranks[0]["auto_plan"] == ranks[1]["auto_plan"]
    assert "('tasks', [{'name': " in ranks[0]["auto_plan"]  # the plan's dict form (swpipe_core.planfile)
    # the candidates were measured on both ranks at once, and both chose the same one from the folded table
    note = ranks[0]["auto_note"]
    assert ranks[1]["auto_note"] == note and word_after(note, "all") == "2" and "lockstep" in note
    # predicted after the lockstep runs, with the search's own model (the calibration folded in)
    assert "folded" in note.split() and "predicted" in note.split()
    # the model's speedup of the plan chosen in lockstep, the same on both ranks (rank 0's predictions, shared)
    assert ranks[0]["auto_predicted_speedup"] == ranks[1]["auto_predicted_speedup"]
    assert ranks[0]["auto_predicted_speedup"] > 0
    assert ranks[0]["auto_predicts"] == ranks[1]["auto_predicts"]
    assert set(ranks[0]["auto_predicts"]) == {"prefetch", "prefetch+by_stream"}  # the seeds' rows


def test_a_plan_that_differs_on_one_rank_fails_on_every_rank_naming_the_field(ranks):
    for r in ranks:
        # rank 1 (a JSON key), B's schedule and so the depth
        assert r["mismatch_error"] == {"differences": {"1": ["tasks", "pipeline_depth"]}, "tasks": {"1": ["B"]}}


def test_every_group_the_workload_creates_has_the_jobs_timeout(ranks):
    assert [r["timeouts_s"] for r in ranks] == [[60.0], [60.0]]


def test_demo_under_torchrun_prints_one_folded_table_on_rank_0(tmp_path):
    proc = torchrun(2, "-m", "swpipe.cli", "demo", "--iters", "3", "--repeats", "1", "--batch-size", "32",
                    "--plans", "sparse_dist", "--no-auto", "--trace", str(tmp_path / "t.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:]
    heads = [line for line in proc.stdout.splitlines() if line.split()[:1] == ["DLRM,"]]
    assert len(heads) == 1 and word_after(heads[0], "DLRM,") == "2" and "torchrun" in heads[0]  # once
    reproduced = [line.split()[0] for line in proc.stdout.splitlines() if "reproduce" in line.split()]
    assert reproduced == ["1/1"] and word_after(proc.stdout, "all") == "2"  # every check holds on all 2 ranks


@pytest.mark.parametrize("script, ranks", [("two_ranks.py", ["0/2", "1/2"]), ("custom_plan.py", [])])
def test_examples_run_unchanged_under_torchrun_and_print_once(script, ranks):
    proc = torchrun(2, str(ROOT / "examples" / script), "--iters", "4")
    assert proc.returncode == 0, proc.stdout[-6000:]
    lines = proc.stdout.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("rank ")] == ranks  # one line per rank, once
    checks = [line.rsplit(": ", 1)[1] for line in lines if "equal" in line.split()]
    assert checks == ["True"] * max(1, len(ranks)), proc.stdout[-3000:]  # printed once (rank 0) or once per rank
    assert ranks or "2 rank(s)," in proc.stdout  # custom_plan: checked on both ranks
