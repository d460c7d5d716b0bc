"""CUDA paths: named streams, device events (phase 2), NVTX, context lifetime. Skipped without a GPU."""

from __future__ import annotations

import contextlib
import threading
import time
import weakref

import pytest
import torch

from swpipe_core.engine import PipelineTaskError, SWPipeline
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


# --------------------------------------------------------------------------- issue 12: correct by construction

def _cycles(seconds: float, device: int = 0) -> int:
    """torch.cuda._sleep cycles that spin about ``seconds`` on ``device``."""
    from swpipe_core.profiler import _spin_rate

    return int(_spin_rate(torch.device("cuda", device)) * seconds)


def _two_gpus():
    return pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


@pytest.mark.parametrize("device,caller_group", [(0, None), (0, "compute"), pytest.param(1, None, marks=_two_gpus())])
def test_early_free_across_streams_keeps_sums_exact(device, caller_group):
    """Produce (memcpy) allocates full(N, i+1); Consume (default stream) spins ~30 ms, sums, then dels the input.

    Without keeping deleted values alive, the next Produce gets the freed block from the caching
    allocator on the memcpy stream and overwrites it while the sum still waits behind the spin.
    """
    n, iters, spin = 1 << 20, 200, _cycles(0.03, device)
    sums, devices = [], set()

    def produce(ctx):
        ctx.x = torch.full((n,), ctx.iter_idx + 1, dtype=torch.int64, device="cuda")
        devices.add(ctx.x.device.index)

    def consume(ctx):
        torch.cuda._sleep(spin)
        sums.append(ctx.x.sum())
        del ctx.x

    plan = PipelinePlan({PipelineTask("Produce", produce): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Consume", consume): TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("Consume", "Produce")], caller_group=caller_group)
    SWPipeline(plan, device=device).run(range(iters))
    torch.cuda.synchronize(device)
    assert devices == {device}
    assert [int(s.item()) for s in sums] == [n * (i + 1) for i in range(iters)]


def test_default_name_rejected_and_default_stream_object_is_the_none_stream():
    from swpipe_core.validate import PlanError

    with pytest.raises(PlanError, match="stream_name"):
        SWPipeline(PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule(0, "default")}), device=0)
    n, spin, sums = 1 << 20, _cycles(0.02), []
    side = torch.cuda.Stream()

    def produce(ctx):
        torch.cuda._sleep(spin)
        ctx.x = torch.full((n,), ctx.iter_idx + 1, dtype=torch.int64, device="cuda")

    plan = PipelinePlan({PipelineTask("Produce", produce): TaskSchedule(0, side, "io"),
                         PipelineTask("Alias", lambda ctx: None): TaskSchedule(1, torch.cuda.default_stream(0)),
                         PipelineTask("Consume", lambda ctx: sums.append(ctx.x.sum())): TaskSchedule(1, None)},
                        intra_iter_deps=[("Alias", "Produce"), ("Consume", "Alias")])
    pipe = SWPipeline(plan, device=0)
    assert pipe._device_waits["Alias"] == (("Produce", 0),)  # another stream: a device wait
    assert pipe._device_waits["Consume"] == ()  # the default stream given as an object *is* None's stream
    pipe.run(range(30))
    torch.cuda.synchronize()
    assert [int(s.item()) for s in sums] == [n * (i + 1) for i in range(30)]


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_device_lag_never_exceeds_the_bound(lag):
    spin = _cycles(0.01)
    plan = PipelinePlan({PipelineTask("Spin", lambda ctx: torch.cuda._sleep(spin)): TaskSchedule(0, "work")})
    pipe = SWPipeline(plan, device=0, max_device_lag=lag)
    it = pipe.fill_pipeline(range(40))
    seen = []
    while True:
        try:
            pipe.progress(it)
        except StopIteration:
            break
        seen.append(pipe._device_lag())
    assert max(seen) <= lag
    # and the count can exceed a loose bound: the check above is not vacuous
    loose = SWPipeline(plan, device=0, max_device_lag=30)
    it = loose.fill_pipeline(range(40))
    worst = 0
    for _ in range(20):
        loose.progress(it)
        worst = max(worst, loose._device_lag())
    loose.close()
    assert worst > 2


def test_cross_iteration_dependency_across_streams():
    """Read(i) on the default stream must see Update(i-1) (stream 'upd'), and Update(i) must wait Read(i)."""
    n, spin, sums = 1 << 18, _cycles(0.01), []
    w = torch.zeros(n, dtype=torch.int64, device="cuda")

    def update(ctx):
        torch.cuda._sleep(spin)
        w.add_(1)

    plan = PipelinePlan({PipelineTask("Read", lambda ctx: sums.append(w.sum())): TaskSchedule(0, None, "main"),
                         PipelineTask("Update", update): TaskSchedule(1, "upd", "side")},
                        intra_iter_deps=[("Update", "Read")], inter_iter_deps=[("Read", "Update", 1)])
    pipe = SWPipeline(plan, device=0)
    assert pipe._device_waits == {"Read": (("Update", 1),), "Update": (("Read", 0),)}
    pipe.run(range(50))
    torch.cuda.synchronize()
    assert [int(s.item()) for s in sums] == [n * i for i in range(50)]


def test_failure_teardown_does_not_wait_for_a_long_kernel():
    """A task fails after a 3 s kernel was queued: the error arrives well before the kernel ends."""
    long_spin, failed = _cycles(3.0), []

    def step(ctx):
        if ctx.iter_idx == 1 and not failed:
            failed.append(1)
            torch.cuda._sleep(long_spin)
            raise ValueError("boom")

    plan = PipelinePlan({PipelineTask("Load", lambda ctx: None): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Step", step): TaskSchedule(1, None, "compute")}, [("Step", "Load")])
    pipe = SWPipeline(plan, device=0)
    pipe._teardown_timeout = 0.2
    t0 = time.monotonic()
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(range(4))
    assert time.monotonic() - t0 < 2.0
    assert isinstance(info.value.__cause__, ValueError) and len(pipe._limbo) == 1
    torch.cuda.synchronize()
    pipe.run(range(3))  # usable again
    assert pipe._limbo == []  # freed once the fence completed


def test_emit_nvtx_reaches_every_worker_thread_and_is_off_by_default(monkeypatch):
    pushed, enabled = [], {}
    original = torch.cuda.nvtx.range_push
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: pushed.append(name) or original(name))

    def probe(ctx):
        enabled[threading.current_thread().name] = torch.autograd._profiler_enabled()

    plan = PipelinePlan({PipelineTask("A", probe): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("B", probe): TaskSchedule(1, None, "compute"),
                         PipelineTask("C", probe): TaskSchedule(1, None)}, intra_iter_deps=[("B", "A")])
    pipe = SWPipeline(plan, device=0)
    pipe.run(range(3))
    assert not [p for p in pushed if p.startswith("SWP/")] and not any(enabled.values())
    pipe.run(range(3), emit_nvtx=True)
    assert set(enabled) == {"swpipe-io", "swpipe-compute", threading.current_thread().name}
    assert all(enabled.values())
    assert {f"SWP/{t}/iter{i}" for t in "ABC" for i in range(3)} <= set(pushed)


def test_profiler_device_time_is_device_work_not_host_time():
    from swpipe_core.profiler import TaskProfiler

    spin = _cycles(0.03)

    def host_bound(ctx):
        time.sleep(0.03)  # the workload: host work, then one tiny kernel
        ctx.y = torch.ones(16, device="cuda") + 1

    plan = PipelinePlan({PipelineTask("Host", host_bound): TaskSchedule(),
                         PipelineTask("Device", lambda ctx: torch.cuda._sleep(spin)): TaskSchedule()})
    with SWPipeline(plan, device=0) as pipe:
        r = TaskProfiler(pipe).profile(None, num_warmup=1, num_measure=4, num_rounds=1)
    assert r.host_s["Host"] >= 0.03 and r.device_s["Host"] < 0.005
    assert 0.02 < r.device_s["Device"] < 0.045 and r.host_s["Device"] < 0.01


def _slow_cuda_batches(n: int, stream=None):
    """Batches the loader builds on the device (on ``stream``, else the current one) after a long spin."""
    for i in range(n):
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            x = torch.zeros(1 << 20, device="cuda")
            torch.cuda._sleep(SPIN)
            x.fill_(float(i + 1))
        yield x


def test_a_batch_made_on_the_callers_stream_is_ready_before_a_task_on_another_stream_reads_it():
    """The iterator fills each batch on the caller's stream; Load reads it on 'memcpy' with no host sync."""
    sums = []
    plan = PipelinePlan({PipelineTask("Load", lambda ctx: setattr(ctx, "s", ctx.batch.sum())):
                         TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Read", lambda ctx: sums.append(ctx.s)): TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("Read", "Load")])
    SWPipeline(plan, device=0).run(_slow_cuda_batches(5))
    torch.cuda.synchronize()
    assert [int(s.item()) for s in sums] == [(i + 1) * (1 << 20) for i in range(5)]


def test_run_serial_waits_for_a_batch_made_on_a_side_stream():
    side = torch.cuda.Stream()
    sums = []
    plan = PipelinePlan({PipelineTask("Read", lambda ctx: sums.append(ctx.batch.sum())): TaskSchedule()})
    with torch.cuda.stream(side):  # the caller's current stream is not the one serial tasks run on
        SWPipeline(plan, device=0).run_serial(_slow_cuda_batches(3))
    torch.cuda.synchronize()
    assert [int(s.item()) for s in sums] == [(i + 1) * (1 << 20) for i in range(3)]


def test_emit_nvtx_does_not_synchronise_the_device(monkeypatch):
    def no_sync(*args, **kwargs):
        raise AssertionError("torch.cuda.synchronize() called by emit_nvtx")

    plan = PipelinePlan({PipelineTask("A", lambda ctx: torch.cuda._sleep(SPIN)): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("B", lambda ctx: None): TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("B", "A")])
    pipe = SWPipeline(plan, device=0)
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    pipe.run(range(3), emit_nvtx=True)
    monkeypatch.undo()
    assert not torch.autograd._profiler_enabled()  # NVTX mode left on the caller's thread
