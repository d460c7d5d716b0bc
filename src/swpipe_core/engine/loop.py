"""The period loop: start a run, fetch a batch, walk one period, retire the oldest iteration.

``SWPipeline.fill_pipeline``, ``progress`` and ``drain`` drive these steps;
each receives the :class:`~swpipe_core.engine.run.Run` it works on. A period
``p`` runs, for every task ``T``, iteration ``p - stage(T)``: the caller walks
the plan's enqueue order, handing worker groups' tasks to their workers and
running the caller group's tasks inline (:mod:`swpipe_core.engine.tasks`);
the period's shape is compiled once and cached
(:meth:`CompiledPlan.program <swpipe_core.engine.program.CompiledPlan.program>`).
Retiring waits until the oldest iteration's tasks have all set their CPU
signals, then hands its context to the device bookkeeping
(:mod:`swpipe_core.engine.lifetime`) on CUDA or drops it on CPU.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, List

from swpipe_core.engine.dispatch import profiler_active
from swpipe_core.engine.failure import cancel, inline_overran, progress_timed_out, surface_failure
from swpipe_core.engine.lifetime import prune_device
from swpipe_core.engine.run import Flag, IterState, Run
from swpipe_core.engine.tasks import run_items, run_solo
from swpipe_core.engine.watchdog import InlineWatchdog
from swpipe_core.engine.workers import Workers

__all__: List[str] = []

#: The batch of a period that creates no new iteration (the data ran out, or the pipeline drains).
NO_BATCH = object()


def start_threads(run: Run) -> None:
    """Start the run's watchdog (a caller's group with a finite ``signal_s``) and its workers (other groups).

    A plan whose only group is the caller's starts no worker thread.
    """
    compiled, timeouts = run.compiled, run.timeouts
    if compiled.caller_group is not None and timeouts.signal_s < threading.TIMEOUT_MAX:
        run.watchdog = InlineWatchdog(timeouts.signal_s, functools.partial(inline_overran, run))
        run.watchdog.start()
    if compiled.worker_groups:
        run.workers = Workers(compiled.worker_groups, lambda group, items: run_items(run, items),
                               setup=run.pool.dev.set_current,
                               on_crash=lambda group, exc: cancel(run, exc, f"worker swpipe-{group} crashed"),
                               scope=run.pool.dev.nvtx_mode if run.nvtx else None)
        run.workers.start()


def fetch(run: Run) -> Any:
    """The next batch, or :data:`NO_BATCH` when the data ran out (the data iterator's own errors propagate)."""
    if run.exhausted:
        return NO_BATCH
    try:
        batch = next(run.data_iter)
    except StopIteration:
        run.exhausted = True
        return NO_BATCH
    if run.pool.is_cuda:  # CUDA tensors the iterator made on this thread's stream: tasks wait for them
        run.ready = run.pool.batch_ready(batch)
    return batch


def advance(run: Run, batch: Any) -> None:
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
    if batch is not NO_BATCH:
        st = run.iters[p] = IterState(p, run.ctx_type(batch, p), len(run.compiled.tasks), run.pool.is_cuda)
        st.ready, run.ready = run.ready, ()
        run.fetched = p + 1
    run.period = p + 1
    run.profiling = profiling = profiler_active()
    run.bare = run.plain and not profiling
    compiled = run.compiled
    program = compiled.programs.get(compiled.walk.key(p, run.oldest, run.fetched))
    infos, segments = program if program is not None else compiled.program(p, run.oldest, run.fetched)
    iters = run.iters
    ticket = run.sequencer.ticket  # taken in the walk's order, across groups: every rank issues the same
    items = [(iters[p - ti.stage], ti, ticket(f"{ti.name} (iteration {p - ti.stage})") if ti.ordered else None)
             for ti in infos]
    if run.workers is None:
        if run.bare:
            run_solo(run, items)
        else:
            run_items(run, items, inline=True)
        return
    for handoff, inline_at in segments:
        if run.cancelled:
            return
        for group, at in handoff:
            run.workers.submit(group, [items[k] for k in at])
        if inline_at:
            run_items(run, [items[k] for k in inline_at], inline=True)


def retire_oldest(run: Run) -> int:
    """Wait until the oldest iteration completed on the CPU, retire it; its index.

    Raises
    ------
    PipelineTaskError, RuntimeError
        A task failed, or the iteration did not complete within ``Timeouts.progress_s``.
    """
    idx = run.oldest
    st = run.iters[idx]
    if run.cancelled:
        surface_failure(run)
    if st.remaining and not _wait_complete(run, st) and not run.cancelled:
        progress_timed_out(run, st)
    if run.cancelled:
        surface_failure(run)
    if run.pool.is_cuda:
        run.device_pending[idx] = st  # first, so a worker looking up idx always finds its events
        del run.iters[idx]
        prune_device(run)
    else:
        del run.iters[idx]
        st.ctx = None
    run.oldest = idx + 1
    return idx


def _wait_complete(run: Run, st: IterState) -> bool:
    """Block until every task of ``st`` set its CPU signal (or the run is cancelled); whether it did.

    The flag is made only when the caller must block (usually it need
    not: the iteration completed during the periods it waited in line).
    """
    with run.lock:
        if not st.remaining or run.cancelled:
            return True
        if st.complete is None:
            st.complete = Flag()
        flag = st.complete
    return flag.wait(run.timeouts.progress_s)
