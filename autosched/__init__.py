"""autosched: what-if and search over PipelinePlans (cost models, graphs, simulator, bounds, CP-SAT, beam).

Submodules import networkx / numpy / pandas / matplotlib / ortools lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "CostModel": "costs",
    "TaskCost": "costs",
    "CostModelError": "costs",
    "task_graph": "graph",
    "plan_to_graph": "graph",
    "graph_to_plan": "graph",
    "unroll": "graph",
    "save_plan": "graph",
    "load_plan": "graph",
    "save_task_graph": "graph",
    "load_task_graph": "graph",
    "simulate": "simulate",
    "SimResult": "simulate",
    "lower_bounds": "bounds",
    "Bounds": "bounds",
    "max_cycle_ratio": "bounds",
    "what_if": "whatif",
    "sweep": "whatif",
    "compare_plans": "whatif",
    "gantt": "plots",
    "compare_gantt": "plots",
    "sweep_plot": "plots",
    "auto_schedule": "search",
    "SearchReport": "search",
    "Constraints": "search",
}

__all__ = list(_LAZY)

# The simulate() function shares its module's name: importing the submodule
# (as search.py does) binds ``autosched.simulate`` to the module, shadowing
# the lazy lookup. Binding the function eagerly after the module has loaded
# keeps ``autosched.simulate`` the function; simulate.py is light (stdlib +
# swpipe_core), so this costs little.
from .simulate import simulate  # noqa: E402


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autosched' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list:
    """Every public name, lazy ones included, so ``dir()``, ``help()`` and tab completion list them."""
    return sorted(set(globals()) | set(__all__))
