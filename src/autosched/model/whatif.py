"""What-if questions answered by simulation: "what if InputDist took twice as long?".

:func:`what_if` simulates a plan before and after a change of costs and
returns a pandas table of predicted period, latency, binding resource and
lower bound; :func:`sweep` varies one task's cost over a range (plot it with
:func:`autosched.plots.sweep_plot`); :func:`compare_plans` puts several plans
side by side under one cost model. pandas is imported inside the functions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterable, Mapping, Union

from swpipe_core.plan import PipelinePlan

from autosched.search.bounds import lower_bounds
from autosched.model.costs import CostModel, CostModelError, TaskCost, as_cost_model
from autosched.model.simulate import simulate

__all__ = ["what_if", "sweep", "compare_plans", "apply_changes"]

Change = Union[float, int, TaskCost, Mapping[str, Any]]
Changes = Union[Mapping[str, Change], CostModel, Callable[[CostModel], CostModel]]


def apply_changes(costs: CostModel, changes: Changes) -> CostModel:
    """The cost model after a set of changes.

    Parameters
    ----------
    costs : CostModel
    changes : dict, CostModel or callable
        ``{task: factor}`` scales a task's host and device time; ``{task: TaskCost}``
        replaces its cost; ``{task: {"host_s": ..., "device_s": ..., "resources": ...}}``
        replaces some fields (a task not in the model is added, ``host_s`` required);
        the key ``"*"`` scales every task; the key ``"*bytes"`` scales every memory
        figure ("what if the batch size doubles": ``{"*bytes": 2}``, with
        ``{"*": 2}`` for the time too); a ``CostModel`` replaces the model; a
        callable maps the model to a new one.

    Returns
    -------
    CostModel

    Raises
    ------
    CostModelError
        For an unknown task, a bad field or a negative factor.

    Examples
    --------
    >>> m = CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002)})
    >>> new = apply_changes(m, {"A": 2, "B": {"device_s": 0.001}})
    >>> new["A"].host_s, new["B"]
    (0.002, TaskCost(host_s=0.002, device_s=0.001, resources=()))
    """
    if isinstance(changes, CostModel):
        return changes
    if callable(changes):
        out = changes(costs)
        if not isinstance(out, CostModel):
            raise CostModelError(f"the change function returned {type(out).__name__}, not a CostModel", "changes",
                                 value=out)
        return out
    if not isinstance(changes, Mapping):
        raise CostModelError(f"changes is {type(changes).__name__}", "changes",
                             "pass {task: factor | TaskCost | {field: value}}, a CostModel or a function")
    out = costs
    for task, change in changes.items():
        name = getattr(task, "name", task)
        if name == "*":
            out = out.scaled(None, change)
        elif name == "*bytes":
            out = out.scaled(None, change, part="bytes")
        elif isinstance(change, TaskCost):
            out = dataclasses.replace(out, tasks={**out.tasks, name: change})
        elif isinstance(change, Mapping):
            if name in out:
                out = out.replace(name, **change)
            else:
                out = dataclasses.replace(out, tasks={**out.tasks, name: dict(change)})
        elif isinstance(change, (int, float)) and not isinstance(change, bool):
            if name not in out:
                raise CostModelError(f"no cost for task {name!r} to scale", "changes",
                                     f"tasks with a cost: {sorted(out.tasks)}", tasks=[name])
            out = out.scaled(name, change)
        else:
            raise CostModelError(f"change {change!r} for {name!r} is not a factor, TaskCost or dict of fields",
                                 "changes", tasks=[name], value=change)
    return out


def _describe(changes: Changes) -> str:
    if isinstance(changes, CostModel):
        return f"cost model {changes.method or changes.machine or 'replaced'}"
    if callable(changes) and not isinstance(changes, Mapping):
        return getattr(changes, "__name__", "function")
    parts = []
    for task, change in changes.items():
        name = getattr(task, "name", task)
        if isinstance(change, (int, float)):
            parts.append(f"{name} x{change:g}")
        elif isinstance(change, TaskCost):
            parts.append(f"{name} = {change.host_s * 1e3:g}+{change.device_s * 1e3:g} ms")
        else:
            parts.append(f"{name} {dict(change)}")
    return ", ".join(parts)


def _row(plan: PipelinePlan, costs: CostModel, num_iterations: int, device: str) -> Dict[str, Any]:
    sim = simulate(plan, costs, num_iterations=num_iterations, device=device)
    b = lower_bounds(plan, costs, device=device)
    row = {"period_s": sim.period_s, "latency_s": sim.latency, "binding": sim.binding,
           "lower_bound_s": b.value, "bound_binding": b.binding}
    if costs.has_bytes:  # memory columns only when the model carries bytes
        row.update(peak_bytes=sim.memory.peak_bytes, mean_bytes=sim.memory.mean_bytes,
                   min_memory_bytes=b.memory.value if b.memory is not None else None)
    return row


def what_if(plan: PipelinePlan, costs: CostModel, changes: Changes, num_iterations: int = 50,
            device: str = "cpu") -> Any:
    """Predicted period, latency and binding resource before and after a change of costs.

    Parameters
    ----------
    plan : PipelinePlan
    costs : CostModel
    changes : dict, CostModel or callable
        See :func:`apply_changes`, e.g. ``{"InputDistWait": 2.0}``.
    num_iterations : int
    device : {"cpu", "cuda"}

    Returns
    -------
    pandas.DataFrame
        Index ``["before", "after"]``; columns ``change``, ``period_s``,
        ``latency_s``, ``binding``, ``lower_bound_s``, ``bound_binding`` and
        ``speedup`` (before's period / this period); with memory figures in
        the costs also ``peak_bytes``, ``mean_bytes`` (predicted bytes in
        flight) and ``min_memory_bytes`` (the least any plan needs).

    Raises
    ------
    CostModelError, PlanError
        For bad changes, missing costs or an invalid plan.

    Examples
    --------
    >>> from swpipe import TaskSchedule
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
    ...                     intra_iter_deps=[("B", "A")])
    >>> costs = CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002)})
    >>> t = what_if(plan, costs, {"A": 3.0})
    >>> [round(p * 1e3, 3) for p in t["period_s"]], list(t["binding"])
    ([2.0, 3.0], ['thread:b', 'thread:a'])
    """
    import pandas as pd

    costs = as_cost_model(costs)
    after = apply_changes(costs, changes)
    rows = {"before": {"change": "", **_row(plan, costs, num_iterations, device)},
            "after": {"change": _describe(changes), **_row(plan, after, num_iterations, device)}}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table["speedup"] = table["period_s"].iloc[0] / table["period_s"]
    return printable(table)


def sweep(plan: PipelinePlan, costs: CostModel, task: str, factors: Iterable[float] = (0.25, 0.5, 1, 1.5, 2, 3, 4),
          part: str = "both", num_iterations: int = 50, device: str = "cpu") -> Any:
    """The predicted period as one task's cost is scaled over a range.

    Parameters
    ----------
    plan : PipelinePlan
    costs : CostModel
    task : str
    factors : iterable of float
        Multipliers of the task's cost.
    part : {"both", "host", "device"}
        Which part of the cost to scale.
    num_iterations : int
    device : {"cpu", "cuda"}

    Returns
    -------
    pandas.DataFrame
        One row per factor: ``factor``, ``task_cost_s`` (its time on its thread, or on
        its stream for ``part="device"``), ``period_s``, ``latency_s``, ``binding``,
        ``lower_bound_s``. ``attrs["task"]`` names the task.

    Examples
    --------
    >>> from swpipe import TaskSchedule
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
    ...                     intra_iter_deps=[("B", "A")])
    >>> costs = CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002)})
    >>> t = sweep(plan, costs, "A", [1, 2, 3])
    >>> [round(p * 1e3, 3) for p in t["period_s"]]
    [2.0, 2.0, 3.0]
    """
    import pandas as pd

    costs = as_cost_model(costs)
    costs.check([task])
    rows = []
    for f in factors:
        c = costs.scaled(task, f, part=part)
        tc = c[task]
        cost = tc.device_s if part == "device" else (tc.host_s if str(device).startswith("cuda") else tc.cpu_s)
        rows.append({"factor": float(f), "task_cost_s": cost, **_row(plan, c, num_iterations, device)})
    table = printable(pd.DataFrame(rows))
    table.attrs["task"] = task
    return table


def compare_plans(plans: Mapping[str, PipelinePlan], costs: CostModel, num_iterations: int = 50,
                  device: str = "cpu") -> Any:
    """Several plans side by side under one cost model.

    Parameters
    ----------
    plans : dict
        ``{label: PipelinePlan}``.
    costs : CostModel
    num_iterations : int
    device : {"cpu", "cuda"}

    Returns
    -------
    pandas.DataFrame
        One row per plan (index = label): ``depth``, ``period_s``, ``latency_s``,
        ``binding``, ``lower_bound_s``, ``bound_binding``, sorted by period.

    Examples
    --------
    >>> from swpipe import TaskSchedule
    >>> costs = CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002)})
    >>> one = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0)}, intra_iter_deps=[("B", "A")])
    >>> two = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
    ...                    intra_iter_deps=[("B", "A")])
    >>> list(compare_plans({"serial": one, "pipelined": two}, costs).index)
    ['pipelined', 'serial']
    """
    import pandas as pd

    rows = {label: {"depth": plan.pipeline_depth, **_row(plan, costs, num_iterations, device)}
            for label, plan in plans.items()}
    return printable(pd.DataFrame.from_dict(rows, orient="index").sort_values("period_s", kind="stable"))


_PRINTABLE: list = []


def printable(table: Any) -> Any:
    """``table`` as a DataFrame that prints every column and row (``print`` of a plain one hides columns behind ...).

    Everything else is a ``pandas.DataFrame``'s; operations that return a
    new frame keep the class.

    Examples
    --------
    >>> import pandas as pd
    >>> wide = printable(pd.DataFrame({f"column_{k}": [k] for k in range(30)}))
    >>> "..." in repr(wide), "column_29" in str(wide)
    (False, True)
    """
    if not _PRINTABLE:
        import pandas as pd

        class PrintableFrame(pd.DataFrame):
            """A DataFrame whose text form is complete (``to_string``)."""

            @property
            def _constructor(self) -> Any:
                return PrintableFrame

            def __repr__(self) -> str:
                return self.to_string()

        _PRINTABLE.append(PrintableFrame)
    return _PRINTABLE[0](table)
