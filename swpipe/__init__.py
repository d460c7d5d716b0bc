"""swpipe: the face package. ``import swpipe`` re-exports the public API of swpipe_core and autosched."""

from __future__ import annotations

from typing import Any

import autosched
import swpipe_core
from swpipe_core.plan import DeclaredIO, IterContext, PipelinePlan, PipelineTask, TaskSchedule  # noqa: F401
from swpipe_core.validate import PlanError, validate  # noqa: F401

from ._version import __version__

__all__ = sorted(set(swpipe_core.__all__) | set(autosched.__all__))


def __getattr__(name: str) -> Any:
    if name in swpipe_core.__all__:
        return getattr(swpipe_core, name)
    if name in autosched.__all__:
        return getattr(autosched, name)
    raise AttributeError(f"module 'swpipe' has no attribute {name!r}")


def __dir__() -> list:
    """Every public name, lazy ones included, so ``dir()``, ``help()`` and tab completion list them."""
    return sorted(set(globals()) | set(__all__))
