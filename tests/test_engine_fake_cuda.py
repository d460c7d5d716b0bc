"""The execution contract on the device: checked from the fake's record of every launch and its device order.

swpipe.testing.FakeCuda labels every kernel with the task and iteration the engine ran it for and stamps it
with its place in CUDA's order (a stream runs its work in order; ``wait_event`` orders what follows after the
event's latest record; a thread that synchronised with work orders what *it* launches next). The tests check:
each task launches on its own stream from its own thread, every dependency is ordered on the device (one on an
iteration whose context was already released too), a batch the iterator made on the caller's stream is ready
before the first tasks read it (and a CPU batch adds no order), a run starts after what its caller enqueued
before it, NVTX mode never synchronises the device, and a hung device never hangs a failing run.
"""

from __future__ import annotations

import threading
from typing import Dict, Optional

import pytest
import torch

from swpipe import Timeouts
from swpipe.testing import FakeDeviceHang, Launch, kernels
from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.engine.streams import devices_holding

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(60)]


def _launching(dev):
    k = kernels(dev)

    def fn(ctx):
        k.spin(0.0)  # one kernel, labelled Task(iteration) by the engine
    return fn


def _plan(dev, caller_group: Optional[str]) -> PipelinePlan:
    """H2D (memcpy) -> Fwd (default) -> Bwd (default) -> Opt ('opt'), Fwd(i) after Opt(i-1)."""
    return PipelinePlan(
        {PipelineTask("H2D", _launching(dev)): TaskSchedule(0, "memcpy", "io"),
         PipelineTask("Fwd", _launching(dev)): TaskSchedule(1, None, "compute"),
         PipelineTask("Bwd", _launching(dev)): TaskSchedule(1, None, "compute"),
         PipelineTask("Opt", _launching(dev)): TaskSchedule(1, "opt", "io")},
        intra_iter_deps=[("Fwd", "H2D"), ("Bwd", "Fwd"), ("Opt", "Bwd")],
        inter_iter_deps=[("Fwd", "Opt", 1)], caller_group=caller_group)


def _by_label(fake) -> Dict[str, Launch]:
    return {launch.label: launch for launch in fake.launches}


@pytest.mark.parametrize("caller_group", [None, "compute"])
def test_each_task_launches_on_its_stream_and_every_dependency_is_ordered_on_the_device(fake_cuda, caller_group):
    dev, n = fake_cuda.device(0), 8
    plan = _plan(dev, caller_group)
    pipe = SWPipeline(plan, device=dev)
    pipe.run(range(n))
    launches = _by_label(fake_cuda)
    streams = {name: pipe.streams.resolve(plan.sched(name).stream).label for name in plan.task_names}
    assert len(set(streams.values())) == 3  # memcpy, opt and the default stream
    assert len(launches) == 4 * n
    for name in plan.task_names:
        group = plan.sched(name).thread_group
        for i in range(n):
            launch = launches[f"{name}({i})"]
            assert launch.stream == streams[name], f"{name}({i}) launched on {launch.stream}, not {streams[name]}"
            assert launch.thread == ("MainThread" if group == caller_group else f"swpipe-{group}")
    for t, d, dist in [(t, d, 0) for t, d in plan.intra_edges()] + list(plan.inter_edges()):
        for i in range(dist, n):
            assert launches[f"{d}({i - dist})"].before(launches[f"{t}({i})"]), \
                f"{t}({i}) may run on the device before {d}({i - dist})"
    fake_cuda.assert_no_races()


def test_a_run_that_goes_on_from_a_drained_one_labels_and_orders_its_iterations_as_one_run(fake_cuda):
    dev, n = fake_cuda.device(0), 8
    plan = _plan(dev, "compute")
    pipe = SWPipeline(plan, device=dev)
    pipe.run(range(4))
    assert pipe.run(range(4), first_iter_idx=4) > 0  # the second half: iterations 4 .. 7
    launches = _by_label(fake_cuda)
    assert sorted(launches) == sorted(f"{name}({i})" for name in plan.task_names for i in range(n))
    for t, d, dist in [(t, d, 0) for t, d in plan.intra_edges()] + list(plan.inter_edges()):
        for i in range(dist, n):  # Fwd(4) after Opt(3) too: the first run ended synchronised with the device
            assert launches[f"{d}({i - dist})"].before(launches[f"{t}({i})"]), \
                f"{t}({i}) may run on the device before {d}({i - dist})"
    fake_cuda.assert_no_races()


def test_unordered_tasks_on_two_streams_are_not_ordered_on_the_device(fake_cuda):
    """The check above can fail: two tasks with no dependency on two streams have no device order."""
    dev = fake_cuda.device(0)
    plan = PipelinePlan({PipelineTask("A", _launching(dev)): TaskSchedule(0, "a", "x"),
                         PipelineTask("B", _launching(dev)): TaskSchedule(0, "b", "y")}, caller_group=None)
    SWPipeline(plan, device=dev).run(range(2))
    launches = _by_label(fake_cuda)
    assert not launches["A(1)"].before(launches["B(1)"]) and not launches["B(1)"].before(launches["A(1)"])


def _loader(dev, n: int, on_device: bool):
    """Batches; before each, a kernel on the caller's current stream (a device batch is written by it)."""
    k = kernels(dev)
    for i in range(n):
        with dev.annotate(f"batch({i})"):
            x = k.full(4, float(i))
        yield x if on_device else torch.full((1,), float(i))


def test_a_device_batch_is_ready_before_the_first_tasks_read_it(fake_cuda):
    """The iterator makes the batch on the caller's current stream; H2D reads it on 'memcpy'."""
    dev, n = fake_cuda.device(0), 6
    pipe = SWPipeline(_plan(dev, "compute"), device=dev)
    pipe.run(_loader(dev, n, on_device=True))
    launches = _by_label(fake_cuda)
    for i in range(n):
        assert launches[f"batch({i})"].before(launches[f"H2D({i})"]), f"H2D({i}) reads an unready batch"
    fake_cuda.assert_no_races()


def test_a_cpu_batch_adds_no_device_order(fake_cuda):
    """No wait for a CPU batch: H2D(i) on 'memcpy' stays free to overlap Fwd/Bwd(i-1) on the default stream."""
    dev, n = fake_cuda.device(0), 6
    SWPipeline(_plan(dev, "compute"), device=dev).run(_loader(dev, n, on_device=False))
    launches = _by_label(fake_cuda)
    for i in range(1, n):
        assert not launches[f"batch({i})"].before(launches[f"H2D({i})"])
        assert not launches[f"Bwd({i - 1})"].before(launches[f"H2D({i})"])


def test_devices_holding_finds_device_tensors_in_containers_attributes_and_slots(fake_cuda):
    dev = fake_cuda.device(0)
    k = kernels(dev)

    class Slotted:
        __slots__ = ("values",)

        def __init__(self, v):
            self.values = v

    class Batch:
        def __init__(self, v):
            self.kjt = Slotted(v)

    assert devices_holding(dev, {"a": [1, (Batch(k.full(1, 0.0)),)]}) == [dev]
    other = fake_cuda.device(1)
    assert devices_holding(dev, [kernels(other).full(1, 0.0)]) == [other]
    assert devices_holding(dev, {"a": [1, (Batch(torch.ones(1)),)], "m": torch.nn.Linear(1, 1)}) == []
    assert devices_holding(dev, [[torch.ones(1)] for _ in range(2000)]) == [dev]  # too big to search: assume


# ----------------------------------------------------------------------------- NVTX mode


def _modes(fake, state: str):
    return sorted(thread for thread, op, name in fake.nvtx if op == "mode" and name == state)


def test_emit_nvtx_enters_nvtx_mode_on_every_thread(fake_cuda):
    dev = fake_cuda.device(0)
    SWPipeline(_plan(dev, "compute"), device=dev).run(range(3), emit_nvtx=True)
    threads = sorted(["MainThread", "swpipe-io"])
    assert _modes(fake_cuda, "on") == threads and _modes(fake_cuda, "off") == threads


def test_emit_nvtx_failure_with_a_hung_device_raises_the_task_error_promptly(fake_cuda):
    dev = fake_cuda.device(0)
    k = kernels(dev)

    def step(ctx):
        k.spin(0.0)
        if ctx.iter_idx == 1:
            k.hang()  # a kernel that never ends (a dead peer)
            raise ValueError("boom")

    plan = PipelinePlan({PipelineTask("Load", _launching(dev)): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Step", step): TaskSchedule(1, None, "compute")}, [("Step", "Load")],
                        caller_group=None)
    pipe = SWPipeline(plan, device=dev, timeouts=Timeouts(teardown_s=0.2))
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(range(5), emit_nvtx=True)
    assert (info.value.task, info.value.iteration) == ("Step", 1) and isinstance(info.value.__cause__, ValueError)
    assert pipe.kept_for_device > 0  # the contexts stay alive: the device may still read them
    assert _modes(fake_cuda, "on") == _modes(fake_cuda, "off")  # every thread left NVTX mode
    assert len(_modes(fake_cuda, "on")) == 3  # main, io, compute
    with pytest.raises(FakeDeviceHang):  # what an unbounded synchronize would have done (forever, on a GPU)
        fake_cuda.hang_timeout_s = 0.1
        fake_cuda.synchronize()


def test_nvtx_mode_falls_back_when_torchs_private_profiler_api_changed(monkeypatch):
    """Any error entering torch's NVTX mode (not only ImportError) leaves the task running, with one warning."""
    from torch.autograd import profiler

    from swpipe_core.engine import device as device_module

    def moved(*args, **kwargs):
        raise TypeError("_enable_profiler() takes 3 positional arguments but 2 were given")

    monkeypatch.setattr(profiler, "_enable_profiler", moved)
    monkeypatch.setattr(device_module, "_NVTX_WARNED", [])
    ran = []
    with pytest.warns(RuntimeWarning, match="_enable_profiler"):  # the call that changed
        with device_module._nvtx_mode():  # the seam's NVTX switch, private: what it does when torch's call moved
            ran.append(threading.current_thread().name)
    assert ran == [threading.current_thread().name]
    assert not profiler._is_profiler_enabled  # the half-entered mode was left: a later profile can start


def test_a_dependency_on_a_released_iteration_is_still_ordered_on_the_device(fake_cuda):
    """T(i) (stage 2) reads what D(i-1) (stage 0) wrote on another stream; by then iteration i-1 may be retired and
    its context released. The engine keeps its events for T(i)'s device wait, whatever the timing: T(i) is never
    ordered only by another thread having seen D(i-1) complete."""
    dev = fake_cuda.device(0)
    k = kernels(dev)
    state = {}

    def d(ctx):
        state[ctx.iter_idx] = k.full(64, float(ctx.iter_idx))

    def t(ctx):
        if ctx.iter_idx >= 1:
            x = state.pop(ctx.iter_idx - 1)
            ctx.keep_alive(x)
            k.sum(x)

    plan = PipelinePlan({PipelineTask("D", d): TaskSchedule(0, "a", "g1"),
                         PipelineTask("T", t): TaskSchedule(2, "b", "g2")},
                        inter_iter_deps=[("T", "D", 1)])
    SWPipeline(plan, device=dev, max_device_lag=0).run(range(20))
    launched = _by_label(fake_cuda)
    assert all(launched[f"D({i - 1})"].before(launched[f"T({i})"]) for i in range(1, 20))
    assert fake_cuda.races == []


def test_a_run_starts_after_the_work_its_caller_enqueued_before_it(fake_cuda):
    """A parameter set up on the caller's stream (a non-blocking copy, a warm-up step) is read by a task on another
    stream: the run's streams wait for the caller's stream when it starts."""
    dev = fake_cuda.device(0)
    k = kernels(dev)
    k.spin(0.002)
    weights = k.full(64, 3.0)  # still in flight on the caller's stream when the run starts
    sums = []
    plan = PipelinePlan({PipelineTask("Read", lambda ctx: sums.append(k.sum(weights))): TaskSchedule(0, "side", "io")})
    SWPipeline(plan, device=dev).run(range(3))
    assert [k.item(s) for s in sums] == [192.0] * 3 and fake_cuda.races == []
