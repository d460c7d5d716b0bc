"""The API reference's example of run_serial: the serial baseline beside the pipelined run, and the speedup."""
from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

plan = PipelinePlan({PipelineTask("CopyBatch", lambda ctx: setattr(ctx, "x", ctx.batch)): TaskSchedule(0),
                     PipelineTask("Forward", lambda ctx: ctx.x + 1): TaskSchedule(1)},
                    intra_iter_deps=[("Forward", "CopyBatch")])
pipe = SWPipeline(plan, device="cpu")


def make_data(n):  # left out by the reference
    return range(n)


# -- as written --
serial   = pipe.run_serial(make_data(100), verbose=True)
pipeline = pipe.run(make_data(100), verbose=True)
print(f"Speedup: {serial / pipeline:.2f}x")

# -- checked --
assert serial > 0 and pipeline > 0  # how the two compare is a measurement, not asserted
