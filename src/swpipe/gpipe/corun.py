"""How much CPU partitions slow each other when they run at once, measured with swpipe's engine.

A layer profile (:func:`~swpipe.gpipe.balance.profile_layers`) times the
layers one at a time, on one thread. In a pipelined step the partitions'
threads run at once and share what the machine has: its free cores (other
processes take some) and its caches and memory bandwidth. On a shared or
small machine a partition's forward or backward then takes longer than its
profile says, and a prediction from the profile alone is too low by about
that much.

:func:`profile_corun` measures it: each partition's forward (``F<j>``) and
backward (``B<j>``) on one micro-batch, run by the engine once one partition
at a time (every task on one thread) and once all partitions at once (a
thread per partition, as :class:`~swpipe.gpipe.GPipe` runs them on the CPU),
in interleaved rounds (a burst of load hits both alike). Its
:attr:`CoRun.slowdown` (together over alone, per task) is what
:func:`swpipe.gpipe.predict.predict_step` takes as ``slowdown``: a task's time
stretches by it for the share of the task that runs beside another
partition (:func:`swpipe.gpipe.predict.corun_costs`).

The measurement is the machine *now*, like
:func:`swpipe_core.measure.calibrate.measure_cores`: take it beside the run it
predicts. :func:`corun_in_steps` reads the same figure from the running job's
own steps instead (their timelines against the layer profiles): in a U-Net's
steps the tasks took 12-27 % over their profiles where :func:`profile_corun`,
running the partitions at once outside a step, measured 2-8 %.

Measuring the slowdown does not show that it brings a prediction closer to a
real step: on a U-Net (issue 47) it made predictions worse. So it is checked:
:func:`check_slowdown` predicts measured steps (held out: they did not fit
the slowdown) without and with it, per micro-batch size, and its
:class:`~swpipe.gpipe.predict.CheckedSlowdown` applies the slowdown only at the sizes where it
predicted them better (:func:`autosched.model.corrections.decide_corrections`);
``predict_step(..., slowdown=checked)``, :func:`~swpipe.gpipe.predict.what_if`
and :func:`~swpipe.gpipe.predict.choose` honour its decisions. With both
measurements checked on the same held-out steps, :func:`closest_slowdown`
takes, per micro-batch size, the one that predicted them best.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from autosched.model.corrections import HeldOutStep, decide_corrections
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule

from swpipe.gpipe.balance.profile import _sum_loss
from swpipe.gpipe.errors import GPipeArgumentError
from swpipe.gpipe.microbatch import Tensors, batch_size, check
from swpipe.gpipe.partition import check_balance
from swpipe.gpipe.predict import CORUN, CheckedSlowdown, micro_batch, overlap_shares, predict_step
from swpipe.gpipe.skip.tracker import SkipTracker, use_tracker

__all__ = ["CoRun", "profile_corun", "corun_in_steps", "check_slowdown", "closest_slowdown", "MIN_BESIDE"]

#: The least share of a task's time beside another partition from which a round measures its slowdown
#: (:meth:`CoRun.slowdown_from`).
MIN_BESIDE = 0.5



@dataclass
class CoRun:
    """Each partition's forward and backward on one micro-batch, alone and with every partition at once.

    Attributes
    ----------
    alone_s : dict
        ``{task: [seconds per round]}`` for ``F<j>`` and ``B<j>``, one partition
        at a time (each round's median).
    together_s : dict
        The same with every partition on its own thread at once.
    beside : dict
        ``{task: [share per round]}``: the share of the task's time, all together,
        that another partition ran beside it (:func:`~swpipe.gpipe.predict.overlap_shares`;
        a partition that finishes first leaves the other alone for a while).
    batch : int
        Samples in the micro-batch.

    Examples
    --------
    >>> CoRun({"F0": [0.002, 0.004], "B0": [0.004]}, {"F0": [0.003, 0.004], "B0": [0.0036]},
    ...       {"F0": [1.0, 1.0], "B0": [0.5]}, batch=32).slowdown
    {'F0': 1.25, 'B0': 1.0}
    >>> CoRun({"F0": [0.002]}, {"F0": [0.003]}, {"F0": [0.5]}, batch=32).slowdown  # half of it beside: 1 + 0.5 / 0.5
    {'F0': 2.0}
    """

    alone_s: Dict[str, List[float]]
    together_s: Dict[str, List[float]]
    beside: Dict[str, List[float]]
    batch: int

    @property
    def slowdown(self) -> Dict[str, float]:
        """``{task: slowdown beside another partition}``: :meth:`slowdown_from` rounds where the task ran beside
        another partition for at least :data:`MIN_BESIDE` of its time."""
        return self.slowdown_from(MIN_BESIDE)

    def slowdown_from(self, min_beside: float) -> Dict[str, float]:
        """``{task: slowdown}`` from the rounds where the task ran beside another partition for at least
        ``min_beside`` of its time (1 where none did).

        The inverse of :func:`~swpipe.gpipe.predict.corun_costs`'s stretch: ``together = alone x (1 + beside x
        (s - 1))`` solved for ``s`` in each round, the median over the rounds (a round's two arrangements run back
        to back, so a change of load between rounds cancels), at least 1 (a task never runs faster beside
        another: less is noise). Solving divides the round's noise by its share beside: a round where a task
        ran beside another for 0.1 % of its time turned 2 ms of noise into a slowdown of 500 (issue 47), which
        the prediction then applied to the half of the task it predicts beside another.

        Examples
        --------
        A round with the task beside another all the time, and one where 0.1 of it was:

        >>> corun = CoRun({"F0": [1.0, 1.0]}, {"F0": [1.5, 1.5]}, {"F0": [1.0, 0.1]}, batch=8)
        >>> corun.slowdown, corun.slowdown_from(0.0)
        ({'F0': 1.5}, {'F0': 3.75})
        """
        out = {}
        for task, alone in self.alone_s.items():
            got = [1.0 + (b / a - 1.0) / share for a, b, share in zip(alone, self.together_s[task], self.beside[task])
                   if a > 0 and share > 0 and share >= min_beside]
            out[task] = max(1.0, statistics.median(got)) if got else 1.0
        return out


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, tuple):
        return tuple(_detached(v) for v in value)
    return value


def _leaf(value: Tensors) -> Tensors:
    def one(t: torch.Tensor) -> torch.Tensor:
        return t.detach().requires_grad_(t.is_floating_point())
    return one(value) if isinstance(value, torch.Tensor) else tuple(one(t) for t in value)


def _partition_inputs(partitions: Sequence[nn.Sequential], sample: Tensors) -> List[Any]:
    """Per partition: its input and the skips it may pop, from one pass of the whole module without autograd."""
    inputs = []
    tracker = SkipTracker()
    x: Any = sample
    with torch.no_grad(), use_tracker(tracker):
        for part in partitions:
            inputs.append((_detached(x), {k: _detached(v) for k, v in tracker.values.items()}))
            x = part(x)
    return inputs


def _plan(partitions: Sequence[nn.Sequential], inputs: Sequence[Any], together: bool) -> PipelinePlan:
    """``F<j>``, ``B<j>`` per partition: on a thread each (``together``) or all on one thread."""
    def forward(j: int):
        def run(ctx: Any) -> None:
            main, pops = inputs[j]
            with torch.enable_grad(), use_tracker(SkipTracker(dict(pops))):
                setattr(ctx, f"loss{j}", _sum_loss(partitions[j](_leaf(main)), None))
        return run

    def backward(j: int):
        def run(ctx: Any) -> None:
            with torch.enable_grad():
                getattr(ctx, f"loss{j}").backward()
            delattr(ctx, f"loss{j}")
        return run

    schedule, deps = {}, []
    for j in range(len(partitions)):
        group = f"p{j}" if together else "p0"
        f, b = PipelineTask(f"F{j}", forward(j)), PipelineTask(f"B{j}", backward(j))
        schedule[f], schedule[b] = TaskSchedule(0, thread_group=group), TaskSchedule(0, thread_group=group)
        deps.append((b, f))
    return PipelinePlan(schedule, deps, caller_group=None)


def _run(pipe: SWPipeline, iterations: int) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Each task's median seconds over ``iterations`` pipelined iterations, and its share run beside another."""
    pipe.run(range(iterations))
    out: Dict[str, List[float]] = {}
    for e in pipe.timeline:
        if e.kind == "host":
            out.setdefault(e.task, []).append(e.end - e.start)
    return {task: statistics.median(values) for task, values in out.items()}, overlap_shares(pipe.timeline)


def profile_corun(module: nn.Sequential, balance: Sequence[int], sample: Tensors, *, timeout: float = 1.0,
                  rounds: int = 5) -> CoRun:
    """Measure each CPU partition's forward and backward on ``sample``, alone and with all partitions at once.

    Parameters
    ----------
    module : nn.Sequential
        Its layers, on the CPU; a copy runs (the module, its gradients and
        batch norm statistics stay as they were).
    balance : sequence of int
        Layers per partition.
    sample : tensor or tuple of tensors
        One micro-batch.
    timeout : float
        About how many seconds the measurement takes (more iterations, less noise).
    rounds : int
        Interleaved rounds of the two arrangements (:attr:`CoRun.slowdown`: the median of the rounds' ratios).

    Returns
    -------
    CoRun

    Raises
    ------
    GPipeArgumentError
        A balance that does not fit the module, ``rounds < 1``, or a module not on the CPU.

    Examples
    --------
    >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
    >>> corun = profile_corun(model, [2, 2], torch.randn(4, 8), timeout=0.05, rounds=1)
    >>> sorted(corun.slowdown), all(s >= 1.0 for s in corun.slowdown.values())
    (['B0', 'B1', 'F0', 'F1'], True)
    """
    check(sample, "sample")
    balance = check_balance(module, balance)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise GPipeArgumentError("rounds", rounds, "not an integer >= 1", "give 1 or more rounds")
    if any(p.device.type != "cpu" for p in module.parameters()):
        raise GPipeArgumentError("module", "parameters off the CPU", "co-run slowdown is measured for CPU partitions "
                                 "(CUDA partitions run on devices of their own)", "measure a CPU copy of the module")
    sandbox = copy.deepcopy(module).train()
    for p in sandbox.parameters():
        p.grad = None
    layers, start, partitions = list(sandbox), 0, []
    for count in balance:
        partitions.append(nn.Sequential(*layers[start:start + count]))
        start += count
    inputs = _partition_inputs(partitions, sample)
    pipes = {kind: SWPipeline(_plan(partitions, inputs, kind == "together"), device="cpu", record_timeline=True)
             for kind in ("alone", "together")}
    t0 = time.perf_counter()
    _run(pipes["alone"], 1)  # warm-up: first calls, gradients allocated
    once = time.perf_counter() - t0
    iterations = max(2, min(50, int(timeout / max(once, 1e-6) / (2 * rounds))))
    samples: Dict[str, Dict[str, List[float]]] = {"alone": {}, "together": {}, "beside": {}}
    for _ in range(rounds):
        for kind, pipe in pipes.items():
            seconds, shares = _run(pipe, iterations)
            for task in seconds:
                samples[kind].setdefault(task, []).append(seconds[task])
                if kind == "together":
                    samples["beside"].setdefault(task, []).append(shares.get(task, 0.0))
    for pipe in pipes.values():
        pipe.close()
    return CoRun(samples["alone"], samples["together"], samples["beside"], batch_size(sample))


def _check_config(config: Mapping[str, Any], argument: str) -> None:
    """A step's configuration as :func:`~swpipe.gpipe.predict.predict_step` takes it, or a GPipeArgumentError."""
    missing = {"balance", "batch", "chunks"} - set(config)
    unknown = set(config) - {"balance", "batch", "chunks", "checkpoint", "schedule"}
    if missing or unknown:
        raise GPipeArgumentError(argument, dict(config), f"missing {sorted(missing)}, unknown {sorted(unknown)}",
                                 "give balance, batch, chunks and optionally checkpoint, schedule")


def corun_in_steps(layers: Any, config: Mapping[str, Any], steps: Iterable[Any], *,
                   cores: Optional[int] = None) -> CoRun:
    """The co-run slowdown as the job's own steps show it: each task's time in each step against its plain cost.

    ``alone_s`` is each task's plain predicted cost (the layer profiles, :func:`~swpipe.gpipe.predict.predict_step`
    without a slowdown), ``together_s`` its median time over its micro-batches in each measured step, ``beside``
    the share of that time another partition ran beside it in that step
    (:func:`~swpipe.gpipe.predict.overlap_shares`), so :attr:`CoRun.slowdown` is the stretch that
    :func:`~swpipe.gpipe.predict.corun_costs` would have to apply to give the times the steps took. It is what the
    steps of a running job measure (:class:`~swpipe.gpipe.measure.MeasuredStep`'s timeline, ``GPipe.timeline``);
    check it with :func:`check_slowdown` on other steps than these before it predicts.

    Parameters
    ----------
    layers : LayerModel
        The layers' costs the prediction takes.
    config : dict
        The steps' configuration (``balance``, ``batch``, ``chunks``; ``checkpoint`` and ``schedule`` optional).
    steps : iterable of MeasuredStep
        Steps measured in that configuration, each with its timeline (``events``).
    cores : int, optional
        As :func:`~swpipe.gpipe.predict.predict_step` takes it.

    Returns
    -------
    CoRun
        One round per step, at the configuration's micro-batch size.

    Examples
    --------
    A step whose forwards ran side by side, each twice its plain cost:

    >>> from swpipe.gpipe.measure import MeasuredStep
    >>> from swpipe.gpipe.predict import LayerModel
    >>> from swpipe_core.measure.trace import TimelineEvent
    >>> layers = LayerModel([(0.0, 0.001)] * 2, [(0.0, 0.002)] * 2, [0.0] * 2, [0.0] * 2)
    >>> config = {"balance": [1, 1], "batch": 2, "chunks": 1, "checkpoint": "never"}
    >>> events = [TimelineEvent(f"F{j}", 0, f"p{j}", "default", 0.0, 0.004) for j in (0, 1)]
    >>> corun_in_steps(layers, config, [MeasuredStep(0.004, [0.004], 0.0, [], events=events)]).slowdown
    {'F0': 2.0, 'F1': 2.0}
    """
    _check_config(config, "config")
    plain = predict_step(layers, cores=cores, **config).costs
    alone: Dict[str, List[float]] = {}
    together: Dict[str, List[float]] = {}
    beside: Dict[str, List[float]] = {}
    for step in steps:
        host = [e for e in step.events if e.kind == "host" and e.task in plain.tasks and e.end > e.start]
        shares = overlap_shares(host)
        took: Dict[str, List[float]] = {}
        for e in host:
            took.setdefault(e.task, []).append(e.end - e.start)
        for task, seconds in took.items():
            alone.setdefault(task, []).append(plain[task].host_s)
            together.setdefault(task, []).append(statistics.median(seconds))
            beside.setdefault(task, []).append(shares.get(task, 0.0))
    return CoRun(alone, together, beside, micro_batch(config["batch"], config["chunks"]))


def _nearest(coruns: Sequence[CoRun], micro_batch: float) -> CoRun:
    """The measurement at the micro-batch size nearest ``micro_batch`` (the smaller of two as near)."""
    return min(coruns, key=lambda c: (abs(c.batch - micro_batch), c.batch))


def check_slowdown(layers: Any, coruns: Union[CoRun, Sequence[CoRun]],
                   steps: Iterable[Tuple[Mapping[str, Any], Any]], *, cores: Optional[int] = None) -> CheckedSlowdown:
    """Check the co-run slowdown against measured steps: applied per micro-batch size only where it predicts better.

    Each step is predicted (:func:`~swpipe.gpipe.predict.predict_step`)
    without and with the slowdown measured at the micro-batch size nearest
    the step's, and :func:`~autosched.model.corrections.decide_corrections`
    decides per micro-batch size. The steps must be held out: measured apart
    from ``coruns`` (the slowdown is fitted from those only) and, to judge
    what the decision is worth, apart from the steps it is then used to
    predict.

    Parameters
    ----------
    layers : LayerModel
        The layers' costs the predictions take.
    coruns : CoRun or sequence of CoRun
        The slowdown measured at one or more micro-batch sizes (:func:`profile_corun`).
    steps : iterable of (dict, float or MeasuredStep)
        Each a configuration (``balance``, ``batch``, ``chunks``; ``checkpoint`` and ``schedule`` optional, as
        :func:`~swpipe.gpipe.predict.predict_step` takes them) and its measured step: seconds, or a
        :class:`~swpipe.gpipe.measure.MeasuredStep` (each timed repeat a held-out step).
    cores : int, optional
        As :func:`~swpipe.gpipe.predict.predict_step` takes it.

    Returns
    -------
    swpipe.gpipe.predict.CheckedSlowdown
        A decision per micro-batch size of the steps and of ``coruns`` (those without a step: not applied).

    Raises
    ------
    GPipeArgumentError
        No ``coruns``, or a configuration with a field ``predict_step`` does not take or without ``balance``,
        ``batch`` or ``chunks``.

    Examples
    --------
    A slowdown of 3 on every task, where the measured step was as fast as the plain prediction: not applied.

    >>> from swpipe.gpipe.predict import LayerModel, predict_step
    >>> layers = LayerModel([(0.0, 0.001)] * 2, [(0.0, 0.002)] * 2, [0.0] * 2, [0.0] * 2)
    >>> corun = CoRun({t: [1.0] for t in ("F0", "F1", "B0", "B1")}, {t: [3.0] for t in ("F0", "F1", "B0", "B1")},
    ...               {t: [1.0] for t in ("F0", "F1", "B0", "B1")}, batch=2)
    >>> config = {"balance": [1, 1], "batch": 8, "chunks": 4, "checkpoint": "never"}
    >>> plain = predict_step(layers, **config).step_s
    >>> checked = check_slowdown(layers, corun, [(config, plain)])
    >>> checked.decision(2).applied, checked.decision(2).reason, checked.at(2)
    (False, 'farther', None)
    """
    coruns = [coruns] if isinstance(coruns, CoRun) else list(coruns)
    if not coruns:
        raise GPipeArgumentError("coruns", [], "no co-run measurement", "measure one with profile_corun")
    held, slowdown = [], {}
    for config, measured in steps:
        _check_config(config, "steps")
        key = micro_batch(config["batch"], config["chunks"])
        slowdown.setdefault(key, _nearest(coruns, key).slowdown)
        without = predict_step(layers, cores=cores, **config).step_s
        with_ = predict_step(layers, cores=cores, slowdown=slowdown[key], **config).step_s
        seconds = measured.steps_s if hasattr(measured, "steps_s") else [measured]
        held += [HeldOutStep(key, without, with_, float(s)) for s in seconds]
    for c in coruns:
        slowdown.setdefault(c.batch, c.slowdown)
    return CheckedSlowdown(slowdown, decide_corrections(CORUN, held, keys=slowdown))


def closest_slowdown(candidates: Mapping[str, CheckedSlowdown]) -> CheckedSlowdown:
    """Per micro-batch size, the checked slowdown that predicted the held-out steps best where it is applied.

    Each candidate must have been checked (:func:`check_slowdown`) on the same held-out steps, e.g. one from
    :func:`profile_corun` and one from :func:`corun_in_steps`: neither source is right on every machine and size
    (on a U-Net one was closer at some sizes, the other at others), and the same steps tell which.

    Parameters
    ----------
    candidates : mapping of str to CheckedSlowdown
        By a name of where each was measured, in order of preference on a tie.

    Returns
    -------
    swpipe.gpipe.predict.CheckedSlowdown
        At each size, the applied candidate with the least held-out error (its decision renamed
        ``"co-run slowdown (<name>)"``); where none is applied, not applied (the first candidate's decision there).

    Raises
    ------
    GPipeArgumentError
        No candidate.

    Examples
    --------
    >>> from autosched.model.corrections import CorrectionDecision
    >>> def checked(slowdown, error_with):
    ...     return CheckedSlowdown({8: {"F0": slowdown}}, {8: CorrectionDecision(CORUN, 8, True, "closer", 0.3,
    ...                                                                          error_with, 4)})
    >>> best = closest_slowdown({"profile_corun": checked(1.1, 0.12), "its steps": checked(1.3, 0.05)})
    >>> best.at(8), best.decision(8).correction
    ({'F0': 1.3}, 'co-run slowdown (its steps)')
    """
    if not candidates:
        raise GPipeArgumentError("candidates", {}, "no checked slowdown to choose from",
                                 "give one or more, each from check_slowdown on the same held-out steps")
    named = list(candidates.items())
    slowdown: Dict[float, Dict[str, float]] = {}
    decisions = {}
    for size in sorted({k for _, c in named for k in c.decisions}):
        applied = [(c.decision(size).error_with, i) for i, (_, c) in enumerate(named) if c.decision(size).applied]
        name, chosen = named[min(applied)[1]] if applied else named[0]
        slowdown[size] = dict(chosen.slowdown.get(size, {}))
        decision = chosen.decision(size)
        decisions[size] = replace(decision, correction=f"{CORUN} ({name})") if applied else decision
    return CheckedSlowdown(slowdown, decisions)
