"""The API reference's end-to-end example, FusedSparseDist: 9 tasks, 3 stages, 4 streams, printed and run."""
# needs: a CUDA GPU (it makes torch.cuda.Stream objects)

ran = []


def _task(name):  # "function bodies omitted for brevity": each records (task, iteration)
    def fn(ctx):
        ran.append((name, ctx.iter_idx))
    return fn


h2d, input_dist_start, input_dist_wait, emb_lookup, zero_grad, wait_batch, dense_forward, backward, optimizer_step = (
    _task(n) for n in ("H2D", "InputDistStart", "InputDistWait", "EmbLookup", "ZeroGrad", "WaitBatch", "Forward",
                       "Backward", "OptimizerStep"))

# -- as written --
# TrainPipelineFusedSparseDist 的 SWPipeline 等价表示
# 9 个 task · 3 stages · 4 streams: memcpy, data_dist, emb_lookup, default

import torch
from sw_pipeline import (
    PipelineTask, TaskSchedule, PipelinePlan, SWPipeline,
)

# 1. Streams
memcpy_stream     = torch.cuda.Stream()
data_dist_stream  = torch.cuda.Stream()
emb_lookup_stream = torch.cuda.Stream()

# 2. Tasks (function bodies omitted for brevity)
t_h2d        = PipelineTask("H2D",            h2d)
t_dist_start = PipelineTask("InputDistStart", input_dist_start)
t_dist_wait  = PipelineTask("InputDistWait",  input_dist_wait)
t_emb        = PipelineTask("EmbLookup",      emb_lookup)
t_zero       = PipelineTask("ZeroGrad",       zero_grad)
t_wait       = PipelineTask("WaitBatch",      wait_batch)
t_fwd        = PipelineTask("Forward",        dense_forward)
t_bwd        = PipelineTask("Backward",       backward)
t_opt        = PipelineTask("OptimizerStep",  optimizer_step)

# 3. PipelinePlan — 3 stages, 4 streams
plan = PipelinePlan(
    schedule={
        t_h2d:        TaskSchedule(stage=0, stream=memcpy_stream),
        t_dist_start: TaskSchedule(stage=1, stream=data_dist_stream, globally_ordered=True),
        t_dist_wait:  TaskSchedule(stage=1, stream=data_dist_stream),
        t_emb:        TaskSchedule(stage=2, stream=emb_lookup_stream),
        t_zero:       TaskSchedule(stage=2),           # default stream
        t_wait:       TaskSchedule(stage=2),
        t_fwd:        TaskSchedule(stage=2),
        t_bwd:        TaskSchedule(stage=2),
        t_opt:        TaskSchedule(stage=2),
    },
    intra_iter_deps=[
        (t_dist_start, t_h2d),         # cross-stage: memcpy → data_dist
        (t_dist_wait,  t_dist_start),   # same-stream ordering
        (t_emb,        t_dist_wait),    # cross-stage: data_dist → emb_lookup
        (t_fwd,        t_emb),          # cross-stream: emb_lookup → default
        (t_wait,       t_zero),         # same-stream ordering
        (t_fwd,        t_wait),         # same-stream ordering
        (t_bwd,        t_fwd),
        (t_opt,        t_bwd),
    ],
    inter_iter_deps=[
        (t_emb, t_bwd),               # EmbLookup(i) 依赖 Backward(i-1):TBE fused 在 backward 时更新权重
    ],
)
# pipeline_depth 自动推断: max(stage)+1 = 3

# 4. Construct & inspect
pipe = SWPipeline(plan, device=0)
pipe.print_schedule(5)

# print_schedule(5) 输出:
#    #  Task               Thread   Stream        | P0    P1    P2    P3    P4
#   --  -----------------  -------  ------------  + ----- ----- ----- ----- -----
#    0  EmbLookup          default  emb_lookup    |  --    --   i0    i1    i2
#    1  ZeroGrad           default  default       |  --    --   i0    i1    i2
#    2  WaitBatch          default  default       |  --    --   i0    i1    i2
#    3  Forward            default  default       |  --    --   i0    i1    i2
#    4  Backward           default  default       |  --    --   i0    i1    i2
#    5  OptimizerStep      default  default       |  --    --   i0    i1    i2
#    6  InputDistStart     default  data_dist     |  --   i0    i1    i2    i3
#    7  InputDistWait      default  data_dist     |  --   i0    i1    i2    i3
#    8  H2D                default  memcpy        | i0    i1    i2    i3    i4

# -- checked --
# the table as printed, but for the Stream column: a torch.cuda.Stream has no name (the sample shows the variables'
# names), so it reads as its device and id (docs/semantics.md); fused_sparse_dist_named.py checks the names
table = pipe.format_schedule(5).splitlines()
sample = reference_output("pipe.print_schedule(5)")
def drop_stream(line):  # the cells of a row but its fourth, the stream
    return line.split()[:3] + line.split()[4:]


assert [drop_stream(line) for line in table] == [drop_stream(line) for line in sample]
assert plan.pipeline_depth == 3
pipe.run(range(6))
assert sorted(i for n, i in ran if n == "OptimizerStep") == list(range(6))
