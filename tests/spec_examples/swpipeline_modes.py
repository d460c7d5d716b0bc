"""The API reference's example of SWPipeline's three execution modes: run, run_serial, fill_pipeline + progress."""
from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

ran = []
plan = PipelinePlan({PipelineTask("CopyBatch", lambda ctx: setattr(ctx, "x", ctx.batch)): TaskSchedule(0),
                     PipelineTask("Forward", lambda ctx: ran.append(ctx.x)): TaskSchedule(1)},
                    intra_iter_deps=[("Forward", "CopyBatch")])  # the reference's plan, left out
dataloader = [10, 11, 12]

# -- as written --
pipe = SWPipeline(plan, device=0)

# Mode 1: run() — one-shot pipelined execution
elapsed = pipe.run(dataloader, verbose=True)

# Mode 2: run_serial() — serial baseline
baseline = pipe.run_serial(dataloader, verbose=True)

# Mode 3: fill_pipeline + progress — fine-grained control
data_iter = pipe.fill_pipeline(dataloader)
while True:
    try:
        idx = pipe.progress(data_iter)
    except StopIteration:
        break

# -- checked --
assert ran == [10, 11, 12] * 3 and idx == 2 and elapsed > 0 and baseline > 0
