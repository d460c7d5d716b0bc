"""Fault matrix: every kind of failure surfaces, named, with no thread left and a usable pipeline.

Each entry of :data:`FAULTS` builds a pipeline, injects one fault and
triggers it; :func:`measure` catches what reaches the caller and records the
error type and message, the seconds from the fault firing to the caller's
exception, the ``swpipe-*`` threads alive at that moment and after blocked
tasks are released, and whether the same pipeline runs a clean set of
batches after ``drain()``. The test asserts each outcome but the seconds (a
hang fails the pytest-timeout mark; how fast a fault surfaces is a figure):
``benchmarks/reliability.py`` runs the same table with them and writes it to
``benchmarks/RELIABILITY.md``.

The plan: seven tasks in a chain over three thread groups and three stages,
two of them globally ordered, one inter-iteration dependency::

    io (stage 0):       Load -> H2D
    dist (stage 1):     DistStart* -> DistWait
    compute (stage 2):  Fwd -> Bwd -> Opt*        Fwd(i) also waits Opt(i-1)
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch

from swpipe import Timeouts
from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.plan import DeclaredIO, PipelinePlan, PipelineTask, TaskSchedule
from conftest import drive, swpipe_threads

pytestmark = pytest.mark.usefixtures("ctrl_c")  # Ctrl-C faults: SIGINT as interactive

# name: (stage, stream, thread group, globally ordered)
LAYOUT = {
    "Load": (0, None, "io", False),
    "H2D": (0, "memcpy", "io", False),
    "DistStart": (1, "data_dist", "dist", True),
    "DistWait": (1, "data_dist", "dist", False),
    "Fwd": (2, None, "compute", False),
    "Bwd": (2, None, "compute", False),
    "Opt": (2, None, "compute", True),
}
CHAIN = list(LAYOUT)
N_BATCHES = 12
SHORT_TIMEOUT = 1.0        # signal/sequencer/progress timeout of the blocking faults


class Boom(Exception):
    """The injected exception."""


def join_swpipe_threads(timeout: float) -> List[str]:
    """Join every ``swpipe-*`` thread (up to ``timeout`` in all); the names still alive."""
    end = time.perf_counter() + timeout
    for t in threading.enumerate():
        if t.name.startswith("swpipe-"):
            t.join(max(0.0, end - time.perf_counter()))
    return swpipe_threads()


class Probe:
    """What the injected fault reports: when it fired, and a switch that disarms it and releases blocks."""

    def __init__(self) -> None:
        self.armed = True
        self.t_fault: Optional[float] = None
        self.release = threading.Event()   # a blocked task waits on this; set only by disarm()
        self.calls: List[Tuple[str, int]] = []
        self._lock = threading.Lock()

    def fire(self) -> None:
        with self._lock:
            if self.t_fault is None:
                self.t_fault = time.perf_counter()

    def disarm(self) -> None:
        self.armed = False
        self.release.set()


@dataclass
class Fault:
    """One row of the matrix: how to build and trigger it, and what the caller must see."""

    name: str
    where: str                                    # the position / group / stage / phase it covers
    setup: Callable[[Probe], Tuple[SWPipeline, Callable[[], Any]]]
    error: type                                   # the exception class the caller must get
    task: Optional[str] = None                    # PipelineTaskError.task
    iteration: Optional[int] = None               # PipelineTaskError.iteration
    message: Tuple[str, ...] = ()                 # substrings of str(error) (and of its cause)
    blocks: bool = False                          # a task stays blocked in user code until released
    intact: bool = False                          # documented: the pipeline stays filled (drain() to stop)
    timeout_s: float = 0.0                        # configured timeout that detects the fault


@dataclass
class Outcome:
    """What :func:`measure` saw for one fault."""

    name: str
    where: str
    error_type: str
    message: str
    seconds: float                 # fault fired -> exception in the caller
    threads_at_raise: List[str]    # swpipe-* alive when the caller got the exception
    threads_after: List[str]       # ... after blocked tasks were released, drain() and a join
    usable_after_drain: bool
    error: Optional[BaseException] = field(default=None, repr=False)
    rerun_error: str = ""


# ----------------------------------------------------------------------------- plans

def _fn(name: str, probe: Probe, inject: Dict[str, Callable[[Any], None]]) -> Callable[[Any], None]:
    def fn(ctx):
        probe.calls.append((name, ctx.iter_idx))
        hook = inject.get(name)
        if hook is not None and probe.armed:
            hook(ctx)
    fn.__name__ = f"task_{name}"
    return fn


def make_plan(probe: Probe, inject: Optional[Dict[str, Callable[[Any], None]]] = None,
              io: Optional[Dict[str, List[DeclaredIO]]] = None) -> PipelinePlan:
    inject = inject or {}
    io = io or {}
    sched = {PipelineTask(n, _fn(n, probe, inject), list(io.get(n, []))): TaskSchedule(s, st, g, o)
             for n, (s, st, g, o) in LAYOUT.items()}
    deps = [(CHAIN[k], CHAIN[k - 1]) for k in range(1, len(CHAIN))]
    return PipelinePlan(sched, intra_iter_deps=deps, inter_iter_deps=[("Fwd", "Opt", 1)])


def raise_at(probe: Probe, iteration: int, exc: type = Boom) -> Callable[[Any], None]:
    def hook(ctx):
        if ctx.iter_idx == iteration:
            probe.fire()
            raise exc(f"injected at iteration {ctx.iter_idx}")
    return hook


def block_at(probe: Probe, iteration: int) -> Callable[[Any], None]:
    def hook(ctx):
        if ctx.iter_idx == iteration:
            probe.fire()
            probe.release.wait()  # never set until disarm(): blocks "forever"
    return hook


def run_all(pipe: SWPipeline, data: Any) -> Callable[[], Any]:
    return lambda: pipe.run(data)


# ----------------------------------------------------------------------------- faults

def _task_fault(task: str, iteration: int, exc: type = Boom):
    def setup(probe):
        pipe = SWPipeline(make_plan(probe, {task: raise_at(probe, iteration, exc)}), device="cpu")
        return pipe, run_all(pipe, range(N_BATCHES))
    return setup


def _data_fault(at: int, exc: type, in_fill: bool):
    def setup(probe):
        def data():
            for i in range(N_BATCHES):
                if i == at and probe.armed:
                    probe.fire()
                    raise exc(f"loader failed at batch {i}")
                yield i
        pipe = SWPipeline(make_plan(probe), device="cpu")
        if in_fill:
            return pipe, lambda: pipe.fill_pipeline(data())
        return pipe, lambda: drive(pipe, data())
    return setup


def _blocked_dependency(probe):
    pipe = SWPipeline(make_plan(probe, {"DistWait": block_at(probe, 3)}), device="cpu",
                      timeouts=Timeouts(signal_s=SHORT_TIMEOUT, sequencer_s=30, progress_s=30))
    return pipe, run_all(pipe, range(N_BATCHES))


def _blocked_last_task(probe):
    # nobody waits on Bwd within its iteration except Opt; make the progress wait the first to expire
    pipe = SWPipeline(make_plan(probe, {"Opt": block_at(probe, 2)}), device="cpu",
                      timeouts=Timeouts(signal_s=30, sequencer_s=30, progress_s=SHORT_TIMEOUT))
    return pipe, run_all(pipe, range(N_BATCHES))


def _blocked_ordered_task(probe):
    # period 4 issues the tickets DistStart(3), then Opt(2): DistStart(3) blocks holding the turn
    pipe = SWPipeline(make_plan(probe, {"DistStart": block_at(probe, 3)}), device="cpu",
                      timeouts=Timeouts(signal_s=30, sequencer_s=SHORT_TIMEOUT, progress_s=30))
    return pipe, run_all(pipe, range(N_BATCHES))


def _fill_task_fault(probe):
    # Load(0) raises while fill_pipeline is still enqueuing; the first progress reports it
    pipe = SWPipeline(make_plan(probe, {"Load": raise_at(probe, 0)}), device="cpu")
    return pipe, lambda: drive(pipe, range(N_BATCHES))


def _drain_fault(probe):
    pipe = SWPipeline(make_plan(probe, {"Opt": raise_at(probe, 3)}), device="cpu")

    def trigger():
        it = pipe.fill_pipeline(range(N_BATCHES))
        pipe.progress(it)        # retires 0; iterations 1-3 stay in flight
        pipe.drain()             # completes them: Opt(3) raises here
    return pipe, trigger


def _shortcut_caching_fault(probe):
    pipe = SWPipeline(make_plan(probe, {"Fwd": raise_at(probe, 0)}), device="cpu")
    pipe.enable_shortcut("Fwd")  # the first Fwd execution is the caching run, and it raises
    return pipe, run_all(pipe, range(N_BATCHES))


def _io_capture_fault(probe):
    def capture():
        if probe.armed:
            probe.fire()
            raise Boom("capture failed")
        return {"step": 1}
    io = {"Bwd": [DeclaredIO(capture=capture, restore=lambda snap: None)]}
    pipe = SWPipeline(make_plan(probe, io=io), device="cpu")
    pipe.enable_shortcut("Bwd")
    return pipe, run_all(pipe, range(N_BATCHES))


def _io_restore_fault(probe):
    def restore(snap):
        if probe.armed:
            probe.fire()
            raise Boom("restore failed")
    io = {"Bwd": [DeclaredIO(capture=lambda: {"w": torch.ones(2)}, restore=restore)]}
    pipe = SWPipeline(make_plan(probe, io=io), device="cpu")
    pipe.enable_shortcut("Bwd")
    return pipe, run_all(pipe, range(N_BATCHES))


def _keyboard_interrupt_signal(probe):
    main = threading.main_thread().ident

    def hook(ctx):
        if ctx.iter_idx == 4:
            probe.fire()
            signal.pthread_kill(main, signal.SIGINT)  # the real Ctrl-C path: a signal to the main thread
            probe.release.wait(0.3)  # workload: keep the caller waiting in progress() when it lands
    pipe = SWPipeline(make_plan(probe, {"Opt": hook}), device="cpu")
    return pipe, run_all(pipe, range(1000))


def _h2d_cannot_move(probe):
    def hook(ctx):
        if ctx.iter_idx == 5:
            probe.fire()
            # no CUDA here: "Torch not compiled with CUDA"; with CUDA: an ordinal that does not exist
            torch.ones(2).to(f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    pipe = SWPipeline(make_plan(probe, {"H2D": hook}), device="cpu")
    return pipe, run_all(pipe, range(N_BATCHES))


def _serial_fault(probe):
    pipe = SWPipeline(make_plan(probe, {"Bwd": raise_at(probe, 2)}), device="cpu")
    return pipe, lambda: pipe.run_serial(range(N_BATCHES))


FAULTS: List[Fault] = [
    Fault("task raises: first task", "position first, group io, stage 0", _task_fault("Load", 0),
          PipelineTaskError, "Load", 0, ("'Load'", "iteration 0", "Boom")),
    Fault("task raises: middle task", "position middle, group dist, stage 1", _task_fault("DistWait", 4),
          PipelineTaskError, "DistWait", 4, ("'DistWait'", "iteration 4", "'dist'")),
    Fault("task raises: last task (globally ordered)", "position last, group compute, stage 2",
          _task_fault("Opt", 7), PipelineTaskError, "Opt", 7, ("'Opt'", "iteration 7", "stage 2")),
    Fault("task raises: io group, later iteration", "group io, stage 0", _task_fault("H2D", 9),
          PipelineTaskError, "H2D", 9, ("'H2D'", "iteration 9", "'io'")),
    Fault("task raises: globally ordered, stage 1", "group dist, stage 1, sequencer", _task_fault("DistStart", 2),
          PipelineTaskError, "DistStart", 2, ("'DistStart'", "iteration 2")),
    Fault("task raises: stage 2 during fill", "group compute, stage 2, first period", _task_fault("Fwd", 0),
          PipelineTaskError, "Fwd", 0, ("'Fwd'", "iteration 0")),
    Fault("task raises BaseException (SystemExit)", "group compute, stage 2", _task_fault("Bwd", 3, SystemExit),
          PipelineTaskError, "Bwd", 3, ("'Bwd'", "SystemExit")),
    Fault("data iterator raises in fill_pipeline", "data, fill", _data_fault(1, ValueError, in_fill=True),
          ValueError, message=("loader failed at batch 1",)),
    Fault("data iterator raises in progress", "data, steady state", _data_fault(6, ValueError, in_fill=False),
          ValueError, message=("loader failed at batch 6",), intact=True),
    Fault("task blocks forever: dependant times out", "Timeouts.signal_s", _blocked_dependency,
          PipelineTaskError, "Fwd", 3, ("'Fwd' (iteration 3)", "'DistWait' of iteration 3", "Timeouts(signal_s="),
          blocks=True, timeout_s=SHORT_TIMEOUT),
    Fault("task blocks forever: progress times out", "Timeouts.progress_s", _blocked_last_task,
          RuntimeError, None, None, ("iteration 2", "tasks not done: ['Opt']", "Timeouts(progress_s="),
          blocks=True, timeout_s=SHORT_TIMEOUT),
    Fault("ordered task blocks forever: sequencer times out", "Timeouts.sequencer_s", _blocked_ordered_task,
          PipelineTaskError, "Opt", 2, ("waiting for DistStart (iteration 3)", "Timeouts(sequencer_s="),
          blocks=True, timeout_s=SHORT_TIMEOUT),
    Fault("task raises during fill_pipeline", "fill_pipeline", _fill_task_fault,
          PipelineTaskError, "Load", 0, ("'Load'", "iteration 0")),
    Fault("task raises during drain", "drain", _drain_fault,
          PipelineTaskError, "Opt", 3, ("'Opt'", "iteration 3")),
    Fault("task raises while shortcut caching", "shortcut caching run", _shortcut_caching_fault,
          PipelineTaskError, "Fwd", 0, ("'Fwd'", "iteration 0", "Boom")),
    Fault("DeclaredIO.capture raises", "shortcut caching, DeclaredIO", _io_capture_fault,
          PipelineTaskError, "Bwd", 0, ("'Bwd'", "capture failed")),
    Fault("DeclaredIO.restore raises", "shortcut replay, DeclaredIO", _io_restore_fault,
          PipelineTaskError, "Bwd", 1, ("'Bwd'", "iteration 1", "restore failed")),
    Fault("KeyboardInterrupt from the data iterator", "caller, data", _data_fault(5, KeyboardInterrupt, False),
          KeyboardInterrupt),
    Fault("KeyboardInterrupt by SIGINT while in progress()", "caller, signal", _keyboard_interrupt_signal,
          KeyboardInterrupt),
    Fault("batch cannot be moved to the device", "H2D", _h2d_cannot_move,
          PipelineTaskError, "H2D", 5, ("'H2D'", "iteration 5")),
    Fault("task raises in run_serial", "serial mode", _serial_fault,
          PipelineTaskError, "Bwd", 2, ("'Bwd'", "iteration 2")),
]


def measure(fault: Fault) -> Outcome:
    """Trigger ``fault``, then check threads and that the pipeline runs clean batches after ``drain()``."""
    probe = Probe()
    pipe, trigger = fault.setup(probe)
    err: Optional[BaseException] = None
    t_start = time.perf_counter()
    try:
        trigger()
    except BaseException as exc:  # KeyboardInterrupt included: it is one of the faults
        err = exc
    t_raise = time.perf_counter()
    threads_at_raise = swpipe_threads()
    probe.disarm()
    usable, rerun_error, drained = False, "", False
    try:
        pipe.drain()
        drained = True
    except BaseException as exc:
        rerun_error = f"drain: {type(exc).__name__}: {exc}"
    threads_after = join_swpipe_threads(10.0)
    try:
        probe.calls.clear()
        pipe.run(range(N_BATCHES))
        # a shortcut task runs for real at most once (its caching run), then replays
        want = sorted((n, i) for n in CHAIN if n not in pipe.shortcuts for i in range(N_BATCHES))
        got = sorted(c for c in probe.calls if c[0] not in pipe.shortcuts)
        short = [c for c in probe.calls if c[0] in pipe.shortcuts]
        usable = drained and got == want and len(short) <= len(pipe.shortcuts)
        if not usable and not rerun_error:
            rerun_error = f"rerun ran {len(got)} normal / {len(short)} shortcut executions, expected {len(want)}"
    except BaseException as exc:
        rerun_error = f"{type(exc).__name__}: {exc}"
    finally:
        pipe.close()
    fired = probe.t_fault if probe.t_fault is not None else t_start
    text = "" if err is None else str(err)
    if err is not None and err.__cause__ is not None and str(err.__cause__) not in text:
        text += f" <- {err.__cause__}"
    return Outcome(fault.name, fault.where, "no error" if err is None else type(err).__name__, text,
                   max(0.0, t_raise - fired), threads_at_raise, threads_after, usable, err, rerun_error)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault_surfaces_named_leaves_no_thread_and_pipeline_runs_again(fault):
    out = measure(fault)
    err = out.error
    assert isinstance(err, fault.error), f"expected {fault.error.__name__}, got {out.error_type}: {out.message}"
    if fault.error is PipelineTaskError:
        assert err.task == (fault.task or err.task)
        if fault.iteration is not None:
            assert err.iteration == fault.iteration
        assert err.__cause__ is not None  # chained to the original exception, traceback kept
        assert err.__cause__.__traceback__ is not None
        assert (err.thread_group, err.stage) == (LAYOUT[err.task][2], LAYOUT[err.task][0])
    for part in fault.message:
        assert part in out.message, f"{part!r} not in {out.message!r}"
    if not (fault.blocks or fault.intact):
        assert out.threads_at_raise == []
    assert out.threads_after == []
    assert out.usable_after_drain, out.rerun_error


def test_data_iterator_fault_in_fill_starts_no_thread_and_keeps_nothing_in_flight():
    probe = Probe()
    pipe, trigger = _data_fault(1, ValueError, in_fill=True)(probe)
    with pytest.raises(ValueError):
        trigger()
    assert swpipe_threads() == [] and pipe.in_flight == 0
    assert probe.t_fault is not None
