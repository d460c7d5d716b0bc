"""The serial path of the engine: every task of an iteration in turn, on the caller's thread.

A mixin of :class:`~swpipe_core.engine.pipeline.SWPipeline` (kept apart so each file
stays one idea). The serial run is the baseline a pipelined run is compared
with: no workers, no overlap, no in-flight state; the tasks of an iteration
run in a topological order of the intra-iteration dependencies (ties broken
by enqueue order) on the default stream, through the same dispatch point as
the pipelined run (``_exec_task``: the wrappers of ``instrument``, shortcuts
and strict mode apply). Also here: :func:`_profiler_active`, which the pipelined
path uses too.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Dict, Iterable, Iterator, List

import torch

from swpipe_core.engine.checks import check_idle, check_runnable
from swpipe_core.engine.state import PipelineTaskError, _GuardedContext, _TaskInfo
from swpipe_core.order import enqueue_order
from swpipe_core.plan import IterContext, PipelinePlan

__all__: List[str] = []

_log = logging.getLogger("swpipe_core.engine.pipeline")

_SERIAL_GROUP = "serial"


def _profiler_active() -> bool:
    """Whether a torch profiler is recording: the thread-local C++ flag, or the
    module flag torch.profiler sets (also in all-threads mode, where the C++
    flag reads False)."""
    return bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", False)) or torch.autograd._profiler_enabled()


class _SerialRunner:
    """Serial execution of a pipeline's plan; expects ``_streams``, ``_recorder``, ``device``,
    ``plan``, ``_run``, ``_serial_order`` and the engine's ``_teardown``,
    ``_exec_task``, ``_range_name``, ``_emit_nvtx`` and ``_sync_device``."""

    @staticmethod
    def _topological(plan: PipelinePlan, by_name: Dict[str, _TaskInfo]) -> List[_TaskInfo]:
        """Serial order: a topological order of the intra deps, ties broken by enqueue order."""
        import networkx as nx

        pos = {n: i for i, n in enumerate(enqueue_order(plan))}
        graph = nx.DiGraph()
        graph.add_nodes_from(plan.task_names)
        graph.add_edges_from((d, t) for t, d in plan.intra_edges())
        return [by_name[n] for n in nx.lexicographical_topological_sort(graph, key=lambda n: pos[n])]

    def run_serial(self, data_iter: Iterable[Any], verbose: bool = False, emit_nvtx: bool = False) -> float:
        """Run every iteration serially on the caller's thread and the default stream; returns wall seconds.

        The baseline a pipelined run is compared with: no workers, no overlap,
        tasks in a topological order of the intra-iteration dependencies.
        Ranges are named ``SWP_serial/{Task}/iter{N}`` (``[skip]`` added for
        shortcut tasks). Timeline events carry thread group ``"serial"``.

        Raises
        ------
        PipelineTaskError
            A task raised (``thread_group`` is the task's configured group).
        RuntimeError
            Pipelined iterations are in flight (call :meth:`drain` first).

        Examples
        --------
        >>> from swpipe_core.engine.pipeline import SWPipeline
        >>> from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
        >>> seen = []
        >>> plan = PipelinePlan({PipelineTask("B", lambda ctx: seen.append(("B", ctx.iter_idx))): TaskSchedule(1),
        ...                      PipelineTask("A", lambda ctx: seen.append(("A", ctx.iter_idx))): TaskSchedule(0)},
        ...                     intra_iter_deps=[("B", "A")])
        >>> _ = SWPipeline(plan, device="cpu").run_serial(range(2))
        >>> seen
        [('A', 0), ('B', 0), ('A', 1), ('B', 1)]
        """
        check_runnable(self.plan)
        check_idle(self._run, "run_serial() called")
        self._teardown(cancelling=False)
        if self._recorder is not None:
            self._recorder.clear()
        t0 = time.perf_counter()
        n = 0
        with self._emit_nvtx(emit_nvtx):
            for i, batch in enumerate(data_iter):
                self._serial_iteration(batch, i)
                n += 1
                if verbose:
                    _log.info("SWPipeline.run_serial: finished iteration %d at %.3f ms", i,
                              (time.perf_counter() - t0) * 1e3)
            self._sync_device("run_serial()")
        elapsed = time.perf_counter() - t0
        if verbose:
            _log.info("SWPipeline.run_serial: %d iteration(s) in %.3f s (%.3f ms/iteration)", n, elapsed,
                      elapsed * 1e3 / max(n, 1))
        return elapsed

    def run_one_serial_iter(self, batch: Any, iter_idx: int = 0) -> None:
        """One serial iteration on the default stream; no workers, no in-flight state.

        Respects shortcuts (a shortcut task replays its cache). Timeline
        events, when recorded, are appended to the current timeline.

        Parameters
        ----------
        batch : Any
        iter_idx : int

        Raises
        ------
        PipelineTaskError
            A task raised.
        RuntimeError
            Pipelined iterations are in flight (call :meth:`drain` first).

        Examples
        --------
        >>> from swpipe_core.engine.pipeline import SWPipeline
        >>> from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
        >>> seen = []
        >>> plan = PipelinePlan({PipelineTask("A", lambda ctx: seen.append((ctx.batch, ctx.iter_idx))): TaskSchedule()})
        >>> SWPipeline(plan, device="cpu").run_one_serial_iter("b", iter_idx=7); seen
        [('b', 7)]
        """
        check_runnable(self.plan)
        check_idle(self._run, "run_one_serial_iter() called")
        self._serial_iteration(batch, iter_idx)

    def _serial_iteration(self, batch: Any, i: int) -> None:
        cuda = self._streams.is_cuda
        ctx = (_GuardedContext if cuda else IterContext)(batch, i)
        recorder = self._recorder
        profiling = _profiler_active()
        dev = self._streams.dev
        stream = dev.default_stream()
        if cuda:  # a batch the iterator made on another current stream is ready before the tasks read it
            for ready in self._streams.batch_ready(batch):
                dev.wait(stream, ready)
        with self._streams.use(stream), self._serial_held(stream, ctx):
            for ti in self._serial_order:
                t0 = time.perf_counter() if recorder is not None else 0.0
                name = self._range_name("SWP_serial", ti.name, i) if (cuda or profiling) else ""
                if cuda:
                    dev.nvtx_push(name)
                try:
                    if profiling:
                        with torch.autograd.profiler.record_function(name):
                            self._exec_task(ti.task, ctx)
                    else:
                        self._exec_task(ti.task, ctx)
                except Exception as exc:
                    raise PipelineTaskError(ti.name, i, ti.group, ti.stage, exc) from exc
                finally:
                    if cuda:
                        dev.nvtx_pop()
                if recorder is not None:
                    recorder.record(ti.name, i, _SERIAL_GROUP, "default", t0, time.perf_counter())

    @contextlib.contextmanager
    def _serial_held(self, stream: Any, ctx: IterContext) -> Iterator[None]:
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
            if self._streams.is_cuda:
                streams, pending = self._streams, self._serial_pending
                pending.append((streams.record(stream), ctx))
                while pending and streams.completed([pending[0][0]]):
                    streams.recycle([pending.popleft()[0]])
                if len(pending) > self.max_device_lag + 1:
                    if not streams.wait_events([pending[0][0]], self.progress_timeout):
                        raise RuntimeError(self._device_hung("a serial iteration"))
                    streams.recycle([pending.popleft()[0]])
