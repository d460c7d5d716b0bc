"""The simulator's host side: a task starts on its thread group, waits, binds and ends (the engine's Phase 1).

:class:`HostSide` holds the methods of :class:`autosched.model._simcore._Sim` that
run a task's host part: :meth:`~HostSide.try_host` starts the head of a thread's
queue once its CPU signals, the sequencer, its resources and (with a core pool)
a core allow; :meth:`~HostSide.start_host` records the binding wait and the
stalls; :meth:`~HostSide.host_done` ends it, frees what it held, retires the
iteration, releases the caller's held hand-offs and wakes the waiters. The
state it works on is the run's (``_Sim._init_run_state``).
"""

from __future__ import annotations

from typing import Tuple

from autosched.model._simevents import HOST_END, Stall
from autosched.model.taskmodel import CORES

__all__ = ["HostSide"]


class HostSide:
    """The host-side steps of the event machine (a mixin of ``_Sim``: every attribute is the run's state)."""

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
        for op, _, _ in self._dep_ops(k, i):
            if host_end[op] < 0:
                self.waiters.setdefault(op, []).append(g)
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
        if self.cap and self.takes_core[k]:
            if self.cores_busy >= self.cap:
                if g not in self.cwait:
                    self.cwait.append(g)
                self.cwaited[g] = True
                return
            self.cores_busy += 1
        for r in res:
            self.rbusy[r] = True
        self.start_host(g, inst, k, i, res, now)

    def start_host(self, g: int, inst: int, k: int, i: int, res: Tuple[int, ...], now: float) -> None:
        self.busy[g] = True
        self.host_start[inst] = now
        # the binding wait is the latest constraint; on ties: dep > sequencer > resource > thread > barrier
        enq = self.enq[inst]
        bop, bkind = self.period_pred[i + self.stage[k]]
        if inst in self.handoff_pred:  # handed off once the caller ran the task before it in the order
            bop, bkind = self.handoff_pred[inst], self.thread_label[self.caller]
        bt = enq
        ft = self.free_t[g]
        if ft >= bt:
            bt, bop, bkind = ft, self.free_op[g], self.thread_label[g]
        fifo_end = bt
        for r in res:
            if self.rfree_t[r] >= bt:
                bt, bop, bkind = self.rfree_t[r], self.rfree_op[r], self.res_names[r]
        if self.cwaited[g]:  # only a task that found every core busy waited for one
            self.cwaited[g] = False
            if self.cfree_t >= bt:
                bt, bop, bkind = self.cfree_t, self.cfree_op, CORES
        if self.seqd[k] and self.seq_free_t >= bt:
            bt, bop, bkind = self.seq_free_t, self.seq_free_op, "sequencer"
        host_end = self.host_end
        for op, label, _ in self._dep_ops(k, i):
            if host_end[op] >= bt:
                bt, bop, bkind = host_end[op], op, label
        self.pred_op[inst] = bop
        self.pred_kind[inst] = bkind
        if fifo_end > enq:
            self.stalls.append(Stall(self.names[k], i, "host", self.fifo_label[g], fifo_end - enq))
        if now > fifo_end:
            self.stalls.append(Stall(self.names[k], i, "host", bkind, now - fifo_end))
        self.push(now + self.host[k], HOST_END, g)

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
        if self.cap and self.takes_core[k]:  # the core goes to the threads that waited for one first, oldest first
            self.cores_busy -= 1
            self.cfree_t, self.cfree_op = t, inst
            wake_threads = self.cwait + wake_threads
            self.cwait = []
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
        self.remaining[i] -= 1
        if self.remaining[i] == 0:
            self.cpu_done[i] = t
            self.retire_op[i] = inst
        if g == self.caller:
            p = i + self.stage[k]
            self.caller_left[p] -= 1
            self.caller_done_t[p] = t
            self.caller_done_op[p] = inst
            held = self.held.pop(inst, None)
            if held:
                self.release(held, t, inst)
        self.advance_main()
        for x in wake_threads:
            self.try_host(x, t)
        self.try_host(g, t)
        if self.cuda:
            self.try_stream(self.stream[k], t)
