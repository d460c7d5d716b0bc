"""Serial runs: every task of an iteration in turn, on the caller's thread and the device's default stream.

The serial run is the baseline a pipelined run is compared with: no workers,
no overlap, no in-flight state. The tasks of an iteration run in a
topological order of the intra-iteration dependencies, ties broken by
enqueue order (:func:`serial_order`), through the pipeline's dispatch point
(the wrappers of ``instrument``, shortcuts and per-task generators apply;
strict mode does not, one task running at a time). On CUDA a serial
iteration's context is kept until its device work has completed
(:class:`SerialRunner`).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple

import torch

from swpipe_core.engine.dispatch import Dispatch, profiler_active
from swpipe_core.engine.failure import task_failed
from swpipe_core.engine.lifetime import GuardedContext, device_hung
from swpipe_core.engine.options import Timeouts
from swpipe_core.engine.program import TaskInfo
from swpipe_core.engine.streams import StreamPool
from swpipe_core.measure.trace import TimelineRecorder
from swpipe_core.order import enqueue_order
from swpipe_core.plan import IterContext, PipelinePlan

__all__ = ["SerialRunner", "serial_order"]

#: The thread group serial runs record their timeline events under.
SERIAL_GROUP = "serial"


def serial_order(plan: PipelinePlan, by_name: Dict[str, TaskInfo]) -> List[TaskInfo]:
    """The order of a serial iteration: a topological order of the intra deps, ties broken by enqueue order.

    Examples
    --------
    >>> from swpipe_core.engine.device import as_device
    >>> from swpipe_core.engine.program import compile_plan
    >>> from swpipe import TaskSchedule
    >>> plan = PipelinePlan({"B": TaskSchedule(1), "A": TaskSchedule(0)}, intra_iter_deps=[("B", "A")])
    >>> [t.name for t in serial_order(plan, compile_plan(plan, StreamPool(as_device("cpu"))).by_name)]
    ['A', 'B']
    """
    import networkx as nx

    pos = {n: i for i, n in enumerate(enqueue_order(plan))}
    graph = nx.DiGraph()
    graph.add_nodes_from(plan.task_names)
    graph.add_edges_from((d, t) for t, d in plan.intra_edges())
    return [by_name[n] for n in nx.lexicographical_topological_sort(graph, key=lambda n: pos[n])]


class SerialRunner:
    """Runs a pipeline's plan one iteration at a time (one per pipeline).

    Parameters
    ----------
    order : list of TaskInfo
        The tasks in serial order (:func:`serial_order`).
    pool : StreamPool
        The pipeline's streams: the default stream runs every task.
    dispatch : Dispatch
        The pipeline's dispatch point.
    recorder : TimelineRecorder, optional
        Records a timeline event per task (thread group ``"serial"``).
    timeouts : Timeouts
        ``progress_s`` bounds the wait for an old iteration's device work.
    max_device_lag : int
        At most ``max_device_lag + 1`` serial iterations wait for their device work (CUDA).
    """

    def __init__(self, order: List[TaskInfo], pool: StreamPool, dispatch: Dispatch,
                 recorder: Optional[TimelineRecorder], timeouts: Timeouts, max_device_lag: int) -> None:
        self.order = order
        self.pool = pool
        self.dispatch = dispatch
        self.recorder = recorder
        self.timeouts = timeouts
        self.max_device_lag = max_device_lag
        self.pending: Deque[Tuple[Any, IterContext]] = deque()  # CUDA: (event, context) of recent iterations

    def iteration(self, batch: Any, i: int) -> None:
        """Run iteration ``i`` on ``batch``, every task in turn.

        Raises
        ------
        PipelineTaskError
            A task raised (``thread_group`` is the task's configured group).
        """
        pool = self.pool
        cuda = pool.is_cuda
        ctx = (GuardedContext if cuda else IterContext)(batch, i)
        recorder, call, range_name = self.recorder, self.dispatch.call_serial, self.dispatch.range_name
        profiling = profiler_active()
        dev = pool.dev
        stream = dev.default_stream()
        if cuda:  # a batch the iterator made on another current stream is ready before the tasks read it
            for ready in pool.batch_ready(batch):
                dev.wait(stream, ready)
        with pool.use(stream), self._held(stream, ctx):
            for ti in self.order:
                t0 = time.perf_counter() if recorder is not None else 0.0
                name = range_name("SWP_serial", ti.name, i) if (cuda or profiling) else ""
                if cuda:
                    dev.nvtx_push(name)
                try:
                    if profiling:
                        with torch.autograd.profiler.record_function(name):
                            call(ti.task, ctx)
                    else:
                        call(ti.task, ctx)
                except Exception as exc:
                    raise task_failed(ti, i, exc) from exc
                finally:
                    if cuda:
                        dev.nvtx_pop()
                if recorder is not None:
                    recorder.record(ti.name, i, SERIAL_GROUP, "default", t0, time.perf_counter())

    def device_done(self) -> None:
        """The device finished every stream's work (a synchronize): nothing waits any more."""
        self.pending.clear()

    @contextlib.contextmanager
    def _held(self, stream: Any, ctx: IterContext) -> Iterator[None]:
        """On CUDA, keep a serial iteration's context (its batch too) until its device work has completed.

        The batch may come from another stream (the loader's) and a task may
        have deleted values its kernels still read: dropping them when the
        iteration returns would hand their blocks back to the caching
        allocator, which reuses them at once on the stream that made them
        (the loader's next batch). As on the pipelined path, at most
        ``max_device_lag + 1`` iterations wait; beyond that the oldest is
        waited for (a bounded poll).
        """
        try:
            yield
        finally:
            if self.pool.is_cuda:
                pool, pending = self.pool, self.pending
                pending.append((pool.record(stream), ctx))
                while pending and pool.completed([pending[0][0]]):
                    pool.recycle([pending.popleft()[0]])
                if len(pending) > self.max_device_lag + 1:
                    if not pool.wait_events([pending[0][0]], self.timeouts.progress_s):
                        raise RuntimeError(device_hung("a serial iteration", self.timeouts.progress_s))
                    pool.recycle([pending.popleft()[0]])
