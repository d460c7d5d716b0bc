"""The fault matrix on CUDA pipelines, on ``swpipe.testing.FakeCuda``: every fault surfaces, no hang, no thread left.

The CPU matrix (``tests/test_faults.py``) checks what a task, the data or a
timeout can do to a pipeline; here the same engine runs its CUDA path on the
fake device, where work is asynchronous: a task returns once its kernels are
*queued*, a kernel may never complete, an error of the device is sticky and
is reported by whichever call touches the device next, and the engine must
keep every context a stream may still read alive until the device is done.
Each entry of :data:`CUDA_FAULTS` builds a pipeline on a fresh fake, injects
one fault and triggers it; :func:`measure` records what reached the caller
(type, task, iteration, the original exception), the seconds from the fault
to the caller's exception, the ``swpipe-*`` threads alive at that moment and
after recovery, the contexts the engine kept alive for the device
(``SWPipeline.kept_for_device``), and whether the same pipeline then runs 12 clean
batches with exact values and no race in the fake's happens-before check.
The peer-rank row (:func:`run_peer_ranks`) spawns two gloo ranks, each on a
fake device of its own, and kills one. ``benchmarks/reliability.py --device
fake`` prints the same table and records it in ``benchmarks/RELIABILITY.md``.

The plan, one stream per stage (three streams, three thread groups, two
globally ordered tasks, one inter-iteration dependency)::

    io (stage 0, memcpy):          Load -> H2D            (pinned host -> device copy)
    dist (stage 1, data_dist):     DistStart* -> DistWait (copy, a spin kernel, an early del)
    compute (stage 2, default):    Fwd -> Bwd -> Opt*     (sum, add; Fwd(i) waits Opt(i-1))

Iteration ``i`` produces a device scalar ``2 * N * i``; a rerun checks every
one of them. Recovery after the fault is the fault's own: a hung kernel is
released (the device finishes, as when a peer comes back or a communicator
is aborted), a sticky error is forgotten with ``FakeCuda.clear_error()`` (a
new process would start clean), and the fake's own ``hang()``, which only
``FakeCuda.close()`` ends, is checked up to the point where the device would
have to finish.

The tests assert behaviour, never timings: a bound like "within seconds" is
the pytest-timeout mark. They shorten the engine's teardown wait for the
device (``Timeouts.teardown_s``, 5 s) to :data:`TEST_TEARDOWN_S`; the
benchmark measures with the default.
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
import weakref
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import pytest
import torch

from swpipe import Timeouts
from swpipe.testing import FakeCuda, FakeCudaDevice, FakeCudaError, kernels
from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from conftest import swpipe_threads
from test_faults import Probe, join_swpipe_threads

# name: (stage, stream, thread group, globally ordered)
LAYOUT = {
    "Load": (0, "memcpy", "io", False),
    "H2D": (0, "memcpy", "io", False),
    "DistStart": (1, "data_dist", "dist", True),
    "DistWait": (1, "data_dist", "dist", False),
    "Fwd": (2, None, "compute", False),
    "Bwd": (2, None, "compute", False),
    "Opt": (2, None, "compute", True),
}
CHAIN = list(LAYOUT)
N = 256                    # elements per device tensor
N_BATCHES = 12
SHORT_TIMEOUT = 1.0        # progress_timeout of the rows a hung kernel blocks
KERNEL_S = 0.2             # the spin kernels a failing task leaves queued
SPIN_S = 0.001             # DistWait's spin, every iteration
FAKE_DELAY_S = 0.001       # the fake's seeded random delay per kernel
FAKE_HANG_S = 60.0         # FakeCuda.hang_timeout_s: longer than every engine timeout, as a GPU blocks forever
STALL_MAX_S = 120.0        # a released hang: a deadlock guard only, a row releases it long before
TEST_TEARDOWN_S = 1.0      # the tests' Timeouts.teardown_s (default 5 s)
GUARD_S = 120              # pytest-timeout of one row: a hang fails the test instead of the suite


class Boom(Exception):
    """The injected exception."""


def expected_value(iteration: int) -> float:
    """What iteration ``iteration`` leaves in its device scalar: sum of N copies of the batch, doubled."""
    return 2.0 * N * iteration


# ----------------------------------------------------------------------------- kernels made of the fake's own

def host_func(dev: FakeCudaDevice, fn: Callable[[], None], label: str) -> None:
    """Queue ``fn`` on the calling thread's current stream of ``dev``, as ``cudaLaunchHostFunc`` does.

    It runs on the stream's executor when the stream reaches it, after the
    work queued before it, and the work queued after it waits for it to
    return (``FakeKernels.host_func``): it is labelled, ordered and traced like any kernel.
    """
    kernels(dev).host_func(fn, label)


def released_hang(dev: FakeCudaDevice, probe: Probe) -> None:
    """A kernel that never completes until ``probe`` is disarmed: ``FakeKernels.hang()`` with a release.

    ``hang()`` ends only with ``FakeCuda.close()``, after which the fake runs
    nothing again; a row that checks the pipeline runs again once the device
    has finished needs a hang that the device can get over (a dead peer's
    collective aborted, a slow peer back).
    """
    def kernel() -> None:
        probe.fire()
        probe.release.wait(STALL_MAX_S)
    host_func(dev, kernel, "hang")


# ----------------------------------------------------------------------------- the plan

def make_plan(dev: FakeCudaDevice, probe: Probe, results: Dict[int, Any],
              inject: Optional[Dict[str, Callable[[Any], None]]] = None,
              caller_group: Optional[str] = None) -> PipelinePlan:
    """The seven-task plan on ``dev``'s kernels.

    Parameters
    ----------
    dev : FakeCudaDevice
    probe : Probe
        Every task appends ``(name, iteration)`` to ``probe.calls``.
    results : dict
        ``results[i]`` gets iteration ``i``'s device scalar (:func:`expected_value`).
    inject : dict, optional
        Task name -> hook run at the end of that task while ``probe`` is armed.
    caller_group : str, optional
        ``PipelinePlan.caller_group`` (``None``: every group has a worker).

    Returns
    -------
    PipelinePlan
    """
    k = dev.kernels
    inject = inject or {}

    def body(name: str) -> Callable[[Any], None]:
        def fn(ctx: Any) -> None:
            probe.calls.append((name, ctx.iter_idx))
            if name == "Load":
                ctx.host = k.pin(torch.full((N,), float(ctx.batch)))
            elif name == "H2D":
                ctx.x = k.to_device(ctx.host)
            elif name == "DistStart":
                ctx.y = k.empty(N)
                k.copy_(ctx.y, ctx.x)
            elif name == "DistWait":
                k.spin(SPIN_S)
                del ctx.x  # freed early: DistStart's copy on data_dist may not have read it yet
            elif name == "Fwd":
                ctx.s = k.sum(ctx.y)
            elif name == "Bwd":
                k.add_(ctx.s, ctx.s)
            elif name == "Opt":
                results[ctx.iter_idx] = ctx.s
            hook = inject.get(name)
            if hook is not None and probe.armed:
                hook(ctx)
        fn.__name__ = f"task_{name}"
        return fn

    sched = {PipelineTask(n, body(n)): TaskSchedule(s, st, g, o) for n, (s, st, g, o) in LAYOUT.items()}
    deps = [(CHAIN[j], CHAIN[j - 1]) for j in range(1, len(CHAIN))]
    return PipelinePlan(sched, intra_iter_deps=deps, inter_iter_deps=[("Fwd", "Opt", 1)], caller_group=caller_group)


# ----------------------------------------------------------------------------- the faults

Setup = Callable[[Probe, FakeCudaDevice, Dict[int, Any], Timeouts], Tuple[SWPipeline, Callable[[], Any]]]


@dataclass
class CudaFault:
    """One row of the matrix: how to build and trigger it, and what the caller must see.

    Attributes
    ----------
    error : type or tuple of types
        What the caller must get.
    task, iteration : optional
        ``PipelineTaskError.task`` / ``.iteration`` when the row pins them.
    cause : type, optional
        The original exception's type: ``__cause__`` of a ``PipelineTaskError``
        (or the error itself when the original surfaces unchanged).
    message : tuple of str
        Substrings of the error's text (its cause appended).
    blocks : bool
        A worker stays blocked in a host call on the device until recovery.
    kept : bool
        The engine must keep contexts alive for the device at the raise
        (``SWPipeline.kept_for_device``): the device has not finished.
    recover : str
        ``"release"`` (a released hang ends), ``"clear_error"``, ``"close"``
        (the fake's ``hang()``: only ``FakeCuda.close()`` ends it, so the
        pipeline cannot run on that fake again) or ``"none"``.
    defect : str
        A known engine defect the row shows: the test is an expected failure.
    """

    name: str
    where: str
    setup: Setup
    error: Union[type, Tuple[type, ...]]
    task: Optional[str] = None
    iteration: Optional[int] = None
    cause: Optional[type] = None
    message: Tuple[str, ...] = ()
    blocks: bool = False
    kept: bool = False
    recover: str = "none"
    timeouts: str = "defaults"
    defect: str = ""


@dataclass
class CudaOutcome:
    """What :func:`measure` (or :func:`peer_outcome`) saw for one fault."""

    name: str
    where: str
    error_type: str
    surfaced: str                  # "PipelineTaskError Bwd(5)" / "KeyboardInterrupt" / ...
    message: str                   # str(error), " <- " and the cause when it is not in it
    seconds: float                 # fault fired -> exception in the caller
    threads_at_raise: List[str]    # swpipe-* alive when the caller got the exception
    threads_after: List[str]       # ... after recovery, drain() and a join
    kept_at_raise: int             # contexts the engine kept alive for the device (kept_for_device) at the raise
    kept_after: int                # ... after the rerun
    usable: Optional[bool]         # None: not checkable (the fake's hang() ends only with close())
    races: int = 0                 # races the fake's happens-before check found (failed run and rerun)
    rerun_error: str = ""
    error: Optional[BaseException] = field(default=None, repr=False)


def _raise_after_kernels(task: str, iteration: int, caller_group: Optional[str] = None) -> Setup:
    """``task(iteration)`` queues a spin kernel and a fill, then raises :class:`Boom`."""
    def setup(probe, dev, results, timeouts):
        k = dev.kernels

        def hook(ctx):
            if ctx.iter_idx == iteration:
                k.spin(KERNEL_S)              # queued device work the teardown must wait for
                ctx.scratch = k.full(N, -1.0)
                probe.fire()
                raise Boom(f"injected at iteration {ctx.iter_idx} after enqueuing kernels")
        pipe = SWPipeline(make_plan(dev, probe, results, {task: hook}, caller_group), device=dev, timeouts=timeouts)
        return pipe, lambda: pipe.run(range(N_BATCHES))
    return setup


def _hung_kernel(released: bool) -> Setup:
    """DistWait(3) queues a kernel that never completes; no host call waits on it: the device-lag bound does."""
    def setup(probe, dev, results, timeouts):
        def hook(ctx):
            if ctx.iter_idx == 3:
                if released:
                    released_hang(dev, probe)
                else:
                    host_func(dev, probe.fire, "fired")
                    dev.kernels.hang()
        pipe = SWPipeline(make_plan(dev, probe, results, {"DistWait": hook}), device=dev,
                          timeouts=replace(timeouts, progress_s=SHORT_TIMEOUT))
        return pipe, lambda: pipe.run(range(N_BATCHES))
    return setup


def _hung_kernel_host_sync(probe, dev, results, timeouts):
    """DistWait(3) queues a hung kernel, Fwd(3) reads a value behind it on the host (``.item()``): Fwd blocks."""
    def hang(ctx):
        if ctx.iter_idx == 3:
            released_hang(dev, probe)

    def sync(ctx):
        if ctx.iter_idx == 3:
            dev.kernels.item(ctx.s)  # on a GPU: blocks forever; the fake's own limit (60 s) is far away
    pipe = SWPipeline(make_plan(dev, probe, results, {"DistWait": hang, "Fwd": sync}), device=dev,
                      timeouts=replace(timeouts, progress_s=SHORT_TIMEOUT))
    return pipe, lambda: pipe.run(range(N_BATCHES))


def _sticky(task: str, iteration: int, sync: bool) -> Setup:
    """``task(iteration)`` queues a kernel that fails (sticky); with ``sync`` it then reads a value on the host."""
    def setup(probe, dev, results, timeouts):
        k = dev.kernels

        def hook(ctx):
            if ctx.iter_idx == iteration:
                probe.fire()
                k.fault("an illegal memory access was encountered")
                if sync:
                    k.item(ctx.s)
        pipe = SWPipeline(make_plan(dev, probe, results, {task: hook}), device=dev, timeouts=timeouts)
        return pipe, lambda: pipe.run(range(N_BATCHES))
    return setup


def _sigint_while_waiting_for_the_device(probe, dev, results, timeouts):
    """Ctrl-C reaches the caller while ``progress()`` waits for the device (``max_device_lag=0``).

    Opt(4) queues a spin kernel and, behind it, a host function that sends
    SIGINT to the main thread: the caller retires iteration 4 on the CPU and
    then waits for its device work, which cannot complete before the signal
    is sent.
    """
    main = threading.main_thread().ident
    k = dev.kernels

    def interrupt() -> None:
        probe.fire()
        signal.pthread_kill(main, signal.SIGINT)

    def hook(ctx):
        if ctx.iter_idx == 4:
            k.spin(KERNEL_S)
            host_func(dev, interrupt, "sigint")
    pipe = SWPipeline(make_plan(dev, probe, results, {"Opt": hook}), device=dev, max_device_lag=0, timeouts=timeouts)
    return pipe, lambda: pipe.run(range(N_BATCHES))


def _sigint_in_inline_task(probe, dev, results, timeouts):
    """Ctrl-C lands while the caller runs a task of its own group (``caller_group="compute"``) with kernels queued."""
    k = dev.kernels

    def hook(ctx):
        if ctx.iter_idx == 3:
            k.spin(KERNEL_S)
            probe.fire()
            signal.raise_signal(signal.SIGINT)  # the handler raises KeyboardInterrupt here, on the main thread
    pipe = SWPipeline(make_plan(dev, probe, results, {"Bwd": hook}, caller_group="compute"), device=dev,
                      timeouts=timeouts)
    return pipe, lambda: pipe.run(range(N_BATCHES))


STICKY_MESSAGE = "an illegal memory access was encountered"
CUDA_FAULTS: List[CudaFault] = [
    CudaFault("task raises after enqueuing kernels", "worker task, kernels queued on the default stream",
              _raise_after_kernels("Bwd", 4), PipelineTaskError, "Bwd", 4, Boom,
              ("'Bwd'", "iteration 4", "after enqueuing kernels")),
    CudaFault("inline task raises after enqueuing kernels", "caller's group (compute inline), globally ordered",
              _raise_after_kernels("Opt", 7, caller_group="compute"), PipelineTaskError, "Opt", 7, Boom,
              ("'Opt'", "iteration 7")),
    CudaFault("kernel never completes (the fake's hang())", "device-lag bound, no host call waits on it",
              _hung_kernel(released=False), RuntimeError, message=("device work of iteration 3", "'DistWait'"),
              kept=True, recover="close", timeouts=f"progress {SHORT_TIMEOUT:g} s"),
    CudaFault("kernel never completes until released", "device-lag bound; then the device finishes",
              _hung_kernel(released=True), RuntimeError, message=("device work of iteration 3", "'DistWait'"),
              kept=True, recover="release", timeouts=f"progress {SHORT_TIMEOUT:g} s"),
    CudaFault("task blocks on a hung kernel (.item())", "host sync in a worker task, progress_timeout",
              _hung_kernel_host_sync, RuntimeError,
              message=("iteration 3 to complete", "tasks not done: ['Fwd', 'Bwd', 'Opt']"),
              blocks=True, kept=True, recover="release", timeouts=f"progress {SHORT_TIMEOUT:g} s"),
    CudaFault("sticky device error, the task syncs", "FakeKernels.fault() then .item() in the same task",
              _sticky("Bwd", 5, sync=True), PipelineTaskError, "Bwd", 5, FakeCudaError,
              ("'Bwd'", "iteration 5", "kernel 'Bwd(5)'", STICKY_MESSAGE), recover="clear_error"),
    CudaFault("sticky device error, noticed later", "no sync: the next call on the device reports it",
              _sticky("Bwd", 5, sync=False), (PipelineTaskError, FakeCudaError), cause=FakeCudaError,
              message=("kernel 'Bwd(5)'", STICKY_MESSAGE), recover="clear_error"),
    CudaFault("sticky device error in the last kernels", "nothing but the end-of-run fence touches the device",
              _sticky("Opt", N_BATCHES - 1, sync=False), (RuntimeError, FakeCudaError), cause=FakeCudaError,
              message=(f"kernel 'Opt({N_BATCHES - 1})'", STICKY_MESSAGE), recover="clear_error"),
    CudaFault("Ctrl-C while progress() waits for the device", "caller, SIGINT, max_device_lag=0",
              _sigint_while_waiting_for_the_device, KeyboardInterrupt),
    CudaFault("Ctrl-C inside an inline task", "caller's group (compute inline), SIGINT, kernels queued",
              _sigint_in_inline_task, KeyboardInterrupt),
]


# ----------------------------------------------------------------------------- measuring one row

def original(err: Optional[BaseException]) -> Optional[BaseException]:
    """The original exception: the error's ``__cause__`` (a ``PipelineTaskError``'s always), else the error itself."""
    if isinstance(err, PipelineTaskError) or (err is not None and err.__cause__ is not None):
        return err.__cause__
    return err


def describe(err: Optional[BaseException]) -> str:
    """``PipelineTaskError Bwd(5)``, ``KeyboardInterrupt``, or ``no error``."""
    if err is None:
        return "no error"
    if isinstance(err, PipelineTaskError):
        return f"{type(err).__name__} {err.task}({err.iteration})"
    return type(err).__name__


def _rerun(pipe: SWPipeline, probe: Probe, results: Dict[int, Any], dev: FakeCudaDevice) -> str:
    """Drain, then run clean batches; what went wrong ('' if every task ran once and every value is exact)."""
    pipe.drain()
    probe.calls.clear()
    results.clear()
    pipe.run(range(N_BATCHES))
    want = sorted((n, i) for n in CHAIN for i in range(N_BATCHES))
    got = sorted(probe.calls)
    if got != want:
        return f"rerun ran {len(got)} task executions, expected {len(want)}"
    k = dev.kernels
    values = [k.item(results[i]) for i in range(N_BATCHES)]
    wrong = [(i, v) for i, v in enumerate(values) if v != expected_value(i)]
    return f"wrong values (iteration, value): {wrong}" if wrong else ""


def measure(fault: CudaFault, teardown_s: Optional[float] = None) -> CudaOutcome:
    """Trigger ``fault`` on a fresh fake, recover, and check threads, kept contexts and a clean rerun.

    Parameters
    ----------
    fault : CudaFault
    teardown_s : float, optional
        ``Timeouts.teardown_s`` (how long a failed run's teardown
        waits for the device before keeping the contexts); the engine's
        default (5 s) when ``None``.

    Returns
    -------
    CudaOutcome
    """
    probe = Probe()
    fake = FakeCuda(num_devices=1, seed=0, max_delay_s=FAKE_DELAY_S, hang_timeout_s=FAKE_HANG_S)
    dev = fake.device(0)
    results: Dict[int, Any] = {}
    err: Optional[BaseException] = None
    pipe: Optional[SWPipeline] = None
    usable: Optional[bool] = None
    rerun_error, kept_after = "", 0
    try:
        pipe, trigger = fault.setup(probe, dev, results, Timeouts() if teardown_s is None else
                                    Timeouts(teardown_s=teardown_s))
        t_start = time.perf_counter()
        try:
            trigger()
        except BaseException as exc:  # KeyboardInterrupt included: it is one of the faults
            err = exc
        t_raise = time.perf_counter()
        threads_at_raise = swpipe_threads()
        kept_at_raise = pipe.kept_for_device
        probe.disarm()                       # ends a released hang; the hooks stop firing
        if fault.recover == "clear_error":
            fake.clear_error()
        if fault.recover == "close":         # hang() ends only with close(): nothing runs on this fake again
            fake.close()
            threads_after = join_swpipe_threads(10.0)
            kept_after = pipe.kept_for_device
        else:
            try:
                rerun_error = _rerun(pipe, probe, results, dev)
            except BaseException as exc:
                rerun_error = f"{type(exc).__name__}: {exc}"
            usable = not rerun_error
            threads_after = join_swpipe_threads(10.0)
            kept_after = pipe.kept_for_device
    finally:
        probe.disarm()
        if pipe is not None:
            pipe.close()
        fake.close()
    fired = probe.t_fault if probe.t_fault is not None else t_start
    text = "" if err is None else str(err)
    if err is not None and err.__cause__ is not None and str(err.__cause__) not in text:
        text += f" <- {type(err.__cause__).__name__}: {err.__cause__}"
    return CudaOutcome(fault.name, fault.where, "no error" if err is None else type(err).__name__, describe(err),
                       text, max(0.0, t_raise - fired), threads_at_raise, threads_after, kept_at_raise, kept_after,
                       usable, len(fake.races), rerun_error, err)


def problems(fault: CudaFault, out: CudaOutcome) -> List[str]:
    """Every way ``out`` falls short of the contract for ``fault``.

    Parameters
    ----------
    fault : CudaFault
    out : CudaOutcome
        What :func:`measure` saw.

    Returns
    -------
    list of str
        Empty when the row behaved as expected: the right exception (task,
        iteration, group, stage, the original exception with its traceback),
        no thread at the raise unless a worker is blocked on the device, none
        after recovery, contexts kept while the device had not finished and
        freed once it had, a clean rerun, no race.
    """
    found: List[str] = []
    err = out.error
    if not isinstance(err, fault.error):
        found.append(f"surfaced as {out.error_type}: {out.message}")
        return found
    if isinstance(err, PipelineTaskError):
        if fault.task is not None and err.task != fault.task:
            found.append(f"names task {err.task!r}, not {fault.task!r}")
        if fault.iteration is not None and err.iteration != fault.iteration:
            found.append(f"names iteration {err.iteration}, not {fault.iteration}")
        if (err.thread_group, err.stage) != (LAYOUT[err.task][2], LAYOUT[err.task][0]):
            found.append(f"names group {err.thread_group!r} / stage {err.stage} for {err.task}")
        if err.__cause__ is None or err.__cause__.__traceback__ is None:
            found.append("no __cause__ with its traceback")
    if fault.cause is not None and not isinstance(original(err), fault.cause):
        found.append(f"the original exception is {type(original(err)).__name__}, not {fault.cause.__name__}")
    found += [f"{part!r} not in the message" for part in fault.message if part not in out.message]
    if not fault.blocks and out.threads_at_raise:
        found.append(f"threads alive at the raise: {out.threads_at_raise}")
    if out.threads_after:
        found.append(f"threads left: {out.threads_after}")
    if fault.kept and not out.kept_at_raise:
        found.append("no context kept alive while the device had not finished")
    if fault.recover != "close":
        if not out.usable:
            found.append(f"not usable after recovery: {out.rerun_error}")
        if out.kept_after and fault.recover != "clear_error":  # after a sticky error: see the limbo test below
            found.append(f"{out.kept_after} context(s) still kept after the device finished and a rerun")
    if out.races:
        found.append(f"{out.races} race(s) in the fake's happens-before check")
    return found


def _mark(fault: CudaFault) -> Any:
    """The row as a pytest param: an expected failure (strict) when it shows a known engine defect."""
    marks = [pytest.mark.xfail(strict=True, reason=f"engine defect: {fault.defect}")] if fault.defect else []
    return pytest.param(fault, id=fault.name, marks=marks)


pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("ctrl_c")]  # Ctrl-C faults: SIGINT as interactive


@pytest.mark.timeout(GUARD_S)
@pytest.mark.parametrize("fault", [_mark(f) for f in CUDA_FAULTS])
def test_cuda_fault_surfaces_leaves_no_thread_and_the_pipeline_runs_again(fault):
    out = measure(fault, teardown_s=TEST_TEARDOWN_S)
    assert problems(fault, out) == []


@pytest.mark.timeout(GUARD_S)
def test_a_released_hang_keeps_the_contexts_until_the_device_finishes_and_the_next_run_frees_them():
    """The hung run's contexts stay alive while the device may still read them; the next fill frees them."""
    probe, results = Probe(), {}
    with FakeCuda(num_devices=1, seed=0, max_delay_s=FAKE_DELAY_S, hang_timeout_s=FAKE_HANG_S) as fake:
        dev = fake.device(0)
        pipe, trigger = _hung_kernel(released=True)(probe, dev, results, Timeouts(teardown_s=TEST_TEARDOWN_S))
        contexts = []  # every context of the hung run, weakly

        def seen(run_task, task, ctx):
            contexts.append(weakref.ref(ctx))
            run_task(task, ctx)

        try:
            with pytest.raises(RuntimeError, match=r"iteration 3"):
                with pipe.instrument(seen):
                    trigger()  # the iteration whose device work never completed
            kept = pipe.kept_for_device
            assert kept > 0 and len({id(ref()) for ref in contexts if ref() is not None}) >= kept
            with pytest.raises(RuntimeError, match=r"\(Timeouts\.progress_s\)"):  # the timeout that expired
                pipe.drain()  # nothing in flight: a bounded wait for the device, which is still hung
            assert pipe.kept_for_device == kept  # still kept: a stream may still read them
        finally:
            probe.disarm()  # the device finishes
        assert _rerun(pipe, probe, results, dev) == ""
        gc.collect()
        assert pipe.kept_for_device == 0 and [ref for ref in contexts if ref() is not None] == []
        assert swpipe_threads() == []
        fake.assert_no_races()


@pytest.mark.timeout(GUARD_S)
def test_after_clear_error_the_contexts_kept_by_the_failed_teardown_are_freed():
    fault = next(f for f in CUDA_FAULTS if f.name == "sticky device error, the task syncs")
    out = measure(fault, teardown_s=TEST_TEARDOWN_S)
    assert out.usable and out.kept_at_raise > 0
    assert out.kept_after == 0


# ----------------------------------------------------------------------------- a peer rank that dies

WORLD = 2
PEER_VICTIM, PEER_ITER = 1, 7     # rank 1 is killed (SIGKILL) inside its collective task at iteration 7
PEER_GLOO_TIMEOUT_S = 5.0
PEER_DEADLINE_S = 150.0


def _peer_plan(dev: FakeCudaDevice, rank: int, results: Dict[int, Any], calls: List[Tuple[str, int]],
               out_dir: str) -> PipelinePlan:
    """Load (io, memcpy) -> Sync* (comm, stream comm: a kernel, then a gloo all_reduce) -> Step (compute, default)."""
    import torch.distributed as dist

    k = dev.kernels

    def load(ctx):
        calls.append(("Load", ctx.iter_idx))
        ctx.x = k.to_device(k.pin(torch.full((N,), float(ctx.batch))))

    def sync(ctx):
        calls.append(("Sync", ctx.iter_idx))
        if rank == PEER_VICTIM and ctx.iter_idx == PEER_ITER and dist.get_world_size() == WORLD:
            with open(os.path.join(out_dir, "death"), "w") as fh:
                fh.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)  # the peer dies: no exception, no goodbye, sockets closed
        k.spin(SPIN_S)
        t = torch.tensor([float(ctx.iter_idx)])
        dist.all_reduce(t)  # waits on the peer (gloo: on the host)
        ctx.r = k.to_device(k.pin(t.expand(N).contiguous()))

    def step(ctx):
        calls.append(("Step", ctx.iter_idx))
        results[ctx.iter_idx] = k.sum(ctx.r)

    return PipelinePlan({PipelineTask("Load", load): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Sync", sync): TaskSchedule(1, "comm", "comm", globally_ordered=True),
                         PipelineTask("Step", step): TaskSchedule(2, None, "compute")},
                        intra_iter_deps=[("Sync", "Load"), ("Step", "Sync")])


def _peer_rank_main(rank: int, store: str, out_dir: str) -> None:
    """One rank: a pipeline on a FakeCuda device of its own; rank 0 records what it saw in ``rank0.json``."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.distributed as dist

    torch.set_num_threads(1)
    out: Dict[str, Any] = {}
    path = os.path.join(out_dir, f"rank{rank}.json")
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                                timeout=timedelta(seconds=PEER_GLOO_TIMEOUT_S))
        with FakeCuda(num_devices=1, seed=rank, max_delay_s=FAKE_DELAY_S, hang_timeout_s=FAKE_HANG_S) as fake:
            dev = fake.device(0)
            results: Dict[int, Any] = {}
            calls: List[Tuple[str, int]] = []
            pipe = SWPipeline(_peer_plan(dev, rank, results, calls, out_dir), device=dev,
                              timeouts=Timeouts(signal_s=10, sequencer_s=10, progress_s=15))
            try:
                pipe.run(range(10 * PEER_ITER))
                out["error"] = None
            except BaseException as err:  # recorded for the parent's assertions
                out.update(t_raise=time.time(), error=type(err).__name__, message=str(err),
                           cause=type(err.__cause__).__name__ if err.__cause__ is not None else None,
                           task=getattr(err, "task", None), iteration=getattr(err, "iteration", None),
                           traceback_kept=err.__cause__ is not None and err.__cause__.__traceback__ is not None)
            out["threads_at_raise"] = swpipe_threads()
            out["kept_at_raise"] = pipe.kept_for_device
            # the survivor goes on alone: a world of one on a new store, the same pipeline, every value exact
            dist.destroy_process_group()
            dist.init_process_group("gloo", init_method=f"file://{store}.alone", rank=0, world_size=1)
            calls.clear()
            results.clear()
            try:
                pipe.drain()
                pipe.run(range(N_BATCHES))
                k = dev.kernels
                want = sorted((n, i) for n in ("Load", "Sync", "Step") for i in range(N_BATCHES))
                values = [k.item(results[i]) for i in range(N_BATCHES)]
                ok = sorted(calls) == want and values == [float(N * i) for i in range(N_BATCHES)]
                out["rerun_error"] = "" if ok else f"calls {len(calls)}, values {values}"
            except BaseException as err:
                out["rerun_error"] = f"{type(err).__name__}: {err}"
            out["threads_after"] = join_swpipe_threads(10.0)
            out["kept_after"] = pipe.kept_for_device
            out["races"] = len(fake.races)
            pipe.close()
        dist.destroy_process_group()
    except BaseException:
        out["crash"] = traceback.format_exc()
        raise
    finally:
        with open(path, "w") as fh:
            json.dump(out, fh)


def run_peer_ranks(deadline_s: float = PEER_DEADLINE_S) -> Dict[str, Any]:
    """Spawn two gloo ranks on fake devices; rank 1 dies inside its collective task.

    Parameters
    ----------
    deadline_s : float
        Children alive after it are killed and listed in ``killed`` (a hang
        fails the caller's check instead of blocking it).

    Returns
    -------
    dict
        ``survivor`` (rank 0's record), ``t_death`` (wall clock when rank 1
        killed itself), ``exitcodes``, ``killed``, ``seconds``.
    """
    ctx = mp.get_context("spawn")
    # The children import this module, whose `conftest` must be tests/conftest.py, not the repository's own
    # conftest.py: they get the parent's sys.path as it is at start(), so this folder goes first meanwhile.
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_peer_rank_main, args=(r, os.path.join(tmp, "store"), tmp), name=f"rank{r}")
                 for r in range(WORLD)]
        t0 = time.perf_counter()
        sys.path.insert(0, here)
        try:
            for p in procs:
                p.start()
        finally:
            sys.path.remove(here)  # the first entry: the one inserted above
        killed = []
        for p in procs:
            p.join(max(0.0, deadline_s - (time.perf_counter() - t0)))
        for p in procs:
            if p.is_alive():
                killed.append(p.name)
                p.kill()
                p.join(10)
        try:
            with open(os.path.join(tmp, "rank0.json")) as fh:
                survivor = json.load(fh)
        except FileNotFoundError:
            survivor = {}
        try:
            with open(os.path.join(tmp, "death")) as fh:
                t_death: Optional[float] = float(fh.read())
        except FileNotFoundError:
            t_death = None
        return {"survivor": survivor, "t_death": t_death, "exitcodes": [p.exitcode for p in procs],
                "killed": killed, "seconds": time.perf_counter() - t0}


PEER_FAULT = CudaFault("peer rank dies (2 ranks, gloo)", "rank 1 SIGKILLed in its collective task; rank 0's Sync "
                       "waits on it", None, PipelineTaskError, "Sync", PEER_ITER, RuntimeError,
                       ("'Sync'", f"iteration {PEER_ITER}"),
                       timeouts=f"gloo {PEER_GLOO_TIMEOUT_S:g} s, signal 10 s, progress 15 s")


def peer_outcome(session: Dict[str, Any]) -> CudaOutcome:
    """The surviving rank's record as a row of the matrix."""
    s = session["survivor"]
    err = s.get("error")
    surfaced = "no error" if err is None else (f"{err} {s.get('task')}({s.get('iteration')})"
                                              if s.get("task") is not None else err)
    seconds = (s["t_raise"] - session["t_death"]) if "t_raise" in s and session["t_death"] is not None else float("nan")
    return CudaOutcome(PEER_FAULT.name, PEER_FAULT.where, err or "no error", surfaced, s.get("message", ""),
                       max(0.0, seconds), s.get("threads_at_raise", []), s.get("threads_after", []),
                       s.get("kept_at_raise", 0), s.get("kept_after", 0), not s.get("rerun_error", "missing"),
                       s.get("races", 0), s.get("rerun_error", ""))


def peer_problems(session: Dict[str, Any]) -> List[str]:
    """Every way the two-rank session falls short (empty: as expected)."""
    found: List[str] = []
    if session["killed"]:
        found.append(f"killed by the deadline (a hang): {session['killed']}")
    s = session["survivor"]
    if "crash" in s:
        return found + [f"rank 0 crashed:\n{s['crash']}"]
    if session["exitcodes"] != [0, -signal.SIGKILL]:
        found.append(f"exit codes {session['exitcodes']}, expected [0, -{int(signal.SIGKILL)}]")
    out = peer_outcome(session)
    if (s.get("error"), s.get("task"), s.get("iteration")) != ("PipelineTaskError", "Sync", PEER_ITER):
        found.append(f"rank 0 surfaced {out.surfaced}: {out.message}")
    if s.get("cause") != "RuntimeError" or not s.get("traceback_kept"):
        found.append(f"rank 0's cause is {s.get('cause')} (traceback kept: {s.get('traceback_kept')})")
    found += [f"{part!r} not in the message" for part in PEER_FAULT.message if part not in out.message]
    if out.threads_at_raise or out.threads_after:
        found.append(f"threads at raise / left: {out.threads_at_raise} / {out.threads_after}")
    if not out.usable:
        found.append(f"not usable alone afterwards: {out.rerun_error}")
    if out.kept_after or out.races:
        found.append(f"kept after {out.kept_after}, races {out.races}")
    return found


@pytest.mark.slow
@pytest.mark.timeout(int(PEER_DEADLINE_S) + 60)
def test_a_peer_rank_that_dies_fails_the_survivor_naming_the_collective_and_it_runs_on_alone():
    """Rank 1 is killed inside Sync(7); rank 0's Sync(7) all_reduce fails at once (connection closed), not after a
    timeout, as a PipelineTaskError naming it; rank 0 exits by itself, no thread left, and its pipeline runs again
    in a world of one."""
    session = run_peer_ranks()
    assert peer_problems(session) == []
