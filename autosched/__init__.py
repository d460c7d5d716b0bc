"""autosched: what-if and search over PipelinePlans (cost models, graphs, simulator, bounds, CP-SAT, beam).

Submodules import networkx / numpy / pandas / matplotlib / ortools lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "CostModel": "costs",
    "TaskCost": "costs",
    "task_graph": "graph",
    "plan_to_graph": "graph",
    "graph_to_plan": "graph",
    "simulate": "simulate",
    "SimResult": "simulate",
    "lower_bounds": "bounds",
    "what_if": "whatif",
    "auto_schedule": "search",
    "SearchReport": "search",
    "Constraints": "search",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autosched' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
