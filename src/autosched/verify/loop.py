"""Verify in the loop: run candidate plans on the real engine and keep the one measured fastest.

The simulator ranks plans by a model of the machine; this module checks the
ranking where it matters, on the user's machine with the user's tasks.
:func:`measure_plans` runs each plan (a bound :class:`PipelinePlan`) on
:class:`~swpipe_core.engine.pipeline.SWPipeline` for one short run per round, the plans
interleaved and their order rotated every round (slow drift in machine load
then shifts every plan alike), and returns a :class:`VerifyTable`: per plan its
steady period in each round, the median, the prediction if one was given and
the model's error.

Measured period of one run: the retire times of ``progress()`` over the
steady iterations (after a warm-up quarter, at least ``depth`` iterations in,
before the drain), averaged. A plan's period is the median over the rounds.

Prediction of each plan: its simulated period in the search's own model
(:meth:`autosched.search.problem.Problem.simulate`: the costs the search used, with
the machine calibration's engine costs per hand-off and per period when it
folded one in), the model that ranked the plans and wrote the report: one
model per ``auto_schedule`` call. :func:`predict_periods` gives the same
figures from a cost model outside a search.

Noise band: ``noise_pct`` = the larger of ``noise_floor_pct`` and the median,
over the plans, of ``(slowest round - fastest round) / median``. Two plans
whose periods differ by less than the band are a tie as far as this machine
can tell. :meth:`VerifyTable.choose` returns the plan with the lowest median
period, or a known plan (below) that plan does not measurably beat, so the
chosen plan is never measured slower than the input plan beyond the noise
(nor than the serial plan, nor than the search's own favourite).

Racing (``max_rounds``): after the first rounds, the plans still within the
noise band of the fastest run further rounds among themselves, so measurement
time goes where the ranking is in doubt.

Known plans (``VerifyOptions.keep_known``): the seeds and the input plan are
what the user would run without the search. One of them is returned unless the
fastest plan beats it measurably: faster in at least 80 % of the rounds both
ran, and by at least ``margin_pct`` (3 %) in the median of their per-round
ratios (:meth:`VerifyTable.beats`). A plan ahead only within the machine's
noise then never replaces a known one.

Feedback: the serial plan's prediction is the sum of the task costs, so its
measured/predicted ratio (:attr:`VerifyTable.speed_factor`) is how fast the
machine runs the tasks now against when the costs were taken; the table also
reports every prediction rescaled by it. A uniform scale changes no ranking,
only the absolute figures. What can reorder plans is how many of their
threads really run at once: :mod:`autosched.verify.refit` refits the model's core
pool to the measured periods, and when it moves, ``auto_schedule`` searches
once more with it and :func:`measure_refit` measures that plan beside the
choice (the table of that measurement keeps the first one as ``earlier``).

:func:`serial_plan` gives the serial candidate: every task at stage 0 on one
thread group, the caller's (no overlap; what ``run_serial`` computes).
:func:`verify_search` is the hook ``auto_schedule(..., verify=..., batches=...)``
calls; it lives here so the search modules stay about the search.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from swpipe_core.order import enqueue_order
from swpipe_core.plan import PipelinePlan, TaskSchedule

__all__ = ["VerifyOptions", "PlanMeasurement", "VerifyTable", "measure_plans", "serial_plan",
           "verify_search", "measure_refit", "plan_key", "is_known",
           "turned", "within_band", "predict_periods", "predicted_speedup", "predicted_speedups"]


@dataclass
class VerifyOptions:
    """How ``auto_schedule`` verifies its answer on the engine.

    Parameters
    ----------
    rounds : int
        Interleaved rounds; each plan runs once per round.
    top : int
        Most search candidates measured (the search's pick first, then the
        other searchers' bests and the seeds); the input plan and the serial
        plan are measured on top of these.
    iterations : int, optional
        Batches per run (default: all the batches given, cycled up to 24 if fewer).
    noise_floor_pct : float
        The smallest noise band reported (timer and scheduler jitter).
    device : str
        Device the plans run on (``SWPipeline(plan, device=...)``).
    max_rounds : int, optional
        Race the contenders: after ``rounds``, plans still within the noise
        band of the fastest run more rounds, up to ``max_rounds`` in all
        (default ``2 * rounds``; ``rounds``: no extra round).
    keep_known : bool
        Keep the best known plan (the seeds, the input plan) unless a
        searched plan is measurably faster (:meth:`VerifyTable.beats`:
        faster in at least 80 % of the rounds both ran and by at least
        ``margin_pct`` in the median); False: the fastest median wins.
    margin_pct : float
        See ``keep_known``.

    Examples
    --------
    >>> VerifyOptions(rounds=5).top
    3
    """

    rounds: int = 3
    top: int = 3
    iterations: Optional[int] = None
    noise_floor_pct: float = 2.0
    device: Any = "cpu"
    max_rounds: Optional[int] = None
    keep_known: bool = True
    margin_pct: float = 3.0

    def __post_init__(self) -> None:
        from autosched._fields import check_fields, flag, integer, number, optional

        check_fields(self, {
            "rounds": integer(1), "top": integer(0), "iterations": optional(integer(1)),
            "noise_floor_pct": number(0), "max_rounds": optional(integer(1)), "keep_known": flag(),
            "margin_pct": number(0),
        })


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


def serial_plan(plan: PipelinePlan, group: str = "default") -> PipelinePlan:
    """The serial version of a plan: every task at stage 0 on one thread group and the device's default stream
    (as the serial loop, ``SWPipeline.run_serial``, runs them), same tasks and dependencies.

    Parameters
    ----------
    plan : PipelinePlan
    group : str
        The one thread group (the caller's group, so an engine that runs the
        caller's group inline starts no thread for it).

    Returns
    -------
    PipelinePlan

    Examples
    --------
    >>> p = PipelinePlan({"A": TaskSchedule(0, thread_group="io"), "B": TaskSchedule(1, "s1", "compute")},
    ...                  intra_iter_deps=[("B", "A")])
    >>> s = serial_plan(p)
    >>> s.pipeline_depth, {s.sched(n).thread_group for n in s.task_names}, s.stream_of("B")
    (1, {'default'}, 'default')
    """
    sched = {k: TaskSchedule(0, None, group, v.globally_ordered) for k, v in plan.schedule.items()}
    return PipelinePlan(sched, list(plan.intra_iter_deps), list(plan.inter_iter_deps), enqueue_policy="ready_first",
                        caller_group=group, same_period_deps=list(plan.same_period_deps))


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
    >>> from swpipe_core.plan import PipelineTask
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


# --------------------------------------------------------------------------- the auto_schedule hook


def wanted(verify: Any, problem: Any, batches: Optional[Sequence[Any]]) -> bool:
    """Whether ``auto_schedule`` verifies: on by default when the tasks are runnable and batches are given."""
    if verify is False:
        return False
    runnable = all(callable(t.fn) for t in problem.tasks.values())
    if verify is None and batches is not None and not runnable:
        unbound = [n for n, t in problem.tasks.items() if not callable(t.fn)]
        raise ValueError(f"auto_schedule(batches=...) measures the candidate plans on the engine, but tasks {unbound} "
                         "have no function: bind them (plan.bind({name: fn, ...}) or PipelineTask(name, fn)), or drop "
                         "batches= to search on the cost model alone (the plan is then not verified)")
    if verify is None:
        return batches is not None
    if batches is None:
        raise ValueError("auto_schedule(verify=...) needs batches=[...] to run the candidate plans on the engine")
    if not runnable:
        unbound = [n for n, t in problem.tasks.items() if not callable(t.fn)]
        raise ValueError(f"auto_schedule(verify=...) needs runnable tasks; {unbound} have no function "
                         "(pass PipelineTask(name, fn) objects, or verify=False)")
    return True


def _options(verify: Any) -> VerifyOptions:
    if isinstance(verify, VerifyOptions):
        return verify
    if isinstance(verify, int) and not isinstance(verify, bool):
        return VerifyOptions(rounds=verify)
    return VerifyOptions()


def _batches_for(batches: Sequence[Any], opts: VerifyOptions, depth: int) -> List[Any]:
    batches = list(batches)
    want = opts.iterations or max(len(batches), min(24, 4 * depth + 8))
    out = []
    while len(out) < want:
        out.extend(batches[: want - len(out)])
    return out


def verify_search(report: Any, pool: Sequence[Tuple[str, Optional[PipelinePlan]]], problem: Any,
                  batches: Sequence[Any], verify: Any, num_iterations: int) -> Tuple[PipelinePlan, Any]:
    """Measure the search's candidates, the input plan and the serial plan; return the fastest and the report.

    Parameters
    ----------
    report : SearchReport
        The search's report (its ``plan`` is the simulator's favourite).
    pool : list of (label, plan or None)
        The other candidates (other searchers' bests, seeds), best first; plans
        equal to one already listed are measured once.
    problem : Problem
    batches : sequence
    verify : True, int or VerifyOptions
    num_iterations : int
        Simulated iterations for the predictions.

    Returns
    -------
    (PipelinePlan, SearchReport)
        The plan measured fastest, and the report re-judged for it (period,
        binding, utilisation simulated for that plan) with ``verify`` set to
        the :class:`VerifyTable`.
    """
    opts = _options(verify)
    cands: List[Tuple[str, PipelinePlan]] = [("auto", report.plan)]
    seen = {plan_key(report.plan)}
    searched = 1
    for label, plan in pool:  # the searchers' bests up to ``top``; every seed
        is_seed = label.startswith("seed")
        if plan is None or (not is_seed and searched >= opts.top):
            continue
        if plan_key(plan) not in seen:
            searched += 0 if is_seed else 1
            seen.add(plan_key(plan))
            cands.append((label, plan))
    base = problem.base_plan
    if base is not None and not base.unbound_tasks() and plan_key(base) not in seen:
        seen.add(plan_key(base))
        cands.append(("input", base))
    serial = serial_plan(report.plan)
    cands.append(("serial", serial))
    known = [label for label, _ in cands if is_known(label)] if opts.keep_known else []
    table = _measure(cands, problem, batches, opts, num_iterations, known)
    chosen = table.choose()
    if chosen is not table.fastest():
        table.notes.append(f"{table.verdict()}: keeping {chosen.label} ({chosen.period_s * 1e3:.3f} ms)")
    if chosen.label != "auto":
        table.notes.append(f"the simulator's favourite (auto) measured {table['auto'].period_s * 1e3:.3f} ms, "
                           f"{chosen.label} {chosen.period_s * 1e3:.3f} ms: returning {chosen.label}")
    new = _rejudge(report, chosen.plan, problem, num_iterations) if chosen.label != "auto" else report
    new = dataclasses.replace(new, verify=table)
    return chosen.plan, new


def measure_refit(report: Any, chosen: PlanMeasurement, plan: PipelinePlan, problem: Any, batches: Sequence[Any],
                  verify: Any, num_iterations: int) -> Any:
    """Measure a refitted search's plan beside the verified choice and the serial plan; report the fastest.

    Parameters
    ----------
    report : SearchReport
        The verified report (``report.verify`` holds the first measurement).
    chosen : PlanMeasurement
        The first measurement's choice.
    plan : PipelinePlan
        The plan the search found with the refitted model (:mod:`autosched.verify.refit`).
    problem : Problem
        The refitted problem: its costs predict all three plans.
    batches, verify, num_iterations
        As for :func:`verify_search`.

    Returns
    -------
    SearchReport
        Re-judged with the refitted costs for the plan measured fastest in
        these rounds (``"refit"``, the earlier choice or ``"serial"``); its
        ``verify`` is the new table, with the first one as ``earlier``.
    """
    opts = _options(verify)
    first = report.verify
    cands = [(chosen.label, chosen.plan), ("refit", plan)]
    if chosen.label != "serial":
        cands.append(("serial", first["serial"].plan))
    table = _measure(cands, problem, batches, opts, num_iterations, [chosen.label] if opts.keep_known else [])
    table.earlier = first
    won = table.choose()
    table.notes.append(f"refit: the search with the refitted pool found a new plan; measured beside "
                       f"{chosen.label}: refit {table['refit'].period_s * 1e3:.3f} ms, {chosen.label} "
                       f"{table[chosen.label].period_s * 1e3:.3f} ms: returning {won.label}")
    new = _rejudge(report, won.plan, problem, num_iterations)
    return dataclasses.replace(new, verify=table, method=report.method + ("+refit" if won.label == "refit" else ""))


def _measure(cands: List[Tuple[str, PipelinePlan]], problem: Any, batches: Sequence[Any], opts: VerifyOptions,
             num_iterations: int, known: Sequence[str]) -> VerifyTable:
    """Predict each candidate with the search's model (:meth:`Problem.simulate`), then measure them all side by
    side (with racing)."""
    runs = _batches_for(batches, opts, max(p.pipeline_depth for _, p in cands))
    predicted: Dict[str, float] = {}
    for label, plan in cands:
        try:
            predicted[label] = float(problem.simulate(plan, num_iterations).period)
        except Exception:  # noqa: BLE001 - a plan the simulator rejects is still measured
            pass
    return measure_plans(cands, runs, opts.rounds, predicted=predicted, device=opts.device,
                         noise_floor_pct=opts.noise_floor_pct,
                         max_rounds=opts.max_rounds if opts.max_rounds is not None else 2 * opts.rounds,
                         known=known, margin_pct=opts.margin_pct)


def predict_periods(plans: Sequence[Tuple[str, PipelinePlan]], costs: Any, num_iterations: int = 50,
                    device: str = "cpu") -> Dict[str, float]:
    """The simulated steady period of each labelled plan: what the verification calls its prediction.

    The same model as ``auto_schedule``'s for these costs: a cost model that
    carries a ``machine_calibration`` is simulated with it folded in
    (:func:`~autosched.model.machine.simulate_calibrated`: engine costs per task,
    per hand-off and per period, the free cores), any other as it is.

    Parameters
    ----------
    plans : sequence of (label, PipelinePlan)
    costs : CostModel
    num_iterations : int
    device : {"cpu", "cuda"}

    Returns
    -------
    dict
        ``label -> seconds``; a plan the simulator rejects has no entry (it
        can still be measured).

    Examples
    --------
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="x"), "B": TaskSchedule(1, thread_group="y")},
    ...                     intra_iter_deps=[("B", "A")])
    >>> costs = CostModel({"A": TaskCost(1e-3), "B": TaskCost(1e-3)})
    >>> got = predict_periods([("two", plan), ("serial", serial_plan(plan))], costs)
    >>> {label: round(s * 1e3, 6) for label, s in got.items()}
    {'two': 1.0, 'serial': 2.0}

    Calibrated: 10 us per task, 50 us per hand-off, 2 free cores. ``B`` waits for ``A`` on another thread:

    >>> from swpipe_core.measure.calibrate import MachineCalibration
    >>> cal = MachineCalibration(task_s=1e-5, dep_s=5e-5, cores_free=2.0, cpu_count=2)
    >>> got = predict_periods([("two", plan), ("serial", serial_plan(plan))],
    ...                       dataclasses.replace(costs, machine_calibration=cal))
    >>> {label: round(s * 1e3, 6) for label, s in got.items()}
    {'two': 1.06, 'serial': 2.02}
    """
    from autosched.model.machine import simulate_calibrated
    from autosched.model.simulate import simulate

    cal = getattr(costs, "machine_calibration", None)
    predicted: Dict[str, float] = {}
    for label, plan in plans:
        try:
            if cal is None:
                sim = simulate(plan, costs, num_iterations=num_iterations, device=device)
            else:
                sim = simulate_calibrated(plan, costs, cal, num_iterations=num_iterations, device=device)
            predicted[label] = float(sim.period)
        except Exception:  # noqa: BLE001 - a plan the simulator rejects is still measured
            pass
    return predicted


def predicted_speedup(predicted: Dict[str, Optional[float]], label: str) -> Optional[float]:
    """The model's speedup of ``label`` over the serial plan: predicted serial period / its predicted period.

    A ratio of two predictions from one cost model, so how fast the machine
    runs now against when the costs were taken cancels out: compare it with
    a measured speedup over a serial run taken in the same rounds.

    Parameters
    ----------
    predicted : dict
        ``label -> predicted period`` (:func:`predict_periods`), with ``"serial"``.
    label : str

    Returns
    -------
    float or None
        None when either prediction is missing or zero.

    Examples
    --------
    >>> predicted_speedup({"serial": 0.008, "auto": 0.005}, "auto")
    1.6
    >>> predicted_speedup({"auto": 0.006}, "auto") is None
    True
    """
    serial, own = predicted.get("serial"), predicted.get(label)
    if not serial or not own:
        return None
    return serial / own


def predicted_speedups(predicted: Dict[str, Optional[float]]) -> Dict[str, float]:
    """:func:`predicted_speedup` of every label that has one.

    Examples
    --------
    >>> predicted_speedups({"serial": 0.008, "auto": 0.005, "broken": None})
    {'serial': 1.0, 'auto': 1.6}
    """
    out = {label: predicted_speedup(predicted, label) for label in predicted}
    return {label: x for label, x in out.items() if x is not None}


def is_known(label: str) -> bool:
    """Whether a candidate's label names a known plan (a seed, ``"seed..."``, or the input plan, ``"input"``):
    what the user would run without the search, kept unless measurably beaten (:meth:`VerifyTable.choose`).

    Examples
    --------
    >>> [is_known(label) for label in ("seed:prefetch", "input", "auto", "beam", "serial")]
    [True, True, False, False, False]
    """
    return label == "input" or label.startswith("seed")


def plan_key(plan: PipelinePlan) -> tuple:
    """What makes two plans run alike on the engine: schedule, enqueue order, caller group (functions aside).

    Examples
    --------
    >>> a = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, intra_iter_deps=[("B", "A")])
    >>> plan_key(a) == plan_key(a.replace(pipeline_depth=2)), plan_key(a) == plan_key(serial_plan(a))
    (True, False)
    """
    return (tuple(sorted((n, plan.stage(n), plan.stream_of(n), plan.sched(n).thread_group,
                          plan.sched(n).globally_ordered) for n in plan.task_names)), tuple(enqueue_order(plan)),
            plan.caller_group)


def _rejudge(report: Any, plan: PipelinePlan, problem: Any, num_iterations: int) -> Any:
    """The report's plan-dependent fields for another plan (simulated with the same costs)."""
    sim = problem.simulate(plan, num_iterations)
    lb = min(report.lower_bound_s, float(sim.period))
    return dataclasses.replace(
        report, plan=plan, period_s=float(sim.period), latency_s=float(sim.latency), binding=str(sim.binding),
        gap_pct=100.0 * (float(sim.period) / lb - 1.0) if lb > 0 else 0.0, depth=plan.pipeline_depth,
        depth_reason="chosen by measurement on the engine (verify), not by the simulator",
        threads=len(plan.thread_groups), method=f"{report.method}+verify",
        utilisation=dict(sim.utilisation), what_if=[],
    )
