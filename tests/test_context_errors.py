"""A task that reads a ctx attribute no earlier task wrote gets an error that says what that means."""

from __future__ import annotations

import pytest

from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.plan import IterContext, PipelinePlan, PipelineTask, TaskSchedule


def test_a_missing_attribute_names_itself_the_iteration_and_the_fix():
    with pytest.raises(AttributeError) as info:
        IterContext(batch=None, iter_idx=4).x
    assert info.value.name == "x" and info.value.obj.iter_idx == 4  # the attribute, the iteration's context
    assert "dependency" in str(info.value)  # the fix: make the task that sets it a dependency
    ctx = IterContext(batch=None, iter_idx=0)
    assert not hasattr(ctx, "x") and getattr(ctx, "x", "default") == "default"  # the protocol still holds


def test_strict_mode_names_the_task_that_read_an_attribute_no_task_had_written():
    plan = PipelinePlan({PipelineTask("Step", lambda ctx: ctx.x + 1): TaskSchedule(0)})
    with SWPipeline(plan, device="cpu", strict=True) as pipe:
        with pytest.raises(PipelineTaskError) as info:
            pipe.run(range(2))
    cause = info.value.__cause__
    assert isinstance(cause, AttributeError) and cause.name == "x" and cause.obj.iter_idx == 0
    assert (info.value.task, info.value.iteration) == ("Step", 0) and "Step(0)" in str(cause)
