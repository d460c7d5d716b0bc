"""The API reference's example of profile_many: one profile per batch, to see exposed time vary with the data."""
import time

from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskProfiler, TaskSchedule

# a sleep as the workload: each batch is a duration to spend
plan = PipelinePlan({PipelineTask("Work", lambda ctx: time.sleep(ctx.batch)): TaskSchedule()})
pipe = SWPipeline(plan, device="cpu")
profiler = TaskProfiler(pipe, num_warmup=0, num_measure=2, num_rounds=1)
batch_a, batch_b, batch_c = 0.0001, 0.0002, 0.0003

# -- as written --
results = profiler.profile_many([batch_a, batch_b, batch_c])
for i, r in enumerate(results):
    print(f"\n--- Batch {i} ---")
    r.print_report()

# -- checked --
assert [r.meta["batch_index"] for r in results] == [0, 1, 2]
results = profiler.profile_many([batch_a, batch_b], num_warmup=1, num_measure=3, num_rounds=2)  # the signature's
assert {(r.meta["num_warmup"], r.meta["num_measure"], r.meta["num_rounds"]) for r in results} == {(1, 3, 2)}
