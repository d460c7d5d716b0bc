"""Predict plans' periods with a cost model: what the verification compares each measurement with.

Prediction of each plan: its simulated period in the search's own model
(:meth:`autosched.search.problem.Problem.simulate`: the costs the search used, with
the machine calibration's engine costs per hand-off and per period when it
folded one in), the model that ranked the plans and wrote the report: one
model per ``auto_schedule`` call. :func:`predict_periods` gives the same
figures from a cost model outside a search; :func:`predicted_speedup` turns two
predictions of one model into a speedup over the serial plan.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan

__all__ = ["predict_periods", "predicted_speedup", "predicted_speedups"]


def predict_periods(plans: Sequence[Tuple[str, PipelinePlan]], costs: Any, num_iterations: int = 50,
                    device: str = "cpu") -> Dict[str, float]:
    """The simulated steady period of each labelled plan: what the verification calls its prediction.

    The same model as ``auto_schedule``'s for these costs
    (:func:`~autosched.model.simulate.simulate`): a cost model that carries a
    ``machine_calibration`` is simulated with it folded in (engine costs per
    task, per hand-off and per period, the free cores), any other as it is.

    Parameters
    ----------
    plans : sequence of (label, PipelinePlan)
    costs : CostModel
    num_iterations : int
    device : {"cpu", "cuda"}

    Returns
    -------
    dict
        ``label -> seconds``; a plan the simulator rejects has no entry (it
        can still be measured).

    Examples
    --------
    >>> from swpipe import CostModel, PipelinePlan, TaskCost, TaskSchedule
    >>> from autosched.verify.candidates import serial_plan
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(1, thread_group="y")},
    ...                     intra_iter_deps=[("B", "A")])
    >>> costs = CostModel({"A": TaskCost(1e-3), "B": TaskCost(1e-3)})
    >>> got = predict_periods([("two", plan), ("serial", serial_plan(plan))], costs)
    >>> {label: round(s * 1e3, 6) for label, s in got.items()}
    {'two': 1.0, 'serial': 2.0}

    Calibrated: 10 us per task, 50 us per hand-off, 2 free cores. ``B`` waits for ``A`` on another thread:

    >>> import dataclasses
    >>> from swpipe_core.measure.calibrate import MachineCalibration
    >>> cal = MachineCalibration(task_s=1e-5, dep_s=5e-5, cores_free=2.0, cpu_count=2)
    >>> got = predict_periods([("two", plan), ("serial", serial_plan(plan))],
    ...                       dataclasses.replace(costs, machine_calibration=cal))
    >>> {label: round(s * 1e3, 6) for label, s in got.items()}
    {'two': 1.06, 'serial': 2.02}
    """
    from autosched.model.simulate import simulate

    predicted: Dict[str, float] = {}
    for label, plan in plans:
        try:
            predicted[label] = float(simulate(plan, costs, num_iterations=num_iterations, device=device).period_s)
        except Exception:  # noqa: BLE001 - a plan the simulator rejects is still measured
            pass
    return predicted


def predicted_speedup(predicted: Dict[str, Optional[float]], label: str) -> Optional[float]:
    """The model's speedup of ``label`` over the serial plan: predicted serial period / its predicted period.

    A ratio of two predictions from one cost model, so how fast the machine
    runs now against when the costs were taken cancels out: compare it with
    a measured speedup over a serial run taken in the same rounds.

    Parameters
    ----------
    predicted : dict
        ``label -> predicted period`` (:func:`predict_periods`), with ``"serial"``.
    label : str

    Returns
    -------
    float or None
        None when either prediction is missing or zero.

    Examples
    --------
    >>> predicted_speedup({"serial": 0.008, "auto": 0.005}, "auto")
    1.6
    >>> predicted_speedup({"auto": 0.006}, "auto") is None
    True
    """
    serial, own = predicted.get("serial"), predicted.get(label)
    if not serial or not own:
        return None
    return serial / own


def predicted_speedups(predicted: Dict[str, Optional[float]]) -> Dict[str, float]:
    """:func:`predicted_speedup` of every label that has one.

    Examples
    --------
    >>> predicted_speedups({"serial": 0.008, "auto": 0.005, "broken": None})
    {'serial': 1.0, 'auto': 1.6}
    """
    out = {label: predicted_speedup(predicted, label) for label in predicted}
    return {label: x for label, x in out.items() if x is not None}
