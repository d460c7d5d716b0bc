"""The API reference's examples of fill_pipeline and progress: prefetch depth batches, then retire one per call."""
from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

plan = PipelinePlan({PipelineTask("CopyBatch", lambda ctx: None): TaskSchedule(0),
                     PipelineTask("Forward", lambda ctx: None): TaskSchedule(1)},
                    intra_iter_deps=[("Forward", "CopyBatch")])  # the reference's plan, left out
pipe = SWPipeline(plan, device="cpu")
train_loader = dataloader = range(5)
retired = []

# -- as written --
data_iter = pipe.fill_pipeline(train_loader)
# Now ready for pipe.progress(data_iter)
pipe.drain()

data_iter = pipe.fill_pipeline(dataloader)
while True:
    try:
        idx = pipe.progress(data_iter)
        retired.append(idx)  # ours: what each call returned
    except StopIteration:
        break

# -- checked --
assert retired == [0, 1, 2, 3, 4]
try:
    pipe.fill_pipeline(dataloader)
    pipe.fill_pipeline(dataloader)  # called twice without drain: RuntimeError
except RuntimeError:
    pipe.drain()
else:
    raise AssertionError("a second fill_pipeline without drain was accepted")
