"""AdaptivePipeline: an SWPipeline that searches a new plan when the measured period drifts, and swaps at a drain.

It drives one :class:`~swpipe_core.engine.pipeline.SWPipeline` at a time through its public calls only
(``fill_pipeline``, ``progress``, ``drain``, ``close``, ``instrument``). Each retired iteration's period is
compared with the baseline (:mod:`swpipe.replan.rules`); on drift a search runs on a thread of its own
(``swpipe-replan``) on what the cost source says the tasks cost now. At the decision iteration, when the searched
plan is predicted faster by more than the noise, the running pipeline drains (its in-flight iterations retire in
order, through ``progress``) and a new ``SWPipeline`` with the new plan is filled from the same data, its
iterations numbered on from the run-wide index (``first_iter_idx``): every iteration runs whole under one plan, in
order, with the ``ctx.iter_idx`` it has in the serial loop, so the results equal the serial loop's (random draws
too, under ``rng="per_task"``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import traceback
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

from autosched.model.costs import CostModel
from autosched.search.options import Constraints, SolverOptions
from swpipe.replan.costs_now import CostSnapshot, CostSource, RollingSource
from swpipe.replan.log import ReplanDecision, ReplanError
from swpipe.replan.options import ReplanOptions
from swpipe.replan.ranks import DecisionExchange
from swpipe.replan.rules import swap_worth_it
from swpipe.replan.watch import PeriodWatch
from swpipe_core.engine.checks import check_first_iter_idx
from swpipe_core.engine.options import OptionError
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.measure.rolling import RollingCosts
from swpipe_core.plan import PipelinePlan

__all__ = ["AdaptivePipeline", "default_search", "predicted_period"]

_log = logging.getLogger(__name__)

Search = Callable[[PipelinePlan, CostModel], PipelinePlan]


def default_search(options: ReplanOptions) -> Search:
    """The search the pipeline runs by default: ``auto_schedule`` from the running plan, within the time limit.

    Parameters
    ----------
    options : ReplanOptions
        Its ``constraints`` and ``time_limit_s``.

    Returns
    -------
    callable
        ``search(plan, costs) -> PipelinePlan``.

    Examples
    --------
    >>> from swpipe import CostModel, PipelinePlan, TaskCost, TaskSchedule
    >>> plan = PipelinePlan({"Load": TaskSchedule(0), "Step": TaskSchedule(0)}, intra_iter_deps=[("Step", "Load")])
    >>> search = default_search(ReplanOptions(time_limit_s=5))
    >>> found = search(plan, CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)}))
    >>> found.stage("Load"), found.stage("Step")
    (0, 1)
    """
    from autosched.search.autoschedule import auto_schedule

    constraints = options.constraints if options.constraints is not None else Constraints()
    solver = SolverOptions(time_limit_s=options.time_limit_s)

    def search(plan: PipelinePlan, costs: CostModel) -> PipelinePlan:
        found, _ = auto_schedule(plan, costs, constraints, solver)
        return found

    return search


def predicted_period(plan: PipelinePlan, costs: CostModel) -> float:
    """The plan's simulated period (seconds) on ``costs``: what every prediction of the re-planner is.

    Examples
    --------
    >>> from swpipe import CostModel, PipelinePlan, TaskCost, TaskSchedule
    >>> plan = PipelinePlan({"Load": TaskSchedule(0), "Step": TaskSchedule(0)}, intra_iter_deps=[("Step", "Load")])
    >>> round(predicted_period(plan, CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})), 6)
    0.005
    """
    from autosched.verbs import simulate

    return float(simulate(plan, costs).period_s)


class _Counted:
    """The caller's batches, counted from the run's first index: after a drain, the count is the first iteration
    of the next plan."""

    def __init__(self, data: Iterable[Any], first: int = 0) -> None:
        self._it = iter(data)
        self.count = first

    def __iter__(self) -> "_Counted":
        return self

    def __next__(self) -> Any:
        batch = next(self._it)
        self.count += 1
        return batch


class _BackgroundSearch:
    """One search on the thread ``swpipe-replan``: its plan and both predictions, or its failure."""

    def __init__(self, search: Search, plan: PipelinePlan, snapshot: CostSnapshot) -> None:
        self.plan, self.snapshot = plan, snapshot
        self.found: Optional[Tuple[PipelinePlan, float, float]] = None
        self.error: Optional[BaseException] = None
        self.trace = ""
        self.thread = threading.Thread(target=self._run, args=(search,), name="swpipe-replan", daemon=True)
        self.thread.start()

    def _run(self, search: Search) -> None:
        try:
            new = search(self.plan, self.snapshot.costs)
            costs = self.snapshot.costs
            self.found = (new, predicted_period(self.plan, costs), predicted_period(new, costs))
        except BaseException as exc:  # surfaced on the caller's thread at the decision point
            self.error, self.trace = exc, traceback.format_exc()

    def join(self, timeout_s: float) -> bool:
        self.thread.join(timeout_s)
        return not self.thread.is_alive()


class AdaptivePipeline:
    """An :class:`SWPipeline` that re-plans when the measured period drifts from its baseline.

    Used like an ``SWPipeline``: ``fill_pipeline`` / ``progress`` until ``StopIteration`` (or :meth:`run`),
    ``drain``, ``close``. After each fill it measures a baseline period and watches the rolling median against it
    (:class:`ReplanOptions`); on drift it searches on the costs now in the background and, ``search_periods``
    later, swaps to the searched plan when its predicted period beats the running plan's by more than the noise:
    the running pipeline drains through ``progress`` (each in-flight iteration retires in order) and, in the call
    that retires its last iteration, a new ``SWPipeline`` with the new plan is filled from the same data, its
    iterations numbered on from there (``first_iter_idx``). Results equal the serial loop's across a swap, and
    ``ctx.iter_idx`` is the iteration's index over the whole run, as in the serial loop.

    Parameters
    ----------
    plan : PipelinePlan
        The plan to start with.
    costs : CostModel
        The costs ``plan`` was searched for: the default cost source (:class:`RollingSource`) refreshes them
        with the medians of the tasks' recent durations.
    device : int, str, torch.device or Device
        As ``SWPipeline``'s.
    replan : ReplanOptions or None
        When and how to re-plan (default ``ReplanOptions()``); ``None`` never re-plans (a plain ``SWPipeline``
        with the same calls).
    cost_source : CostSource, optional
        What the tasks cost now (default ``RollingSource(costs, RollingCosts(window=replan.window,
        device=device))``, its window installed with ``instrument``: the tasks' last ``window`` durations, the
        periods the rolling median watches, so that at a drift their medians are the new level).
    search : callable, optional
        ``search(plan, costs) -> PipelinePlan`` (default :func:`default_search`).
    clock : callable, optional
        Seconds, read once per retired iteration on the caller's thread (default ``time.perf_counter``); a test
        scripts it to make every decision deterministic.
    group : torch.distributed.ProcessGroup, optional
        Several ranks: a gloo group of its own (``torch.distributed.new_group(backend="gloo")``, not the tasks'
        group), the same on every rank. Rank 0 watches, searches and decides; after every
        ``replan.exchange_every``-th retired iteration it tells the other ranks
        (:class:`~swpipe.replan.ranks.DecisionExchange`), so every rank swaps at the same iteration to the same
        plan: its decision point (and a failure of its re-planning) waits for the next such iteration. The other
        ranks' cost sources and clocks are not read. ``None``: one rank.
    **pipeline_options
        Passed to every ``SWPipeline`` built (``timeouts``, ``state``, ``strict``, ``rng``, ...). With
        ``rng="per_task"`` each task's generator is keyed by the run-wide ``ctx.iter_idx``, so the draws across a
        swap are the serial loop's; each ``SWPipeline`` seeds them from ``torch.initial_seed()`` when it is made (at
        a swap too): do not reseed torch while the run goes on.

    Attributes
    ----------
    plan : PipelinePlan
        The plan running now.
    decisions : list of ReplanDecision
        Every decision, in order; :attr:`swaps` the ones that swapped.

    Raises
    ------
    OptionError
        ``replan`` is not a ``ReplanOptions``.

    Notes
    -----
    ``progress`` returns the iteration's index over the whole run, and a task sees the same index as
    ``ctx.iter_idx``, before and after a swap.

    Examples
    --------
    >>> from swpipe import CostModel, PipelinePlan, PipelineTask, TaskCost, TaskSchedule
    >>> out = []
    >>> plan = PipelinePlan({PipelineTask("Load", lambda ctx: setattr(ctx, "x", ctx.batch * 10)): TaskSchedule(0),
    ...                      PipelineTask("Step", lambda ctx: out.append(ctx.x)): TaskSchedule(0)},
    ...                     intra_iter_deps=[("Step", "Load")])
    >>> with AdaptivePipeline(plan, CostModel({"Load": TaskCost(1e-3), "Step": TaskCost(1e-3)}), "cpu") as pipe:
    ...     seconds = pipe.run(range(5))
    >>> out, pipe.swaps
    ([0, 10, 20, 30, 40], [])
    """

    def __init__(self, plan: PipelinePlan, costs: CostModel, device: Any = "cpu", *,
                 replan: Optional[ReplanOptions] = ReplanOptions(), cost_source: Optional[CostSource] = None,
                 search: Optional[Search] = None, clock: Optional[Callable[[], float]] = None,
                 group: Any = None, **pipeline_options: Any) -> None:
        if replan is not None and not isinstance(replan, ReplanOptions):
            raise OptionError("AdaptivePipeline", "replan", replan, expected="a ReplanOptions or None")
        self.replan = replan
        self.cost_source: CostSource = (cost_source if cost_source is not None else RollingSource(
            # the costs over the periods the drift was seen in: a longer window's median would still be the old level
            costs, RollingCosts(window=replan.window if replan is not None else 64, device=device)))
        self._search = search if search is not None or replan is None else default_search(replan)
        self._clock = clock if clock is not None else time.perf_counter
        self._device, self._options = device, pipeline_options
        self.plan = plan
        self._pipe = SWPipeline(plan, device, **pipeline_options)  # built now: a bad plan or option fails here
        self.decisions: List[ReplanDecision] = []
        self._data: Optional[_Counted] = None
        self._measuring = contextlib.ExitStack()
        self._pending: Optional[PipelinePlan] = None  # a swap decided: draining the old pipeline through progress
        self._running: Optional[_BackgroundSearch] = None
        self._exchange = (DecisionExchange(group, replan.exchange_every) if group is not None and replan is not None
                          else None)
        self._failed: Optional[Exception] = None  # rank 0's re-planning failed: told at the next exchange
        self._watch_reset()

    # ------------------------------------------------------------- the loop

    def fill_pipeline(self, data_iter: Iterable[Any], *, first_iter_idx: int = 0) -> Iterator[Any]:
        """Start a run over ``data_iter`` (as :meth:`SWPipeline.fill_pipeline`); returns the iterator for progress.

        ``first_iter_idx`` is the index of the first batch (as ``SWPipeline``'s); every plan of the run numbers its
        iterations on from the run's.

        Raises
        ------
        OptionError
            ``first_iter_idx`` is not an integer ``>= 0``.
        """
        first = check_first_iter_idx(first_iter_idx, "AdaptivePipeline.fill_pipeline")
        self._data = _Counted(data_iter, first)
        self._start(self._data)
        return self._data

    def progress(self, data_iter: Optional[Iterator[Any]] = None) -> int:
        """Retire the oldest in-flight iteration and run the next period; returns its index over the whole run.

        Between periods it watches the period, starts the search on drift, and decides at the decision iteration.
        After a swap is decided, the next calls drain the running plan (each returns the next iteration, in
        order); the call that retires its last iteration fills the new plan, and the run goes on.

        Raises
        ------
        StopIteration
            Nothing is left in flight and no data remains.
        ReplanError
            The background search failed or did not end within ``join_timeout_s`` of the decision point.
        PipelineTaskError, RuntimeError
            As :meth:`SWPipeline.progress` (a running search is then joined and dropped).
        """
        if self._data is None:
            raise RuntimeError("progress() called before fill_pipeline(); start with "
                               "data_iter = pipe.fill_pipeline(loader)")
        if data_iter is not None and data_iter is not self._data:
            raise RuntimeError("progress() got a different data iterator than fill_pipeline() returned; "
                               "to switch data, call drain() and then fill_pipeline(new_data)")
        try:
            if self._pending is not None:  # the old plan drains through progress: each iteration still returned
                try:
                    idx = self._pipe.progress(None)
                except StopIteration:  # nothing was in flight when the swap was decided
                    self._swap()
                else:
                    if self._pipe.in_flight == 0:  # its last iteration: the new plan's fill runs in this call
                        self._pipe.drain()
                        self._swap()
                    return idx
            try:
                idx = self._pipe.progress(None if data_iter is None else self._data)
            except StopIteration:
                self._stop()
                self._raise_held()
                raise
        except BaseException:
            self._drop_search()
            raise
        if self.replan is not None and data_iter is not None:
            self._after_period(idx)
        return idx

    def run(self, data_iter: Iterable[Any], *, first_iter_idx: int = 0) -> float:
        """Every batch of ``data_iter``, pipelined, re-planned on drift; returns wall seconds.

        ``first_iter_idx`` is as :meth:`fill_pipeline`'s.
        """
        t0 = time.perf_counter()
        it = self.fill_pipeline(data_iter, first_iter_idx=first_iter_idx)
        try:
            while True:
                try:
                    self.progress(it)
                except StopIteration:
                    break
        except BaseException:
            self.close()
            raise
        return time.perf_counter() - t0

    def drain(self) -> None:
        """Retire every in-flight iteration (as :meth:`SWPipeline.drain`); a search in flight is dropped."""
        try:
            self._pipe.drain()
        finally:
            self._stop()
            self._drop_search()
        self._raise_held()

    def close(self) -> None:
        """Stop now (as :meth:`SWPipeline.close`); a search in flight is joined and dropped."""
        self._failed = None
        try:
            self._pipe.close()
        finally:
            self._stop()
            self._drop_search()

    def __enter__(self) -> "AdaptivePipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def swaps(self) -> List[ReplanDecision]:
        """The decisions that swapped the plan, in order."""
        return [d for d in self.decisions if d.swapped]

    @property
    def reference_s(self) -> Optional[float]:
        """The period the running plan is watched against (``None`` until its baseline is measured)."""
        return self._periods.reference_s

    @property
    def noise(self) -> float:
        """The band's relative half-width around :attr:`reference_s` (0 until the baseline is measured)."""
        return self._periods.noise

    @property
    def pipeline(self) -> SWPipeline:
        """The ``SWPipeline`` running :attr:`plan` now."""
        return self._pipe

    # ------------------------------------------------------------- internals

    def _start(self, data: _Counted) -> None:
        """Fill the current pipeline from ``data``, measured by the cost source."""
        wrapper = getattr(self.cost_source, "instrument", None)
        if wrapper is not None and self.replan is not None:
            self._measuring.enter_context(self._pipe.instrument(wrapper))
        try:
            self._pipe.fill_pipeline(data, first_iter_idx=data.count)  # iterations numbered on over the whole run
        except BaseException:
            self._stop()
            raise
        self._watch_reset()
        self._last = self._clock()  # the first period runs from the end of the fill

    def _stop(self) -> None:
        """The run ended (or was drained): the cost source's wrapper leaves the pipeline; a swap decided and not
        yet made is made now (the next fill runs the new plan, as the decision's log says)."""
        self._measuring.close()
        self._measuring = contextlib.ExitStack()
        new, self._pending = self._pending, None
        if new is not None:
            self._pipe = SWPipeline(new, self._device, **self._options)
            self.plan = new

    def _swap(self) -> None:
        """The old plan has drained: build the new plan's pipeline and fill it from the same data."""
        new, self._pending = self._pending, None
        self._measuring.close()
        self._measuring = contextlib.ExitStack()
        self._pipe = SWPipeline(new, self._device, **self._options)
        self.plan = new
        self._start(self._data)

    def _watch_reset(self) -> None:
        """Start watching afresh (after a fill): warm-up, then a baseline."""
        self._last = 0.0
        self._periods = PeriodWatch(self.replan if self.replan is not None else ReplanOptions())
        self._detected_at = self._decide_at = -1

    def _after_period(self, idx: int) -> None:
        """After ``idx`` retired: watch and decide (one rank, or rank 0, which tells the others), or hear rank 0."""
        exchange = self._exchange
        if exchange is None:
            self._watch(idx)
            return
        due = exchange.due(idx)
        if exchange.rank != 0:
            swap = exchange.hear(idx, self.plan) if due else None
            if swap is not None:
                swap.starts_at = self._data.count  # the same on every rank: the same plan fetched the same batches
                self.decisions.append(swap)
                self._pending = swap.plan
            return
        decided = len(self.decisions)
        try:
            if self._failed is None:
                self._watch(idx)
        except Exception as exc:
            if not due:  # the other ranks listen only at an exchange: told, and raised, there
                self._failed = exc
                return
            exchange.tell_failure(idx)
            raise
        except BaseException:
            if due:
                exchange.tell_failure(idx)
            raise
        if not due:
            return
        failed, self._failed = self._failed, None
        if failed is not None:
            exchange.tell_failure(idx)
            raise failed
        new = self.decisions[decided:]
        exchange.tell(idx, new[0] if new and new[0].swapped else None)

    def _raise_held(self) -> None:
        """Rank 0, at the end of a run: its re-planning failed after the last exchange; it raises alone (nothing
        is left to tell the other ranks at, and nothing waits for it)."""
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def _watch(self, idx: int) -> None:
        """The period that retired ``idx``, measured and judged."""
        opts = self.replan
        now = self._clock()
        period, self._last = now - self._last, now
        said = self._periods.add(period)
        if said == "baseline":
            self._measured_after(self._periods.reference_s)
        elif self._running is not None:
            if idx >= self._decide_at and (self._exchange is None or self._exchange.due(idx)):
                self._decide(idx)  # on several ranks, at the first exchange from the decision point on
        elif said == "drift":
            self._detected_at = idx
            periods = opts.search_periods
            if periods is None:
                periods = math.ceil(opts.time_limit_s / self._periods.reference_s) + 1
            self._decide_at = idx + periods
            self._running = _BackgroundSearch(self._search, self.plan, self.cost_source.costs_now())

    def _measured_after(self, reference: float) -> None:
        """The new plan's first baseline: what the last swap's decision measured after it."""
        last = self.decisions[-1] if self.decisions else None
        if last is not None and last.swapped and last.measured_after_s is None:
            last.measured_after_s = reference
            _log.info("re-planning: measured after the swap at iteration %d: %.3f ms (predicted %.3f ms)",
                      last.starts_at, reference * 1e3, last.predicted_new_s * 1e3)

    def _decide(self, idx: int) -> None:
        """Join the search, judge its plan, and swap or take the new level as the reference."""
        running, self._running = self._running, None
        t0 = time.perf_counter()
        if not running.join(self.replan.join_timeout_s):
            raise ReplanError(idx, "timeout", f"still running {self.replan.join_timeout_s:g} s after iteration "
                                              f"{self._decide_at}, the decision point")
        waited = time.perf_counter() - t0
        if running.error is not None:
            raise ReplanError(idx, "failed", f"{type(running.error).__name__}: {running.error}",
                              running.trace) from running.error
        new, old_s, new_s = running.found
        watch = self._periods
        measured = watch.last_s
        worth = str(new) != str(self.plan) and swap_worth_it(old_s, new_s, max(watch.noise, running.snapshot.noise))
        decision = ReplanDecision(
            detected_at=self._detected_at, decided_at=idx, reference_s=watch.reference_s, measured_s=measured,
            noise=watch.noise, costs=running.snapshot.costs, cost_noise=running.snapshot.noise,
            predicted_old_s=old_s, predicted_new_s=new_s, swapped=worth, plan=new,
            starts_at=self._data.count if worth else None, waited_s=waited)
        self.decisions.append(decision)
        _log.info("re-planning: %s", decision)
        if worth:
            self._pending = new
        else:  # the plan is still the best: the new level is what "steady" means from now on
            watch.rebase(measured)

    def _drop_search(self) -> None:
        """Join a search in flight and forget it (the run ended or failed)."""
        running, self._running = self._running, None
        if running is not None and not running.join(self.replan.join_timeout_s):
            _log.warning("re-planning: the search thread is still running %g s after the run ended",
                         self.replan.join_timeout_s)
