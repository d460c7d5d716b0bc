"""swpipe_core: the engine that runs a software-pipelined training loop from a PipelinePlan.

Only the standard library, torch and networkx are imported here; heavy
modules load on first attribute access so ``import swpipe_core`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from swpipe_core.plan import (
    DeclaredIO,
    IterContext,
    PipelinePlan,
    PipelineTask,
    TaskRef,
    TaskSchedule,
    ref_name,
    stream_name,
)
from swpipe_core.validate import PlanError, validate

_LAZY = {
    "period_local_graph": "order",
    "stall_cost": "order",
    "ready_first_order": "order",
    "stage_descending_order": "order",
    "enqueue_order": "order",
    "SWPipeline": "engine.pipeline",
    "PipelineTaskError": "engine.pipeline",
    "Timeouts": "engine.options",
    "with_thread_map": "engine.workers",
    "TaskProfiler": "measure.profiler",
    "ProfileResult": "measure.result",
    "ShortcutCorruptedError": "engine.shortcut",
    "format_schedule": "analysis",
    "format_stage_analysis": "analysis",
    "min_depth": "analysis",
    "lds": "analysis",
    "format_plan_repr": "analysis",
    "TimelineEvent": "measure.trace",
    "to_chrome_trace": "measure.trace",
    "write_chrome_trace": "measure.trace",
    "pipelines": "pipelines",
    "agree_on_end": "distributed",
    "AgreedIterator": "distributed",
    "keep_freed_memory": "measure.allocator",
    "snapshot_state": "measure.state",
    "restore_state": "measure.state",
    "StateSnapshot": "measure.state",
}

__all__ = [
    "DeclaredIO", "IterContext", "PipelinePlan", "PipelineTask", "ProfileResult", "TaskRef",
    "TaskSchedule", "PlanError", "validate", "ref_name", "stream_name", *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'swpipe_core' has no attribute {name!r}")
    mod = importlib.import_module(f".{module}", __name__)
    return mod if name == module else getattr(mod, name)


def __dir__() -> list:
    """Every public name, lazy ones included, so ``dir()``, ``help()`` and tab completion list them."""
    return sorted(set(globals()) | set(__all__))
