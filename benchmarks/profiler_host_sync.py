"""The profiler's host time of a task that waits for the device itself (``.item()``), on swpipe.testing.FakeCuda.

The profiler times device work by holding the task's stream with a spin kernel; a task that reads a value
back would wait behind that spin. Host time is therefore measured in iterations without the spin. This prints,
per task length, the task's time called alone on an idle device, the profiler's host time, and their ratio.

Then the host/device split the unit tests check on the fake's virtual time only (tests/test_profiler.py,
tests/test_streams_cuda.py), on the wall clock: a host-bound task (30 ms host work, one tiny kernel), a
device-bound one (a 30 ms spin) and a launch-only one (a kernel launch before a 20 ms spin), with each time's
ratio to the work it should hold, on the fake and on cuda:0 where there is one.

    python benchmarks/profiler_host_sync.py
"""
import time, statistics
from swpipe.testing import FakeCuda, kernels
from swpipe_core import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.measure.profiler import TaskProfiler
from swpipe_core.plan import IterContext
with FakeCuda(num_devices=1) as fake:
    dev = fake.device(0); k = kernels(dev)
    for host in (0.0005, 0.005, 0.02):
        def syncing(ctx, host=host):
            t = time.perf_counter()
            while time.perf_counter() - t < host: pass
            ctx.n = k.item(k.sum(k.full(16, 1.0)))
        direct = []
        for _ in range(10):
            t = time.perf_counter(); syncing(IterContext(None, 0)); direct.append(time.perf_counter() - t)
        plan = PipelinePlan({PipelineTask("Sync", syncing): TaskSchedule()})
        with SWPipeline(plan, device=dev) as pipe:
            r = TaskProfiler(pipe, num_warmup=2, num_measure=10, num_rounds=1).profile(None)
        d = statistics.median(direct)
        print(f"busy {host*1e3:.1f} ms: task alone {d*1e3:.3f} ms, profiler host_s {r.host_s['Sync']*1e3:.3f} ms ({(r.host_s['Sync']/d-1)*100:+.1f} %), device_s {r.device_s['Sync']*1e3:.3f} ms")

import torch
from swpipe.testing import kernels as kernels_of
devices = [("fake", None)] + ([("cuda:0", "cuda:0")] if torch.cuda.is_available() else [])
for label, name in devices:
    fake = FakeCuda(num_devices=1) if name is None else None
    dev = fake.device(0) if fake is not None else name
    k = kernels_of(dev)
    def host_bound(ctx):
        time.sleep(0.03); ctx.y = k.full(16, 1.0)
    def heavy(ctx):
        ctx.z = k.full(1 << 10, 1.0); k.spin(0.02)
    plan = PipelinePlan({PipelineTask("Host", host_bound): TaskSchedule(),
                         PipelineTask("Device", lambda ctx: k.spin(0.03)): TaskSchedule(),
                         PipelineTask("Heavy", heavy): TaskSchedule()})
    with SWPipeline(plan, device=dev) as pipe:
        r = TaskProfiler(pipe, num_warmup=1, num_measure=4, num_rounds=2).profile(None)
    h, d, e = r.host_s, r.device_s, r.exposed_s
    print(f"{label}: Host host_s/30ms {h['Host'] / 0.03:.2f}, device_s/host_s {d['Host'] / h['Host']:.3f}; "
          f"Device device_s/30ms {d['Device'] / 0.03:.2f}, host_s/device_s {h['Device'] / d['Device']:.3f}; "
          f"Heavy host_s/device_s {h['Heavy'] / d['Heavy']:.3f}, exposed_s/device_s {e['Heavy'] / d['Heavy']:.2f}")
    if fake is not None:
        fake.close()
