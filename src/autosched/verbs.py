"""One set of verbs for three kinds of pipeline: a plan, a GPipe and PyTorch's pipeline-parallel schedules.

``simulate``, ``lower_bounds``, ``what_if``, ``compare`` and ``search`` each take what they are given first and
hand it to the implementation for its kind (:data:`_TABLE`, the one dispatch table):

=====================  ===========================================  ==========================================
first argument         kind                                         costs
=====================  ===========================================  ==========================================
``PipelinePlan``       a plan (a GPipe's plan too: it is a plan)    ``CostModel``
task graph / tasks     a plan search's input (``search`` and        ``CostModel``
                       ``lower_bounds`` only)
``GPipe``              a GPipe training step (``batch=`` needed)    ``LayerModel`` (per-layer profiles)
``PPProgram``          a pipeline-parallel step across ranks        ``PPCosts`` (or ``{n_stages: PPCosts}``)
=====================  ===========================================  ==========================================

Every kind returns the same family (:mod:`autosched.results`): ``simulate`` a result with ``period_s``,
``peak_bytes_by`` and ``events``; ``lower_bounds`` one with ``period_s`` and ``binding``; ``what_if`` and
``compare`` a table (pandas) with the columns ``period_s``, ``lower_bound_s``, ``peak_bytes`` (and ``speedup``
for ``what_if``); ``search`` ``(chosen, report)`` whose report has ``period_s``, ``lower_bound_s``, ``status``,
``method`` and ``summary()``. ``period_s`` is a plan's steady-state period and a GPipe's or a PP step's time (a
step repeats once per step). The one memory cap is ``max_memory_bytes`` (``Constraints.max_memory_bytes`` in a
search).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from autosched.results import Preference, StepBounds, StepSearchReport, fastest_first, pp_preference
from autosched.search.options import Constraints, SolverOptions

__all__ = ["simulate", "lower_bounds", "what_if", "compare", "search", "kind_of"]

#: the kinds, most specific first: (module that defines the class, class, kind). A class is looked up only when
#: its module is loaded: an object of it cannot exist before, and the heavy kinds (GPipe: torch.nn) stay unloaded.
_KINDS = (("swpipe.gpipe.gpipe", "GPipe", "gpipe"), ("autosched.pp.program", "PPProgram", "pp"),
          ("swpipe_core.plan", "PipelinePlan", "plan"))


def kind_of(subject: Any) -> str:
    """``"plan"``, ``"gpipe"`` or ``"pp"``: which implementation the verbs take for ``subject``; ``"graph"`` for
    anything else (a task graph or task list: a search's input).

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> kind_of(PipelinePlan({"A": TaskSchedule(0)})), kind_of((["A"], []))
    ('plan', 'graph')
    """
    for module, name, kind in _KINDS:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(subject, getattr(loaded, name)):
            return kind
    return "graph"


def _implementation(verb: str, subject: Any) -> Callable[..., Any]:
    kind = kind_of(subject)
    found = _TABLE[verb].get(kind)
    if found is None:
        takes = ", ".join(k for k in _TABLE[verb] if k != "graph")
        raise TypeError(f"{verb}({type(subject).__name__}): {verb} takes a {takes.replace('pp', 'PPProgram')}"
                        f"{' or a task graph' if 'graph' in _TABLE[verb] else ''}, not {type(subject).__name__}")
    return found


# -- the verbs -----------------------------------------------------------------------------------------------------


def simulate(subject: Any, costs: Any, *args: Any, **options: Any) -> Any:
    """Predict a run: a plan's steady state, a GPipe's training step or a pipeline-parallel step.

    Parameters
    ----------
    subject : PipelinePlan, GPipe or PPProgram
        A plan: :func:`autosched.model.simulate.simulate` (``num_iterations``, ``device``, ...). A GPipe:
        :func:`swpipe.gpipe.predict.predict_step` of its balance, chunks, checkpoint and schedule (``batch=``,
        the samples per mini-batch, is needed; ``slowdown=``, ``cores=`` optional). A program
        (:func:`swpipe.pp.pp_program`): each rank's actions on the costs (``cores=``: the cores the ranks share;
        ``device="cuda"``: a compute and a communication stream per rank, the default for costs measured over
        NCCL; :func:`autosched.pp.simulate.pp_simulate`).
    costs : CostModel, LayerModel or PPCosts
        The costs of that kind.

    Returns
    -------
    SimResult, StepPrediction or PPSimResult
        Each with ``period_s`` (a step's time for a GPipe or a program), ``peak_bytes_by``
        (:class:`autosched.results.PeakBytes`), ``events`` (what ``gantt`` draws) and ``summary()``.

    Examples
    --------
    >>> from swpipe.pp import PPCosts, StageCost, pp_program
    >>> r = simulate(pp_program("1f1b", 2, 4), PPCosts((StageCost(1.0, 2.0, activation_bytes=100),) * 2))
    >>> r.period_s, dict(r.peak_bytes_by), r.events[0].thread_group
    (15.0, {0: 200, 1: 100}, 'rank0')
    """
    return _implementation("simulate", subject)(subject, costs, *args, **options)


def lower_bounds(subject: Any, costs: Any, *args: Any, **options: Any) -> Any:
    """Lower bounds: no run of ``subject`` (or, for a task graph, of any plan of it) repeats faster.

    Parameters
    ----------
    subject : PipelinePlan, task graph, GPipe or PPProgram
        A plan or graph: :func:`autosched.search.bounds.lower_bounds`. A GPipe (``batch=`` needed): its step's
        bound. A program: no action order on its ranks and stages, at its micro-batch count, is faster.
    costs : CostModel, LayerModel or PPCosts

    Returns
    -------
    Bounds, StepBounds or PPBounds
        Each with ``period_s`` (the bound), ``binding`` and ``summary()``.

    Examples
    --------
    >>> from swpipe.pp import PPCosts, StageCost, pp_program
    >>> b = lower_bounds(pp_program("1F1B", 2, 4), PPCosts((StageCost(1.0, 2.0),) * 2))
    >>> b.period_s, b.binding
    (15.0, 'fill + work + drain: rank 1')
    """
    return _implementation("lower_bounds", subject)(subject, costs, *args, **options)


def what_if(subject: Any, costs: Any, changes: Any, *args: Any, **options: Any) -> Any:
    """Predicted before and after a change, as a table.

    Parameters
    ----------
    subject : PipelinePlan, GPipe or PPProgram
    costs : CostModel, LayerModel or PPCosts
    changes : dict (or, for a GPipe, a list of dicts)
        A plan: ``{task: factor | TaskCost | {field: value}}`` (:func:`autosched.model.whatif.apply_changes`).
        A GPipe: ``{"chunks": 8}``, ``{"balance": [3, 1]}``, ``{"checkpoint": "never"}``, ``{"schedule": "1F1B"}``,
        ``{"batch": 32}``; a list of them gives one row each. A program: ``{stage: factor}`` (that stage's times
        multiplied) and ``{"n_microbatches": n}`` (the same batch in ``n`` micro-batches; ``same_global_batch=False``
        keeps the micro-batch); ``max_memory_bytes=`` marks the rows over a cap per rank (``fits``).

    Returns
    -------
    pandas.DataFrame
        Index ``["before", "after"]`` (a list of GPipe changes: ``"after 1"``, ``"after 2"``, ...); columns
        ``change``, ``period_s``, ``lower_bound_s``, ``peak_bytes``, ``speedup`` (before's period over the row's)
        and the kind's own (a plan's ``latency_s`` and ``binding``, a step's ``bubble``, ...).

    Examples
    --------
    >>> from swpipe.pp import PPCosts, StageCost, pp_program
    >>> t = what_if(pp_program("1F1B", 2, 4), PPCosts((StageCost(1.0, 2.0),) * 2), {1: 0.5})
    >>> list(t.index), list(t["period_s"])
    (['before', 'after'], [15.0, 12.5])
    """
    return _implementation("what_if", subject)(subject, costs, changes, *args, **options)


def compare(subjects: Any, costs: Any, *args: Any, **options: Any) -> Any:
    """Several plans, GPipes or programs side by side under the same costs, fastest first.

    Parameters
    ----------
    subjects : dict or sequence
        ``{label: subject}`` (a sequence is labelled by position, a program's by its schedule), all of one kind.
    costs : CostModel, LayerModel or PPCosts (or ``{n_stages: PPCosts}``)

    Returns
    -------
    pandas.DataFrame
        One row per subject (index: its label), fastest first (:func:`autosched.results.fastest_first`: steps
        within 1 % of each other tie, and the lower ``peak_bytes`` goes first); columns ``period_s``, ``lower_bound_s``,
        ``peak_bytes`` and the kind's own. With ``max_memory_bytes=`` (a GPipe or a program), ``fits``.
        ``attrs["skipped"]``: ``{label: why}`` for programs with no costs of their stage split.

    Examples
    --------
    >>> from swpipe.pp import PPCosts, StageCost, pp_program
    >>> costs = PPCosts((StageCost(1.0, 2.0, activation_bytes=100),) * 2)
    >>> t = compare([pp_program("GPipe", 2, 4), pp_program("1F1B", 2, 4)], costs)
    >>> list(t.index), list(t["period_s"]), list(t["peak_bytes"])  # a tie: the lower peak first
    (['1F1B', 'GPipe'], [15.0, 15.0], [200, 400])
    """
    items = _labelled(subjects)
    if not items:
        raise ValueError("compare: no subjects given; pass {label: plan | GPipe | PPProgram}")
    kinds = {kind_of(s) for s in items.values()}
    if len(kinds) > 1:
        raise TypeError(f"compare: subjects of several kinds ({', '.join(sorted(kinds))}); compare one kind at a time")
    return _implementation("compare", next(iter(items.values())))(items, costs, *args, **options)


def search(subject: Any, costs: Any, constraints: Optional[Constraints] = None,
           solver: Optional[SolverOptions] = None, **options: Any) -> Tuple[Any, Any]:
    """Search a faster one: a plan, a GPipe's configuration or a pipeline-parallel action order.

    Parameters
    ----------
    subject : task graph, task list, PipelinePlan, GPipe or PPProgram
        A plan search's input: :func:`autosched.search.autoschedule.auto_schedule` (``seeds=``, ``verify=``,
        ``batches=``, ``state=``). A GPipe (``batch=`` needed): the balance, chunks, checkpoint mode and schedule
        of the fastest predicted step (``chunks=``, ``checkpoints=``, ``schedules=``, ``slowdown=``: what to
        try). A program: an action order per rank (and micro-batch count: ``n_microbatches=`` a sequence to
        try) on its ranks, seeded with PyTorch's schedules (``costs_for_microbatches=``; ``margin_pct=``: a custom
        order only where predicted faster than PyTorch's best by more than that).
    costs : CostModel, LayerModel or PPCosts (or ``{n_stages: PPCosts}``)
    constraints : Constraints, optional
        What the answer may be. A GPipe and a program read ``max_memory_bytes`` (a GPipe's: the step's
        activation bytes; a program's: per rank).
    solver : SolverOptions, optional
        How the search runs. A program reads ``time_limit_s``, ``method`` (``"beam"``: no CP-SAT) and
        ``cpsat_max_tasks`` (its compute actions); without it, 10 s and 64. A GPipe's search predicts its grid
        whole and reads none.

    Returns
    -------
    (chosen, report)
        A plan and its ``SearchReport``; a ``StepPrediction`` and a :class:`autosched.results.StepSearchReport`;
        a ``PPProgram`` and a ``PPSearchResult``. Every report has ``period_s``, ``lower_bound_s``, ``status``
        (``"OPTIMAL"``, ``"FEASIBLE"``, ``"HEURISTIC"``), ``method`` and ``summary()``.

    Examples
    --------
    >>> from swpipe.pp import PPCosts, StageCost, pp_program
    >>> program, report = search(pp_program("1F1B", 2, 4), PPCosts((StageCost(1.0, 2.0, 1.0, 1.0),) * 2),
    ...                          solver=SolverOptions(method="beam"))
    >>> report.period_s, report.status, program is report.program
    (13.0, 'OPTIMAL', True)
    """
    return _implementation("search", subject)(subject, costs, constraints, solver, **options)


# -- the implementations, one per kind -----------------------------------------------------------------------------


def _labelled(subjects: Any) -> Dict[str, Any]:
    if isinstance(subjects, Mapping):
        return {str(k): v for k, v in subjects.items()}
    out: Dict[str, Any] = {}
    for i, s in enumerate(subjects):
        label = getattr(s, "schedule", None) if kind_of(s) == "pp" else None
        out[label if label and label not in out else str(i)] = s
    return out


def _table(rows: Dict[str, Dict[str, Any]], preference: Optional[Callable[[Dict[str, Any]], Preference]] = None
           ) -> Any:
    """The rows as a table; with ``preference`` (a row's), fastest first by :func:`autosched.results.fastest_first`."""
    import pandas as pd

    from autosched.model.whatif import printable

    if preference is not None:
        rows = dict(fastest_first(rows.items(), lambda item: preference(item[1])))
    return printable(pd.DataFrame.from_dict(rows, orient="index"))


def _with_speedup(table: Any) -> Any:
    table["speedup"] = table["period_s"].iloc[0] / table["period_s"]
    return table


# a plan ------------------------------------------------------------------------------------------------------------

def _plan_simulate(plan: Any, costs: Any, *args: Any, **options: Any) -> Any:
    from autosched.model.simulate import simulate as plan_simulate

    return plan_simulate(plan, costs, *args, **options)


def _plan_bounds(plan: Any, costs: Any, *args: Any, **options: Any) -> Any:
    from autosched.search.bounds import lower_bounds as plan_bounds

    return plan_bounds(plan, costs, *args, **options)


def _plan_what_if(plan: Any, costs: Any, changes: Any, *args: Any, **options: Any) -> Any:
    from autosched.model.whatif import what_if as plan_what_if

    return plan_what_if(plan, costs, changes, *args, **options)


def _plan_compare(plans: Dict[str, Any], costs: Any, *args: Any, **options: Any) -> Any:
    from autosched.model.whatif import compare_plans

    return compare_plans(plans, costs, *args, **options)


def _plan_search(graph: Any, costs: Any, constraints: Optional[Constraints], solver: Optional[SolverOptions],
                 **options: Any) -> Tuple[Any, Any]:
    from autosched.search.autoschedule import auto_schedule

    return auto_schedule(graph, costs, constraints, solver, **options)


# a GPipe -----------------------------------------------------------------------------------------------------------

def _batch(verb: str, batch: Optional[int]) -> int:
    if batch is None:
        from swpipe.gpipe.errors import GPipeArgumentError

        raise GPipeArgumentError("batch", None, f"{verb}(gpipe, layers) predicts a step of a mini-batch",
                                 f"pass {verb}(gpipe, layers, ..., batch=<samples per mini-batch>)")
    return batch


def _step(gpipe: Any, layers: Any, batch: Optional[int], verb: str, **options: Any) -> Any:
    from swpipe.gpipe.predict import predict_step

    return predict_step(layers, gpipe.balance, _batch(verb, batch), gpipe.chunks, gpipe.checkpoint, gpipe.schedule,
                        **options)


def _gpipe_simulate(gpipe: Any, layers: Any, *, batch: Optional[int] = None, **options: Any) -> Any:
    return _step(gpipe, layers, batch, "simulate", **options)


def _gpipe_bounds(gpipe: Any, layers: Any, *, batch: Optional[int] = None, **options: Any) -> StepBounds:
    from autosched.search.bounds import lower_bounds as plan_bounds

    step = _step(gpipe, layers, batch, "lower_bounds", **options)
    per = plan_bounds(step.plan, step.costs, device="cuda" if layers.device.startswith("cuda") else "cpu")
    m = min(step.chunks, step.batch)
    rest = step.bound_s - (m - 1) * per.value
    return StepBounds(step.bound_s, f"{m - 1} x per micro-batch ({per.binding}) + one micro-batch",
                      ((f"{m - 1} x per micro-batch", (m - 1) * per.value),
                       ("one micro-batch through all", rest)))


def _step_row(p: Any, change: str) -> Dict[str, Any]:
    return {"change": change, "period_s": p.step_s, "lower_bound_s": p.bound_s, "peak_bytes": p.activation_bytes,
            "bubble": p.bubble, "schedule": p.schedule, "balance": list(p.balance), "chunks": p.chunks,
            "checkpoint": p.checkpoint}


def _gpipe_what_if(gpipe: Any, layers: Any, changes: Any, *, batch: Optional[int] = None, **options: Any) -> Any:
    from swpipe.gpipe.predict import what_if as step_what_if

    many = not isinstance(changes, Mapping)
    listed = list(changes) if many else [changes]
    rows = step_what_if(_step(gpipe, layers, batch, "what_if", **options), layers, listed)
    labels = ["before"] + ([f"after {k + 1}" for k in range(len(listed))] if many else ["after"])
    said = [""] + [", ".join(f"{k}={v}" for k, v in c.items()) for c in listed]
    return _with_speedup(_table({lab: _step_row(p, s) for lab, p, s in zip(labels, rows, said)}))


def _gpipe_compare(gpipes: Dict[str, Any], layers: Any, *, batch: Optional[int] = None,
                   max_memory_bytes: Optional[float] = None, **options: Any) -> Any:
    from autosched._fields import memory_cap

    cap = memory_cap("compare", max_memory_bytes, "max_activation_bytes", None)
    rows = {}
    for label, g in gpipes.items():
        row = _step_row(_step(g, layers, batch, "compare", **options), "")
        del row["change"]
        if cap is not None:
            row["fits"] = row["peak_bytes"] <= cap
        rows[label] = row
    return _table(rows, lambda r: Preference(r["period_s"], r["peak_bytes"], (len(r["balance"]), r["chunks"])))


def _gpipe_search(gpipe: Any, layers: Any, constraints: Optional[Constraints], solver: Optional[SolverOptions],
                  *, batch: Optional[int] = None, **options: Any) -> Tuple[Any, StepSearchReport]:
    from swpipe.gpipe.errors import GPipeArgumentError
    from swpipe.gpipe.predict import choose

    cap = constraints.max_memory_bytes if constraints is not None else None
    best, candidates = choose(layers, len(gpipe.balance), _batch("search", batch), cap, **options)
    if best is None:
        least = min(p.activation_bytes for p in candidates)
        raise GPipeArgumentError("max_memory_bytes", cap, f"no step tried keeps its activations within it; the least "
                                 f"is {least:.0f} bytes", "raise Constraints.max_memory_bytes or try more chunks")
    return best, StepSearchReport(best, tuple(candidates), cap)


# a pipeline-parallel program ---------------------------------------------------------------------------------------

def _pp_simulate(program: Any, costs: Any, *, cores: Optional[int] = None, device: Optional[str] = None) -> Any:
    from autosched.pp.simulate import pp_simulate

    return pp_simulate(program, costs, cores=cores, device=device)


def _pp_bounds(program: Any, costs: Any) -> Any:
    from autosched.pp.bounds import program_bounds

    return program_bounds(program, costs)


def _pp_row(result: Any, bound_s: float, cap: Optional[float]) -> Dict[str, Any]:
    row = {"period_s": result.step_s, "lower_bound_s": bound_s, "peak_bytes": result.max_peak_bytes,
           "bubble": max(result.bubble_fraction.values())}
    if cap is not None:
        row["fits"] = result.max_peak_bytes <= cap
    return row


def _pp_what_if(program: Any, costs: Any, changes: Mapping[Any, Any], *, max_memory_bytes: Optional[float] = None,
                same_global_batch: bool = True, cores: Optional[int] = None, device: Optional[str] = None) -> Any:
    from autosched.pp.program import PPError
    from autosched.pp.whatif import pp_what_if

    unknown = [k for k in changes if k != "n_microbatches" and not isinstance(k, int)]
    if unknown:
        raise PPError("bad_value", "changes", unknown[0], program.schedule,
                      "{stage: factor} or {'n_microbatches': n}")
    w = pp_what_if(program, costs, n_microbatches=changes.get("n_microbatches"),
                   stage_factors={k: v for k, v in changes.items() if isinstance(k, int)} or None,
                   max_memory_bytes=max_memory_bytes, same_global_batch=same_global_batch, cores=cores, device=device)
    return _with_speedup(_table({"before": {"change": "", **_pp_row(w.before, w.before_bound_s, max_memory_bytes)},
                                 "after": {"change": w.change, **_pp_row(w.after, w.after_bound_s, max_memory_bytes)}}))


def _pp_compare(programs: Dict[str, Any], costs: Any, *, max_memory_bytes: Optional[float] = None,
                cores: Optional[int] = None, device: Optional[str] = None) -> Any:
    from autosched._fields import memory_cap
    from autosched.pp.bounds import program_bounds
    from autosched.pp.costs import PPCosts
    from autosched.pp.simulate import pp_simulate

    cap = memory_cap("compare", max_memory_bytes, "memory_cap_bytes", None)
    by_stages = {costs.n_stages: costs} if isinstance(costs, PPCosts) else dict(costs)
    rows, skipped = {}, {}
    for label, p in programs.items():
        c = by_stages.get(p.n_stages)
        if c is None:
            skipped[label] = f"no costs for its {p.n_stages} stages (costs given for {sorted(by_stages)})"
            continue
        rows[label] = {"n_stages": p.n_stages, "n_microbatches": p.n_microbatches,
                       **_pp_row(pp_simulate(p, c, cores=cores, device=device), program_bounds(p, c).value, cap)}
    table = _table(rows, lambda r: pp_preference(r["period_s"], r["peak_bytes"], r["n_stages"], r["n_microbatches"]))
    table.attrs["skipped"] = skipped
    return table


def _pp_search(program: Any, costs: Any, constraints: Optional[Constraints], solver: Optional[SolverOptions], *,
               n_microbatches: Optional[Sequence[int]] = None, **options: Any) -> Tuple[Any, Any]:
    from autosched.pp.search import pp_search

    found = pp_search(costs, program.n_ranks, n_microbatches or program.n_microbatches, constraints=constraints,
                      solver=solver, **options)
    return found.program, found


#: verb -> kind -> implementation: the one place that says which function answers which kind
_TABLE: Dict[str, Dict[str, Callable[..., Any]]] = {
    "simulate": {"plan": _plan_simulate, "gpipe": _gpipe_simulate, "pp": _pp_simulate},
    "lower_bounds": {"plan": _plan_bounds, "graph": _plan_bounds, "gpipe": _gpipe_bounds, "pp": _pp_bounds},
    "what_if": {"plan": _plan_what_if, "gpipe": _gpipe_what_if, "pp": _pp_what_if},
    "compare": {"plan": _plan_compare, "gpipe": _gpipe_compare, "pp": _pp_compare},
    "search": {"plan": _plan_search, "graph": _plan_search, "gpipe": _gpipe_search, "pp": _pp_search},
}
