"""The simulator's event machine: the engine's contract (docs/semantics.md) run on one heap of timed events.

:class:`_Sim` holds one run's state in flat lists indexed by integers: a task
instance ``(task k, iteration i)`` is ``k * n + i``, its host part op ``inst`` and
its device part op ``T * n + inst``. :func:`autosched.model.simulate.simulate` builds it,
runs it and reads the result; nothing else uses it. This module holds the run's
state, the event loop and the main thread (periods enqueued, hand-offs held
behind the caller's tasks); a task's host part runs in :mod:`autosched.model._simhost`,
its device part in :mod:`autosched.model._simdevice`, and the events, stalls and
deadlock they share are in :mod:`autosched.model._simevents`.

Resources are binary (one holder: ``rbusy``, ``rwait``), except the core pool
(``CostModel.cores``; docs/semantics.md): every host part that takes a core
(:attr:`autosched.model.taskmodel.TaskParts.takes_core`) takes one of ``cap`` cores
while it runs, threads that find none free wait in arrival order
(``cwait``) and are woken, oldest first, when one is released. ``cap = 0`` is
unlimited (also a pool of at least as many cores as threads,
:func:`autosched.model.taskmodel.pool_limit`) and leaves every step as without a pool.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Dict, List, Tuple

from swpipe_core.plan import PipelinePlan
from swpipe_core.walk import PeriodWalk

from autosched.model._simdevice import DeviceSide
from autosched.model._simevents import DEV_END, ENQUEUE, HOST_END, SimDeadlock, Stall
from autosched.model._simhost import HostSide
from autosched.model.costs import CostModel
from autosched.model.taskmodel import plan_parts, pool_limit, resource_loads, stream_label

__all__ = ["_Sim"]


class _Sim(HostSide, DeviceSide):
    """State of one simulation run: integers and flat lists everywhere, one heap of events.

    A task instance ``(task k, iteration i)`` is the integer ``k * n + i``; its host
    part is op ``inst`` and its device part op ``T * n + inst``. For every op the
    binding predecessor (the op whose end let it start) and the kind of that wait
    are kept, which is what :func:`_critical_cycle` walks back.
    """

    def __init__(self, plan: PipelinePlan, costs: CostModel, n: int, cuda: bool,
                 task_overhead_s: float, period_overhead_s: float, max_device_lag: int) -> None:
        self.n, self.cuda = n, cuda
        self.lag = max_device_lag
        names = plan.task_names
        self.names = names
        idx = {name: k for k, name in enumerate(names)}
        self.walk = PeriodWalk(plan)  # the contract's walk of a period (swpipe_core.walk)
        self.idx = idx
        self.order = [idx[name] for name in self.walk.order]
        sched = [plan.sched(name) for name in names]
        self.stage = [s.stage for s in sched]
        self.depth = plan.pipeline_depth
        self.group_names = sorted({s.thread_group for s in sched})
        self.thread = [self.group_names.index(s.thread_group) for s in sched]
        self.thread_label = [f"thread:{g}" for g in self.group_names]
        self.fifo_label = [f"fifo:{g}" for g in self.group_names]
        streams = [stream_label(plan.sched(name).stream) for name in names]
        self.stream_names = sorted(set(streams))
        self.stream = [self.stream_names.index(st) for st in streams]
        self.stream_label = [f"stream:{st}" for st in self.stream_names]
        self.seqd = [bool(s.globally_ordered) for s in sched]
        parts = plan_parts(plan, costs, cuda, task_overhead_s)
        self.parts = [parts[name] for name in names]
        self.host = [p.host for p in self.parts]
        self.takes_core = [p.takes_core for p in self.parts]
        self.dev = [p.device for p in self.parts]
        self.res_names = sorted({r for p in self.parts for r in p.shared})
        self.res = [tuple(self.res_names.index(r) for r in p.shared) for p in self.parts]
        self.comm = [r.startswith("comm:") for r in self.res_names]
        self.cores = costs.cores
        self.cap = pool_limit(costs.cores, len(self.group_names)) or 0  # the core pool's size; 0: cannot bind
        self.period_overhead = period_overhead_s
        # deps[k]: (dep task, distance, label of the CPU-signal wait, label of the device-event wait)
        self.deps: List[List[Tuple[int, int, str, str]]] = [[] for _ in names]
        for t, d in plan.intra_edges():
            self.deps[idx[t]].append((idx[d], 0, f"dep:{d}", f"event:{d}"))
        for t, d, dist in plan.inter_edges():
            it = f"i-{dist}" if dist > 0 else f"i+{-dist}" if dist < 0 else "i"  # dist < 0: a same-period dep
            self.deps[idx[t]].append((idx[d], dist, f"dep:{d}[{it}]", f"event:{d}[{it}]"))
        self.T = len(names)
        self._init_run_state(n)
        self._init_main_thread(plan, n)

    def _dep_ops(self, k: int, i: int) -> List[Tuple[int, str, str]]:
        """What ``k(i)`` waits for: ``(op index, CPU-signal label, device-event label)`` per dependency.

        The one place the waited iteration is computed: ``i - distance``, of
        which none before the first and (a same-period dependency waits a
        newer iteration) none after the last.
        """
        n = self.n
        return [(d * n + i - dist, cpu, dev) for d, dist, cpu, dev in self.deps[k] if 0 <= i - dist < n]

    def _init_run_state(self, n: int) -> None:
        """Per-op times and binding predecessors, and the state of every thread, stream and resource."""
        T = self.T
        N = T * n
        self.host_start = [-1.0] * N
        self.host_end = [-1.0] * N
        self.dev_start = [-1.0] * N
        self.dev_end = [-1.0] * N
        self.enq = [-1.0] * N
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
        self.cores_busy = 0  # host parts running (the core pool, when self.cap > 0)
        self.cwait: List[int] = []  # threads waiting for a core, in arrival order
        self.cwaited = [False] * G  # the thread's current task waited for a core (for its binding wait)
        self.cfree_t = 0.0
        self.cfree_op = -1
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
        self.dev_left = [T] * n  # CUDA: device parts of an iteration not yet complete
        self.dev_done_t = [-1.0] * n
        self.dev_done_op = [-1] * n

    def _init_main_thread(self, plan: PipelinePlan, n: int) -> None:
        """The main thread: the caller's group it runs inline, periods to enqueue, the event heap."""
        # the caller's group runs inline: the main thread is that group's thread
        self.caller = (self.group_names.index(plan.caller_group)
                       if plan.caller_group in self.group_names else -1)
        self.total_periods = n + self.depth - 1
        P = max(self.total_periods, n + 1)
        self.caller_left = [0] * P  # the caller's tasks each period runs
        if self.caller >= 0:
            for p in range(self.total_periods):
                self.caller_left[p] = sum(1 for step in self.walk.shape(p, 0, n).steps if step[2])
        self.caller_done_t = [0.0] * P
        self.caller_done_op = [-1] * P
        self.held: Dict[int, List[int]] = {}  # a caller's task -> the worker tasks handed off once it has run
        self.handoff_pred: Dict[int, int] = {}  # a worker task handed off late -> the caller's task it waited for
        self.period_pred: List[Tuple[int, str]] = [(-1, "barrier")] * P
        self.next_period = 0
        self.cut = math.inf  # when the first period short of a batch is enqueued (see _window)
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
        load = resource_loads(self.parts, self.cores)
        if self.caller >= 0:  # the main thread also runs the caller's group
            key = self.thread_label[self.caller]
            load[key] = load.get(key, 0.0) + self.period_overhead
        return max(list(load.values()) + [self.period_overhead])

    def push(self, t: float, kind: int, arg: int) -> None:
        self.counter += 1
        heapq.heappush(self.heap, (t, self.counter, kind, arg))

    def run(self) -> None:
        self.advance_main()
        heap = self.heap
        pop = heapq.heappop
        while heap:
            t, _, kind, arg = pop(heap)
            if kind == HOST_END:
                self.host_done(arg, t)
            elif kind == DEV_END:
                self.dev_done(arg, t)
            else:
                self.enqueue(arg, t)
        if self.next_period < self.total_periods or (self.cuda and min(self.dev_end) < 0):
            raise self.deadlock()

    def deadlock(self) -> SimDeadlock:
        """What each thread holds and each stream's head, when nothing can run."""
        def instance(inst: int) -> Tuple[str, int]:
            k, i = divmod(inst, self.n)
            return self.names[k], i

        threads = {self.group_names[g]: instance(inst) for g, inst in enumerate(self.cur) if inst >= 0}
        streams = {self.stream_names[s]: instance(q[0]) for s, q in enumerate(self.squeue) if q}
        return SimDeadlock(self.next_period, threads, streams)

    def advance_main(self) -> None:
        """Enqueue every period the main thread can: it runs ``fill_pipeline`` then ``progress`` in turn.

        Period ``p`` is enqueued once the main thread has finished the caller group's
        tasks of period ``p - 1`` (it runs them inline), and, for ``p >= depth``, once
        iteration ``p - depth`` completed on the CPU (retired) and, on CUDA, the device
        part of iteration ``p - depth - max_device_lag`` completed. The binding one of
        these is kept as the enqueued tasks' "barrier" predecessor.
        """
        n, depth = self.n, self.depth
        last = max(self.total_periods, n + 1)
        while self.next_period < last:
            p = self.next_period
            ready, pred = self.main_t, (-1, "barrier")
            if p >= 1 and self.caller >= 0:
                if self.caller_left[p - 1] > 0:
                    return
                if self.caller_done_t[p - 1] >= ready and self.caller_done_op[p - 1] >= 0:
                    ready, pred = self.caller_done_t[p - 1], (self.caller_done_op[p - 1], self.thread_label[self.caller])
            r = p - depth
            if r >= 0:
                if self.cpu_done[r] < 0:
                    return
                if self.cpu_done[r] >= ready:
                    ready, pred = self.cpu_done[r], (self.retire_op[r], "barrier")
                j = r - self.lag
                if self.cuda and j >= 0:
                    if self.dev_done_t[j] < 0:
                        return
                    if self.dev_done_t[j] >= ready:
                        ready, pred = self.dev_done_t[j], (self.dev_done_op[j], "device-lag")
            if p == n:
                self.cut = ready
            self.next_period += 1
            if p < self.total_periods:
                self.main_t = ready + self.period_overhead
                self.period_pred[p] = pred
                self.push(self.main_t, ENQUEUE, p)

    def enqueue(self, p: int, t: float) -> None:
        """Walk period ``p``'s tasks in the enqueue order, as the engine's main thread does.

        A worker task placed after a task of the caller's group is held until
        the main thread has run that task (:meth:`release`, from
        :meth:`host_done`); the rest are handed off now.
        """
        n = self.n
        now: List[int] = []
        placed: List[int] = []  # the instance at each position of the period's walk
        if 0 <= p < n:
            self.entry[p] = t
        for task, stage, inline, after in self.walk.shape(p, 0, n).steps:
            k = self.idx[task]
            inst = k * n + p - stage
            placed.append(inst)
            if self.seqd[k]:
                self.ticket[inst] = self.seq_issued
                self.seq_issued += 1
            if inline or after is None:
                now.append(inst)
            else:  # held until the main thread has run the caller's task the walk passed last
                self.held.setdefault(placed[after], []).append(inst)
        self.release(now, t, -1)

    def release(self, insts: List[int], t: float, after: int) -> None:
        """Hand ``insts`` to their threads at ``t``; ``after``: the caller's task they waited for (-1: none)."""
        touched: List[int] = []
        for inst in insts:
            self.enq[inst] = t
            if after >= 0:
                self.handoff_pred[inst] = after
            g = self.thread[inst // self.n]
            self.queue[g].append(inst)
            if g not in touched:
                touched.append(g)
        for g in touched:
            self.try_host(g, t)
