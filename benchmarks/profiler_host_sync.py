"""The profiler's host time of a task that waits for the device itself (``.item()``), on swpipe.testing.FakeCuda.

The profiler times device work by holding the task's stream with a spin kernel; a task that reads a value
back would wait behind that spin. Host time is therefore measured in iterations without the spin. This prints,
per task length, the task's time called alone on an idle device, the profiler's host time, and their ratio.

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
