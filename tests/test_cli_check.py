"""``swpipe check`` through swpipe.cli.main."""

from __future__ import annotations

import re
from pathlib import Path

from swpipe.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _verdicts(out: str) -> dict:
    """``{plan: verdict}`` of the ``== plan: VERDICT; counts`` lines."""
    return dict(line[3:].split(";")[0].rsplit(": ", 1) for line in out.splitlines() if line.startswith("== "))


def _counts(out: str) -> dict:
    """``{plan: {what: number}}`` of the same lines (``hazards``, ``stale``, ``declared``)."""
    lines = [line[3:].rsplit(": ", 1) for line in out.splitlines() if line.startswith("== ")]
    return {name.split(": ")[0]: {part.split()[1]: int(part.split()[0]) for part in rest.split("; ")[1].split(", ")}
            for name, rest in lines}


def _findings(out: str) -> list:
    """``(level, [dependency tuple, ...], [task(i...), ...])`` of the ``  [level] ...`` lines."""
    return [(line.split("]")[0].strip(" ["), re.findall(r"\('[^)]*\)", line), re.findall(r"\w+\(i[-\d]*\)", line))
            for line in out.splitlines() if line.startswith("  [")]


def _tally(out: str) -> str:
    """The last line's ``ordered/checked`` count."""
    return out.strip().splitlines()[-1].split()[0]


def test_check_torchrec_plans_ok(capsys):
    assert main(["check", "sparse_dist", "semi_sync", "--order", "default"]) == 0
    out = capsys.readouterr().out
    assert _verdicts(out) == {"sparse_dist": "OK", "semi_sync": "OK"} and _tally(out) == "2/2"


def test_check_own_plan_missing_dependency_exits_1_with_fix(tmp_path, capsys):
    src = (ROOT / "examples" / "custom_plan.py").read_text()
    broken = src.replace('inter_iter_deps=[("EmbLookup", "Backward"),', 'inter_iter_deps=[')
    assert broken != src
    path = tmp_path / "broken_plan.py"
    path.write_text(broken)
    assert main(["check", "--plan", f"{path}:lookup_ahead_plan"]) == 1
    out = capsys.readouterr().out
    assert _verdicts(out) == {"broken_plan.py:lookup_ahead_plan": "MISSING DEPENDENCIES"} and _tally(out) == "0/1"
    [(level, deps, instances)] = _findings(out)
    assert (level, deps, instances) == ("error", ["('EmbLookup', 'Backward', 1)"], ["EmbLookup(i)"])
    assert "emb_weights" in out and "inter_iter_deps" in out  # what is read, where the fix goes


def test_check_example_plan_ok_and_all_lists_notes(capsys):
    assert main(["check", "--plan", str(ROOT / "examples" / "custom_plan.py") + ":lookup_ahead_plan", "--all"]) == 0
    assert _verdicts(capsys.readouterr().out) == {"custom_plan.py:lookup_ahead_plan": "OK"}
    assert main(["check", "base", "--order", "torchrec", "--all"]) == 0
    infos = [deps for level, deps, _ in _findings(capsys.readouterr().out) if level == "info"]
    assert ["('WaitBatch', 'ZeroGrad')"] in infos  # a declared dependency with no dataflow behind it


def test_check_bad_arguments_exit_2(capsys):
    assert main(["check", "nope"]) == 2
    assert "['nope']" in capsys.readouterr().err
    assert main(["check", "--plan", "examples/custom_plan.py"]) == 2
    assert "FILE.py:FUNC" in capsys.readouterr().err  # the form --plan takes


def test_check_enqueue_order_shows_semi_sync_staleness(capsys):
    order = "H2D,InputDistStart,ZeroGrad,InputDistWait,Forward,Backward,EmbLookup,EmbBackward,OptimizerStep"
    assert main(["check", "semi_sync", "--order", "default", "--enqueue-order", order]) == 0
    out = capsys.readouterr().out
    assert _verdicts(out) == {"semi_sync (--enqueue-order)": "OK"}
    assert _counts(out)["semi_sync (--enqueue-order)"]["stale"] == 1
    [(level, deps, instances)] = _findings(out)
    assert (level, deps, instances[0]) == ("stale", ["('EmbLookup', 'EmbBackward', 1)"], "EmbLookup(i)")
    assert main(["check", "semi_sync", "--enqueue-order", "H2D,Forward"]) == 2
    err = capsys.readouterr().err
    assert "--enqueue-order" in err and "InputDistStart" in err  # the option, and the tasks it must list
