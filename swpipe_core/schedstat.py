"""The wait for a core after each wake-up, read from the kernel's scheduler statistics of a run's own threads.

Linux keeps, per thread, how long it has been runnable but not running (its
run delay) and how many times it was put on a CPU
(``/proc/thread-self/schedstat``, fields 2 and 3). A pipelined run's threads
sleep at every cross-thread dependency, every empty queue and every contended
GIL take-back, and each wake-up then waits for a core. Over a run, the run
delay per time on a CPU is what one such wake-up costs beyond the hand-off.

It depends on the plan as well as the machine: on a 2-core VM whose idle
virtual CPUs must be woken, a DLRM plan whose threads run in turn
(``fused_sparse_dist+by_stream``) waited 72-109 us per wake-up, where plans
whose threads stay busy waited 15-25 us, as much as the cross-thread wake-up
:func:`swpipe_core.calibrate.measure_engine_costs` measures in a tight loop.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Optional, Sequence, Tuple

__all__ = ["thread_run_delay", "measure_wake_s"]

_SCHEDSTAT = "/proc/thread-self/schedstat"


def thread_run_delay() -> Optional[Tuple[float, int]]:
    """The calling thread's run delay so far (seconds) and how many times it was put on a CPU; ``None`` off Linux.

    Examples
    --------
    >>> got = thread_run_delay()
    >>> got is None or (got[0] >= 0 and got[1] >= 1)
    True
    """
    try:
        fd = os.open(_SCHEDSTAT, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _parse(os.pread(fd, 128, 0))
    finally:
        os.close(fd)


def _parse(text: bytes) -> Optional[Tuple[float, int]]:
    try:
        _on_cpu_ns, delay_ns, slices = (int(x) for x in text.split()[:3])
    except ValueError:
        return None
    return delay_ns * 1e-9, slices


class _Readers:
    """One open ``schedstat`` per thread, read again with ``pread``: a task start costs one system call."""

    def __init__(self) -> None:
        self._fds: Dict[int, int] = {}

    def read(self) -> Optional[Tuple[float, int]]:
        me = threading.get_native_id()
        fd = self._fds.get(me)
        if fd is None:
            try:
                fd = self._fds[me] = os.open(_SCHEDSTAT, os.O_RDONLY)  # the file of the thread that opens it
            except OSError:
                return None
        return _parse(os.pread(fd, 128, 0))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def measure_wake_s(pipe: Any, batches: Sequence[Any]) -> Optional[float]:
    """Run ``batches`` through ``pipe`` and return its threads' mean run delay per time on a CPU (seconds).

    Each thread that runs a task reads its own counters as each task starts
    (one file read per task); the first and last reading of every thread
    bound what it waited between them, dependency waits and queue waits
    included.

    Parameters
    ----------
    pipe : SWPipeline
        Bound and idle; its plan runs once over ``batches`` (a pipelined run, training included).
    batches : sequence
        At least ``pipeline_depth + 2`` of them: the threads must wake up between readings.

    Returns
    -------
    float or None
        Seconds of run delay per time on a CPU over every thread that ran a
        task, or ``None`` where the counters cannot be read (not Linux, no
        ``schedstat``) or no thread was put on a CPU between its readings.

    Examples
    --------
    >>> from swpipe_core.engine import SWPipeline
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")}, [("B", "A")])
    >>> with SWPipeline(plan.bind({"A": lambda ctx: None, "B": lambda ctx: None}), device="cpu") as pipe:
    ...     wake = measure_wake_s(pipe, range(20))
    >>> wake is None or wake >= 0
    True
    """
    first: Dict[int, Tuple[float, int]] = {}
    last: Dict[int, Tuple[float, int]] = {}

    readers = _Readers() if thread_run_delay() is not None else None

    def read_then_run(run: Any, task: Any, ctx: Any) -> None:
        now = readers.read() if readers is not None else None
        if now is not None:
            me = threading.get_native_id()
            first.setdefault(me, now)  # one writer per key: the thread itself
            last[me] = now
        run(task, ctx)

    try:
        with pipe.instrument(read_then_run):
            pipe.run(list(batches))
    finally:
        if readers is not None:
            readers.close()
    delay = sum(last[t][0] - first[t][0] for t in first)
    slices = sum(last[t][1] - first[t][1] for t in first)
    return delay / slices if slices > 0 else None
