"""Where the fake device fails as a GPU would (issue 38, section 2): six CUDA semantics, each checked by its fields.

1. A non-blocking copy from pageable memory returns once the data is staged; the copy is still in flight and the
   host has observed nothing.
2. A host read (``item``, ``to_host``) is a copy on the current stream: an access the race check sees.
3. An observation is per thread: one thread's synchronisation orders that thread's later work only, and a
   ``query()`` orders nothing.
4. An event belongs to the device of its first record; a record on another device's stream raises.
5. A bounded pool of streams per device, round robin, shared by every name: two names can share one queue, and a
   kernel that never completes on one holds the other.
6. Autograd on fake tensors: each backward op on its forward op's stream, ``.grad`` allocated there, the caller's
   stream waiting for the gradients when backward ends.

Besides the unit tests, each semantic has a pipelined *scenario* (``SCENARIOS``) that the engine as it is passes
and that ``benchmarks/cuda_mutations.py`` runs with an engine fault injected: the fake before this section missed
each of those faults, the fake now catches it. Every check reads the happens-before order, never the timing.
"""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch

from swpipe import Timeouts
from swpipe.testing import FakeCuda, kernels
from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.engine.streams import StreamPool
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from conftest import hang_after_kernel_plan

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(120)]

NUMEL = 64
DTYPE = torch.int64


# ----------------------------------------------------------------------------- the scenarios (engine-level)

@dataclass
class Seen:
    """What a scenario's run showed.

    Attributes
    ----------
    wrong : list of str
        ``"Task(i): got x, expected y"`` for every value that is not exact.
    races : list
        The fake's :class:`~swpipe.testing.Race` objects.
    error : BaseException or None
        What the run raised (``None``: nothing).
    warnings : list of Warning
        Warnings the run issued.
    """

    wrong: List[str] = field(default_factory=list)
    races: List[Any] = field(default_factory=list)
    error: Optional[BaseException] = None
    warnings: List[Warning] = field(default_factory=list)


def _exact(got: Dict[int, float], want: Callable[[int], float], task: str) -> List[str]:
    return [f"{task}({i}): got {v}, expected {want(i)}" for i, v in sorted(got.items()) if v != want(i)]


def _sums_exact(k: Any, sums: Dict[int, Any], task: str) -> List[str]:
    """Each iteration's sum of ``NUMEL`` copies of its index, read back exactly."""
    return _exact({i: k.item(s) for i, s in sums.items()}, lambda i: NUMEL * i, task)


def _observe(fake: Any, plan: PipelinePlan, dev: Any, data: Any, check: Callable[[], List[str]]) -> Seen:
    """Run ``plan`` over ``data``; what ``check`` finds not exact afterwards, or what the run raised; the races."""
    seen = Seen()
    try:
        SWPipeline(plan, device=dev, timeouts=Timeouts(progress_s=20)).run(data)
        seen.wrong = check()
    except Exception as exc:
        seen.error = exc
    seen.races = fake.races
    return seen


def _sum_then_tail(k: Any, sums: Dict[int, Any], tail: Callable[[Any], None], tail_stream: str) -> PipelinePlan:
    """``Sum`` sums the batch on ``s1``; ``Tail`` follows it a stage later on ``tail_stream``."""
    return PipelinePlan({PipelineTask("Sum", lambda ctx: sums.__setitem__(ctx.iter_idx, k.sum(ctx.batch))):
                         TaskSchedule(0, "s1", "io"),
                         PipelineTask("Tail", tail): TaskSchedule(1, tail_stream, "io")},
                        intra_iter_deps=[("Tail", "Sum")])


def pageable_loader(n_iters: int = 16, seed: int = 0) -> Seen:
    """A loader copies each batch from pageable memory (non-blocking) on the caller's busy stream; ``Sum`` reads it
    on stream ``s1``. Only the engine's batch-ready wait orders the read after the copy."""
    with FakeCuda(num_devices=1, seed=seed, max_delay_s=0.0005) as fake:
        dev = fake.device(0)
        k = kernels(dev)
        sums: Dict[int, Any] = {}

        def batches():
            for i in range(n_iters):
                k.spin(0.001)  # the caller's stream is busy: the copy lands late
                yield k.to_device(torch.full((NUMEL,), i, dtype=DTYPE))  # pageable: staged, still in flight

        plan = _sum_then_tail(k, sums, lambda ctx: None, "s1")
        return _observe(fake, plan, dev, batches(), lambda: _sums_exact(k, sums, "Sum"))


def host_read(n_iters: int = 16, seed: int = 0) -> Seen:
    """``Produce`` writes ``ctx.x`` on ``s1``; ``Consume`` reads it on the host (``item``) on the default stream,
    from another thread. Only the engine's device wait orders that read after the write."""
    with FakeCuda(num_devices=1, seed=seed, max_delay_s=0.0) as fake:
        dev = fake.device(0)
        k = kernels(dev)
        values: Dict[int, float] = {}

        def produce(ctx):
            ctx.x = k.full(NUMEL, float(ctx.iter_idx + 1))

        plan = PipelinePlan({PipelineTask("Produce", produce): TaskSchedule(0, "s1", "io"),
                             PipelineTask("Consume", lambda ctx: values.__setitem__(ctx.iter_idx, k.item(ctx.x))):
                             TaskSchedule(1, None, "main")}, intra_iter_deps=[("Consume", "Produce")])
        return _observe(fake, plan, dev, range(n_iters), lambda: _exact(values, lambda i: float(i + 1), "Consume"))


def another_threads_sync(n_iters: int = 8, seed: int = 0, host_work_s: float = 0.03) -> Seen:
    """``P`` writes ``ctx.x`` on ``s1``; ``W`` (default stream, its own thread) waits for it on the device and reads
    it with ``item``, synchronising its own thread; ``C`` (``s3``, a third thread) reads it with a kernel after some
    host work. ``C`` is ordered after ``P`` by its own device wait alone, whatever ``W`` synchronised."""
    with FakeCuda(num_devices=1, seed=seed, max_delay_s=0.0) as fake:
        dev = fake.device(0)
        k = kernels(dev)
        sums: Dict[int, Any] = {}

        def p(ctx):
            k.spin(0.002)
            ctx.x = k.full(NUMEL, ctx.iter_idx, DTYPE)

        def w(ctx):
            k.item(ctx.x)

        def c(ctx):
            time.sleep(host_work_s)  # host work: the workload, not a synchronisation
            sums[ctx.iter_idx] = k.sum(ctx.x)

        plan = PipelinePlan({PipelineTask("P", p): TaskSchedule(0, "s1", "p"),
                             PipelineTask("W", w): TaskSchedule(0, None, "w"),
                             PipelineTask("C", c): TaskSchedule(1, "s3", "c")},
                            intra_iter_deps=[("W", "P"), ("C", "P")], caller_group=None)
        return _observe(fake, plan, dev, range(n_iters), lambda: _sums_exact(k, sums, "C"))


def batch_on_another_device(n_iters: int = 24, seed: int = 0) -> Seen:
    """The loader makes each batch on device 1; the pipeline runs on device 0. The batch's ready event must be an
    event of device 1 (an event belongs to the device of its first record)."""
    with FakeCuda(num_devices=2, seed=seed, max_delay_s=0.0005) as fake:
        dev, other = fake.device(0), fake.device(1)
        k, k1 = kernels(dev), kernels(other)
        sums: Dict[int, Any] = {}

        def batches():
            for i in range(n_iters):
                k1.spin(0.0005)
                yield k1.full(NUMEL, i, DTYPE)

        plan = _sum_then_tail(k, sums, lambda ctx: k.spin(0.0002), "s2")
        return _observe(fake, plan, dev, batches(), lambda: _sums_exact(k, sums, "Sum"))


def shared_stream_hang(hang_timeout_s: float = 1.0, teardown_timeout_s: float = 0.2) -> Seen:
    """The pool is used up by other names (NCCL draws from it too), so ``compute`` lands on ``memcpy``'s queue.
    ``Step`` (on ``compute``) enqueues a kernel that never completes and raises: the caller must get ``Step``'s own
    error, the device polled with a deadline, although the hang holds ``Load``'s stream too."""
    seen = Seen()
    with warnings.catch_warnings(record=True) as caught, \
            FakeCuda(num_devices=1, hang_timeout_s=hang_timeout_s) as fake:
        warnings.simplefilter("always")
        dev = fake.device(0)
        k = kernels(dev)
        dev.new_stream("memcpy")
        for n in range(31):
            dev.new_stream(f"nccl{n}")  # the rest of PyTorch's 32 streams, drawn by other code

        plan = hang_after_kernel_plan(k, NUMEL, DTYPE)
        # the bounded poll gives up quickly (teardown_s)
        pipe = SWPipeline(plan, device=dev, timeouts=Timeouts(progress_s=20, teardown_s=teardown_timeout_s))
        try:
            pipe.run(range(6))
        except Exception as exc:
            seen.error = exc
        seen.races = fake.races
    seen.warnings = [w.message for w in caught]
    return seen


def training_step(n_iters: int = 6, seed: int = 0, state: bool = True) -> Seen:
    """A model trained on fake tensors: ``Forward`` on ``fwd``, ``Backward`` on the default stream, ``Step`` on
    ``opt`` and ``Zero`` (``zero_grad(set_to_none=True)``) on ``side``. The gradients are allocated on ``fwd`` (their
    forward op's stream) and read by ``Step`` on ``opt``: freeing them from ``side`` is safe only because the engine
    keeps the gradients of ``state=`` alive until the iteration's device work completed. The weights must equal a
    serial CPU run's."""
    seen = Seen()
    data = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(n_iters)]

    def make(dev=None):
        torch.manual_seed(seed)
        model = torch.nn.Linear(8, 8)
        if dev is not None:
            dev.module(model)  # before the optimizer is made, as model.cuda()
        return model, torch.optim.SGD(model.parameters(), lr=0.05)

    ref, ref_opt = make()
    for x in data:
        ref(x).pow(2).sum().backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    with FakeCuda(num_devices=1, seed=seed, max_delay_s=0.0005) as fake:
        dev = fake.device(0)
        model, opt = make(dev)

        def forward(ctx):
            ctx.loss = model(dev.tensor(data[ctx.iter_idx])).pow(2).sum()

        plan = PipelinePlan({PipelineTask("Forward", forward): TaskSchedule(0, "fwd", "g0"),
                             PipelineTask("Backward", lambda ctx: ctx.loss.backward()): TaskSchedule(0, None, "g0"),
                             PipelineTask("Step", lambda ctx: opt.step()): TaskSchedule(1, "opt", "g1"),
                             PipelineTask("Zero", lambda ctx: opt.zero_grad(set_to_none=True)):
                             TaskSchedule(1, "side", "g2")},
                            intra_iter_deps=[("Backward", "Forward"), ("Step", "Backward"), ("Zero", "Step")],
                            inter_iter_deps=[("Forward", "Step", 1), ("Forward", "Zero", 1)])
        try:
            SWPipeline(plan, device=dev, timeouts=Timeouts(progress_s=20),
                       state=[model, opt] if state else None).run(range(n_iters))
            kernel = kernels(dev)
            seen.wrong = [f"{name}: not the serial CPU run's" for (name, p), q in
                          zip(model.named_parameters(), ref.parameters()) if not torch.equal(kernel.to_host(p), q)]
        except Exception as exc:
            seen.error = exc
        seen.races = fake.races
    return seen


#: each semantic's scenario, by the letter of the mutation-table row that injects its fault
SCENARIOS: Dict[str, Callable[[], Seen]] = {
    "h": pageable_loader, "i": host_read, "j": another_threads_sync, "k": batch_on_another_device,
    "l": shared_stream_hang, "m": training_step}


@pytest.mark.parametrize("key", sorted(SCENARIOS))
def test_each_scenario_is_exact_race_free_and_raises_nothing_on_the_engine_as_is(key):
    seen = SCENARIOS[key]()
    if key == "l":  # its task's own error, by design
        assert isinstance(seen.error, PipelineTaskError) and isinstance(seen.error.__cause__, ValueError)
        assert (seen.error.task, seen.error.iteration) == ("Step", 2)
        assert [(w.name, w.other) for w in seen.warnings if hasattr(w, "other")] == [("compute", "memcpy")]
    else:
        assert seen.error is None, repr(seen.error)
    assert seen.wrong == [] and seen.races == []


# ----------------------------------------------------------------------------- 1. pageable copies

def test_a_pageable_non_blocking_copy_returns_staged_with_the_copy_in_flight_and_observed_by_no_one():
    with FakeCuda(num_devices=1) as fake:
        dev = fake.device(0)
        k = kernels(dev)
        gate = threading.Event()
        k.wait_host(gate)  # the current stream is held: nothing enqueued after this has run
        host = torch.full((NUMEL,), 7, dtype=DTYPE)
        x = k.to_device(host)
        host.fill_(-1)  # staged: the device gets what the host held at the call
        pending = dev.event()
        dev.record(pending, dev.current_stream())
        assert not pending.query()  # the copy is still in flight
        other = dev.draw_stream()
        with dev.use(other):
            k.sum(x)  # read on another stream: the host observed nothing, so nothing orders it after the copy
        gate.set()
        assert [(r.first.kind, r.first.where, r.second.kind, r.second.where) for r in fake.races] == [
            ("write", "default", "read", other.label)]
        assert k.to_host(x).tolist() == [7] * NUMEL


def test_a_pinned_non_blocking_copy_reads_the_host_memory_when_it_runs():
    with FakeCuda(num_devices=1) as fake:
        dev = fake.device(0)
        k = kernels(dev)
        gate = threading.Event()
        k.wait_host(gate)
        host = k.pin(torch.full((NUMEL,), 7, dtype=DTYPE))
        x = k.to_device(host)
        host.fill_(3)  # written before the copy ran: the device sees it
        gate.set()
        assert k.to_host(x).tolist() == [3] * NUMEL and fake.races == []


# ----------------------------------------------------------------------------- 2. host reads

def test_a_host_read_is_a_read_on_the_current_stream():
    with FakeCuda(num_devices=1) as fake:
        dev = fake.device(0)
        k = kernels(dev)
        x = k.full(NUMEL, 2.0)
        side = dev.draw_stream()
        with dev.use(side):
            k.to_host(x)  # nothing orders side after the fill: the read races (its value is timing)
        (race,) = fake.races
        assert (race.first.kind, race.first.where, race.second.kind, race.second.where) == (
            "write", "default", "read", side.label)
        assert k.item(x) == 2.0 and len(fake.races) == 1  # on the default stream: ordered by the stream
        y = k.full(NUMEL, 3.0)
        side.wait_stream(dev.default_stream())
        with dev.use(side):
            assert k.item(y) == 3.0
        assert len(fake.races) == 1  # after the wait: ordered


def test_a_fake_torch_tensors_item_is_a_read_on_the_current_stream():
    with FakeCuda(num_devices=1) as fake:
        dev = fake.device(0)
        gate = threading.Event()
        kernels(dev).wait_host(gate)  # the default stream is held: the writes below land only once it is set
        t = dev.tensor(torch.arange(4.0)) * 2
        side = dev.draw_stream()
        with dev.use(side):
            # item waits for the side stream only: it returns with the default stream still held, and its sum read
            # the block before the write landed (a fresh block holds zeros), a race the check names
            assert t.sum().item() == 0.0
        assert [(r.first.kind, r.second.kind, r.second.where) for r in fake.races] == [("write", "read", side.label)]
        gate.set()
        assert t.sum().item() == 12.0 and len(fake.races) == 1  # on the default stream: ordered by the stream


# ----------------------------------------------------------------------------- 3. observations per thread

def test_another_threads_synchronisation_orders_nothing_for_this_thread():
    with FakeCuda(num_devices=1) as fake:
        dev = fake.device(0)
        k = kernels(dev)
        x = k.full(NUMEL, 1.0)
        done = dev.event()
        dev.record(done, dev.current_stream())
        helper = threading.Thread(target=done.synchronize, name="helper")
        helper.start()
        helper.join()
        assert done.query()  # the work has completed, and this thread knows it only by a query
        side = dev.draw_stream()
        with dev.use(side):
            k.sum(x)
        assert [(r.first.kind, r.second.kind, r.second.where) for r in fake.races] == [("write", "read", side.label)]


def test_this_threads_synchronisation_orders_its_later_work_and_so_does_a_completion_the_engine_acts_on():
    with FakeCuda(num_devices=1) as fake:
        dev = fake.device(0)
        k = kernels(dev)
        side = dev.draw_stream()
        x = k.full(NUMEL, 1.0)
        done = dev.event()
        dev.record(done, dev.current_stream())
        done.synchronize()
        with dev.use(side):
            k.sum(x)
        y = k.full(NUMEL, 1.0)
        later = dev.event()
        dev.record(later, dev.current_stream())
        pool = StreamPool(dev)
        assert pool.wait_events([later], timeout=20.0) and pool.completed([later])
        with dev.use(side):
            k.sum(y)
        assert fake.races == []


@pytest.mark.parametrize("synchronised", [True, False])
def test_the_devices_synchronize_orders_this_threads_later_work_after_every_stream(synchronised):
    """Device.synchronize (what a measurement's edge calls: GPipe's balance timer, the PP overhead probe) waits for
    every stream of the device; without it a read on another stream is a race."""
    with FakeCuda(num_devices=1) as fake:
        dev = fake.device(0)
        k = kernels(dev)
        side = dev.draw_stream()
        with dev.use(side):
            y = k.full(NUMEL, 2.0)
        if synchronised:
            dev.synchronize()
        total = k.sum(y)  # on the default stream, which never waited for side
        dev.synchronize()
        assert (fake.races == []) == synchronised
        if synchronised:
            assert k.item(total) == 2.0 * NUMEL


def test_a_missing_wait_is_reported_whatever_another_thread_synchronised():
    seen = another_threads_sync(n_iters=3, host_work_s=0.0)
    assert seen.races == [] and seen.wrong == [] and seen.error is None
    with pytest.MonkeyPatch.context() as mp:  # C's stream loses its device waits: the race is named
        wait = StreamPool.wait
        mp.setattr(StreamPool, "wait",
                   lambda self, s, e: None if getattr(s, "swpipe_name", None) == "s3" else wait(self, s, e))
        seen = another_threads_sync(n_iters=3, host_work_s=0.0)
    assert {(r.first.label, r.first.kind, r.second.label, r.second.where) for r in seen.races} == {
        (f"P({i})", "write", f"C({i})", "s3") for i in range(3)}


# ----------------------------------------------------------------------------- 4. events belong to a device

def test_an_event_belongs_to_the_device_of_its_first_record():
    from swpipe.testing import EventDeviceError

    with FakeCuda(num_devices=2) as fake:
        dev0, dev1 = fake.device(0), fake.device(1)
        event = dev0.event()
        assert event.device_index is None
        dev0.record(event, dev1.default_stream())  # made through device 0, first recorded on device 1
        assert event.device_index == 1
        with pytest.raises(EventDeviceError) as raised:
            dev0.record(event, dev0.default_stream())
        assert (raised.value.event_device, raised.value.stream_device) == (1, 0)
        dev0.wait(dev0.default_stream(), event)  # a stream may wait for another device's event
        dev1.record(event, dev1.draw_stream())  # any stream of its own device
        assert fake.races == []


# ----------------------------------------------------------------------------- 5. the stream pool

def test_stream_names_and_draws_share_a_bounded_round_robin_pool():
    from swpipe_core.engine.device import SharedStreamWarning

    with FakeCuda(num_devices=1, streams_per_device=3) as fake:
        dev = fake.device(0)
        pool = StreamPool(dev)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            a, b = pool.resolve("a"), pool.resolve("b")
            drawn = dev.draw_stream()  # what torch.cuda.Stream() or NCCL takes
        with pytest.warns(SharedStreamWarning) as caught:
            c = pool.resolve("c")
        assert [(w.message.name, w.message.other) for w in caught] == [("c", "a")]
        assert [s.stream_id for s in (a, b, drawn, c)] == [1, 2, 3, 1]
        assert pool.key("c") == pool.key("a") != pool.key("b") and c.names == ["a", "c"]
        assert len({dev.new_stream(f"n{i}").stream_id for i in range(8)}) == 3


def test_the_default_pool_has_32_streams_per_device():
    with FakeCuda(num_devices=1) as fake:
        dev = fake.device(0)
        ids = [dev.draw_stream().stream_id for _ in range(33)]
        assert ids[:32] == list(range(1, 33)) and ids[32] == 1


def test_a_kernel_that_never_completes_holds_every_name_on_its_queue():
    with FakeCuda(num_devices=1, streams_per_device=1) as fake, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dev = fake.device(0)
        k = kernels(dev)
        memcpy, compute = dev.new_stream("memcpy"), dev.new_stream("compute")
        gate = threading.Event()
        with dev.use(compute):
            k.wait_host(gate)  # a collective waiting for its peer
        with dev.use(memcpy):
            x = k.full(NUMEL, 1.0)
        after = dev.event()
        dev.record(after, memcpy)
        assert memcpy is compute and not after.query()  # behind the hung kernel, whatever the timing
        gate.set()
        after.synchronize()
        assert k.item(x) == 1.0


def test_an_engine_on_a_shared_queue_reports_the_tasks_error_when_a_kernel_never_completes():
    seen = shared_stream_hang()
    assert isinstance(seen.error, PipelineTaskError) and (seen.error.task, seen.error.iteration) == ("Step", 2)
    assert [(w.name, w.other) for w in seen.warnings if hasattr(w, "other")] == [("compute", "memcpy")]


# ----------------------------------------------------------------------------- 6. autograd on fake tensors

def _linear(dev, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.Linear(3, 2)
    torch.manual_seed(seed)
    return dev.module(torch.nn.Linear(3, 2)), ref


def test_backward_runs_each_op_on_its_forward_ops_stream_and_allocates_the_gradients_there():
    with FakeCuda(num_devices=1, max_delay_s=0.0005) as fake:
        dev = fake.device(0)
        k = kernels(dev)
        lin, ref = _linear(dev)
        fwd = dev.draw_stream()
        fwd.wait_stream(dev.default_stream())  # the parameters were copied on the default stream
        x = torch.arange(12.0).reshape(4, 3)
        with dev.use(fwd):
            loss = lin(dev.tensor(x)).pow(2).sum()
        start = len(fake.launches)
        loss.backward()  # called on the default stream
        ref(x).pow(2).sum().backward()
        backward_streams = {launch.stream for launch in fake.launches[start:]}
        assert backward_streams == {"default", fwd.label}  # the initial gradient on the caller's stream, the rest
        assert [dev.stream_of(p.grad) for p in lin.parameters()] == [fwd, fwd]
        grads = [k.to_host(p.grad) for p in lin.parameters()]  # on the default stream: backward made it wait
        assert all(torch.allclose(g, p.grad) for g, p in zip(grads, ref.parameters()))
        assert fake.races == []


def test_gradients_accumulate_on_their_stream_and_zero_grad_frees_them_into_its_pool():
    with FakeCuda(num_devices=1, max_delay_s=0.0005) as fake:
        dev = fake.device(0)
        k = kernels(dev)
        lin, ref = _linear(dev)
        fwd = dev.draw_stream()
        fwd.wait_stream(dev.default_stream())
        x = torch.ones(2, 3)
        for _ in range(2):
            with dev.use(fwd):
                lin(dev.tensor(x)).sum().backward()
            ref(x).sum().backward()
        dev.default_stream().wait_stream(fwd)  # backward ran inside fwd: the default stream reads after a wait
        assert torch.equal(k.to_host(lin.weight.grad), ref.weight.grad)  # accumulated: twice one backward's
        assert dev.stream_of(lin.weight.grad) is fwd
        block = dev.block_of(lin.weight.grad)  # the block the allocator hands out next, once the gradient is freed
        with dev.use(fwd):
            lin.zero_grad(set_to_none=True)
        elsewhere = [dev.tensor(torch.zeros(2, 3)) for _ in range(20)]  # the default stream's pool
        with dev.use(fwd):
            here = [dev.tensor(torch.zeros(2, 3)) for _ in range(20)]
        assert lin.weight.grad is None
        assert block not in {dev.block_of(t) for t in elsewhere} and block in {dev.block_of(t) for t in here}
        assert fake.races == []


def test_gradients_used_on_another_stream_without_a_wait_race():
    """The CUDA notes' "unsafe" case: backward inside ``with stream(s)``, the gradients used outside it."""
    with FakeCuda(num_devices=1) as fake:
        dev = fake.device(0)
        lin, _ = _linear(dev)
        s = dev.draw_stream()
        s.wait_stream(dev.default_stream())
        with dev.use(s):
            lin(dev.tensor(torch.ones(2, 3))).sum().backward()
        assert fake.races == []
        lin.weight.grad.sum()  # on the default stream: nothing orders it after the backward on s
        assert {(r.first.kind, r.first.where, r.second.kind, r.second.where) for r in fake.races} == {
            ("write", s.label, "read", "default")}


def test_an_initial_gradient_from_another_stream_needs_a_wait():
    """The engine syncs the root with the caller's current stream, not with where the initial gradient was made."""
    with FakeCuda(num_devices=1) as fake:
        dev = fake.device(0)
        lin, _ = _linear(dev)
        s = dev.draw_stream()
        s.wait_stream(dev.default_stream())
        with dev.use(s):
            out = lin(dev.tensor(torch.ones(2, 3))).sum()
        initial = torch.ones_like(out)  # on the default stream
        with dev.use(s):
            out.backward(initial)
        assert fake.races and {(r.first.where, r.second.where) for r in fake.races} == {("default", s.label)}


def test_a_training_step_on_fake_tensors_equals_the_cpu_and_needs_the_state_kept_alive():
    assert training_step(n_iters=4).races == []
    races = training_step(n_iters=4, state=False).races  # the gradients freed from 'side' while 'opt' reads them
    assert races and {(r.second.kind, r.second.label[:4], r.first.where) for r in races} == {("free", "Zero", "opt")}
