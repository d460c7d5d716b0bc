"""What the verbs return, whatever they were given: one vocabulary for a plan, a GPipe and PyTorch's schedules.

:func:`autosched.verbs.simulate` of a :class:`~swpipe_core.plan.PipelinePlan`, of a GPipe or of a
pipeline-parallel program returns its own result class (``SimResult``, ``StepPrediction``, ``PPSimResult``), and
each has the :class:`Prediction` fields:

* ``period_s``: seconds per repetition. A plan repeats every period (its steady state); a GPipe step and a
  pipeline-parallel step repeat once per step, so their ``period_s`` is the step time (``step_s``);
* ``peak_bytes_by``: the most bytes alive, per place, as :class:`PeakBytes` (per rank of a PP step, per partition
  of a GPipe step, the one process of a plan: a plan's memory model counts the bytes an iteration keeps, not
  the thread holding them);
* ``events``: the timeline, :class:`~swpipe_core.measure.trace.TimelineEvent` on a track per thread (a plan), per
  partition (a GPipe) or per rank (a PP step), which :func:`autosched.plots.gantt` draws;
* ``summary()``: a few lines of text.

The bounds (:func:`autosched.verbs.lower_bounds`) have ``period_s`` (no run repeats faster), ``binding`` and
``summary()``: ``Bounds``, ``PPBounds``, :class:`StepBounds`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, Iterator, List, Mapping, Optional, Protocol, Tuple, runtime_checkable

__all__ = ["Prediction", "PeakBytes", "StepBounds", "StepSearchReport"]


@runtime_checkable
class Prediction(Protocol):
    """What every ``simulate`` result has (see the module's docstring for what each means per kind)."""

    @property
    def period_s(self) -> float: ...

    @property
    def peak_bytes_by(self) -> "PeakBytes": ...

    @property
    def events(self) -> List[Any]: ...

    def summary(self) -> str: ...


@dataclass(frozen=True)
class PeakBytes(Mapping):
    """Peak bytes per place: ``{rank: bytes}``, ``{partition: bytes}`` or ``{"process": bytes}``.

    Attributes
    ----------
    by : dict
        The peak of each place.
    place : {"rank", "partition", "process"}
        What a key is.

    Examples
    --------
    >>> peaks = PeakBytes({0: 200, 1: 100}, "rank")
    >>> peaks[0], peaks.max_bytes, list(peaks)
    (200, 200, [0, 1])
    """

    by: Dict[Hashable, float]
    place: str

    def __getitem__(self, key: Hashable) -> float:
        return self.by[key]

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.by)

    def __len__(self) -> int:
        return len(self.by)

    @property
    def max_bytes(self) -> float:
        """The largest peak of one place (what a cap per rank, per device or per process is compared with)."""
        return max(self.by.values(), default=0)


@dataclass(frozen=True)
class StepBounds:
    """A lower bound on a GPipe step: ``(m - 1)`` x the step plan's bound per micro-batch, plus one micro-batch's
    work through every partition.

    Attributes
    ----------
    period_s : float
        No step of this GPipe is shorter.
    binding : str
        What sets it.
    components : tuple of (str, float)
    """

    period_s: float
    binding: str
    components: Tuple[Tuple[str, float], ...] = ()

    def summary(self) -> str:
        lines = [f"lower bound {self.period_s * 1e3:.3f} ms/step, binding: {self.binding}"]
        lines += [f"  {name:<32} {v * 1e3:9.3f} ms" for name, v in self.components]
        return "\n".join(lines)


@dataclass(frozen=True)
class StepSearchReport:
    """What :func:`autosched.verbs.search` found for a GPipe: the fastest predicted step within the memory cap.

    Its fields are ``SearchReport``'s where they mean the same.

    Attributes
    ----------
    best : StepPrediction
        The step chosen (balance, chunks, checkpoint, schedule, prediction).
    candidates : tuple of StepPrediction
        Every configuration predicted, fastest first.
    max_memory_bytes : float or None
        The cap on the step's activation bytes.
    """

    best: Any
    candidates: Tuple[Any, ...] = field(repr=False, default=())
    max_memory_bytes: Optional[float] = None

    @property
    def period_s(self) -> float:
        """The chosen step's predicted time."""
        return self.best.step_s

    @property
    def lower_bound_s(self) -> float:
        """No step of the chosen configuration is shorter (:class:`StepBounds`)."""
        return self.best.bound_s

    @property
    def method(self) -> str:
        return "grid"

    @property
    def status(self) -> str:
        """``"OPTIMAL"`` when the chosen step reaches its bound, else ``"HEURISTIC"`` (the best of the grid tried)."""
        return "OPTIMAL" if self.best.step_s <= self.best.bound_s * (1 + 1e-9) else "HEURISTIC"

    @property
    def peak_bytes(self) -> float:
        return self.best.activation_bytes

    def summary(self) -> str:
        b = self.best
        cap = "" if self.max_memory_bytes is None else f" within {self.max_memory_bytes / 2**20:.2f} MiB"
        return (f"search (GPipe, {self.status}): step {b.step_s * 1e3:.3f} ms (bound {b.bound_s * 1e3:.3f}){cap}: "
                f"{b.schedule}, balance {list(b.balance)}, chunks {b.chunks}, checkpoint {b.checkpoint}, "
                f"activations {b.activation_bytes / 2**20:.2f} MiB; {len(self.candidates)} configurations predicted")
