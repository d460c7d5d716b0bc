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
every iteration in steady state. The simulation is deterministic. A run too
short to show the steady state (a queue that grows slowly binds only after
many iterations) is lengthened until its period reaches the busiest
resource's work per iteration, which no steady state beats.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from swpipe_core.order import enqueue_order
from swpipe_core.plan import PipelinePlan, ref_name
from swpipe_core.trace import TimelineEvent, to_chrome_trace, write_chrome_trace
from swpipe_core.validate import validate

from .costs import CostModel

__all__ = ["simulate", "SimResult", "Stall", "CriticalCycle", "SimDeadlock"]

_HOST_END, _DEV_END, _ENQUEUE = 0, 1, 2
_MIN_WINDOW = 8  # iterations in the steady-state window before the run is lengthened
_LOAD_RTOL = 1e-9  # a period this much (relative) below the busiest resource's load is rounding, not a transient
_MAX_TASK_ITERATIONS = 200_000


class SimDeadlock(RuntimeError):
    """The simulated plan stopped making progress (every worker waits on something that never comes)."""


class Stall(NamedTuple):
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

        def node(task: str, part: str, it: int) -> str:
            off = f"{it - base:+d}" if it != base else ""
            return f"{task}{'' if part == 'host' else '@dev'}[i{off}]"

        parts = [f"{node(task, part, it)} -{via}->" for task, part, it, via in self.steps]
        first = self.steps[0]
        parts.append(node(first[0], first[1], first[2] + self.iterations))
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
        ``{resource: busy fraction}`` in steady state (busy time per iteration over the
        period), resources named ``"thread:<group>"``, ``"stream:<name>"`` (CUDA),
        ``"comm:<name>"``, ``"pcie"`` and ``"sequencer"`` (host time of globally
        ordered tasks, which hold the turn while they run).
    idle : dict
        ``{resource: idle seconds per iteration}`` over the same window.
    stalls : list of Stall
        Every wait of every task instance (positive waits only).
    critical_cycle : CriticalCycle
        The repeating chain of binding waits.
    binding : str
        The saturated resource (``"thread:<g>"``, ``"stream:<s>"``, ``"comm:<c>"``,
        ``"pcie"``, ``"sequencer"``), else the critical cycle:
        ``"progress barrier (depth d): ..."`` if it passes the retire barrier,
        ``"recurrence: ..."`` if it is made of data dependencies only, else
        ``"cycle: ..."`` (dependencies chained with FIFO or resource order).
    window : (int, int)
        First and last iteration of the steady-state window.

    Examples
    --------
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> from autosched.costs import CostModel, TaskCost
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(0, thread_group="a")})
    >>> r = simulate(plan, CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002)}), num_iterations=20)
    >>> print(r.summary())
    simulated 20 iterations on cpu: period 3.000 ms/iter, latency 3.000 ms
    binding: thread:a
    utilisation: thread:a 100%
    largest waits per iteration: B on fifo:a 1.000 ms
    >>> [(t, part, cause, round(sec, 9)) for t, part, cause, sec in r.stall_summary(top=1)]
    [('B', 'host', 'fifo:a', 0.001)]
    >>> sorted({e["name"] for e in r.to_chrome_trace()["traceEvents"] if e["ph"] == "M"})
    ['process_name', 'thread_name', 'thread_sort_index']
    >>> len(r.to_dataframe()) == 2 * r.num_iterations
    True
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
    def memory(self) -> Any:
        """Predicted live bytes over the run (:func:`autosched.memory.predict_memory`; needs the costs' bytes)."""
        from .memory import predict_memory

        return predict_memory(self)

    @property
    def peak_bytes(self) -> float:
        """Most bytes in flight at any instant (``memory.peak_bytes``)."""
        return self.memory.peak_bytes

    @property
    def mean_bytes(self) -> float:
        """Time-weighted mean bytes in flight in steady state (``memory.mean_bytes``)."""
        return self.memory.mean_bytes

    @property
    def latency_growth(self) -> float:
        """Seconds per iteration by which latency grows over the window (> 0: the host runs ahead of the device)."""
        w0, w1 = self.window
        return (self.latencies[w1] - self.latencies[w0]) / (w1 - w0) if w1 > w0 else 0.0

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
        growth = self.latency_growth
        ahead = (f" (host runs ahead of the device: latency grows {growth * 1e3:.3f} ms per iteration)"
                 if growth > 1e-6 * max(self.period, 1e-12) else "")
        lines = [
            f"simulated {self.num_iterations} iterations on {self.device}: period {self.period * 1e3:.3f} ms/iter, "
            f"latency {self.latency * 1e3:.3f} ms{ahead}",
            f"binding: {self.binding}",
            "utilisation: " + ", ".join(f"{k} {v:.0%}" for k, v in
                                        sorted(self.utilisation.items(), key=lambda kv: -kv[1])),
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
    """State of one simulation run: integers and flat lists everywhere, one heap of events.

    A task instance ``(task k, iteration i)`` is the integer ``k * n + i``; its host
    part is op ``inst`` and its device part op ``T * n + inst``. For every op the
    binding predecessor (the op whose end let it start) and the kind of that wait
    are kept, which is what :func:`_critical_cycle` walks back.
    """

    def __init__(self, plan: PipelinePlan, costs: CostModel, n: int, cuda: bool,
                 task_overhead_s: float, period_overhead_s: float) -> None:
        self.n, self.cuda = n, cuda
        names = plan.task_names
        self.names = names
        idx = {name: k for k, name in enumerate(names)}
        self.order = [idx[name] for name in enqueue_order(plan)]
        sched = [plan.sched(name) for name in names]
        self.stage = [s.stage for s in sched]
        self.depth = plan.pipeline_depth
        self.group_names = sorted({s.thread_group for s in sched})
        self.thread = [self.group_names.index(s.thread_group) for s in sched]
        self.thread_label = [f"thread:{g}" for g in self.group_names]
        self.fifo_label = [f"fifo:{g}" for g in self.group_names]
        self.stream_names = sorted({plan.stream_of(name) for name in names})
        self.stream = [self.stream_names.index(plan.stream_of(name)) for name in names]
        self.stream_label = [f"stream:{st}" for st in self.stream_names]
        self.seqd = [bool(s.globally_ordered) for s in sched]
        tc = [costs[name] for name in names]
        if cuda:
            self.host = [c.host_s + task_overhead_s for c in tc]
            self.dev = [c.device_s for c in tc]
        else:
            self.host = [c.cpu_s + task_overhead_s for c in tc]
            self.dev = [0.0] * len(tc)
        self.res_names = sorted({r for c in tc for r in c.resources})
        self.res = [tuple(self.res_names.index(r) for r in c.resources) for c in tc]
        self.comm = [r.startswith("comm:") for r in self.res_names]
        self.period_overhead = period_overhead_s
        # deps[k]: (dep task, distance, label of the CPU-signal wait, label of the device-event wait)
        self.deps: List[List[Tuple[int, int, str, str]]] = [[] for _ in names]
        for t, d in plan.intra_edges():
            self.deps[idx[t]].append((idx[d], 0, f"dep:{d}", f"event:{d}"))
        for t, d, dist in plan.inter_edges():
            self.deps[idx[t]].append((idx[d], dist, f"dep:{d}[i-{dist}]", f"event:{d}[i-{dist}]"))
        T = self.T = len(names)
        N = T * n
        self.host_start = [-1.0] * N
        self.host_end = [-1.0] * N
        self.dev_start = [-1.0] * N
        self.dev_end = [-1.0] * N
        self.enq = [-1.0] * N
        self.enq_pred = [-1] * N
        self.ticket: Dict[int, int] = {}
        self.pred_op = [-1] * (2 * N)
        self.pred_kind: List[str] = [""] * (2 * N)
        self.stalls: List[Stall] = []
        self.events_host: List[Tuple[int, float, float]] = []
        self.events_dev: List[Tuple[int, float, float]] = []
        G = len(self.group_names)
        self.queue: List[deque] = [deque() for _ in range(G)]
        self.cur = [-1] * G
        self.busy = [False] * G
        self.free_t = [0.0] * G
        self.free_op = [-1] * G
        S = len(self.stream_names)
        self.squeue: List[deque] = [deque() for _ in range(S)]
        self.sbusy = [False] * S
        self.sfree_t = [0.0] * S
        self.sfree_op = [-1] * S
        self.running = [-1] * S
        R = len(self.res_names)
        self.rbusy = [False] * R
        self.rfree_t = [0.0] * R
        self.rfree_op = [-1] * R
        self.rwait: List[List[Tuple[bool, int]]] = [[] for _ in range(R)]
        self.rqueue: List[deque] = [deque() for _ in range(R)]  # CUDA: submission order per communicator
        self.waiters: Dict[int, List[int]] = {}   # CPU signal -> waiting thread groups
        self.dwaiters: Dict[int, List[int]] = {}  # device event -> waiting streams
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

    def busiest_load(self) -> float:
        """Seconds per iteration that the busiest resource must work: no steady period is shorter.

        Every iteration runs every task once, so each thread group, stream (CUDA),
        communicator, PCIe, the sequencer and the main thread (``period_overhead_s``
        per period) is held this long per iteration, whatever the order.
        """
        thread = [0.0] * len(self.group_names)
        stream = [0.0] * len(self.stream_names)
        res = [0.0] * len(self.res_names)
        sequencer = 0.0
        for k in range(self.T):
            thread[self.thread[k]] += self.host[k]
            stream[self.stream[k]] += self.dev[k]  # 0 on CPU, where a stream is only a name
            held = self.dev[k] if self.cuda else self.host[k]  # a resource is held by the part that uses it
            for r in self.res[k]:
                res[r] += held
            if self.seqd[k]:
                sequencer += self.host[k]
        return max(thread + stream + res + [sequencer, self.period_overhead])

    def push(self, t: float, kind: int, arg: int) -> None:
        self.counter += 1
        heapq.heappush(self.heap, (t, self.counter, kind, arg))

    def run(self) -> None:
        total_periods = self.n + self.depth - 1
        for p in range(min(self.depth, total_periods)):
            self.main_t += self.period_overhead
            self.push(self.main_t, _ENQUEUE, p)
        heap = self.heap
        pop = heapq.heappop
        while heap:
            t, _, kind, arg = pop(heap)
            if kind == _HOST_END:
                self.host_done(arg, t)
            elif kind == _DEV_END:
                self.dev_done(arg, t)
            else:
                self.enqueue(arg, t)
        if self.next_retire < self.n or (self.cuda and min(self.dev_end) < 0):
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
        return (f"the simulated plan stopped at iteration {self.next_retire}: "
                + ("; ".join(parts) or "nothing is runnable")
                + ". validate(plan) should have rejected it; please report this plan")

    def enqueue(self, p: int, t: float) -> None:
        n = self.n
        pred = self.retire_op[p - self.depth] if p >= self.depth else -1
        touched: List[int] = []
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
        """Start the task at the head of thread ``g`` if Phase 1, the sequencer and resources allow."""
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
        for d, dist, _, _ in self.deps[k]:
            j = i - dist
            if j >= 0 and host_end[d * n + j] < 0:
                self.waiters.setdefault(d * n + j, []).append(g)
                return
        if self.seqd[k] and self.ticket[inst] != self.seq_next:
            self.seq_waiter[self.ticket[inst]] = g
            return
        res = self.res[k] if not self.cuda else ()
        for r in res:
            if self.rbusy[r]:
                if (True, g) not in self.rwait[r]:
                    self.rwait[r].append((True, g))
                return
        for r in res:
            self.rbusy[r] = True
        self.start_host(g, inst, k, i, res, now)

    def start_host(self, g: int, inst: int, k: int, i: int, res: Tuple[int, ...], now: float) -> None:
        n = self.n
        self.busy[g] = True
        self.host_start[inst] = now
        # the binding wait is the latest constraint; on ties: dep > sequencer > resource > thread > barrier
        enq = self.enq[inst]
        bt, bop, bkind = enq, self.enq_pred[inst], "barrier"
        ft = self.free_t[g]
        if ft >= bt:
            bt, bop, bkind = ft, self.free_op[g], self.thread_label[g]
        fifo_end = bt
        for r in res:
            if self.rfree_t[r] >= bt:
                bt, bop, bkind = self.rfree_t[r], self.rfree_op[r], self.res_names[r]
        if self.seqd[k] and self.seq_free_t >= bt:
            bt, bop, bkind = self.seq_free_t, self.seq_free_op, "sequencer"
        host_end = self.host_end
        for d, dist, label, _ in self.deps[k]:
            j = i - dist
            if j >= 0 and host_end[d * n + j] >= bt:
                bt, bop, bkind = host_end[d * n + j], d * n + j, label
        self.pred_op[inst] = bop
        self.pred_kind[inst] = bkind
        if fifo_end > enq:
            self.stalls.append(Stall(self.names[k], i, "host", self.fifo_label[g], fifo_end - enq))
        if now > fifo_end:
            self.stalls.append(Stall(self.names[k], i, "host", bkind, now - fifo_end))
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
        wake_threads = self.waiters.pop(inst, [])
        if self.seqd[k]:
            self.seq_next += 1
            self.seq_free_t = t
            self.seq_free_op = inst
            w = self.seq_waiter.pop(self.seq_next, None)
            if w is not None:
                wake_threads.append(w)
        if not self.cuda:
            for r in self.res[k]:
                self.rbusy[r] = False
                self.rfree_t[r] = t
                self.rfree_op[r] = inst
                wake_threads.extend(x for _, x in self.rwait[r])
                self.rwait[r] = []
        else:
            # the device part is submitted when the host part ends
            self.squeue[self.stream[k]].append(inst)
            for r in self.res[k]:
                if self.comm[r]:
                    self.rqueue[r].append(inst)
        # progress() waits CPU signals only: retire in order, then enqueue the next period
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
        for x in wake_threads:
            self.try_host(x, t)
        self.try_host(g, t)
        if self.cuda:
            self.try_stream(self.stream[k], t)

    # -- device side --

    def try_stream(self, s: int, now: float) -> None:
        """Start the device part at the head of stream ``s`` if its events and resources allow."""
        if self.sbusy[s] or not self.squeue[s]:
            return
        inst = self.squeue[s][0]
        n = self.n
        k, i = divmod(inst, n)
        dev_end = self.dev_end
        for d, dist, _, _ in self.deps[k]:
            j = i - dist
            if j >= 0 and dev_end[d * n + j] < 0:
                self.dwaiters.setdefault(d * n + j, []).append(s)
                return
        res = self.res[k]
        for r in res:
            if self.rbusy[r] or (self.comm[r] and self.rqueue[r][0] != inst):
                if (False, s) not in self.rwait[r]:
                    self.rwait[r].append((False, s))
                return
        for r in res:
            self.rbusy[r] = True
            if self.comm[r]:
                self.rqueue[r].popleft()
        self.squeue[s].popleft()
        self.sbusy[s] = True
        self.running[s] = inst
        self.dev_start[inst] = now
        N = self.T * n
        sub = self.host_end[inst]
        bt, bop, bkind = sub, inst, "submit"
        if self.sfree_t[s] >= bt and self.sfree_op[s] >= 0:
            bt, bop, bkind = self.sfree_t[s], N + self.sfree_op[s], self.stream_label[s]
        fifo_end = bt
        for r in res:
            if self.rfree_t[r] >= bt and self.rfree_op[r] >= 0:
                bt, bop, bkind = self.rfree_t[r], N + self.rfree_op[r], self.res_names[r]
        for d, dist, _, label in self.deps[k]:
            j = i - dist
            if j >= 0 and dev_end[d * n + j] >= bt:
                bt, bop, bkind = dev_end[d * n + j], N + d * n + j, label
        self.pred_op[N + inst] = bop
        self.pred_kind[N + inst] = bkind
        if fifo_end > sub:
            self.stalls.append(Stall(self.names[k], i, "device", self.stream_label[s], fifo_end - sub))
        if now > fifo_end:
            self.stalls.append(Stall(self.names[k], i, "device", bkind, now - fifo_end))
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
        wake = self.dwaiters.pop(inst, [])
        for r in self.res[k]:
            self.rbusy[r] = False
            self.rfree_t[r] = t
            self.rfree_op[r] = inst
            wake.extend(x for _, x in self.rwait[r])
            self.rwait[r] = []
        for x in wake:
            self.try_stream(x, t)
        self.try_stream(s, t)


# -- measuring the result -----------------------------------------------------------------------------------------


def _window(completion: Sequence[float], cpu_done: Sequence[float], n: int, depth: int) -> Tuple[int, int]:
    """The iterations measured for the steady state.

    The run is identical to one with endless data until the first period that
    misses a batch would be enqueued, at the retirement of iteration
    ``n - depth``. The window ends with the last iteration completed by then
    (on CUDA the device may lag the host by many iterations) and skips the
    first quarter as warm-up.
    """
    cut = cpu_done[n - depth] if n - depth >= 0 else math.inf
    w1 = -1
    for i in range(max(0, n - depth + 1) if n - depth >= 0 else n):
        if completion[i] > cut:
            break
        w1 = i
    w0 = max(w1 // 4, min(depth, w1 - 2), 0)
    return w0, max(w1, w0)


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
        Iterations to run (>= 2). The period is measured on the iterations that
        complete before the run stops admitting full periods, after a warm-up
        quarter. The run is doubled, up to 16 times its length (and at most
        200,000 task-iterations), while fewer than 8 such iterations remain (on
        CUDA the device can lag the host by many iterations) or while the period
        is below the busiest resource's work per iteration (a queue that grows
        slowly has not bound yet: the run has not reached steady state).
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
    cap = max(n, min(16 * n, _MAX_TASK_ITERATIONS // max(1, len(plan.schedule))))
    while True:
        sim = _Sim(plan, costs, n, cuda, float(task_overhead_s), float(period_overhead_s))
        sim.run()
        T, names = sim.T, sim.names
        completion = list(sim.cpu_done)
        last_op = [sim.retire_op[i] for i in range(n)]
        if cuda:
            N = T * n
            for k in range(T):
                base = k * n
                for i in range(n):
                    if sim.dev_end[base + i] > completion[i]:
                        completion[i] = sim.dev_end[base + i]
                        last_op[i] = N + base + i
        w0, w1 = _window(completion, sim.cpu_done, n, sim.depth)
        period = _steady_period(completion, w0, w1)
        # A queue that grows by a little every iteration binds only after many of them; until then the
        # window shows a faster transient. No steady state beats the busiest resource, so keep going.
        steady = w1 - w0 >= _MIN_WINDOW and period >= sim.busiest_load() * (1.0 - _LOAD_RTOL)
        if steady or n >= cap:
            break
        n = min(cap, 2 * n)
    latencies = [completion[i] - sim.entry[i] for i in range(n)]
    win = latencies[w0:w1 + 1]
    latency = sum(win) / len(win)

    events: List[TimelineEvent] = []
    busy: Dict[str, float] = {f"thread:{g}": 0.0 for g in sim.group_names}
    if cuda:
        busy.update({f"stream:{st}": 0.0 for st in sim.stream_names})
    busy.update({r: 0.0 for r in sim.res_names})
    if any(sim.seqd):
        busy["sequencer"] = 0.0

    def charge(name: str, i: int, seconds: float) -> None:
        if w0 <= i <= w1:
            busy[name] += seconds

    for inst, s, e in sim.events_host:
        k, i = divmod(inst, n)
        g = sim.group_names[sim.thread[k]]
        events.append(TimelineEvent(names[k], i, g, sim.stream_names[sim.stream[k]], s, e, "host"))
        charge(f"thread:{g}", i, e - s)
        if sim.seqd[k]:
            charge("sequencer", i, e - s)
        if not cuda:
            for r in sim.res[k]:
                charge(sim.res_names[r], i, e - s)
    for inst, s, e in sim.events_dev:
        k, i = divmod(inst, n)
        st = sim.stream_names[sim.stream[k]]
        events.append(TimelineEvent(names[k], i, sim.group_names[sim.thread[k]], st, s, e, "device"))
        charge(f"stream:{st}", i, e - s)
        for r in sim.res[k]:
            charge(sim.res_names[r], i, e - s)
    events.sort(key=lambda e: (e.start, e.kind, e.thread_group if e.kind == "host" else e.stream))
    # per-iteration busy time over the window / period: independent of where the window's edges fall
    count = w1 - w0 + 1
    utilisation = {name: (b / count) / period if period > 0 else 0.0 for name, b in sorted(busy.items())}
    idle = {name: max(0.0, period - b / count) for name, b in sorted(busy.items())}

    cycle = _critical_cycle(sim, last_op[w1])
    top = max(utilisation.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0.0))
    if top[1] >= 1.0 - 1e-6:
        binding = top[0]
    elif "barrier" in cycle.kinds:
        binding = f"progress barrier (depth {sim.depth}): {cycle}"
    elif all(k.startswith(("dep:", "event:", "submit")) for k in cycle.kinds):
        binding = f"recurrence: {cycle}"
    else:
        binding = f"cycle: {cycle}"
    return SimResult(plan=plan, costs=costs, device="cuda" if cuda else "cpu", num_iterations=n, period=period,
                     latency=latency, latencies=latencies, completion=completion, entry=list(sim.entry),
                     events=events, utilisation=utilisation, idle=idle, stalls=sim.stalls, critical_cycle=cycle,
                     binding=binding, window=(w0, w1))
