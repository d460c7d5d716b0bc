"""The API reference's example of run_one_serial_iter, with a shortcut: caching, then Forward skipped."""
from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

forward_runs = []
plan = PipelinePlan({PipelineTask("CopyBatch", lambda ctx: setattr(ctx, "x", ctx.batch)): TaskSchedule(0),
                     PipelineTask("Forward", lambda ctx: (forward_runs.append(ctx.iter_idx),
                                                          setattr(ctx, "y", ctx.x * 2))): TaskSchedule(1)},
                    intra_iter_deps=[("Forward", "CopyBatch")])
pipe = SWPipeline(plan, device="cpu")
train_loader = [3, 4]

# -- as written --
batch = next(iter(train_loader))
pipe.run_one_serial_iter(batch, iter_idx=0)

# With shortcut
pipe.enable_shortcut("Forward")
pipe.run_one_serial_iter(batch, iter_idx=1)  # caching
pipe.run_one_serial_iter(batch, iter_idx=2)  # shortcut (Forward skipped)

# -- checked --
assert forward_runs == [0, 1]  # iteration 2 replayed the cache
