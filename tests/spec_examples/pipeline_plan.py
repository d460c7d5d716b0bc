"""The API reference's full example of PipelinePlan: four tasks, two stages, Fwd(i) waits for Optim(i-1)."""
from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

ran = []


def record(name):  # the reference's task bodies, left out: each records (task, iteration)
    return lambda ctx: ran.append((name, ctx.iter_idx))


h2d_fn, fwd_fn, bwd_fn, optim_fn = record("H2D"), record("Forward"), record("Backward"), record("Optim")
copy_stream = "copy"  # the reference's stream, made elsewhere: a named stream here

# -- as written --
copy  = PipelineTask("H2D", h2d_fn)
fwd   = PipelineTask("Forward", fwd_fn)
bwd   = PipelineTask("Backward", bwd_fn)
optim = PipelineTask("Optim", optim_fn)

plan = PipelinePlan(
    schedule={
        copy:  TaskSchedule(stage=0, stream=copy_stream, thread_group="io"),
        fwd:   TaskSchedule(stage=1, thread_group="compute"),
        bwd:   TaskSchedule(stage=1, thread_group="compute"),
        optim: TaskSchedule(stage=1, thread_group="compute"),
    },
    intra_iter_deps=[(fwd, copy), (bwd, fwd), (optim, bwd)],
    inter_iter_deps=[(fwd, optim)],  # Fwd(i) waits for Optim(i-1)
    pipeline_depth=2,
)

# -- checked --
SWPipeline(plan, device="cpu").run(range(4))
steps = [(n, i) for n, i in ran if n != "H2D"]
assert steps == [(n, i) for i in range(4) for n in ("Forward", "Backward", "Optim")]  # Fwd(i) after Optim(i-1)
assert sorted(i for n, i in ran if n == "H2D") == [0, 1, 2, 3]
