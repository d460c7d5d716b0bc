"""``swpipe show`` and ``swpipe list`` through swpipe.cli.main."""

from __future__ import annotations

import re

import pytest

from swpipe.cli import main
from swpipe_core import pipelines


def test_show_prints_table_and_stage_analysis(capsys):
    assert main(["show", "fused_sparse_dist"]) == 0
    out = capsys.readouterr().out
    assert "   0  EmbLookup          default  emb_lookup    |  --    --   i0    i1    i2" in out
    assert "| P0    P1    P2    P3    P4\n" in out
    assert "Task schedule (topological order):" in out and "LDS = " in out and "Pipeline depth = 3" in out


def test_show_periods_option(capsys):
    assert main(["show", "base", "--periods", "2"]) == 0
    out = capsys.readouterr().out
    assert "| P0    P1\n" in out and "P2" not in out


def test_show_default_periods_cover_depth(capsys):
    assert main(["show", "semi_sync"]) == 0
    assert "P5" in capsys.readouterr().out  # depth 4 + 2 periods


def test_show_factory_options(capsys):
    assert main(["show", "fused_sparse_dist", "--option", "emb_lookup=data_dist"]) == 0
    out = capsys.readouterr().out
    assert "EmbLookup          default  data_dist" in out
    assert main(["show", "staged", "-o", "stages=load,post,sdd"]) == 0
    out = capsys.readouterr().out
    assert "sdd" in out and "Pipeline depth = 3" in out


def test_show_unknown_pipeline_lists_known_ones(capsys):
    assert main(["show", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown pipeline 'nope'" in err and "sparse_dist_comp_autograd" in err


def test_show_bad_option_is_a_clear_error(capsys):
    assert main(["show", "base", "-o", "stages"]) == 2
    assert "not key=value" in capsys.readouterr().err
    assert main(["show", "base", "-o", "stages=2"]) == 2
    assert "takes no option(s) ['stages']" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # argparse rejects it before the command runs
        main(["show", "base", "--periods", "0"])
    assert info.value.code == 2 and "--periods/-n: 0 is too small: give an integer >= 1" in capsys.readouterr().err


def test_list_prints_every_pipeline_with_description(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(pipelines.PIPELINES)
    assert any("TrainPipelineFusedSparseDist:" in line for line in lines)


def _legend(out: str) -> dict:
    """``{term: words}`` of the legend ``swpipe show`` prints under its tables: an entry is two spaces, the term,
    two or more spaces, its words; a wrapped line continues the entry above it."""
    legend, key = {}, None
    for line in out.split("\nLegend:\n", 1)[1].splitlines():
        entry = re.match(r"^  (\S.*?)\s{2,}(\S.*)$", line)
        if entry:
            key = entry.group(1)
            legend[key] = entry.group(2)
        elif line.startswith("   ") and key is not None:
            legend[key] += " " + line.strip()
    return legend


def test_show_explains_its_terms_and_marks_in_a_legend(capsys):
    """TorchRec's sparse_dist is deeper than its order needs: a plain mark the legend explains, no error mark."""
    assert main(["show", "sparse_dist"]) == 0
    out = capsys.readouterr().out
    assert "✗" not in out
    verdict = next(line.strip() for line in out.splitlines() if "> minimum depth" in line)
    legend = _legend(out)
    assert verdict.split()[0] in legend, (verdict, legend)
    assert {"LDS", "Dilworth-optimal", "Type", "minimum depth", "✓"} <= set(legend)
    assert "memory" in legend[verdict.split()[0]]  # what the extra stages cost
    assert main(["show", "sparse_dist", "--order", "torchrec"]) == 0
    out = capsys.readouterr().out
    shown_marks = {line.split()[0] for line in out.splitlines() if line.startswith("  ") and "depth" in line
                   and line.split()[0] in ("✓", "+")}
    assert shown_marks and shown_marks <= set(_legend(out))
