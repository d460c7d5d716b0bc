"""A GPipe training step measured: its wall time, the activation bytes it keeps, its bubble, its timeline.

The figures :mod:`swpipe.gpipe.predict` predicts, measured on the real step,
so the two stand side by side (``benchmarks/gpipe.py``, notebook ``05_gpipe``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List

import torch

from swpipe.gpipe.memory import ActivationMeter

__all__ = ["MeasuredStep", "measure_step"]


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
        From one more step's timeline: ``1 - busy / (partitions x span)``, the
        tasks' busy time over the span from the first task's start to the last one's end.
    events : list
        That step's timeline (``swpipe.gantt(events)``).
    """

    step_s: float
    steps_s: List[float]
    activation_bytes: float
    activation_by: List[float]
    bubble: float = 0.0
    events: List[Any] = field(default_factory=list, repr=False)


def measure_step(gpipe: Any, input: Any, target: Any, loss_fn: Callable[..., torch.Tensor], repeats: int = 5,
                 warmup: int = 1) -> MeasuredStep:
    """Run ``gpipe.step`` ``warmup + repeats`` times; the median wall time and the activation bytes it kept.

    The parameters' gradients are set to ``None`` before each step; the
    activation meter runs in one more step, apart from the timed ones.
    """
    times = []
    params = list(gpipe.parameters())
    for k in range(warmup + repeats):
        for p in params:
            p.grad = None
        t0 = time.perf_counter()
        gpipe.step(input, target, loss_fn)
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    for p in params:
        p.grad = None
    given = [t for v in (input, target) for t in (v if isinstance(v, tuple) else (v,))]
    meter = ActivationMeter(exclude=params + given)
    gpipe.step(input, target, loss_fn, meter=meter)
    for p in params:
        p.grad = None
    recording = gpipe.record_timeline
    gpipe.record_timeline = True
    try:
        gpipe.step(input, target, loss_fn)
        events = list(gpipe.timeline)
    finally:
        gpipe.record_timeline = recording
    for p in params:
        p.grad = None
    n = len(gpipe.partitions)
    work = [e for e in events if e.task[0] in "FB"]
    span = max(e.end for e in work) - min(e.start for e in work)
    bubble = 1.0 - sum(e.end - e.start for e in work) / (n * span) if span > 0 else 0.0
    return MeasuredStep(statistics.median(times), times, float(meter.peak),
                        [float(meter.peak_by.get(j, 0)) for j in range(n)], bubble, events)


