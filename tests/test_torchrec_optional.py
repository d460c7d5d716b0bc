"""TorchRec stays optional: ``import swpipe.torchrec`` without it is an ImportError that says how to install it."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import sys
sys.modules["torchrec"] = None  # as if TorchRec were not installed
import swpipe, swpipe_core  # the rest of the package imports without it
try:
    import swpipe.torchrec
except ImportError as exc:
    print("ImportError:", exc)
"""


def test_import_without_torchrec_says_how_to_install():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ImportError: swpipe.torchrec needs TorchRec and FBGEMM")
    assert "bash scripts/install_peer.sh" in out.stdout and 'pip install -e ".[peer]"' in out.stdout
