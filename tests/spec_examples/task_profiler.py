"""The API reference's examples of TaskProfiler: profile with the call's counts, print_report, the raw data."""
import time

from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskProfiler, TaskSchedule

runs = []
plan = PipelinePlan({PipelineTask("CopyBatch", lambda ctx: (runs.append(1), setattr(ctx, "x", ctx.batch))):
                     TaskSchedule(0),
                     # a sleep as the workload: the forward takes a little time
                     PipelineTask("Forward", lambda ctx: time.sleep(0.0002)): TaskSchedule(1)},
                    intra_iter_deps=[("Forward", "CopyBatch")])
pipe = SWPipeline(plan, device="cpu")
batch = 1

# -- as written --
profiler = TaskProfiler(pipe)
result = profiler.profile(batch, num_warmup=5, num_measure=20)
result.print_report()

# -- checked --
assert (result.meta["num_warmup"], result.meta["num_measure"], result.meta["num_rounds"]) == (5, 20, 3)

# -- as written --
result = profiler.profile(batch, num_warmup=5, num_measure=20, num_rounds=5)
result.print_report()

# Access raw data
for name, t in result.exposed_s.items():
    print(f"{name}: {t*1e3:.3f} ms")

# -- checked --
assert (result.meta["num_warmup"], result.meta["num_measure"], result.meta["num_rounds"]) == (5, 20, 5)
assert sorted(result.exposed_s) == ["CopyBatch", "Forward"] and result.baseline_s > 0
result = profiler.profile(batch, 3, 10, 3, None)  # the signature's positional form
assert (result.meta["num_warmup"], result.meta["num_measure"], result.meta["num_rounds"]) == (3, 10, 3)
