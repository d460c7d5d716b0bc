"""SWPipeline.instrument: a wrapper around every task execution, in every mode, removed on exit."""

from __future__ import annotations

import threading

import pytest
import torch

from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from conftest import drive, swpipe_threads

pytestmark = pytest.mark.timeout(60)


class Seen:
    """A wrapper that records (task, iteration, thread) of every call, thread-safe."""

    def __init__(self, label="w", log=None):
        self.label = label
        self.calls = []
        self.log = log  # shared by nested wrappers: the order of entries and exits
        self._lock = threading.Lock()

    def __call__(self, run_task, task, ctx):
        if self.log is not None:
            self.log.append((self.label, "enter", task.name, ctx.iter_idx))
        with self._lock:
            self.calls.append((task.name, ctx.iter_idx, threading.current_thread().name))
        run_task(task, ctx)
        if self.log is not None:
            self.log.append((self.label, "exit", task.name, ctx.iter_idx))

    def instances(self):
        return sorted((name, i) for name, i, _ in self.calls)


def _fast_path(pipe):
    """Whether the run in flight calls each task's function directly (the CPU fast path, no dispatch).

    Only the per-task cost shows it through the API, and tests assert no timing: this one reads the
    engine's run state.
    """
    return pipe._run.setup.plain  # private: see the docstring


def _plan(groups, caller_group="default", ran=None):
    """A -> B -> C at stages 0, 1, 1 on the given thread groups; ``ran`` collects (task, iteration)."""
    ran = [] if ran is None else ran
    tasks = {n: PipelineTask(n, lambda ctx, n=n: ran.append((n, ctx.iter_idx))) for n in "ABC"}
    return PipelinePlan({tasks["A"]: TaskSchedule(0, thread_group=groups[0]),
                         tasks["B"]: TaskSchedule(1, thread_group=groups[1]),
                         tasks["C"]: TaskSchedule(1, thread_group=groups[2])},
                        intra_iter_deps=[("B", "A"), ("C", "B")], caller_group=caller_group)


def _every(n):
    return sorted((t, i) for t in "ABC" for i in range(n))


@pytest.mark.parametrize("groups, caller, threads", [
    (("io", "compute", "compute"), "default", {"A": "swpipe-io", "B": "swpipe-compute", "C": "swpipe-compute"}),
    (("default", "default", "default"), "default", {n: "MainThread" for n in "ABC"}),  # inline, no worker
    (("io", "default", "default"), "default", {"A": "swpipe-io", "B": "MainThread", "C": "MainThread"}),
], ids=["workers", "inline", "mixed"])
def test_pipelined_run_calls_the_wrapper_once_per_task_execution_on_the_thread_that_runs_it(groups, caller, threads):
    assert threading.current_thread().name == "MainThread"
    ran = []
    seen = Seen()
    with SWPipeline(_plan(groups, caller, ran), device="cpu") as pipe:
        with pipe.instrument(seen):
            assert drive(pipe, range(5)) == list(range(5))
    assert seen.instances() == sorted(ran) == _every(5)
    assert {name: thread for name, _, thread in seen.calls} == threads
    assert swpipe_threads() == []


@pytest.mark.parametrize("groups", [("io", "compute", "compute"), ("default",) * 3], ids=["workers", "inline"])
def test_serial_modes_call_the_wrapper_once_per_task_on_the_callers_thread(groups):
    ran = []
    seen = Seen()
    with SWPipeline(_plan(groups, ran=ran), device="cpu") as pipe:
        with pipe.instrument(seen):
            pipe.run_serial(range(3))
            pipe.run_one_serial_iter(None, iter_idx=3)
    assert seen.instances() == sorted(ran) == _every(4)
    assert {thread for _, _, thread in seen.calls} == {"MainThread"}


def test_run_and_timeline_and_strict_mode_each_call_it_once():
    """Strict mode wraps the task in its own watch: the wrapper still sees one call per execution."""
    for kwargs in ({"record_timeline": True}, {"strict": True}):
        ran = []
        seen = Seen()
        with SWPipeline(_plan(("io", "default", "default"), ran=ran), device="cpu", **kwargs) as pipe:
            with pipe.instrument(seen):
                pipe.run(range(4))
        assert seen.instances() == sorted(ran) == _every(4), kwargs


def test_wrapper_sees_shortcut_tasks_and_run_task_replays_them():
    ran = []
    seen = Seen()
    with SWPipeline(_plan(("io", "compute", "compute"), ran=ran), device="cpu") as pipe:
        pipe.enable_shortcut("A")
        with pipe.instrument(seen):
            pipe.run(range(3))
    assert seen.instances() == _every(3)  # A's replays too
    assert [i for name, i in ran if name == "A"] == [0]  # cached once, replayed after


def test_nested_wrappers_run_outermost_first_and_each_leaves_with_its_block():
    log = []
    outer, inner = Seen("outer", log), Seen("inner", log)
    ran = []
    with SWPipeline(_plan(("default",) * 3, ran=ran), device="cpu") as pipe:
        with pipe.instrument(outer):
            with pipe.instrument(inner):
                pipe.run_one_serial_iter(None, iter_idx=0)
            pipe.run_one_serial_iter(None, iter_idx=1)  # inner is gone
        pipe.run_one_serial_iter(None, iter_idx=2)  # both are gone
    assert log[:4] == [("outer", "enter", "A", 0), ("inner", "enter", "A", 0),
                       ("inner", "exit", "A", 0), ("outer", "exit", "A", 0)]
    assert inner.instances() == _every(1)
    assert outer.instances() == _every(2)
    assert len(ran) == 9


def test_the_same_wrapper_entered_twice_is_called_twice_and_removed_once_per_block():
    seen = Seen()
    with SWPipeline(_plan(("default",) * 3), device="cpu") as pipe:
        with pipe.instrument(seen), pipe.instrument(seen) as same:
            assert same is seen
            pipe.run_one_serial_iter(None)
        pipe.run_one_serial_iter(None)
    assert len(seen.calls) == 2 * 3


@pytest.mark.parametrize("groups", [("io", "compute", "compute"), ("default",) * 3], ids=["workers", "inline"])
def test_wrapper_is_removed_and_the_fast_path_back_when_a_task_raises(groups):
    def boom(ctx):
        if ctx.iter_idx == 2:
            raise ValueError("boom")

    plan = _plan(groups).bind({"B": boom})
    seen = Seen()
    with SWPipeline(plan, device="cpu") as pipe:
        with pytest.raises(PipelineTaskError, match="boom"):
            with pipe.instrument(seen):
                pipe.run(range(6))
        assert swpipe_threads() == []
        assert ("B", 2) in seen.instances()
        calls = len(seen.calls)
        it = pipe.fill_pipeline(range(6))
        assert _fast_path(pipe)  # nothing around the tasks: the CPU fast path skips the dispatch again
        pipe.drain()
        assert len(seen.calls) == calls


def test_fast_path_off_while_instrumented_and_back_after():
    with SWPipeline(_plan(("default",) * 3), device="cpu") as pipe:
        pipe.fill_pipeline(range(3))
        assert _fast_path(pipe)
        pipe.drain()
        with pipe.instrument(Seen()):
            pipe.fill_pipeline(range(3))
            assert not _fast_path(pipe)
            pipe.drain()
        pipe.fill_pipeline(range(3))
        assert _fast_path(pipe)
        pipe.drain()


def test_a_wrapper_that_raises_fails_its_task():
    def broken(run_task, task, ctx):
        if task.name == "C":
            raise KeyError("wrapper")
        run_task(task, ctx)

    with SWPipeline(_plan(("io", "compute", "compute")), device="cpu") as pipe:
        with pytest.raises(PipelineTaskError) as info:
            with pipe.instrument(broken):
                pipe.run(range(3))
        assert info.value.task == "C" and isinstance(info.value.__cause__, KeyError)
        pipe.run(range(3))  # usable, uninstrumented


def test_entering_or_leaving_while_iterations_are_in_flight_raises():
    seen = Seen()
    with SWPipeline(_plan(("io", "compute", "compute")), device="cpu") as pipe:
        it = pipe.fill_pipeline(range(5))
        with pytest.raises(RuntimeError, match=r"instrument\(\).*\b2\b.*drain\(\)"):  # the call, the iterations, the fix
            with pipe.instrument(seen):
                pass  # pragma: no cover
        pipe.drain()
        with pytest.raises(RuntimeError, match=r"instrument\(\).*\b2\b"):  # the block, the iterations in flight
            with pipe.instrument(seen):
                it = pipe.fill_pipeline(range(5))
        calls = len(seen.calls)
        pipe.progress(it)  # the rest of the run goes on without it
        pipe.drain()
        assert len(seen.calls) == calls and pipe.in_flight == 0 and pipe.worker_threads == []
        with pipe.instrument(seen):  # an idle pipeline again
            pipe.run(range(2))
    assert len(seen.calls) == calls + 6


def test_instrument_needs_a_callable():
    with SWPipeline(_plan(("default",) * 3), device="cpu") as pipe:
        with pytest.raises(TypeError, match=r"wrapper\(run_task.*str"):  # what it takes, what it got
            with pipe.instrument("timer"):
                pass  # pragma: no cover


@pytest.mark.cuda
def test_cuda_wrapper_sees_every_task_once_with_its_stream_current(cuda_device):
    from swpipe_core.engine.streams import StreamPool

    plan = PipelinePlan({PipelineTask("Copy", lambda ctx: setattr(ctx, "x", ctx.batch + 1)):
                         TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Use", lambda ctx: setattr(ctx, "y", ctx.x * 2)): TaskSchedule(1)},
                        intra_iter_deps=[("Use", "Copy")])
    memcpy, default = StreamPool(cuda_device).resolve("memcpy"), cuda_device.default_stream()
    streams = []

    def on_stream(run_task, task, ctx):
        streams.append((task.name, ctx.iter_idx, cuda_device.current_stream()))
        run_task(task, ctx)

    with SWPipeline(plan, device=cuda_device) as pipe:
        with pipe.instrument(on_stream):
            pipe.run([torch.ones(2)] * 4)
            pipelined, streams[:] = list(streams), []
            pipe.run_serial([torch.ones(2)] * 2)
    assert sorted((n, i) for n, i, _ in pipelined) == [(n, i) for n in ("Copy", "Use") for i in range(4)]
    assert {(n, s == memcpy, s == default) for n, _, s in pipelined} == {("Copy", True, False), ("Use", False, True)}
    assert sorted((n, i) for n, i, _ in streams) == [(n, i) for n in ("Copy", "Use") for i in range(2)]
    assert all(s == default for _, _, s in streams)  # a serial run is on the default stream
