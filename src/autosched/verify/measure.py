"""Measure plans on the engine: interleaved rounds, racing, the noise band, the table of what was measured.

:func:`measure_plans` runs each plan (a bound :class:`PipelinePlan`) on
:class:`~swpipe_core.engine.pipeline.SWPipeline` for one short run per round, the plans
interleaved and their order rotated every round (:func:`turned`: slow drift in
machine load then shifts every plan alike), and returns a :class:`VerifyTable`:
per plan its steady period in each round, the median, the prediction if one was
given and the model's error.

Measured period of one run (``_one_run``, the one place the engine is timed):
the retire times of ``progress()`` over the steady iterations (after a warm-up
quarter, at least ``depth`` iterations in, before the drain), averaged. A
plan's period is the median over the rounds.

Noise band: ``noise_pct`` = the larger of ``noise_floor_pct`` and the median,
over the plans, of ``(slowest round - fastest round) / median``. Two plans
whose periods differ by less than the band are a tie as far as this machine
can tell. :meth:`VerifyTable.choose` returns the plan with the lowest median
period, or a known plan (:mod:`autosched.verify.candidates`) that plan does not
measurably beat: faster in at least 80 % of the rounds both ran, and by at
least ``margin_pct`` (3 %) in the median of their per-round ratios
(:meth:`VerifyTable.beats`). A plan ahead only within the machine's noise then
never replaces a known one.

Racing (``max_rounds``): after the first rounds, the plans still within the
noise band of the fastest (:func:`within_band`) run further rounds among
themselves, so measurement time goes where the ranking is in doubt.

Feedback: the serial plan's prediction is the sum of the task costs, so its
measured/predicted ratio (:attr:`VerifyTable.speed_factor`) is how fast the
machine runs the tasks now against when the costs were taken; the table also
reports every prediction rescaled by it. A uniform scale changes no ranking,
only the absolute figures.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from swpipe_core.plan import PipelinePlan

from autosched.verify.predict import predicted_speedup, predicted_speedups

__all__ = ["PlanMeasurement", "VerifyTable", "measure_plans", "turned", "within_band"]


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


@dataclass
class VerifyTable:
    """Measured (and predicted) periods of several plans, measured side by side.

    Examples
    --------
    >>> t = VerifyTable([PlanMeasurement("serial", None, [0.010, 0.010]),
    ...                  PlanMeasurement("auto", None, [0.006, 0.007], predicted_s=0.006)], rounds=2, iterations=20)
    >>> t.choose().label, t["serial"].period_s
    ('auto', 0.01)
    >>> print(t.format().splitlines()[0])
    verified on the engine: 2 plans, 2 interleaved rounds of 20 iterations; noise band +-7.7%

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
    margin_pct: float = 3.0
    iterations_run: int = 0  # iterations of the user's tasks these measurements ran (warm-ups included)

    def __getitem__(self, label: str) -> PlanMeasurement:
        for r in self.rows:
            if r.label == label:
                return r
        raise KeyError(f"no measured plan {label!r}; measured: {[r.label for r in self.rows]}")

    def __contains__(self, label: str) -> bool:
        return any(r.label == label for r in self.rows)

    @property
    def noise_pct(self) -> float:
        """The noise band in percent: ``max(noise_floor_pct, median spread of the plans' rounds)``."""
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

    def choose(self) -> PlanMeasurement:
        """The row measured fastest (lowest median period; ties keep the earlier row), or a known plan it does not beat.

        A plan named in ``known`` (a seed, the input plan: what the user
        would run without the search) is kept unless the fastest row
        :meth:`beats` it; of several such, the fastest. So a plan that is
        faster only within this machine's noise never replaces a known one.

        Examples
        --------
        >>> seed = PlanMeasurement("seed:a", None, [0.0100, 0.0096, 0.0101])
        >>> auto = PlanMeasurement("auto", None, [0.0098, 0.0099, 0.0097])   # faster in 2 of 3 rounds
        >>> VerifyTable([auto, seed], 3, 20).choose().label
        'auto'
        >>> VerifyTable([auto, seed], 3, 20, known=("seed:a",)).choose().label
        'seed:a'
        """
        fastest = self.fastest()
        if fastest.label in self.known:
            return fastest
        kept = [r for r in self.rows if r.label in self.known and not self.beats(fastest, r)]
        return min(kept, key=lambda r: r.period_s) if kept else fastest

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
        """
        fastest = self.fastest()
        if self.choose() is fastest:
            return "measured fastest"
        return (f"kept as a known plan ({fastest.label}, the fastest median at {fastest.period_s * 1e3:.1f} ms/it, "
                "does not beat it measurably)")

    def beats(self, a: PlanMeasurement, b: PlanMeasurement) -> bool:
        """Whether ``a`` ran measurably faster than ``b``: paired by round, in both senses.

        ``a`` was faster in at least 80 % of the rounds both ran (all of them
        up to four), and the median over those rounds of ``b``'s period over
        ``a``'s is at least ``1 + margin_pct / 100``. Pairing by round cancels
        the machine's drift between rounds; asking for most rounds, not the
        median alone, keeps one lucky run from deciding.

        Examples
        --------
        >>> a = PlanMeasurement("a", None, [0.0090, 0.0091, 0.0095])
        >>> b = PlanMeasurement("b", None, [0.0100, 0.0099, 0.0101])
        >>> t = VerifyTable([a, b], 3, 20)
        >>> t.beats(a, b), t.beats(b, a)
        (True, False)
        """
        pa, pb = a.by_round(), b.by_round()
        common = [k for k in pa if k in pb and pa[k] > 0]
        if not common:
            return False
        ratios = [pb[k] / pa[k] for k in common]
        wins = sum(r > 1.0 for r in ratios)
        return wins >= math.ceil(0.8 * len(common)) and statistics.median(ratios) >= 1.0 + self.margin_pct / 100.0

    def machine_limit(self, serial_label: str = "serial") -> Optional[str]:
        """One line when no plan beats the serial plan by more than the noise band, else ``None``."""
        if serial_label not in self:
            return None
        serial = self[serial_label].period_s
        best = min((r for r in self.rows if r.label != serial_label), key=lambda r: r.period_s, default=None)
        if best is None or serial <= 0:
            return None
        gain = 100.0 * (serial / best.period_s - 1.0)
        if gain > self.noise_pct:
            return None
        return (f"the machine is the limit: the best pipelined plan ({best.label}) runs x{serial / best.period_s:.2f} "
                f"the serial loop ({gain:+.1f}%, not beyond the noise band +-{self.noise_pct:.1f}%): the cores and "
                "the GIL free now give these tasks no measurable parallelism")

    def format(self, indent: str = "") -> str:
        """The table: measured vs predicted per plan, the model's error, the noise band, the choice."""
        head = (f"verified on the engine: {len(self.rows)} plans, {self.rounds} interleaved rounds of "
                f"{self.iterations} iterations; noise band +-{self.noise_pct:.1f}%")
        if self.load is not None:
            head += f"; load average {self.load:.2f}"
        width = max([8, *(len(r.label) for r in self.rows)])
        lines = [head, f"  {'plan':<{width}} {'measured':>11} {'predicted':>11} {'error':>7} {'spread':>7}"]
        chosen = self.choose()
        for r in self.rows:
            pred = "-" if r.predicted_s is None else f"{r.predicted_s * 1e3:.3f} ms"
            err = "-" if r.error_pct is None else f"{r.error_pct:+.1f}%"
            mark = "  <- chosen" if r is chosen else ""
            lines.append(f"  {r.label:<{width}} {r.period_s * 1e3:>8.3f} ms {pred:>11} {err:>7} "
                         f"{r.spread_pct:>6.1f}%{mark}")
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
                  rounds: int = 3, *, predicted: Optional[Dict[str, float]] = None, device: Any = "cpu",
                  noise_floor_pct: float = 2.0, warmup: bool = True, max_rounds: Optional[int] = None,
                  known: Sequence[str] = (), margin_pct: float = 3.0) -> VerifyTable:
    """Run plans on the engine in interleaved rounds and tabulate their measured periods.

    Parameters
    ----------
    plans : dict or list of (label, PipelinePlan)
        Bound plans (every task has a function), measured in this order in the
        first round; round ``r`` starts ``r`` plans further on.
    batches : sequence
        The batches of one run (a list: every run reuses it). At least 2.
    rounds : int
        Runs per plan (>= 1).
    predicted : dict, optional
        ``{label: predicted period in seconds}`` (e.g. the simulator's).
    device : str or int
        Passed to ``SWPipeline``.
    noise_floor_pct : float
        Smallest noise band reported.
    warmup : bool
        One untimed short run per plan first (first-call costs, caches).
    max_rounds : int, optional
        Race: after ``rounds`` rounds, the contenders (plans whose median is
        within the noise band of the fastest median) run further rounds,
        interleaved among themselves, until one is left or they have run
        ``max_rounds`` rounds. Measurement time goes where the ranking is in
        doubt. Default: no extra round. Every caller must decide alike, so
        ranks measuring in lockstep leave it off (their times differ).
    known : sequence of str
        Labels of plans the table keeps unless measurably beaten
        (:meth:`VerifyTable.choose`): seeds, the input plan.
    margin_pct : float
        The median gain, in percent, by which another plan must beat a known one.

    Returns
    -------
    VerifyTable

    Raises
    ------
    ValueError
        No plan, a repeated label, fewer than 2 batches, ``rounds < 1`` or ``max_rounds < rounds``.
    swpipe_core.validate.PlanError
        A plan has unbound tasks or breaks a rule.
    swpipe_core.engine.pipeline.PipelineTaskError
        A task failed while measuring (the engine's own report).

    Examples
    --------
    >>> import time
    >>> from swpipe_core.plan import PipelineTask, TaskSchedule
    >>> from autosched.verify.candidates import serial_plan
    >>> a, b = PipelineTask("A", lambda ctx: time.sleep(0.001)), PipelineTask("B", lambda ctx: time.sleep(0.001))
    >>> two = PipelinePlan({a: TaskSchedule(0, thread_group="x"), b: TaskSchedule(1, thread_group="y")},
    ...                    intra_iter_deps=[(b, a)])
    >>> t = measure_plans({"two": two, "serial": serial_plan(two)}, list(range(10)), rounds=1)
    >>> [r.label for r in t.rows], len(t["two"].rounds_s)
    (['two', 'serial'], 1)
    """
    items = list(plans.items()) if isinstance(plans, dict) else [(str(k), p) for k, p in plans]
    labels = [k for k, _ in items]
    if not items:
        raise ValueError("measure_plans needs at least one (label, plan)")
    if len(set(labels)) != len(labels):
        raise ValueError(f"plan labels repeat: {labels}; give each plan its own label")
    batches = list(batches)
    if len(batches) < 2:
        raise ValueError(f"measure_plans needs at least 2 batches per run, got {len(batches)}")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    if max_rounds is not None and (not isinstance(max_rounds, int) or max_rounds < rounds):
        raise ValueError(f"max_rounds must be an integer >= rounds ({rounds}), got {max_rounds!r}")
    if warmup:
        short = batches[: max(2, min(len(batches), 8))]
        for _, plan in items:
            _one_run(plan, short, device)
    got: Dict[str, List[float]] = {k: [] for k in labels}
    ids: Dict[str, List[int]] = {k: [] for k in labels}
    for r in range(rounds):
        _one_round(items, r, got, ids, batches, device)
    predicted = predicted or {}
    table = VerifyTable([PlanMeasurement(label, plan, got[label], predicted.get(label), ids[label])
                         for label, plan in items], rounds, len(batches), noise_floor_pct, _load(),
                        known=tuple(k for k in known if k in labels), margin_pct=margin_pct)
    extra = 0
    for r in range(rounds, max_rounds or rounds):
        contenders = _contenders(table)
        if len(contenders) < 2:
            break
        _one_round([(c.label, c.plan) for c in contenders], r, got, ids, batches, device)
        extra += 1
    if extra:
        table.notes.append(f"{extra} extra round(s) for the plans within the noise band of the fastest "
                           f"({'; '.join(c.label for c in table.rows if len(c.rounds_s) > rounds)})")
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


def _one_round(items: Sequence[Tuple[str, PipelinePlan]], r: int, got: Dict[str, List[float]],
               ids: Dict[str, List[int]], batches: Sequence[Any], device: Any) -> None:
    """Every plan once, in round ``r``'s order (:func:`turned`)."""
    for label, plan in turned(items, r):
        got[label].append(_one_run(plan, batches, device))
        ids[label].append(r)


def _contenders(table: VerifyTable) -> List[PlanMeasurement]:
    """The rows whose median period is within the table's noise band of the fastest row's."""
    near = set(within_band({r.label: r.period_s for r in table.rows}, table.noise_pct))
    return [r for r in table.rows if r.label in near]


def _load() -> Optional[float]:
    try:
        import os

        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
