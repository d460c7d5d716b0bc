"""Shared test configuration and helpers.

Tests marked ``cuda`` run everywhere: the ``cuda_device`` fixture gives them
``swpipe.testing.FakeCuda``'s device on every machine and, where there is a
GPU, the real device as a second parameter. Tests marked ``gpu`` need a real
GPU (NCCL, torch's own CUDA kernels) and skip without one. Helpers used by several
test files live here once; import them with ``from conftest import ...``.
Every property test is derandomised (the ``swpipe`` hypothesis profile): a
run draws the same examples on every machine, so CI is reproducible.

Tests assert behaviour, never timings: no bound on elapsed wall time and no
measured speed ratio (a hang is caught by the pytest-timeout marks; speed is
measured by ``benchmarks/``). Where a behaviour depends on what a measurement
says (which plan the verification keeps, when a search stops), the
measurement is made deterministic: :func:`measured_by_simulation` for the
verification's engine runs, :class:`FakeClock` for a module's clock.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import signal
import socket
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import pytest
from hypothesis import settings

settings.register_profile("swpipe", derandomize=True, database=None)
settings.load_profile("swpipe")


def torchrec_usable() -> bool:
    """Whether ``swpipe.torchrec`` imports here: TorchRec and FBGEMM installed and loadable (the peer step of CI).

    Any ``ImportError`` counts as "not installed", whatever pytest's ``importorskip`` does with it.
    """
    try:
        import swpipe.torchrec  # noqa: F401
    except ImportError:
        return False
    return True


requires_torchrec = pytest.mark.skipif(not torchrec_usable(), reason="TorchRec not installed (bash scripts/install_peer.sh)")


def load_benchmark(name: str) -> ModuleType:
    """A script of ``benchmarks/`` (not a package) imported by path, e.g. ``load_benchmark("gpu_overlap")``."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def swpipe_threads() -> List[str]:
    """Names of the live ``swpipe-*`` threads, sorted (a clean pipeline leaves none)."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("swpipe-"))


def retirements(pipe: Any, it: Any = None) -> Iterator[int]:
    """Call ``pipe.progress(it)`` until the data ends, yielding each retired iteration index (look at the
    pipeline between two calls: ``[pipe.device_lag for _ in retirements(pipe, it)]``)."""
    while True:
        try:
            idx = pipe.progress(it)
        except StopIteration:
            return
        yield idx


def progress_until_end(pipe: Any, it: Any = None) -> List[int]:
    """Call ``pipe.progress(it)`` until the data ends; the retired iteration indices in order."""
    return list(retirements(pipe, it))


def drive(pipe: Any, data: Any) -> List[int]:
    """Fill the pipeline with ``data`` and progress it to the end; the retired indices in order."""
    return progress_until_end(pipe, pipe.fill_pipeline(data))


def spawned_ranks(target: Callable[..., None], *args: Any, world: int = 2, deadline_s: float = 120.0,
                  name: str = "rank") -> dict:
    """Run ``target(rank, store_path, out_dir, *args)`` in ``world`` spawned processes (a file store for their
    process group in a temporary folder), each writing its results to ``out_dir/rank{rank}.json``; the ranks
    still alive ``deadline_s`` after the start are killed. Returns ``{"ranks": [each rank's results, {} if it
    wrote none], "killed": [names of killed ranks], "exitcodes": [...]}``."""
    import json
    import multiprocessing as mp
    import os
    import tempfile
    import time

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=target, args=(r, os.path.join(tmp, "store"), tmp, *args), name=f"{name}{r}")
                 for r in range(world)]
        t0 = time.monotonic()
        for p in procs:
            p.start()
        for p in procs:
            p.join(max(0.0, deadline_s - (time.monotonic() - t0)))
        killed = [p.name for p in procs if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
        ranks = []
        for r in range(world):
            try:
                with open(os.path.join(tmp, f"rank{r}.json")) as fh:
                    ranks.append(json.load(fh))
            except FileNotFoundError:
                ranks.append({})
        return {"ranks": ranks, "killed": killed, "exitcodes": [p.exitcode for p in procs]}


@contextlib.contextmanager
def rank_results(out_dir: str, rank: int) -> Iterator[dict]:
    """In a rank that :func:`spawned_ranks` started: a dict for its results, written to ``out_dir/rank{rank}.json``
    when the block ends, with the traceback as ``"crash"`` when it raised (the error still raised)."""
    import json
    import os
    import traceback

    results: dict = {}
    try:
        yield results
    except BaseException:
        results["crash"] = traceback.format_exc()
        raise
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(results, fh)


def ranks_that_ended(spawned: dict) -> List[dict]:
    """Every rank's results from :func:`spawned_ranks`, checked: no rank killed at the deadline, none crashed (its
    ``"crash"`` traceback shown), every exit code 0."""
    assert spawned["killed"] == [], f"ranks did not exit by themselves: {spawned['killed']}"
    for r, res in enumerate(spawned["ranks"]):
        assert "crash" not in res, f"rank {r} crashed:\n{res['crash']}"
    assert spawned["exitcodes"] == [0] * len(spawned["ranks"])
    return spawned["ranks"]


@pytest.fixture
def one_rank():
    """A one-rank gloo group in this process (``torch.distributed`` is yielded), destroyed afterwards."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def one_intra_op_thread():
    """torch's intra-op threads set to 1 for a module (``pytestmark = pytest.mark.usefixtures(...)``).

    On a shared 2-core machine OpenMP teams of 2 stall at barriers whenever a core is taken (ops
    become 10-100x slower); the pipeline's own threads are the parallelism in these tests.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def env():
    """A one-rank gloo job on the CPU for the DLRM workload (``swpipe.workloads``' DistEnv), closed after the module."""
    import torch

    from swpipe.workloads.dlrm import init_distributed

    e = init_distributed(backend="gloo", device=torch.device("cpu"))
    yield e
    e.close()


class FakeClock:
    """A clock that moves only when told: stands in for a module's ``time`` (``monkeypatch.setattr(mod, "time", clock)``).

    ``perf_counter``, ``monotonic`` and ``time`` read the wall clock, ``thread_time`` and
    ``process_time`` the CPU clock; :meth:`advance` moves them (a task that sleeps moves the
    wall clock only, one that computes moves both). ``sleep`` advances the wall clock.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = 0.0

    def advance(self, wall_s: float, cpu_s: float = 0.0) -> None:
        self.now += wall_s
        self.cpu += cpu_s

    def perf_counter(self) -> float:
        return self.now

    monotonic = time = perf_counter

    def thread_time(self) -> float:
        return self.cpu

    process_time = thread_time

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)


def device_clock(monkeypatch: Any, dev: Any, *modules: ModuleType) -> Optional[FakeClock]:
    """Virtual time for a ``cuda_device`` test: on the fake, a :class:`FakeClock` its streams keep their time on
    (``FakeCuda(clock=...)``) and that stands in for each module's ``time``; ``None`` on a real GPU, whose timings
    are the benchmarks' (``benchmarks/profiler_host_sync.py``), not a test's. Call it before any device work."""
    fake = getattr(dev, "fake", None)
    if fake is None:
        return None
    clock = FakeClock()
    fake.clock = clock
    for module in modules:
        monkeypatch.setattr(module, "time", clock)
    return clock


def measured_by_simulation(monkeypatch: Any, truth: Any, factor: Optional[Callable[[Any], float]] = None
                           ) -> List[Tuple[Any, int]]:
    """Make the verification's engine runs report the period ``truth`` simulates for each plan.

    ``autosched.verify.measure`` measures a plan by one engine run per round. Patched here, each run still
    runs the plan on the engine (its tasks, its failures), but the period it reports is
    ``simulate(plan, truth).period_s`` (times ``factor(plan)`` when given): the machine, made
    deterministic, so which plan is measured fastest no longer depends on the load. ``truth`` is the
    cost model of what the tasks really do (a sleep's length, one core for tasks that hold the GIL), or a
    function giving a plan's period (e.g. the machine model's simulation of it).

    Returns
    -------
    list of (PipelinePlan, int)
        Each engine run in order: the plan and its number of batches (warm-up runs included).
    """
    import autosched.verify.measure as verify
    from autosched.model.simulate import simulate

    engine_run = verify._one_run  # private: the one seam where a measurement runs the engine, replaced here
    runs: List[Tuple[Any, int]] = []

    def run(plan: Any, batches: Sequence[Any], device: Any) -> float:
        engine_run(plan, batches, device)
        runs.append((plan, len(batches)))
        period = float(truth(plan) if callable(truth) else simulate(plan, truth, num_iterations=40).period_s)
        return period * (factor(plan) if factor is not None else 1.0)

    monkeypatch.setattr(verify, "_one_run", run)
    return runs


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a real GPU (marked gpu); the cuda-marked tests run on swpipe.testing.FakeCuda")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# kernel delays of the fake: seeded, up to 2 ms, so a missing wait or an early free shows in the values
FAKE_DELAY_S = 0.002


@pytest.fixture
def fake_cuda():
    """A :class:`swpipe.testing.FakeCuda` (two devices, seeded random kernel delays), closed afterwards."""
    from swpipe.testing import FakeCuda

    fake = FakeCuda(num_devices=2, seed=0, max_delay_s=FAKE_DELAY_S)
    yield fake
    fake.close()


@pytest.fixture(params=["fake"] + (["real"] if _has_gpu() else []))
def cuda_device(request):
    """A CUDA device for a ``cuda``-marked test: the fake's device 0 everywhere, the real cuda:0 where there is one.

    The test reads ``cuda_device.fake`` (``None`` on a real GPU) for what only the fake can tell (races,
    launches, hung kernels).
    """
    if request.param == "real":
        from swpipe_core.engine.device import as_device

        dev = as_device("cuda:0")
        yield dev
        return
    fake = request.getfixturevalue("fake_cuda")
    yield fake.device(0)


# -- the execution contract (docs/semantics.md), checked on a timeline -----------------------------------------


def enqueue_sequence(plan: Any, num_iterations: int) -> List[Tuple[str, int]]:
    """Every (task, iteration) in the order the main thread enqueues them: the contract's walk, period by period."""
    from swpipe_core.walk import PeriodWalk

    return PeriodWalk(plan).sequence(num_iterations)


def check_contract(plan: Any, events: Sequence[Any], num_iterations: int) -> None:
    """Assert that a timeline (engine's or simulator's) obeys the execution contract.

    * every (task, iteration) ran exactly once on its thread group;
    * every dependency is respected with its distance (host parts: the CPU signal; device parts: the event);
    * each thread group ran its tasks in the order they were enqueued (FIFO);
    * at most ``depth`` iterations in flight: a task of period ``p`` starts after iteration ``p - depth``
      has completed on the host;
    * globally ordered tasks ran one at a time in enqueue order (the sequencer);
    * with a caller's group, a worker task the enqueue order places after a caller's task started after
      that task ended (the main thread hands it off when its walk reaches it).
    """
    host = {(e.task, e.iteration): e for e in events if e.kind == "host"}
    dev = {(e.task, e.iteration): e for e in events if e.kind == "device"}
    assert len(host) == len([e for e in events if e.kind == "host"]), "a (task, iteration) ran twice"
    seq = enqueue_sequence(plan, num_iterations)
    assert set(host) == set(seq), f"ran {len(host)} task instances, expected {len(seq)}"
    for (t, i), e in host.items():
        assert e.thread_group == plan.sched(t).thread_group, f"{t}[{i}] ran on {e.thread_group}"
    deps = [(t, d, 0) for t, d in plan.intra_edges()] + list(plan.inter_edges())
    for t, d, n in deps:
        for i in range(n, num_iterations):
            assert host[t, i].start >= host[d, i - n].end, \
                f"{t}[{i}] started {host[t, i].start:.6f} before {d}[{i - n}] ended {host[d, i - n].end:.6f}"
            if (t, i) in dev and (d, i - n) in dev:
                assert dev[t, i].start >= dev[d, i - n].end, f"{t}[{i}] device part before {d}[{i - n}]'s"
    for g in {plan.sched(t).thread_group for t in plan.task_names}:
        expected = [x for x in seq if plan.sched(x[0]).thread_group == g]
        ran = [x for x in sorted(expected, key=lambda x: (host[x].start, host[x].end))]
        assert ran == expected, f"group {g} ran {ran[:8]}... not in enqueue order {expected[:8]}..."
    done = {}
    for (t, i), e in host.items():
        done[i] = max(done.get(i, 0.0), e.end)
    depth = plan.pipeline_depth
    for (t, i), e in host.items():
        j = i + plan.stage(t) - depth
        if j >= 0:
            assert e.start >= done[j], f"{t}[{i}] started before iteration {j} completed: more than {depth} in flight"
    from swpipe_core.walk import PeriodWalk

    for _, steps in PeriodWalk(plan).periods(num_iterations):
        for step in steps:
            if step.after is not None:  # handed off once the caller ran the step the walk passed last
                caller = steps[step.after]
                assert host[step.task, step.iteration].start >= host[caller.task, caller.iteration].end, \
                    f"{step.task}[{step.iteration}] started before the caller ran {caller.task}[{caller.iteration}]"
    ordered = [x for x in seq if plan.sched(x[0]).globally_ordered]
    ran = sorted(ordered, key=lambda x: host[x].start)
    assert ran == ordered, "globally ordered tasks ran out of enqueue order"
    for a, b in zip(ran, ran[1:]):
        assert host[b].start >= host[a].end, f"sequencer turns overlap: {a} and {b}"


# --------------------------------------------------------------- printed output, read as facts
# Tests of what a command or a report prints read its tables and its "name = value" lines through these, and
# assert the facts (rows, columns, values), not the sentences around them.

def schedule_rows(text: str) -> Tuple[List[str], dict]:
    """The periods and the rows of the schedule table in ``text`` (``format_schedule``'s layout):
    ``(["P0", ...], {task: (thread, stream, [cell, ...])})``, a shortcut task's ``" [skip]"`` kept in its name."""
    lines = text.splitlines()
    at = next(k for k, line in enumerate(lines) if line.split()[:4] == ["#", "Task", "Thread", "Stream"])
    head = lines[at]
    starts = [head.index(c) for c in ("Task", "Thread", "Stream", "|")]
    rows = {}
    for line in lines[at + 2:]:
        if "|" not in line:
            break
        task, thread, stream = (line[a:b].strip() for a, b in zip(starts, starts[1:]))
        rows[task] = (thread, stream, line[starts[-1] + 1:].split())
    return head[starts[-1] + 1:].split(), rows


def word_after(text: str, *words: str) -> Optional[str]:
    """The word that follows the first run of ``words`` in ``text`` (a printed figure after its label), or None."""
    tokens, n = text.split(), len(words)
    return next((tokens[k + n] for k in range(len(tokens) - n) if tuple(tokens[k:k + n]) == words), None)


def key_values(text: str) -> dict:
    """The ``Name words = value`` lines of ``text`` as ``{"name_words": "value"}`` (the value's first word)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and value.split():
            out["_".join(key.lower().split())] = value.split()[0]
    return out


@pytest.fixture
def ctrl_c():
    """SIGINT raises ``KeyboardInterrupt`` on the main thread during the test, as in an interactive Python.

    A process started with SIGINT ignored (a background job of a script, ``nohup``) inherits ``SIG_IGN`` and
    Python keeps it: a test of the Ctrl-C path would then see nothing (or, at ``SIG_DFL``, its worker killed).
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def hang_after_kernel_plan(k: Any, numel: int, dtype: Any) -> Any:
    """``Load`` makes ``ctx.x`` on stream ``memcpy``; ``Step`` (stream ``compute``, the caller's group ``main``)
    adds it, and on iteration 2 enqueues a kernel that never completes (a collective whose peer died), then raises.
    ``k`` is the fake device's :func:`swpipe.testing.kernels`."""
    from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule

    def load(ctx):
        ctx.x = k.full(numel, ctx.iter_idx, dtype)

    def step(ctx):
        k.add_(k.full(numel, 0, dtype), ctx.x)
        if ctx.iter_idx == 2:
            k.hang()
            raise ValueError("failed after enqueuing a kernel that never completes")

    return PipelinePlan({PipelineTask("Load", load): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Step", step): TaskSchedule(1, "compute", "main")},
                        intra_iter_deps=[("Step", "Load")], caller_group="main")


@pytest.fixture
def temp_in_tmp_path(monkeypatch, tmp_path) -> Path:
    """``tempfile``'s folder is the test's ``tmp_path`` (what the code under test makes there goes with the test)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.fixture
def launched(monkeypatch, temp_in_tmp_path) -> List[object]:
    """The configurations ``swpipe pp`` launched; the job itself fails at once (reason "failed"). The folder the
    command keeps for a failed job's output is made under the test's ``tmp_path``."""
    from swpipe.commands.pp_launch import PPJobError

    calls: List[object] = []

    def fake_launch(cfg, nproc=2, out_path=None, timeout_s=600.0, log_path=None, grace_s=5.0):
        calls.append(cfg)
        raise PPJobError("failed", "torchrun failed (exit 1)", 1)

    monkeypatch.setattr("swpipe.commands.pp_launch.launch", fake_launch)
    return calls


class ScriptedClock:
    """A re-planner's clock (``AdaptivePipeline(clock=...)``): each read advances by ``before`` seconds, or by
    ``after`` from read number ``switch`` on, times ``1 + `` the next of ``jitter`` (deterministic)."""

    def __init__(self, switch: int, before: float = 1.0, after: float = 2.0, jitter: Any = ()) -> None:
        self.reads, self.now = 0, 0.0
        self.switch, self.before, self.after = switch, before, after
        self.jitter = itertools.cycle(jitter or (0.0,))

    def __call__(self) -> float:
        self.now += (self.before if self.reads < self.switch else self.after) * (1.0 + next(self.jitter))
        self.reads += 1
        return self.now
