"""``benchmarks/gil_retakes.py``: what two threads of torch work gain by op size, and a plan's tasks by thread map."""

from __future__ import annotations

import pytest
from conftest import load_benchmark

pytestmark = pytest.mark.timeout(300)


def _bench():
    return load_benchmark("gil_retakes")


def test_smoke_run_measures_every_op_size_and_every_task_both_ways(capsys):
    got = _bench().main(["--quick"])
    out = capsys.readouterr().out
    assert set(got["a"]) == {"mm 64x64", "mm 256x256", "sha256 1 MiB", "beside python"}
    assert all(v > 0 for values in got["a"].values() for v in values)
    for plan in ("sparse_dist", "fused_sparse_dist"):
        runs = got["b"][plan]
        assert set(runs["as_torchrec"]["tasks"]) == set(runs["by_stream"]["tasks"]) == set(runs["calls"])
        assert runs["calls"]["Forward"] > 0 and runs["calls"]["WaitBatch"] == 0  # WaitBatch calls no torch op
    assert "(a) two threads" in out and "(b) host time per task" in out


def test_a_torch_call_counter_counts_calls_made_from_python():
    counter_type = _bench()._CallCounter
    import torch

    with counter_type() as counter:
        x = torch.ones(3)
        (x + 1).sum()
    assert counter.calls == 3  # ones, add, sum
