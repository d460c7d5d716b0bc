"""Shared test configuration and helpers.

Tests marked ``cuda`` skip on a machine without a GPU. Helpers used by several
test files live here once; import them with ``from conftest import ...``.
"""

from __future__ import annotations

import threading
from typing import Any, List

import pytest


def swpipe_threads() -> List[str]:
    """Names of the live ``swpipe-*`` threads, sorted (a clean pipeline leaves none)."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("swpipe-"))


def progress_until_end(pipe: Any, it: Any) -> List[int]:
    """Call ``pipe.progress(it)`` until the data ends; the retired iteration indices in order."""
    out: List[int] = []
    while True:
        try:
            out.append(pipe.progress(it))
        except StopIteration:
            return out


def drive(pipe: Any, data: Any) -> List[int]:
    """Fill the pipeline with ``data`` and progress it to the end; the retired indices in order."""
    return progress_until_end(pipe, pipe.fill_pipeline(data))


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch is a hard dependency
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
