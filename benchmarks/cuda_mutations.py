"""CUDA mutation table: inject each engine fault on the fake device and show which check catches it.

    python benchmarks/cuda_mutations.py            # the table (about 30 s on two cores)
    python benchmarks/cuda_mutations.py --details  # also every check's finding per fault

Each row monkeypatches one fault into the engine for the duration of the row
(at run time only, never in library code), runs the fake-device suite of
``tests/test_cuda_property.py`` against it, and records what each check saw:

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
ignored, (g) an unbounded synchronize in teardown. A first row runs the
engine as it is: every check must pass there, or a "caught" below means
nothing. ``tests/test_cuda_mutations.py`` asserts the table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import sys
import threading
import time
from pathlib import Path
from typing import Callable, ContextManager, List, NamedTuple, Optional
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

import swpipe_core.engine.lifetime as lifetime_mod  # noqa: E402
import swpipe_core.engine.loop as loop_mod  # noqa: E402
import swpipe_core.engine.pipeline as engine_mod  # noqa: E402
from swpipe.testing import FakeCudaDevice, FakeDeviceHang  # noqa: E402
from swpipe_core.engine.pipeline import PipelineTaskError  # noqa: E402
from swpipe_core.plan import IterContext  # noqa: E402
from swpipe_core.engine.streams import StreamPool  # noqa: E402

import test_cuda_property as suite  # noqa: E402

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

    def prune(run):
        for j in list(run.device_pending):
            lifetime_mod.free_iteration(run, run.device_pending.pop(j))

    return mock.patch.object(loop_mod, "prune_device", prune)


def _no_batch_ready() -> ContextManager:
    """(d) No ready event after a fetch: a batch made on the caller's stream is read on another without a wait."""
    return mock.patch.object(StreamPool, "batch_ready", lambda self, batch: ())


def _inline_off_stream() -> ContextManager:
    """(e) The caller's group runs its tasks without making their stream current (they launch on the caller's)."""
    marker = threading.local()  # set while the caller's thread runs its own group's tasks
    run_items, use = loop_mod.run_items, FakeCudaDevice.use

    def run_items_marked(run, items, inline=False):
        marker.inline = inline
        try:
            return run_items(run, items, inline)
        finally:
            marker.inline = False

    def use_unless_inline(self, stream):  # the one call that makes a task's stream current
        return contextlib.nullcontext() if getattr(marker, "inline", False) else use(self, stream)

    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(loop_mod, "run_items", run_items_marked))
    stack.enter_context(mock.patch.object(FakeCudaDevice, "use", use_unless_inline))
    return stack


def _lag_ignored() -> ContextManager:
    """(f) ``max_device_lag`` ignored: ``progress`` never waits for the device."""
    return mock.patch.object(engine_mod, "bound_device_lag", lambda run, retired: None)


def _blocking_teardown() -> ContextManager:
    """(g) Teardown synchronises the device with no deadline (``torch.cuda.synchronize()``) before its bounded poll."""
    release = lifetime_mod.release

    def blocking_release(run, states, timeout, limbo):
        for event in run.pool.fence(run.streams):
            event.synchronize()  # blocks until the device is done: forever on a kernel that never completes
        return release(run, states, timeout, limbo)

    return mock.patch.object(lifetime_mod, "release", blocking_release)


class Fault(NamedTuple):
    """One injected fault: its letter in issue 31, what it is, and the patches that inject it (a context manager)."""

    key: str
    name: str
    inject: Callable[[], ContextManager]


FAULTS = (
    Fault("a", "no graveyard (deleted/replaced values not kept on CUDA)", _no_graveyard),
    Fault("b", "no cross-stream device wait", _no_device_wait),
    Fault("c", "contexts released at CPU retire", _release_at_retire),
    Fault("d", "no batch-ready wait", _no_batch_ready),
    Fault("e", "inline caller-group task not on its stream", _inline_off_stream),
    Fault("f", "max_device_lag ignored", _lag_ignored),
    Fault("g", "unbounded synchronize in teardown", _blocking_teardown),
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
              "hang": "hang turned into an error", "errors": "run raised"}

    def __init__(self) -> None:
        self.values: Optional[str] = None
        self.races: Optional[str] = None
        self.lag: Optional[str] = None
        self.hang: Optional[str] = None
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


def run_suite() -> Findings:
    """Every check once against the engine as currently patched."""
    t0 = time.perf_counter()
    f = Findings()
    wrong, races, errors = [], [], []
    for name, w in workloads():
        out = suite.run_workload(w, n_iters=N_ITERS, seed=0, serial=False)
        f.details.append(f"{name}: {out.summary()}")
        if out.wrong:
            wrong.append((name, out.wrong))
        if out.races:
            races.append((name, out.races))
        if out.error:
            errors.append(f"{name}: {out.error}")
    n = len(workloads())
    if wrong:
        f.values = (f"{sum(len(x) for _, x in wrong)} sums wrong in {len(wrong)}/{n} workloads, e.g. "
                    f"{wrong[0][0]}: {wrong[0][1][0]}")
    if races:
        f.races = (f"{sum(len(x) for _, x in races)} races in {len(races)}/{n} workloads, e.g. "
                   f"{_short(races[0][1][0].split(' with nothing ordering')[0].split(', with no device order')[0])}")
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
    f.errors = _short("; ".join(errors)) if errors else None
    f.seconds = time.perf_counter() - t0
    return f


class Row(NamedTuple):
    """One row of the table: the fault injected (``None``: the engine as is) and what the suite found."""

    fault: Optional[Fault]
    findings: Findings

    @property
    def caught(self) -> bool:
        return bool(self.findings.caught_by())


def mutation_table() -> List[Row]:
    """The engine as is (first row), then each fault injected in turn."""
    rows = [Row(None, run_suite())]
    for fault in FAULTS:
        with fault.inject():
            rows.append(Row(fault, run_suite()))
    return rows


def format_table(rows: List[Row]) -> str:
    """The table, markdown: fault, the checks that caught it, the result, what they saw, seconds."""
    out = ["| fault | caught by | result | what the checks saw | s |", "|---|---|---|---|---:|"]
    for row in rows:
        by = ", ".join(row.findings.caught_by()) or "-"
        if row.fault is None:
            name = "none (the engine as is): every check must pass"
            result = "clean" if not row.findings.caught_by() else "NOT CLEAN"
        else:
            name, result = f"({row.fault.key}) {row.fault.name}", "caught" if row.caught else "missed"
        out.append(f"| {name} | {by} | {result} | {row.findings.evidence() or '-'} | {row.findings.seconds:.1f} |")
    return "\n".join(out)


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
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    rows = mutation_table()
    print(f"machine: {platform.machine()} {platform.system()}, Python {platform.python_version()}, "
          f"torch {torch.__version__}, {len(os.sched_getaffinity(0))} cores; "
          f"{N_ITERS} iterations per workload, kernel delays up to {suite.MAX_DELAY_S * 1e3:g} ms")
    print(format_table(rows))
    if args.details:
        print(format_details(rows))
    print(f"{time.perf_counter() - t0:.1f} s")
    clean = not rows[0].findings.caught_by()
    return 0 if clean and all(r.caught for r in rows[1:]) else 1


if __name__ == "__main__":
    sys.exit(main())
