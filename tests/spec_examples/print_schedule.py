"""The API reference's example of print_schedule(3): a row per task, [skip] after a shortcut task's name.

``reference_output`` (given by tests/test_spec_examples.py) reads the reference's sample output, the comment
lines under a call below.
"""
from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

names = ("H2DAndShuffle", "EmbInputDistStart", "EmbInputDistWait")  # the sample's first rows, a plan of their own
plan = PipelinePlan({PipelineTask(n, lambda ctx: None): TaskSchedule() for n in names},
                    intra_iter_deps=[("EmbInputDistStart", "H2DAndShuffle"), ("EmbInputDistWait", "EmbInputDistStart")])
pipe = SWPipeline(plan, device="cpu")
pipe.enable_shortcut("EmbInputDistStart")

# -- as written --
pipe.print_schedule(3)
#    #  Task                      Thread   Stream   | P0   P1   P2
#   --  ------------------------  -------  -------  + ---- ---- ----
#    0  H2DAndShuffle             default  default  | i0   i1   i2
#    1  EmbInputDistStart [skip]  default  default  |  .    .    .
#    2  EmbInputDistWait          default  default  | i0   i1   i2

# -- checked --
# the same cells; the columns are as wide as in the reference's FusedSparseDist sample (docs/semantics.md)
ours = pipe.format_schedule(3).splitlines()
sample = reference_output("pipe.print_schedule(3)")
assert [line.split() for line in ours] == [line.split() for line in sample[:1]] + [
    ["--", "-" * 24, "-------", "-" * 12, "+", "-----", "-----", "-----"]] + [line.split() for line in sample[2:]]
