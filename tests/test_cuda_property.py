"""Property test on the fake CUDA device: random multi-stream plans compute exact sums, equal to serial, race-free.

A random valid plan (2-4 streams, 1-3 thread groups, sometimes a caller's
group inline, intra- and cross-iteration dependencies across streams) is
bound to tasks that compute on :class:`swpipe.testing.FakeCuda` with its
kernels: each task sums what its dependencies wrote (FakeTensors in ``ctx``,
at the top level or nested in ``ctx.d``; for a cross-iteration dependency a
tensor the producer left in a state buffer outside ``ctx``, taken with
``ctx.keep_alive``), publishes a fresh output, and some tasks free what they
read early (``del ctx.x``, ``ctx.x = other``, ``ctx.d.pop(k)``). The fake's
seeded kernel delays make the streams run at adversarial speeds, and its
caching allocator hands a freed block to the next allocation of its stream at
once, poisoned: a missing wait or an early free gives a wrong sum. Over 50+
iterations every task's sum must be exact (a closed form), equal to the
serial run's, and the happens-before check must report no race.

The same workload and checks are what ``benchmarks/cuda_mutations.py`` runs
against engines with one fault injected each (:func:`run_workload`,
:func:`check_device_lag`, :func:`check_teardown_hang` return what they saw
instead of asserting, so a mutation table can say which check caught what).
"""

from __future__ import annotations

import logging
import random
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch
from swpipe.testing import FakeCuda, kernels
from swpipe import Timeouts
from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.validate import validate
from conftest import hang_after_kernel_plan, retirements

GROUPS = ("g0", "g1", "g2")
STREAMS = (None, "s1", "s2", "s3")
NUMEL = 64  # elements per tensor: one allocator size, so every stream's frees are reused by its next allocation
DTYPE = torch.int64  # exact sums; the poison (0xFF bytes) reads as -1
MAX_DELAY_S = 0.0005  # the fake's seeded per-kernel delay: small, but enough to reorder streams

Key = Tuple[str, int]

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(120)]

# explicit seeds: every machine runs the same plans (the fake's delays are seeded by them too)
PROPERTY_SEEDS = tuple(range(10))


# ----------------------------------------------------------------------------- the workload, as plain data

@dataclass(frozen=True)
class Workload:
    """A plan's shape and what each task does with its data; built by :func:`random_workload`.

    Attributes
    ----------
    stages, streams, groups : dict
        Per task: its stage, stream name (``None`` is the default stream), thread group.
    intra : list of (task, dependency)
    inter : list of (task, dependency, distance)
    caller_group : str or None
        The group run inline on the caller's thread.
    nested : frozenset of str
        Tasks that publish their output in ``ctx.d[task]`` (the others in ``ctx.o_<task>``).
    frees : dict
        ``producer -> (consumer, how)``: that consumer frees the producer's output after reading it;
        ``how`` is ``"del"`` (``del ctx.o_P`` / ``ctx.d.pop(P)``) or ``"replace"`` (a new tensor in its place).
    spins : dict
        Per task, seconds of a spin kernel before it publishes its output (a slow producer).
    device_batch : bool
        The data iterator makes each batch on the device (on the caller's stream); every task reads it.
    """

    stages: Dict[str, int]
    streams: Dict[str, Optional[str]]
    groups: Dict[str, str]
    intra: List[Tuple[str, str]]
    inter: List[Tuple[str, str, int]]
    caller_group: Optional[str]
    nested: frozenset = frozenset()
    frees: Dict[str, Tuple[str, str]] = field(default_factory=dict)
    spins: Dict[str, float] = field(default_factory=dict)
    device_batch: bool = False

    @property
    def tasks(self) -> List[str]:
        return list(self.stages)

    def describe(self) -> str:
        """One line per task: what a failing example needs to be reproduced by hand."""
        lines = [f"caller_group={self.caller_group!r} device_batch={self.device_batch}"]
        for t in self.tasks:
            deps = [d for x, d in self.intra if x == t] + [f"{d}@-{n}" for x, d, n in self.inter if x == t]
            lines.append(f"  {t}: stage {self.stages[t]}, stream {self.streams[t]!r}, group {self.groups[t]!r}, "
                         f"deps {deps}, {'nested' if t in self.nested else 'attr'}"
                         + (f", frees {[p for p, (c, _) in self.frees.items() if c == t]}" if t in
                            {c for c, _ in self.frees.values()} else ""))
        return "\n".join(lines)


def random_workload(rnd: random.Random, max_tasks: int = 6, n_streams: Optional[int] = None,
                    n_groups: Optional[int] = None) -> Workload:
    """A random valid workload: 3 to ``max_tasks`` tasks, 2-4 streams, 1-3 groups, deps across streams.

    ``n_streams`` (2-4) and ``n_groups`` (1-3) are drawn from ``rnd`` unless
    given: tasks draw their stream from the first ``n_streams`` of
    :data:`STREAMS` (at least two distinct ones in use) and their group from
    the first ``n_groups`` of :data:`GROUPS`.

    Stages are drawn sorted over the task slots, so an intra dependency from a
    later slot to an earlier one keeps ``stage(dep) <= stage(task)`` and is
    acyclic; an inter dependency is kept only when ``stage(dep) - stage(task)
    <= distance`` (corollary 3). At least one intra and one inter dependency
    cross streams (added if the draw had none), so every plan needs device
    waits both within and across iterations.
    """
    n = rnd.randint(3, max_tasks)
    names = [f"T{k}" for k in range(n)]
    rnd.shuffle(names)  # names do not reveal the slot order
    stages = dict(zip(names, sorted(rnd.randint(0, 2) for _ in range(n))))
    n_streams = rnd.randint(2, 4) if n_streams is None else n_streams
    pool = list(STREAMS[:n_streams])
    streams = {t: rnd.choice(pool) for t in names}
    for k, s in enumerate(rnd.sample(pool, 2)):  # at least two streams in use
        streams[names[k]] = s
    n_groups = rnd.randint(1, 3) if n_groups is None else n_groups
    groups = {t: rnd.choice(GROUPS[:n_groups]) for t in names}
    caller_group = rnd.choice([None] + sorted(set(groups.values())))
    intra = [(names[b], names[a]) for a in range(n) for b in range(a + 1, n) if rnd.random() < 0.5]
    if not any(streams[t] != streams[d] for t, d in intra):
        a, b = next(((a, b) for a in range(n) for b in range(a + 1, n) if streams[names[a]] != streams[names[b]]))
        intra.append((names[b], names[a]))
    inter: List[Tuple[str, str, int]] = []
    for _ in range(rnd.randint(1, 3)):
        t, d, dist = rnd.choice(names), rnd.choice(names), rnd.randint(1, 2)
        if stages[d] - stages[t] <= dist and (t, d, dist) not in inter:
            inter.append((t, d, dist))
    if not any(streams[t] != streams[d] for t, d, _ in inter):
        t, d = next((t, d) for t in names for d in names if streams[t] != streams[d])
        inter.append((t, d, max(1, stages[d] - stages[t])))
    nested = frozenset(t for t in names if rnd.random() < 0.4)
    frees: Dict[str, Tuple[str, str]] = {}
    ancestors = _ancestors(names, intra)
    for p in names:
        consumers = [t for t, d in intra if d == p]
        # the freeing consumer must come after every other consumer of p (they read p's output on the host first)
        last = [c for c in consumers if all(o == c or o in ancestors[c] for o in consumers)]
        if last and rnd.random() < 0.8:
            frees[p] = (last[0], rnd.choice(["del", "replace"]))
    spins = {t: rnd.choice([0.0, 0.0003, 0.001]) for t in names}
    return Workload(stages, streams, groups, intra, inter, caller_group, nested, frees, spins,
                    device_batch=rnd.random() < 0.5)


def _ancestors(names: List[str], intra: List[Tuple[str, str]]) -> Dict[str, set]:
    """Every task's transitive intra-iteration dependencies."""
    direct = {t: {d for x, d in intra if x == t} for t in names}
    out: Dict[str, set] = {}

    def visit(t: str) -> set:
        if t not in out:
            out[t] = set()
            for d in direct[t]:
                out[t] |= {d} | visit(d)
        return out[t]

    for t in names:
        visit(t)
    return out


def canonical_workload() -> Workload:
    """A hand-written workload that exercises every lifetime and ordering rule at once.

    ``H2D`` (stream ``memcpy``, worker ``io``) reads the device batch the
    iterator made on the caller's stream; ``Fwd`` (default stream, inline
    in the caller's group) reads it; ``Bwd`` (stream ``bwd``, inline too) reads
    ``Fwd``'s nested output and frees ``H2D``'s and ``Fwd``'s (so blocks of
    ``memcpy`` and the default stream are freed by a task on a third stream);
    ``Opt`` (stream ``opt``, worker ``side``) reads ``Bwd``'s output and frees
    it, and the next iteration's ``Fwd`` reads ``Opt``'s state across streams.
    """
    return Workload(
        stages={"H2D": 0, "Fwd": 1, "Bwd": 1, "Opt": 2},
        streams={"H2D": "memcpy", "Fwd": None, "Bwd": "bwd", "Opt": "opt"},
        groups={"H2D": "io", "Fwd": "main", "Bwd": "main", "Opt": "side"},
        intra=[("Fwd", "H2D"), ("Bwd", "Fwd"), ("Bwd", "H2D"), ("Opt", "Bwd")],
        inter=[("Fwd", "Opt", 1), ("H2D", "Bwd", 1)],
        caller_group="main",
        nested=frozenset({"Fwd"}),
        frees={"H2D": ("Bwd", "del"), "Fwd": ("Bwd", "replace"), "Bwd": ("Opt", "del")},
        spins={"H2D": 0.001, "Fwd": 0.0, "Bwd": 0.0005, "Opt": 0.0},
        device_batch=True,
    )


def build_plan(w: Workload) -> PipelinePlan:
    """The workload's plan, unbound (:meth:`_Bound.plan` binds the task functions on a device)."""
    sched = {t: TaskSchedule(stage=w.stages[t], stream=w.streams[t], thread_group=w.groups[t]) for t in w.tasks}
    plan = PipelinePlan(sched, intra_iter_deps=list(w.intra), inter_iter_deps=list(w.inter),
                        caller_group=w.caller_group)
    validate(plan)  # the generator only builds valid plans; a PlanError here is a generator bug
    return plan


# ----------------------------------------------------------------------------- values: the closed form

def _base(w: Workload, task: str, i: int) -> int:
    """The value a task's output holds in iteration ``i`` (distinct per task and iteration)."""
    return 1 + 7 * w.tasks.index(task) + 61 * i


def _state_value(w: Workload, task: str, i: int) -> int:
    """The value of the tensor ``task(i)`` leaves in the state buffer for a later iteration."""
    return 5000 + 3 * w.tasks.index(task) + 17 * i


def _batch_value(i: int) -> int:
    return 100_000 + 11 * i


def expected_sums(w: Workload, n_iters: int) -> Dict[Key, int]:
    """Every task's sum in every iteration, as the serial loop computes it."""
    out = {}
    for i in range(n_iters):
        for t in w.tasks:
            v = _base(w, t, i) + (_batch_value(i) if w.device_batch else 0)
            v += sum(_base(w, d, i) for x, d in w.intra if x == t)
            v += sum(_state_value(w, d, i - n) for x, d, n in w.inter if x == t and i >= n)
            out[t, i] = NUMEL * v
    return out


# ----------------------------------------------------------------------------- the tasks on a device

class _Bound:
    """The workload's task functions on one device, and what they leave behind (sums, the state buffer)."""

    def __init__(self, w: Workload, dev: Any, n_iters: int) -> None:
        self.w, self.k, self.n_iters = w, kernels(dev), n_iters
        self.sums: Dict[Key, Any] = {}
        # the cross-iteration state buffer: (producer, iteration) -> tensor, outside ctx, popped by its last reader
        self.state: Dict[Key, Any] = {}
        self.readers: Dict[Key, int] = {}
        self.lock = threading.Lock()  # readers of one state entry run on different threads

    def reset(self) -> None:
        """Forget the sums and the state buffer (after a run: the device work has completed)."""
        self.sums.clear()
        self.state.clear()
        self.readers.clear()

    def plan(self) -> PipelinePlan:
        return build_plan(self.w).bind({t: self._fn(t) for t in self.w.tasks})

    def batches(self):
        """The data iterator: ints, or (``device_batch``) tensors filled on the caller's current stream."""
        for i in range(self.n_iters):
            if self.w.device_batch:
                self.k.spin(0.0005)  # a slow loader: a reader that skips the ready wait sees the old values
                yield self.k.full(NUMEL, _batch_value(i), DTYPE)
            else:
                yield i

    def _fn(self, name: str):
        w, k = self.w, self.k
        intra = [d for t, d in w.intra if t == name]
        inter = [(d, n) for t, d, n in w.inter if t == name]
        state_readers = [n for _, d, n in w.inter if d == name]  # distances of the tasks reading name's state
        frees = [(p, how) for p, (c, how) in w.frees.items() if c == name]
        spin = w.spins.get(name, 0.0)

        def fn(ctx):
            i = ctx.iter_idx
            acc = k.full(NUMEL, _base(w, name, i), DTYPE)
            if w.device_batch:
                k.add_(acc, ctx.batch)
            for d in intra:
                k.add_(acc, _output(ctx, d, d in w.nested))
            for d, n in inter:
                if i >= n:
                    k.add_(acc, self._take_state(ctx, d, i - n))
            self.sums[name, i] = acc  # read once the run ended (a device sum would only add a kernel per task)
            if spin:
                k.spin(spin)  # the output below is written late: a reader that skips the wait reads stale bytes
            out = k.full(NUMEL, _base(w, name, i), DTYPE)
            if name in w.nested:
                vars(ctx).setdefault("d", {})[name] = out  # setdefault: atomic, tasks of one iteration run on threads
            else:
                setattr(ctx, f"o_{name}", out)
            readers = sum(1 for n in state_readers if i + n < self.n_iters)  # iterations of the data only
            if readers:
                with self.lock:
                    self.readers[name, i] = readers
                    self.state[name, i] = k.full(NUMEL, _state_value(w, name, i), DTYPE)
            for p, how in frees:  # after the reads above were launched: an early free
                _free(ctx, p, p in w.nested, how, k)
        return fn

    def _take_state(self, ctx: Any, producer: str, j: int) -> Any:
        """Read ``producer(j)``'s state tensor; the last reader removes it from the buffer.

        Each reader hands it to its own context (``ctx.keep_alive``): the
        buffer no longer holds it once the last reader popped it, and the block
        must outlive the kernels of every reader (docs/semantics.md, lifetimes).
        """
        with self.lock:
            x = self.state[producer, j]
            self.readers[producer, j] -= 1
            if self.readers[producer, j] == 0:
                del self.state[producer, j], self.readers[producer, j]
        ctx.keep_alive(x)
        return x


def _output(ctx: Any, task: str, nested: bool) -> Any:
    return ctx.d[task] if nested else getattr(ctx, f"o_{task}")


def _free(ctx: Any, task: str, nested: bool, how: str, k: Any) -> None:
    if how == "del":
        if nested:
            ctx.d.pop(task)
        else:
            delattr(ctx, f"o_{task}")
    else:  # replaced: the old value leaves the context as surely as a del
        new = k.full(NUMEL, -7, DTYPE)
        if nested:
            ctx.d[task] = new
        else:
            setattr(ctx, f"o_{task}", new)


# ----------------------------------------------------------------------------- running and checking

@dataclass
class Outcome:
    """What one pipelined and one serial run of a workload showed.

    Attributes
    ----------
    wrong : list of str
        ``Task(i): got x, expected y`` for every pipelined sum that is not exact.
    serial_wrong : list of str
        The same for the serial run.
    races : list of str
        The fake's race reports (pipelined run, then serial run).
    error : str or None
        An exception either run raised (type and message).
    traceback : str
        Its traceback (empty if none).
    """

    wrong: List[str] = field(default_factory=list)
    serial_wrong: List[str] = field(default_factory=list)
    races: List[str] = field(default_factory=list)
    error: Optional[str] = None
    traceback: str = ""

    @property
    def ok(self) -> bool:
        return not (self.wrong or self.serial_wrong or self.races or self.error)

    def summary(self) -> str:
        parts = []
        if self.wrong:
            parts.append(f"{len(self.wrong)} wrong sum(s), e.g. {self.wrong[0]}")
        if self.serial_wrong:
            parts.append(f"serial: {len(self.serial_wrong)} wrong sum(s), e.g. {self.serial_wrong[0]}")
        if self.races:
            parts.append(f"{len(self.races)} race(s), e.g. {self.races[0]}")
        if self.error:
            parts.append(f"error: {self.error}")
        return "; ".join(parts) or "ok"


def _read_sums(bound: _Bound) -> Dict[Key, int]:
    # the runs end with a device synchronisation, so reading on the caller's stream sees every kernel
    return {key: int(bound.k.to_host(s).sum()) for key, s in bound.sums.items()}


def _compare(got: Dict[Key, int], want: Dict[Key, int]) -> List[str]:
    missing = sorted(set(want) - set(got))
    bad = [f"{t}({i}): got {got[t, i]}, expected {want[t, i]}" for (t, i) in sorted(want, key=lambda x: (x[1], x[0]))
           if (t, i) in got and got[t, i] != want[t, i]]
    return bad + [f"{t}({i}): never ran" for t, i in missing]


def run_workload(w: Workload, n_iters: int = 50, seed: int = 0, max_delay_s: float = MAX_DELAY_S,
                 max_device_lag: Optional[int] = None, serial: bool = True) -> Outcome:
    """Run ``w`` pipelined and serially on a fresh fake device; what the values and the race check say.

    Parameters
    ----------
    w : Workload
    n_iters : int
    seed : int
        Seeds the fake's kernel delays.
    max_delay_s : float
    max_device_lag : int or None
        Passed to the pipeline.
    serial : bool
        Also run the plan serially (the same pipeline's ``run_serial``) and compare.

    Returns
    -------
    Outcome
    """
    out = Outcome()
    want = expected_sums(w, n_iters)
    with FakeCuda(num_devices=1, seed=seed, max_delay_s=max_delay_s, hang_timeout_s=20.0) as fake:
        dev = fake.device(0)
        try:
            bound = _Bound(w, dev, n_iters)
            pipe = SWPipeline(bound.plan(), device=dev, max_device_lag=max_device_lag,
                              timeouts=Timeouts(signal_s=20, progress_s=20))
            pipe.run(bound.batches())
            out.wrong = _compare(_read_sums(bound), want)
            out.races = [str(r) for r in fake.races]
            bound.reset()
            if not serial:
                return out
            races_before = len(fake.races)
            pipe.run_serial(bound.batches())  # the same pipeline and plan, serially on the default stream
            out.serial_wrong = _compare(_read_sums(bound), want)
            out.races += [f"serial: {r}" for r in fake.races[races_before:]]
            bound.reset()
        except Exception as exc:  # a mutation may break a run outright: that is a finding, not a crash of the table
            out.error = f"{type(exc).__name__}: {exc}"
            out.traceback = traceback.format_exc()
    return out


def check_device_lag(lag: int = 1, n_iters: int = 16) -> Tuple[int, Optional[str]]:
    """The most retired iterations whose device work is pending, seen after each ``progress`` (bound: ``lag``).

    Iteration 0's kernel holds the only stream until the host first blocks on
    the device (``pipe.streams.wait_events`` with a timeout), so every later
    iteration's device work waits behind it: a pipeline that ignores
    ``max_device_lag`` retires them all on the CPU and the count climbs past
    the bound; the correct engine blocks in ``progress`` at the bound, which
    releases the kernel. Whatever the machine's load: the device is slower
    than the host by construction, not by a spin of some length.

    Returns
    -------
    (int, str or None)
        The largest lag seen, and an error the run raised (if any).
    """
    with FakeCuda(num_devices=1, seed=0, max_delay_s=0.0, hang_timeout_s=20.0) as fake:
        dev = fake.device(0)
        k = kernels(dev)
        host_blocked = threading.Event()

        def work(ctx):
            if ctx.iter_idx == 0:
                k.wait_host(host_blocked)
            ctx.x = k.full(NUMEL, ctx.iter_idx, DTYPE)

        # two stages: the default bound (the depth, 2) is not the one asked for
        plan = PipelinePlan({PipelineTask("Work", work): TaskSchedule(0, "work", "io"),
                             PipelineTask("Tail", lambda ctx: None): TaskSchedule(1, "work", "io")},
                            intra_iter_deps=[("Tail", "Work")], caller_group=None)
        pipe = SWPipeline(plan, device=dev, max_device_lag=lag, timeouts=Timeouts(progress_s=20))
        poll = pipe.streams.wait_events

        def wait_events(events, timeout, wake=None):
            if timeout > 0:  # the host blocks on the device: the held kernel may finish now
                host_blocked.set()
            return poll(events, timeout, wake)

        pipe.streams.wait_events = wait_events  # on this pipeline's pool only
        seen = [0]
        try:
            for _ in retirements(pipe, pipe.fill_pipeline(range(n_iters))):
                seen.append(pipe.device_lag)
        except Exception as exc:
            pipe.close()
            return max(seen), f"{type(exc).__name__}: {exc}"
        finally:
            host_blocked.set()
        return max(seen), None


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def check_teardown_hang(hang_timeout_s: float = 1.0) -> Tuple[Optional[BaseException], List[str], int]:
    """A task enqueues a kernel that never completes, then raises: what reaches the caller.

    The engine must report the task's own error, having polled the device
    with a deadline (the contexts stay alive, in its limbo), never having
    blocked on it: a blocking wait hits the fake's ``hang_timeout_s`` (on a
    GPU it would block forever) and raises :class:`~swpipe.testing.FakeDeviceHang`,
    which the engine either lets out or logs.

    Returns
    -------
    (exception or None, list of str, int)
        What ``run`` raised, the engine's warnings that name a ``FakeDeviceHang``,
        and how many iteration contexts the teardowns kept alive (``SWPipeline.kept_for_device``).
    """
    handler = _Warnings()
    logger = logging.getLogger("swpipe_core.engine.pipeline")
    logger.addHandler(handler)
    try:
        with FakeCuda(num_devices=1, seed=0, max_delay_s=0.0, hang_timeout_s=hang_timeout_s) as fake:
            dev = fake.device(0)
            k = kernels(dev)

            plan = hang_after_kernel_plan(k, NUMEL, DTYPE)
            # the bounded poll gives up quickly (teardown_s): the kernel never ends
            pipe = SWPipeline(plan, device=dev, timeouts=Timeouts(progress_s=20, teardown_s=0.2))
            error: Optional[BaseException] = None
            try:
                pipe.run(range(6))
            except Exception as exc:
                error = exc
            kept = pipe.kept_for_device  # contexts the teardowns kept alive for the device
    finally:
        logger.removeHandler(handler)
    return error, [m for m in handler.messages if "FakeDeviceHang" in m], kept


# ----------------------------------------------------------------------------- the tests

@pytest.mark.parametrize("seed", PROPERTY_SEEDS)
def test_random_plans_on_the_fake_device_are_exact_equal_to_serial_and_race_free(seed):
    """Reproduce one example by hand: ``run_workload(random_workload(random.Random(seed), max_tasks=5), ...)``."""
    w = random_workload(random.Random(seed), max_tasks=5)
    out = run_workload(w, n_iters=50 + seed % 7, seed=seed)
    assert out.ok, f"{out.summary()}\nworkload (seed {seed}):\n{w.describe()}\n{out.traceback}"


def test_the_canonical_workload_is_exact_and_race_free():
    out = run_workload(canonical_workload(), n_iters=60, seed=1)
    assert out.ok, f"{out.summary()}\n{out.traceback}"


def test_the_property_examples_cover_what_it_claims():
    """Caller's group or none, 2 and 4 streams, 1 and 3 groups, frees of both kinds across streams, nested outputs,
    device batches, depth 3, and intra and inter deps across streams in every example: else the property is
    weaker than it reads."""
    seen = {"caller": 0, "no_caller": 0, "streams2": 0, "streams4": 0, "groups1": 0, "groups3": 0, "del": 0,
            "replace": 0, "nested": 0, "device_batch": 0, "free_across_streams": 0, "deep": 0}
    for s in PROPERTY_SEEDS:
        w = random_workload(random.Random(s), max_tasks=5)
        streams = {w.streams[t] for t in w.tasks}
        assert 2 <= len(streams) <= 4 and 1 <= len(set(w.groups.values())) <= 3
        assert any(w.streams[t] != w.streams[d] for t, d in w.intra)
        assert any(w.streams[t] != w.streams[d] for t, d, _ in w.inter)
        seen["caller"] += w.caller_group is not None
        seen["no_caller"] += w.caller_group is None
        seen["streams2"] += len(streams) == 2
        seen["streams4"] += len(streams) == 4
        seen["groups1"] += len(set(w.groups.values())) == 1
        seen["groups3"] += len(set(w.groups.values())) == 3
        seen["del"] += any(h == "del" for _, h in w.frees.values())
        seen["replace"] += any(h == "replace" for _, h in w.frees.values())
        seen["nested"] += bool(w.nested)
        seen["device_batch"] += w.device_batch
        seen["free_across_streams"] += any(w.streams[p] != w.streams[c] for p, (c, _) in w.frees.items())
        seen["deep"] += max(w.stages.values()) >= 2
    assert all(seen.values()), seen


def test_device_lag_stays_within_the_bound():
    worst, error = check_device_lag(lag=1)
    assert error is None and worst <= 1


def test_a_hung_kernel_at_teardown_leaves_the_task_error_and_never_blocks():
    error, hangs, kept = check_teardown_hang()
    assert isinstance(error, PipelineTaskError) and isinstance(error.__cause__, ValueError), repr(error)
    assert (error.task, error.iteration) == ("Step", 2)
    assert hangs == [] and kept > 0  # polled, never blocked; the contexts stay alive while the kernel may run
