"""``swpipe pp`` end to end: every PyTorch schedule and the searched one trained under torchrun (2 ranks, gloo).

The job is bounded by the command's own ``--timeout`` (the launcher's process group is
killed past it); the test then fails with the output, it never hangs.
"""

from __future__ import annotations

import json

import pytest

from autosched.pp import PP_CORRECTIONS, PPCosts, builtin_programs, pp_program, read_csv
from autosched.model.corrections import CorrectionDecision
from autosched.pp.simulate import pp_simulate
from swpipe.cli import main
from swpipe.pp import held_out_error_pct


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("pp")
    path, csv_path = out / "report.json", out / "searched.csv"
    rc = main(["pp", "--ranks", "2", "--microbatches", "4", "--width", "32", "--depth", "4", "--batch", "16",
               "--steps", "2", "--warmup", "1", "--time-limit", "1", "--json", str(path), "--csv", str(csv_path),
               "--timeout", "400"])
    assert rc == 0
    return json.loads(path.read_text()), csv_path


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_every_schedule_trains_like_the_unsplit_model(report) -> None:
    data, _ = report
    rows = {r["schedule"]: r for r in data["results"] if "refused" not in r}
    expected = set(builtin_programs(2, 4)[0]) | {"swpipe-searched"}
    assert set(rows) == expected
    for name, r in rows.items():
        assert len(r["losses"]) == len(r["reference_losses"]) == 1 + 2 + 1, name
        assert r["loss_rel_err"] <= 1e-4, (name, r["losses"], r["reference_losses"])


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_measured_beside_predicted_on_every_rank(report) -> None:
    data, csv_path = report
    assert data["world_size"] == 2 and data["p2p"]["backend"] == "gloo"
    for r in data["results"]:
        if "refused" in r:
            continue
        assert set(r["measured_peak_bytes"]) == set(r["predicted_peak_bytes"]) == {"0", "1"}
        assert all(int(v) > 0 for v in r["measured_peak_bytes"].values())
        assert r["measured_step_s"] > 0 and r["predicted_step_s"] > 0
    # the prediction is the simulator on the costs the report records, the link's post cost included
    for r in data["results"]:
        if "refused" in r or r["schedule"] == "swpipe-searched":
            continue
        costs = PPCosts.from_dict(data["costs"][str(r["n_microbatches"])][str(r["n_stages"])])
        assert costs.p2p.post_s >= 0 and costs.p2p.backend == "gloo"
        assert all(c.reduce_grad_s > 0 for c in costs.stages)
        program = pp_program(r["schedule"], 2, r["n_microbatches"])
        assert pp_simulate(program, costs).step_s == pytest.approx(r["predicted_step_s"])
    assert csv_path.read_text().splitlines() == data["searched"]["csv"].splitlines()
    back = read_csv(str(csv_path), 2, data["searched"]["n_stages"], 4)  # through PyTorch's own loader
    assert back.n_stages == data["searched"]["n_stages"]


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_each_ranks_steps_are_split_into_compute_posting_and_waiting(report) -> None:
    from swpipe.commands.pp import format_summary, split_line, summarise
    from swpipe.pp import StepSplit

    data, _ = report
    for r in data["results"]:
        if "refused" in r:
            continue
        splits = {rank: StepSplit(**s) for rank, s in r["split_by_rank"].items()}
        assert set(splits) == set(r["predicted_busy_s"]) == {"0", "1"}
        for s in splits.values():  # one step's parts: they add up to it
            assert 0 < s.compute_s and s.other_s >= 0 and s.compute_s + s.post_s + s.wait_s <= s.step_s
        # two ranks exchange every micro-batch's activations and gradients: both post and wait
        assert all(s.post_s > 0 for s in splits.values()), r["schedule"]
        assert any(s.wait_s > 0 for s in splits.values()), r["schedule"]
    summary, lines = summarise(data), format_summary(data).splitlines()
    assert split_line(summary.measured_fastest) in lines and split_line(summary.worst_predicted) in lines
    rows = [r for r in data["results"] if "refused" not in r]
    worst = max(abs(r["predicted_step_s"] / r["measured_step_s"] - 1) for r in rows)
    assert abs(summary.worst_predicted["predicted_step_s"] / summary.worst_predicted["measured_step_s"] - 1) == worst


def test_bad_arguments_start_no_job(capsys) -> None:
    assert main(["pp", "--schedules", "GPipe,NoSuch"]) == 2
    assert main(["pp", "--batch", "10", "--microbatches", "4"]) == 2
    assert main(["pp", "--ranks", "3", "--depth", "2"]) == 2  # fewer blocks than ranks
    assert main(["pp", "--grid", "NoSuch"]) == 2
    assert main(["pp", "--grid", "GPipe", "--microbatches", "4"]) == 0
    out = capsys.readouterr().out
    assert "0F3" in out and "1B3" in out


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_the_benchmark_reads_the_report(report, capsys) -> None:
    from conftest import load_benchmark

    data, _ = report
    figures = load_benchmark("pp").analyse(data)
    assert 0 <= figures["step_median_abs_error"] and 0 <= figures["memory_median_abs_error"]
    assert figures["best_builtin"] in set(builtin_programs(2, 4)[0])
    assert -1.0 <= figures["dry_run_spearman"] <= 1.0
    # the comparison with PyTorch's dry run is printed: its heading is what a reader looks for
    assert "(4) PyTorch's dry run" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_the_searched_row_runs_the_searchs_best_with_its_path_priced(report, tmp_path) -> None:
    """The job measures what a custom order's path adds per action (1F1B's order both ways), the prediction of a
    custom order carries it, and the searched row runs the search's best: PyTorch's class when it is one of them."""
    data, _ = report
    assert set(data["custom_overhead_s"]) == {"4"} and set(data["custom_overhead_s"]["4"]) == set(data["costs"]["4"])
    assert all(v >= 0 for v in data["custom_overhead_s"]["4"].values())  # one probe per stage count
    # each stage count's corrections decided on its own probe's steps, and the costs carry what was kept
    decided = {(d["key"], d["correction"]): d for d in data["corrections"]["4"]}
    assert set(decided) == {(f"4 mb, {k} stages", c) for k in data["costs"]["4"] for c in PP_CORRECTIONS}
    for k, c in data["costs"]["4"].items():
        kept = PPCosts.from_dict(c)
        post, per_action = (decided[(f"4 mb, {k} stages", name)] for name in ("post cost", "runtime cost per action"))
        assert post["applied"] or kept.p2p.post_s == 0.0
        assert per_action["applied"] or kept.action_overhead_s == 0.0
        # the probe's steps in the runs' rounds only (one per round), not those before the runs (the report keeps
        # them): the post cost fitted on every other one, the corrections judged on the rest
        held = data["held_out_steps_s"]["4"][k]
        assert len(held) == data["config"]["steps"] and all(s > 0 for s in held)
        assert all(d["steps"] == len(held[1::2]) for d in (post, per_action))
    # and the decisions the search's costs carried, before the runs (their own steps), on the same keys
    before = data["search_corrections"]["4"]
    assert {(d["key"], d["correction"]) for d in before} == set(decided)
    assert all(d["steps"] == max(3, data["config"]["cost_repeats"]) for d in before)
    # the search's margin: the largest held-out error of the costs it ran on (a smaller predicted gain is none)
    margin = held_out_error_pct([CorrectionDecision(**d) for d in before])
    assert data["searched"]["margin_pct"] == pytest.approx(margin) and margin > 0
    searched = data["searched"]
    row = next(r for r in data["results"] if r["schedule"] == "swpipe-searched")
    costs = PPCosts.from_dict(data["costs"]["4"][str(row["n_stages"])])
    assert costs.custom_overhead_s == data["custom_overhead_s"]["4"][str(row["n_stages"])]
    if searched["builtin"] is not None:
        assert searched["origin"] == f"PyTorch {searched['builtin']}"
        program = pp_program(searched["builtin"], 2, 4, row["n_stages"] // 2)
    else:
        path = tmp_path / "order.csv"
        path.write_text(searched["csv"])
        program = read_csv(str(path), 2, row["n_stages"], 4)
        assert program.source == "csv"
    assert pp_simulate(program, costs).step_s == pytest.approx(row["predicted_step_s"])

