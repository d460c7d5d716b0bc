"""Verify in the loop: the ``auto_schedule`` hook that measures the candidates, paired with the serial plan, and
keeps the one that beats it (:meth:`autosched.verify.measure.VerifyTable.choose`).

The simulator ranks plans by a model of the machine; the verification checks
the ranking where it matters, on the user's machine with the user's tasks.
:func:`verify_search` predicts each candidate (:mod:`autosched.verify.candidates`)
with the search's own model (:meth:`autosched.search.problem.Problem.simulate`;
:mod:`autosched.verify.predict`), measures them side by side on the engine
(:func:`autosched.verify.measure.measure_plans`: the serial plan in every round,
each other plan's period divided by its period in the same round), returns the
plan the table chooses (the serial plan unless a plan beats it beyond the
rounds' noise) and re-judges the report for it. :class:`VerifyOptions` (how
the answer is measured) is defined beside the measurement. It lives here so the search modules
stay about the search.

What can reorder plans is how many of their threads really run at once:
:mod:`autosched.verify.refit` refits the model's core pool to the measured
periods, and when it moves, ``auto_schedule`` searches once more with it and
:func:`measure_refit` measures that plan beside the choice (the table of that
measurement keeps the first one as ``earlier``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan

from autosched.verify.candidates import is_known, refit_candidates, search_candidates
from autosched.verify.measure import PlanMeasurement, VerifyOptions, VerifyTable, measure_plans

__all__ = ["VerifyOptions", "verify_search", "measure_refit", "wanted"]


def wanted(verify: Any, problem: Any, batches: Optional[Sequence[Any]]) -> bool:
    """Whether ``auto_schedule`` verifies: on by default when the tasks are runnable and batches are given."""
    if verify is False:
        return False
    runnable = all(callable(t.fn) for t in problem.tasks.values())
    if verify is None and batches is not None and not runnable:
        unbound = [n for n, t in problem.tasks.items() if not callable(t.fn)]
        raise ValueError(f"auto_schedule(batches=...) measures the candidate plans on the engine, but tasks {unbound} "
                         "have no function: bind them (plan.bind({name: fn, ...}) or PipelineTask(name, fn)), or drop "
                         "batches= to search on the cost model alone (the plan is then not verified)")
    if verify is None:
        return batches is not None
    if batches is None:
        raise ValueError("auto_schedule(verify=...) needs batches=[...] to run the candidate plans on the engine")
    if not runnable:
        unbound = [n for n, t in problem.tasks.items() if not callable(t.fn)]
        raise ValueError(f"auto_schedule(verify=...) needs runnable tasks; {unbound} have no function "
                         "(pass PipelineTask(name, fn) objects, or verify=False)")
    return True


def _options(verify: Any) -> VerifyOptions:
    if isinstance(verify, VerifyOptions):
        return verify
    if isinstance(verify, int) and not isinstance(verify, bool):
        return VerifyOptions(rounds=verify)
    return VerifyOptions()


def _batches_for(batches: Sequence[Any], opts: VerifyOptions, depth: int) -> List[Any]:
    batches = list(batches)
    want = opts.iterations or max(len(batches), min(24, 4 * depth + 8))
    out = []
    while len(out) < want:
        out.extend(batches[: want - len(out)])
    return out


def verify_search(report: Any, pool: Sequence[Tuple[str, Optional[PipelinePlan]]], problem: Any,
                  batches: Sequence[Any], verify: Any, num_iterations: int) -> Tuple[PipelinePlan, Any]:
    """Measure the search's candidates, the input plan and the serial plan, paired by round; return the choice.

    Parameters
    ----------
    report : SearchReport
        The search's report (its ``plan`` is the simulator's favourite).
    pool : list of (label, plan or None)
        The other candidates (other searchers' bests, seeds), best first; plans
        equal to one already listed are measured once.
    problem : Problem
    batches : sequence
    verify : True, int or VerifyOptions
    num_iterations : int
        Simulated iterations for the predictions.

    Returns
    -------
    (PipelinePlan, SearchReport)
        The plan chosen (:meth:`VerifyTable.choose`), and the report re-judged for it (period,
        binding, utilisation simulated for that plan) with ``verify`` set to
        the :class:`VerifyTable`.
    """
    opts = _options(verify)
    cands = search_candidates(report.plan, pool, opts.top, problem.base_plan)
    known = [label for label, _ in cands if is_known(label)] if opts.keep_known else []
    table = _measure(cands, problem, batches, opts, num_iterations, known)
    chosen = table.choose()
    if chosen is not table.fastest():
        table.notes.append(f"{table.verdict()}: keeping {chosen.label} ({chosen.period_s * 1e3:.3f} ms)")
    if chosen.label != "auto":
        table.notes.append(f"the simulator's favourite (auto) measured {table['auto'].period_s * 1e3:.3f} ms, "
                           f"{chosen.label} {chosen.period_s * 1e3:.3f} ms: returning {chosen.label}")
    new = _rejudge(report, chosen.plan, problem, num_iterations) if chosen.label != "auto" else report
    new = dataclasses.replace(new, verify=table)
    return chosen.plan, new


def measure_refit(report: Any, chosen: PlanMeasurement, plan: PipelinePlan, problem: Any, batches: Sequence[Any],
                  verify: Any, num_iterations: int) -> Any:
    """Measure a refitted search's plan beside the verified choice and the serial plan; report the fastest.

    Parameters
    ----------
    report : SearchReport
        The verified report (``report.verify`` holds the first measurement).
    chosen : PlanMeasurement
        The first measurement's choice.
    plan : PipelinePlan
        The plan the search found with the refitted model (:mod:`autosched.verify.refit`).
    problem : Problem
        The refitted problem: its costs predict all three plans.
    batches, verify, num_iterations
        As for :func:`verify_search`.

    Returns
    -------
    SearchReport
        Re-judged with the refitted costs for the plan measured fastest in
        these rounds (``"refit"``, the earlier choice or ``"serial"``); its
        ``verify`` is the new table, with the first one as ``earlier``.
    """
    opts = _options(verify)
    first = report.verify
    serial = first["serial"].plan if chosen.label != "serial" else chosen.plan
    cands = refit_candidates((chosen.label, chosen.plan), plan, serial)
    table = _measure(cands, problem, batches, opts, num_iterations, [chosen.label] if opts.keep_known else [])
    table.earlier = first
    won = table.choose()
    table.notes.append(f"refit: the search with the refitted pool found a new plan; measured beside "
                       f"{chosen.label}: refit {table['refit'].period_s * 1e3:.3f} ms, {chosen.label} "
                       f"{table[chosen.label].period_s * 1e3:.3f} ms: returning {won.label}")
    new = _rejudge(report, won.plan, problem, num_iterations)
    return dataclasses.replace(new, verify=table, method=report.method + ("+refit" if won.label == "refit" else ""))


def _measure(cands: List[Tuple[str, PipelinePlan]], problem: Any, batches: Sequence[Any], opts: VerifyOptions,
             num_iterations: int, known: Sequence[str]) -> VerifyTable:
    """Predict each candidate with the search's model (:meth:`Problem.simulate`), then measure them all side by
    side (with racing)."""
    runs = _batches_for(batches, opts, max(p.pipeline_depth for _, p in cands))
    predicted: Dict[str, float] = {}
    for label, plan in cands:
        try:
            predicted[label] = float(problem.simulate(plan, num_iterations).period_s)
        except Exception:  # noqa: BLE001 - a plan the simulator rejects is still measured
            pass
    return measure_plans(cands, runs, opts, predicted=predicted, known=known, baseline="serial")

def _rejudge(report: Any, plan: PipelinePlan, problem: Any, num_iterations: int) -> Any:
    """The report's plan-dependent fields for another plan (:func:`autosched.search.assess.rejudge`)."""
    from autosched.search.assess import rejudge

    return rejudge(report, plan, problem, num_iterations)
