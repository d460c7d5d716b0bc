"""CUDA-safety logic of the engine that is checkable on a CPU: stream identity and the
resolved wait list, the context graveyard (early frees), the device-lag setting and a
teardown that stays bounded when the device hangs. The GPU side is tests/test_streams_cuda.py."""

from __future__ import annotations

import pytest
import torch

from swpipe import Timeouts
from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.engine.lifetime import GuardedContext
from swpipe_core.plan import DeclaredIO, PipelinePlan, PipelineTask, TaskSchedule, stream_name
from swpipe_core.engine.dispatch import Dispatch
from swpipe_core.validate import PlanError
from conftest import retirements, swpipe_threads

pytestmark = pytest.mark.timeout(60)


def _noop(ctx):
    return None


def _cuda_stream(index: int, sid: int) -> torch.Stream:
    """A CUDA stream *object* (constructible without a GPU): what a plan may carry as its stream."""
    return torch.Stream(stream_id=sid, device_index=index, device_type=1)


# ----------------------------------------------------------------------------- stream identity

def test_string_default_stream_rejected_with_rule_and_fix():
    plan = PipelinePlan({PipelineTask("P", _noop): TaskSchedule(0, "default"),
                         PipelineTask("C", _noop): TaskSchedule(1, None)}, [("C", "P")])
    with pytest.raises(PlanError) as info:
        SWPipeline(plan, device="cpu")
    assert info.value.rule == "stream_name" and "P" in str(info.value) and "None" in info.value.fix


def test_device_waits_follow_the_resolved_stream_not_its_name():
    a, same_as_a, other_device = _cuda_stream(0, 0), _cuda_stream(0, 0), _cuda_stream(1, 0)
    plan = PipelinePlan(
        {PipelineTask("A", _noop): TaskSchedule(0, a),
         PipelineTask("SameStream", _noop): TaskSchedule(0, same_as_a),      # another object, one queue
         PipelineTask("OtherDevice", _noop): TaskSchedule(0, other_device),  # same stream id on cuda:1
         PipelineTask("Copy", _noop): TaskSchedule(0, "memcpy"),
         PipelineTask("Fwd", _noop): TaskSchedule(1, None),
         PipelineTask("Bwd", _noop): TaskSchedule(1, None)},
        intra_iter_deps=[("SameStream", "A"), ("OtherDevice", "A"), ("Copy", "A"), ("Fwd", "Copy"), ("Bwd", "Fwd")],
        inter_iter_deps=[("Copy", "Bwd", 1)])
    waits = SWPipeline(plan, device="cpu").device_waits
    assert waits["SameStream"] == ()
    assert waits["OtherDevice"] == (("A", 0),)
    assert waits["Copy"] == (("A", 0), ("Bwd", 1))  # the cross-iteration dependency too
    assert waits["Fwd"] == (("Copy", 0),)
    assert waits["Bwd"] == ()  # same (default) stream: its FIFO orders it
    assert stream_name(a) == "cuda:0/stream0" != stream_name(other_device) == "cuda:1/stream0"


# ----------------------------------------------------------------------------- graveyard
# What a CUDA context keeps is a slot (``_swp_graveyard``) on purpose: a context's attributes are the user's
# namespace, so nothing public may take a name there. These tests read the slot.

def test_guarded_context_keeps_deleted_and_replaced_values_out_of_sight():
    ctx = GuardedContext(batch=1, iter_idx=0)
    first, second = torch.ones(3), torch.zeros(3)
    ctx.x = first
    ctx.x = first          # the same object again: nothing leaves the context
    ctx.x = second
    del ctx.x
    assert [id(v) for v in ctx._swp_graveyard] == [id(first), id(second)]  # the slot (see above)
    assert vars(ctx) == {"batch": 1, "iter_idx": 0} and "_swp_graveyard" not in repr(ctx)


def test_shortcut_replay_and_declared_io_restore_keep_what_they_replace():
    external = {"w": torch.ones(2)}
    io = DeclaredIO(capture=lambda: dict(external), restore=external.update)

    def fwd(ctx):
        ctx.y = ctx.x * 2
        del ctx.x

    task, dispatch = PipelineTask("Fwd", fwd, [io]), Dispatch()  # how the engine calls a task
    dispatch.shortcut.enable(["Fwd"])
    first = GuardedContext(batch=None, iter_idx=0)
    first.x = torch.ones(2)
    dispatch.call_serial(task, first)  # caching run
    replay = GuardedContext(batch=None, iter_idx=1)
    x, y_old, w_old = torch.full((2,), 5.0), torch.zeros(2), external["w"]
    replay.x, replay.y = x, y_old
    dispatch.call_serial(task, replay)
    kept = replay._swp_graveyard  # the graveyard slot: a context's attribute names are the user's (see above)
    assert any(v is x for v in kept) and any(v is y_old for v in kept)  # deleted and swapped out by the replay
    assert any(isinstance(v, dict) and v["w"] is w_old for v in kept)   # replaced by the DeclaredIO restore
    assert external["w"] is not w_old and torch.equal(external["w"], torch.ones(2))


def test_cpu_pipelines_use_the_plain_context():
    seen = []
    plan = PipelinePlan({PipelineTask("A", lambda ctx: seen.append(type(ctx).__name__)): TaskSchedule()})
    SWPipeline(plan, device="cpu").run(range(2))
    assert seen == ["IterContext", "IterContext"]


# ----------------------------------------------------------------------------- device lag

@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_max_device_lag_rejects_non_integers(bad):
    plan = PipelinePlan({PipelineTask("A", _noop): TaskSchedule()})
    with pytest.raises(ValueError, match="max_device_lag"):
        SWPipeline(plan, device="cpu", max_device_lag=bad)


def test_max_device_lag_defaults_to_depth_and_has_no_effect_on_cpu():
    out = []
    plan = PipelinePlan({PipelineTask("A", lambda ctx: setattr(ctx, "x", ctx.batch)): TaskSchedule(0),
                         PipelineTask("B", lambda ctx: out.append(ctx.x)): TaskSchedule(2)}, [("B", "A")])
    assert SWPipeline(plan, device="cpu").max_device_lag == 3
    pipe = SWPipeline(plan, device="cpu", max_device_lag=0)
    lags = [pipe.device_lag for _ in retirements(pipe, pipe.fill_pipeline(range(6)))]
    assert out == list(range(6)) and lags == [0] * 6


# ----------------------------------------------------------------------------- bounded teardown

class _HungEvent:
    """A device event whose work does not complete (a collective whose peer died) until ``recover()``."""

    hung = True

    def query(self) -> bool:
        return not _HungEvent.hung


@pytest.fixture
def hung_device(monkeypatch):
    """Fence events that never complete; the fixture's ``recover()`` lets them complete."""
    monkeypatch.setattr(_HungEvent, "hung", True)

    def recover():
        monkeypatch.setattr(_HungEvent, "hung", False)

    return recover


def _failing_plan(fail_at: int) -> PipelinePlan:
    def step(ctx):
        if ctx.iter_idx == fail_at:
            raise ValueError("boom")

    return PipelinePlan({PipelineTask("Load", _noop): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Step", step): TaskSchedule(1, None, "compute")}, [("Step", "Load")])


def _no_synchronize(*args, **kwargs):
    raise AssertionError("torch.cuda.synchronize must not be called by teardown")


def test_teardown_with_a_hung_device_is_bounded_and_keeps_the_task_error(monkeypatch, hung_device):
    # the fence never completes until hung_device() below: a teardown that waited for the device would hang
    # the test (its timeout mark); one bounded by its deadline raises while the device is still hung
    monkeypatch.setattr(torch.cuda, "synchronize", _no_synchronize)
    pipe = SWPipeline(_failing_plan(fail_at=2), device="cpu", timeouts=Timeouts(teardown_s=0.2))
    monkeypatch.setattr(pipe.streams, "fence", lambda streams=(): [_HungEvent()])
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(range(6))
    assert (info.value.task, info.value.iteration) == ("Step", 2) and isinstance(info.value.__cause__, ValueError)
    assert swpipe_threads() == [] and pipe.kept_for_device > 0  # contexts kept: the device may still read them
    hung_device()  # the device recovers
    with pytest.raises(PipelineTaskError):
        pipe.run(range(6))  # the pipeline is usable again (and fails the same way)
    assert pipe.kept_for_device == 0  # the fill found the old fence complete and freed the contexts


def test_teardown_after_a_sticky_device_error_keeps_the_task_error(monkeypatch):
    def broken(streams=()):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    pipe = SWPipeline(_failing_plan(fail_at=1), device="cpu")
    monkeypatch.setattr(pipe.streams, "fence", broken)
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(range(4))
    assert isinstance(info.value.__cause__, ValueError) and swpipe_threads() == []
    assert pipe.kept_for_device > 0 and pipe.in_flight == 0


def test_normal_end_with_a_hung_device_raises_instead_of_hanging(monkeypatch, hung_device):
    pipe = SWPipeline(_failing_plan(fail_at=-1), device="cpu", timeouts=Timeouts(progress_s=0.2))
    monkeypatch.setattr(pipe.streams, "fence", lambda streams=(): [_HungEvent()])
    with pytest.raises(RuntimeError, match=r"0\.2 s \(Timeouts\.progress_s\)"):  # the timeout that expired
        pipe.run(range(3))
    assert swpipe_threads() == []
    hung_device()
    assert pipe.run(range(3)) > 0 and pipe.kept_for_device == 0
