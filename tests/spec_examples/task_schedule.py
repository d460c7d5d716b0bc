"""The API reference's example of TaskSchedule: every field has a default, the simplest use sets only stage."""
from sw_pipeline import TaskSchedule

memcpy_stream = "memcpy"  # the reference's stream, made elsewhere: a named stream here (one per device and name)

# -- as written --
TaskSchedule(stage=0, stream=memcpy_stream, thread_group="io")
TaskSchedule(stage=1, globally_ordered=True)  # NCCL task
TaskSchedule(stage=2)  # default stream, default thread

# -- checked --
s = TaskSchedule(stage=2)
assert (s.stage, s.stream, s.thread_group, s.globally_ordered) == (2, None, "default", False)
assert TaskSchedule() == TaskSchedule(stage=0)
