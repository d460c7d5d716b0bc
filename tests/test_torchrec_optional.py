"""TorchRec stays optional: ``import swpipe.torchrec`` without it is a ModuleNotFoundError that says how to install it."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import json, sys
sys.modules["torchrec"] = None  # as if TorchRec were not installed
import pytest
import swpipe, swpipe_core  # the rest of the package imports without it
try:
    import swpipe.torchrec
except ImportError as exc:
    error = {"type": type(exc).__name__, "name": exc.name, "message": str(exc)}
try:
    pytest.importorskip("swpipe.torchrec")
    skipped = False
except pytest.skip.Exception:
    skipped = True
print(json.dumps(dict(error, skipped=skipped)))
"""


def _probe() -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_without_torchrec_is_a_missing_module_that_importorskip_skips():
    probe = _probe()
    assert (probe["type"], probe["name"], probe["skipped"]) == ("ModuleNotFoundError", "torchrec", True)
    # the message is the fix the user must read: the install command
    assert "bash scripts/install_peer.sh" in probe["message"]
