"""What each layer costs, measured by swpipe's profiler: forward and backward time, saved and output bytes.

The layers run as the tasks of a training step of one micro-batch in which
every layer is a partition of its own (:func:`swpipe.gpipe.schedule.step_plan`,
all on one thread), profiled by :class:`~swpipe_core.measure.profiler.TaskProfiler`
(each task's time on the real step); an :class:`~swpipe.gpipe.memory.ActivationMeter`
counts the bytes each layer has autograd keep. The module is never changed:
the layers run on a copy of it (its batch norm statistics, its gradients and
its ``training`` flag stay as they were), in training mode.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, List, Sequence

import torch
from torch import nn

from swpipe_core.engine.device import Device
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.measure.profiler import TaskProfiler

from swpipe.gpipe.errors import ProfilingError
from swpipe.gpipe.memory import ActivationMeter, tensor_bytes
from swpipe.gpipe.microbatch import Tensors, batch_size, check
from swpipe.gpipe.partition import as_partition_device, movable
from swpipe.gpipe.runtime import Call, MicroBatch, TorchOps
from swpipe.gpipe.schedule import Placement, bind, step_plan
from swpipe.gpipe.skip.layout import skip_routes
from swpipe.gpipe.skip.tracker import SkipTracker, use_tracker

__all__ = ["LayerProfile", "profile_layers"]


@dataclass
class LayerProfile:
    """Per-layer costs of a module on one micro-batch of ``batch`` samples.

    Attributes
    ----------
    forward_s, backward_s : list of float
        Seconds per layer (on CUDA the larger of host and device time).
    saved_bytes : list of float
        Bytes of activations a layer has autograd keep (each storage counted
        for the first layer that saves it).
    output_bytes : list of float
        Bytes of a layer's output (what a checkpointed partition keeps of its input).
    param_bytes : list of float
    batch : int
        Samples in the profiled micro-batch.
    device : str
    """

    forward_s: List[float]
    backward_s: List[float]
    saved_bytes: List[float]
    output_bytes: List[float]
    param_bytes: List[float]
    batch: int
    device: str

    @property
    def time_s(self) -> List[float]:
        """Forward plus backward seconds per layer."""
        return [f + b for f, b in zip(self.forward_s, self.backward_s)]

    def __len__(self) -> int:
        return len(self.forward_s)


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
                   num_rounds: int = 3) -> LayerProfile:
    """Measure each layer of ``module`` on ``sample`` (one micro-batch) with swpipe's profiler.

    Parameters
    ----------
    module : nn.Sequential
    sample : tensor or tuple of tensors
    timeout : float
        About how many seconds the measurement takes (more iterations, less noise).
    device : device, optional
        Where the layers run; default the module's (its first parameter's), else the CPU.
    num_rounds : int
        Rounds of measured iterations (the profiler's medians).

    Returns
    -------
    LayerProfile

    Raises
    ------
    ProfilingError
        A parameter already has a gradient (``problem == "has_grad"``, ``parameter`` names it):
        zero the gradients first, as profiling runs backward.
    """
    check(sample, "sample")
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
    with SWPipeline(plan, device=dev) as pipe:
        t0 = time.perf_counter()
        pipe.run_one_serial_iter(batch)  # also the meter's run: every layer saves once
        call.meter = None
        once = time.perf_counter() - t0
        num_measure = max(1, min(100, int(timeout / max(once, 1e-6) / (num_rounds + 1))))
        profiler = TaskProfiler(pipe, num_warmup=1, num_measure=num_measure, num_rounds=num_rounds)
        result = profiler.profile(batch, skip_tasks=pipe.plan.task_names, memory=False, state=[sandbox])
    host = result.host_s or {}
    dev_s = result.device_s or {}

    def cost(name: str) -> float:
        return max(host.get(name, 0.0), dev_s.get(name, 0.0))

    outputs = _output_bytes(sandbox, sample)
    return LayerProfile(forward_s=[cost(f"F{j}") for j in range(len(layers))],
                        backward_s=[cost(f"B{j}") for j in range(len(layers))],
                        saved_bytes=[float(meter.saved_by.get(j, 0)) for j in range(len(layers))],
                        output_bytes=outputs,
                        param_bytes=[float(sum(p.numel() * p.element_size() for p in layer.parameters()))
                                     for layer in layers],
                        batch=batch_size(sample), device=str(dev.torch_device))


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
