"""Pipeline parallelism across ranks: PyTorch's schedules read, predicted, bounded and searched.

``torch.distributed.pipelining`` runs the schedules; this package reads them as data
(:func:`pp_program`), predicts their step time, bubble and memory per rank on measured
costs (:func:`pp_simulate`), bounds them (:func:`pp_lower_bounds`), answers what-if
questions (:func:`pp_what_if`) and searches a better action order (:func:`search_pp`),
which it writes as the compute-only CSV PyTorch's runtime loads. While a job trains,
:class:`RollingStepCosts` times its steps and actions and :func:`refreshed_pp_costs` refreshes
the costs from them; :func:`measure_action_overhead` measures the runtime's cost per action.
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
    "StageCost": "costs",
    "P2PCost": "costs",
    "PPCosts": "costs",
    "measure_stage_costs": "costs",
    "measure_p2p": "costs",
    "split_module": "costs",
    "PPSimResult": "simulate",
    "pp_simulate": "simulate",
    "PPBounds": "bounds",
    "pp_lower_bounds": "bounds",
    "PPWhatIf": "whatif",
    "pp_what_if": "whatif",
    "PPRow": "whatif",
    "PPComparison": "whatif",
    "pp_compare": "whatif",
    "PPSearchResult": "search",
    "PPCandidate": "search",
    "pp_search": "search",
    "LiveTensorBytes": "memory",
    "PPTorchError": "_torch",
    "RollingStepCosts": "rolling",
    "refreshed_pp_costs": "rolling",
    "PPRefreshed": "rolling",
    "measure_action_overhead": "rolling",
    "ActionOverhead": "rolling",
    "calibrate_pp": "rolling",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autosched.pp' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
