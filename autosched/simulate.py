"""Discrete-event simulation of the engine's execution semantics (ARCHITECTURE.md, "Execution semantics").

What is modelled, exactly as the engine does it:

* **Main thread.** ``fill_pipeline`` enqueues periods ``0 .. depth-1`` at time 0;
  each ``progress()`` waits until the oldest in-flight iteration has completed
  on the CPU side (every task's CPU signal set), then enqueues the next period.
  Period ``p`` runs every task ``T`` on iteration ``p - stage(T)``. The main
  thread costs nothing unless ``period_overhead_s`` is given.
* **Thread groups.** One worker per group takes tasks from its FIFO queue in
  enqueue order. A taken task holds the worker while it waits: Phase 1, the
  CPU signals of its dependencies for the iterations they concern; then, if
  ``globally_ordered``, its sequencer turn (tickets in enqueue order; the
  turn is held while the task's host part runs). Its host time runs on the
  thread; its CPU signal is set at the end of the host part.
* **Devices (``device="cuda"``).** At the end of its host part a task's device
  part is submitted to its stream, a FIFO; it starts after the work ahead of
  it on that stream and after the device completion of every dependency
  (``wait_event``). CPU completion is not device completion: ``progress()``
  waits CPU signals only. A task without device time still records an event
  on its stream, so it completes when the stream reaches it.
* **CPU (``device="cpu"``).** A stream is only a name; a task's whole cost
  (``host_s + device_s``) is host time on its thread.
* **Resources.** Tasks tagged ``comm:<name>`` serialise on that communicator
  (on CUDA in submission order, even across streams); tasks tagged ``pcie``
  run one at a time (the same total bus time as fair sharing).

The result has every (task, iteration) on its thread and stream
(:class:`~swpipe_core.trace.TimelineEvent`), the steady-state period, each
iteration's latency (from its batch entering the pipeline to its completion),
utilisation and idle time per thread group, stream, communicator and PCIe,
what made each task wait (its binding dependency, FIFO, sequencer or
resource), and the critical cycle: the chain of binding waits that repeats
every iteration in steady state. The simulation is deterministic.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from swpipe_core.order import enqueue_order
from swpipe_core.plan import PipelinePlan, ref_name
from swpipe_core.trace import TimelineEvent, to_chrome_trace, write_chrome_trace
from swpipe_core.validate import validate

from .costs import CostModel

__all__ = ["simulate", "SimResult", "Stall", "CriticalCycle", "SimDeadlock"]

_HOST_END, _DEV_END, _ENQUEUE = 0, 1, 2


class SimDeadlock(RuntimeError):
    """The simulated plan stopped making progress (every worker waits on something that never comes)."""


@dataclass(frozen=True)
class Stall:
    """One wait of one task instance.

    ``part`` is ``"host"`` (waiting on its thread) or ``"device"`` (waiting on its
    stream); ``cause`` names what it waited for: ``"fifo:<group>"`` (queued behind
    earlier tasks of its thread group), ``"dep:<task>"`` / ``"dep:<task>[i-N]"``
    (a CPU signal), ``"sequencer"``, ``"comm:<name>"``, ``"pcie"``,
    ``"stream:<name>"`` (device FIFO) or ``"event:<task>"`` (a device event).
    """

    task: str
    iteration: int
    part: str
    cause: str
    seconds: float


@dataclass(frozen=True)
class CriticalCycle:
    """The chain of binding waits that repeats in steady state.

    ``steps`` run forward in time: ``(task, part, iteration, via)`` where ``via`` is
    the kind of wait that let the *next* step start (``"thread:<g>"``,
    ``"stream:<s>"``, ``"dep:<t>"``, ``"event:<t>"``, ``"submit"``,
    ``"barrier"``, ``"sequencer"``, ``"comm:<c>"``, ``"pcie"``). The chain spans
    ``iterations`` iterations in ``seconds``; ``ratio = seconds / iterations``.
    """

    steps: Tuple[Tuple[str, str, int, str], ...]
    iterations: int
    seconds: float

    @property
    def ratio(self) -> float:
        """Seconds per iteration along the cycle."""
        return self.seconds / self.iterations if self.iterations else math.inf

    @property
    def kinds(self) -> Tuple[str, ...]:
        """The kinds of wait along the cycle."""
        return tuple(s[3] for s in self.steps)

    def __str__(self) -> str:
        if not self.steps:
            return "(no cycle)"
        base = self.steps[-1][2]
        parts = []
        for task, part, it, via in self.steps:
            off = it - base
            tag = f"{task}{'' if part == 'host' else '@dev'}[i{off:+d}]" if off else f"{task}{'' if part == 'host' else '@dev'}[i]"
            parts.append(f"{tag} -{via}->")
        return " ".join(parts) + f" (repeats every {self.iterations} iteration(s), {self.ratio * 1e3:.3f} ms/iter)"


@dataclass
class SimResult:
    """What :func:`simulate` predicts for a plan.

    Attributes
    ----------
    period : float
        Steady-state seconds per iteration.
    latency : float
        Mean steady-state seconds from an iteration's batch entering the pipeline
        (its first period enqueued) to its completion (CPU signals, and on CUDA
        device completion). On a device-bound CUDA plan the host runs ahead (the
        engine waits CPU signals only), so this grows with the iteration index.
    latencies : list of float
        Per iteration.
    completion, entry : list of float
        Per iteration: completion time and entry time.
    events : list of TimelineEvent
        Every host part on its thread group, and (CUDA) every device part with
        device time on its stream.
    utilisation : dict
        ``{resource: busy fraction}`` over the steady-state window, resources named
        ``"thread:<group>"``, ``"stream:<name>"`` (CUDA), ``"comm:<name>"``, ``"pcie"``.
    idle : dict
        ``{resource: idle seconds per iteration}`` over the same window.
    stalls : list of Stall
        Every wait of every task instance (positive waits only).
    critical_cycle : CriticalCycle
        The repeating chain of binding waits.
    binding : str
        The saturated resource, else ``"progress barrier ..."`` or ``"recurrence ..."``
        naming the critical cycle.
    window : (int, int)
        First and last iteration of the steady-state window.
    """

    plan: PipelinePlan
    costs: CostModel
    device: str
    num_iterations: int
    period: float
    latency: float
    latencies: List[float]
    completion: List[float]
    entry: List[float]
    events: List[TimelineEvent]
    utilisation: Dict[str, float]
    idle: Dict[str, float]
    stalls: List[Stall]
    critical_cycle: CriticalCycle
    binding: str
    window: Tuple[int, int]

    @property
    def makespan(self) -> float:
        """Seconds until the last iteration completed."""
        return max(self.completion) if self.completion else 0.0

    def stall_summary(self, top: Optional[int] = None) -> List[Tuple[str, str, str, float]]:
        """Mean wait per steady-state iteration by ``(task, part, cause)``, largest first.

        Parameters
        ----------
        top : int, optional
            Keep only the largest ``top`` entries.

        Returns
        -------
        list of (task, part, cause, seconds per iteration)
        """
        w0, w1 = self.window
        span = max(1, w1 - w0 + 1)
        acc: Dict[Tuple[str, str, str], float] = {}
        for s in self.stalls:
            if w0 <= s.iteration <= w1:
                key = (s.task, s.part, s.cause)
                acc[key] = acc.get(key, 0.0) + s.seconds
        rows = sorted(((k[0], k[1], k[2], v / span) for k, v in acc.items()), key=lambda r: (-r[3], r[:3]))
        return rows[:top] if top is not None else rows

    def to_chrome_trace(self, name: str = "swpipe-sim") -> Dict[str, Any]:
        """The simulated timeline as Chrome/Perfetto trace JSON (same format as measured runs)."""
        return to_chrome_trace(self.events, name=name)

    def write_chrome_trace(self, path: str, name: str = "swpipe-sim") -> str:
        """Write :meth:`to_chrome_trace` to ``path`` (open in https://ui.perfetto.dev)."""
        return write_chrome_trace(self.events, path, name=name)

    def summary(self) -> str:
        """A few readable lines: period, latency, binding, utilisation, top stalls."""
        lines = [
            f"simulated {self.num_iterations} iterations on {self.device}: period {self.period * 1e3:.3f} ms/iter, "
            f"latency {self.latency * 1e3:.3f} ms",
            f"binding: {self.binding}",
            "utilisation: " + ", ".join(f"{k} {v:.0%}" for k, v in sorted(self.utilisation.items(), key=lambda kv: -kv[1])),
        ]
        top = self.stall_summary(top=5)
        if top:
            lines.append("largest waits per iteration: " + ", ".join(
                f"{t}{'' if p == 'host' else '@dev'} on {c} {s * 1e3:.3f} ms" for t, p, c, s in top))
        return "\n".join(lines)

    def to_dataframe(self) -> Any:
        """The events as a pandas DataFrame (pandas imported here)."""
        import pandas as pd

        return pd.DataFrame([e.__dict__ for e in self.events])


# -- the simulation -----------------------------------------------------------------------------------------------


class _Sim:
    """State of one simulation run; integers everywhere, one heap of events."""

    def __init__(self, plan: PipelinePlan, costs: CostModel, n: int, cuda: bool,
                 task_overhead_s: float, period_overhead_s: float) -> None:
        self.plan, self.n, self.cuda = plan, n, cuda
        names = plan.task_names
        self.names = names
        idx = {name: k for k, name in enumerate(names)}
        self.order = [idx[name] for name in enqueue_order(plan)]
        sched = [plan.sched(name) for name in names]
        self.stage = [s.stage for s in sched]
        self.depth = plan.pipeline_depth
        groups = sorted({s.thread_group for s in sched})
        self.group_names = groups
        self.thread = [groups.index(s.thread_group) for s in sched]
        streams = sorted({plan.stream_of(name) for name in names})
        self.stream_names = streams
        self.stream = [streams.index(plan.stream_of(name)) for name in names]
        self.seqd = [bool(s.globally_ordered) for s in sched]
        tc = [costs[name] for name in names]
        if cuda:
            self.host = [c.host_s + task_overhead_s for c in tc]
            self.dev = [c.device_s for c in tc]
        else:
            self.host = [c.cpu_s + task_overhead_s for c in tc]
            self.dev = [0.0] * len(tc)
        res_names = sorted({r for c in tc for r in c.resources})
        self.res_names = res_names
        self.res = [tuple(res_names.index(r) for r in c.resources) for c in tc]
        self.period_overhead = period_overhead_s
        deps: List[List[Tuple[int, int]]] = [[] for _ in names]
        labels: List[List[str]] = [[] for _ in names]
        for t, d in plan.intra_edges():
            deps[idx[t]].append((idx[d], 0))
            labels[idx[t]].append(d)
        for t, d, dist in plan.inter_edges():
            deps[idx[t]].append((idx[d], dist))
            labels[idx[t]].append(f"{d}[i-{dist}]")
        self.deps = deps
        self.dep_labels = labels
        T = len(names)
        self.T = T
        N = T * n
        self.host_start = [-1.0] * N
        self.host_end = [-1.0] * N
        self.dev_start = [-1.0] * N
        self.dev_end = [-1.0] * N
        self.enq = [-1.0] * N
        self.enq_pred = [-1] * N
        self.ticket: Dict[int, int] = {}
        # predecessor (op id, kind) per op: host op = inst, device op = N + inst
        self.pred_op = [-1] * (2 * N)
        self.pred_kind: List[str] = [""] * (2 * N)
        self.stalls: List[Stall] = []
        self.events_host: List[Tuple[int, float, float]] = []
        self.events_dev: List[Tuple[int, float, float]] = []
        G = len(groups)
        self.queue = [deque() for _ in range(G)]
        self.cur = [-1] * G
        self.busy = [False] * G
        self.free_t = [0.0] * G
        self.free_op = [-1] * G
        S = len(streams)
        self.squeue = [deque() for _ in range(S)]
        self.sbusy = [False] * S
        self.sfree_t = [0.0] * S
        self.sfree_op = [-1] * S
        self.running = [-1] * S
        R = len(res_names)
        self.rbusy = [False] * R
        self.rfree_t = [0.0] * R
        self.rfree_op = [-1] * R
        self.rwait: List[List[Tuple[str, int]]] = [[] for _ in range(R)]
        self.comm = [r.startswith("comm:") for r in res_names]
        self.rqueue = [deque() for _ in range(R)]  # CUDA: submission order per communicator
        self.waiters: Dict[int, List[Tuple[str, int]]] = {}
        self.dwaiters: Dict[int, List[int]] = {}
        self.seq_next = 0
        self.seq_issued = 0
        self.seq_free_t = 0.0
        self.seq_free_op = -1
        self.seq_waiter: Dict[int, int] = {}
        self.remaining = [T] * n
        self.cpu_done = [-1.0] * n
        self.retire_op = [-1] * n
        self.next_retire = 0
        self.main_t = 0.0
        self.entry = [-1.0] * n
        self.heap: List[Tuple[float, int, int, int]] = []
        self.counter = 0

    # -- events --

    def push(self, t: float, kind: int, arg: int) -> None:
        self.counter += 1
        heapq.heappush(self.heap, (t, self.counter, kind, arg))

    def run(self) -> None:
        total_periods = self.n + self.depth - 1
        for p in range(min(self.depth, total_periods)):
            self.main_t += self.period_overhead
            self.push(self.main_t, _ENQUEUE, p)
        heap = self.heap
        while heap:
            t, _, kind, arg = heapq.heappop(heap)
            if kind == _HOST_END:
                self.host_done(arg, t)
            elif kind == _DEV_END:
                self.dev_done(arg, t)
            else:
                self.enqueue(arg, t)
        if self.next_retire < self.n or (self.cuda and any(e < 0 for e in self.dev_end)):
            raise SimDeadlock(self.describe_block())

    def describe_block(self) -> str:
        parts = []
        for g, inst in enumerate(self.cur):
            if inst >= 0:
                k, i = divmod(inst, self.n)
                parts.append(f"thread {self.group_names[g]} holds {self.names[k]}(iter {i})")
        for s, q in enumerate(self.squeue):
            if q:
                k, i = divmod(q[0], self.n)
                parts.append(f"stream {self.stream_names[s]} head {self.names[k]}(iter {i})")
        return ("the simulated plan deadlocked at iteration "
                f"{self.next_retire}: " + ("; ".join(parts) or "nothing is runnable") +
                ". validate(plan) should have rejected it; please report this plan")

    def enqueue(self, p: int, t: float) -> None:
        n = self.n
        pred = self.retire_op[p - self.depth] if p >= self.depth else -1
        touched = []
        if 0 <= p < n:
            self.entry[p] = t
        for k in self.order:
            i = p - self.stage[k]
            if 0 <= i < n:
                inst = k * n + i
                self.enq[inst] = t
                self.enq_pred[inst] = pred
                if self.seqd[k]:
                    self.ticket[inst] = self.seq_issued
                    self.seq_issued += 1
                g = self.thread[k]
                self.queue[g].append(inst)
                if g not in touched:
                    touched.append(g)
        for g in touched:
            self.try_host(g, t)

    # -- host side --

    def try_host(self, g: int, now: float) -> None:
        if self.busy[g]:
            return
        inst = self.cur[g]
        if inst < 0:
            if not self.queue[g]:
                return
            inst = self.queue[g].popleft()
            self.cur[g] = inst
        n = self.n
        k, i = divmod(inst, n)
        host_end = self.host_end
        for d, dist in self.deps[k]:
            j = i - dist
            if j >= 0:
                key = d * n + j
                if host_end[key] < 0:
                    self.waiters.setdefault(key, []).append(("h", g))
                    return
        if self.seqd[k] and self.ticket[inst] != self.seq_next:
            self.seq_waiter[self.ticket[inst]] = g
            return
        if not self.cuda and self.res[k]:
            for r in self.res[k]:
                if self.rbusy[r]:
                    if ("h", g) not in self.rwait[r]:
                        self.rwait[r].append(("h", g))
                    return
            for r in self.res[k]:
                self.rbusy[r] = True
        self.start_host(g, inst, k, i, now)

    def start_host(self, g: int, inst: int, k: int, i: int, now: float) -> None:
        n = self.n
        self.busy[g] = True
        self.host_start[inst] = now
        # binding predecessor: the latest of the constraints that held the start back
        cands = [(self.enq[inst], 0, self.enq_pred[inst], "barrier"),
                 (self.free_t[g], 1, self.free_op[g], f"thread:{self.group_names[g]}")]
        for (d, dist), label in zip(self.deps[k], self.dep_labels[k]):
            j = i - dist
            if j >= 0:
                key = d * n + j
                cands.append((self.host_end[key], 4, key, f"dep:{label}"))
        if self.seqd[k]:
            cands.append((self.seq_free_t, 3, self.seq_free_op, "sequencer"))
        if not self.cuda:
            for r in self.res[k]:
                cands.append((self.rfree_t[r], 2, self.rfree_op[r], self.res_names[r]))
        t_b, _, op, kind = max(cands, key=lambda c: (c[0], c[1]))
        self.pred_op[inst] = op
        self.pred_kind[inst] = kind
        enq = self.enq[inst]
        fifo_end = max(enq, self.free_t[g])
        if fifo_end > enq:
            self.stalls.append(Stall(self.names[k], i, "host", f"fifo:{self.group_names[g]}", fifo_end - enq))
        if now > fifo_end and kind not in ("barrier",) and not kind.startswith("thread:"):
            self.stalls.append(Stall(self.names[k], i, "host", kind, now - fifo_end))
        self.push(now + self.host[k], _HOST_END, g)

    def host_done(self, g: int, t: float) -> None:
        inst = self.cur[g]
        n = self.n
        k, i = divmod(inst, n)
        self.host_end[inst] = t
        self.events_host.append((inst, self.host_start[inst], t))
        self.cur[g] = -1
        self.busy[g] = False
        self.free_t[g] = t
        self.free_op[g] = inst
        wake: List[Tuple[str, int]] = self.waiters.pop(inst, [])
        if self.seqd[k]:
            self.seq_next += 1
            self.seq_free_t = t
            self.seq_free_op = inst
            w = self.seq_waiter.pop(self.seq_next, None)
            if w is not None:
                wake.append(("h", w))
        if not self.cuda:
            for r in self.res[k]:
                self.rbusy[r] = False
                self.rfree_t[r] = t
                self.rfree_op[r] = inst
                wake.extend(self.rwait[r])
                self.rwait[r] = []
        else:
            s = self.stream[k]
            self.squeue[s].append(inst)
            for r in self.res[k]:
                if self.comm[r]:
                    self.rqueue[r].append(inst)
        # retire bookkeeping (CPU signals only, as progress() does)
        self.remaining[i] -= 1
        if self.remaining[i] == 0:
            self.cpu_done[i] = t
            self.retire_op[i] = inst
            total_periods = self.n + self.depth - 1
            while self.next_retire < self.n and self.cpu_done[self.next_retire] >= 0:
                p = self.next_retire + self.depth
                if p < total_periods:
                    self.main_t = max(self.main_t, self.cpu_done[self.next_retire]) + self.period_overhead
                    self.push(self.main_t, _ENQUEUE, p)
                self.next_retire += 1
        for kind, x in wake:
            if kind == "h":
                self.try_host(x, t)
            else:
                self.try_stream(x, t)
        self.try_host(g, t)
        if self.cuda:
            self.try_stream(self.stream[k], t)

    # -- device side --

    def try_stream(self, s: int, now: float) -> None:
        if self.sbusy[s] or not self.squeue[s]:
            return
        inst = self.squeue[s][0]
        n = self.n
        k, i = divmod(inst, n)
        dev_end = self.dev_end
        for d, dist in self.deps[k]:
            j = i - dist
            if j >= 0:
                key = d * n + j
                if dev_end[key] < 0:
                    self.dwaiters.setdefault(key, []).append(s)
                    return
        for r in self.res[k]:
            busy = self.rbusy[r] or (self.comm[r] and self.rqueue[r][0] != inst)
            if busy:
                if ("d", s) not in self.rwait[r]:
                    self.rwait[r].append(("d", s))
                return
        for r in self.res[k]:
            self.rbusy[r] = True
            if self.comm[r]:
                self.rqueue[r].popleft()
        self.squeue[s].popleft()
        self.sbusy[s] = True
        self.running[s] = inst
        self.dev_start[inst] = now
        N = self.T * n
        cands = [(self.host_end[inst], 0, inst, "submit"),
                 (self.sfree_t[s], 1, N + self.sfree_op[s] if self.sfree_op[s] >= 0 else -1,
                  f"stream:{self.stream_names[s]}")]
        for (d, dist), label in zip(self.deps[k], self.dep_labels[k]):
            j = i - dist
            if j >= 0:
                key = d * n + j
                cands.append((dev_end[key], 3, N + key, f"event:{label}"))
        for r in self.res[k]:
            op = self.rfree_op[r]
            cands.append((self.rfree_t[r], 2, N + op if op >= 0 else -1, self.res_names[r]))
        _, _, op, kind = max(cands, key=lambda c: (c[0], c[1]))
        self.pred_op[N + inst] = op
        self.pred_kind[N + inst] = kind
        sub = self.host_end[inst]
        if now > sub:
            self.stalls.append(Stall(self.names[k], i, "device", kind, now - sub))
        self.push(now + self.dev[k], _DEV_END, s)

    def dev_done(self, s: int, t: float) -> None:
        inst = self.running[s]
        k, i = divmod(inst, self.n)
        self.dev_end[inst] = t
        if self.dev[k] > 0:
            self.events_dev.append((inst, self.dev_start[inst], t))
        self.sbusy[s] = False
        self.sfree_t[s] = t
        self.sfree_op[s] = inst
        self.running[s] = -1
        wake: List[Tuple[str, int]] = [("d", x) for x in self.dwaiters.pop(inst, [])]
        for r in self.res[k]:
            self.rbusy[r] = False
            self.rfree_t[r] = t
            self.rfree_op[r] = inst
            wake.extend(self.rwait[r])
            self.rwait[r] = []
        for _, x in wake:
            self.try_stream(x, t)
        self.try_stream(s, t)


# -- measuring the result -----------------------------------------------------------------------------------------


def _window(n: int, depth: int) -> Tuple[int, int]:
    """Iterations whose periods are all full (no fill, no drain), skipping a warm-up quarter."""
    w1 = n - depth if n - depth >= 1 else n - 1
    w0 = max(depth, n // 4)
    if w1 - w0 < 2:
        w0 = max(0, min(w0, w1 - 2))
    return w0, w1


def _steady_period(c: Sequence[float], w0: int, w1: int) -> float:
    """Seconds per iteration in steady state: exact when the tail of the window is periodic.

    Completion times of a pipeline settle into ``c[i + k] = c[i] + k * period`` for
    some cyclicity ``k``; the smallest ``k`` for which the last half of the window
    fits gives the period exactly, else the window's average is used.
    """
    span = w1 - w0
    if span <= 0:
        return c[-1] - c[0] if len(c) > 1 else c[0]
    mid = w0 + span // 2
    for k in range(1, min(8, (w1 - mid) // 2) + 1):
        ref = c[mid + k] - c[mid]
        tol = 1e-9 * max(1.0, abs(ref)) + 1e-12
        if all(abs((c[i + k] - c[i]) - ref) <= tol for i in range(mid, w1 - k + 1)):
            return ref / k
    return (c[w1] - c[w0]) / span


def _busy(intervals: List[Tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in intervals)


def _critical_cycle(sim: _Sim, start_op: int) -> CriticalCycle:
    """Follow binding predecessors back from ``start_op`` until a (task, part) repeats at an earlier iteration."""
    n, N = sim.n, sim.T * sim.n
    seen: Dict[Tuple[int, int], int] = {}
    path: List[Tuple[int, str]] = []  # (op, kind of wait that let it start)
    op = start_op
    limit = 2 * N + 2
    while op >= 0 and len(path) < limit:
        part = 1 if op >= N else 0
        inst = op - N if part else op
        k, i = divmod(inst, n)
        key = (k, part)
        if key in seen:
            j = seen[key]
            i0 = divmod((path[j][0] - N if path[j][0] >= N else path[j][0]), n)[1]
            if i0 > i:
                seg = path[j:]  # from the later visit back to just before this one
                end_later = sim.dev_end[path[j][0] - N] if path[j][0] >= N else sim.host_end[path[j][0]]
                end_earlier = sim.dev_end[inst] if part else sim.host_end[inst]
                steps = []
                # forward in time: this (earlier) op, then seg reversed up to the later op
                chain = [(op, sim.pred_kind[op])] + list(reversed(seg[1:]))
                for (o, _), nxt in zip(chain, chain[1:] + [path[j]]):
                    pp = 1 if o >= N else 0
                    kk, ii = divmod(o - N if pp else o, n)
                    steps.append((sim.names[kk], "device" if pp else "host", ii, sim.pred_kind[nxt[0]]))
                return CriticalCycle(tuple(steps), i0 - i, end_later - end_earlier)
        seen[key] = len(path)
        path.append((op, sim.pred_kind[op]))
        op = sim.pred_op[op]
    return CriticalCycle((), 0, 0.0)


def simulate(plan: PipelinePlan, costs: CostModel, num_iterations: int = 50, device: str = "cpu", *,
             task_overhead_s: float = 0.0, period_overhead_s: float = 0.0) -> SimResult:
    """Simulate a plan with a cost model under the engine's execution semantics.

    Parameters
    ----------
    plan : PipelinePlan
        Validated first (:func:`swpipe_core.validate.validate`); may be unbound.
    costs : CostModel
        Must cost every task of the plan.
    num_iterations : int
        Iterations to run (>= 2); the period is measured on the full periods after
        a warm-up quarter.
    device : {"cpu", "cuda"}
        ``"cpu"``: all of a task's cost is host time. ``"cuda"``: ``host_s`` on the
        thread, ``device_s`` on the stream.
    task_overhead_s : float
        Engine overhead added to every task's host part (queue hand-off, signals).
    period_overhead_s : float
        Main-thread time per enqueued period.

    Returns
    -------
    SimResult

    Raises
    ------
    swpipe_core.validate.PlanError
        If the plan breaks a rule.
    autosched.costs.CostModelError
        If a task has no cost.
    ValueError
        For ``num_iterations < 2`` or an unknown device.
    SimDeadlock
        If the simulated run stops making progress (a validated plan never does).

    Examples
    --------
    Two tasks on two threads overlap across iterations (period = the longer);
    on one thread they add up:

    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> from autosched.costs import CostModel, TaskCost
    >>> costs = CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002)})
    >>> two = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
    ...                    intra_iter_deps=[("B", "A")])
    >>> r = simulate(two, costs)
    >>> round(r.period * 1e3, 6), r.binding
    (2.0, 'thread:b')
    >>> one = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, intra_iter_deps=[("B", "A")])
    >>> round(simulate(one, costs).period * 1e3, 6)
    3.0
    """
    validate(plan)
    costs.check(plan)
    if not isinstance(num_iterations, int) or num_iterations < 2:
        raise ValueError(f"num_iterations={num_iterations!r}: the period needs at least 2 iterations")
    dev = str(device)
    if dev not in ("cpu",) and not dev.startswith("cuda"):
        raise ValueError(f"device={device!r}: use 'cpu' (all time on the host) or 'cuda' (host + device streams)")
    for name, value in (("task_overhead_s", task_overhead_s), ("period_overhead_s", period_overhead_s)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name}={value!r}: use a time >= 0 in seconds")
    cuda = dev.startswith("cuda")
    n = num_iterations
    sim = _Sim(plan, costs, n, cuda, float(task_overhead_s), float(period_overhead_s))
    sim.run()

    T, names = sim.T, sim.names
    completion = list(sim.cpu_done)
    last_op = [sim.retire_op[i] for i in range(n)]
    if cuda:
        N = T * n
        for i in range(n):
            for k in range(T):
                inst = k * n + i
                if sim.dev_end[inst] > completion[i]:
                    completion[i] = sim.dev_end[inst]
                    last_op[i] = N + inst
    w0, w1 = _window(n, sim.depth)
    period = _steady_period(completion, w0, w1)
    latencies = [completion[i] - sim.entry[i] for i in range(n)]
    win = latencies[w0:w1 + 1]
    latency = sum(win) / len(win)

    events: List[TimelineEvent] = []
    intervals: Dict[str, List[Tuple[float, float]]] = {}
    for inst, s, e in sim.events_host:
        k, i = divmod(inst, n)
        g = sim.group_names[sim.thread[k]]
        events.append(TimelineEvent(names[k], i, g, sim.stream_names[sim.stream[k]], s, e, "host"))
        intervals.setdefault(f"thread:{g}", []).append((s, e))
        if not cuda:
            for r in sim.res[k]:
                intervals.setdefault(sim.res_names[r], []).append((s, e))
    for inst, s, e in sim.events_dev:
        k, i = divmod(inst, n)
        st = sim.stream_names[sim.stream[k]]
        events.append(TimelineEvent(names[k], i, sim.group_names[sim.thread[k]], st, s, e, "device"))
        intervals.setdefault(f"stream:{st}", []).append((s, e))
        for r in sim.res[k]:
            intervals.setdefault(sim.res_names[r], []).append((s, e))
    events.sort(key=lambda e: (e.start, e.kind, e.thread_group if e.kind == "host" else e.stream))
    for g in sim.group_names:
        intervals.setdefault(f"thread:{g}", [])
    if cuda:
        for st in sim.stream_names:
            intervals.setdefault(f"stream:{st}", [])
    lo, hi = completion[w0], completion[w1]
    width = hi - lo
    utilisation: Dict[str, float] = {}
    idle: Dict[str, float] = {}
    for name, iv in sorted(intervals.items()):
        u = _busy(iv, lo, hi) / width if width > 0 else 0.0
        utilisation[name] = u
        idle[name] = (1.0 - u) * period

    cycle = _critical_cycle(sim, last_op[w1])
    top = max(utilisation.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0.0))
    if top[1] >= 1.0 - 1e-6:
        binding = top[0]
    elif "barrier" in cycle.kinds:
        binding = f"progress barrier (depth {sim.depth}): {cycle}"
    else:
        binding = f"recurrence: {cycle}"
    return SimResult(plan=plan, costs=costs, device="cuda" if cuda else "cpu", num_iterations=n, period=period,
                     latency=latency, latencies=latencies, completion=completion, entry=list(sim.entry),
                     events=events, utilisation=utilisation, idle=idle, stalls=sim.stalls, critical_cycle=cycle,
                     binding=binding, window=(w0, w1))
