"""The API reference's examples of enable_shortcut and disable_shortcut (ValueError for an unknown task name)."""
from sw_pipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

plan = PipelinePlan({PipelineTask(n, lambda ctx: None): TaskSchedule() for n in ("EmbLookup", "Prefetch",
                                                                                 "MPEmbForward")})
pipe = SWPipeline(plan, device="cpu")

# -- as written --
pipe.enable_shortcut("EmbLookup")
pipe.enable_shortcut("EmbLookup", "Prefetch", "MPEmbForward")

pipe.disable_shortcut("EmbLookup")

# -- checked --
assert sorted(pipe.shortcuts) == ["MPEmbForward", "Prefetch"]
try:
    pipe.enable_shortcut("Nope")
except ValueError:
    pass
else:
    raise AssertionError("an unknown task name was accepted")
