"""The API reference's examples of drain: switch the data iterator, or change shortcuts mid-pipeline."""
from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

forward_runs = []
plan = PipelinePlan({PipelineTask("CopyBatch", lambda ctx: setattr(ctx, "x", ctx.batch)): TaskSchedule(0),
                     PipelineTask("Forward", lambda ctx: forward_runs.append(ctx.x)): TaskSchedule(1)},
                    intra_iter_deps=[("Forward", "CopyBatch")])
pipe = SWPipeline(plan, device="cpu")
data_iter = pipe.fill_pipeline([1, 2, 3, 4])
pipe.progress(data_iter)
new_loader, loader = [5, 6, 7], [8, 9, 10]

# -- as written --
# Switch data iterator in pipelined mode
pipe.drain()
data_iter = pipe.fill_pipeline(new_loader)

# Change shortcut config mid-pipeline
pipe.drain()
pipe.enable_shortcut("Forward")
data_iter = pipe.fill_pipeline(loader)

# -- checked --
while True:
    try:
        pipe.progress(data_iter)
    except StopIteration:
        break
assert pipe.in_flight == 0 and pipe.shortcuts == ["Forward"]  # drain keeps the shortcut configuration
assert forward_runs[-1] == 8  # Forward ran once (caching) on the new loader, then was replayed
