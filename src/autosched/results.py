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

Which prediction is *fastest* is one rule, :func:`fastest_first` (and :func:`fastest`): the least predicted step;
steps within :data:`STEP_TIE` of it are a tie, won by the lower predicted peak, then by the smaller configuration
(fewer stages, then fewer micro-batches). ``compare``, ``pp_compare``'s best, the pipeline-parallel search's choice
and ``swpipe pp``'s "predicted fastest" all rank by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import (Any, Callable, Dict, Hashable, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Protocol,
                    Tuple, TypeVar, runtime_checkable)

__all__ = ["Prediction", "PeakBytes", "StepBounds", "StepSearchReport", "Preference", "STEP_TIE", "fastest_first",
           "fastest", "pp_preference"]

T = TypeVar("T")

#: Predicted steps within this share of the fastest are a tie (a prediction's error is several times more): the
#: lower predicted peak wins it, then the smaller configuration.
STEP_TIE = 0.01


class Preference(NamedTuple):
    """What ranks one prediction (:func:`fastest_first`): its step, and on a tie its peak, then its size.

    Attributes
    ----------
    step_s : float
        The predicted step (or period), seconds.
    peak_bytes : float
        The predicted peak (the fullest rank's, partition's or process's).
    size : tuple
        Fewer is simpler: e.g. ``(n_stages, n_microbatches)`` of a pipeline-parallel schedule.
    """

    step_s: float
    peak_bytes: float
    size: Tuple[Any, ...] = ()


def pp_preference(step_s: float, peak_bytes: float, n_stages: int, n_microbatches: int) -> Preference:
    """A pipeline-parallel schedule's :class:`Preference`: fewer stages, then fewer micro-batches, is the smaller.

    Examples
    --------
    >>> pp_preference(0.0336, 4_700_000, 2, 4)
    Preference(step_s=0.0336, peak_bytes=4700000, size=(2, 4))
    """
    return Preference(step_s, peak_bytes, (n_stages, n_microbatches))


def fastest_first(items: Iterable[T], key: Callable[[T], Preference], tolerance: float = STEP_TIE) -> List[T]:
    """``items`` in the order to prefer them: the least predicted step first, a tie won by the lower peak, then size.

    Each time, the fastest step left and every step within ``tolerance`` (relative) of it are a tie: the one with the
    least ``peak_bytes`` comes next, then the smaller ``size``, then the faster step, then the earlier item.

    Parameters
    ----------
    items : iterable
    key : callable
        An item's :class:`Preference`.
    tolerance : float
        Steps this share above the fastest left tie with it (:data:`STEP_TIE`); 0: only equal steps tie.

    Returns
    -------
    list
        The items, preferred first.

    Raises
    ------
    ValueError
        ``tolerance`` not a finite number >= 0.

    Examples
    --------
    GPipe and 1F1B predicted within 0.5 % of each other: 1F1B holds a third of the memory, so it comes first.

    >>> rows = {"GPipe": Preference(0.03356, 14_000_000, (2, 4)), "1F1B": Preference(0.03360, 4_700_000, (2, 4)),
    ...         "Interleaved1F1B": Preference(0.0414, 6_800_000, (4, 4))}
    >>> fastest_first(rows, key=rows.get)
    ['1F1B', 'GPipe', 'Interleaved1F1B']
    >>> fastest_first(rows, key=rows.get, tolerance=0.0)  # only equal steps tie
    ['GPipe', '1F1B', 'Interleaved1F1B']
    """
    _check_tolerance("fastest_first", tolerance)
    rest = [(key(item), k, item) for k, item in enumerate(items)]
    out: List[T] = []
    while rest:
        chosen = _first(rest, tolerance)
        rest.remove(chosen)
        out.append(chosen[2])
    return out


def _check_tolerance(verb: str, tolerance: float) -> None:
    if not (isinstance(tolerance, (int, float)) and 0 <= tolerance < float("inf")):
        raise ValueError(f"{verb}: tolerance={tolerance!r}: give a share >= 0 (e.g. {STEP_TIE})")


def _first(entries: List[Tuple[Preference, int, Any]], tolerance: float) -> Tuple[Preference, int, Any]:
    """Of ``(preference, position, item)`` entries, the one preferred (:func:`fastest_first`'s rule)."""
    least = min(p.step_s for p, _, _ in entries)
    tied = [e for e in entries if e[0].step_s <= least + tolerance * abs(least)]
    return min(tied, key=lambda e: (e[0].peak_bytes, e[0].size, e[0].step_s, e[1]))


def fastest(items: Iterable[T], key: Callable[[T], Preference], tolerance: float = STEP_TIE) -> T:
    """The item :func:`fastest_first` puts first.

    Raises
    ------
    ValueError
        No items, or ``tolerance`` not a finite number >= 0.

    Examples
    --------
    >>> fastest([(1.0, 100), (1.005, 40), (0.9, 500)], key=lambda r: Preference(*r))
    (0.9, 500)
    >>> fastest([(1.0, 100), (1.005, 40)], key=lambda r: Preference(*r))
    (1.005, 40)
    """
    _check_tolerance("fastest", tolerance)
    entries = [(key(item), k, item) for k, item in enumerate(items)]
    if not entries:
        raise ValueError("fastest: no items to choose from")
    return _first(entries, tolerance)[2]


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
