"""benchmarks/gpipe.py runs end to end with its quickest options and prints every part (figures are not asserted)."""

from __future__ import annotations

import pytest

from conftest import load_benchmark


@pytest.mark.slow
def test_the_gpipe_benchmark_runs_and_its_memory_predictions_are_measured(capsys):
    out = load_benchmark("gpipe").main(["--quick"])
    text = capsys.readouterr().out
    # every part of the benchmark is printed: its headings are what a reader looks for
    assert "(a) step time" in text and "(b) balance" in text and "(c) predicted against measured" in text
    assert sorted({row["chunks"] for row in out["a"]}) == [1, 2, 4, 8]
    assert {row["variant"] for row in out["a"]} >= {"whole (1 thread)", "swpipe GPipe.step GPipe",
                                                    "swpipe GPipe.step 1F1B"}
    assert all(sum(row["balance"]) == 12 for row in out["b"])
    # GPipe without checkpointing: every activation is alive when the last forward ends, whatever the timing
    never = [row for row in out["c"] if row["checkpoint"] == "never" and row["schedule"] == "GPipe"]
    assert never and all(row["pred_MB"] == pytest.approx(row["meas_MB"]) for row in never)


@pytest.mark.slow
def test_the_unet_benchmark_prints_each_chunks_with_its_decision(capsys):
    out = load_benchmark("gpipe_unet").main(["--quick"])
    lines = capsys.readouterr().out.splitlines()
    assert [row["chunks"] for row in out["rows"]] == [2, 4, 8]
    # the decided prediction is the corrected one where the slowdown is applied, else the plain one
    for row in out["rows"]:
        assert row["decided_err"] == pytest.approx(row["corr_err"] if row["applied"] else row["plain_err"])
        assert row["instep_applied"] or row["instep_err"] == pytest.approx(row["plain_err"])
    assert sorted(out["checked"].decisions) == [2, 4, 8] and out["checked"].summary() in lines
    assert sorted(out["in_steps"].decisions) == [2, 4, 8] and "in-step " + out["in_steps"].summary() in lines
    # the closest is, per size, one of the two checked predictions (or the plain one where neither is applied)
    for row in out["rows"]:
        assert row["closest_err"] in (pytest.approx(row["decided_err"]), pytest.approx(row["instep_err"]))
