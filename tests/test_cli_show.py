"""``swpipe show`` and ``swpipe list`` through swpipe.cli.main."""

from __future__ import annotations

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
