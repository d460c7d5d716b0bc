"""The API reference's example of format_schedule: print_schedule's table as a string, e.g. for logging."""
import logging

from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

logger = logging.getLogger("spec_examples")  # the reference's logger, left out
plan = PipelinePlan({PipelineTask("CopyBatch", lambda ctx: None): TaskSchedule(0),
                     PipelineTask("Forward", lambda ctx: None): TaskSchedule(1)},
                    intra_iter_deps=[("Forward", "CopyBatch")])
pipe = SWPipeline(plan, device="cpu")

# -- as written --
logger.info(pipe.format_schedule(5))

# -- checked --
header = pipe.format_schedule(5).splitlines()[0].split()
assert header[header.index("|") + 1:] == ["P0", "P1", "P2", "P3", "P4"]
