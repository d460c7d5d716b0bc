"""CUDA paths: named streams, device events (phase 2), NVTX, context lifetime, device lag, teardown.

Every test takes ``cuda_device``: swpipe.testing.FakeCuda's device on every machine (kernels on executor
threads, seeded random delays, freed blocks reused and poisoned at once, races reported), and the real
cuda:0 where there is a GPU. Tasks launch work with :func:`swpipe.testing.kernels`, which runs the same
kernels on both, so a missing wait or an early free shows as a wrong value on either.
"""

from __future__ import annotations

import threading
import weakref

import pytest
import torch

from swpipe import Timeouts
from swpipe.testing import kernels
from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.engine.streams import StreamPool
from conftest import retirements

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(120)]


def _sync(dev) -> None:
    """Wait for all device work (bounded on the fake; the test's own wait on a GPU)."""
    fake = getattr(dev, "fake", None)
    if fake is not None:
        fake.synchronize()
    else:
        torch.cuda.synchronize(dev.index)


def _no_races(dev) -> None:
    fake = getattr(dev, "fake", None)
    if fake is not None:
        fake.assert_no_races()


def test_named_streams_created_once_per_device_and_shared_by_pipelines(cuda_device):
    pool, other = StreamPool(cuda_device), StreamPool(cuda_device)
    a, b = pool.resolve("memcpy"), pool.resolve("memcpy")
    assert a is b and a.swpipe_name == "memcpy"
    assert other.resolve("memcpy") is a  # a second pipeline on the device does not draw a new stream
    assert pool.resolve("data_dist") is not a
    assert pool.key(None) == cuda_device.stream_key(cuda_device.default_stream())
    given = cuda_device.new_stream("given-by-the-user")
    assert pool.resolve(given) is given
    names = [f"s{i}" for i in range(8)]
    assert len({pool.key(n) for n in names}) == len(names)


def test_task_runs_with_its_stream_current_on_its_thread(cuda_device):
    seen = {}

    def probe(name):
        def fn(ctx):
            seen[name] = (cuda_device.stream_key(cuda_device.current_stream()), threading.current_thread().name)
        return fn

    plan = PipelinePlan({PipelineTask("H2D", probe("H2D")): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Fwd", probe("Fwd")): TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("Fwd", "H2D")], caller_group=None)
    pipe = SWPipeline(plan, device=cuda_device)
    pipe.run(range(2))
    assert seen["Fwd"] == (pipe.streams.key(None), "swpipe-compute")
    assert seen["H2D"] == (pipe.streams.key("memcpy"), "swpipe-io")


def test_device_event_orders_cross_stream_consumer(cuda_device):
    """Producer writes on 'memcpy' after a long spin; the consumer on the default stream must see the write."""
    k, n, results = kernels(cuda_device), 1 << 12, []

    def produce(ctx):
        k.spin(0.01)
        ctx.x = k.full(n, ctx.iter_idx + 1, dtype=torch.int64)

    plan = PipelinePlan({PipelineTask("Produce", produce): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Consume", lambda ctx: results.append(k.sum(ctx.x))): TaskSchedule(1, None)},
                        intra_iter_deps=[("Consume", "Produce")])
    SWPipeline(plan, device=cuda_device).run(range(6))
    assert [int(k.item(r)) for r in results] == [(i + 1) * n for i in range(6)]
    _no_races(cuda_device)


def test_retired_context_kept_until_device_work_completes(cuda_device):
    refs, gate = [], threading.Event()
    k = kernels(cuda_device)

    def produce(ctx):
        refs.append(weakref.ref(ctx))
        if ctx.iter_idx == 0:
            if getattr(cuda_device, "fake", None) is not None:
                k.wait_host(gate)  # device work that ends when the test says so
            else:
                k.spin(0.5)
        ctx.x = k.full(1 << 10, 1.0)

    plan = PipelinePlan({PipelineTask("Produce", produce): TaskSchedule(0, "memcpy")})
    pipe = SWPipeline(plan, device=cuda_device)
    it = pipe.fill_pipeline(range(3))
    assert pipe.progress(it) == 0
    assert refs[0]() is not None  # CPU retired, device still running: context kept
    assert pipe.device_lag >= 1
    gate.set()
    pipe.drain()
    assert all(r() is None for r in refs)


def test_nvtx_ranges_named_per_task_and_iteration(cuda_device, monkeypatch):
    pushed = []
    original = cuda_device.nvtx_push
    monkeypatch.setattr(cuda_device, "nvtx_push", lambda name: pushed.append(name) or original(name))
    plan = PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("B", lambda ctx: None): TaskSchedule(1)}, intra_iter_deps=[("B", "A")])
    pipe = SWPipeline(plan, device=cuda_device)
    pipe.run(range(2), emit_nvtx=True)
    pipe.run_serial(range(1))
    assert {"SWP/A/iter0", "SWP/A/iter1", "SWP/B/iter1", "SWP_serial/B/iter0"} <= set(pushed)


def test_device_timeline_events_recorded(cuda_device):
    k = kernels(cuda_device)
    plan = PipelinePlan({PipelineTask("Spin", lambda ctx: k.spin(0.005)): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("B", lambda ctx: None): TaskSchedule(1)}, intra_iter_deps=[("B", "Spin")])
    pipe = SWPipeline(plan, device=cuda_device, record_timeline=True)
    pipe.run(range(4))
    device = [e for e in pipe.timeline if e.kind == "device"]
    assert {(e.task, e.iteration) for e in device} == {(t, i) for t in ("Spin", "B") for i in range(4)}
    spins = sorted((e for e in device if e.task == "Spin"), key=lambda e: e.iteration)
    assert all(e.end - e.start >= 0.004 for e in spins)  # the spin's own length: device time, not host time
    assert all(a.end <= b.start + 1e-4 for a, b in zip(spins, spins[1:]))  # one stream: serialised


def _device(cuda_device, index: int):
    """Device ``index`` of the same kind as ``cuda_device`` (the fake has two; a GPU machine may not)."""
    fake = getattr(cuda_device, "fake", None)
    if fake is not None:
        return fake.device(index)
    if torch.cuda.device_count() <= index:
        pytest.skip("needs two CUDA devices")
    from swpipe_core.engine.device import as_device
    return as_device(f"cuda:{index}")


@pytest.mark.parametrize("index,caller_group", [(0, None), (0, "compute"), (1, None)])
def test_early_free_across_streams_keeps_sums_exact(cuda_device, index, caller_group):
    """Produce (memcpy) allocates full(N, i+1); Consume (default stream) spins, sums, then dels the input.

    Without keeping deleted values alive, the next Produce gets the freed block from the caching
    allocator on the memcpy stream and overwrites it while the sum still waits behind the spin.
    """
    dev = _device(cuda_device, index)
    k, n, iters, sums = kernels(dev), 1 << 12, 60, []

    def produce(ctx):
        ctx.x = k.full(n, ctx.iter_idx + 1, dtype=torch.int64)

    def consume(ctx):
        k.spin(0.002)
        sums.append(k.sum(ctx.x))
        del ctx.x

    plan = PipelinePlan({PipelineTask("Produce", produce): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Consume", consume): TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("Consume", "Produce")], caller_group=caller_group)
    SWPipeline(plan, device=dev).run(range(iters))
    assert [int(k.item(s)) for s in sums] == [n * (i + 1) for i in range(iters)]
    _no_races(dev)


def test_default_name_rejected_and_default_stream_object_is_the_none_stream(cuda_device):
    from swpipe_core.validate import PlanError

    with pytest.raises(PlanError, match="stream_name"):
        SWPipeline(PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule(0, "default")}),
                   device=cuda_device)
    k, n, sums = kernels(cuda_device), 1 << 10, []
    side = cuda_device.new_stream("side-given")

    def produce(ctx):
        k.spin(0.002)
        ctx.x = k.full(n, ctx.iter_idx + 1, dtype=torch.int64)

    plan = PipelinePlan({PipelineTask("Produce", produce): TaskSchedule(0, side, "io"),
                         PipelineTask("Alias", lambda ctx: None): TaskSchedule(1, cuda_device.default_stream()),
                         PipelineTask("Consume", lambda ctx: sums.append(k.sum(ctx.x))): TaskSchedule(1, None)},
                        intra_iter_deps=[("Alias", "Produce"), ("Consume", "Alias")])
    pipe = SWPipeline(plan, device=cuda_device)
    assert pipe.device_waits["Alias"] == (("Produce", 0),)  # another stream: a device wait
    assert pipe.device_waits["Consume"] == ()  # the default stream given as an object *is* None's stream
    pipe.run(range(30))
    assert [int(k.item(s)) for s in sums] == [n * (i + 1) for i in range(30)]
    _no_races(cuda_device)


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_device_lag_never_exceeds_the_bound(cuda_device, lag):
    k = kernels(cuda_device)
    plan = PipelinePlan({PipelineTask("Spin", lambda ctx: k.spin(0.003)): TaskSchedule(0, "work")})
    pipe = SWPipeline(plan, device=cuda_device, max_device_lag=lag)
    seen = [pipe.device_lag for _ in retirements(pipe, pipe.fill_pipeline(range(20)))]
    assert max(seen) <= lag
    # and the count can exceed a loose bound: the check above is not vacuous
    loose = SWPipeline(plan, device=cuda_device, max_device_lag=30)
    it = loose.fill_pipeline(range(40))
    worst = 0
    for _ in range(20):
        loose.progress(it)
        worst = max(worst, loose.device_lag)
    loose.close()
    assert worst > 2


def test_cross_iteration_dependency_across_streams(cuda_device):
    """Read(i) on the default stream must see Update(i-1) (stream 'upd'), and Update(i) must wait Read(i)."""
    k, n, sums = kernels(cuda_device), 1 << 10, []
    w = k.full(n, 0, dtype=torch.int64)
    one = k.full(n, 1, dtype=torch.int64)

    def update(ctx):
        k.spin(0.002)
        k.add_(w, one)

    plan = PipelinePlan({PipelineTask("Read", lambda ctx: sums.append(k.sum(w))): TaskSchedule(0, None, "main"),
                         PipelineTask("Update", update): TaskSchedule(1, "upd", "side")},
                        intra_iter_deps=[("Update", "Read")], inter_iter_deps=[("Read", "Update", 1)])
    pipe = SWPipeline(plan, device=cuda_device)
    assert pipe.device_waits == {"Read": (("Update", 1),), "Update": (("Read", 0),)}
    pipe.run(range(40))
    assert [int(k.item(s)) for s in sums] == [n * i for i in range(40)]
    _no_races(cuda_device)


def test_failure_teardown_does_not_wait_for_a_long_kernel(cuda_device):
    """A task fails after a long kernel was queued: the error arrives while that kernel still runs."""
    k, gate, failed = kernels(cuda_device), threading.Event(), []
    fake = getattr(cuda_device, "fake", None)

    def step(ctx):
        if ctx.iter_idx == 1 and not failed:
            failed.append(1)
            if fake is not None:
                k.wait_host(gate)
            else:
                k.spin(3.0)
            raise ValueError("boom")

    plan = PipelinePlan({PipelineTask("Load", lambda ctx: None): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Step", step): TaskSchedule(1, None, "compute")}, [("Step", "Load")])
    pipe = SWPipeline(plan, device=cuda_device, timeouts=Timeouts(teardown_s=0.2))
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(range(4))
    assert isinstance(info.value.__cause__, ValueError)
    assert pipe.kept_for_device > 0  # the teardown gave up on the running kernel: contexts kept, not waited for
    gate.set()
    _sync(cuda_device)
    pipe.run(range(3))  # usable again
    assert pipe.kept_for_device == 0  # freed once the fence completed


def test_emit_nvtx_reaches_every_worker_thread_and_is_off_by_default(cuda_device, monkeypatch):
    pushed, entered = [], []
    original_push, original_mode = cuda_device.nvtx_push, cuda_device.nvtx_mode
    monkeypatch.setattr(cuda_device, "nvtx_push", lambda name: pushed.append(name) or original_push(name))

    def mode():
        entered.append(threading.current_thread().name)
        return original_mode()
    monkeypatch.setattr(cuda_device, "nvtx_mode", mode)
    plan = PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("B", lambda ctx: None): TaskSchedule(1, None, "compute"),
                         PipelineTask("C", lambda ctx: None): TaskSchedule(1, None)}, intra_iter_deps=[("B", "A")])
    pipe = SWPipeline(plan, device=cuda_device)
    pipe.run(range(3))
    assert not [p for p in pushed if p.startswith("SWP/")] and not entered
    pipe.run(range(3), emit_nvtx=True)
    assert set(entered) == {"swpipe-io", "swpipe-compute", threading.current_thread().name}
    assert {f"SWP/{t}/iter{i}" for t in "ABC" for i in range(3)} <= set(pushed)


def test_profiler_device_time_is_device_work_not_host_time(cuda_device, monkeypatch):
    """On the fake's virtual time each measured time is exact: a launch costs the host nothing and the
    profiler's spin holds the stream so that the host work before a kernel's launch is not device time. On a
    real GPU only the keys are checked (the timings are ``benchmarks/profiler_host_sync.py``'s)."""
    import time

    import swpipe_core.measure.profiler as profiler
    from swpipe_core.measure.profiler import TaskProfiler
    from conftest import device_clock

    clock = device_clock(monkeypatch, cuda_device, profiler)
    k = kernels(cuda_device)

    def host_bound(ctx):
        (clock or time).sleep(0.03)  # the workload: host work, then one tiny kernel
        ctx.y = k.full(16, 1.0)

    plan = PipelinePlan({PipelineTask("Host", host_bound): TaskSchedule(),
                         PipelineTask("Device", lambda ctx: k.spin(0.01)): TaskSchedule()})
    with SWPipeline(plan, device=cuda_device) as pipe:
        r = TaskProfiler(pipe, num_warmup=1, num_measure=4, num_rounds=1).profile(None)
    assert set(r.host_s) == set(r.device_s) == {"Host", "Device"}
    if clock is not None:
        assert r.host_s == pytest.approx({"Host": 0.03, "Device": 0.0})
        assert r.device_s == pytest.approx({"Host": 0.0, "Device": 0.01})


def _slow_device_batches(dev, n: int, stream=None):
    """Batches the loader builds on the device (on ``stream``, else the current one) after a spin."""
    k = kernels(dev)
    for i in range(n):
        with dev.use(stream) if stream is not None else _nothing():
            x = k.full(1 << 10, 0.0)
            k.spin(0.005)
            k.fill_(x, float(i + 1))
        yield x


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_batch_made_on_the_callers_stream_is_ready_before_a_task_on_another_stream_reads_it(cuda_device):
    """The iterator fills each batch on the caller's stream; Load reads it on 'memcpy' with no host sync."""
    k, sums = kernels(cuda_device), []
    plan = PipelinePlan({PipelineTask("Load", lambda ctx: setattr(ctx, "s", k.sum(ctx.batch))):
                         TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Read", lambda ctx: sums.append(ctx.s)): TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("Read", "Load")])
    SWPipeline(plan, device=cuda_device).run(_slow_device_batches(cuda_device, 5))
    assert [int(k.item(s)) for s in sums] == [(i + 1) * (1 << 10) for i in range(5)]
    _no_races(cuda_device)


def test_run_serial_waits_for_a_batch_made_on_a_side_stream(cuda_device):
    k, sums = kernels(cuda_device), []
    side = cuda_device.new_stream("loader-side")
    plan = PipelinePlan({PipelineTask("Read", lambda ctx: sums.append(k.sum(ctx.batch))): TaskSchedule()})
    with cuda_device.use(side):  # the caller's current stream is not the one serial tasks run on
        SWPipeline(plan, device=cuda_device).run_serial(_slow_device_batches(cuda_device, 3))
    assert [int(k.item(s)) for s in sums] == [(i + 1) * (1 << 10) for i in range(3)]
    _no_races(cuda_device)


def test_a_batch_made_on_another_device_is_ready_before_the_pipeline_reads_it(cuda_device):
    """The caller's current device is 0; the pipeline runs on device 1; the loader writes on device 0's stream."""
    dev1 = _device(cuda_device, 1)
    k1, sums = kernels(dev1), []
    side = cuda_device.new_stream("loader-on-0")
    def copy(ctx):  # a read of device 0's memory by device 1's stream
        ctx.s = k1.sum(k1.copy_(k1.empty(1 << 10), ctx.batch))

    plan = PipelinePlan({PipelineTask("Copy", copy):
                         TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Read", lambda ctx: sums.append(ctx.s)): TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("Read", "Copy")])
    with cuda_device.use(side):
        SWPipeline(plan, device=dev1).run(_slow_device_batches(cuda_device, 4))
    assert [int(k1.item(s)) for s in sums] == [(i + 1) * (1 << 10) for i in range(4)]
    _no_races(cuda_device)
