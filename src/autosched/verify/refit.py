"""Feed the verification's measurements back into the model: refit the pool of free cores.

The verification (:mod:`autosched.verify.measure`) measures a few plans on the engine
beside the serial plan. The serial plan's measured/predicted ratio rescales
every prediction (``VerifyTable.speed_factor``), which fixes a machine that
runs all tasks faster or slower than when their costs were taken but changes
no ranking. What can change the ranking is how much the plans' threads really
run in parallel: the cost model's core pool (``CostModel.cores``), taken from
a short probe (``swpipe_core.measure.calibrate.measure_cores``) or absent (unlimited).

:func:`fit_core_pool` re-predicts each measured multi-thread plan with every
pool size from one core up to its threads, rescaled by the serial plan, and
keeps the size whose predictions are nearest the measurements (median
relative error). The model's own pool is kept unless another size lowers that
error by at least the table's noise floor, so one noisy round does not move
it (:meth:`PoolFit.applied_to` sets it, in the search's model and in the
verification's calibrated one). ``auto_schedule`` then searches once more with the refitted pool and
measures that search's plan against the one verification chose; the faster
one is returned (:func:`autosched.search.autoschedule.auto_schedule`).

Only the pool is refitted: it is the one machine term whose error reorders
plans (threads that cannot run at once), it is identified by plans with
different thread counts measured side by side, and a handful of noisy
measurements cannot pin more terms than one.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any, Dict, Optional

__all__ = ["PoolFit", "fit_core_pool"]


@dataclass
class PoolFit:
    """The core pool that best explains a verification's measurements.

    Parameters
    ----------
    cores : int or None
        The pool size that fits best (``None``: unlimited, as the model had it).
    was : int or None
        The model's pool before the fit (``None``: unlimited).
    errors_pct : dict
        ``{pool size: median |rescaled prediction - measured| / measured in percent}``
        over the measured multi-thread plans; the model's own pool is among them.
    plans : int
        How many measured plans the fit used.

    Examples
    --------
    >>> fit = PoolFit(cores=1, was=2, errors_pct={1: 3.0, 2: 21.5}, plans=2)
    >>> fit.changed
    True
    >>> print(fit.describe())
    the measured periods of 2 multi-thread plan(s) fit a pool of 1 core(s) better than the model's 2 (median rescaled error 21.5% -> 3.0%)
    """

    cores: Optional[int]
    was: Optional[int]
    errors_pct: Dict[Optional[int], float]
    plans: int

    @property
    def changed(self) -> bool:
        """Whether the fit moved the pool."""
        return self.cores != self.was

    def applied_to(self, costs: Any) -> Any:
        """``costs`` with the fitted pool: the folded model's ``cores``, or, on a model that carries its
        machine calibration (the verification's calibrated model), the calibration's ``cores_free``.

        Examples
        --------
        >>> from swpipe import CostModel, TaskCost
        >>> from swpipe_core.measure.calibrate import MachineCalibration
        >>> fit = PoolFit(cores=1, was=2, errors_pct={1: 3.0, 2: 21.5}, plans=2)
        >>> fit.applied_to(CostModel({"A": TaskCost(1e-3)}, cores=2)).cores
        1
        >>> calibrated = CostModel({"A": TaskCost(1e-3)}, machine_calibration=MachineCalibration(cores_free=1.8))
        >>> fit.applied_to(calibrated).machine_calibration.cores_free
        1.0
        >>> PoolFit(cores=None, was=2, errors_pct={}, plans=1).applied_to(calibrated) is calibrated
        True
        """
        cal = getattr(costs, "machine_calibration", None)
        if cal is None:
            return dataclasses.replace(costs, cores=self.cores)
        if self.cores is None:  # unlimited: a calibrated model has no such pool, it keeps the cores measured free
            return costs
        return dataclasses.replace(costs, machine_calibration=dataclasses.replace(cal, cores_free=float(self.cores)))

    def describe(self) -> str:
        """One line for the report."""
        def name(k: Optional[int]) -> str:
            return "unlimited" if k is None else str(k)

        if not self.changed:
            return (f"the measured periods of {self.plans} multi-thread plan(s) keep the model's pool of "
                    f"{name(self.was)} core(s) (median rescaled error {self.errors_pct[self.was]:.1f}%)")
        return (f"the measured periods of {self.plans} multi-thread plan(s) fit a pool of {name(self.cores)} core(s) "
                f"better than the model's {name(self.was)} (median rescaled error "
                f"{self.errors_pct[self.was]:.1f}% -> {self.errors_pct[self.cores]:.1f}%)")


def fit_core_pool(table: Any, costs: Any, num_iterations: int = 60, device: str = "cpu",
                  calibration: Any = None) -> Optional[PoolFit]:
    """Refit the cost model's core pool to a verification's measured periods.

    Parameters
    ----------
    table : autosched.verify.measure.VerifyTable
        Measured plans, with a ``"serial"`` row (its prediction rescales the others).
    costs : CostModel
        The model the predictions came from (the search's, calibration folded in).
    num_iterations : int
        Simulated iterations per prediction.
    device : str
        The simulator's device mode.

    Returns
    -------
    PoolFit or None
        ``None`` when the table cannot tell pools apart: no serial row, or no
        measured plan with two or more thread groups.

    Examples
    --------
    Two tasks of 2 ms on two threads measured at 4 ms a period, as one core
    would run them; the model says two cores (a 2 ms period):

    >>> from swpipe import CostModel, PipelinePlan, TaskCost, TaskSchedule
    >>> from autosched.verify.candidates import serial_plan
    >>> from autosched.verify.measure import PlanMeasurement, VerifyTable
    >>> two = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
    ...                    intra_iter_deps=[("B", "A")])
    >>> costs = CostModel({"A": TaskCost(0.002), "B": TaskCost(0.002)}, cores=2)
    >>> table = VerifyTable([PlanMeasurement("auto", two, [0.004]),
    ...                      PlanMeasurement("serial", serial_plan(two), [0.004], predicted_s=0.004)], 1, 20)
    >>> fit = fit_core_pool(table, costs)
    >>> fit.cores, fit.was, {k: round(v) for k, v in fit.errors_pct.items()}
    (1, 2, {1: 0, 2: 50})
    """
    from autosched.model.simulate import simulate_folded

    def simulate(plan: Any, model: Any, num_iterations: int, device: str) -> Any:
        return simulate_folded(plan, model, calibration, num_iterations, device)

    if "serial" not in table or table["serial"].plan is None or table["serial"].period_s <= 0:
        return None
    multi = [r for r in table.rows if r.label != "serial" and r.plan is not None and r.period_s > 0
             and len(r.plan.thread_groups) > 1]
    if not multi:
        return None
    most = max(len(r.plan.thread_groups) for r in multi)
    was = costs.cores
    # a pool as large as the plans' threads predicts these plans as no pool does: without one, it is the model
    sizes = list(range(1, most)) + [None] if was is None else sorted(set(range(1, most + 1)) | {was})
    errors: Dict[Optional[int], float] = {}
    for k in sizes:
        model = dataclasses.replace(costs, cores=k)
        serial_pred = float(simulate(table["serial"].plan, model, num_iterations=num_iterations, device=device).period_s)
        if serial_pred <= 0:
            return None
        scale = table["serial"].period_s / serial_pred
        errs = [abs(scale * float(simulate(r.plan, model, num_iterations=num_iterations, device=device).period_s)
                    - r.period_s) / r.period_s * 100.0 for r in multi]
        errors[k] = statistics.median(errs)
    best = min(errors, key=lambda k: (errors[k], k != was))
    if errors[was] - errors[best] < table.noise_floor_pct:
        best = was
    return PoolFit(cores=best, was=was, errors_pct=errors, plans=len(multi))
