"""What the re-planner asks of a cost source: the costs now, and how noisy they are.

:class:`CostSource` is the whole interface (``costs_now()`` and an optional ``instrument`` wrapper), so any
measurement that can say "these are the tasks' costs over the last window, this is their spread" plugs in.
:class:`TaskTimes` is the simple one: an :meth:`SWPipeline.instrument <swpipe_core.engine.pipeline.SWPipeline.instrument>`
wrapper that keeps each task's last ``window`` wall durations and puts their medians into the costs the plan was
searched for (host time; on CPU a task's wall time is its cost).
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import threading
import time
from typing import Any, Callable, Deque, Dict, Optional, Protocol


from autosched.model.costs import CostModel

__all__ = ["CostSnapshot", "CostSource", "TaskTimes"]


@dataclasses.dataclass(frozen=True)
class CostSnapshot:
    """The costs of the tasks now, and their noise.

    Parameters
    ----------
    costs : CostModel
        A cost for every task of the plan.
    noise : float
        The relative spread of those costs (0.03: a task's cost varies by about 3 % from window to window); a
        searched plan must beat the running one by more than this to be swapped in.
    """

    costs: CostModel
    noise: float = 0.0


class CostSource(Protocol):
    """Anything that says what the tasks cost now (a rolling measurement, a script in a test).

    ``costs_now()`` returns a :class:`CostSnapshot`. ``instrument``, when not ``None``, is a wrapper
    ``(run_task, task, ctx)`` the pipeline runs every task under (:meth:`SWPipeline.instrument`), which is how a
    measuring source sees the tasks.
    """

    instrument: Optional[Callable[..., Any]]

    def costs_now(self) -> CostSnapshot:
        ...


class TaskTimes:
    """Each task's last ``window`` wall durations, as the plan's costs with those medians put in.

    A task not measured yet keeps its cost from ``base``. The noise is the largest task's median absolute
    deviation over its median. Device time is kept as ``base`` gives it: on CUDA a task's wall time on the host is
    not its device time (a rolling device measurement replaces this class there).

    Parameters
    ----------
    base : CostModel
        The costs the plan was searched for (resource tags, bytes and the machine calibration are kept).
    window : int
        Durations kept per task.
    clock : callable
        Seconds, monotonic (default ``time.perf_counter``).

    Examples
    --------
    >>> from swpipe import CostModel, TaskCost
    >>> times = TaskTimes(CostModel({"Load": TaskCost(0.001), "Step": TaskCost(0.002)}), window=3)
    >>> for seconds in (0.004, 0.004, 0.005):
    ...     times.add("Load", seconds)
    >>> snap = times.costs_now()
    >>> snap.costs["Load"].host_s, snap.costs["Step"].host_s, snap.noise
    (0.004, 0.002, 0.0)
    """

    def __init__(self, base: CostModel, window: int = 50, clock: Callable[[], float] = time.perf_counter) -> None:
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"TaskTimes(window={window!r}): window must be an integer >= 1 (durations kept per task)")
        self.base = base
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()  # the wrapper runs on every worker thread at once
        self._seconds: Dict[str, Deque[float]] = {}

    def instrument(self, run_task: Callable[..., Any], task: Any, ctx: Any) -> None:
        """The wrapper: run the task, keep its wall duration."""
        t0 = self._clock()
        run_task(task, ctx)
        self.add(task.name, self._clock() - t0)

    def add(self, name: str, seconds: float) -> None:
        """Keep one duration of task ``name`` (the oldest beyond ``window`` is dropped)."""
        with self._lock:
            kept = self._seconds.get(name)
            if kept is None:
                kept = self._seconds[name] = collections.deque(maxlen=self.window)
            kept.append(seconds)

    def costs_now(self) -> CostSnapshot:
        """The base costs with each measured task's median duration as its host time, and the noise."""
        with self._lock:
            kept = {name: list(seconds) for name, seconds in self._seconds.items() if seconds}
        tasks, noise = dict(self.base.tasks), 0.0
        for name, seconds in kept.items():
            if name not in tasks:  # a task the base does not cost (another plan's): nothing to refresh
                continue
            middle = statistics.median(seconds)
            tasks[name] = dataclasses.replace(tasks[name], host_s=middle)
            if middle > 0:
                noise = max(noise, statistics.median(abs(s - middle) for s in seconds) / middle)
        return CostSnapshot(dataclasses.replace(self.base, tasks=tasks), noise)
