"""A cost model refreshed from costs measured while the job runs, and how fresh and how noisy those costs are.

:class:`~swpipe_core.measure.rolling.RollingCosts` keeps per task a window of
recent durations. :func:`refreshed_costs` (``CostModel.refreshed``) puts the
window's medians in place of a model's host and device times, task by task,
where the window holds at least ``min_samples`` durations; a task with fewer
keeps the model's own cost (one sample, maybe taken on a load spike, must
not decide). Everything else the model holds (resource tags, bytes, the
machine calibration, the core pool) is kept. The model carries a
:class:`CostFreshness`: per task, where its cost came from, how many samples,
how old the newest and the oldest are and their spread. ``print(costs.freshness)``
shows it and :meth:`SimResult.summary <autosched.model.simulate.SimResult.summary>`
adds its one-line summary.

The medians are the durations as the job ran them: host times include what
tasks running at the same time cost each other (cores, memory bandwidth);
the engine's own cost per task, hand-off and period is not in them (a
machine calibration in the model still adds it when simulating).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional

from autosched.model.taskcost import CostModelError, TaskCost

__all__ = ["TaskFreshness", "CostFreshness", "refreshed_costs", "DEFAULT_MIN_SAMPLES"]

DEFAULT_MIN_SAMPLES = 5


@dataclass(frozen=True)
class TaskFreshness:
    """Where one task's cost came from, and how fresh and noisy its window is.

    Attributes
    ----------
    task : str
    source : str
        ``"window"`` (the medians of recent executions) or ``"model"`` (too few
        samples: the model's own cost kept).
    host, device : WindowStats or None
        The task's window of that kind when there is one
        (:class:`~swpipe_core.measure.rolling.WindowStats`).
    """

    task: str
    source: str
    host: Any = None
    device: Any = None

    @property
    def samples(self) -> int:
        """Host samples in the window (0: none)."""
        return self.host.samples if self.host is not None else 0

    @property
    def age_s(self) -> Optional[float]:
        """How old the newest sample is (``None``: no samples)."""
        return self.host.age_s if self.host is not None else None

    @property
    def spread(self) -> float:
        """The larger spread (interquartile range over the median) of the host and device windows."""
        return max([0.0, *(w.spread for w in (self.host, self.device) if w is not None)])


@dataclass(frozen=True)
class CostFreshness:
    """How fresh and how noisy a refreshed cost model's costs are, per task.

    Attributes
    ----------
    tasks : dict
        ``{task: TaskFreshness}`` for every task of the model.
    min_samples : int
        The fewest samples a window needed to replace the model's cost.
    """

    tasks: Dict[str, TaskFreshness]
    min_samples: int

    @property
    def refreshed(self) -> list:
        """The tasks whose cost came from the window."""
        return [n for n, f in self.tasks.items() if f.source == "window"]

    @property
    def age_s(self) -> Optional[float]:
        """The oldest newest-sample over the refreshed tasks: how stale the stalest refreshed cost is."""
        ages = [self.tasks[n].age_s for n in self.refreshed]
        return max(ages) if ages else None

    @property
    def span_s(self) -> Optional[float]:
        """How far back the refreshed tasks' windows reach (their oldest sample)."""
        spans = [self.tasks[n].host.span_s for n in self.refreshed]
        return max(spans) if spans else None

    @property
    def noisiest(self) -> Optional[TaskFreshness]:
        """The refreshed task with the largest spread."""
        rows = [self.tasks[n] for n in self.refreshed]
        return max(rows, key=lambda f: f.spread) if rows else None

    def summary(self) -> str:
        """One line: how many tasks were refreshed, how old and how noisy their costs are.

        Examples
        --------
        >>> from swpipe_core.measure.rolling import RollingCosts
        >>> from autosched.model.costs import CostModel, TaskCost
        >>> r = RollingCosts(clock=lambda: 100.0)
        >>> for i, d in enumerate((0.010, 0.011, 0.012, 0.009, 0.010)):
        ...     r.add("A", d, at=90.0 + i)
        >>> print(CostModel({"A": TaskCost(0.02), "B": TaskCost(0.01)}).refreshed(r).freshness.summary())
        costs: 1 of 2 tasks from recent executions (5 or more each; newest sample at most 6.0 s old, oldest 10.0 s); noisiest A, spread 10%; kept from the model: B
        """
        kept = [n for n, f in self.tasks.items() if f.source != "window"]
        tail = f"; kept from the model: {', '.join(kept)}" if kept else ""
        worst = self.noisiest
        if worst is None:
            return f"costs: no task had {self.min_samples} samples; every cost kept from the model"
        return (f"costs: {len(self.refreshed)} of {len(self.tasks)} tasks from recent executions ({self.min_samples} or "
                f"more each; newest sample at most {self.age_s:.1f} s old, oldest {self.span_s:.1f} s); "
                f"noisiest {worst.task}, spread {worst.spread:.0%}{tail}")

    def __str__(self) -> str:
        width = max([4, *(len(n) for n in self.tasks)])
        lines = [self.summary(),
                 f"{'task':<{width}}  source  samples  median ms  spread  age s  span s  device ms  dev spread"]
        for name, f in self.tasks.items():
            h, d = f.host, f.device
            host = (f"{h.samples:>7}{h.median_s * 1e3:>11.3f}{h.spread:>8.0%}{h.age_s:>7.1f}{h.span_s:>8.1f}"
                    if h is not None else f"{0:>7}{'-':>11}{'-':>8}{'-':>7}{'-':>8}")
            dev = f"{d.median_s * 1e3:>11.3f}{d.spread:>12.0%}" if d is not None else f"{'-':>11}{'-':>12}"
            lines.append(f"{name:<{width}}  {f.source:<6}{host}{dev}")
        return "\n".join(lines)


def refreshed_costs(model: Any, rolling: Any, min_samples: int = DEFAULT_MIN_SAMPLES,
                    tasks_from_window: bool = False) -> Any:
    """``model`` with each task's times replaced by its window's medians where the window has ``min_samples``.

    The rule behind :meth:`CostModel.refreshed <autosched.model.costs.CostModel.refreshed>` and
    :meth:`CostModel.from_rolling <autosched.model.costs.CostModel.from_rolling>` (see there);
    ``tasks_from_window`` adds the window's tasks the model lacks (a model built from the window alone).
    """
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1:
        raise CostModelError(f"min_samples is {min_samples!r}, not an integer >= 1", "min_samples",
                             "pass how many recent executions a task needs before its cost is replaced, e.g. 5",
                             value=min_samples)
    host, device = rolling.stats("host"), rolling.stats("device")
    names = list(model.tasks) + ([n for n in dict.fromkeys([*host, *device]) if n not in model.tasks]
                                 if tasks_from_window else [])
    tasks: Dict[str, TaskCost] = {}
    fresh: Dict[str, TaskFreshness] = {}
    for name in names:
        cost = model.tasks.get(name, TaskCost(0.0))
        h, d = host.get(name), device.get(name)
        use_host = h is not None and h.samples >= min_samples
        use_device = d is not None and d.samples >= min_samples
        if use_host:
            cost = dataclasses.replace(cost, host_s=h.median_s)
        if use_device:
            cost = dataclasses.replace(cost, device_s=d.median_s)
        tasks[name] = cost
        fresh[name] = TaskFreshness(name, "window" if use_host or use_device else "model", h, d)
    method = f"rolling: window medians (at least {min_samples} executions), else {model.method or 'the model'}"
    return dataclasses.replace(model, tasks=tasks, method=method, freshness=CostFreshness(fresh, min_samples))
