"""A GPipe training step measured: its wall time, the activation bytes it keeps, its bubble, its timeline.

The figures :mod:`swpipe.gpipe.predict` predicts, measured on the real step,
so the two stand side by side (``benchmarks/gpipe.py``, notebook ``05_gpipe``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Sequence

import torch

from swpipe.gpipe.errors import GPipeArgumentError
from swpipe.gpipe.memory import ActivationMeter
from swpipe.gpipe.partition import as_partition_device

__all__ = ["MeasuredStep", "measure_step", "timed_step", "step_bubble"]


def timed_step(gpipe: Any, input: Any, target: Any, loss_fn: Callable[..., torch.Tensor]) -> float:
    """One ``gpipe.step``, its parameters' gradients cleared first: wall seconds until every partition's device has
    run the step's work (on CUDA the host returns while kernels still run; each device is synchronised before and
    after, so the step neither inherits earlier work nor leaves its own out).

    Examples
    --------
    >>> from swpipe.gpipe import GPipe
    >>> model = GPipe(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)), balance=[1, 1],
    ...               devices=["cpu", "cpu"], chunks=2)
    >>> timed_step(model, torch.randn(4, 4), torch.randn(4, 2), torch.nn.functional.mse_loss) > 0
    True
    """
    devices = [as_partition_device(d) for d in dict.fromkeys(gpipe.devices)]
    for p in gpipe.parameters():
        p.grad = None
    for d in devices:
        d.synchronize()
    t0 = time.perf_counter()
    gpipe.step(input, target, loss_fn)
    for d in devices:
        d.synchronize()
    return time.perf_counter() - t0


@dataclass
class MeasuredStep:
    """A GPipe step measured.

    Attributes
    ----------
    step_s : float
        Median wall seconds of a step over the repeats (``steps_s``).
    activation_bytes, activation_by : float, list of float
        Peak bytes autograd kept, all partitions and each.
    bubble : float
        The median over the timed steps of each step's ``1 - busy / (partitions x span)``
        (:func:`step_bubble`): the partitions' idle share, as
        :attr:`swpipe.gpipe.predict.StepPrediction.bubble` predicts it.
    events : list
        The timeline of the timed step whose bubble is the median (``swpipe.gantt(events)``).
    """

    step_s: float
    steps_s: List[float]
    activation_bytes: float
    activation_by: List[float]
    bubble: float = 0.0
    events: List[Any] = field(default_factory=list, repr=False)


def step_bubble(events: Sequence[Any], partitions: int) -> float:
    """The partitions' idle share of a step's timeline: ``1 - busy / (partitions x span)``.

    ``busy`` is the forward and backward tasks' time, ``span`` from the first
    one's start to the last one's end: the window and the idle time the
    prediction's bubble has (its makespan, its tasks' costs).

    Examples
    --------
    >>> from swpipe_core.measure.trace import TimelineEvent
    >>> step_bubble([TimelineEvent("F0", 0, "p0", "default", 0.0, 1.0),
    ...              TimelineEvent("F1", 0, "p1", "default", 1.0, 2.0)], partitions=2)
    0.5
    """
    work = [e for e in events if e.task[0] in "FB"]
    if not work:
        return 0.0
    span = max(e.end for e in work) - min(e.start for e in work)
    return 1.0 - sum(e.end - e.start for e in work) / (partitions * span) if span > 0 else 0.0


def measure_step(gpipe: Any, input: Any, target: Any, loss_fn: Callable[..., torch.Tensor], repeats: int = 5,
                 warmup: int = 1) -> MeasuredStep:
    """Run ``gpipe.step`` ``warmup + repeats`` times; the median wall time, bubble and the activation bytes it kept.

    The timed steps record their timelines (the bubble of each); the
    parameters' gradients are set to ``None`` before each step; the
    activation meter runs in one more step, apart from the timed ones.

    Examples
    --------
    >>> import torch
    >>> from swpipe.gpipe import GPipe
    >>> model = GPipe(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)),
    ...               balance=[2, 1], devices=["cpu", "cpu"], chunks=2)
    >>> m = measure_step(model, torch.randn(8, 8), torch.randn(8, 2), torch.nn.functional.mse_loss, repeats=2)
    >>> len(m.steps_s), m.step_s > 0, m.activation_bytes > 0, 0.0 <= m.bubble < 1.0
    (2, True, True, True)
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise GPipeArgumentError("repeats", repeats, "not an integer >= 1", "time one step or more")
    times, timelines = [], []
    params = list(gpipe.parameters())
    n = len(gpipe.partitions)
    recording = gpipe.record_timeline
    gpipe.record_timeline = True
    try:
        for k in range(warmup + repeats):
            seconds = timed_step(gpipe, input, target, loss_fn)
            if k >= warmup:
                times.append(seconds)
                timelines.append(list(gpipe.timeline))
    finally:
        gpipe.record_timeline = recording
    for p in params:
        p.grad = None
    given = [t for v in (input, target) for t in (v if isinstance(v, tuple) else (v,))]
    meter = ActivationMeter(exclude=params + given)
    gpipe.step(input, target, loss_fn, meter=meter)
    for p in params:
        p.grad = None
    bubbles = [step_bubble(events, n) for events in timelines]
    middle = sorted(range(len(bubbles)), key=bubbles.__getitem__)[(len(bubbles) - 1) // 2]
    return MeasuredStep(statistics.median(times), times, float(meter.peak),
                        [float(meter.peak_by.get(j, 0)) for j in range(n)], statistics.median(bubbles),
                        timelines[middle])


