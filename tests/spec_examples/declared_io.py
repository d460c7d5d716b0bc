"""The API reference's example of DeclaredIO: a task's writes outside ctx, captured and replayed by a shortcut."""
from sw_pipeline import DeclaredIO, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule


def encode_fn(ctx):  # left out by the reference: a task writing state outside ctx
    shared_buffer["code"] = ctx.batch * 2


# -- as written --
shared_buffer = {}

PipelineTask("encode", encode_fn, io=[
    DeclaredIO(
        capture=lambda: dict(shared_buffer),
        restore=lambda s: shared_buffer.update(s),
    ),
])

# -- checked --
encode = PipelineTask("encode", encode_fn, io=[
    DeclaredIO(capture=lambda: dict(shared_buffer), restore=lambda s: shared_buffer.update(s))])
pipe = SWPipeline(PipelinePlan({encode: TaskSchedule()}), device="cpu")
pipe.enable_shortcut("encode")
pipe.run_one_serial_iter(5, iter_idx=0)  # caching: runs encode_fn, captures the buffer
shared_buffer.clear()
pipe.run_one_serial_iter(7, iter_idx=1)  # shortcut: encode_fn skipped, the captured buffer restored
assert shared_buffer == {"code": 10}
