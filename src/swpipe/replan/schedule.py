"""AdaptiveSchedule: PyTorch's pipelining schedule chosen again between steps when the measured step drifts.

It owns the ``torch.distributed.pipelining`` schedule object built from the user's own ``PipelineStage`` objects
(:meth:`PPProgram.torch_schedule <autosched.pp.program.PPProgram.torch_schedule>`: PyTorch's class, or
``_PipelineScheduleRuntime`` from the searched program's CSV) and steps it like PyTorch's. Each step's time goes
through :class:`~swpipe.replan.watch.PeriodWatch` (the re-planning rules); on drift the stages' recent actions
(:class:`~autosched.pp.rolling.RollingStepCosts`, every rank's gathered) refresh the costs
(:func:`~autosched.pp.rolling.refreshed_pp_costs`), every candidate is predicted on them
(:func:`choose_schedule`), and when the fastest beats the running one by more than the noise
(:func:`~swpipe.replan.rules.swap_worth_it`) every rank builds its schedule object on the same stages before the
next step. Rank 0 decides and tells (:class:`~swpipe.replan.ranks.DecisionExchange`), after every
``exchange_every``-th step.

The math does not change: the same stages hold the same modules and parameters; every schedule runs each
micro-batch's forward and backward once and, with PyTorch's default ``scale_grads=True``, divides the accumulated
gradients by the micro-batch count, so with a loss that averages over samples the gradients equal the whole
batch's whatever the schedule or the (even) micro-batch count, within float rounding.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from autosched.pp.costs import PPCosts
from autosched.pp.program import PPProgram, builtin_programs
from autosched.pp.rolling import RollingStepCosts, refreshed_pp_costs
from swpipe.replan.log import SwitchDecision
from swpipe.replan.options import ReplanOptions
from swpipe.replan.ranks import DecisionExchange
from swpipe.replan.rules import swap_worth_it
from swpipe.replan.watch import PeriodWatch
from swpipe_core.engine.options import OptionError

__all__ = ["AdaptiveSchedule", "ScheduleChoice", "choose_schedule", "schedule_label", "same_layout_programs"]

_log = logging.getLogger(__name__)


def schedule_label(program: PPProgram) -> str:
    """How a decision names a program: its schedule and micro-batch count (``"1F1B n=4"``)."""
    return f"{program.schedule} n={program.n_microbatches}"


def same_layout_programs(running: PPProgram, microbatches: Sequence[int]) -> List[PPProgram]:
    """PyTorch's schedules that run on ``running``'s stages (the same stage-to-rank map), for each count.

    Examples
    --------
    >>> from autosched.pp.program import pp_program
    >>> [schedule_label(p) for p in same_layout_programs(pp_program("GPipe", 2, 4), [4, 8])]
    ['GPipe n=4', '1F1B n=4', 'GPipe n=8', '1F1B n=8']
    """
    out = []
    for n in microbatches:
        programs, _ = builtin_programs(running.n_ranks, n, running.stages_per_rank)
        out.extend(p for p in programs.values() if p.stage_to_rank == running.stage_to_rank)
    return out


@dataclasses.dataclass(frozen=True)
class ScheduleChoice:
    """What :func:`choose_schedule` found: the fastest program, every prediction, and whether to switch."""

    program: PPProgram
    predicted: Dict[str, float]
    running_s: float
    best_s: float
    swap: bool


def choose_schedule(running: PPProgram, candidates: Sequence[PPProgram], costs: PPCosts, noise: float, *,
                    max_memory_bytes: Optional[float] = None) -> ScheduleChoice:
    """Every candidate predicted on ``costs``; the fastest (within the cap), and whether it is worth a switch.

    Parameters
    ----------
    running : PPProgram
        The program running now; ``costs`` are at its micro-batch size.
    candidates : sequence of PPProgram
        The programs it may switch to (other micro-batch counts: ``costs`` rescaled, :meth:`PPCosts.rescaled`).
    costs : PPCosts
        The costs now (:func:`~autosched.pp.rolling.refreshed_pp_costs`).
    noise : float
        The relative gain a switch must exceed (:func:`~swpipe.replan.rules.swap_worth_it`).
    max_memory_bytes : float, optional
        The most any rank may hold at its peak, as ``simulate`` predicts it.

    Returns
    -------
    ScheduleChoice

    Examples
    --------
    >>> from autosched.pp.costs import PPCosts, StageCost
    >>> from autosched.pp.program import pp_program
    >>> running = pp_program("GPipe", 2, 2)
    >>> costs = PPCosts((StageCost(1.0, 2.0),) * 2, samples_per_microbatch=4)
    >>> choice = choose_schedule(running, same_layout_programs(running, [2, 4]), costs, noise=0.05)
    >>> choice.predicted
    {'GPipe n=2': 9.0, '1F1B n=2': 9.0, 'GPipe n=4': 7.5, '1F1B n=4': 7.5}
    >>> schedule_label(choice.program), choice.swap
    ('GPipe n=4', True)
    """
    from autosched.verbs import simulate

    samples = costs.samples_per_microbatch * running.n_microbatches
    predicted: Dict[str, float] = {}
    best: Optional[PPProgram] = None
    pool = [running] + [p for p in candidates if p != running]
    for program in pool:
        n = program.n_microbatches
        if n != running.n_microbatches and (costs.samples_per_microbatch <= 0 or samples % n):
            continue  # no costs at that micro-batch size (or the batch does not split evenly)
        at = costs if n == running.n_microbatches else costs.rescaled(samples // n)
        result = simulate(program, at)
        if max_memory_bytes is not None and program is not running and result.max_peak_bytes > max_memory_bytes:
            continue
        predicted[schedule_label(program)] = step = float(result.period_s)
        if best is None or step < predicted[schedule_label(best)]:
            best = program
    running_s, best_s = predicted[schedule_label(running)], predicted[schedule_label(best)]
    return ScheduleChoice(best, predicted, running_s, best_s, best != running and swap_worth_it(running_s, best_s,
                                                                                              noise))


class AdaptiveSchedule:
    """A ``torch.distributed.pipelining`` schedule over the user's stages, chosen again when the step drifts.

    Used like PyTorch's schedule: ``schedule.step(batch, target=..., losses=...)`` on every rank (the first stage's
    rank passes the inputs, the last's the target). After every ``replan.exchange_every``-th step every rank takes
    part in one small broadcast on ``group`` (rank 0's step times decide); when rank 0 saw a drift since the last
    one, every rank's recent action times are gathered, rank 0 predicts every candidate on the refreshed costs and,
    when one is faster by more than the noise, every rank switches to it before the next step.

    Parameters
    ----------
    stages : sequence of PipelineStage
        This rank's stages, in stage order (``program.rank_stages(rank)``); kept across switches.
    loss_fn : callable
        ``loss_fn(output, target)`` per micro-batch, as PyTorch's schedules take it.
    program : PPProgram
        The schedule to start with (:func:`~autosched.pp.program.pp_program`, or a searched one).
    costs : PPCosts
        The stages' costs at ``program``'s micro-batch size (``calibrate_pp``, ``measure_stage_costs``): what the
        measured actions refresh.
    microbatches : sequence of int, optional
        The micro-batch counts it may switch to (default: ``program``'s only). Other counts need
        ``costs.samples_per_microbatch``.
    candidates : sequence of PPProgram, optional
        The programs it may switch to (default: PyTorch's schedules on the same stage layout for each count,
        :func:`same_layout_programs`). Only those with ``program``'s stage-to-rank map are kept.
    search : bool
        Also search a schedule on the refreshed costs (``swpipe.search``, within ``replan.time_limit_s``, the ranks
        waiting) and offer it (when it runs on these stages).
    replan : ReplanOptions or None
        When to choose again (``warmup``, ``window``, ``patience``, ``min_noise``, ``spread_k``; ``constraints``'
        ``max_memory_bytes`` caps the candidates' predicted peak; on several ranks ``exchange_every``: the steps a
        choice is made after); ``None``: never (a plain schedule, same calls).
    group : ProcessGroup, optional
        A gloo group of its own for the decisions, the same on every rank (``dist.new_group(backend="gloo")``);
        ``None``: one process decides alone (every stage on this rank).
    clock : callable, optional
        Seconds around each step on rank 0 (default ``time.perf_counter``); tests script it.
    costs_now : callable, optional
        ``costs_now(stats) -> PPCosts``: the costs now from every rank's ``{action: WindowStats}`` (default
        :func:`~autosched.pp.rolling.refreshed_pp_costs` of the running costs).

    Attributes
    ----------
    program : PPProgram
        The program running now; :attr:`schedule` its PyTorch schedule object.
    decisions : list of SwitchDecision
        Every decision (rank 0's, told to every rank when it switched).
    steps : int
        Steps run so far.

    Raises
    ------
    OptionError
        ``replan`` is not a ``ReplanOptions``; a micro-batch count without ``costs.samples_per_microbatch``.
    """

    def __init__(self, stages: Sequence[Any], loss_fn: Callable[..., Any], program: PPProgram, costs: PPCosts, *,
                 microbatches: Optional[Sequence[int]] = None, candidates: Optional[Sequence[PPProgram]] = None,
                 search: bool = False, replan: Optional[ReplanOptions] = ReplanOptions(), group: Any = None,
                 clock: Optional[Callable[[], float]] = None,
                 costs_now: Optional[Callable[[List[Any]], PPCosts]] = None) -> None:
        if replan is not None and not isinstance(replan, ReplanOptions):
            raise OptionError("AdaptiveSchedule", "replan", replan, expected="a ReplanOptions or None")
        counts = list(microbatches) if microbatches is not None else [program.n_microbatches]
        if any(n != program.n_microbatches for n in counts) and costs.samples_per_microbatch <= 0:
            raise OptionError("AdaptiveSchedule", "microbatches", counts, expected=(
                f"[{program.n_microbatches}] with costs of no micro-batch size"),
                fix="measure the costs with their samples_per_microbatch (calibrate_pp does) to offer other counts")
        self.stages, self.loss_fn, self.program, self.costs = list(stages), loss_fn, program, costs
        self.replan = replan
        pool = list(candidates) if candidates is not None else same_layout_programs(program, counts)
        self.candidates = [p for p in pool if p.stage_to_rank == program.stage_to_rank]
        self._search, self._clock = search, clock if clock is not None else time.perf_counter
        self._costs_now = costs_now if costs_now is not None else (
            lambda stats: refreshed_pp_costs(self.costs, stats).costs)
        self._exchange = (DecisionExchange(group, replan.exchange_every) if group is not None and replan is not None
                          else None)
        self.decisions: List[SwitchDecision] = []
        self.steps = 0
        self._timing: Optional[RollingStepCosts] = None
        self._build(program)

    # ------------------------------------------------------------- what a user calls

    def step(self, *args: Any, target: Any = None, losses: Optional[List[Any]] = None, **kwargs: Any) -> Any:
        """One step of the running schedule (as its ``step``), then the check and, on drift, the choice.

        Raises
        ------
        ReplanError
            On a rank other than 0, rank 0's choice failed, or the ranks are out of step.
        """
        t0 = self._clock()
        out = self.schedule.step(*args, target=target, losses=losses, **kwargs)
        elapsed = self._clock() - t0
        if self.replan is not None:
            self._after_step(self.steps, elapsed)
        self.steps += 1
        return out

    @property
    def swaps(self) -> List[SwitchDecision]:
        """The decisions that switched, in order."""
        return [d for d in self.decisions if d.swapped]

    @property
    def reference_s(self) -> Optional[float]:
        """The step time the running configuration is watched against (``None`` until its baseline is measured)."""
        return self._watch.reference_s

    def close(self) -> None:
        """Stop timing the stages' actions (their methods as before)."""
        if self._timing is not None:
            self._timing.__exit__(None, None, None)
            self._timing = None

    def __enter__(self) -> "AdaptiveSchedule":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------- internals

    def _build(self, program: PPProgram) -> None:
        """``program``'s schedule object on the same stages, its actions timed into a fresh window."""
        self.close()
        self.program = program
        self.schedule = program.torch_schedule(self.stages, self.loss_fn)
        window = self.replan.window if self.replan is not None else 1
        self._timing = RollingStepCosts(self.schedule, self.stages, window=window).__enter__()
        self._watch = PeriodWatch(self.replan if self.replan is not None else ReplanOptions())
        self._drifted = False  # rank 0 saw a drift: it chooses at the next exchange

    def _after_step(self, idx: int, elapsed: float) -> None:
        exchange = self._exchange
        if exchange is not None and exchange.rank != 0:
            if exchange.due(idx) and exchange.poll(idx):
                exchange.gather(self._timing.stats())
                decision = exchange.hear_object(idx)
                if decision is not None:
                    self._switch(decision)
            return
        said = self._watch.add(elapsed)
        if said == "baseline" and self.decisions:
            self.decisions[-1].measured_after(self._watch.reference_s)
        self._drifted = self._drifted or said == "drift"
        if exchange is not None:
            if not exchange.due(idx):
                return
            exchange.poll(idx, self._drifted)
        drift, self._drifted = self._drifted, False
        if not drift:
            return
        try:
            stats = exchange.gather(self._timing.stats()) if exchange is not None else [self._timing.stats()]
            decision = self._decide(idx, stats)
        except BaseException:
            if exchange is not None:
                exchange.tell_failure(idx)
            raise
        if exchange is not None:
            exchange.tell_object(idx, decision if decision.swapped else None)
        if decision.swapped:
            self._switch(decision)
        else:
            self._watch.rebase(decision.measured_s)

    def _decide(self, idx: int, stats: List[Any]) -> SwitchDecision:
        watch, opts = self._watch, self.replan
        costs = self._costs_now(stats)
        candidates = list(self.candidates)
        if self._search:
            candidates.extend(self._searched(costs))
        cap = opts.constraints.max_memory_bytes if opts.constraints is not None else None
        choice = choose_schedule(self.program, candidates, costs, watch.noise, max_memory_bytes=cap)
        decision = SwitchDecision(
            step=idx, reference_s=watch.reference_s, measured_s=watch.last_s, noise=watch.noise, costs=costs,
            predicted=choice.predicted, running=schedule_label(self.program), chosen=schedule_label(choice.program),
            predicted_old_s=choice.running_s, predicted_new_s=choice.best_s, swapped=choice.swap,
            starts_at=idx + 1 if choice.swap else None, choice=choice.program)
        self.decisions.append(decision)
        _log.info("re-planning: %s", decision)
        return decision

    def _searched(self, costs: PPCosts) -> List[PPProgram]:
        """The search's exported program on the costs now, when it runs on these stages."""
        from autosched.pp.search import pp_search
        from autosched.search.options import SolverOptions

        counts = sorted({p.n_microbatches for p in self.candidates} | {self.program.n_microbatches})
        samples = costs.samples_per_microbatch * self.program.n_microbatches
        by_count = {n: {costs.n_stages: costs if n == self.program.n_microbatches else costs.rescaled(samples // n)}
                    for n in counts if n == self.program.n_microbatches or samples % n == 0}
        found = pp_search(costs, self.program.n_ranks, list(by_count), costs_for_microbatches=by_count,
                          solver=SolverOptions(time_limit_s=self.replan.time_limit_s))
        program = found.exported.program
        if program.source == "pytorch" or program.stage_to_rank != self.program.stage_to_rank:
            return []  # one of PyTorch's (a candidate already), or on other stages
        return [dataclasses.replace(program, schedule="swpipe-searched")]

    def _switch(self, decision: SwitchDecision) -> None:
        """Every rank, between two steps: the chosen program's schedule object on the same stages."""
        if not self.decisions or self.decisions[-1] is not decision:
            self.decisions.append(decision)
        program = decision.choice
        if program.n_microbatches != self.program.n_microbatches and self.costs.samples_per_microbatch > 0:
            samples = self.costs.samples_per_microbatch * self.program.n_microbatches
            self.costs = decision.costs.rescaled(samples // program.n_microbatches)
        else:
            self.costs = decision.costs
        self._build(program)
