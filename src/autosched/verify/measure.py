"""Measure plans on the engine: interleaved rounds, paired ratios against the simplest plan, racing, the table.

:func:`measure_plans` runs each plan (a bound :class:`PipelinePlan`) on
:class:`~swpipe_core.engine.pipeline.SWPipeline` for one short run per round, the plans
interleaved (slow drift in machine load then shifts every plan alike) in an
order that changes every round (:func:`shuffled`, seeded by the round: what one
run leaves behind, or a place in the round, does not fall on the same plan
every round), and returns a :class:`VerifyTable`: per plan its steady period in
each round, the median, the prediction if one was given and the model's error.

Measured period of one run (``_one_run``, the one place the engine is timed):
the retire times of ``progress()`` over the steady iterations (after a warm-up
quarter, at least ``depth`` iterations in, before the drain), averaged. A
plan's period is the median over the rounds.

Paired against the simplest plan: the table's *baseline* (the serial plan, or
the plan the caller names: the drop-in's TorchRec ``base``) runs in every
round. Each other plan's period is divided by the baseline's **in the same
round** (:func:`paired_ratio`), which cancels the machine's drift between
rounds; a plan's figure is the median of those ratios and their middle half
(interquartile range, :class:`PairedRatio`). A plan *beats* another
(:meth:`VerifyTable.beats`) when the upper quartile of its paired ratios is
below 1 (faster in the middle half of the rounds, so beyond the rounds' noise)
and the median is at least ``margin_pct`` below 1. :meth:`VerifyTable.choose`
returns the baseline unless some plan beats it; of those that do, the lowest
median ratio, or a known plan (:mod:`autosched.verify.candidates`: seeds, the
input plan) that one does not beat. A plan ahead only within the noise never
replaces the simplest one, nor a known one.

Noise band: ``noise_pct`` = the larger of ``noise_floor_pct`` and the median,
over the plans, of the width of their paired ratios' middle half (without a
baseline: of their own rounds' spread). Racing (``max_rounds``): after the
first rounds, the plan ahead of the baseline and those within the band of it,
and any plan that may still beat the baseline, run further rounds with the
baseline, up to ``max_rounds``: the first rounds picked the leader among many,
so its lead is confirmed on rounds that did not pick it, and measurement time
goes where the choice is in doubt.

Feedback: the serial plan's prediction is the sum of the task costs, so its
measured/predicted ratio (:attr:`VerifyTable.speed_factor`) is how fast the
machine runs the tasks now against when the costs were taken; the table also
reports every prediction rescaled by it. A uniform scale changes no ranking,
only the absolute figures.
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from swpipe_core.plan import PipelinePlan

from autosched.verify.predict import predicted_speedup, predicted_speedups

__all__ = ["VerifyOptions", "PlanMeasurement", "PairedRatio", "paired_ratio", "VerifyTable", "measure_plans", "turned",
           "shuffled", "within_band"]


@dataclass
class VerifyOptions:
    """How a search's answer is measured on the engine: rounds, run length, noise, device; what ``plan="auto"`` profiles.

    What the plan may be is :class:`~autosched.search.options.Constraints`'s; how the search runs,
    :class:`~autosched.search.options.SolverOptions`'s.

    Parameters
    ----------
    rounds : int
        Interleaved rounds; each plan runs once per round, the simplest plan in every round (the pairs).
    top : int
        Most searched plans measured (the search's pick first, then the
        other searchers' bests); the seeds, the input plan and the serial
        plan are measured on top of these.
    iterations : int, optional
        Batches per run (default: all the batches given, cycled up to 24 if fewer). ``swpipe.torchrec``'s
        ``plan="auto"`` also runs its serial cost measurement this long (default 24).
    noise_floor_pct : float
        The smallest noise band reported (timer and scheduler jitter).
    device : str or torch.device, optional
        Device the plans run on (``SWPipeline(plan, device=...)``; default ``"cpu"``). ``swpipe.torchrec``
        measures on the pipeline's device, and refuses another one here.
    max_rounds : int, optional
        Race the contenders: after ``rounds``, the plans whose median paired
        ratio is still within the noise band of the best one run more rounds
        (with the simplest plan), up to ``max_rounds`` in all (default
        ``2 * rounds``; ``rounds``: no extra round).
    keep_known : bool
        Keep the best known plan (the seeds, the input plan) unless the plan
        measured best beats it measurably
        (:meth:`~autosched.verify.measure.VerifyTable.beats`); False: the
        best median paired ratio wins. Either way a plan must beat the
        simplest plan to be chosen over it.
    margin_pct : float
        The least median gain, in percent, by which a plan beats another (on
        top of the middle half of its paired rounds being faster).
    profile_batches : int
        ``swpipe.torchrec``'s ``plan="auto"``: the first batches of the first pass it measures on (they are
        trained on afterwards, from the restored state). ``auto_schedule`` measures on the ``batches`` it is given.
    calibrate : bool
        ``swpipe.torchrec``'s ``plan="auto"``: measure the machine (the engine's cost per task, per hand-off and
        per period, the cores free) and search with it. ``auto_schedule`` uses the calibration its costs carry.

    Raises
    ------
    OptionError
        A field of the wrong type or out of range.

    Examples
    --------
    >>> from swpipe import VerifyOptions
    >>> VerifyOptions(rounds=7).top, VerifyOptions().rounds
    (3, 5)
    >>> VerifyOptions(rounds=0)
    Traceback (most recent call last):
    ...
    swpipe_core.engine.options.OptionError: VerifyOptions(rounds=0): expected an integer >= 1
    """

    rounds: int = 5
    top: int = 3
    iterations: Optional[int] = None
    noise_floor_pct: float = 2.0
    device: Any = None
    max_rounds: Optional[int] = None
    keep_known: bool = True
    margin_pct: float = 2.0
    profile_batches: int = 8
    calibrate: bool = True

    def __post_init__(self) -> None:
        from autosched._fields import check_fields, flag, integer, number, optional

        check_fields(self, {
            "rounds": integer(1), "top": integer(0), "iterations": optional(integer(2)),
            "noise_floor_pct": number(0), "max_rounds": optional(integer(self.rounds)), "keep_known": flag(),
            "margin_pct": number(0), "profile_batches": integer(2), "calibrate": flag(),
        })

    @property
    def last_round(self) -> int:
        """The most rounds a plan runs: ``max_rounds``, or ``2 * rounds`` when not given."""
        return self.max_rounds if self.max_rounds is not None else 2 * self.rounds


def _as_options(options: Union["VerifyOptions", int, None]) -> "VerifyOptions":
    """``measure_plans``' options: a number of rounds is that many rounds exactly (no racing)."""
    if isinstance(options, VerifyOptions):
        return options
    if options is None:
        return VerifyOptions()
    if isinstance(options, int) and not isinstance(options, bool) and options >= 1:
        return VerifyOptions(rounds=options, max_rounds=options)
    raise ValueError(f"rounds must be an integer >= 1 or a VerifyOptions, got {options!r}")


@dataclass
class PlanMeasurement:
    """One plan's measured periods (seconds per iteration), one per round.

    Examples
    --------
    >>> m = PlanMeasurement("auto", None, [0.010, 0.012, 0.011], predicted_s=0.0099)
    >>> round(m.period_s, 4), round(m.spread_pct, 1), round(m.error_pct, 1)
    (0.011, 18.2, -10.0)
    """

    label: str
    plan: Optional[PipelinePlan]
    rounds_s: List[float]
    predicted_s: Optional[float] = None
    round_ids: List[int] = field(default_factory=list)  # the round of each period (racing skips some); [] = 0, 1, ...

    def by_round(self) -> Dict[int, float]:
        """``{round: period}``: what pairs this plan's runs with another's run in the same round."""
        return dict(zip(self.round_ids or range(len(self.rounds_s)), self.rounds_s))

    @property
    def period_s(self) -> float:
        """Median measured period over the rounds."""
        return statistics.median(self.rounds_s)

    @property
    def spread_pct(self) -> float:
        """``100 * (slowest - fastest round) / median``: this plan's own round-to-round noise."""
        return 100.0 * (max(self.rounds_s) - min(self.rounds_s)) / self.period_s if self.period_s > 0 else 0.0

    @property
    def error_pct(self) -> Optional[float]:
        """``100 * (predicted - measured) / measured``, or ``None`` without a prediction."""
        if self.predicted_s is None or self.period_s <= 0:
            return None
        return 100.0 * (self.predicted_s - self.period_s) / self.period_s


@dataclass(frozen=True)
class PairedRatio:
    """One plan's period over another's, round by round in the rounds both ran: the median and the middle half.

    Attributes
    ----------
    label, over : str
        The plan measured, and the plan it is divided by.
    median : float
        Median over the paired rounds of ``period(label) / period(over)``: below 1 = faster.
    q1, q3 : float
        The quartiles of those ratios (the middle half of the rounds lies between them).
    rounds : int
        Rounds paired.

    Examples
    --------
    >>> r = PairedRatio("auto", "serial", median=0.8, q1=0.78, q3=0.82, rounds=7)
    >>> round(r.gain_pct, 1), round(r.iqr_pct, 1)
    (25.0, 5.0)
    """

    label: str
    over: str
    median: float
    q1: float
    q3: float
    rounds: int

    @property
    def gain_pct(self) -> float:
        """How much faster ``label`` ran than ``over``, in percent: ``100 * (1 / median - 1)``."""
        return 100.0 * (1.0 / self.median - 1.0) if self.median > 0 else math.inf

    @property
    def iqr_pct(self) -> float:
        """The width of the middle half, in percent of the median: the pairing's own noise."""
        return 100.0 * (self.q3 - self.q1) / self.median if self.median > 0 else 0.0

    def __str__(self) -> str:
        return f"x{self.median:.3f} [{self.q1:.3f}-{self.q3:.3f}]"


def paired_ratio(a: PlanMeasurement, b: PlanMeasurement) -> Optional[PairedRatio]:
    """``a``'s period over ``b``'s in each round both ran (:meth:`PlanMeasurement.by_round`): median and quartiles.

    Pairing by round cancels what the machine did between rounds (load, frequency): both runs of a pair saw the
    same spell of it. The quartiles are the inclusive ones (linear between the paired values).

    Returns
    -------
    PairedRatio or None
        ``None`` when no round holds both.

    Examples
    --------
    >>> a = PlanMeasurement("a", None, [0.009, 0.008, 0.010, 0.007])
    >>> b = PlanMeasurement("b", None, [0.010, 0.010, 0.010, 0.010])
    >>> r = paired_ratio(a, b)
    >>> r.median, round(r.q1, 3), round(r.q3, 3), r.rounds
    (0.85, 0.775, 0.925, 4)
    """
    pa, pb = a.by_round(), b.by_round()
    ratios = sorted(pa[k] / pb[k] for k in pa if k in pb and pb[k] > 0)
    if not ratios:
        return None
    q1, q3 = (ratios[0], ratios[0]) if len(ratios) == 1 else \
        (lambda q: (q[0], q[2]))(statistics.quantiles(ratios, n=4, method="inclusive"))
    return PairedRatio(a.label, b.label, statistics.median(ratios), q1, q3, len(ratios))


@dataclass
class VerifyTable:
    """Measured (and predicted) periods of several plans, measured side by side, and the choice among them.

    Attributes
    ----------
    baseline : str, optional
        The simplest plan, run in every round: every other plan is measured against it round by round
        (:meth:`paired`) and must beat it beyond the noise to be chosen. Default: ``"serial"`` when measured.
    known : tuple of str
        Plans kept unless measurably beaten (seeds, the input plan): see :meth:`choose`.
    margin_pct : float
        The least median gain, in percent, by which a plan beats another (:meth:`beats`).

    Examples
    --------
    >>> t = VerifyTable([PlanMeasurement("serial", None, [0.010, 0.011]),
    ...                  PlanMeasurement("auto", None, [0.006, 0.007], predicted_s=0.006)], rounds=2, iterations=20)
    >>> t.choose().label, round(t["serial"].period_s, 4), str(t.paired("auto"))
    ('auto', 0.0105, 'x0.618 [0.609-0.627]')
    >>> print(t.format().splitlines()[0])
    verified on the engine: 2 plans, 2 interleaved rounds of 20 iterations, each paired with serial's run in its round; noise band +-2.9%

    The serial plan measured 25 % slower than its prediction: the machine runs
    slower now than when the costs were taken, and the other predictions are
    rescaled by the same factor:

    >>> t = VerifyTable([PlanMeasurement("serial", None, [0.010], predicted_s=0.008),
    ...                  PlanMeasurement("auto", None, [0.0066], predicted_s=0.005)], rounds=1, iterations=20)
    >>> round(t.speed_factor, 2), round(t["auto"].error_pct, 1), round(t.rescaled_error_pct, 1)
    (1.25, -24.2, 5.3)
    """

    rows: List[PlanMeasurement]
    rounds: int
    iterations: int
    noise_floor_pct: float = 2.0
    load: Optional[float] = None
    notes: List[str] = field(default_factory=list)
    earlier: Optional["VerifyTable"] = None  # the measurement this one follows up (refit round), printed first
    known: Tuple[str, ...] = ()  # plans kept unless measurably beaten (seeds, the input plan): see choose()
    margin_pct: float = 2.0
    iterations_run: int = 0  # iterations of the user's tasks these measurements ran (warm-ups included)
    baseline: Optional[str] = None  # the simplest plan, paired with every other round by round; None: "serial"

    def __getitem__(self, label: str) -> PlanMeasurement:
        for r in self.rows:
            if r.label == label:
                return r
        raise KeyError(f"no measured plan {label!r}; measured: {[r.label for r in self.rows]}")

    def __contains__(self, label: str) -> bool:
        return any(r.label == label for r in self.rows)

    @property
    def baseline_row(self) -> Optional[PlanMeasurement]:
        """The simplest plan's row (``baseline``, else ``"serial"``), or ``None`` when it was not measured."""
        label = self.baseline or "serial"
        return self[label] if label in self else None

    def paired(self, label: str, over: Optional[str] = None) -> Optional[PairedRatio]:
        """``label``'s period over ``over``'s (default: the baseline's), round by round (:func:`paired_ratio`)."""
        other = self.baseline_row if over is None else self[over]
        return None if other is None else paired_ratio(self[label], other)

    @property
    def noise_pct(self) -> float:
        """The noise band in percent: ``max(noise_floor_pct, median noise of the plans)``.

        A plan's noise is the width of its paired ratios' middle half (:attr:`PairedRatio.iqr_pct`) when there is
        a baseline, else its own rounds' spread (:attr:`PlanMeasurement.spread_pct`).
        """
        base = self.baseline_row
        if base is not None:
            pairs = [self.paired(r.label) for r in self.rows if r is not base]
            spreads = [p.iqr_pct for p in pairs if p is not None and p.rounds > 1]
        else:
            spreads = [r.spread_pct for r in self.rows if len(r.rounds_s) > 1]
        return max(self.noise_floor_pct, statistics.median(spreads) if spreads else 0.0)

    @property
    def model_error_pct(self) -> Optional[float]:
        """Median |predicted - measured| / measured over the rows with a prediction, in percent."""
        errs = [abs(r.error_pct) for r in self.rows if r.error_pct is not None]
        return statistics.median(errs) if errs else None

    @property
    def speed_factor(self) -> Optional[float]:
        """The serial plan's measured over predicted period, or ``None`` without both.

        The serial plan's prediction is the sum of the tasks' costs, so this
        is how fast the machine runs the tasks now against when the costs were
        taken (load, frequency, caches), plus what the model leaves out of a
        serial period. Scaling every cost by it changes no ranking (a
        simulated period scales with its costs) but corrects the absolute
        predictions: measurement fed back into the model.
        """
        if "serial" not in self or self["serial"].predicted_s in (None, 0.0):
            return None
        return self["serial"].period_s / self["serial"].predicted_s

    def predicted_speedup(self, label: str) -> Optional[float]:
        """The model's speedup of ``label`` over the serial plan (:func:`predicted_speedup`), or ``None``."""
        return predicted_speedup({r.label: r.predicted_s for r in self.rows}, label)

    def predicted_speedups(self) -> Dict[str, float]:
        """Every measured plan's predicted speedup over serial, this table's or (refit) the earlier one's.

        A refit round measures only its plan, the earlier choice and the
        serial plan; the other plans keep the speedup the earlier table
        predicted. Each speedup is a ratio within one table (one model).

        Examples
        --------
        >>> first = VerifyTable([PlanMeasurement("serial", None, [0.01], predicted_s=0.009),
        ...                      PlanMeasurement("seed:a", None, [0.008], predicted_s=0.006)], 1, 20)
        >>> last = VerifyTable([PlanMeasurement("serial", None, [0.01], predicted_s=0.009),
        ...                     PlanMeasurement("refit", None, [0.007], predicted_s=0.0045)], 1, 20)
        >>> last.earlier = first
        >>> {k: round(v, 6) for k, v in last.predicted_speedups().items()}
        {'serial': 1.0, 'refit': 2.0, 'seed:a': 1.5}
        """
        out: Dict[str, float] = {}
        table: Optional[VerifyTable] = self
        while table is not None:
            own = predicted_speedups({r.label: r.predicted_s for r in table.rows})
            out.update({label: x for label, x in own.items() if label not in out})
            table = table.earlier
        return out

    @property
    def rescaled_error_pct(self) -> Optional[float]:
        """Median |speed_factor * predicted - measured| / measured over the other plans, in percent."""
        k = self.speed_factor
        errs = [abs(k * r.predicted_s - r.period_s) / r.period_s * 100.0 for r in self.rows
                if k is not None and r.label != "serial" and r.predicted_s is not None and r.period_s > 0]
        return statistics.median(errs) if errs else None

    def fastest(self) -> PlanMeasurement:
        """The row with the lowest median period (ties keep the earlier row)."""
        return min(self.rows, key=lambda r: r.period_s)

    def _rank(self, row: PlanMeasurement) -> float:
        """What orders plans: the median paired ratio over the baseline, or without one the median period."""
        pair = self.paired(row.label) if self.baseline_row is not None else None
        return pair.median if pair is not None else row.period_s

    def choose(self) -> PlanMeasurement:
        """The plan chosen: the baseline unless a plan :meth:`beats` it; of those, the best, or a known one it does
        not beat.

        With a baseline (the simplest plan) the plans that beat it, round by
        round beyond the noise, compete: the lowest median paired ratio wins,
        unless a known plan (a seed, the input plan: what the user would run
        without the search) among them is not beaten by it; of several such,
        the best is kept. Without a baseline every plan competes on its median
        period. So a plan faster only within this machine's noise never
        replaces the simplest plan, nor a known one.

        Examples
        --------
        >>> base = PlanMeasurement("seed:base", None, [0.0100, 0.0105, 0.0098, 0.0101, 0.0110])
        >>> noisy = PlanMeasurement("seed:fused", None, [0.0090, 0.0107, 0.0095, 0.0096, 0.0114])  # ahead in 3 of 5
        >>> t = VerifyTable([noisy, base], 5, 20, baseline="seed:base")
        >>> str(t.paired("seed:fused")), t.beats(noisy, base), t.choose().label
        ('x0.969 [0.950-1.019]', False, 'seed:base')
        >>> steady = PlanMeasurement("auto", None, [0.0095, 0.0099, 0.0093, 0.0096, 0.0104])   # ahead in 5 of 5
        >>> VerifyTable([steady, noisy, base], 5, 20, baseline="seed:base").choose().label
        'auto'
        """
        base = self.baseline_row
        if base is None:
            contenders = self.rows
        else:
            contenders = [r for r in self.rows if r is not base and self.beats(r, base)]
            if not contenders:
                return base
        best = min(contenders, key=self._rank)
        if best.label in self.known:
            return best
        kept = [r for r in contenders if r.label in self.known and not self.beats(best, r)]
        return min(kept, key=self._rank) if kept else best

    def verdict(self) -> str:
        """How :meth:`choose` decided, in a few words (for reports).

        Examples
        --------
        >>> seed = PlanMeasurement("seed:a", None, [0.0100, 0.0096, 0.0101])
        >>> auto = PlanMeasurement("auto", None, [0.0098, 0.0099, 0.0097])
        >>> VerifyTable([auto, seed], 3, 20).verdict()
        'measured fastest'
        >>> VerifyTable([auto, seed], 3, 20, known=("seed:a",)).verdict()
        'kept as a known plan (auto, the fastest median at 9.8 ms/it, does not beat it measurably)'
        >>> VerifyTable([auto, seed], 3, 20, baseline="seed:a").verdict()
        'the simplest plan (seed:a): no plan beat it beyond the noise (auto x0.980 [0.970-1.006] over 3 paired rounds)'
        """
        chosen, base = self.choose(), self.baseline_row
        if base is None:
            fastest = self.fastest()
            if chosen is fastest:
                return "measured fastest"
            return (f"kept as a known plan ({fastest.label}, the fastest median at {fastest.period_s * 1e3:.1f} ms/it, "
                    "does not beat it measurably)")
        others = [r for r in self.rows if r is not base]
        if chosen is base:
            if not others:
                return "the only plan measured"
            best = min(others, key=self._rank)
            pair = self.paired(best.label)
            return (f"the simplest plan ({base.label}): no plan beat it beyond the noise ({best.label} {pair} over "
                    f"{pair.rounds} paired rounds)")
        pair = self.paired(chosen.label)
        head = (f"beat the simplest plan ({base.label}) by {pair.gain_pct:.1f}% ({pair} over {pair.rounds} paired "
                "rounds)")
        best = min((r for r in others if self.beats(r, base)), key=self._rank)
        if chosen is not best:
            head += f"; kept as a known plan ({best.label}, {self.paired(best.label)}, does not beat it measurably)"
        return head

    def beats(self, a: PlanMeasurement, b: PlanMeasurement) -> bool:
        """Whether ``a`` ran measurably faster than ``b``: paired by round, beyond the noise and by the margin.

        The ratios ``a / b`` of the rounds both ran (:func:`paired_ratio`):
        their upper quartile is below 1 (``a`` was faster in the middle half
        of the rounds and more, so its lead is beyond the rounds' noise), and
        their median is at most ``1 - margin_pct / 100``. Pairing by round
        cancels the machine's drift between rounds; the quartile keeps a few
        lucky runs from deciding.

        Examples
        --------
        >>> a = PlanMeasurement("a", None, [0.0090, 0.0091, 0.0095])
        >>> b = PlanMeasurement("b", None, [0.0100, 0.0099, 0.0101])
        >>> t = VerifyTable([a, b], 3, 20)
        >>> t.beats(a, b), t.beats(b, a)
        (True, False)
        """
        pair = paired_ratio(a, b)
        return pair is not None and pair.q3 < 1.0 and pair.median <= 1.0 - self.margin_pct / 100.0

    def machine_limit(self, serial_label: str = "serial") -> Optional[str]:
        """One line when no plan beats the serial plan (:meth:`beats`), else ``None``."""
        if serial_label not in self:
            return None
        serial = self[serial_label]
        pairs = [p for p in (paired_ratio(r, serial) for r in self.rows if r is not serial) if p is not None]
        if not pairs:
            return None
        best = min(pairs, key=lambda p: p.median)
        if self.beats(self[best.label], serial):
            return None
        return (f"the machine is the limit: the best pipelined plan ({best.label}) runs x{1 / best.median:.2f} "
                f"the serial loop ({best.gain_pct:+.1f}%; paired {best}, not beyond the noise): the cores and "
                "the GIL free now give these tasks no measurable parallelism")

    def with_slowest(self, per_rank: Sequence[Dict[str, List[float]]]) -> "VerifyTable":
        """This table with each round's period the slowest rank's (``per_rank``: every rank's ``{label: rounds_s}``).

        Ranks that measured the same plans in lockstep (their collectives pair up) wait for the slowest at each
        collective, so the slowest rank's time of each round is the job's. Baseline, known plans and margin stay.

        Examples
        --------
        >>> t = VerifyTable([PlanMeasurement("serial", None, [0.010, 0.012])], 2, 20)
        >>> t.with_slowest([{"serial": [0.010, 0.012]}, {"serial": [0.011, 0.011]}])["serial"].rounds_s
        [0.011, 0.012]
        """
        rows = [PlanMeasurement(r.label, r.plan, [max(rank[r.label][k] for rank in per_rank)
                                                  for k in range(len(r.rounds_s))], r.predicted_s, list(r.round_ids))
                for r in self.rows]
        return VerifyTable(rows, self.rounds, self.iterations, self.noise_floor_pct, self.load, list(self.notes),
                           self.earlier, self.known, self.margin_pct, self.iterations_run, self.baseline)

    def format(self, indent: str = "") -> str:
        """The table: measured vs predicted per plan, paired ratio over the baseline, the noise band, the choice."""
        base = self.baseline_row
        paired = f", each paired with {base.label}'s run in its round" if base is not None else ""
        head = (f"verified on the engine: {len(self.rows)} plans, {self.rounds} interleaved rounds of "
                f"{self.iterations} iterations{paired}; noise band +-{self.noise_pct:.1f}%")
        if self.load is not None:
            head += f"; load average {self.load:.2f}"
        width = max([8, *(len(r.label) for r in self.rows)])
        over = f"/ {base.label} [IQR]" if base is not None else ""
        lines = [head, f"  {'plan':<{width}} {'measured':>11} {'predicted':>11} {'error':>7} {'spread':>7}  {over}"]
        chosen = self.choose()
        for r in self.rows:
            pred = "-" if r.predicted_s is None else f"{r.predicted_s * 1e3:.3f} ms"
            err = "-" if r.error_pct is None else f"{r.error_pct:+.1f}%"
            pair = self.paired(r.label) if base is not None and r is not base else None
            ratio = f"{pair} ({pair.rounds})" if pair is not None else ("baseline" if r is base else "")
            mark = "  <- chosen" if r is chosen else ""
            lines.append(f"  {r.label:<{width}} {r.period_s * 1e3:>8.3f} ms {pred:>11} {err:>7} "
                         f"{r.spread_pct:>6.1f}%  {ratio}{mark}")
        lines.append(f"  chosen: {chosen.label} ({self.verdict()})")
        if self.model_error_pct is not None:
            lines.append(f"  model error: median |predicted - measured| {self.model_error_pct:.1f}%")
        if self.rescaled_error_pct is not None:
            lines.append(f"  rescaled by the serial plan (measured/predicted x{self.speed_factor:.2f}): median "
                         f"|error| {self.rescaled_error_pct:.1f}% over the other plans")
        limit = self.machine_limit()
        if limit:
            lines.append(f"  {limit}")
        lines += [f"  note: {n}" for n in self.notes]
        if self.earlier is not None:
            lines = self.earlier.format().splitlines() + ["then " + lines[0]] + lines[1:]
        return "\n".join(indent + line for line in lines)

    def __str__(self) -> str:
        return self.format()


def _one_run(plan: PipelinePlan, batches: Sequence[Any], device: Any) -> float:
    """One engine run; the mean spacing of retirements over the steady iterations (seconds per iteration)."""
    from swpipe_core.engine.pipeline import SWPipeline

    n = len(batches)
    depth = plan.pipeline_depth
    stamps: List[float] = []
    gc.collect()  # the garbage of earlier runs is not this run's to collect
    with SWPipeline(plan, device=device) as pipe:
        t0 = time.perf_counter()
        it = pipe.fill_pipeline(batches)
        while True:
            try:
                pipe.progress(it)
            except StopIteration:
                break
            stamps.append(time.perf_counter())
    w1 = n - depth  # iteration n - depth retires when the last full period is enqueued (then the drain starts)
    w0 = min(max(depth, n // 4), max(0, w1 - 1))
    if w1 > w0:
        return (stamps[w1] - stamps[w0]) / (w1 - w0)
    return (stamps[-1] - t0) / max(1, n)


def measure_plans(plans: Union[Sequence[Tuple[str, PipelinePlan]], Dict[str, PipelinePlan]], batches: Sequence[Any],
                  options: Union[VerifyOptions, int, None] = None, *, predicted: Optional[Dict[str, float]] = None,
                  known: Sequence[str] = (), baseline: Optional[str] = None, warmup: bool = True) -> VerifyTable:
    """Run plans on the engine in interleaved rounds and tabulate their measured periods, paired by round.

    Parameters
    ----------
    plans : dict or list of (label, PipelinePlan)
        Bound plans (every task has a function), measured in this order in the
        first round; round ``r`` starts ``r`` plans further on.
    batches : sequence
        The batches of one run (a list: every run reuses it). At least 2.
    options : VerifyOptions or int, optional
        ``rounds``, ``max_rounds`` (racing: after ``rounds`` rounds, the plans
        whose median paired ratio is within the noise band of the best run
        further rounds with the baseline, until one is left or they have run
        ``max_rounds``), ``noise_floor_pct``, ``margin_pct`` and ``device``
        (the others are the search's). An int is that many rounds exactly, no
        racing: ranks measuring in lockstep must all decide alike, and their
        times differ. Default ``VerifyOptions()``.
    predicted : dict, optional
        ``{label: predicted period in seconds}`` (e.g. the simulator's).
    known : sequence of str
        Labels of plans the table keeps unless measurably beaten
        (:meth:`VerifyTable.choose`): seeds, the input plan.
    baseline : str, optional
        The label of the simplest plan, which every other must beat round by
        round (default: ``"serial"`` when measured).
    warmup : bool
        One untimed short run per plan first (first-call costs, caches).

    Returns
    -------
    VerifyTable

    Raises
    ------
    ValueError
        No plan, a repeated label, fewer than 2 batches, a baseline not among the plans, bad ``options``.
    swpipe_core.validate.PlanError
        A plan has unbound tasks or breaks a rule.
    swpipe_core.engine.pipeline.PipelineTaskError
        A task failed while measuring (the engine's own report).

    Examples
    --------
    >>> import time
    >>> from swpipe import PipelinePlan, PipelineTask, TaskSchedule
    >>> from autosched.verify.candidates import serial_plan
    >>> a, b = PipelineTask("A", lambda ctx: time.sleep(0.001)), PipelineTask("B", lambda ctx: time.sleep(0.001))
    >>> two = PipelinePlan({a: TaskSchedule(0, thread_group="x"), b: TaskSchedule(1, thread_group="y")},
    ...                    intra_iter_deps=[(b, a)])
    >>> t = measure_plans({"two": two, "serial": serial_plan(two)}, list(range(10)), 1)
    >>> [r.label for r in t.rows], len(t["two"].rounds_s), t.baseline_row.label, t.paired("two").rounds
    (['two', 'serial'], 1, 'serial', 1)
    """
    opts = _as_options(options)
    items = list(plans.items()) if isinstance(plans, dict) else [(str(k), p) for k, p in plans]
    labels = [k for k, _ in items]
    if not items:
        raise ValueError("measure_plans needs at least one (label, plan)")
    if len(set(labels)) != len(labels):
        raise ValueError(f"plan labels repeat: {labels}; give each plan its own label")
    if baseline is not None and baseline not in labels:
        raise ValueError(f"baseline={baseline!r} is not among the plans measured: {labels}")
    batches = list(batches)
    if len(batches) < 2:
        raise ValueError(f"measure_plans needs at least 2 batches per run, got {len(batches)}")
    device = opts.device if opts.device is not None else "cpu"
    if warmup:
        short = batches[: max(2, min(len(batches), 8))]
        for _, plan in items:
            _one_run(plan, short, device)
    got: Dict[str, List[float]] = {k: [] for k in labels}
    ids: Dict[str, List[int]] = {k: [] for k in labels}
    for r in range(opts.rounds):
        _one_round(items, r, got, ids, batches, device)
    predicted = predicted or {}
    table = VerifyTable([PlanMeasurement(label, plan, got[label], predicted.get(label), ids[label])
                         for label, plan in items], opts.rounds, len(batches), opts.noise_floor_pct, _load(),
                        known=tuple(k for k in known if k in labels), margin_pct=opts.margin_pct, baseline=baseline)
    extra = 0
    for r in range(opts.rounds, opts.last_round):
        contenders = _contenders(table)
        if not contenders:
            break
        _one_round([(c.label, c.plan) for c in contenders], r, got, ids, batches, device)
        extra += 1
    if extra:
        table.notes.append(f"{extra} extra round(s) for the plans within the noise band of the best "
                           f"({'; '.join(c.label for c in table.rows if len(c.rounds_s) > opts.rounds)})")
        table.load = _load()
    warm = len(short) * len(items) if warmup else 0
    table.iterations_run = warm + len(batches) * sum(len(v) for v in got.values())
    return table


def turned(items: Sequence[Any], r: int) -> List[Any]:
    """Round ``r``'s order: ``items`` started ``r`` places further on.

    Slow drift of the machine then shifts every plan alike, and no plan
    always runs last in a round.

    Examples
    --------
    >>> turned("abc", 0), turned("abc", 1), turned("abc", 4)
    (['a', 'b', 'c'], ['b', 'c', 'a'], ['b', 'c', 'a'])
    """
    k = r % max(1, len(items))
    return [*items[k:], *items[:k]]


def within_band(periods: Dict[str, float], band_pct: float) -> List[str]:
    """The labels whose period is within ``band_pct`` percent of the fastest one's (the contenders of a race).

    Examples
    --------
    >>> within_band({"a": 10.0, "b": 10.5, "c": 12.0}, 10.0)
    ['a', 'b']
    """
    if not periods:
        return []
    fastest = min(periods.values())
    return [label for label, p in periods.items() if p <= fastest * (1.0 + band_pct / 100.0)]


def shuffled(items: Sequence[Any], r: int) -> List[Any]:
    """Round ``r``'s order in a verification: ``items`` as given in round 0, then shuffled by a generator seeded
    with ``r`` (the same order on every call, every rank, every run).

    Across rounds each plan runs after different plans and at different places, so what a run leaves behind (the
    previous plan's garbage, caches, threads winding down) or a place in the round does not fall on the same plan
    every round, as it would in :func:`turned`'s cyclic order.

    Examples
    --------
    >>> shuffled("abcd", 0), shuffled("abcd", 1) == shuffled("abcd", 1), sorted(shuffled("abcd", 5))
    (['a', 'b', 'c', 'd'], True, ['a', 'b', 'c', 'd'])
    """
    return list(items) if r == 0 else random.Random(r).sample(list(items), len(items))


def _one_round(items: Sequence[Tuple[str, PipelinePlan]], r: int, got: Dict[str, List[float]],
               ids: Dict[str, List[int]], batches: Sequence[Any], device: Any) -> None:
    """Every plan once, in round ``r``'s order (:func:`shuffled`)."""
    for label, plan in shuffled(items, r):
        got[label].append(_one_run(plan, batches, device))
        ids[label].append(r)


def _contenders(table: VerifyTable) -> List[PlanMeasurement]:
    """The rows a further round is for, or ``[]`` when the choice is settled.

    With a baseline: while some plan's median paired ratio is below 1, it and the plans within the noise band of
    it race on, so a plan replaces the simplest one only on all the rounds ``max_rounds`` allows (the first rounds
    picked it among many: its lead is confirmed on rounds that did not pick it); plans that may still beat the
    baseline (the lower quartile of their ratios below 1, not beating it yet) race too. The baseline runs with
    them, as their pair. Without a baseline: the plans within the band of the fastest median period, while two or
    more are left.
    """
    base = table.baseline_row
    if base is None:
        near = set(within_band({r.label: r.period_s for r in table.rows}, table.noise_pct))
        rows = [r for r in table.rows if r.label in near]
        return rows if len(rows) > 1 else []
    others = [r for r in table.rows if r is not base]
    if not others:
        return []
    ranks = {r.label: table._rank(r) for r in others}
    best = min(ranks.values())
    near = set(within_band({**ranks, base.label: 1.0}, table.noise_pct))
    undecided = {r.label for r in others if not table.beats(r, base) and table.paired(r.label).q1 < 1.0}
    racing = [r for r in others if (best < 1.0 and r.label in near) or r.label in undecided]
    return racing + [base] if racing else []


def _load() -> Optional[float]:
    try:
        import os

        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
