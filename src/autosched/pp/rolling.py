"""PyTorch's pipelining runtime measured on the user's stages: once ahead (calibrate_pp), and while it trains.

:class:`RollingStepCosts` wraps a schedule's ``step`` and its stages' public
per-action methods (``forward_one_chunk``, ``backward_one_chunk``,
``backward_weight_one_chunk``, which every schedule calls through the stage)
for the ``with`` block: each step's wall time goes into a
:class:`~swpipe_core.measure.rolling.RollingCosts` as ``"step"``, and each
action's as ``"F<stage>"``, ``"B<stage>"`` (a full backward), ``"I<stage>"``
(the input gradients of a split backward) and ``"W<stage>"`` (its weight
gradients). An action's time is what the runtime spent in it on this rank,
its own Python around the module included (what
:attr:`PPCosts.action_overhead_s <autosched.pp.costs.PPCosts.action_overhead_s>`
stands for) and the transfers it waits for excluded. The time the rank spends
posting its sends and receives and waiting for them (PyTorch's module-level
``_batch_p2p`` and ``_wait_batch_p2p``, which every schedule posts and waits
through) goes in as ``"post"`` and ``"wait"``, and each step's split into
compute, posting, waiting and the rest is kept (:class:`StepSplit`,
:meth:`RollingStepCosts.split`): where a step's time went on this rank, which
a prediction from the stages' costs alone cannot see (on a loaded machine the
busiest rank's posts took 1-2 ms each where the others' took 0.1 ms).

:func:`refreshed_pp_costs` puts the windows' medians in place of a
:class:`~autosched.pp.costs.PPCosts`' stage times where a window holds enough
samples, with the freshness report of plan cost models
(:class:`~autosched.model.refresh.CostFreshness`). Each rank measures only its
own stages: gather the ranks' ``rolling.stats()`` (``dist.all_gather_object``)
and pass the list.

:func:`measure_action_overhead` measures, on the user's stages in the user's
process, what the runtime adds per compute action: every stage on one rank
(``LoopedBFS`` over a one-rank group, no transfers), each timed step paired
with the stages' own costs measured right after it, so both share the load.
:func:`measure_custom_overhead` measures what a custom order's path adds per
action beyond PyTorch's own class: the same order run both ways on the user's
stages in the user's group, in paired rounds (:class:`CustomPathProbe`).
:func:`calibrate_pp` is the one calibration ahead of a job: the stages' costs,
the link in the job's process group (its cost per posted transfer included), the
runtime's cost per action and a custom order's path's, as one
:class:`~autosched.pp.costs.PPCosts`.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple, Union

from autosched.pp.program import PPError
from swpipe_core.engine.device import as_device

__all__ = ["RollingStepCosts", "StepSplit", "refreshed_pp_costs", "PPRefreshed", "measure_action_overhead",
           "ActionOverhead", "measure_custom_overhead", "CustomOverhead", "CustomPathProbe", "calibrate_pp",
           "check_pp_corrections", "PP_CORRECTIONS", "ACTION_METHODS", "P2P_HELPERS"]

#: the stage methods wrapped, and the action letter each call is recorded as
ACTION_METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
_FIELD_OF = {"F": "forward_s", "B": "backward_s", "I": "backward_input_s", "W": "backward_weight_s"}
#: PyTorch's module-level helpers every schedule posts its transfers and waits for them through, and the window
#: each call (with at least one operation) is recorded as
P2P_HELPERS = (("_batch_p2p", "post"), ("_wait_batch_p2p", "wait"))


@dataclass(frozen=True)
class StepSplit:
    """Where one rank's ``schedule.step`` went (seconds): its actions, posting transfers, waiting for them.

    Attributes
    ----------
    step_s : float
    compute_s : float
        The stages' actions (F, B, I, W), the runtime's Python around each included.
    post_s : float
        Posting sends and receives (``_batch_p2p``).
    wait_s : float
        Waiting for posted transfers (``_wait_batch_p2p``).

    Examples
    --------
    >>> StepSplit(0.010, 0.006, 0.001, 0.002).other_s
    0.001
    """

    step_s: float
    compute_s: float
    post_s: float
    wait_s: float

    @property
    def other_s(self) -> float:
        """The rest of the step: the schedule's own Python, the loss, what the rank did between the calls timed."""
        return round(self.step_s - self.compute_s - self.post_s - self.wait_s, 12)


def _action_of(method: str, kwargs: Dict[str, Any], args: Tuple[Any, ...]) -> str:
    if method == "forward_one_chunk":
        return "F"
    if method == "backward_weight_one_chunk":
        return "W"
    # backward_one_chunk(bwd_chunk_id, loss=None, full_backward=True, last_backward=False)
    full = kwargs.get("full_backward", args[2] if len(args) > 2 else True)
    return "B" if full else "I"


class RollingStepCosts:
    """For the ``with`` block, time every ``schedule.step`` and every action of its stages into a rolling window.

    Parameters
    ----------
    schedule : torch.distributed.pipelining schedule
        The schedule this rank steps (``ScheduleGPipe``, ``Schedule1F1B``, a multi-stage one).
    stages : sequence of PipelineStage, optional
        This rank's stages (default: the schedule's own).
    rolling : RollingCosts, optional
        The window to record into (default: a new one of ``window`` samples).
    window : int
        Samples kept per action when ``rolling`` is not given.

    Raises
    ------
    RuntimeError
        Entered twice at once.

    Examples
    --------
    >>> import torch, torch.distributed as dist
    >>> from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    >>> if not dist.is_initialized():
    ...     dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> stage = PipelineStage(torch.nn.Linear(4, 2), 0, 1, torch.device("cpu"))
    >>> schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=torch.nn.functional.mse_loss)
    >>> with RollingStepCosts(schedule) as costs:
    ...     for _ in range(3):
    ...         _ = schedule.step(torch.randn(8, 4), target=torch.randn(8, 2))
    >>> {name: s.recorded for name, s in costs.rolling.stats().items()}
    {'F0': 6, 'B0': 6, 'step': 3}
    >>> split = costs.split()  # one rank: nothing to post or wait for
    >>> 0 < split.compute_s <= split.step_s, split.post_s, split.wait_s
    (True, 0.0, 0.0)
    >>> dist.destroy_process_group()
    """

    def __init__(self, schedule: Any, stages: Optional[Sequence[Any]] = None, rolling: Any = None,
                 window: int = 64) -> None:
        from swpipe_core.measure.rolling import RollingCosts

        if stages is None:
            from autosched.pp import _torch

            stages = _torch.schedule_stages(schedule)
        self.schedule = schedule
        self.stages = list(stages)
        self.rolling = rolling if rolling is not None else RollingCosts(window)
        self._installed: List[Tuple[Any, str, Any]] = []  # (object, attribute, what its instance held before)
        self._splits: Deque[StepSplit] = deque(maxlen=window if rolling is None else rolling.window)
        self._open: Optional[Dict[str, float]] = None  # the step running now: seconds per part so far

    def __enter__(self) -> "RollingStepCosts":
        if self._installed:
            raise RuntimeError("RollingStepCosts: already entered; leave the block before entering it again")
        self._wrap_step()
        for stage in self.stages:
            index = stage.stage_index
            for method in ACTION_METHODS:
                self._wrap(stage, method, lambda args, kwargs, m=method, s=index: f"{_action_of(m, kwargs, args)}{s}",
                           part="compute_s")
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._installed:  # in reverse, each instance attribute as it was
            obj, name, before = self._installed.pop()
            if before is None:
                del obj.__dict__[name]
            else:
                obj.__dict__[name] = before

    def _wrap(self, obj: Any, name: str, label: Callable[[Tuple[Any, ...], Dict[str, Any]], str],
              part: str) -> None:
        original = getattr(obj, name)
        rolling, clock = self.rolling, self.rolling.clock

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            out = original(*args, **kwargs)
            seconds = clock() - t0
            rolling.add(label(args, kwargs), seconds)
            if self._open is not None:
                self._open[part] += seconds
            return out

        self._installed.append((obj, name, obj.__dict__.get(name)))
        obj.__dict__[name] = timed  # an instance attribute: the runtime calls stage.forward_one_chunk(...) through it

    def _wrap_step(self) -> None:
        """``schedule.step`` timed, and for its duration PyTorch's post and wait helpers timed too: they are module
        functions, shared by every schedule of the process, so they are wrapped only while this schedule steps."""
        from torch.distributed.pipelining import schedules as helpers

        original = self.schedule.step
        rolling, clock = self.rolling, self.rolling.clock

        def p2p(function: Callable[..., Any], label: str, part: str) -> Callable[..., Any]:
            def timed(ops: Any, *args: Any, **kwargs: Any) -> Any:
                if not ops:  # nothing posted or waited for: not a transfer
                    return function(ops, *args, **kwargs)
                t0 = clock()
                out = function(ops, *args, **kwargs)
                seconds = clock() - t0
                rolling.add(label, seconds)
                if self._open is not None:
                    self._open[part] += seconds
                return out
            return timed

        def step(*args: Any, **kwargs: Any) -> Any:
            before = {name: getattr(helpers, name) for name, _ in P2P_HELPERS if hasattr(helpers, name)}
            for name, label in P2P_HELPERS:
                if name in before:
                    setattr(helpers, name, p2p(before[name], label, f"{label}_s"))
            self._open = {"compute_s": 0.0, "post_s": 0.0, "wait_s": 0.0}
            t0 = clock()
            try:
                out = original(*args, **kwargs)
                seconds = clock() - t0
            finally:  # a step that raised is not recorded; the helpers are PyTorch's again either way
                for name, function in before.items():
                    setattr(helpers, name, function)
                parts, self._open = self._open, None
            rolling.add("step", seconds)
            self._splits.append(StepSplit(step_s=seconds, **parts))
            return out

        self._installed.append((self.schedule, "step", self.schedule.__dict__.get("step")))
        self.schedule.__dict__["step"] = step

    def split(self) -> Optional[StepSplit]:
        """The split of the median step in the window (the lower middle one of an even count): the parts of one
        step, so they add up to it (``None`` before the first step)."""
        if not self._splits:
            return None
        ordered = sorted(self._splits, key=lambda s: s.step_s)
        return ordered[(len(ordered) - 1) // 2]

    def stats(self) -> Dict[str, Any]:
        """``{action: WindowStats}`` of this rank (``rolling.stats()``): ``"step"``, ``"F0"``, ``"B1"``, ..."""
        return self.rolling.stats()


@dataclass(frozen=True)
class PPRefreshed:
    """Costs refreshed from the runtime's own measurements.

    Attributes
    ----------
    costs : PPCosts
        The stage times replaced by the windows' medians where there were enough samples.
    freshness : CostFreshness
        Per action (``"F0"``, ``"B1"``, ...): where its time came from, samples, age, spread.
    step : WindowStats or None
        The measured step's window (the slowest rank's median, over the lists given), to set
        beside ``pp_simulate(program, costs).step_s``.
    """

    costs: Any
    freshness: Any
    step: Any = None


def _merged(windows: Any) -> Dict[str, Any]:
    """One ``{action: WindowStats}`` over ranks: each action from the rank with the most samples of it."""
    if hasattr(windows, "stats"):
        windows = [windows]
    merged: Dict[str, Any] = {}
    for w in windows:
        stats = w.stats() if hasattr(w, "stats") else dict(w)
        for name, s in stats.items():
            have = merged.get(name)
            if name == "step":  # the job's step is the slowest rank's
                if have is None or s.median_s > have.median_s:
                    merged[name] = s
            elif have is None or s.samples > have.samples:
                merged[name] = s
    return merged


def refreshed_pp_costs(costs: Any, windows: Any, min_samples: int = 5) -> PPRefreshed:
    """``costs`` with each stage's F, B, I and W times from the runtime's recent actions, where enough were timed.

    Parameters
    ----------
    costs : PPCosts
        The costs to refresh (measured ahead, e.g. :func:`~autosched.pp.costs.measure_stage_costs`).
    windows : RollingCosts, RollingStepCosts or list
        This rank's window, or every rank's (``RollingCosts`` or the ``stats()`` dicts,
        e.g. gathered with ``dist.all_gather_object``).
    min_samples : int
        The fewest samples that replace a time (``>= 1``); an action with fewer keeps its cost.

    Returns
    -------
    PPRefreshed

    Raises
    ------
    PPError
        ``min_samples`` not an integer >= 1 (``rule="bad_value"``, ``field="min_samples"``).

    Examples
    --------
    >>> from swpipe_core.measure.rolling import RollingCosts
    >>> from autosched.pp.costs import PPCosts, StageCost
    >>> r = RollingCosts()
    >>> for d in (0.004, 0.005, 0.004, 0.3, 0.004):
    ...     r.add("F1", d)
    >>> out = refreshed_pp_costs(PPCosts((StageCost(0.001, 0.002), StageCost(0.001, 0.002))), r)
    >>> out.costs.stages[1].forward_s, out.costs.stages[0].forward_s, out.freshness.refreshed
    (0.004, 0.001, ['F1'])
    """
    from autosched.model.refresh import CostFreshness, TaskFreshness

    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1:
        raise PPError("bad_value", "min_samples", min_samples, detail="an integer >= 1")
    if isinstance(windows, RollingStepCosts):
        windows = windows.rolling
    stats = _merged(windows)
    stages = list(costs.stages)
    fresh: Dict[str, TaskFreshness] = {}
    for s, cost in enumerate(stages):
        for letter, field in _FIELD_OF.items():
            name = f"{letter}{s}"
            w = stats.get(name)
            use = w is not None and w.samples >= min_samples
            if use:
                cost = replace(cost, **{field: w.median_s})
            if w is not None or getattr(cost, field) > 0:
                fresh[name] = TaskFreshness(name, "window" if use else "model", w)
        stages[s] = cost
    return PPRefreshed(replace(costs, stages=tuple(stages)), CostFreshness(fresh, min_samples), stats.get("step"))


@dataclass(frozen=True)
class ActionOverhead:
    """What PyTorch's runtime adds per compute action, measured on the user's stages.

    Attributes
    ----------
    overhead_s : float
        The median over the rounds, at least 0: pass it to
        :meth:`PPCosts.with_action_overhead <autosched.pp.costs.PPCosts.with_action_overhead>`.
    rounds_s : tuple of float
        Each round's ``(measured step - simulated step) / compute actions`` (may be negative: noise).
    actions : int
        Compute actions per step.
    """

    overhead_s: float
    rounds_s: Tuple[float, ...]
    actions: int

    @property
    def spread_s(self) -> float:
        """The interquartile range of the rounds (their range under 4 rounds)."""
        return _spread_s(self.rounds_s)


def _spread_s(rounds: Sequence[float]) -> float:
    """The interquartile range of per-round figures, in their unit (their range under 4; 0 for none): the spread of
    a difference, whose median may be 0 or negative where a relative spread means nothing."""
    v = sorted(rounds)
    if not v:
        return 0.0
    if len(v) < 4:
        return v[-1] - v[0]
    q = statistics.quantiles(v, n=4, method="inclusive")
    return q[2] - q[0]


def _one_rank_group(group: Any) -> Any:
    import torch.distributed as dist

    size = dist.get_world_size(group)
    if size != 1:
        raise PPError("bad_value", "group", group, detail=(
            f"a process group of one rank (this one has {size}): every rank creates one group per rank, in the same "
            "order (alone = [dist.new_group([r]) for r in range(world)]), and passes alone[rank]"))
    return group


def measure_action_overhead(stages: Sequence[Any], microbatch: Any, target: Any, loss_fn: Callable[..., Any], *,
                            n_microbatches: int = 4, group: Any = None, steps: int = 5,
                            costs: Any = None) -> ActionOverhead:
    """What PyTorch's runtime adds to each compute action, on these stage modules, in this process.

    Every stage runs on this rank (``LoopedBFS`` over ``n_microbatches`` micro-batches on a
    one-rank group: no transfers). Each of ``steps`` rounds times one step and then measures
    the stages' own costs once (:func:`~autosched.pp.costs.measure_stage_costs`; or uses
    ``costs`` as given); the round's overhead is ``(step - simulated step) / actions``. The
    modules' parameters, buffers, gradients and torch's generators are put back afterwards.

    Parameters
    ----------
    stages : sequence of torch.nn.Module
        The stage modules in order (all of them, as :func:`~autosched.pp.costs.measure_stage_costs` takes).
    microbatch, target : torch.Tensor
        One micro-batch and its target.
    loss_fn : callable
        ``loss_fn(output, target)``, as given to the schedule.
    n_microbatches : int
        Micro-batches per step.
    group : ProcessGroup, optional
        A one-rank group to run on. Default: the default group when it has one rank, or
        a one-rank group of its own when no process group exists (made and destroyed here).
    steps : int
        Timed rounds (after one untimed step).
    costs : PPCosts, optional
        Fixed stage costs to simulate with instead of measuring them each round.

    Returns
    -------
    ActionOverhead

    Raises
    ------
    PPError
        ``group`` (or the default group) with more than one rank, or ``steps`` /
        ``n_microbatches`` not an integer >= 1 (``rule="bad_value"``, ``.field``).

    Examples
    --------
    >>> import torch
    >>> stages = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)]
    >>> out = measure_action_overhead(stages, torch.randn(4, 8), torch.randn(4, 2), torch.nn.functional.mse_loss,
    ...                               n_microbatches=2, steps=2)
    >>> out.actions, len(out.rounds_s), out.overhead_s >= 0
    (8, 2, True)
    """
    import torch
    import torch.distributed as dist

    for name, value in (("steps", steps), ("n_microbatches", n_microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PPError("bad_value", name, value, detail="an integer >= 1")
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return _overhead_rounds(list(stages), microbatch, target, loss_fn, n_microbatches, _one_rank_group(group),
                                steps, costs)
    finally:
        if own:
            dist.destroy_process_group()


def _overhead_rounds(modules: List[Any], microbatch: Any, target: Any, loss_fn: Callable[..., Any], n_mb: int,
                     group: Any, steps: int, costs: Any) -> ActionOverhead:
    import torch
    from torch.distributed.pipelining import PipelineStage

    from autosched.pp import _torch
    from autosched.pp.costs import PPCosts, measure_stage_costs
    from autosched.pp.program import pp_program
    from autosched.pp.simulate import pp_simulate
    from swpipe_core.measure.state import restore_state, snapshot_state

    n = len(modules)
    snapshot = snapshot_state(modules)
    try:
        device = microbatch.device
        pstages = [PipelineStage(m, s, n, device, group=group) for s, m in enumerate(modules)]
        schedule = _torch.schedule_class("LoopedBFS")(pstages, n_mb, loss_fn=loss_fn)
        program = pp_program("LoopedBFS", 1, n_mb, stages_per_rank=n)
        actions = len(program.compute[0])
        x, y = torch.cat([microbatch] * n_mb), torch.cat([target] * n_mb)
        sync = as_device(device).synchronize

        def step() -> float:
            for m in modules:
                m.zero_grad(set_to_none=False)
            sync()
            t0 = time.perf_counter()
            schedule.step(x, target=y, losses=[], return_outputs=False)
            sync()
            return time.perf_counter() - t0

        step()  # warm-up: the runtime shapes its buffers on the first step
        rounds = []
        for _ in range(steps):
            measured = step()
            stage_costs = costs if costs is not None else PPCosts(measure_stage_costs(modules, microbatch, target,
                                                                                      loss_fn, repeats=1, warmup=0))
            predicted = pp_simulate(program, stage_costs.with_action_overhead(0.0)).step_s
            rounds.append((measured - predicted) / actions)
    finally:
        restore_state(modules, snapshot)
    return ActionOverhead(max(0.0, statistics.median(rounds)), tuple(rounds), actions)


@dataclass(frozen=True)
class CustomOverhead:
    """What a custom order's path adds per compute action beyond PyTorch's own class, measured on the user's stages.

    Attributes
    ----------
    overhead_s : float
        The median over the rounds, at least 0: :attr:`PPCosts.custom_overhead_s
        <autosched.pp.costs.PPCosts.custom_overhead_s>`.
    rounds_s : tuple of float
        Each round's ``(custom step - class step) / actions`` (may be negative: noise).
    builtin_steps_s, custom_steps_s : tuple of float
        Each round's step run by PyTorch's class and by the custom path (the slowest rank's).
    actions : int
        Compute actions per step on the busiest rank.
    schedule : str
        The order run both ways (``"1F1B"`` with one stage per rank, ``"Interleaved1F1B"`` with several).
    program : PPProgram or None
        PyTorch's program the class ran: what :attr:`builtin_steps_s` are steps of (the held-out steps
        :func:`check_pp_corrections` judges the corrections on).
    """

    overhead_s: float
    rounds_s: Tuple[float, ...]
    builtin_steps_s: Tuple[float, ...]
    custom_steps_s: Tuple[float, ...]
    actions: int
    schedule: str
    program: Any = None

    @property
    def spread_s(self) -> float:
        """The interquartile range of the rounds, seconds per action (their range under 4 rounds)."""
        return _spread_s(self.rounds_s)

    @property
    def noise(self) -> float:
        """The steps' own spread: the larger :func:`~swpipe_core.measure.rolling.relative_iqr` of the two paths'."""
        from swpipe_core.measure.rolling import relative_iqr

        return max(relative_iqr(self.builtin_steps_s), relative_iqr(self.custom_steps_s))

    @classmethod
    def from_steps(cls, builtin: Sequence[Sequence[float]], custom: Sequence[Sequence[float]], actions: int,
                   schedule: str, program: Any = None) -> "CustomOverhead":
        """The figure from each rank's step times, round by round (the rounds paired: both paths in each).

        A round's step is its slowest rank's (the pipeline's step); its figure ``(custom - class) / actions``;
        the overhead their median, at least 0.

        Parameters
        ----------
        builtin, custom : sequence of sequence of float
            Per rank, each round's step by PyTorch's class and by the custom path.
        actions : int
            Compute actions per step on the busiest rank.
        schedule : str
        program : PPProgram, optional
            PyTorch's program the class ran.

        Returns
        -------
        CustomOverhead

        Raises
        ------
        PPError
            No rounds, or ranks or paths with different round counts (``rule="bad_value"``, ``field="rounds"``).

        Examples
        --------
        >>> out = CustomOverhead.from_steps([[1.0, 1.0, 1.0], [1.2, 1.0, 1.1]], [[1.1, 1.4, 1.3], [1.0, 1.4, 1.0]],
        ...                                 actions=10, schedule="1F1B")
        >>> out.builtin_steps_s, out.custom_steps_s, [round(r, 6) for r in out.rounds_s], round(out.overhead_s, 6)
        ((1.2, 1.0, 1.1), (1.1, 1.4, 1.3), [-0.01, 0.04, 0.02], 0.02)
        >>> CustomOverhead.from_steps([[1.0, 1.0]], [[0.9, 0.8]], actions=4, schedule="1F1B").overhead_s
        0.0
        """
        counts = {len(r) for r in list(builtin) + list(custom)}
        if len(counts) != 1 or 0 in counts or not builtin or len(builtin) != len(custom):
            raise PPError("bad_value", "rounds", sorted(counts), detail=(
                "every rank's step times for both paths, the same number of rounds (at least one): step each "
                "rank's probe in the same rounds"))
        slow_b = tuple(max(r[i] for r in builtin) for i in range(counts.pop()))
        slow_c = tuple(max(r[i] for r in custom) for i in range(len(slow_b)))
        rounds = tuple((c - b) / actions for b, c in zip(slow_b, slow_c))
        return cls(max(0.0, statistics.median(rounds)), rounds, slow_b, slow_c, actions, schedule, program)


class CustomPathProbe:
    """PyTorch's class and a custom order's path (:func:`~autosched.pp.program.schedule_for`) running the same order
    on the user's stages in the user's process group, in paired rounds.

    The order is ``1F1B``'s with one stage per rank, ``Interleaved1F1B``'s with several (the stages placed in a loop,
    stage ``s`` on rank ``s % ranks``); one run by PyTorch's class, the other by the custom path
    (``_PipelineScheduleRuntime`` on :func:`~autosched.pp.program.program_from_order`'s lowering). Every
    :meth:`round` steps each once after a barrier (which goes first alternates), so both share the load's swings;
    :meth:`result` gathers every rank's steps (every rank calls it) into a :class:`CustomOverhead`. The modules'
    parameters, buffers, gradients and torch's generators are put back by :meth:`close` (or the ``with`` block).
    :func:`measure_custom_overhead` is this probe stepped ``steps`` rounds; ``swpipe pp`` steps it before the
    search, then (:meth:`drop_rounds`) once in every round of its runs.

    Parameters
    ----------
    stages : sequence of torch.nn.Module
        Every stage module, in order (each rank passes all of them): a multiple of the group's ranks.
    microbatch, target : torch.Tensor
        One micro-batch and its target.
    loss_fn : callable
    group : ProcessGroup, optional
        The job's group (default: the default group, which must exist).
    n_microbatches : int, optional
        Micro-batches per step (default: 4, or the group's ranks if more: 1F1B runs at least one per stage).
    warmup : int
        Untimed rounds first (the runtime shapes its buffers on the first step).

    Raises
    ------
    PPError
        No process group; a stage count that is not a multiple of the group's ranks (``field="stages"``);
        ``n_microbatches`` or ``warmup`` out of range or too few micro-batches for the order (``rule="bad_value"``
        or the order's own rule, ``.field``).
    """

    def __init__(self, stages: Sequence[Any], microbatch: Any, target: Any, loss_fn: Callable[..., Any], *,
                 group: Any = None, n_microbatches: Optional[int] = None, warmup: int = 1) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.pipelining import PipelineStage

        from autosched.pp.program import pp_program, program_from_order, schedule_for
        from swpipe_core.measure.state import snapshot_state

        if not dist.is_initialized():
            raise PPError("bad_value", "group", group, detail=(
                "a process group: call it on every rank of the job after dist.init_process_group (or call "
                "measure_custom_overhead, which makes a one-rank group when none exists)"))
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        modules = list(stages)
        if not modules or len(modules) % world:
            raise PPError("bad_value", "stages", len(modules), detail=(
                f"every stage module, as many as the group's {world} ranks or a multiple of them (each rank passes "
                "all of them)"))
        n_mb = max(4, world) if n_microbatches is None else n_microbatches
        for name, value, least in (("n_microbatches", n_mb, 1), ("warmup", warmup, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise PPError("bad_value", name, value, detail=f"an integer >= {least}")
        per = len(modules) // world
        self.schedule = "1F1B" if per == 1 else "Interleaved1F1B"
        builtin = pp_program(self.schedule, world, n_mb, None if per == 1 else per)
        custom = program_from_order(builtin.compute, n_mb, builtin.stage_to_rank, f"{self.schedule}-order")
        self.group, self.program = group, builtin
        self.actions = max(len(actions) for actions in builtin.compute.values())
        self.modules = modules
        mine = builtin.rank_stages(rank)
        self._snapshot = snapshot_state(modules)
        device = microbatch.device
        self._sync = as_device(device).synchronize
        self._schedules = tuple(
            schedule_for(p, [PipelineStage(modules[s], s, len(modules), device, group=group) for s in mine], loss_fn)
            for p in (builtin, custom))
        self._first, self._last = 0 in mine, len(modules) - 1 in mine
        self._x, self._y = torch.cat([microbatch] * n_mb), torch.cat([target] * n_mb)
        self.steps_s: Tuple[List[float], List[float]] = ([], [])  # this rank's, by PyTorch's class and the path
        for _ in range(warmup):
            self._round(timed=False)

    def _step(self, path: int) -> float:
        import torch.distributed as dist

        for m in self.modules:
            m.zero_grad(set_to_none=False)
        args = (self._x,) if self._first else ()
        kwargs: Dict[str, Any] = {"target": self._y, "losses": []} if self._last else {}
        dist.barrier(group=self.group)  # every rank starts the step together: the step is the pipeline's
        self._sync()
        t0 = time.perf_counter()
        self._schedules[path].step(*args, return_outputs=False, **kwargs)
        self._sync()
        return time.perf_counter() - t0

    def _round(self, timed: bool) -> None:
        order = (0, 1) if len(self.steps_s[0]) % 2 == 0 else (1, 0)
        took = {path: self._step(path) for path in order}
        if timed:
            for path in (0, 1):
                self.steps_s[path].append(took[path])

    def round(self) -> None:
        """One timed step of each path (every rank calls it, in the same rounds)."""
        self._round(timed=True)

    def drop_rounds(self) -> None:
        """The rounds timed so far let go: :meth:`result` reads only the rounds stepped from here on, so that the
        steps judging a prediction were taken in the conditions of the runs it predicts (every rank calls it at the
        same point)."""
        for steps in self.steps_s:
            steps.clear()

    def result(self) -> CustomOverhead:
        """Every rank's rounds so far, gathered on the group (every rank calls it; all get the same figure).

        Raises
        ------
        PPError
            No round yet (``field="rounds"``).
        """
        import torch.distributed as dist

        gathered: List[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(gathered, self.steps_s, group=self.group)
        return CustomOverhead.from_steps([g[0] for g in gathered], [g[1] for g in gathered], self.actions,
                                         self.schedule, self.program)

    def close(self) -> None:
        """The modules put back as they were before the probe (idempotent)."""
        from swpipe_core.measure.state import restore_state

        if self._snapshot is not None:
            restore_state(self.modules, self._snapshot)
            self._snapshot = None

    def __enter__(self) -> "CustomPathProbe":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def measure_custom_overhead(stages: Sequence[Any], microbatch: Any, target: Any, loss_fn: Callable[..., Any], *,
                            group: Any = None, n_microbatches: Optional[int] = None, steps: int = 5,
                            warmup: int = 1) -> CustomOverhead:
    """What a custom order's path adds per compute action beyond PyTorch's own class, on these stage modules, in
    this process group.

    The same order runs both ways on the user's stages (:class:`CustomPathProbe`: ``1F1B``'s with one stage per
    rank, ``Interleaved1F1B``'s with several): by PyTorch's class and by :func:`~autosched.pp.program.schedule_for`'s
    path for a custom order. Each of ``steps`` paired rounds steps both; a round's figure is ``(custom step - class
    step) / actions`` (each step the slowest rank's), the overhead their median, at least 0: what
    :attr:`PPCosts.custom_overhead_s <autosched.pp.costs.PPCosts.custom_overhead_s>` holds, so a search picks a
    custom order only where it beats PyTorch's by more than its path costs. Every rank of ``group`` calls it and
    gets the same figure. The modules are put back afterwards.

    Parameters
    ----------
    stages : sequence of torch.nn.Module
        Every stage module, in order (each rank passes all of them): as many as the group's ranks, or a multiple.
    microbatch, target : torch.Tensor
        One micro-batch and its target.
    loss_fn : callable
        ``loss_fn(output, target)``, as given to the schedule.
    group : ProcessGroup, optional
        The job's group. Default: the default group, or a one-rank group of its own when no process group exists
        (made and destroyed here).
    n_microbatches : int, optional
        Micro-batches per step (default: 4, or the group's ranks if more).
    steps : int
        Paired rounds timed.
    warmup : int
        Untimed rounds first.

    Returns
    -------
    CustomOverhead
        ``.overhead_s`` (>= 0), ``.rounds_s`` (each round's, may be negative), ``.spread_s`` (their interquartile
        range), ``.noise`` (the steps' relative spread).

    Raises
    ------
    PPError
        ``steps`` not an integer >= 1, or what :class:`CustomPathProbe` refuses (``rule``, ``.field``).

    Examples
    --------
    >>> import torch
    >>> stages = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)]
    >>> out = measure_custom_overhead(stages, torch.randn(4, 8), torch.randn(4, 2), torch.nn.functional.mse_loss,
    ...                               n_microbatches=2, steps=3)
    >>> out.schedule, out.actions, len(out.rounds_s), out.overhead_s >= 0, out.spread_s >= 0
    ('Interleaved1F1B', 8, 3, True, True)
    """
    import torch.distributed as dist

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise PPError("bad_value", "steps", steps, detail="an integer >= 1")
    own = not dist.is_initialized() and group is None
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with CustomPathProbe(stages, microbatch, target, loss_fn, group=group, n_microbatches=n_microbatches,
                             warmup=warmup) as probe:
            for _ in range(steps):
                probe.round()
            return probe.result()
    finally:
        if own:
            dist.destroy_process_group()


#: The corrections a pipeline-parallel prediction carries on top of the stages' own costs, in the order
#: :func:`check_pp_corrections` decides them: the runtime's cost per action
#: (:attr:`PPCosts.action_overhead_s <autosched.pp.costs.PPCosts.action_overhead_s>`), then what a posted transfer
#: costs a computing rank (:attr:`P2PCost.post_s <autosched.pp.costs.P2PCost.post_s>`).
PP_CORRECTIONS = ("runtime cost per action", "post cost")


def fitted_post_s(costs: Any, program: Any, steps_s: Sequence[float], *, cores: Optional[int] = None) -> float:
    """The cost per post at which the prediction of ``program`` meets the median of ``steps_s``.

    The step grows with the post cost, so the answer is found by bisection (to 0.1 % of the post cost); 0 when the
    prediction without posts' cost already reaches the median, or when the program posts nothing.

    Parameters
    ----------
    costs : PPCosts
        The costs to fit on (their own ``p2p.post_s`` is replaced).
    program : PPProgram
        What ran the steps.
    steps_s : sequence of float
        Its measured steps, seconds (the slowest rank's), at least one.
    cores : int, optional
        The cores the prediction shares.

    Returns
    -------
    float
        Seconds per post.

    Examples
    --------
    >>> from autosched.pp.costs import P2PCost, PPCosts, StageCost
    >>> from autosched.pp.program import pp_program
    >>> from autosched.pp.simulate import pp_simulate
    >>> program = pp_program("1F1B", 2, 4)
    >>> costs = PPCosts((StageCost(0.010, 0.020),) * 2)
    >>> step = pp_simulate(program, replace(costs, p2p=P2PCost(post_s=0.002))).step_s
    >>> round(fitted_post_s(costs, program, [step * 0.9, step, step * 1.1]), 5)
    0.002
    >>> fitted_post_s(costs, program, [0.001])  # faster than the posts' cost could explain
    0.0
    """
    from autosched.pp.simulate import pp_simulate

    target = statistics.median(steps_s)

    def step(post_s: float) -> float:
        return pp_simulate(program, replace(costs, p2p=replace(costs.p2p, post_s=post_s)), cores=cores).step_s

    low, high = 0.0, max(target, 1e-6)
    if step(low) >= target or step(high) <= step(low):  # already there, or nothing posted
        return 0.0
    while step(high) < target:
        high *= 2
    while high - low > 1e-3 * high:
        middle = (low + high) / 2
        low, high = (middle, high) if step(middle) < target else (low, middle)
    return (low + high) / 2


def check_pp_corrections(costs: Any, program: Any, steps_s: Sequence[float], *, cores: Optional[int] = None,
                         key: Any = None, fit_post: bool = False) -> Tuple[Any, Tuple[Any, ...]]:
    """Keep each correction of ``costs`` only where it predicts measured steps of ``program`` better than without.

    Both corrections are fitted on measurements of their own (the runtime's cost per action on every stage run
    alone, the post cost on a busy exchange), which say nothing about whether they bring a real step's prediction
    closer; ``steps_s`` are steps that fitted neither (:attr:`CustomOverhead.builtin_steps_s`: PyTorch's own
    ``1F1B`` or ``Interleaved1F1B`` on the user's stages and group). The set of corrections whose prediction is
    closest to the steps is kept (the fewest on a tie), each decided by
    :func:`~autosched.model.corrections.decide_corrections` against that set without it (or, left out, with it):
    one is kept only where it brings the prediction closer. One not kept is set to 0.

    With ``fit_post`` the post cost is not the busy exchange's figure but the one at which the prediction (with the
    runtime's cost per action as given) meets the median of every other step (the first, third, ...;
    :func:`fitted_post_s`), and the corrections are judged on the steps in between, which fitted nothing: a post's
    cost inside a pipeline's steps (the peers it wakes, gloo's threads competing for the cores) is not what two
    ranks exchanging alone cost.

    Parameters
    ----------
    costs : PPCosts
        The costs with both corrections as measured.
    program : PPProgram
        What ran the held-out steps (one of PyTorch's schedules on ``costs``' stages).
    steps_s : sequence of float
        Its measured steps, seconds (the slowest rank's); none: no correction is kept.
    cores : int, optional
        The cores the prediction shares (:func:`~autosched.pp.simulate.pp_simulate`'s ``cores``).
    key : hashable, optional
        What the decisions are for (default: the program's micro-batch count).
    fit_post : bool
        Fit the post cost on half the steps, judge on the other half (at least two steps; with fewer, as without).

    Returns
    -------
    (PPCosts, tuple of CorrectionDecision)
        The costs with the kept corrections, and one decision per correction.

    Examples
    --------
    A 2 ms post cost on a step measured as the plain prediction: not kept; the runtime's 1 ms per action is.

    >>> from autosched.pp.costs import P2PCost, PPCosts, StageCost
    >>> from autosched.pp.program import pp_program
    >>> from autosched.pp.simulate import pp_simulate
    >>> program = pp_program("1F1B", 2, 4)
    >>> costs = PPCosts((StageCost(0.010, 0.020),) * 2, P2PCost(post_s=0.002)).with_action_overhead(0.001)
    >>> measured = pp_simulate(program, replace(costs, p2p=P2PCost())).step_s
    >>> kept, decisions = check_pp_corrections(costs, program, [measured] * 3)
    >>> [(d.correction, d.applied) for d in decisions], kept.p2p.post_s, kept.action_overhead_s
    ([('runtime cost per action', True), ('post cost', False)], 0.0, 0.001)
    """
    import itertools

    from autosched.model.corrections import HeldOutStep, decide_corrections, prediction_error
    from autosched.pp.simulate import pp_simulate

    key = program.n_microbatches if key is None else key
    plain = replace(costs.with_action_overhead(0.0), p2p=replace(costs.p2p, post_s=0.0))
    if fit_post and len(steps_s) >= 2:
        fitted = fitted_post_s(costs, program, steps_s[0::2], cores=cores)  # beside the cost per action as given
        costs, steps_s = replace(costs, p2p=replace(costs.p2p, post_s=fitted)), steps_s[1::2]

    def corrected(kept: Tuple[str, ...]) -> Any:
        out = plain.with_action_overhead(costs.action_overhead_s) if PP_CORRECTIONS[0] in kept else plain
        return replace(out, p2p=replace(out.p2p, post_s=costs.p2p.post_s)) if PP_CORRECTIONS[1] in kept else out

    subsets = [c for n in range(len(PP_CORRECTIONS) + 1) for c in itertools.combinations(PP_CORRECTIONS, n)]
    step = {kept: pp_simulate(program, corrected(kept), cores=cores).step_s for kept in subsets}
    # the set that predicts the steps best, the fewest corrections on a tie: then each one kept is closer than
    # without it, and each one left out is not closer with it, which is decide_corrections' rule per correction
    best = min(subsets, key=lambda kept: (round(prediction_error([step[kept]] * len(steps_s), steps_s), 12)
                                          if steps_s else 0.0, len(kept)))
    decisions = []
    for name in PP_CORRECTIONS:
        without = tuple(c for c in best if c != name)
        with_ = tuple(c for c in PP_CORRECTIONS if c in best or c == name)
        held = [HeldOutStep(key, step[without], step[with_], s) for s in steps_s]
        decisions.append(decide_corrections(name, held, keys=[key])[key])
    return corrected(tuple(d.correction for d in decisions if d.applied)), tuple(decisions)


def held_out_error_pct(decisions: Sequence[Any]) -> float:
    """The largest error, over the keys decided, of the prediction with the corrections kept on its held-out steps
    (percent; each decision carries its key's: ``error_with`` when applied, else ``error_without``): the search's
    margin (``pp_search(..., margin_pct=)``), since a predicted gain smaller than the prediction's own error is none.

    Parameters
    ----------
    decisions : sequence of CorrectionDecision
        :func:`check_pp_corrections`' decisions, of one or several keys.

    Returns
    -------
    float
        Percent; 0 when no decision had held-out steps.

    Examples
    --------
    >>> from autosched.model.corrections import CorrectionDecision
    >>> held_out_error_pct([CorrectionDecision("post cost", "4 mb", True, "closer", 0.2, 0.05, 7),
    ...                     CorrectionDecision("post cost", "8 mb", False, "farther", 0.08, 0.3, 7)])
    8.0
    """
    return 100 * max((d.error_with if d.applied else d.error_without for d in decisions if d.steps), default=0.0)


def calibrate_pp(stages: Sequence[Any], microbatch: Any, target: Any, loss_fn: Callable[..., Any], *,
                 group: Any = None, alone_group: Any = None, n_microbatches: Optional[int] = None,
                 repeats: int = 5) -> Any:
    """The costs of a pipeline-parallel job, measured on its own stages, in its own process group.

    * each stage's F, B, I, W, loss and bytes: :func:`~autosched.pp.costs.measure_stage_costs`
      (``repeats`` timed passes);
    * the link: :func:`~autosched.pp.costs.measure_p2p` on ``group`` (the job's; its default
      group when ``None``), its busy exchange at the size of the largest activation sent, when
      the group has two ranks or more (every rank of it calls this); no link otherwise;
    * the runtime's cost per action: :func:`measure_action_overhead` on ``alone_group``
      (``repeats`` rounds), folded in with
      :meth:`PPCosts.with_action_overhead <autosched.pp.costs.PPCosts.with_action_overhead>`;
    * what a custom order's path adds per action beyond PyTorch's class: :func:`measure_custom_overhead` on
      ``group`` (``repeats`` paired rounds; every rank gets the same figure), as
      :attr:`PPCosts.custom_overhead_s <autosched.pp.costs.PPCosts.custom_overhead_s>`, so a search on these
      costs picks a custom order only where it beats PyTorch's schedule by more than that.

    Then both corrections (the runtime's cost per action, the link's post cost) are checked on the custom path
    probe's steps by PyTorch's own class, which fitted neither (:func:`check_pp_corrections`): each is kept only
    where it predicts those steps better than without it. The machine note (``PPCosts.machine``) gives both
    overheads' spread over their rounds and each correction's decision with the errors that decided it.

    Parameters
    ----------
    stages : sequence of torch.nn.Module
        Every stage module, in order (each rank passes all of them, as ``swpipe pp`` builds them).
    microbatch, target : torch.Tensor
    loss_fn : callable
    group : ProcessGroup, optional
        The job's group, for the link.
    alone_group : ProcessGroup, optional
        A one-rank group of this rank (see :func:`measure_action_overhead`).
    n_microbatches : int, optional
        Micro-batches per step of the overheads' runs (default: 4, or the group's ranks if more for the custom
        path's).
    repeats : int

    Returns
    -------
    PPCosts

    Raises
    ------
    PPError
        A stage count that is not a multiple of the group's ranks (``field="stages"``), or a count out of range.

    Examples
    --------
    >>> import torch
    >>> costs = calibrate_pp([torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)], torch.randn(4, 8), torch.randn(4, 2),
    ...                      torch.nn.functional.mse_loss, n_microbatches=2, repeats=2)
    >>> costs.n_stages, costs.samples_per_microbatch, costs.p2p.latency_s, costs.action_overhead_s >= 0
    (2, 4, 0.0, True)
    >>> costs.custom_overhead_s >= 0
    True
    """
    import platform

    import torch.distributed as dist

    from autosched.pp.costs import P2PCost, PPCosts, measure_p2p, measure_stage_costs

    measured = measure_stage_costs(stages, microbatch, target, loss_fn, repeats=repeats)
    link = P2PCost()
    if dist.is_initialized() and dist.get_world_size(group) >= 2:
        busy = max([c.output_bytes for c in measured] + [1])
        link = measure_p2p(group, repeats=max(4, repeats), busy_bytes=busy)
    overhead = measure_action_overhead(stages, microbatch, target, loss_fn, n_microbatches=n_microbatches or 4,
                                       group=alone_group, steps=repeats)
    custom = measure_custom_overhead(stages, microbatch, target, loss_fn, group=group, n_microbatches=n_microbatches,
                                     steps=repeats)
    costs = PPCosts(measured, link, samples_per_microbatch=int(microbatch.shape[0]),
                    custom_overhead_s=custom.overhead_s).with_action_overhead(overhead.overhead_s)
    costs, decisions = check_pp_corrections(costs, custom.program, custom.builtin_steps_s)
    machine = (f"calibrate_pp on {platform.node()}: {repeats} repeats, overhead spread {overhead.spread_s * 1e6:.1f} "
               f"us, custom path {custom.overhead_s * 1e6:.1f} us per action (spread {custom.spread_s * 1e6:.1f} us, "
               f"{custom.schedule}'s order both ways); " + "; ".join(d.describe() for d in decisions))
    return replace(costs, machine=machine)
