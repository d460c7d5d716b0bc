"""The simulator's device side: a task's device part runs on its stream, waits for events and resources, ends.

:class:`DeviceSide` holds the methods of :class:`autosched.model._simcore._Sim` that
run a task's device part (CUDA only): :meth:`~DeviceSide.try_stream` starts the head
of a stream's FIFO once the device events it waits for have completed and its
resources (a communicator in submission order, PCIe) are free, recording the
binding wait and the stalls; :meth:`~DeviceSide.dev_done` ends it, completes the
iteration on the device and wakes the waiting streams.
"""

from __future__ import annotations

from autosched.model._simevents import DEV_END, Stall

__all__ = ["DeviceSide"]


class DeviceSide:
    """The device-side steps of the event machine (a mixin of ``_Sim``: every attribute is the run's state)."""

    def try_stream(self, s: int, now: float) -> None:
        """Start the device part at the head of stream ``s`` if its events and resources allow."""
        if self.sbusy[s] or not self.squeue[s]:
            return
        inst = self.squeue[s][0]
        n = self.n
        k, i = divmod(inst, n)
        dev_end = self.dev_end
        for op, _, _ in self._dep_ops(k, i):
            if dev_end[op] < 0:
                self.dwaiters.setdefault(op, []).append(s)
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
        for op, _, label in self._dep_ops(k, i):
            if dev_end[op] >= bt:
                bt, bop, bkind = dev_end[op], N + op, label
        self.pred_op[N + inst] = bop
        self.pred_kind[N + inst] = bkind
        if fifo_end > sub:
            self.stalls.append(Stall(self.names[k], i, "device", self.stream_label[s], fifo_end - sub))
        if now > fifo_end:
            self.stalls.append(Stall(self.names[k], i, "device", bkind, now - fifo_end))
        self.push(now + self.dev[k], DEV_END, s)

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
        self.dev_left[i] -= 1
        if self.dev_left[i] == 0:
            self.dev_done_t[i] = t
            self.dev_done_op[i] = self.T * self.n + inst
            self.advance_main()
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
