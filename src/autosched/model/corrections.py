"""Corrections to a prediction, applied only where they predict held-out measured steps better than without them.

A correction (the co-run slowdown of partitions that run at once, an
action's overhead, contention for a link) is a model of something a plain
prediction leaves out. It is fitted from its own measurement (two
arrangements of the same tasks, say), and fitting it says nothing about
whether it brings the prediction of a real step closer: on a U-Net
(issue 47) GPipe's co-run slowdown took the predicted step from -18 %..+5 %
of the measured one to +18 %..+103 %. So a correction is checked against
measured steps that did not fit it (held out), one key at a time (a
micro-batch size, a configuration), and kept only where its error is the
smaller: :func:`decide_corrections` is that rule, in one place, for every
path that predicts with a correction (:func:`swpipe.gpipe.corun.check_slowdown`
calls it). A key with no held-out step keeps the plain prediction: a
correction nothing has checked is not applied.

The error of a prediction on a key is the median over its held-out steps of
``|predicted / measured - 1|``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Dict, Hashable, Iterable, List, Optional

__all__ = ["HeldOutStep", "CorrectionDecision", "CorrectionCheckError", "REASONS", "decide_corrections",
           "decisions_line", "prediction_error"]

#: Why a correction was or was not applied on a key: its error on the held-out steps was smaller ("closer"), larger
#: ("farther") or the same ("tie": the plain prediction is kept), or no held-out step had the key.
REASONS = ("closer", "farther", "tie", "no-held-out-steps")


class CorrectionCheckError(ValueError):
    """A held-out step that cannot judge a correction: ``field`` of the step with ``key`` is ``value``."""

    def __init__(self, field: str, key: Hashable, value: Any, expected: str) -> None:
        self.field, self.key, self.value, self.expected = field, key, value, expected
        super().__init__(f"held-out step of key {key!r}: {field}={value!r}, expected {expected} "
                         "(give the step's measured seconds and both predictions of it)")


@dataclass(frozen=True)
class HeldOutStep:
    """One measured step that did not fit the correction, and its two predictions.

    Attributes
    ----------
    key : hashable
        What the correction is decided for (a micro-batch size, a configuration).
    without_s, with_s : float
        The step predicted without and with the correction, seconds.
    measured_s : float
        The step measured, seconds (> 0).
    """

    key: Hashable
    without_s: float
    with_s: float
    measured_s: float

    def __post_init__(self) -> None:
        for name in ("without_s", "with_s", "measured_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0 or (name == "measured_s" and value == 0):
                raise CorrectionCheckError(name, self.key, value, "> 0 seconds" if name == "measured_s"
                                           else ">= 0 seconds")


@dataclass(frozen=True)
class CorrectionDecision:
    """Whether a correction is applied on one key, and why.

    Attributes
    ----------
    correction : str
        Its name (``"co-run slowdown"``).
    key : hashable
    applied : bool
    reason : str
        One of :data:`REASONS`.
    error_without, error_with : float or None
        The median ``|predicted / measured - 1|`` over the key's held-out steps; ``None`` without any.
    steps : int
        Held-out steps that judged it.
    """

    correction: str
    key: Hashable
    applied: bool
    reason: str
    error_without: Optional[float] = None
    error_with: Optional[float] = None
    steps: int = 0

    @property
    def detail(self) -> str:
        """Why, in brackets: the reason unless it is "closer", and the errors where there were held-out steps."""
        if self.error_without is None or self.error_with is None:
            return f"({self.reason})"
        why = "" if self.reason == "closer" else f"{self.reason}: "
        return f"({why}error {self.error_without:.1%} -> {self.error_with:.1%} on {self.steps} held-out steps)"

    def describe(self) -> str:
        """One line: the key, applied or not, and the errors that decided it.

        Examples
        --------
        >>> CorrectionDecision("co-run slowdown", 8, True, "closer", 0.2, 0.05, 3).describe()
        'co-run slowdown at 8: applied (error 20.0% -> 5.0% on 3 held-out steps)'
        >>> CorrectionDecision("co-run slowdown", 16, False, "no-held-out-steps").describe()
        'co-run slowdown at 16: not applied (no-held-out-steps)'
        """
        return f"{self.correction} at {self.key}: {'applied' if self.applied else 'not applied'} {self.detail}"


def prediction_error(predicted: Iterable[float], measured: Iterable[float]) -> float:
    """The median ``|predicted / measured - 1|`` over pairs: the error every correction is judged by.

    Examples
    --------
    >>> prediction_error([1.1, 0.8, 1.0], [1.0, 1.0, 1.0])
    0.10000000000000009
    """
    return statistics.median(abs(p / m - 1.0) for p, m in zip(predicted, measured))


def decide_corrections(correction: str, steps: Iterable[HeldOutStep], keys: Iterable[Hashable] = ()
                       ) -> Dict[Hashable, CorrectionDecision]:
    """Per key, apply ``correction`` only if it predicts the key's held-out measured steps better than without it.

    Parameters
    ----------
    correction : str
        The correction's name, carried into each decision.
    steps : iterable of HeldOutStep
        Measured steps that did not fit the correction, each with its predictions without and with it.
    keys : iterable of hashable
        Keys to decide even where no step has them (decided "not applied", reason ``"no-held-out-steps"``).

    Returns
    -------
    dict
        ``{key: CorrectionDecision}`` for every key of ``steps`` and ``keys``. Applied exactly where the median
        error with the correction is smaller than without it; a tie (equal up to rounding) keeps the plain
        prediction.

    Examples
    --------
    Micro-batch 8: the correction brings 0.10 s predictions of a 0.12 s step to 0.118 s; at 16 it overshoots.

    >>> steps = [HeldOutStep(8, 0.10, 0.118, 0.12), HeldOutStep(16, 0.20, 0.30, 0.19)]
    >>> got = decide_corrections("co-run slowdown", steps, keys=[32])
    >>> [(k, d.applied, d.reason) for k, d in got.items()]
    [(8, True, 'closer'), (16, False, 'farther'), (32, False, 'no-held-out-steps')]
    """
    by: Dict[Hashable, List[HeldOutStep]] = {}
    for step in steps:
        if not isinstance(step, HeldOutStep):
            raise CorrectionCheckError("step", None, step, "a HeldOutStep")
        by.setdefault(step.key, []).append(step)
    for key in keys:
        by.setdefault(key, [])
    out = {}
    for key, held in by.items():
        if not held:
            out[key] = CorrectionDecision(correction, key, False, "no-held-out-steps")
            continue
        measured = [s.measured_s for s in held]
        without = prediction_error([s.without_s for s in held], measured)
        with_ = prediction_error([s.with_s for s in held], measured)
        # equal up to rounding (0.9 and 1.1 s of a 1.0 s step) is a tie: the plain prediction is kept
        reason = "tie" if math.isclose(with_, without, rel_tol=1e-9, abs_tol=1e-12) \
            else "closer" if with_ < without else "farther"
        out[key] = CorrectionDecision(correction, key, reason == "closer", reason, without, with_, len(held))
    return out


def decisions_line(decisions: Iterable[CorrectionDecision]) -> str:
    """The decisions as one summary line, applied keys first.

    Examples
    --------
    >>> d = decide_corrections("co-run slowdown", [HeldOutStep(4, 1.0, 1.1, 1.1), HeldOutStep(2, 1.0, 1.5, 1.0)])
    >>> for part in decisions_line(d.values()).split("; "):
    ...     print(part)
    co-run slowdown applied at 4 (error 9.1% -> 0.0% on 1 held-out steps)
    not applied at 2 (farther: error 0.0% -> 50.0% on 1 held-out steps)
    """
    decisions = list(decisions)
    parts = []
    for applied in (True, False):
        items = [f"{d.key} {d.detail}" for d in decisions if d.applied is applied]
        if items:
            parts.append(("applied at " if applied else "not applied at ") + ", ".join(items))
    name = decisions[0].correction if decisions else "correction"
    return f"{name} " + "; ".join(parts) if parts else f"{name}: nothing decided"
