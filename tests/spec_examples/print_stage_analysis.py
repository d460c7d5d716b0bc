"""The API reference's example of print_stage_analysis: topological order, stages, LDS, the depth it needs.

Its sample's LDS = 2 is the stage-descending enqueue order's (Forward before CopyBatch); this plan says so with
enqueue_policy="stage_descending". Under the default ready_first order CopyBatch goes first and LDS = 1
(docs/semantics.md, "Where the API reference disagrees with itself").
"""
from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

plan = PipelinePlan({PipelineTask("CopyBatch", lambda ctx: None): TaskSchedule(0, "copy"),
                     PipelineTask("Forward", lambda ctx: None): TaskSchedule(1)},
                    intra_iter_deps=[("Forward", "CopyBatch")], enqueue_policy="stage_descending")
pipe = SWPipeline(plan, device="cpu")

# -- as written --
pipe.print_stage_analysis()
# Task schedule (topological order):
#   Pos  Task              Idx  Stage  Type
#   --------------------------------------------------
#     0  CopyBatch           0      0  stream
#     1  Forward             1      1  stream
#     ...
# LDS = 2  (example: (1, 0))
# Pipeline depth = 2
#   ✓  LDS == depth (Dilworth-optimal)

# -- checked --
from swpipe_core.analysis import format_stage_analysis  # what print_stage_analysis prints

ours = format_stage_analysis(plan).splitlines()
sample = [line for line in reference_output("pipe.print_stage_analysis()") if line.strip() != "..."]
assert [line for line in sample if line not in ours] == []  # every line of the sample, as printed
