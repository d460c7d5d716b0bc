"""Testing a pipeline without a GPU: a fake CUDA device with CUDA's semantics, and the races it finds.

``FakeCuda`` runs a multi-stream :class:`~swpipe_core.engine.pipeline.SWPipeline` on a
CPU with executor threads per stream, a bounded pool of streams per device, events
that belong to one device, a caching allocator that reuses freed blocks at once,
adversarial kernel delays, hung kernels and sticky errors; its happens-before check
names every pair of accesses the streams do not order ("Forward(3) on default reads
block #4 ..., which H2D(4) on memcpy writes"). A host thread knows only what it
synchronised with itself, a host read is a copy on the current stream, and a
``query()`` orders nothing. ``kernels(device)`` gives the same small set of kernels on
the fake, on a real CUDA device and on the CPU, so a test written once runs on each;
:class:`FakeCudaTensor` runs torch's own ops (autograd included, with CUDA's stream
rules) on the fake.

Examples
--------
>>> from swpipe_core import PipelinePlan, PipelineTask, TaskSchedule
>>> from swpipe_core.engine.pipeline import SWPipeline
>>> sums = []
>>> with FakeCuda(max_delay_s=0.001) as fake:
...     dev = fake.device(0)
...     k = kernels(dev)
...     def load(ctx): ctx.x = k.full(1000, float(ctx.batch))
...     def total(ctx): sums.append(k.sum(ctx.x))
...     plan = PipelinePlan({PipelineTask("Load", load): TaskSchedule(0, "memcpy", "io"),
...                          PipelineTask("Sum", total): TaskSchedule(1)}, intra_iter_deps=[("Sum", "Load")])
...     _ = SWPipeline(plan, device=dev).run(range(5))
...     values = [k.item(s) for s in sums]
...     fake.assert_no_races()
>>> values
[0.0, 1000.0, 2000.0, 3000.0, 4000.0]
"""

from __future__ import annotations

from swpipe.testing.fake_cuda import FakeCuda, FakeCudaDevice
from swpipe.testing.fake_memory import FakeTensor
from swpipe.testing.fake_streams import EventDeviceError, FakeCudaError, FakeDeviceHang, FakeEvent, FakeStream, Launch
from swpipe.testing.fake_torch import FakeCudaTensor
from swpipe.testing.kernels import FakeKernels, kernels
from swpipe.testing.races import HappensBefore, Race, RaceError

__all__ = ["EventDeviceError", "FakeCuda", "FakeCudaDevice", "FakeCudaError", "FakeCudaTensor", "FakeDeviceHang",
           "FakeEvent", "FakeKernels", "FakeStream", "FakeTensor", "HappensBefore", "Launch", "Race", "RaceError",
           "kernels"]
