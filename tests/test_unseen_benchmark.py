"""benchmarks/unseen_models.py (issue 47): its decisions on scripted rows, the pp job's core pool, and a smoke run.

No timing is asserted: the rows here are written by hand, and the smoke run checks that the summary it prints
reads the rows it measured.
"""

from __future__ import annotations

import statistics

import pytest
from conftest import load_benchmark, word_after

from swpipe import simulate
from autosched.pp.bounds import pp_lower_bounds
from autosched.results import fastest
from swpipe.commands.pp import predicted_preference
from swpipe.commands.pp_job import prediction_cores
from swpipe.pp import PPCosts, StageCost, pp_program


def row(schedule, n_mb, pred_ms, meas_ms, peaks=(100, 100), noise=0.1):
    return {"schedule": schedule, "n_microbatches": n_mb, "n_stages": 2, "predicted_step_s": pred_ms / 1e3,
            "measured_step_s": meas_ms / 1e3, "noise": noise, "loss_rel_err": 0.0,
            "measured_peak_bytes": {str(k): v for k, v in enumerate(peaks)},
            "predicted_peak_bytes": {str(k): v for k, v in enumerate(peaks)}}


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("pp")


def test_the_predicted_fastest_is_judged_by_its_measured_step(bench):
    rows = [row("GPipe", 4, 10.0, 21.0), row("1F1B", 4, 11.0, 20.0), row("1F1B", 8, 12.0, 30.0)]
    got = bench.fastest_pick(rows)
    # GPipe/4 is predicted fastest; it ran 21 ms against 1F1B/4's 20: 5 % over, which is within
    assert (got["predicted_fastest"], got["measured_fastest"]) == ("GPipe/4", "1F1B/4")
    assert got["pick_ratio"] == pytest.approx(1.05) and got["pick_within"]
    rows[0] = row("GPipe", 4, 10.0, 21.2)
    assert not bench.fastest_pick(rows)["pick_within"]
    rows[0] = row("GPipe", 4, 13.0, 21.2)  # now 1F1B/4 is predicted and measured fastest
    assert bench.fastest_pick(rows) == {"predicted_fastest": "1F1B/4", "measured_fastest": "1F1B/4",
                                        "pick_ratio": 1.0, "pick_within": True}


def test_a_tied_prediction_picks_the_lower_peak(bench):
    # GPipe/4 and 1F1B/4 predicted within 1 %: 1F1B holds half the memory, so it is the predicted fastest
    rows = [row("GPipe", 4, 10.0, 21.0, peaks=(400, 300)), row("1F1B", 4, 10.05, 20.0, peaks=(200, 100))]
    assert bench.fastest_pick(rows)["predicted_fastest"] == "1F1B/4"
    rows[1] = row("1F1B", 4, 10.2, 20.0, peaks=(200, 100))  # 2 % slower: no tie
    assert bench.fastest_pick(rows)["predicted_fastest"] == "GPipe/4"


def test_the_best_builtin_under_a_cap_is_the_fastest_whose_every_rank_fits(bench):
    rows = [row("GPipe", 8, 10, 18, peaks=(400, 300)), row("1F1B", 8, 10, 20, peaks=(200, 100)),
            row("ZBVZeroBubble", 8, 10, 19, peaks=(150, 250))]
    assert bench.best_fitting(rows, None)["schedule"] == "GPipe"
    assert bench.best_fitting(rows, 250)["schedule"] == "ZBVZeroBubble"  # its busiest rank exactly at the cap
    assert bench.best_fitting(rows, 249)["schedule"] == "1F1B"
    assert bench.best_fitting(rows, 199) is None


@pytest.mark.parametrize("ratio, noise, headroom, verdict", [
    (0.85, 0.10, 0.30, "faster"),
    (1.15, 0.10, 0.30, "slower"),
    (0.95, 0.10, 0.05, "cannot_win"),  # the bound leaves less than the noise below the best built-in
    (0.95, 0.10, 0.10, "cannot_win"),
    (0.95, 0.10, 0.30, "not_shown"),
    (0.50, float("nan"), 0.30, "no_noise"),
])
def test_the_search_verdict_reads_the_noise_and_the_bound(bench, ratio, noise, headroom, verdict):
    assert bench.search_verdict(ratio, noise, headroom) == verdict


def test_the_bound_headroom_is_the_lower_bound_under_the_rows_prediction(bench):
    costs = PPCosts((StageCost(1.0, 2.0),) * 2)
    report = {"world_size": 2, "costs": {"4": {"2": costs.to_dict()}}}
    r = row("1F1B", 4, 20e3, 20e3)  # predicted 20 s; no order of these stages beats 15 s
    got = bench.bound_headroom(report, r)
    assert got["bound_s"] == pytest.approx(15.0) and got["headroom"] == pytest.approx(0.25)
    assert got["binding"] == pp_lower_bounds(costs, 4, (0, 1)).binding  # what binds: the bound's own words


def test_the_cap_admits_only_the_most_frugal_schedules():
    unseen = load_benchmark("unseen_models")
    rows = [row("GPipe", 8, 1, 1, peaks=(1000, 800)), row("1F1B", 8, 1, 1, peaks=(400, 200)),
            row("ZBVZeroBubble", 8, 1, 1, peaks=(300, 410)), row("DualPipeV", 8, 1, 1, peaks=(430, 100))]
    assert unseen.choose_cap(rows) == {"cap_bytes": 420, "fits": ["1F1B", "ZBVZeroBubble"]}


def test_the_prediction_shares_the_cores_only_when_the_ranks_outnumber_them():
    assert prediction_cores(2, 2) is None and prediction_cores(2, 16) is None
    assert prediction_cores(4, 2) == 2 and prediction_cores(3, 2) == 2
    assert prediction_cores(2, 2, given=1) == 1
    # and the verb passes the pool on: one core for 2 ranks, the ranks take turns (1 + 2 per micro-batch each)
    costs = PPCosts((StageCost(1.0, 2.0),) * 2)
    program = pp_program("GPipe", 2, 4)
    assert simulate(program, costs).period_s == pytest.approx(15.0)
    assert simulate(program, costs, cores=1).period_s == pytest.approx(24.0)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_quick_run_prints_a_summary_that_reads_its_rows(capsys):
    unseen = load_benchmark("unseen_models")
    out = unseen.main(["--quick"])
    text = capsys.readouterr().out
    lines = text.splitlines()
    titles = [p["title"] for p in out["parts"]]
    assert titles == ["transformer LM, 2 ranks", "unequal MLP, 2 ranks", f"unequal MLP, 4 ranks on {out['cores']} cores"]
    for part in out["parts"]:
        rows = [r for r in part["report"]["results"] if "refused" not in r and r["schedule"] != "swpipe-searched"]
        errors = [abs(r["predicted_step_s"] - r["measured_step_s"]) / r["measured_step_s"] for r in rows]
        fastest_pred = fastest(rows, predicted_preference)  # a tie within 1 % goes to the lower peak
        fastest_meas = min(rows, key=lambda r: r["measured_step_s"])
        ratio = fastest_pred["measured_step_s"] / fastest_meas["measured_step_s"]
        line = next(x for x in lines if x.startswith(part["title"] + ":"))
        unchecked = [abs(r["predicted_unchecked_step_s"] / r["measured_step_s"] - 1) for r in rows]
        assert word_after(line, "|step", "error|") == f"{statistics.median(errors):.1%}"
        assert word_after(line, "correction", "unchecked") == f"{statistics.median(unchecked):.1%});"
        assert word_after(line, "predicted", "fastest") == f"{fastest_pred['schedule']}/{fastest_pred['n_microbatches']}"
        assert word_after(line, "measured", "fastest") == f"{fastest_meas['schedule']}/{fastest_meas['n_microbatches']}"
        assert word_after(line, "ratio") == f"{ratio:.3f}"
        assert word_after(line, "within5%") == ("yes;" if ratio <= 1.05 else "no;")
        assert {r["n_microbatches"] for r in rows} == {4, 8}
        assert all(r["loss_rel_err"] <= 1e-4 for r in rows)
    four = out["parts"][-1]["report"]
    assert four["world_size"] == 4 and four["prediction_cores"] == prediction_cores(4, out["cores"])
    # item 7: the capped job ran only the schedules that fit the cap, and the search under that cap
    capped = out["capped"]["report"]
    assert capped["config"]["memory_cap_bytes"] == out["cap"]["cap_bytes"]
    assert {r["schedule"] for r in capped["results"]} == set(out["cap"]["fits"]) | {"swpipe-searched"}
    assert [r["chunks"] for r in out["unet"]["rows"]] == [2, 4, 8]
