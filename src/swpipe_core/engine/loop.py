"""The period loop of one pipelined run: fetch a batch, walk one period, retire the oldest iteration.

A :class:`PeriodLoop` is one ``fill_pipeline`` .. ``drain`` cycle of a
:class:`~swpipe_core.engine.pipeline.SWPipeline`, which makes one per fill
and drives it (``fill_pipeline``, ``progress``, ``drain``). It owns the
iterations in flight, the period counter and the data, and holds the run's
other owners: how the tasks run (:class:`~swpipe_core.engine.tasks.TaskRunner`),
the device lifetimes (:class:`~swpipe_core.engine.lifetime.DeviceLifetimes`)
and the failure (:class:`~swpipe_core.engine.failure.RunFailure`); each
changes only its own state (docs/architecture.md, "The state of a run"). A
period ``p`` runs, for every task ``T``, iteration ``p - stage(T)``; the
period's shape is compiled once and cached
(:meth:`CompiledPlan.program <swpipe_core.engine.program.CompiledPlan.program>`).
Retiring waits until the oldest iteration's tasks have all set their CPU
signals, then hands its context to the device lifetimes on CUDA or drops it
on CPU.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Iterator, List

from swpipe_core.engine.failure import RunFailure
from swpipe_core.engine.lifetime import DeviceLifetimes, Limbo
from swpipe_core.engine.run import RunSetup
from swpipe_core.engine.tasks import IterState, TaskRunner

__all__ = ["PeriodLoop", "NO_BATCH"]

#: The batch of a period that creates no new iteration (the data ran out, or the pipeline drains).
NO_BATCH = object()


class PeriodLoop:
    """One pipelined run: its iterations in flight, where the period loop stands, and the run's other owners.

    Attributes
    ----------
    setup : RunSetup
        What the run executes and with what (fixed).
    failure : RunFailure
        How the run fails.
    tasks : TaskRunner
        How its tasks run (threads, per-period flags).
    device : DeviceLifetimes
        What it keeps alive for the device (CUDA).
    """

    __slots__ = ("setup", "failure", "tasks", "device", "data_source", "data_iter", "iters", "oldest", "period",
                 "fetched", "exhausted", "draining", "ready", "finished")

    def __init__(self, setup: RunSetup, data_source: Iterable[Any], data_iter: Iterator[Any],
                 origin_event: Any = None, first: int = 0) -> None:
        self.setup = setup
        self.failure = failure = RunFailure(setup)
        self.device = DeviceLifetimes(setup, failure, origin_event)
        self.iters: Dict[int, IterState] = {}  # in flight, by iteration
        self.tasks = TaskRunner(setup, failure, self.iters, self.device.pending)
        self.data_source = data_source
        self.data_iter = data_iter
        # iterations are numbered from ``first`` (the ctx.iter_idx of the first batch, SWPipeline's first_iter_idx);
        # a shape depends on the period relative to the iterations in flight only, so the programs are the same
        self.oldest = first        # next iteration to retire
        self.period = first        # next period to enqueue
        self.fetched = first       # one past the last iteration created so far
        self.exhausted = False     # the data ran out
        self.draining = False      # progress(None) or drain(): no new iterations
        self.ready: Any = ()       # the last fetched batch's ready events, until its iteration state takes them
        self.finished = False      # everything retired, threads stopped

    @property
    def in_flight(self) -> int:
        """Iterations enqueued and not retired yet (0 once the run finished)."""
        return 0 if self.finished else self.fetched - self.oldest

    @property
    def busy(self) -> bool:
        """Whether iterations are in flight that may still run (neither finished nor cancelled)."""
        return not (self.finished or self.failure.cancelled)

    @property
    def retired_all(self) -> bool:
        """Whether every iteration created so far has retired."""
        return self.oldest >= self.fetched

    # ------------------------------------------------------------ the steps

    def start(self, depth: int) -> None:
        """Start the run's threads and run its first ``depth`` periods."""
        self.tasks.start()
        for _ in range(depth):
            self.advance(self.fetch())

    def start_draining(self) -> None:
        """No new iterations from now on (``progress(None)``, ``drain``)."""
        self.draining = self.exhausted = True

    def fetch(self) -> Any:
        """The next batch, or :data:`NO_BATCH` when the data ran out (the data iterator's own errors propagate)."""
        if self.exhausted:
            return NO_BATCH
        try:
            batch = next(self.data_iter)
        except StopIteration:
            self.exhausted = True
            return NO_BATCH
        pool = self.setup.pool
        if pool.is_cuda:  # CUDA tensors the iterator made on this thread's stream: tasks wait for them
            self.ready = pool.batch_ready(batch)
        return batch

    def advance(self, batch: Any) -> None:
        """Run period ``self.period`` (creating its new iteration if a batch was fetched).

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
        setup = self.setup
        compiled = setup.compiled
        p = self.period
        iters = self.iters
        if batch is not NO_BATCH:
            st = iters[p] = IterState(p, setup.ctx_type(batch, p), len(compiled.tasks), setup.pool.is_cuda)
            st.ready, self.ready = self.ready, ()
            self.fetched = p + 1
        self.period = p + 1
        program = compiled.programs.get(compiled.walk.key(p, self.oldest, self.fetched))
        infos, segments = program if program is not None else compiled.program(p, self.oldest, self.fetched)
        ticket = setup.sequencer.ticket  # taken in the walk's order, across groups: every rank issues the same
        items = [(iters[p - ti.stage], ti, ticket(f"{ti.name} (iteration {p - ti.stage})") if ti.ordered else None)
                 for ti in infos]
        self.tasks.run_period(items, segments)

    def retire_oldest(self) -> int:
        """Wait until the oldest iteration completed on the CPU, retire it; its index.

        Raises
        ------
        PipelineTaskError, RuntimeError
            A task failed, or the iteration did not complete within ``Timeouts.progress_s``.
        """
        idx = self.oldest
        st = self.iters[idx]
        failure = self.failure
        if failure.cancelled:
            failure.surface()
        if st.remaining and not self.tasks.wait_complete(st) and not failure.cancelled:
            failure.progress_timed_out(st.idx, st.done)
        if failure.cancelled:
            failure.surface()
        if self.setup.pool.is_cuda:
            self.device.hold(idx, st)  # first, so a worker looking up idx always finds its events
            del self.iters[idx]
            self.device.prune(idx)
        else:
            del self.iters[idx]
            st.ctx = None
        self.oldest = idx + 1
        return idx

    def drain(self) -> None:
        """Retire every iteration in flight, running the periods that finish them (no new data)."""
        self.start_draining()
        while self.oldest < self.fetched:
            self.retire_oldest()
            self.advance(NO_BATCH)

    # ------------------------------------------------------------ the end

    def finish(self, limbo: Limbo) -> None:
        """The data ran out and every iteration retired: stop the threads, release what waits on the device."""
        if self.finished:
            return
        self.tasks.stop()
        self.finished = True
        self.device.finish(limbo)

    def stop(self, cancelling: bool) -> List[IterState]:
        """Cancel the run when closing it, join its threads, and take every iteration it still holds.

        Never raises for the run's own failure: the caller is usually re-raising
        a task's exception, which must not be masked.
        """
        if cancelling and self.busy:
            self.failure.cancel(None, "pipeline closed")
        self.tasks.stop()
        states = list(self.iters.values()) + self.device.take_pending()
        self.iters.clear()
        return states

    def end(self, states: List[IterState], cancelling: bool, limbo: Limbo) -> None:
        """Release ``states``' contexts once the device is done with them (:meth:`DeviceLifetimes.end`)."""
        self.device.end(states, cancelling or self.failure.cancelled, limbo)
