"""The engine's state has owners (issue 46.6): each part of a run is one object, the only writer of its fields.

A pipelined run is a :class:`~swpipe_core.engine.loop.PeriodLoop` (the iterations in flight, the period
counter, the data) holding a :class:`~swpipe_core.engine.tasks.TaskRunner` (threads, per-period flags), a
:class:`~swpipe_core.engine.lifetime.DeviceLifetimes` (what the device still reads) and a
:class:`~swpipe_core.engine.failure.RunFailure` (the first error, the cancel flag, raise once), over a fixed
:class:`~swpipe_core.engine.run.RunSetup`. Two things are checked: no module writes another's state, and
following one CPU ``progress()`` takes few files.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import List, Set, Tuple

import pytest

from swpipe import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
from swpipe_core.engine.failure import RunFailure
from swpipe_core.engine.lifetime import DeviceLifetimes
from swpipe_core.engine.loop import PeriodLoop
from swpipe_core.engine.run import RunSetup
from swpipe_core.engine.tasks import IterState, TaskRunner

ENGINE = Path(__file__).resolve().parents[1] / "src" / "swpipe_core" / "engine"
#: The modules that hold or change a run's state.
RUN_MODULES = ("pipeline", "run", "loop", "tasks", "failure", "lifetime", "checks")
#: Calls that change the container they are called on.
MUTATING = {"clear", "pop", "popitem", "append", "extend", "update", "setdefault", "remove", "insert", "add",
            "discard", "set"}
#: The names the engine gives an in-flight iteration's record (IterState), which tasks, loop and lifetimes share.
ITERATION_NAMES = {"st", "dst"}


def owned_fields() -> Set[str]:
    names: Set[str] = set()
    for owner in (PeriodLoop, TaskRunner, DeviceLifetimes, RunFailure):
        names.update(owner.__slots__)
    return names | {f for f in RunSetup.__dataclass_fields__}


def writes_through_another_object(source: str) -> List[Tuple[int, str, str]]:
    """``(line, receiver, field)`` of every write to an attribute not made through ``self``: ``x.f = ...``,
    ``x.f += ...``, ``del x.f``, ``x.f[k] = ...``, ``del x.f[k]`` and ``x.f.clear()`` (and the other calls of
    :data:`MUTATING`)."""
    found = []

    def note(target: ast.AST) -> None:
        if isinstance(target, ast.Subscript):
            target = target.value
        if isinstance(target, ast.Attribute) and not (isinstance(target.value, ast.Name) and target.value.id == "self"):
            receiver = target.value.id if isinstance(target.value, ast.Name) else ast.unparse(target.value)
            found.append((target.lineno, receiver, target.attr))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.Delete)):
            for target in node.targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    note(t)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            note(node.target)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATING
              and isinstance(node.func.value, ast.Attribute)):
            note(node.func.value)
    return sorted(found, key=lambda w: w[0])  # in the order of the source


def test_each_part_of_a_runs_state_is_written_by_its_owner_alone():
    """A field of an owner (or of the setup) is assigned or mutated only through ``self`` in its own class; what
    other modules write is the shared record of an iteration (its signals, context and events, under the run's
    lock), named ``st``/``dst``."""
    owned, iteration = owned_fields(), set(IterState.__slots__)
    foreign = []
    for module in RUN_MODULES:
        for line, receiver, field in writes_through_another_object((ENGINE / f"{module}.py").read_text()):
            if field in owned and not (receiver in ITERATION_NAMES and field in iteration):
                foreign.append(f"{module}.py:{line}: {receiver}.{field}")
    assert foreign == []


def test_the_check_sees_what_the_old_run_state_did():
    # the old engine's writes, one of each kind: every one is a write through another object
    old = ("run.cancelled = True\nrun.draining = run.exhausted = True\nrun.oldest += 1\ndel run.iters[idx]\n"
           "run.device_pending[idx] = st\nrun.device_pending.clear()\nself.x = 1\nst.ctx = None\n")
    assert [(r, f) for _, r, f in writes_through_another_object(old)] == [
        ("run", "cancelled"), ("run", "draining"), ("run", "exhausted"), ("run", "oldest"), ("run", "iters"),
        ("run", "device_pending"), ("run", "device_pending"), ("st", "ctx")]


def _noop(ctx) -> None:
    return None


def engine_files_of_one_progress(plan: PipelinePlan) -> Set[str]:
    """The files under ``src/swpipe_core/engine`` whose code runs on the caller's thread during one steady-state
    ``progress()`` (a ``sys.settrace`` 'call' event of a frame of that file)."""
    seen: Set[str] = set()
    root = str(ENGINE) + "/"

    def tracer(frame, event, arg):
        name = frame.f_code.co_filename
        if name.startswith(root):
            seen.add(name[len(root):])
        return None  # calls only, no line events

    with SWPipeline(plan, device="cpu") as pipe:
        it = pipe.fill_pipeline(range(8))
        pipe.progress(it)  # steady state: the period's program is compiled and cached
        previous = sys.gettrace()
        sys.settrace(tracer)
        try:
            pipe.progress(it)
        finally:
            sys.settrace(previous)
        pipe.drain()
    return seen


@pytest.mark.parametrize("caller_group", ["default", None], ids=["inline", "on-workers"])
def test_following_one_cpu_progress_takes_at_most_five_engine_files(caller_group):
    """How the files are counted: every file of ``swpipe_core/engine`` in which a function runs on the caller's
    thread during one ``progress()`` of a 2-task CPU plan (``A`` at stage 0, ``B`` after it at stage 1), helpers
    included (the watchdog's begin/end stamp, the profiler check, a worker's queue put); what the plan's walk
    computes outside the engine (``swpipe_core/walk.py``, ``plan.py``) is not counted. The two tasks run inline on
    the caller's thread, or each on a worker; a plan with both (a worker group and the caller's) touches six, the
    queue put and the watchdog's stamp both. Before the state had owners the inline run took six (``run.py`` for
    the iteration's record)."""
    tasks = {n: PipelineTask(n, _noop) for n in "AB"}
    groups = ("default", "default") if caller_group else ("io", "compute")
    plan = PipelinePlan({tasks["A"]: TaskSchedule(0, thread_group=groups[0]),
                         tasks["B"]: TaskSchedule(1, thread_group=groups[1])},
                        intra_iter_deps=[("B", "A")], caller_group=caller_group)
    files = engine_files_of_one_progress(plan)
    assert {"pipeline.py", "loop.py", "tasks.py"} <= files  # the trace followed the call
    assert len(files) <= 5, sorted(files)
