"""The engine's period loop: fetch a batch, walk one period, retire the oldest iteration.

A mixin of :class:`~swpipe_core.engine.pipeline.SWPipeline` (kept apart so each file
stays one idea): the public calls (``fill_pipeline``, ``progress``,
``drain``) drive these steps; this is what they do each period. A period
``p`` runs, for every task ``T``, iteration ``p - stage(T)``: the caller
walks the plan's enqueue order, handing worker groups' tasks to their
workers and running the caller group's tasks inline
(:mod:`swpipe_core.engine.tasks`); the period's shape is compiled once and
cached (:func:`~swpipe_core.engine.program.period_program`). Retiring waits
until the oldest iteration's tasks have all set their CPU signals, then
hands its context to the device bookkeeping (:mod:`swpipe_core.engine.lifetime`)
on CUDA or drops it on CPU.
"""

from __future__ import annotations

from typing import Any, List

from swpipe_core.engine.failure import progress_timed_out, surface_failure
from swpipe_core.engine.program import period_program
from swpipe_core.engine.serial import _profiler_active
from swpipe_core.engine.state import _Flag, _IterState, _Run

__all__: List[str] = []

#: The batch of a period that creates no new iteration (the data ran out, or the pipeline drains).
_NO_BATCH = object()


class _PeriodLoop:
    """One period at a time; expects ``_streams``, ``_infos``, ``_by_name``, ``_walk``, ``_programs``,
    ``progress_timeout``, ``_join_timeout`` and the engine's ``_run_items``, ``_run_solo`` and ``_prune_device``."""

    def _fetch(self, run: _Run) -> Any:
        if run.exhausted:
            return _NO_BATCH
        try:
            batch = next(run.data_iter)
        except StopIteration:
            run.exhausted = True
            return _NO_BATCH
        if self._streams.is_cuda:  # CUDA tensors the iterator made on this thread's stream: tasks wait for them
            run.ready = self._streams.batch_ready(batch)
        return batch

    def _advance(self, run: _Run, batch: Any) -> None:
        """Run period ``run.period`` (creating its new iteration if a batch was fetched).

        The caller walks the enqueue order: a worker group's task is handed
        to its worker when the walk reaches it, the caller group's task is
        run inline then, so a worker task placed after a caller's task starts
        only once the caller has run that task (as a pipeline's
        ``progress()`` issues work at its place in the program). No deadlock:
        the enqueue order is a topological order of the period-local graph,
        so every dependency of an inline task is an earlier inline task, an
        earlier task already handed to a worker (whose own dependencies
        precede it in the same order), or a task of an earlier period, all of
        which complete without the caller.
        """
        p = run.period
        if batch is not _NO_BATCH:
            st = run.iters[p] = _IterState(p, run.ctx_type(batch, p), len(self._infos), run.streams)
            st.ready, run.ready = run.ready, ()
            run.fetched = p + 1
        run.period = p + 1
        run.profiling = profiling = _profiler_active()
        run.bare = run.plain and not profiling
        key = self._walk.key(p, run.oldest, run.fetched)
        program = self._programs.get(key)
        if program is None:  # a period shape not seen yet: compiled once, then cached
            shape = self._walk.shape(p, run.oldest, run.fetched)
            program = self._programs[key] = period_program(shape, self._by_name)
        infos, segments = program
        iters = run.iters
        ticket = run.sequencer.ticket  # taken in the walk's order, across groups: every rank issues the same
        items = [(iters[p - ti.stage], ti, ticket(f"{ti.name} (iteration {p - ti.stage})") if ti.ordered else None)
                 for ti in infos]
        if run.workers is None:
            inline = items
            if run.bare:
                self._run_solo(run, inline)
            else:
                self._run_items(run, inline, inline=True)
            return
        for handoff, inline_at in segments:
            if run.cancelled:
                return
            for group, at in handoff:
                run.workers.submit(group, [items[k] for k in at])
            if inline_at:
                self._run_items(run, [items[k] for k in inline_at], inline=True)

    def _retire_oldest(self, run: _Run) -> int:
        idx = run.oldest
        st = run.iters[idx]
        if run.cancelled:
            surface_failure(run, self._join_timeout)
        if st.remaining and not self._wait_complete(run, st) and not run.cancelled:
            progress_timed_out(run, st, self._infos, self.progress_timeout, self._join_timeout)
        if run.cancelled:
            surface_failure(run, self._join_timeout)
        if self._streams.is_cuda:
            run.device_pending[idx] = st  # first, so a worker looking up idx always finds its events
            del run.iters[idx]
            self._prune_device(run)
        else:
            del run.iters[idx]
            st.ctx = None
        run.oldest = idx + 1
        return idx

    def _wait_complete(self, run: _Run, st: _IterState) -> bool:
        """Block until every task of ``st`` set its CPU signal (or the run is cancelled); whether it did.

        The flag is made only when the caller must block (usually it need
        not: the iteration completed during the periods it waited in line).
        """
        with run.lock:
            if not st.remaining or run.cancelled:
                return True
            if st.complete is None:
                st.complete = _Flag()
            flag = st.complete
        return flag.wait(self.progress_timeout)
