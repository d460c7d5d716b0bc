"""A measurement that runs the user's tasks on their model: what it ran (:class:`MeasuredRun`), and the model put
back afterwards (:func:`measured_on`).

Profiling a training step, calibrating the engine and verifying plans run the
user's own tasks, which train the model they measure. :func:`measured_on`
counts what such a block runs for real through the engine's ``instrument()``
hook and restores the state :func:`swpipe_core.measure.state.snapshot_state`
recorded; it builds on the engine and on :mod:`swpipe_core.measure.state`,
which the engine itself uses and which names no engine type.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Iterator

from swpipe_core.measure.state import restore_state, snapshot_state

if TYPE_CHECKING:  # annotations only: the pipeline is the caller's
    from swpipe_core.engine.dispatch import RunTask
    from swpipe_core.engine.lifetime import TrainState
    from swpipe_core.engine.pipeline import SWPipeline
    from swpipe_core.plan import IterContext, PipelineTask

__all__ = ["MeasuredRun", "measured_on"]


@dataclass
class MeasuredRun:
    """What a measurement ran of the user's tasks: how often each ran for real (not replayed), and ``restored``."""

    runs: Dict[str, int] = field(default_factory=dict)
    restored: bool = False

    @property
    def iterations(self) -> int:
        """The most any task ran: the iterations of the user's step the measurement went through."""
        return max(self.runs.values(), default=0)

    def describe(self) -> str:
        """One line for a report.

        Examples
        --------
        >>> MeasuredRun({"Forward": 16, "Step": 12}, restored=True).describe()
        'ran your tasks up to 16 times each (Step 12 times); your model and optimizer were restored afterwards'
        >>> MeasuredRun({"Forward": 16, "Step": 16}).describe()
        'ran your tasks 16 times each: they trained your model (pass state=[model, optimizer] to have it restored)'
        """
        if not self.runs:
            return "ran none of your tasks"
        least = min(self.runs, key=self.runs.get)
        times = (f"{self.iterations} times each" if self.runs[least] == self.iterations else
                 f"up to {self.iterations} times each ({least} {self.runs[least]} times)")
        if self.restored:
            return f"ran your tasks {times}; your model and optimizer were restored afterwards"
        return f"ran your tasks {times}: they trained your model (pass state=[model, optimizer] to have it restored)"


class _Counter:
    """The wrapper of :func:`measured_on`: counts each task that runs for real (a shortcut's replay aside)."""

    def __init__(self, pipe: "SWPipeline", ran: MeasuredRun) -> None:
        self.pipe, self.ran = pipe, ran

    def __call__(self, run_task: "RunTask", task: "PipelineTask", ctx: "IterContext") -> None:
        if task.name not in self.pipe.cached_shortcuts:  # a shortcut task with its cache replays
            self.ran.runs[task.name] = self.ran.runs.get(task.name, 0) + 1
        run_task(task, ctx)


@contextlib.contextmanager
def measured_on(pipe: "SWPipeline", state: "TrainState", what: str) -> Iterator[MeasuredRun]:
    """A measurement that runs ``pipe``'s tasks on the user's model: count what it ran, restore ``state`` after.

    Counts how often the block runs each of ``pipe``'s tasks for real (a
    shortcut's replay aside), seen through :meth:`SWPipeline.instrument
    <swpipe_core.engine.pipeline.SWPipeline.instrument>`. With ``state`` (modules,
    optimizers, stateful objects), everything :func:`snapshot_state` records
    is put back when the block ends, also on an error. Without it, a
    ``RuntimeWarning`` says once how many steps ran on the user's model.

    Examples
    --------
    >>> from swpipe import SWPipeline, PipelinePlan, PipelineTask, TaskSchedule
    >>> import torch
    >>> model = torch.nn.Linear(1, 1, bias=False)
    >>> _ = torch.nn.init.zeros_(model.weight)
    >>> def step(ctx):
    ...     with torch.no_grad():
    ...         model.weight.add_(1)
    >>> plan = PipelinePlan({PipelineTask("Step", step): TaskSchedule()})
    >>> with SWPipeline(plan, device="cpu") as pipe, measured_on(pipe, [model], "a measurement") as ran:
    ...     _ = pipe.run_serial(range(5))
    >>> ran.iterations, ran.restored, float(model.weight)
    (5, True, 0.0)
    """
    ran = MeasuredRun()
    snapshot = snapshot_state(state) if state is not None else None
    outer = any(isinstance(w, _Counter) for w in pipe.instruments)  # inside another measurement: it reports
    try:
        with pipe.instrument(_Counter(pipe, ran)):
            yield ran
    finally:
        if snapshot is not None:
            restore_state(state, snapshot)
            ran.restored = True
    if snapshot is None and ran.iterations and not outer:
        warnings.warn(f"{what} {ran.describe()}", RuntimeWarning, stacklevel=3)
