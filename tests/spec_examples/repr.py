"""The API reference's example of print(pipe): device, depth, tasks, shortcuts, then the schedule table."""
import torch

from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

plan = PipelinePlan({PipelineTask("H2DAndShuffle", lambda ctx: None): TaskSchedule(),
                     PipelineTask("MPEmbForward", lambda ctx: None): TaskSchedule()},
                    intra_iter_deps=[("MPEmbForward", "H2DAndShuffle")])
pipe = SWPipeline(plan, device=0)
pipe.enable_shortcut("MPEmbForward")

# -- as written --
print(pipe)
# SWPipeline(device=0, depth=1, tasks=[...], shortcuts=['MPEmbForward'])
#
#    #  Task                      Thread   Stream   | P0
#   --  ------------------------  -------  -------  + ---
#    0  H2DAndShuffle             default  default  | i0

# -- checked --
device = "0" if torch.cuda.is_available() else "cpu"  # device=0 runs on the CPU without CUDA (a warning says so)
first, blank, header, rule, row = repr(pipe).splitlines()[:5]
assert first == f"SWPipeline(device={device}, depth=1, tasks={plan.task_names}, shortcuts=['MPEmbForward'])"
sample = reference_output("print(pipe)")
assert blank == "" and [header.split(), row.split()] == [sample[2].split(), sample[4].split()]
