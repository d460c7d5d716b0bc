"""The simulator's event machine: the engine's contract (docs/semantics.md) run on one heap of timed events.

A run of ``n`` iterations numbers everything with integers: task ``k`` of
iteration ``i`` is the instance ``inst = k * n + i``; its host part is op
``inst`` and its device part op ``tasks * n + inst``. :class:`Simulator` reads the
plan as tables that never change (:class:`~autosched.model._simplan.SimPlan`) and
keeps the state of each thing the contract names in a record of its own:
:class:`Threads`, :class:`Streams`, :class:`Resources` (the cost model's
``comm:``/``pcie``/``gil`` tags), :class:`CorePool`, :class:`Sequencer`,
:class:`Iterations` and :class:`MainThread`; :class:`Ops` is what happened to
each op. Its methods follow a period through the engine, top to bottom:

1. the main thread enqueues a period once the barrier allows
   (:meth:`~Simulator.advance_main`), walks its tasks (:meth:`~Simulator.enqueue`)
   and hands them to their threads (:meth:`~Simulator.hand_off`);
2. a task's host part starts on its thread when Phase 1, the sequencer, its
   resources and a core allow (:meth:`~Simulator.try_host`,
   :meth:`~Simulator.start_host`) and ends (:meth:`~Simulator.host_done`);
3. on CUDA its device part then runs on its stream (:meth:`~Simulator.try_stream`,
   :meth:`~Simulator.device_done`).

For every op the binding predecessor (the op whose end let it start) and the
kind of that wait are kept, which is what
:func:`autosched.model.simulate._critical_cycle` walks back.
:func:`autosched.model.simulate.simulate` builds the machine, runs it and reads the
result; nothing else uses it.

Resources are binary (one holder), except the core pool (``CostModel.cores``;
docs/semantics.md): every host part that takes a core
(:attr:`autosched.model.taskmodel.TaskParts.takes_core`) takes one of ``size``
cores while it runs, threads that find none free wait in arrival order and are
woken, oldest first, when one is released. ``size = 0`` is unlimited (also a
pool of at least as many cores as threads, :func:`autosched.model.taskmodel.pool_limit`)
and leaves every step as without a pool.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Tuple

from autosched.model._simevents import DEV_END, ENQUEUE, HOST_END, SimCut, SimDeadlock, Stall
from autosched.model._simplan import SimPlan
from autosched.model.taskmodel import CORES

__all__ = ["Simulator"]

# a wait label and the op that ended it: what let a part start
Binding = Tuple[int, str]


class Ops:
    """What happened to each op: when it was handed off, started and ended, and what it waited for last."""

    def __init__(self, instances: int) -> None:
        self.handed_off = [-1.0] * instances  # host ops: when the main thread handed the task to its thread
        self.host_start = [-1.0] * instances
        self.host_end = [-1.0] * instances  # -1: its CPU signal is not set yet
        self.dev_start = [-1.0] * instances
        self.dev_end = [-1.0] * instances  # -1: its device event has not completed
        self.pred_op = [-1] * (2 * instances)  # host and device ops: the op whose end let it start
        self.pred_kind = [""] * (2 * instances)  # ... and the kind of that wait
        self.stalls: List[Stall] = []
        self.host_events: List[Tuple[int, float, float]] = []  # (instance, start, end) of each host part
        self.device_events: List[Tuple[int, float, float]] = []  # ... of each device part with device time


class Threads:
    """Each thread group ``g``: its FIFO, the instance it holds (from the moment it takes it), when it was last free."""

    def __init__(self, groups: int) -> None:
        self.queue: List[Deque[int]] = [deque() for _ in range(groups)]
        self.current = [-1] * groups  # the instance taken from the queue (running or waiting), -1: none
        self.busy = [False] * groups  # its host part is running
        self.free_t = [0.0] * groups
        self.free_op = [-1] * groups
        self.waited_core = [False] * groups  # the current instance found every core busy (for its binding wait)
        self.signal_waiters: Dict[int, List[int]] = {}  # a host op's CPU signal -> the groups waiting for it


class Streams:
    """Each stream ``s`` (CUDA): its FIFO of submitted device parts, the one running, when it was last free."""

    def __init__(self, streams: int) -> None:
        self.queue: List[Deque[int]] = [deque() for _ in range(streams)]
        self.busy = [False] * streams
        self.running = [-1] * streams
        self.free_t = [0.0] * streams
        self.free_op = [-1] * streams
        self.event_waiters: Dict[int, List[int]] = {}  # an instance's device event -> the streams waiting for it


class Resources:
    """Each shared resource ``r`` of the cost model, held by one part at a time.

    On CPU host parts hold them and threads wait; on CUDA device parts hold them
    and streams wait, and a communicator runs its parts in submission order.
    """

    def __init__(self, resources: int) -> None:
        self.busy = [False] * resources
        self.free_t = [0.0] * resources
        self.free_op = [-1] * resources
        self.waiting: List[List[int]] = [[] for _ in range(resources)]  # threads (CPU) or streams (CUDA)
        self.submitted: List[Deque[int]] = [deque() for _ in range(resources)]  # CUDA: a communicator's order


class CorePool:
    """The machine's free cores (``size``; 0: unlimited): host parts running, threads waiting for one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.busy = 0
        self.waiting: List[int] = []  # thread groups, in arrival order
        self.free_t = 0.0
        self.free_op = -1


class Sequencer:
    """The global turn order of globally ordered tasks: a ticket each in enqueue order, one turn at a time."""

    def __init__(self) -> None:
        self.ticket: Dict[int, int] = {}  # instance -> its turn
        self.issued = 0
        self.next = 0  # the turn being served
        self.waiting: Dict[int, int] = {}  # turn -> the thread group holding that task, waiting for it
        self.free_t = 0.0
        self.free_op = -1


class Iterations:
    """Each iteration ``i``: when its batch entered, and when it completed on the CPU and on the device."""

    def __init__(self, iterations: int, tasks: int) -> None:
        self.entry = [-1.0] * iterations
        self.host_left = [tasks] * iterations  # tasks whose CPU signal is not set yet
        self.cpu_done = [-1.0] * iterations  # when it completed on the CPU (the engine may retire it)
        self.retire_op = [-1] * iterations
        self.device_left = [tasks] * iterations  # CUDA: device parts not yet complete
        self.dev_done_t = [-1.0] * iterations
        self.dev_done_op = [-1] * iterations


class MainThread:
    """The main thread: the periods it enqueues, the caller's group it runs inline, the hand-offs it holds."""

    def __init__(self, plan: SimPlan, iterations: int) -> None:
        self.total_periods = iterations + plan.depth - 1
        periods = max(self.total_periods, iterations + 1)
        self.caller_left = [0] * periods  # the caller's tasks each period has yet to run
        if plan.caller >= 0:
            for p in range(self.total_periods):
                self.caller_left[p] = sum(1 for _, _, inline, _ in plan.walk.shape(p, 0, iterations).steps if inline)
        self.caller_done_t = [0.0] * periods
        self.caller_done_op = [-1] * periods
        self.held: Dict[int, List[int]] = {}  # a caller's task -> the worker tasks handed off once it has run
        self.handoff_pred: Dict[int, int] = {}  # a worker task handed off late -> the caller's task it waited for
        self.period_pred: List[Binding] = [(-1, "barrier")] * periods  # what let each period be enqueued
        self.next_period = 0
        self.free_t = 0.0  # when it is next free
        self.cut = math.inf  # when the first period short of a batch is enqueued (simulate._window)


class Simulator:
    """One simulated run of ``iterations`` iterations of a plan: the state above and one heap of events.

    Examples
    --------
    >>> from swpipe import CostModel, PipelinePlan, TaskCost, TaskSchedule
    >>> from autosched.model._simplan import sim_plan
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
    ...                     intra_iter_deps=[("B", "A")], caller_group=None)
    >>> costs = CostModel({"A": TaskCost(1.0), "B": TaskCost(2.0)})
    >>> sim = Simulator(sim_plan(plan, costs, cuda=False, task_overhead_s=0.0, period_overhead_s=0.0,
    ...                          max_device_lag=2), iterations=3)
    >>> sim.run()
    >>> sim.iterations.cpu_done
    [3.0, 5.0, 7.0]
    """

    def __init__(self, plan: SimPlan, iterations: int, *, stop: Optional[Callable[[], bool]] = None,
                 check_every: int = 256) -> None:
        self.plan = plan
        self.stop = stop  # asked before the first event and every ``check_every`` events: True stops the run
        self.check_every = max(1, check_every)
        self.n = iterations
        self.ops = Ops(plan.tasks * iterations)
        self.threads = Threads(len(plan.group_names))
        self.streams = Streams(len(plan.stream_names))
        self.resources = Resources(len(plan.res_names))
        self.pool = CorePool(plan.pool_size)
        self.sequencer = Sequencer()
        self.iterations = Iterations(iterations, plan.tasks)
        self.main = MainThread(plan, iterations)
        self.heap: List[Tuple[float, int, int, int]] = []  # (time, tie-break, event kind, group/stream/period)
        self.pushed = 0

    def run(self) -> None:
        """Run every event until none is left; raise :class:`SimDeadlock` if the run stopped short.

        :class:`SimCut` when ``stop()`` (asked before the first event and every
        ``check_every`` events) says to stop: a search's deadline passed.
        """
        self.advance_main()
        heap = self.heap
        pop = heapq.heappop
        stop, every = self.stop, self.check_every
        events = 0
        while heap:
            if stop is not None:
                if events % every == 0 and stop():
                    raise SimCut(events, heap[0][0])
                events += 1
            now, _, kind, arg = pop(heap)
            if kind == HOST_END:
                self.host_done(arg, now)
            elif kind == DEV_END:
                self.device_done(arg, now)
            else:
                self.enqueue(arg, now)
        if self.main.next_period < self.main.total_periods or (self.plan.cuda and min(self.ops.dev_end) < 0):
            raise self.deadlock()

    def push(self, at: float, kind: int, arg: int) -> None:
        """Schedule an event; events at one time run in the order they were pushed."""
        self.pushed += 1
        heapq.heappush(self.heap, (at, self.pushed, kind, arg))

    def dep_ops(self, task: int, iteration: int) -> List[Tuple[int, str, str]]:
        """What ``task(iteration)`` waits for: ``(host op, CPU-signal label, device-event label)`` per dependency.

        The one place the waited iteration is computed: ``iteration - distance``,
        of which none before the first and (a same-period dependency waits a
        newer iteration) none after the last.
        """
        n = self.n
        return [(dep * n + iteration - dist, cpu, dev) for dep, dist, cpu, dev in self.plan.deps[task]
                if 0 <= iteration - dist < n]

    # -- the main thread ------------------------------------------------------------------------------------------

    def advance_main(self) -> None:
        """Enqueue every period the main thread can: it runs ``fill_pipeline`` then ``progress`` in turn.

        Period ``p`` is enqueued once the main thread has finished the caller group's
        tasks of period ``p - 1`` (it runs them inline), and, for ``p >= depth``, once
        iteration ``p - depth`` completed on the CPU (retired) and, on CUDA, the device
        part of iteration ``p - depth - max_device_lag`` completed. The binding one of
        these is kept as the enqueued tasks' "barrier" predecessor.
        """
        plan, main, its = self.plan, self.main, self.iterations
        n = self.n
        last = max(main.total_periods, n + 1)
        while main.next_period < last:
            p = main.next_period
            ready, pred = main.free_t, (-1, "barrier")
            if p >= 1 and plan.caller >= 0:
                if main.caller_left[p - 1] > 0:
                    return
                if main.caller_done_t[p - 1] >= ready and main.caller_done_op[p - 1] >= 0:
                    ready, pred = main.caller_done_t[p - 1], (main.caller_done_op[p - 1],
                                                              plan.thread_labels[plan.caller])
            retired = p - plan.depth
            if retired >= 0:
                if its.cpu_done[retired] < 0:
                    return
                if its.cpu_done[retired] >= ready:
                    ready, pred = its.cpu_done[retired], (its.retire_op[retired], "barrier")
                lagging = retired - plan.max_device_lag
                if plan.cuda and lagging >= 0:
                    if its.dev_done_t[lagging] < 0:
                        return
                    if its.dev_done_t[lagging] >= ready:
                        ready, pred = its.dev_done_t[lagging], (its.dev_done_op[lagging], "device-lag")
            if p == n:
                main.cut = ready
            main.next_period += 1
            if p < main.total_periods:
                main.free_t = ready + plan.period_overhead
                main.period_pred[p] = pred
                self.push(main.free_t, ENQUEUE, p)

    def enqueue(self, period: int, now: float) -> None:
        """Walk ``period``'s tasks in the enqueue order, as the engine's main thread does.

        A worker task placed after a task of the caller's group is held until
        the main thread has run that task (:meth:`hand_off`, from
        :meth:`host_done`); the rest are handed off now.
        """
        plan, seq = self.plan, self.sequencer
        n = self.n
        now_insts: List[int] = []
        placed: List[int] = []  # the instance at each position of the period's walk
        if 0 <= period < n:
            self.iterations.entry[period] = now
        for task, stage, inline, after in plan.walk.shape(period, 0, n).steps:
            k = plan.index[task]
            inst = k * n + period - stage
            placed.append(inst)
            if plan.ordered[k]:
                seq.ticket[inst] = seq.issued
                seq.issued += 1
            if inline or after is None:
                now_insts.append(inst)
            else:  # held until the main thread has run the caller's task the walk passed last
                self.main.held.setdefault(placed[after], []).append(inst)
        self.hand_off(now_insts, now, -1)

    def hand_off(self, insts: List[int], now: float, after: int) -> None:
        """Hand ``insts`` to their threads at ``now``; ``after``: the caller's task they waited for (-1: none)."""
        threads, thread_of = self.threads, self.plan.thread
        n = self.n
        touched: List[int] = []
        for inst in insts:
            self.ops.handed_off[inst] = now
            if after >= 0:
                self.main.handoff_pred[inst] = after
            group = thread_of[inst // n]
            threads.queue[group].append(inst)
            if group not in touched:
                touched.append(group)
        for group in touched:
            self.try_host(group, now)

    # -- a task's host part on its thread (Phase 1, the sequencer, resources, a core) -----------------------------

    def try_host(self, group: int, now: float) -> None:
        """Start the task at the head of ``group``'s thread if Phase 1, the sequencer, resources and a core allow."""
        threads = self.threads
        if threads.busy[group]:
            return
        inst = threads.current[group]
        if inst < 0:
            if not threads.queue[group]:
                return
            inst = threads.queue[group].popleft()
            threads.current[group] = inst
        plan = self.plan
        k, i = divmod(inst, self.n)
        host_end = self.ops.host_end
        for op, _, _ in self.dep_ops(k, i):
            if host_end[op] < 0:
                threads.signal_waiters.setdefault(op, []).append(group)
                return
        if plan.ordered[k]:
            seq = self.sequencer
            if seq.ticket[inst] != seq.next:
                seq.waiting[seq.ticket[inst]] = group
                return
        held = plan.res[k] if not plan.cuda else ()
        resources = self.resources
        for r in held:
            if resources.busy[r]:
                if group not in resources.waiting[r]:
                    resources.waiting[r].append(group)
                return
        pool = self.pool
        if pool.size and plan.takes_core[k]:
            if pool.busy >= pool.size:
                if group not in pool.waiting:
                    pool.waiting.append(group)
                threads.waited_core[group] = True
                return
            pool.busy += 1
        for r in held:
            resources.busy[r] = True
        self.start_host(group, inst, held, now)

    def start_host(self, group: int, inst: int, held: Tuple[int, ...], now: float) -> None:
        """Run ``inst``'s host part from ``now``: record its binding wait and its stalls, schedule its end."""
        plan, ops, threads = self.plan, self.ops, self.threads
        k, i = divmod(inst, self.n)
        threads.busy[group] = True
        ops.host_start[inst] = now
        # the binding wait is the latest constraint; on ties: dep > sequencer > resource > thread > barrier
        handed_off = ops.handed_off[inst]
        bop, bkind = self.main.period_pred[i + plan.stage[k]]
        if inst in self.main.handoff_pred:  # handed off once the caller ran the task before it in the order
            bop, bkind = self.main.handoff_pred[inst], plan.thread_labels[plan.caller]
        bt = handed_off
        if threads.free_t[group] >= bt:
            bt, bop, bkind = threads.free_t[group], threads.free_op[group], plan.thread_labels[group]
        fifo_end = bt
        resources = self.resources
        for r in held:
            if resources.free_t[r] >= bt:
                bt, bop, bkind = resources.free_t[r], resources.free_op[r], plan.res_names[r]
        if threads.waited_core[group]:  # only a task that found every core busy waited for one
            threads.waited_core[group] = False
            if self.pool.free_t >= bt:
                bt, bop, bkind = self.pool.free_t, self.pool.free_op, CORES
        if plan.ordered[k] and self.sequencer.free_t >= bt:
            bt, bop, bkind = self.sequencer.free_t, self.sequencer.free_op, "sequencer"
        host_end = ops.host_end
        for op, label, _ in self.dep_ops(k, i):
            if host_end[op] >= bt:
                bt, bop, bkind = host_end[op], op, label
        ops.pred_op[inst] = bop
        ops.pred_kind[inst] = bkind
        if fifo_end > handed_off:
            ops.stalls.append(Stall(plan.names[k], i, "host", plan.fifo_labels[group], fifo_end - handed_off))
        if now > fifo_end:
            ops.stalls.append(Stall(plan.names[k], i, "host", bkind, now - fifo_end))
        self.push(now + plan.host[k], HOST_END, group)

    def host_done(self, group: int, now: float) -> None:
        """End the host part ``group``'s thread runs: free what it held, set its CPU signal, wake the waiters."""
        plan, ops, threads = self.plan, self.ops, self.threads
        inst = threads.current[group]
        k, i = divmod(inst, self.n)
        ops.host_end[inst] = now
        ops.host_events.append((inst, ops.host_start[inst], now))
        threads.current[group] = -1
        threads.busy[group] = False
        threads.free_t[group] = now
        threads.free_op[group] = inst
        wake = threads.signal_waiters.pop(inst, [])
        pool = self.pool
        if pool.size and plan.takes_core[k]:  # the core goes to the threads that waited for one first, oldest first
            pool.busy -= 1
            pool.free_t, pool.free_op = now, inst
            wake = pool.waiting + wake
            pool.waiting = []
        if plan.ordered[k]:
            seq = self.sequencer
            seq.next += 1
            seq.free_t = now
            seq.free_op = inst
            waiting = seq.waiting.pop(seq.next, None)
            if waiting is not None:
                wake.append(waiting)
        if not plan.cuda:
            self.release(plan.res[k], inst, now, wake)
        else:  # the device part is submitted when the host part ends
            self.streams.queue[plan.stream[k]].append(inst)
            for r in plan.res[k]:
                if plan.comm[r]:
                    self.resources.submitted[r].append(inst)
        its = self.iterations
        its.host_left[i] -= 1
        if its.host_left[i] == 0:
            its.cpu_done[i] = now
            its.retire_op[i] = inst
        if group == plan.caller:
            self.caller_ran(inst, now)
        self.advance_main()
        for waiting in wake:
            self.try_host(waiting, now)
        self.try_host(group, now)
        if plan.cuda:
            self.try_stream(plan.stream[k], now)

    def caller_ran(self, inst: int, now: float) -> None:
        """The main thread ran ``inst`` of the caller's group: count it, hand off the worker tasks it held."""
        main = self.main
        k, i = divmod(inst, self.n)
        period = i + self.plan.stage[k]
        main.caller_left[period] -= 1
        main.caller_done_t[period] = now
        main.caller_done_op[period] = inst
        held = main.held.pop(inst, None)
        if held:
            self.hand_off(held, now, inst)

    def release(self, held: Tuple[int, ...], inst: int, now: float, wake: List[int]) -> None:
        """Free the resources ``inst`` held; what waited for them is added to ``wake``."""
        resources = self.resources
        for r in held:
            resources.busy[r] = False
            resources.free_t[r] = now
            resources.free_op[r] = inst
            wake.extend(resources.waiting[r])
            resources.waiting[r] = []

    # -- a task's device part on its stream (CUDA: device events, communicators, PCIe) ----------------------------

    def try_stream(self, stream: int, now: float) -> None:
        """Start the device part at the head of ``stream`` if its events and resources allow."""
        streams = self.streams
        if streams.busy[stream] or not streams.queue[stream]:
            return
        inst = streams.queue[stream][0]
        plan = self.plan
        k, i = divmod(inst, self.n)
        dev_end = self.ops.dev_end
        for op, _, _ in self.dep_ops(k, i):
            if dev_end[op] < 0:
                streams.event_waiters.setdefault(op, []).append(stream)
                return
        held = plan.res[k]
        resources = self.resources
        for r in held:
            if resources.busy[r] or (plan.comm[r] and resources.submitted[r][0] != inst):
                if stream not in resources.waiting[r]:
                    resources.waiting[r].append(stream)
                return
        for r in held:
            resources.busy[r] = True
            if plan.comm[r]:
                resources.submitted[r].popleft()
        streams.queue[stream].popleft()
        streams.busy[stream] = True
        streams.running[stream] = inst
        self.start_device(stream, inst, held, now)

    def start_device(self, stream: int, inst: int, held: Tuple[int, ...], now: float) -> None:
        """Run ``inst``'s device part from ``now``: record its binding wait and its stalls, schedule its end."""
        plan, ops, streams, resources = self.plan, self.ops, self.streams, self.resources
        k, i = divmod(inst, self.n)
        ops.dev_start[inst] = now
        device_ops = plan.tasks * self.n  # a device op's index is this plus its instance
        submitted = ops.host_end[inst]
        bt, bop, bkind = submitted, inst, "submit"
        if streams.free_t[stream] >= bt and streams.free_op[stream] >= 0:
            bt, bop, bkind = streams.free_t[stream], device_ops + streams.free_op[stream], plan.stream_labels[stream]
        fifo_end = bt
        for r in held:
            if resources.free_t[r] >= bt and resources.free_op[r] >= 0:
                bt, bop, bkind = resources.free_t[r], device_ops + resources.free_op[r], plan.res_names[r]
        dev_end = ops.dev_end
        for op, _, label in self.dep_ops(k, i):
            if dev_end[op] >= bt:
                bt, bop, bkind = dev_end[op], device_ops + op, label
        ops.pred_op[device_ops + inst] = bop
        ops.pred_kind[device_ops + inst] = bkind
        if fifo_end > submitted:
            ops.stalls.append(Stall(plan.names[k], i, "device", plan.stream_labels[stream], fifo_end - submitted))
        if now > fifo_end:
            ops.stalls.append(Stall(plan.names[k], i, "device", bkind, now - fifo_end))
        self.push(now + plan.device[k], DEV_END, stream)

    def device_done(self, stream: int, now: float) -> None:
        """End the device part ``stream`` runs: complete its event, free its resources, wake the waiting streams."""
        plan, ops, streams = self.plan, self.ops, self.streams
        inst = streams.running[stream]
        k, i = divmod(inst, self.n)
        ops.dev_end[inst] = now
        if plan.device[k] > 0:
            ops.device_events.append((inst, ops.dev_start[inst], now))
        streams.busy[stream] = False
        streams.free_t[stream] = now
        streams.free_op[stream] = inst
        streams.running[stream] = -1
        its = self.iterations
        its.device_left[i] -= 1
        if its.device_left[i] == 0:
            its.dev_done_t[i] = now
            its.dev_done_op[i] = plan.tasks * self.n + inst
            self.advance_main()
        wake = streams.event_waiters.pop(inst, [])
        self.release(plan.res[k], inst, now, wake)
        for waiting in wake:
            self.try_stream(waiting, now)
        self.try_stream(stream, now)

    # -- when nothing can run ---------------------------------------------------------------------------------------

    def deadlock(self) -> SimDeadlock:
        """What each thread holds and each stream's head, when nothing can run."""
        def instance(inst: int) -> Tuple[str, int]:
            k, i = divmod(inst, self.n)
            return self.plan.names[k], i

        threads = {self.plan.group_names[g]: instance(inst) for g, inst in enumerate(self.threads.current)
                   if inst >= 0}
        streams = {self.plan.stream_names[s]: instance(queue[0]) for s, queue in enumerate(self.streams.queue)
                   if queue}
        return SimDeadlock(self.main.next_period, threads, streams)
