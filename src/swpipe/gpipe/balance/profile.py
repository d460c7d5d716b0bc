"""What each layer costs: forward and backward time over paired rounds, robust statistics, and bytes.

The layers run as the tasks of a training step of one micro-batch in which
every layer is a partition of its own (:func:`swpipe.gpipe.schedule.step_plan`,
all on one thread). One **round** is one such step with every layer's forward
and backward timed (:meth:`~swpipe_core.engine.pipeline.SWPipeline.instrument`
around each task): the layers of a round run back to back, so a burst of
other work on the machine hits the layers of that round together, and the
round's costs can be compared with each other. :func:`robust_times` turns the
rounds into one cost per layer (normalised rounds, spikes dropped, medians;
its docstring says exactly how) and reports the spread.
An :class:`~swpipe.gpipe.memory.ActivationMeter` counts the bytes each layer has autograd keep.
The module is never changed: the layers run on a copy of it (its batch norm
statistics, its gradients and its ``training`` flag stay as they were), in
training mode.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence

import torch
from torch import nn

from swpipe_core.engine.device import Device
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.measure.rolling import relative_iqr

from swpipe.gpipe.errors import GPipeArgumentError, ProfilingError
from swpipe.gpipe.memory import ActivationMeter, tensor_bytes
from swpipe.gpipe.microbatch import Tensors, batch_size, check
from swpipe.gpipe.partition import as_partition_device, movable
from swpipe.gpipe.runtime import Call, MicroBatch, TorchOps
from swpipe.gpipe.schedule import Placement, bind, step_plan
from swpipe.gpipe.skip.layout import skip_routes
from swpipe.gpipe.skip.tracker import SkipTracker, use_tracker

__all__ = ["LayerProfile", "RobustTimes", "profile_layers", "robust_times", "default_timer", "TaskTimer", "SPIKE", "MIN_ROUNDS",
           "MAX_ROUNDS"]

#: A layer's sample more than this many times its median (after the round's normalisation) is a spike.
SPIKE = 3.0
#: Without ``num_rounds``, :func:`profile_layers` times as many rounds as ``timeout`` allows, within these bounds.
MIN_ROUNDS, MAX_ROUNDS = 7, 200

#: ``timer(run, task, round) -> seconds``: run ``run()`` once (task ``"F3"`` or ``"B3"`` of round ``round``)
#: and return how long it took.
TaskTimer = Callable[[Callable[[], None], str, int], float]


@dataclass
class RobustTimes:
    """One forward and one backward cost per layer from timed rounds, with their spread (:func:`robust_times`).

    Attributes
    ----------
    forward_s, backward_s : list of float
        Per layer: the median over the rounds kept of the forward (backward)
        seconds divided by the round's scale.
    spread : list of float
        Per layer: the interquartile range of its normalised forward +
        backward seconds over the rounds kept, relative to their median (0.1:
        the middle half of the rounds lie within 10 % of the median's width).
    spikes : list of int
        Per layer: how many rounds were dropped as spikes.
    round_scale : list of float
        Per round: how much slower than a typical round it ran (its kept
        layers' total over the same layers' medians): 3.0 for a round that
        ran three times slower throughout.
    """

    forward_s: List[float]
    backward_s: List[float]
    spread: List[float]
    spikes: List[int]
    round_scale: List[float]


def robust_times(forward: Sequence[Sequence[float]], backward: Sequence[Sequence[float]], *,
                 spike: float = SPIKE) -> RobustTimes:
    """Per-layer costs from rounds of paired timings: normalise each round, drop spikes, take medians.

    ``forward[r][j]`` and ``backward[r][j]`` are layer ``j``'s seconds in round
    ``r``; ``t[r][j]`` is their sum.

    1. A round's **slowdown** ``s0[r]`` is the median over the layers of
       ``t[r][j] / median_r t[r][j]``: a burst of load that slowed the whole
       round, which one layer's spike cannot move.
    2. With ``m[j]`` the median over the rounds of ``t[r][j] / s0[r]``,
       ``t[r][j]`` is a **spike** when ``t[r][j] / s0[r] > spike * m[j]``.
    3. A round's **scale** is its total over the layers that are no spike
       there, divided by the same layers' ``m`` (``sum t / sum m``): what the
       balance needs are the layers' ratios, so each round is normalised by
       its total (spikes left out of it, or one spike would shrink every
       other layer of its round).
    4. A layer's forward (backward) cost is the median, over the rounds where
       it is no spike, of its forward (backward) seconds divided by the
       round's scale; its **spread** is the interquartile range of its
       normalised ``t`` over those rounds, relative to their median.

    Parameters
    ----------
    forward, backward : sequence of sequences of float
        Rounds x layers, seconds (>= 0).
    spike : float
        How many times its median a sample must be to be dropped (> 1).

    Returns
    -------
    RobustTimes

    Raises
    ------
    GPipeArgumentError
        No rounds, rounds of different lengths, a negative or non-finite time, ``spike <= 1``.

    Examples
    --------
    A spike (layer 1, 50 times its time in round 0) and a round three times
    slower throughout (round 2) leave the costs of the clean rounds:

    >>> fwd = [[1.0, 50.0, 3.0], [1.0, 1.0, 3.0], [3.0, 3.0, 9.0], [1.0, 1.0, 3.0]]
    >>> bwd = [[2.0, 2.0, 6.0], [2.0, 2.0, 6.0], [6.0, 6.0, 18.0], [2.0, 2.0, 6.0]]
    >>> r = robust_times(fwd, bwd)
    >>> r.forward_s, r.backward_s
    ([1.0, 1.0, 3.0], [2.0, 2.0, 6.0])
    >>> r.spikes, r.round_scale
    ([0, 1, 0], [1.0, 1.0, 3.0, 1.0])
    """
    if not isinstance(spike, (int, float)) or isinstance(spike, bool) or not spike > 1:
        raise GPipeArgumentError("spike", spike, "must be a number > 1", "give how many times its median a "
                                 "sample must be to count as a spike, e.g. 3")
    rows_f = [[float(x) for x in row] for row in forward]
    rows_b = [[float(x) for x in row] for row in backward]
    if not rows_f or len(rows_f) != len(rows_b):
        raise GPipeArgumentError("forward", len(rows_f), f"needs one or more rounds, as many as backward "
                                 f"({len(rows_b)})", "time one round or more")
    n = len(rows_f[0])
    for r, (rf, rb) in enumerate(zip(rows_f, rows_b)):
        if len(rf) != n or len(rb) != n:
            raise GPipeArgumentError("forward", r, f"round {r} has {len(rf)} forward and {len(rb)} backward "
                                     f"times, round 0 has {n}", "give every layer's time in every round")
        if any(not math.isfinite(x) or x < 0 for x in rf + rb):
            raise GPipeArgumentError("forward", r, f"round {r} has a negative or non-finite time",
                                     "give seconds >= 0")
    rounds = range(len(rows_f))
    t = [[f + b for f, b in zip(rf, rb)] for rf, rb in zip(rows_f, rows_b)]

    def median_of(values: List[float]) -> float:
        return statistics.median(values) if values else 0.0

    raw = [statistics.median(t[r][j] for r in rounds) for j in range(n)]
    slowdown = [median_of([t[r][j] / raw[j] for j in range(n) if raw[j] > 0]) or 1.0 for r in rounds]
    m = [statistics.median(t[r][j] / slowdown[r] for r in rounds) for j in range(n)]
    kept = [[not (m[j] > 0 and t[r][j] / slowdown[r] > spike * m[j]) for j in range(n)] for r in rounds]
    scale = []
    for r in rounds:
        total = sum(m[j] for j in range(n) if kept[r][j])
        scale.append(sum(t[r][j] for j in range(n) if kept[r][j]) / total if total > 0 else 1.0)

    def normalised(rows: List[List[float]], j: int) -> List[float]:
        # every layer is kept in some round: one above spike * its median cannot be half of them
        return [rows[r][j] / scale[r] if scale[r] > 0 else rows[r][j] for r in rounds if kept[r][j]]

    spread = [relative_iqr(normalised(t, j)) for j in range(n)]
    return RobustTimes(forward_s=[statistics.median(normalised(rows_f, j)) for j in range(n)],
                       backward_s=[statistics.median(normalised(rows_b, j)) for j in range(n)],
                       spread=spread, spikes=[sum(not kept[r][j] for r in rounds) for j in range(n)],
                       round_scale=scale)


@dataclass
class LayerProfile:
    """Per-layer costs of a module on one micro-batch of ``batch`` samples.

    Attributes
    ----------
    forward_s, backward_s : list of float
        Seconds per layer (:func:`robust_times` of the rounds; on CUDA each
        task is timed between two device synchronisations).
    saved_bytes : list of float
        Bytes of activations a layer has autograd keep (each storage counted
        for the first layer that saves it).
    output_bytes : list of float
        Bytes of a layer's output (what a checkpointed partition keeps of its input).
    param_bytes : list of float
    batch : int
        Samples in the profiled micro-batch.
    device : str
    spread, spikes, round_scale : list
        As in :class:`RobustTimes`: how much each layer's time varied over the
        rounds, how many of its rounds were spikes, how slow each round ran.
    round_time_s : list of list of float
        The rounds as timed: ``round_time_s[r][j]``, layer ``j``'s forward +
        backward seconds in round ``r`` (before any normalisation).
    """

    forward_s: List[float]
    backward_s: List[float]
    saved_bytes: List[float]
    output_bytes: List[float]
    param_bytes: List[float]
    batch: int
    device: str
    spread: List[float] = field(default_factory=list)
    spikes: List[int] = field(default_factory=list)
    round_scale: List[float] = field(default_factory=list)
    round_time_s: List[List[float]] = field(default_factory=list)

    @property
    def time_s(self) -> List[float]:
        """Forward plus backward seconds per layer."""
        return [f + b for f, b in zip(self.forward_s, self.backward_s)]

    def __len__(self) -> int:
        return len(self.forward_s)

    def report(self) -> str:
        """One line per layer: its time, spread and spikes; then the rounds' scales.

        Examples
        --------
        >>> p = LayerProfile([0.001], [0.002], [0.0], [0.0], [0.0], batch=4, device="cpu", spread=[0.05],
        ...                  spikes=[1], round_scale=[1.0, 2.5, 1.0])
        >>> print(p.report())
        layer  time_ms  spread  spikes
            0    3.000    5.0%       1
        3 rounds, scale min 1.00 median 1.00 max 2.50
        """
        lines = ["layer  time_ms  spread  spikes"]
        for j, t in enumerate(self.time_s):
            spread = self.spread[j] if j < len(self.spread) else 0.0
            spikes = self.spikes[j] if j < len(self.spikes) else 0
            lines.append(f"{j:5d} {t * 1e3:8.3f} {spread * 100:6.1f}% {spikes:7d}")
        if self.round_scale:
            s = self.round_scale
            lines.append(f"{len(s)} rounds, scale min {min(s):.2f} median {statistics.median(s):.2f} "
                         f"max {max(s):.2f}")
        return "\n".join(lines)


def _sum_loss(out: Tensors, target: Any) -> torch.Tensor:
    tensors = (out,) if isinstance(out, torch.Tensor) else out
    total = torch.zeros((), requires_grad=True, device=tensors[0].device if tensors else None)
    for t in tensors:
        if t.is_floating_point():
            total = total + t.sum()
    return total


def _to(value: Tensors, device: torch.device) -> Tensors:
    def leaf(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().to(device)
        return t.requires_grad_(True) if t.is_floating_point() else t
    return leaf(value) if isinstance(value, torch.Tensor) else tuple(leaf(t) for t in value)


def _device_of(module: nn.Module, device: Any) -> Device:
    if device is not None:
        return as_partition_device(device)
    for p in module.parameters():
        return as_partition_device(p.device)
    return as_partition_device("cpu")


def profile_layers(module: nn.Sequential, sample: Tensors, *, timeout: float = 1.0, device: Any = None,
                   num_rounds: Optional[int] = None, spike: float = SPIKE,
                   timer: Optional[TaskTimer] = None) -> LayerProfile:
    """Measure each layer of ``module`` on ``sample`` (one micro-batch): timed rounds, robust statistics, bytes.

    After one untimed step (the bytes' meter) and one warm-up step, each
    round times every layer's forward and backward in one training step;
    :func:`robust_times` makes one cost per layer of the rounds (each round
    normalised by its scale, spikes dropped, medians) and reports their
    spread in the profile.

    Parameters
    ----------
    module : nn.Sequential
    sample : tensor or tuple of tensors
    timeout : float
        About how many seconds the rounds take, when ``num_rounds`` is not
        given: rounds start until ``timeout`` has passed, at least
        :data:`MIN_ROUNDS` and at most :data:`MAX_ROUNDS`.
    device : device, optional
        Where the layers run; default the module's (its first parameter's), else the CPU.
    num_rounds : int, optional
        Exactly this many rounds (>= 1), whatever ``timeout``.
    spike : float
        A layer's time more than ``spike`` times its median in a round is dropped (:func:`robust_times`).
    timer : callable, optional
        ``timer(run, task, round) -> seconds`` (:data:`TaskTimer`), to time
        each task another way. Default (:func:`default_timer`): on the CPU
        with one intra-op thread, the thread's CPU time; else wall time, on
        CUDA between two device synchronisations.

    Returns
    -------
    LayerProfile

    Raises
    ------
    ProfilingError
        A parameter already has a gradient (``problem == "has_grad"``, ``parameter`` names it):
        zero the gradients first, as profiling runs backward.
    GPipeArgumentError
        ``num_rounds`` not an integer >= 1, ``spike`` not > 1.

    Examples
    --------
    >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> p = profile_layers(model, torch.randn(4, 8), num_rounds=5)
    >>> len(p), len(p.round_scale), len(p.round_time_s), len(p.spread)
    (3, 5, 5, 3)
    """
    check(sample, "sample")
    if num_rounds is not None and (isinstance(num_rounds, bool) or not isinstance(num_rounds, int)
                                   or num_rounds < 1):
        raise GPipeArgumentError("num_rounds", num_rounds, "must be an integer >= 1 (or None: as many as "
                                 "timeout allows)", "give how many rounds to time, e.g. 9")
    for name, p in module.named_parameters():
        if p.grad is not None:
            raise ProfilingError("has_grad", f"some parameter already has gradient ({name}); profiling runs "
                                 "backward: set the gradients to None first (module.zero_grad(set_to_none=True))",
                                 parameter=name)
    dev = _device_of(module, device)
    sandbox = copy.deepcopy(module)
    sandbox.train()
    if movable(dev):
        sandbox.to(dev.torch_device)
    layers = [nn.Sequential(layer) for layer in sandbox]
    sample = _to(sample, dev.torch_device)
    group = f"{dev.type}{dev.index}" if dev.is_async else "layers"
    places = [Placement(str(dev.torch_device), group, dev.default_stream() if dev.is_async else None)
              for _ in layers]
    routes = skip_routes(layers)
    ops = TorchOps(layers, [dev] * len(layers), places, routes, [False] * len(layers))
    plan = bind(step_plan(places, "gpipe", 1, routes), ops.ops())
    meter = ActivationMeter(exclude=list(sandbox.parameters()) + list(_tensors(sample)))
    call = Call([sample], grad=True, inference=False, checkpoint_stop=0, seed=0, step=True, targets=[None],
                loss_fn=_sum_loss, weights=[1.0], meter=meter)
    batch = MicroBatch(call, 0)
    n = len(layers)
    timer = timer if timer is not None else default_timer(dev)
    forward = []
    backward = []
    with SWPipeline(plan, device=dev) as pipe:
        pipe.run_one_serial_iter(batch)  # the meter's run: every layer saves once
        call.meter = None
        pipe.run_one_serial_iter(batch)  # warm-up
        current = {"round": 0, "row": {}}

        def timed(run_task: Any, task: Any, ctx: Any) -> None:
            name = task.name
            if name[:1] in "FB" and name[1:].isdigit():
                current["row"][name] = timer(lambda: run_task(task, ctx), name, current["round"])
            else:
                run_task(task, ctx)

        deadline = time.perf_counter() + timeout
        with pipe.instrument(timed):
            r = 0
            while r < (num_rounds or MAX_ROUNDS) and (
                    num_rounds is not None or r < MIN_ROUNDS or time.perf_counter() < deadline):
                current["round"], current["row"] = r, {}
                pipe.run_one_serial_iter(batch)
                row = current["row"]
                forward.append([row[f"F{j}"] for j in range(n)])
                backward.append([row[f"B{j}"] for j in range(n)])
                r += 1
        for p in sandbox.parameters():
            p.grad = None
    stats = robust_times(forward, backward, spike=spike)
    outputs = _output_bytes(sandbox, sample)
    return LayerProfile(forward_s=stats.forward_s, backward_s=stats.backward_s,
                        saved_bytes=[float(meter.saved_by.get(j, 0)) for j in range(n)],
                        output_bytes=outputs,
                        param_bytes=[float(sum(p.numel() * p.element_size() for p in layer.parameters()))
                                     for layer in layers],
                        batch=batch_size(sample), device=str(dev.torch_device),
                        spread=stats.spread, spikes=stats.spikes, round_scale=stats.round_scale,
                        round_time_s=[[f + b for f, b in zip(rf, rb)] for rf, rb in zip(forward, backward)])


def default_timer(device: Any = "cpu") -> TaskTimer:
    """How :func:`profile_layers` times a task on ``device`` unless given a ``timer``.

    On the CPU with one intra-op thread (``torch.get_num_threads() == 1``)
    the task runs on the calling thread alone, and its CPU time
    (``time.thread_time``) is the work it does without the time it waited
    for a core: on a busy machine that wait is most of the noise, and a
    pipeline's threads wait in proportion to their work, so the ratios the
    balance needs are those of the CPU times. With more intra-op threads,
    wall time (``time.perf_counter``): other threads do part of the work. On
    CUDA, wall time between two device synchronisations, so the device's
    work is inside.

    Examples
    --------
    >>> timer = default_timer("cpu")
    >>> timer(lambda: sum(range(1000)), "F0", 0) >= 0
    True
    """
    dev = as_partition_device(device)
    if dev.type == "cuda":
        def synchronised(run: Callable[[], None], task: str, round: int) -> float:
            dev.synchronize()
            t0 = time.perf_counter()
            run()
            dev.synchronize()
            return time.perf_counter() - t0
        return synchronised
    clock = time.thread_time if dev.type == "cpu" and torch.get_num_threads() == 1 else time.perf_counter

    def timer(run: Callable[[], None], task: str, round: int) -> float:
        t0 = clock()
        run()
        return clock() - t0
    return timer


def _tensors(value: Tensors) -> Sequence[torch.Tensor]:
    return (value,) if isinstance(value, torch.Tensor) else value


def _output_bytes(layers: nn.Sequential, sample: Tensors) -> List[float]:
    out = []
    x = sample
    with torch.no_grad(), use_tracker(SkipTracker()):
        for layer in layers:
            x = layer(x)
            out.append(float(tensor_bytes(_tensors(x))))
    return out
