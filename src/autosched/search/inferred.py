"""``auto_schedule(tasks, costs, deps="infer", batches=...)``: search over dependencies observed, not declared.

The tasks run a few serial iterations under :mod:`swpipe_core.dataflow`'s
recorder; the minimal dependencies inferred from what they read and write
become the search's task graph, and the report's notes list each inferred
edge the returned plan honours (with the hazard behind it).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple

from autosched.search.core import search_plan
from autosched.search.options import Constraints, SolverOptions

__all__ = ["auto_schedule_inferred"]


def auto_schedule_inferred(tasks: Any, costs: Any, c: Constraints, s: SolverOptions, *,
                           batches: Optional[Iterable[Any]] = None, state: Any = None, seeds: Any = None,
                           verify: Any = None) -> Tuple[Any, Any]:
    """Infer the tasks' dependencies from a recorded run, then search them (:func:`~autosched.search.core.search_plan`).

    :func:`~autosched.search.entry.auto_schedule` comes here with ``deps="infer"``, its inputs checked.

    Parameters
    ----------
    tasks : list of PipelineTask, mapping ``{name: fn}`` or PipelinePlan
        Bound tasks; declared dependencies, if any, are ignored (only their
        serial order is used).
    costs : CostModel
        A cost model (its machine calibration, if any, is folded in).
    c : Constraints
        What the plan may be.
    s : SolverOptions
        How the search runs.
    batches : iterable
        Two or more batches to record on (the tasks run: the model trains).
    state : modules/optimizers, optional
        Names parameters and optimizer state in the report.

    Returns
    -------
    (PipelinePlan, SearchReport)
        ``report.notes`` lists every inferred edge and whether the plan
        declares it; ``report.inferred`` is the :class:`~swpipe_core.dataflow.InferredDeps`.

    Raises
    ------
    ValueError
        No batches given.

    Examples
    --------
    >>> import torch
    >>> from swpipe_core.plan import PipelineTask
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> from autosched.search.options import Constraints, SolverOptions
    >>> from autosched.search.entry import auto_schedule
    >>> def load(ctx): ctx.x = ctx.batch + 1
    >>> def use(ctx): ctx.y = ctx.x * 2
    >>> costs = CostModel({"Load": TaskCost(0.002), "Use": TaskCost(0.003)})
    >>> plan, report = auto_schedule([PipelineTask("Load", load), PipelineTask("Use", use)], costs,
    ...                              Constraints(max_depth=2), solver=SolverOptions(time_limit_s=5), deps="infer",
    ...                              batches=[torch.ones(1)] * 2)
    >>> plan.intra_edges(), [n for n in report.notes if n.startswith("inferred")]
    ([('Use', 'Load')], ["inferred ('Use', 'Load') honoured (RAW ctx.x)"])
    """
    from swpipe_core.dataflow import infer_plan

    if batches is None:
        raise ValueError("deps='infer' needs batches=[...] (two or more) to record the tasks' dataflow on")
    inferred = infer_plan(tasks, batches, state=state)
    batches = list(batches)
    plan, report = search_plan((inferred.plan.tasks, inferred.intra, inferred.inter), costs, c, s, seeds=seeds,
                               verify=verify, batches=batches, state=state)
    declared = set(plan.intra_edges()) | set(plan.inter_edges())
    kinds = {}
    for h in inferred.hazards:
        kinds.setdefault(h.edge, f"{h.kind} {h.what(2)}")
    for edge in inferred.intra + inferred.inter:
        state_word = "honoured" if edge in declared else "NOT declared by the plan"
        report.notes.append(f"inferred {edge!r} {state_word} ({kinds.get(edge, 'implied')})")
    report.notes += [f"dataflow: {n}" for n in inferred.notes]
    report.inferred = inferred
    return plan, report
