"""Pipeline parallelism across ranks: PyTorch's schedules read, predicted, bounded and searched.

``torch.distributed.pipelining`` runs the schedules; this package reads them as data
(:func:`pp_program`); the verbs every pipeline takes (:mod:`autosched.verbs`: ``simulate``,
``lower_bounds``, ``what_if``, ``compare``, ``search``) predict their step time, bubble and
memory per rank on measured costs, bound them, answer what-if questions and search a better
action order, which :meth:`PPProgram.to_csv` writes as the compute-only CSV PyTorch's runtime loads.
The verbs' names before (``pp_simulate``, ``pp_lower_bounds``, ``pp_what_if``, ``pp_compare``,
``pp_search``) still work for one release and warn (``FutureWarning``).
While a job trains, :class:`RollingStepCosts` times its steps, actions, posts and waits (:class:`StepSplit`) and
:func:`refreshed_pp_costs` refreshes the costs from them; :func:`measure_action_overhead`
measures the runtime's cost per action, :func:`measure_custom_overhead` what a custom order's path adds to it.
:func:`schedule_for` builds the PyTorch schedule object that runs a
program (PyTorch's own class for one of its schedules, its runtime for any other order).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "PPError": "program",
    "PPScheduleError": "program",
    "validate_program": "program",
    "PPProgram": "program",
    "pp_program": "program",
    "builtin_programs": "program",
    "program_from_order": "program",
    "read_csv": "program",
    "schedule_for": "program",
    "StageCost": "costs",
    "P2PCost": "costs",
    "PPCosts": "costs",
    "measure_stage_costs": "costs",
    "measure_p2p": "costs",
    "split_module": "costs",
    "PPSimResult": "simulate",
    "PPBounds": "bounds",
    "PPWhatIf": "whatif",
    "PPRow": "whatif",
    "PPComparison": "whatif",
    "PPSearchResult": "search",
    "PPCandidate": "search",
    "PPCpsatRun": "search",
    "LiveTensorBytes": "memory",
    "PPTorchError": "_torch",
    "RollingStepCosts": "rolling",
    "StepSplit": "rolling",
    "refreshed_pp_costs": "rolling",
    "PPRefreshed": "rolling",
    "measure_action_overhead": "rolling",
    "ActionOverhead": "rolling",
    "measure_custom_overhead": "rolling",
    "CustomOverhead": "rolling",
    "CustomPathProbe": "rolling",
    "calibrate_pp": "rolling",
    "check_pp_corrections": "rolling",
    "held_out_error_pct": "rolling",
    "fitted_post_s": "rolling",
    "PP_CORRECTIONS": "rolling",
}

__all__ = sorted(_LAZY)

#: the verbs' names before one set of verbs (autosched.verbs), kept one release: old name -> (module, new verb)
RENAMED = {"pp_simulate": ("simulate", "simulate"), "pp_lower_bounds": ("bounds", "lower_bounds"),
           "pp_what_if": ("whatif", "what_if"), "pp_compare": ("whatif", "compare"),
           "pp_search": ("search", "search")}


def renamed(name: str, package: str) -> Any:
    """The old verb ``name`` of :data:`RENAMED`, with a ``FutureWarning`` naming the verb that replaces it."""
    import warnings

    module, new = RENAMED[name]
    warnings.warn(f"{package}.{name} is replaced by swpipe.{new}, which takes a plan, a GPipe or a "
                  f"pipeline-parallel program alike; use swpipe.{new}", FutureWarning, stacklevel=3)
    return getattr(importlib.import_module(f"autosched.pp.{module}"), name)


def __getattr__(name: str) -> Any:
    if name in RENAMED:
        return renamed(name, "autosched.pp")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autosched.pp' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
