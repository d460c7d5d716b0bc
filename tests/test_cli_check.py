"""``swpipe check`` through swpipe.cli.main."""

from __future__ import annotations

from pathlib import Path

from swpipe.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_check_torchrec_plans_ok(capsys):
    assert main(["check", "sparse_dist", "semi_sync", "--order", "default"]) == 0
    out = capsys.readouterr().out
    assert "== sparse_dist: OK" in out and "== semi_sync: OK" in out
    assert "2/2 plan(s) order every observed hazard" in out


def test_check_own_plan_missing_dependency_exits_1_with_fix(tmp_path, capsys):
    src = (ROOT / "examples" / "custom_plan.py").read_text()
    broken = src.replace('inter_iter_deps=[("EmbLookup", "Backward"),', 'inter_iter_deps=[')
    assert broken != src
    path = tmp_path / "broken_plan.py"
    path.write_text(broken)
    assert main(["check", "--plan", f"{path}:lookup_ahead_plan"]) == 1
    out = capsys.readouterr().out
    assert "MISSING DEPENDENCIES" in out and "Fix: add ('EmbLookup', 'Backward', 1) to inter_iter_deps" in out
    assert "EmbLookup(i) reads emb_weights written by Backward of iteration i-1" in out


def test_check_example_plan_ok_and_all_lists_notes(capsys):
    assert main(["check", "--plan", str(ROOT / "examples" / "custom_plan.py") + ":lookup_ahead_plan", "--all"]) == 0
    assert "custom_plan.py:lookup_ahead_plan: OK" in capsys.readouterr().out
    assert main(["check", "base", "--order", "torchrec", "--all"]) == 0
    assert "[info] declared ('WaitBatch', 'ZeroGrad'): no observed dataflow" in capsys.readouterr().out


def test_check_bad_arguments_exit_2(capsys):
    assert main(["check", "nope"]) == 2
    assert "unknown pipeline(s) ['nope']" in capsys.readouterr().err
    assert main(["check", "--plan", "examples/custom_plan.py"]) == 2
    assert "is not FILE.py:FUNC" in capsys.readouterr().err


def test_check_enqueue_order_shows_semi_sync_staleness(capsys):
    order = "H2D,InputDistStart,ZeroGrad,InputDistWait,Forward,Backward,EmbLookup,EmbBackward,OptimizerStep"
    assert main(["check", "semi_sync", "--order", "default", "--enqueue-order", order]) == 0
    out = capsys.readouterr().out
    assert "== semi_sync (--enqueue-order): OK" in out and "1 stale read(s)" in out
    assert "[stale] EmbLookup reads emb_weights 1 iteration(s) stale" in out
    assert main(["check", "semi_sync", "--enqueue-order", "H2D,Forward"]) == 2
    assert "must list the tasks of semi_sync once each" in capsys.readouterr().err
