"""Collection rules for the whole repository (the tests' own helpers are in tests/conftest.py).

``swpipe.torchrec`` needs TorchRec (the ``[peer]`` extra): without it, importing
the package raises an ImportError that says how to install it, so its modules'
doctests are not collected; ``tests/test_torchrec_optional.py`` checks that
message instead. ``tests/spec_examples/`` holds the API reference's examples as
scripts: ``tests/test_spec_examples.py`` runs them, nothing collects them as modules.
A doctest that writes a file writes it under ``tempfile``'s folder, which is the
doctest's own ``tmp_path`` while it runs (pytest removes old ones), not ``/tmp``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest


def _torchrec_importable() -> bool:
    try:
        import swpipe.torchrec  # noqa: F401
    except ImportError:
        return False
    return True


def pytest_ignore_collect(collection_path: Path, config) -> bool:
    parts = collection_path.parts
    if "spec_examples" in parts and parts[parts.index("spec_examples") - 1] == "tests":
        return True  # the API reference's examples run as scripts in tests/test_spec_examples.py, not as modules
    if "torchrec" in parts and "swpipe" in parts and parts.index("torchrec") == parts.index("swpipe") + 1:
        return not _torchrec_importable() or None
    return None


@pytest.fixture(autouse=True)
def _doctest_files_in_tmp_path(request, monkeypatch):
    if isinstance(request.node, pytest.DoctestItem):
        monkeypatch.setattr(tempfile, "tempdir", str(request.getfixturevalue("tmp_path")))
