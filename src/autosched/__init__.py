"""autosched: what-if and search over PipelinePlans (cost models, graphs, simulator, bounds, CP-SAT, beam).

``simulate``, ``lower_bounds``, ``what_if``, ``compare`` and ``search`` take a plan, a GPipe or a
pipeline-parallel program alike (:mod:`autosched.verbs`).

Submodules import networkx / numpy / pandas / matplotlib / ortools lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "CostModel": "model.costs",
    "TaskCost": "model.costs",
    "CostModelError": "model.costs",
    "task_graph": "model.graph",
    "plan_to_graph": "model.graph",
    "graph_to_plan": "model.graph",
    "unroll": "model.graph",
    "save_plan": "model.graph",
    "load_plan": "model.graph",
    "save_task_graph": "model.graph",
    "load_task_graph": "model.graph",
    "simulate": "verbs",
    "SimResult": "model.simulate",
    "lower_bounds": "verbs",
    "Bounds": "search.bounds",
    "max_cycle_ratio": "search.bounds",
    "what_if": "verbs",
    "compare": "verbs",
    "search": "verbs",
    "sweep": "model.whatif",
    "gantt": "plots",
    "compare_gantt": "plots",
    "sweep_plot": "plots",
    "auto_schedule": "search.autoschedule",
    "SearchReport": "search.report",
    "Constraints": "search.options",
    "SolverOptions": "search.options",
    "OptionError": "search.options",
}

__all__ = list(_LAZY)

#: names kept one release for what replaced them: old name -> (module, name there, the new name to use)
_RENAMED = {"compare_plans": ("model.whatif", "compare_plans", "compare")}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        import warnings

        module, there, new = _RENAMED[name]
        warnings.warn(f"autosched.{name} is renamed autosched.{new} (one verb for a plan, a GPipe and a "
                      f"pipeline-parallel program); use {new}", FutureWarning, stacklevel=2)
        return getattr(importlib.import_module(f".{module}", __name__), there)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autosched' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list:
    """Every public name, lazy ones included, so ``dir()``, ``help()`` and tab completion list them."""
    return sorted(set(globals()) | set(__all__))
