"""``benchmarks/gil_retakes.py``: what two threads of torch work gain by op size, and a plan's tasks by thread map."""

from __future__ import annotations

import pytest
from conftest import load_benchmark

pytestmark = pytest.mark.timeout(300)


def _bench():
    return load_benchmark("gil_retakes")


def test_smoke_run_measures_every_op_size_and_every_task_both_ways(capsys):
    got = _bench().main(["--quick", "--no-keep-freed-memory"])  # in-process: leave malloc as it is
    out = capsys.readouterr().out
    assert set(got["a"]) == {"mm 64x64", "mm 256x256", "sha256 1 MiB", "beside python"}
    assert all(v > 0 for values in got["a"].values() for v in values)
    for plan in ("sparse_dist", "fused_sparse_dist"):
        runs = got["b"][plan]
        assert set(runs["as_torchrec"]["tasks"]) == set(runs["by_stream"]["tasks"]) == set(runs["calls"])
        assert runs["calls"]["Forward"] > 0 and runs["calls"]["WaitBatch"] == 0  # WaitBatch calls no torch op
        off_caller = ("H2D", "InputDistStart", "InputDistWait") + (("EmbLookup",) if plan == "fused_sparse_dist" else ())
        moved = sum(runs["as_torchrec"]["tasks"][t] for t in off_caller)
        assert runs["balance"]["moved_s"] == pytest.approx(moved)  # by stream, these leave the caller's thread
    assert "(a) two threads" in out and "(b) host time per task" in out and "caller's thread (default)" in out


def test_a_torch_call_counter_counts_calls_made_from_python():
    counter_type = _bench()._CallCounter
    import torch

    with counter_type() as counter:
        x = torch.ones(3)
        (x + 1).sum()
    assert counter.calls == 3  # ones, add, sum


def test_caller_balance_weighs_the_work_moved_off_against_the_slowdown_left_behind():
    from swpipe_core.plan import PipelinePlan, TaskSchedule

    balance = _bench().caller_balance
    plan = PipelinePlan({"Copy": TaskSchedule(0, thread_group="memcpy"), "Dist": TaskSchedule(1, thread_group="dist"),
                         "Fwd": TaskSchedule(2), "Bwd": TaskSchedule(2)})
    one = {"Copy": 0.1, "Dist": 0.3, "Fwd": 4.0, "Bwd": 4.0}
    b = balance(one, {"Copy": 0.4, "Dist": 0.9, "Fwd": 4.2, "Bwd": 4.3}, plan, period_s=8.5)
    assert b["moved_s"] == pytest.approx(0.4) and b["moved_there_s"] == pytest.approx(1.3)
    assert b["left_one_s"] == pytest.approx(8.0) and b["left_split_s"] == pytest.approx(8.5)
    assert b["net_s"] == pytest.approx(0.1)  # the caller's thread slowed by 0.5, more than the 0.4 it shed
    assert b["caller_busy"] == pytest.approx(1.0)
    gains = balance(one, {"Copy": 0.4, "Dist": 0.9, "Fwd": 4.0, "Bwd": 4.1}, plan, period_s=8.2)
    assert gains["net_s"] == pytest.approx(-0.3)
    # a task on the caller's group counts as left, whatever the group is called
    named = plan.replace(caller_group="dist")
    assert balance(one, one, named, period_s=8.4)["moved_s"] == pytest.approx(8.1)


def test_caller_balance_example_runs():
    import doctest

    bench = _bench()
    tests = doctest.DocTestFinder().find(bench.caller_balance, "caller_balance", globs=dict(vars(bench)))
    results = [doctest.DocTestRunner().run(t) for t in tests]
    assert tests and all(r.failed == 0 and r.attempted > 0 for r in results)
