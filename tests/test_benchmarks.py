"""Smoke runs of the benchmark scripts the tests used to look inside: each runs with its quickest options and
prints its figures.

What a script measures (prediction errors, speedups, thread balances) is its figures, recorded in
``docs/results.md``, not asserted here; its internals are its own. Where a run states a behaviour of
the library, that is asserted: ``gpu_overlap`` reads every element of every copy, and the pipelined sums
equal the serial ones exactly (on the fake device with no race between its streams). The CUDA mutation
table (every injected engine fault caught) is ``tests/test_cuda_mutations.py``.
"""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import load_benchmark, word_after

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def torch_threads_kept():
    """The scripts set torch's intra-op threads for their run; the rest of the session keeps its own."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_calibrated_fidelity_runs_and_prints_its_errors(capsys):
    got = load_benchmark("calibrated_fidelity").main([
        "--plans", "1", "--rounds", "1", "--iters", "8", "--serial-iters", "3", "--sim-iters", "20",
        "--no-keep-freed-memory"])  # in-process: leave the test process's malloc as it is
    out = capsys.readouterr().out
    assert got == 0
    assert "|error|" in out  # the median prediction error, printed


def test_gil_retakes_runs_and_prints_both_parts(capsys):
    load_benchmark("gil_retakes").main(["--quick", "--no-keep-freed-memory"])  # in-process: malloc as it is
    out = capsys.readouterr().out
    assert {line.split()[0] for line in out.splitlines() if line.startswith("(")} >= {"(a)", "(b)"}  # both parts


def test_readme_example_runs_the_readmes_plan_and_prints_the_ratio(capsys):
    load_benchmark("readme_example").main(["--rounds", "1"])
    out = capsys.readouterr().out
    assert (word_after(out, "serial:") or "").startswith("x")  # the speedup of the pipelined plan


FIGURES = ("(a) overlap", "(b) serial", "(b) pipelined", "(c) engine")


def test_gpu_overlap_on_a_cpu_prints_every_figure_and_pipelined_equals_serial(capsys):
    got = load_benchmark("gpu_overlap").main(["--device", "cpu", "--quick"])
    out = capsys.readouterr().out
    assert got["overlap"]["equal"], got["overlap"]["mismatches"]
    assert all(line in out for line in FIGURES), out


@pytest.mark.cuda
def test_gpu_overlap_on_the_fake_is_exact_with_no_race_and_closes_the_fake(capsys):
    before = set(threading.enumerate())
    got = load_benchmark("gpu_overlap").main(["--device", "fake", "--quick"])
    out = capsys.readouterr().out
    assert got["overlap"]["equal"] and got["overlap"]["races"] == [], got["overlap"]
    assert all(line in out for line in FIGURES), out
    assert not [t.name for t in set(threading.enumerate()) - before if t.name.startswith("fakecuda")]


@pytest.mark.gpu
def test_gpu_overlap_on_a_gpu_is_exact():
    got = load_benchmark("gpu_overlap").main(["--device", "cuda", "--mib", "64", "--n", "4", "--iters", "12",
                                              "--rounds", "2"])
    assert got["overlap"]["equal"], got["overlap"]["mismatches"]
    assert got["overlap"]["costs"]["Copy"].device_s > 0  # the profiler timed the copy on the device


def test_sim_speed_times_every_case(capsys):
    bench = load_benchmark("sim_speed")
    assert bench.main(["--calls", "1", "--blocks", "1"]) == 0
    out = capsys.readouterr().out
    for case in bench.CASES:
        ms = word_after(out, *bench.case_label(*case).split(), "this")
        assert ms is not None and float(ms) > 0, out


def test_rolling_costs_runs_and_prints_both_errors(capsys):
    assert load_benchmark("rolling_costs").main(["--rounds", "1", "--iters", "6"]) == 0
    out = capsys.readouterr().out
    ahead = word_after(out, "|error|:", "ahead")
    fresh = word_after(out, "|error|:", "ahead", ahead, "refreshed")
    assert float(ahead.rstrip("%,")) >= 0 and float(fresh.rstrip("%")) >= 0, out  # both errors, printed


def test_replan_runs_its_three_parts_and_swaps_nothing_on_the_idle_run(capsys):
    got = load_benchmark("replan").main(["--quick"])
    out = capsys.readouterr().out
    assert {line.split()[0] for line in out.splitlines() if line.startswith("(")} == {"(1)", "(2)", "(3)"}
    # the idle run's costs keep the static plan the best: a search may start on a loaded machine, a swap never
    assert got["idle"]["swaps"] == 0


@pytest.mark.slow
def test_pp_runtime_paths_runs_every_path_with_losses_equal_to_schedule1f1b(capsys):
    """Two spawned gloo ranks, 1F1B's order run five ways: every path trains exactly like ``Schedule1F1B``."""
    figures = load_benchmark("pp_runtime_paths").main(["--microbatches", "2", "--rounds", "4", "--warmup", "1"])
    out = capsys.readouterr().out
    assert figures["losses_equal"], out
    assert set(figures["ratio"][2]) == {"Schedule1F1B", "csv", "lockstep", "csv-defer", "swpipe"}
    assert figures["ratio"][2]["Schedule1F1B"] == 1.0


def test_same_predictions_against_its_own_tree_finds_every_prediction_equal(capsys):
    """Two fresh interpreters (each its own hash seed) give the same predictions bit for bit: the script's
    comparison of two trees rests on it."""
    bench = load_benchmark("same_predictions")
    assert bench.main(["--against", str(bench.ROOT / "src")]) == 0
    lines = capsys.readouterr().out.splitlines()
    counts = {line.split()[0]: line.split()[1:4] for line in lines if not line.startswith(" ")}
    assert set(counts) == {"plan", "pp", "gpipe"}, lines
    for kind, (equal, of, total) in counts.items():
        assert of == "of" and equal == total and int(total) > 0, lines


def test_reliability_counts_every_bad_input_of_the_tests_tables_as_rejected():
    """The script counts the bad-input tables of tests/test_bad_input.py (plans, engine options, files): every
    case is tried and rejected naming its field."""
    bench = load_benchmark("reliability")
    got = bench.bad_input()
    assert got["failures"] == [] and got["tried"] == got["rejected"] > 0, got["failures"]
    assert got["counts"]["engine arguments"][0] > 0


def test_reliability_fake_device_surfaces_ctrl_c_when_started_with_sigint_ignored(tmp_path, capsys):
    """Started as a background job (SIGINT ignored), the script's Ctrl-C faults still raise KeyboardInterrupt:
    no unexpected row."""
    import signal

    bench = load_benchmark("reliability")
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = bench.main(["--quick", "--device", "fake", "--skip-multirank", "--out", str(tmp_path / "r.md")])
    finally:
        signal.signal(signal.SIGINT, before)
    from test_cuda_faults import CUDA_FAULTS

    out = capsys.readouterr().out
    headings = {line.split(":")[0] for line in out.splitlines() if line.endswith(":")}
    assert code == 0 and not any(h.startswith("Unexpected") for h in headings), out[-2000:]
    ctrl_c = [f.name for f in CUDA_FAULTS if "SIGINT" in f.where]
    assert ctrl_c and all(name in out for name in ctrl_c)
