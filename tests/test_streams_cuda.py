"""CUDA paths: named streams, device events (phase 2), NVTX, context lifetime. Skipped without a GPU."""

from __future__ import annotations

import threading
import weakref

import pytest
import torch

from swpipe_core.engine import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.streams import StreamPool

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(120)]

SPIN = int(5e7)  # cycles of torch.cuda._sleep: a few ms of device time


def test_named_streams_created_once_and_reused():
    pool = StreamPool(torch.device("cuda", 0))
    a, b = pool.resolve("memcpy"), pool.resolve("memcpy")
    assert a is b and a.swpipe_name == "memcpy"
    assert pool.resolve("data_dist") is not a
    assert pool.resolve(None) == torch.cuda.default_stream(0)
    given = torch.cuda.Stream()
    assert pool.resolve(given) is given


def test_task_runs_with_its_stream_current_and_device_set():
    seen = {}

    def probe(name):
        def fn(ctx):
            seen[name] = (torch.cuda.current_stream().stream_id, torch.cuda.current_device(),
                          threading.current_thread().name)
        return fn

    plan = PipelinePlan({PipelineTask("H2D", probe("H2D")): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Fwd", probe("Fwd")): TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("Fwd", "H2D")])
    pipe = SWPipeline(plan, device=0)
    pipe.run(range(2))
    assert seen["Fwd"][0] == torch.cuda.default_stream(0).stream_id
    assert seen["H2D"][0] != seen["Fwd"][0]
    assert seen["H2D"][1] == seen["Fwd"][1] == 0


def test_device_event_orders_cross_stream_consumer():
    """Producer writes on 'memcpy' after a long spin; the consumer on the default stream must see the write."""
    results = []

    def produce(ctx):
        torch.cuda._sleep(SPIN)
        ctx.x = torch.full((1 << 20,), float(ctx.iter_idx + 1), device="cuda")

    def consume(ctx):
        results.append(ctx.x.sum())  # launched on the default stream, after wait_event

    plan = PipelinePlan({PipelineTask("Produce", produce): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Consume", consume): TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("Consume", "Produce")])
    SWPipeline(plan, device=0).run(range(6))
    torch.cuda.synchronize()
    assert [int(r.item()) for r in results] == [(i + 1) * (1 << 20) for i in range(6)]


def test_retired_context_kept_until_device_work_completes():
    refs = []

    def produce(ctx):
        refs.append(weakref.ref(ctx))
        torch.cuda._sleep(SPIN * 4)
        ctx.x = torch.ones(1 << 20, device="cuda")

    plan = PipelinePlan({PipelineTask("Produce", produce): TaskSchedule(0, "memcpy")})
    pipe = SWPipeline(plan, device=0)
    it = pipe.fill_pipeline(range(3))
    assert pipe.progress(it) == 0
    assert refs[0]() is not None  # CPU retired, device may still be running: context kept
    pipe.drain()
    assert all(r() is None for r in refs)


def test_nvtx_and_profiler_ranges_named_per_task_and_iteration(monkeypatch):
    pushed = []
    original = torch.cuda.nvtx.range_push
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: pushed.append(name) or original(name))
    plan = PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("B", lambda ctx: None): TaskSchedule(1)}, intra_iter_deps=[("B", "A")])
    pipe = SWPipeline(plan, device=0)
    pipe.run(range(2), emit_nvtx=True)
    pipe.run_serial(range(1))
    assert {"SWP/A/iter0", "SWP/A/iter1", "SWP/B/iter1", "SWP_serial/B/iter0"} <= set(pushed)


def test_device_timeline_events_recorded():
    plan = PipelinePlan({PipelineTask("Spin", lambda ctx: torch.cuda._sleep(SPIN)): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("B", lambda ctx: None): TaskSchedule(1)}, intra_iter_deps=[("B", "Spin")])
    pipe = SWPipeline(plan, device=0, record_timeline=True)
    pipe.run(range(4))
    device = [e for e in pipe.timeline if e.kind == "device"]
    assert {(e.task, e.iteration) for e in device} == {(t, i) for t in ("Spin", "B") for i in range(4)}
    spins = sorted((e for e in device if e.task == "Spin"), key=lambda e: e.iteration)
    assert all(e.end > e.start for e in spins)
    assert all(a.end <= b.start + 1e-4 for a, b in zip(spins, spins[1:]))  # one stream: serialised
