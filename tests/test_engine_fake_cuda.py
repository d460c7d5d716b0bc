"""The engine's CUDA path driven on a CPU by a fake ``torch.cuda`` that logs what reaches the device.

Every kernel launch, event record and stream wait is logged with the stream it
went to; :class:`_FakeDevice` then rebuilds the device's happens-before order
from CUDA's rules (a stream runs its work in order; ``wait_event`` orders what
follows after the latest record of the event *made before the wait*, and after
nothing if there was none yet). The tests check the execution contract on it:
each task launches on its own stream from its own thread, every dependency is
ordered on the device, a batch the iterator made on the caller's stream is
ready before the first tasks read it (and a CPU batch adds no order), and NVTX
mode never synchronises the device. The real-GPU side is tests/test_streams_cuda.py.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import Any, List, Optional, Tuple

import networkx as nx
import pytest
import torch

from swpipe_core.engine import PipelineTaskError, SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.streams import _holds_cuda

pytestmark = pytest.mark.timeout(60)

_DEVICE = torch.device("cuda", 0)


class _FakeStream:
    def __init__(self, dev: "_FakeDevice", sid: int) -> None:
        self._dev, self.stream_id, self.device = dev, sid, _DEVICE

    def wait_event(self, event: "_FakeEvent") -> None:
        self._dev.log_op("wait", self, event.id)


class _FakeEvent:
    _ids = itertools.count(1)

    def __init__(self, dev: "_FakeDevice", enable_timing: bool = False, **_: Any) -> None:
        self._dev, self.id, self.recorded = dev, next(self._ids), False

    def record(self, stream: Optional[_FakeStream] = None) -> None:
        self._dev.log_op("record", stream if stream is not None else self._dev.current(), self.id)
        self.recorded = True

    def query(self) -> bool:
        done = not self._dev.hung or not self.recorded
        if done and self.recorded:  # the host saw the recorded work complete: what it issues next runs after it
            self._dev.log_op("done", self._dev.host, self.id)
        return done

    def elapsed_time(self, end: "_FakeEvent") -> float:
        return 0.0


class _FakeDevice:
    """A log of device operations, and the order CUDA would run them in."""

    def __init__(self) -> None:
        self.log: List[Tuple[str, int, Any, str]] = []  # (op, stream id, what, host thread)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._ids = itertools.count(1)
        self.default = _FakeStream(self, 0)
        self.host = _FakeStream(self, -1)  # where host observations of completed events are logged
        self.hung = False

    def current(self) -> _FakeStream:
        return getattr(self._local, "stream", self.default)

    def log_op(self, op: str, stream: _FakeStream, what: Any) -> None:
        with self._lock:
            self.log.append((op, stream.stream_id, what, threading.current_thread().name))

    def launch(self, what: Any) -> None:
        """A kernel on the calling thread's current stream."""
        self.log_op("launch", self.current(), what)

    @contextlib.contextmanager
    def stream(self, s: _FakeStream):
        prev = self.current()
        self._local.stream = s
        try:
            yield
        finally:
            self._local.stream = prev

    def order(self) -> nx.DiGraph:
        g = nx.DiGraph()
        g.add_nodes_from(range(len(self.log)))
        last_on: dict = {}
        last_record: dict = {}
        for k, (op, sid, what, _) in enumerate(self.log):
            if sid in last_on:
                g.add_edge(last_on[sid], k)
            last_on[sid] = k
            if op == "record":
                last_record[what] = k
            elif op == "wait" and what in last_record:  # a wait before any record orders nothing
                g.add_edge(last_record[what], k)
            elif op == "done":  # completed, as a query returned: before every op issued later, on any stream
                g.add_edge(last_record[what], k)
                for sid2 in {s for _, s, _, _ in self.log[k + 1:]} - {sid}:
                    g.add_edge(k, next(j for j in range(k + 1, len(self.log)) if self.log[j][1] == sid2))
        return g

    def launches(self) -> dict:
        return {what: (k, sid, thread) for k, (op, sid, what, thread) in enumerate(self.log) if op == "launch"}


@pytest.fixture
def fake_cuda(monkeypatch):
    dev = _FakeDevice()

    def no_sync(*args, **kwargs):
        raise AssertionError("torch.cuda.synchronize() called: an unbounded device wait")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: dev.default)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: dev.current())
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None, priority=0: _FakeStream(dev, next(dev._ids)))
    monkeypatch.setattr(torch.cuda, "Event", lambda **kw: _FakeEvent(dev, **kw))
    monkeypatch.setattr(torch.cuda, "stream", dev.stream)
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: 0)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: 0)
    return dev


class _CudaLooking(torch.Tensor):
    """A CPU tensor that reports ``is_cuda`` (what a batch the iterator moved to the GPU looks like)."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def _cuda_batch(i: int) -> torch.Tensor:
    return torch.Tensor._make_subclass(_CudaLooking, torch.full((1,), float(i)))


def _launching(dev: _FakeDevice, name: str):
    def fn(ctx):
        dev.launch((name, ctx.iter_idx))
    return fn


def _plan(dev: _FakeDevice, caller_group: Optional[str]) -> PipelinePlan:
    """H2D (memcpy) -> Fwd (default) -> Bwd (default) -> Opt ('opt'), Fwd(i) after Opt(i-1)."""
    return PipelinePlan(
        {PipelineTask("H2D", _launching(dev, "H2D")): TaskSchedule(0, "memcpy", "io"),
         PipelineTask("Fwd", _launching(dev, "Fwd")): TaskSchedule(1, None, "compute"),
         PipelineTask("Bwd", _launching(dev, "Bwd")): TaskSchedule(1, None, "compute"),
         PipelineTask("Opt", _launching(dev, "Opt")): TaskSchedule(1, "opt", "io")},
        intra_iter_deps=[("Fwd", "H2D"), ("Bwd", "Fwd"), ("Opt", "Bwd")],
        inter_iter_deps=[("Fwd", "Opt", 1)], caller_group=caller_group)


@pytest.mark.parametrize("caller_group", [None, "compute"])
def test_each_task_launches_on_its_stream_and_every_dependency_is_ordered_on_the_device(fake_cuda, caller_group):
    dev, n = fake_cuda, 8
    plan = _plan(dev, caller_group)
    pipe = SWPipeline(plan, device="cuda:0")
    pipe.run(range(n))
    launches, order = dev.launches(), dev.order()
    streams = {name: pipe._streams.resolve(plan.sched(name).stream).stream_id for name in plan.task_names}
    assert len(set(streams.values())) == 3  # memcpy, opt and the default stream
    for (name, i), (_, sid, thread) in launches.items():
        assert sid == streams[name], f"{name}({i}) launched on stream {sid}, not its own {streams[name]}"
        group = plan.sched(name).thread_group
        assert thread == ("MainThread" if group == caller_group else f"swpipe-{group}")
    assert len(launches) == 4 * n
    for t, d, dist in list((t, d, 0) for t, d in plan.intra_edges()) + list(plan.inter_edges()):
        for i in range(dist, n):
            a, b = launches[(d, i - dist)][0], launches[(t, i)][0]
            assert nx.has_path(order, a, b), f"{t}({i}) may run on the device before {d}({i - dist})"


def test_a_cuda_batch_is_ready_before_the_first_tasks_read_it(fake_cuda):
    """The iterator makes the batch on the caller's current stream; H2D reads it on 'memcpy'."""
    dev, n = fake_cuda, 6

    def batches():
        for i in range(n):
            dev.launch(("batch", i))  # e.g. .to("cuda", non_blocking=True) in the data loader
            yield _cuda_batch(i)

    pipe = SWPipeline(_plan(dev, "compute"), device="cuda:0")
    pipe.run(batches())
    launches, order = dev.launches(), dev.order()
    for i in range(n):
        assert nx.has_path(order, launches[("batch", i)][0], launches[("H2D", i)][0]), f"H2D({i}) reads an unready batch"


def test_a_cpu_batch_adds_no_device_order(fake_cuda):
    """No wait for a CPU batch: H2D(i) on 'memcpy' stays free to overlap Fwd/Bwd(i-1) on the default stream."""
    dev, n = fake_cuda, 6

    def batches():
        for i in range(n):
            dev.launch(("batch", i))  # host-side loader, but something else ran on the caller's stream
            yield torch.full((1,), float(i))

    pipe = SWPipeline(_plan(dev, "compute"), device="cuda:0")
    pipe.run(batches())
    launches, order = dev.launches(), dev.order()
    for i in range(1, n):
        assert not nx.has_path(order, launches[("batch", i)][0], launches[("H2D", i)][0])
        assert not nx.has_path(order, launches[("Bwd", i - 1)][0], launches[("H2D", i)][0])


def test_serial_run_waits_for_a_batch_made_on_another_current_stream(fake_cuda):
    dev = fake_cuda
    side = torch.cuda.Stream()

    def batches():
        for i in range(3):
            with dev.stream(side):
                dev.launch(("batch", i))
            yield _cuda_batch(i)

    def loader_on_side():
        for b in batches():
            yield b

    plan = _plan(dev, "compute")
    pipe = SWPipeline(plan, device="cuda:0")
    with dev.stream(side):  # the caller runs with a side stream current; serial tasks use the default stream
        pipe.run_serial(loader_on_side())
    launches, order = dev.launches(), dev.order()
    for i in range(3):
        assert launches[("H2D", i)][1] == 0
        assert nx.has_path(order, launches[("batch", i)][0], launches[("H2D", i)][0])


def test_holds_cuda_finds_tensors_in_containers_attributes_and_slots():
    class Slotted:
        __slots__ = ("values",)

        def __init__(self, v):
            self.values = v

    class Batch:
        def __init__(self, v):
            self.kjt = Slotted(v)

    assert _holds_cuda({"a": [1, (Batch(_cuda_batch(0)),)]})
    assert not _holds_cuda({"a": [1, (Batch(torch.ones(1)),)], "m": torch.nn.Linear(1, 1)})
    assert _holds_cuda([[torch.ones(1)] for _ in range(2000)])  # too big to search: assume it does


# ----------------------------------------------------------------------------- NVTX mode


@pytest.fixture
def nvtx_calls(monkeypatch):
    """The profiler's enable/disable calls (a CPU build cannot enter NVTX mode), by thread."""
    from torch.autograd import profiler

    calls: List[Tuple[str, str]] = []
    monkeypatch.setattr(profiler, "_enable_profiler",
                        lambda config, activities: calls.append(("on", threading.current_thread().name)))
    monkeypatch.setattr(profiler, "_disable_profiler", lambda: calls.append(("off", threading.current_thread().name)))
    return calls


def test_emit_nvtx_enters_nvtx_mode_on_every_thread_without_synchronising(fake_cuda, nvtx_calls):
    pipe = SWPipeline(_plan(fake_cuda, "compute"), device="cuda:0")
    pipe.run(range(3), emit_nvtx=True)  # the fixture's torch.cuda.synchronize raises
    threads = {"MainThread", "swpipe-io"}
    assert sorted(nvtx_calls) == sorted([("on", t) for t in threads] + [("off", t) for t in threads])


def test_emit_nvtx_failure_with_a_hung_device_raises_the_task_error_promptly(fake_cuda, nvtx_calls):
    dev = fake_cuda

    def step(ctx):
        dev.launch(("Step", ctx.iter_idx))
        if ctx.iter_idx == 1:
            dev.hung = True  # a kernel that never ends (a dead peer): every event recorded from now on
            raise ValueError("boom")

    plan = PipelinePlan({PipelineTask("Load", _launching(dev, "Load")): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Step", step): TaskSchedule(1, None, "compute")}, [("Step", "Load")],
                        caller_group=None)
    pipe = SWPipeline(plan, device="cuda:0")
    pipe._teardown_timeout = 0.2
    t0 = time.monotonic()
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(range(5), emit_nvtx=True)
    assert time.monotonic() - t0 < 10
    assert (info.value.task, info.value.iteration) == ("Step", 1) and isinstance(info.value.__cause__, ValueError)
    assert len(pipe._limbo) == 1  # the contexts stay alive: the device may still read them
    assert sorted(c for c, _ in nvtx_calls) == ["off"] * 3 + ["on"] * 3  # main, io, compute: left NVTX mode
