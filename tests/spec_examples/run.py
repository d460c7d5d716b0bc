"""The API reference's example of run: one-shot pipelined execution, wall-clock seconds returned."""
from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

seen = []
plan = PipelinePlan({PipelineTask("Forward", lambda ctx: seen.append(ctx.iter_idx)): TaskSchedule(1)})
pipe = SWPipeline(plan, device="cpu")
batches = range(6)

# -- as written --
elapsed = pipe.run(batches, verbose=True, emit_nvtx=True)
print(f"Pipeline: {elapsed*1000:.1f} ms")

# -- checked --
assert seen == list(range(6)) and isinstance(elapsed, float) and elapsed > 0
