"""The two-rank re-planning benchmark's smoke run (``benchmarks/replan_ranks.py --quick``): its parts and decisions.

What it measures (step times, the gap recovered, the overhead) is its figures, recorded in ``docs/results.md``, not
asserted here. Asserted: every candidate was tried in both states, both ranks ran the same schedule at every step
and switched at the same steps, each decision chose the fastest of its predictions, the losses are the static
run's within float rounding, and the idle run switched nothing.
"""

from __future__ import annotations

import pytest
from conftest import load_benchmark

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

LABELS = ["GPipe n=2", "1F1B n=2", "GPipe n=4", "1F1B n=4"]


@pytest.fixture(scope="module")
def quick():
    return load_benchmark("replan_ranks").main(["--quick"])


def test_every_candidate_is_tried_at_first_and_slowed_and_the_best_is_the_fastest_slowed(quick):
    assert quick["labels"] == LABELS and quick["static"] == "GPipe n=2"
    assert set(quick["trials"]["first"]) == set(quick["trials"]["slowed"]) == set(LABELS)
    assert set(quick["predicted_first"]) == set(LABELS)
    slowed = quick["trials"]["slowed"]
    assert quick["best"] == min(slowed, key=slowed.get)
    assert set(quick["drift"]) == {"static", "best", "adaptive"}


def test_both_ranks_run_the_same_schedule_every_step_and_switch_together(quick):
    rank0_used, rank1_used = quick["used"]
    assert rank0_used == rank1_used and rank0_used[0] == "GPipe n=2"
    switches = [d for d in quick["decisions"] if d["swapped"]]
    assert [d["starts_at"] for d in quick["rank1_decisions"]] == [d["starts_at"] for d in switches]
    running = "GPipe n=2"
    for d in quick["decisions"]:
        assert d["running"] == running and set(d["predicted"]) == set(LABELS)
        assert d["predicted"][d["chosen"]] == min(d["predicted"].values())  # the fastest predicted is chosen
        assert d["starts_at"] == (d["step"] + 1 if d["swapped"] else None)
        if d["swapped"]:
            assert rank0_used[d["step"]] == running and rank0_used[d["starts_at"]] == d["chosen"]
            running = d["chosen"]
    assert rank0_used[-1] == running


def test_the_losses_are_the_static_runs_and_the_idle_run_switches_nothing(quick):
    assert quick["loss_diff"]["adaptive"] <= 1e-5 and quick["loss_diff"]["best"] <= 1e-5
    # the first costs keep GPipe n=2 among the fastest: a drift may be seen on a loaded machine, a switch never
    assert quick["idle"]["switches"] == 0 and quick["idle"]["rank1_switches"] == 0
