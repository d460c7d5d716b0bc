"""What the re-planner asks of a cost source: the costs now, and how noisy they are.

:class:`CostSource` is the whole interface (``costs_now()`` and an optional ``instrument`` wrapper), so any
measurement that can say "these are the tasks' costs over the last window, this is their spread" plugs in.
:class:`RollingSource` is the one the pipeline uses by default. It holds no window of its own: the durations are
kept by :class:`~swpipe_core.measure.rolling.RollingCosts` (the instrument wrapper) and turned into costs by
:meth:`CostModel.refreshed <autosched.model.costs.CostModel.refreshed>`, the same rule every other refreshed cost
model follows.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Protocol

from autosched.model.costs import CostModel
from autosched.model.refresh import DEFAULT_MIN_SAMPLES
from swpipe_core.engine.options import OptionError
from swpipe_core.measure.rolling import RollingCosts

__all__ = ["CostSnapshot", "CostSource", "RollingSource"]


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


class RollingSource:
    """The costs the plan was searched for, refreshed from a :class:`RollingCosts` window.

    ``costs_now()`` is ``base.refreshed(rolling, min_samples)``: a task whose window holds ``min_samples``
    durations gets their median (host, and device where the window times the device); a task with fewer keeps
    its cost from ``base``. The noise is the largest spread (interquartile range over the median) of the refreshed
    tasks (:attr:`CostFreshness.noisiest <autosched.model.refresh.CostFreshness.noisiest>`), 0 when none is.

    Parameters
    ----------
    base : CostModel
        The costs the plan was searched for (resource tags, bytes and the machine calibration are kept).
    rolling : RollingCosts, optional
        The window (default ``RollingCosts()``: host time only, 64 durations per task). It is the wrapper the
        pipeline runs every task under (:attr:`instrument`); anything else may feed it too
        (:meth:`RollingCosts.add`).
    min_samples : int, optional
        Durations a task's window needs before its median replaces the base cost (default 5, or the window's
        size when smaller).

    Raises
    ------
    OptionError
        ``min_samples`` larger than the window (no task could ever be refreshed) (``.field``, ``.value``).

    Examples
    --------
    >>> from swpipe import CostModel, RollingCosts, TaskCost
    >>> source = RollingSource(CostModel({"Load": TaskCost(0.001), "Step": TaskCost(0.002)}), RollingCosts(window=3),
    ...                        min_samples=3)
    >>> for seconds in (0.004, 0.004, 0.004):
    ...     source.rolling.add("Load", seconds)
    >>> snap = source.costs_now()
    >>> snap.costs["Load"].host_s, snap.costs["Step"].host_s, snap.noise
    (0.004, 0.002, 0.0)
    """

    def __init__(self, base: CostModel, rolling: Optional[RollingCosts] = None,
                 min_samples: Optional[int] = None) -> None:
        self.base = base
        self.rolling = rolling if rolling is not None else RollingCosts()
        if min_samples is None:
            min_samples = min(DEFAULT_MIN_SAMPLES, self.rolling.window)
        elif isinstance(min_samples, int) and min_samples > self.rolling.window:
            raise OptionError("RollingSource", "min_samples", min_samples,
                              expected=f"at most the window's size, {self.rolling.window}",
                              fix="pass a smaller min_samples or a larger RollingCosts(window=...)")
        self.min_samples = min_samples

    @property
    def instrument(self) -> RollingCosts:
        """The wrapper the pipeline runs every task under: the window itself."""
        return self.rolling

    def costs_now(self) -> CostSnapshot:
        """The base costs refreshed from the window now, and the largest spread of a refreshed task."""
        costs = self.base.refreshed(self.rolling, self.min_samples)
        noisiest = costs.freshness.noisiest
        return CostSnapshot(costs, noisiest.spread if noisiest is not None else 0.0)
