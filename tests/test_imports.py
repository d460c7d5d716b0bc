"""``import swpipe_core`` stays light: no pandas, matplotlib, ortools, autosched or swpipe."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["pandas", "matplotlib", "ortools", "autosched", "swpipe"]

_PROBE = """
import json, sys
import swpipe_core
{extra}
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _loaded_after(extra: str = "") -> list:
    code = _PROBE.format(extra=extra, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_swpipe_core_loads_no_heavy_modules():
    assert _loaded_after() == []


def test_analysis_and_pipelines_load_no_heavy_modules():
    extra = ("from swpipe_core import pipelines, format_stage_analysis, format_schedule\n"
             "p = pipelines.get('fused_sparse_dist'); format_schedule(p); format_stage_analysis(p)")
    assert _loaded_after(extra) == []


def test_probe_detects_a_heavy_import():
    # the check can fail: importing pandas is seen
    assert _loaded_after("import pandas") == ["pandas"]
