"""CUDA mutation table: inject each engine fault on the fake device and show which check catches it.

    python benchmarks/cuda_mutations.py                  # the table (about 40 s on two cores)
    python benchmarks/cuda_mutations.py --details        # also every check's finding per fault
    python benchmarks/cuda_mutations.py --before 22d34da # beside it, what the fake of that commit caught

Each row monkeypatches one fault into the engine for the duration of the row
(at run time only, never in library code), runs the fake-device checks
against it, and records what each check saw. Rows (a)-(g) run the suite of
``tests/test_cuda_property.py``:

* **values**: every task's per-iteration sum against its closed form (which
  the serial run equals: the property test asserts it) on the canonical
  workload and on two random ones, with the fake's seeded kernel delays and
  its caching allocator reusing and poisoning freed blocks at once;
* **races**: the fake's happens-before check over every kernel's reads,
  writes and frees and every event record/wait of the same runs;
* **lag**: retired iterations whose device work is pending, after each
  ``progress``, against ``max_device_lag=1`` while iteration 0's kernel spins;
* **hang**: a task that enqueues a kernel that never completes and raises:
  the caller must get the task's own error, the device polled with a
  deadline; a blocking wait hits the fake's ``hang_timeout_s`` and becomes a
  :class:`~swpipe.testing.FakeDeviceHang` (on a GPU: a hang forever).

The faults (issue 31, section 3): (a) no graveyard, (b) no cross-stream
device wait, (c) contexts released at CPU retire, (d) no batch-ready wait,
(e) an inline caller-group task not on its stream, (f) ``max_device_lag``
ignored, (g) an unbounded synchronize in teardown.

Rows (h)-(m) (issue 38, section 2) each run the pipelined scenario of one
CUDA semantic the fake models (``tests/test_cuda_semantics.py``, ``SCENARIOS``)
with the fault that semantic exposes, and read its values, its races, a
device error it raised (**device error**), and whether the task's own error
reached the caller (**hang**): (h) no batch-ready wait for a loader copying
from pageable memory, (i) no device wait before a host read (``item``), (j)
one stream's device waits dropped while another thread synchronised with
the producer, (k) one pool of events for every device (an event recorded for
a batch on another device reused on the pipeline's), (l) teardown waiting without a deadline for the loader's
stream, which shares a queue with a hung one, (m) the gradients of
``state=`` not kept alive, on a model trained on fake tensors. The fake
before that section missed each of them (``--before``).

A first row runs the engine as it is through every check and scenario: every
check must pass there, or a "caught" below means nothing.
``tests/test_cuda_mutations.py`` asserts the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, ContextManager, Dict, List, NamedTuple, Optional
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

import swpipe_core.engine.pipeline as engine_mod  # noqa: E402
from swpipe_core.engine.lifetime import DeviceLifetimes  # noqa: E402
from swpipe_core.engine.tasks import TaskRunner  # noqa: E402
from swpipe.testing import FakeCudaDevice, FakeDeviceHang  # noqa: E402
from swpipe_core.engine.pipeline import PipelineTaskError  # noqa: E402
from swpipe_core.plan import IterContext  # noqa: E402
from swpipe_core.engine.streams import StreamPool  # noqa: E402

import test_cuda_property as suite  # noqa: E402
import test_cuda_semantics as semantics  # noqa: E402

N_ITERS = 30  # per workload run; the property test itself runs 50+
RANDOM_SEEDS = (1, 6)  # two random workloads beside the canonical one (fixed: the table is reproducible)
LAG = 1
HANG_TIMEOUT_S = 1.0


# ----------------------------------------------------------------------------- the faults

def _no_graveyard() -> ContextManager:
    """(a) The CUDA run keeps nothing its tasks delete or replace: the plain context, a keeper that keeps nothing."""
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(engine_mod, "GuardedContext", IterContext))
    stack.enter_context(mock.patch.object(engine_mod, "context_keeper", lambda dev, params: lambda ctx: None))
    return stack


def _no_device_wait() -> ContextManager:
    """(b) Phase 2 dropped: a task's stream never waits for the events of its dependencies on other streams."""
    return mock.patch.object(StreamPool, "wait", lambda self, stream, event: None)


def _release_at_retire() -> ContextManager:
    """(c) A retired iteration's context (and its events) is released at once, not when its events completed."""

    def prune(self, oldest):
        for j in list(self.pending):
            self._free_iteration(self.pending.pop(j))

    return mock.patch.object(DeviceLifetimes, "prune", prune)


def _no_batch_ready() -> ContextManager:
    """(d) No ready event after a fetch: a batch made on the caller's stream is read on another without a wait."""
    return mock.patch.object(StreamPool, "batch_ready", lambda self, batch: ())


def _inline_off_stream() -> ContextManager:
    """(e) The caller's group runs its tasks without making their stream current (they launch on the caller's)."""
    marker = threading.local()  # set while the caller's thread runs its own group's tasks
    run_items, use = TaskRunner.run_items, FakeCudaDevice.use

    def run_items_marked(self, items, inline=False):
        marker.inline = inline
        try:
            return run_items(self, items, inline)
        finally:
            marker.inline = False

    def use_unless_inline(self, stream):  # the one call that makes a task's stream current
        return contextlib.nullcontext() if getattr(marker, "inline", False) else use(self, stream)

    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(TaskRunner, "run_items", run_items_marked))
    stack.enter_context(mock.patch.object(FakeCudaDevice, "use", use_unless_inline))
    return stack


def _lag_ignored() -> ContextManager:
    """(f) ``max_device_lag`` ignored: ``progress`` never waits for the device."""
    return mock.patch.object(DeviceLifetimes, "bound_lag", lambda self, retired: None)


def _blocking_teardown() -> ContextManager:
    """(g) Teardown synchronises the device with no deadline (``torch.cuda.synchronize()``) before its bounded poll."""
    release = DeviceLifetimes.release

    def blocking_release(self, states, timeout, limbo):
        for event in self.setup.pool.fence(self.setup.streams):
            event.synchronize()  # blocks until the device is done: forever on a kernel that never completes
        return release(self, states, timeout, limbo)

    return mock.patch.object(DeviceLifetimes, "release", blocking_release)


def _waits_dropped_on(name: str) -> Callable[[], ContextManager]:
    """(j) The device waits of one stream's tasks dropped (here the third thread's ``s3``)."""
    def inject() -> ContextManager:
        wait = StreamPool.wait

        def wait_unless(self, stream, event):
            if getattr(stream, "swpipe_name", None) != name:
                wait(self, stream, event)
        return mock.patch.object(StreamPool, "wait", wait_unless)
    return inject


def _one_pool_for_every_device() -> ContextManager:
    """(k) The pipeline's event pool keeps one free list for every device: an event recorded on one is reused on another."""
    def record(self, stream, timing=False):
        if stream is None:
            return None
        free = self._free.setdefault((timing, "every device"), [])
        event = free.pop() if free else self.dev.event(timing=timing)
        self.dev.record(event, stream)
        return event

    def recycle(self, events, timing=False):
        self._free.setdefault((timing, "every device"), []).extend(ev for ev in events if ev is not None)
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(StreamPool, "record", record))
    stack.enter_context(mock.patch.object(StreamPool, "recycle", recycle))
    return stack


def _blocking_on_the_loaders_stream() -> ContextManager:
    """(l) Teardown first waits without a deadline for the first task's stream (a copy stream "never hangs")."""
    release = DeviceLifetimes.release

    def release_after_the_loader(self, states, timeout, limbo):
        streams = self.setup.streams
        if streams and streams[0] is not None:
            self.setup.pool.record(streams[0]).synchronize()  # blocks while anything on its queue is hung
        return release(self, states, timeout, limbo)
    return mock.patch.object(DeviceLifetimes, "release", release_after_the_loader)


def _state_grads_not_kept() -> ContextManager:
    """(m) The gradients of ``SWPipeline(state=...)`` are not kept alive with the iteration's context."""
    keeper = engine_mod.context_keeper
    return mock.patch.object(engine_mod, "context_keeper", lambda dev, params: keeper(dev, []))


class Fault(NamedTuple):
    """One injected fault: its letter, what it is, the patches that inject it (a context manager), and the
    scenario of ``tests/test_cuda_semantics.py`` it runs (``None``: the property suite, lag and hang checks)."""

    key: str
    name: str
    inject: Callable[[], ContextManager]
    scenario: Optional[str] = None


FAULTS = (
    Fault("a", "no graveyard (deleted/replaced values not kept on CUDA)", _no_graveyard),
    Fault("b", "no cross-stream device wait", _no_device_wait),
    Fault("c", "contexts released at CPU retire", _release_at_retire),
    Fault("d", "no batch-ready wait", _no_batch_ready),
    Fault("e", "inline caller-group task not on its stream", _inline_off_stream),
    Fault("f", "max_device_lag ignored", _lag_ignored),
    Fault("g", "unbounded synchronize in teardown", _blocking_teardown),
    Fault("h", "no batch-ready wait, loader copying from pageable memory", _no_batch_ready, "h"),
    Fault("i", "no device wait before a host read (item)", _no_device_wait, "i"),
    Fault("j", "one stream's waits dropped, another thread synced the producer", _waits_dropped_on("s3"), "j"),
    Fault("k", "one event pool for every device (a batch on another device)", _one_pool_for_every_device, "k"),
    Fault("l", "teardown blocks on the loader's stream, pooled with a hung one", _blocking_on_the_loaders_stream, "l"),
    Fault("m", "gradients of state= not kept alive (autograd on fake tensors)", _state_grads_not_kept, "m"),
)


# ----------------------------------------------------------------------------- the suite

class Findings:
    """What each check saw under one engine: ``None`` where it passed, else a short account of what failed.

    (A plain class, not a dataclass: the tests import this script by path, outside ``sys.modules``.)

    Attributes
    ----------
    values, races, lag, hang, errors : str or None
        One per check (``errors``: a run raised something no check expects).
    seconds : float
        Wall time of the suite under this engine.
    details : list of str
        Every check's full finding, for ``--details``.
    """

    LABELS = {"values": "wrong values", "races": "race report", "lag": "lag bound exceeded",
              "hang": "hang turned into an error", "device": "device error", "errors": "run raised"}

    def __init__(self) -> None:
        self.values: Optional[str] = None
        self.races: Optional[str] = None
        self.lag: Optional[str] = None
        self.hang: Optional[str] = None
        self.device: Optional[str] = None
        self.errors: Optional[str] = None
        self.seconds = 0.0
        self.details: List[str] = []

    def caught_by(self) -> List[str]:
        """The checks that failed, by their table labels."""
        return [label for key, label in self.LABELS.items() if getattr(self, key) is not None]

    def evidence(self) -> str:
        """One short line per failed check."""
        return "; ".join(getattr(self, key) for key in self.LABELS if getattr(self, key) is not None)


def workloads() -> List[tuple]:
    """``(name, Workload)``: the canonical workload and two random ones (fixed seeds)."""
    return [("canonical", suite.canonical_workload())] + [
        (f"random seed {s}", suite.random_workload(random.Random(s), max_tasks=5)) for s in RANDOM_SEEDS]


def _short(text: str, n: int = 150) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= n else text[:n - 3] + "..."


def run_suite(scenarios: List[str] = (), property_suite: bool = True) -> Findings:
    """The checks once against the engine as currently patched: the property suite, lag and hang checks (if
    ``property_suite``) and the named scenarios of ``tests/test_cuda_semantics.py``."""
    t0 = time.perf_counter()
    f = Findings()
    wrong, races, errors = [], [], []
    if property_suite:
        _property_checks(f, wrong, races, errors)
    for key in scenarios:
        _scenario_checks(key, f, wrong, races, errors)
    if wrong:
        f.values = (f"{sum(len(x) for _, x in wrong)} values wrong in {len(wrong)} run(s), e.g. "
                    f"{wrong[0][0]}: {wrong[0][1][0]}")
    if races:
        f.races = (f"{sum(len(x) for _, x in races)} races in {len(races)} run(s), e.g. "
                   f"{_short(races[0][1][0].split(' with nothing ordering')[0].split(', with no device order')[0])}")
    f.errors = _short("; ".join(errors)) if errors else None
    f.seconds = time.perf_counter() - t0
    return f


def _property_checks(f: Findings, wrong: list, races: list, errors: list) -> None:
    for name, w in workloads():
        out = suite.run_workload(w, n_iters=N_ITERS, seed=0, serial=False)
        f.details.append(f"{name}: {out.summary()}")
        if out.wrong:
            wrong.append((name, out.wrong))
        if out.races:
            races.append((name, out.races))
        if out.error:
            errors.append(f"{name}: {out.error}")
    worst, error = suite.check_device_lag(lag=LAG)
    f.details.append(f"lag: max {worst} pending with max_device_lag={LAG}" + (f", raised {error}" if error else ""))
    if worst > LAG:
        f.lag = f"{worst} retired iterations pending on the device with max_device_lag={LAG}"
    if error:
        errors.append(f"lag check: {error}")
    error, hangs, kept = suite.check_teardown_hang(hang_timeout_s=HANG_TIMEOUT_S)
    f.details.append(f"hang: raised {type(error).__name__ if error else None}: {error}; "
                     f"FakeDeviceHang logged {len(hangs)}x; teardowns that kept contexts alive: {kept}")
    if isinstance(error, FakeDeviceHang) or hangs:
        f.hang = (f"FakeDeviceHang after the fake's hang_timeout_s={HANG_TIMEOUT_S:g} s "
                  + ("instead of the task's error" if isinstance(error, FakeDeviceHang) else "(logged by teardown)"))
    elif not (isinstance(error, PipelineTaskError) and isinstance(error.__cause__, ValueError)):
        errors.append(f"hang check: {type(error).__name__ if error else 'nothing'} raised, not the task's error")


def _scenario_checks(key: str, f: Findings, wrong: list, races: list, errors: list) -> None:
    """One scenario: its values and races; a device error, a hang, or (scenario l) the task's error missing."""
    name = semantics.SCENARIOS[key].__name__
    try:
        seen = semantics.SCENARIOS[key]()
    except Exception as exc:  # the fake cannot run it (an older fake without the API): a finding of its own
        errors.append(f"{name}: cannot run: {type(exc).__name__}: {exc}")
        return
    f.details.append(f"{name}: {len(seen.wrong)} wrong, {len(seen.races)} races, raised {seen.error!r}")
    if seen.wrong:
        wrong.append((name, seen.wrong))
    if seen.races:
        races.append((name, [str(r) for r in seen.races]))
    error = seen.error
    if type(error).__name__ == "EventDeviceError":
        f.device = f"{name}: {error}"
    elif isinstance(error, FakeDeviceHang):
        f.hang = f"{name}: FakeDeviceHang instead of the task's error"
    elif key == "l":
        if not (isinstance(error, PipelineTaskError) and (error.task, error.iteration) == ("Step", 2)):
            errors.append(f"{name}: {type(error).__name__ if error else 'nothing'} raised, not Step(2)'s error")
    elif error is not None:
        errors.append(f"{name}: {type(error).__name__}: {error}")


class Row(NamedTuple):
    """One row of the table: the fault injected (``None``: the engine as is) and what the suite found."""

    fault: Optional[Fault]
    findings: Findings

    @property
    def caught(self) -> bool:
        return bool(self.findings.caught_by())


def mutation_table() -> List[Row]:
    """The engine as is (first row: every check and scenario), then each fault injected in turn."""
    rows = [Row(None, run_suite(sorted(semantics.SCENARIOS)))]
    for fault in FAULTS:
        with fault.inject():
            rows.append(Row(fault, run_suite([fault.scenario] if fault.scenario else [],
                                             property_suite=fault.scenario is None)))
    return rows


def format_table(rows: List[Row], before: Optional[Dict[str, List[str]]] = None) -> str:
    """The table, markdown: fault, the checks that caught it, the result, what they saw, seconds; with ``before``
    (row key -> the checks an older fake's table said caught it), what that fake did beside it."""
    head = "| fault | caught by | result |" + (" before |" if before is not None else "") + " what the checks saw | s |"
    out = [head, "|---|---|---|" + ("---|" if before is not None else "") + "---|---:|"]
    for row in rows:
        by = ", ".join(row.findings.caught_by()) or "-"
        key = row.fault.key if row.fault else ""
        if row.fault is None:
            name = "none (the engine as is): every check must pass"
            result = "clean" if not row.findings.caught_by() else "NOT CLEAN"
        else:
            name, result = f"({key}) {row.fault.name}", "caught" if row.caught else "missed"
        then = ""
        if before is not None:
            old = before.get(key, [])
            found = [c for c in old if c != Findings.LABELS["errors"]]
            then = ((" clean |" if not old else " clean (cannot run every scenario) |"
                     if old == [Findings.LABELS["errors"]] else " NOT CLEAN |") if row.fault is None else
                    (f" caught ({', '.join(found)}) |" if found else
                     " missed (cannot run it) |" if old else " missed |"))
        out.append(f"| {name} | {by} | {result} |{then} {row.findings.evidence() or '-'} | "
                   f"{row.findings.seconds:.1f} |")
    return "\n".join(out)


def table_before(rev: str) -> Dict[str, List[str]]:
    """Row key -> the checks that caught it with the fake of commit ``rev`` (its ``src/swpipe/testing``) and this
    engine, faults and scenarios: this script run again in a copy of ``src`` whose fake is that commit's."""
    with tempfile.TemporaryDirectory(prefix="swpipe-fake-before-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        testing = src / "swpipe" / "testing"
        shutil.rmtree(testing)
        testing.mkdir()
        listing = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{rev}:src/swpipe/testing"],
                                 check=True, capture_output=True, text=True).stdout.split()
        for name in listing:
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:src/swpipe/testing/{name}"],
                                  check=True, capture_output=True, text=True).stdout
            (testing / name).write_text(text)
        env = dict(os.environ, PYTHONPATH=str(src))
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--json"], env=env, capture_output=True,
                             text=True, timeout=900)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"the table with the fake of {rev} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return json.loads(lines[-1])


def format_details(rows: List[Row]) -> str:
    """Every check's full finding, row by row."""
    out = []
    for row in rows:
        out.append(f"({row.fault.key}) {row.fault.name}" if row.fault else "none (the engine as is)")
        out += [f"    {d}" for d in row.findings.details]
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    """Print the table; exit status 0 when the engine as is is clean and every fault is caught."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--details", action="store_true", help="print every check's finding per fault")
    parser.add_argument("--before", metavar="REV", help="also run the table with the fake of git commit REV and "
                                                        "print what it caught beside each row")
    parser.add_argument("--json", action="store_true", help="print only {row key: checks that caught it}")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    rows = mutation_table()
    if args.json:
        print(json.dumps({(r.fault.key if r.fault else ""): r.findings.caught_by() for r in rows}))
        return 0
    before = table_before(args.before) if args.before else None
    print(f"machine: {platform.machine()} {platform.system()}, Python {platform.python_version()}, "
          f"torch {torch.__version__}, {len(os.sched_getaffinity(0))} cores, load average "
          f"{os.getloadavg()[0]:.1f}; {N_ITERS} iterations per workload, kernel delays up to "
          f"{suite.MAX_DELAY_S * 1e3:g} ms" + (f"; 'before': the fake of {args.before}" if args.before else ""))
    print(format_table(rows, before))
    if args.details:
        print(format_details(rows))
    print(f"{time.perf_counter() - t0:.1f} s")
    clean = not rows[0].findings.caught_by()
    return 0 if clean and all(r.caught for r in rows[1:]) else 1


if __name__ == "__main__":
    sys.exit(main())
