"""The device side of the engine: when a context may be freed, run-ahead, and bounded waits.

A mixin of :class:`~swpipe_core.engine.pipeline.SWPipeline` (kept apart so each file
stays one idea). On CUDA, CPU completion is not device completion: a retired
iteration waits in ``run.device_pending`` until the device events of all its
tasks have completed, and only then is its context (with everything its
tasks deleted or replaced, see :class:`~swpipe_core.engine.state._GuardedContext`)
released. ``max_device_lag`` bounds how many may wait. Every host-side wait
for the device is a poll with a deadline (:meth:`StreamPool.wait_events
<swpipe_core.engine.streams.StreamPool.wait_events>`): a kernel that never finishes
(a collective whose peer died) or a sticky CUDA error must neither hang the
caller nor free memory a stream may still read; such contexts go to
``_limbo`` until a later poll finds their fence complete. The end of a
pipelined run is here too (``_finish`` when the data ran out, ``_teardown``
on drain, close or failure): it releases the run's contexts the same way.
On CPU every method here is (nearly) free: there are no events and nothing
to wait for.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional, Tuple

from swpipe_core.engine.failure import cancel, fail_now, stop_workers, surface_failure
from swpipe_core.engine.state import _IterState, _Run

__all__: List[str] = []

_log = logging.getLogger("swpipe_core.engine.pipeline")


class _DeviceLifetime:
    """Device-side bookkeeping of a pipeline and the end of a run; expects ``_run``, ``_streams``, ``_infos``,
    ``_recorder``, ``_limbo``, ``_serial_pending``, ``max_device_lag``, ``progress_timeout``, ``_join_timeout``
    and ``_teardown_timeout``."""

    def _prune_device(self, run: _Run) -> None:
        """Release retired contexts (and what their tasks deleted) whose device work has completed.

        The events of a released iteration stay in ``run.device_pending`` while
        a task still to launch may wait for them (an inter-iteration
        dependency, up to the plan's largest distance): the device order is
        kept by those waits (on completed events, free), never by this
        thread having seen them complete.
        """
        completed = self._streams.completed
        horizon = run.oldest - self._event_horizon()
        for j in list(run.device_pending):
            st = run.device_pending[j]
            if st.ctx is not None:
                if not completed(st.events):
                    continue
                self._release_context(run, st)
            if j < horizon:
                del run.device_pending[j]
                self._free_state(run, st)

    def _event_horizon(self) -> int:
        """How many iterations back a task may wait for an event: the largest inter-iteration distance (else 0)."""
        return max((dist for ti in self._infos for _, dist in ti.device_deps), default=0)

    def _release_context(self, run: _Run, st: _IterState) -> None:
        """An iteration whose device work has completed: read its timing and drop its context; keep its events."""
        if st.timing:
            run.device_timing.extend(st.timing)
            st.timing = []
            self._collect_device_timeline(run)
        st.ctx = None

    def _free_state(self, run: _Run, st: _IterState) -> None:
        """An iteration whose device work has completed: its context, timing and events (given back) released."""
        self._release_context(run, st)
        self._streams.recycle(st.events)
        st.events = [None] * len(st.events)

    def _bound_device_lag(self, run: _Run, retired: int) -> None:
        """Bounded run-ahead: wait for the device events of iteration ``retired - max_device_lag``."""
        st = run.device_pending.get(retired - self.max_device_lag)
        if st is None or st.ctx is None:  # negative, or already released: its device work completed
            return
        if not self._streams.wait_events(st.events, self.progress_timeout, wake=run.stop):
            if run.cancelled:  # a failure elsewhere ended the wait: report that one
                surface_failure(run, self._join_timeout)
            error = RuntimeError(
                f"progress() waited {self.progress_timeout:g} s for the device work of iteration {st.idx} "
                f"(max_device_lag={self.max_device_lag}); tasks whose device work has not completed: "
                f"{[ti.name for ti in self._infos if not self._streams.query(st.events[ti.idx])]}. A kernel is "
                "hung (a dead peer rank?) or slow (raise progress_timeout); call drain() or fill_pipeline()")
            fail_now(run, error, f"device-lag timeout on iteration {st.idx}", self._join_timeout)
        self._release_context(run, st)  # its events stay for later waiters; _prune_device gives them back

    def _device_lag(self) -> int:
        """Retired iterations whose device work has not completed yet (0 on CPU); for tests."""
        run = self._run
        if run is None:
            return 0
        return sum(1 for st in list(run.device_pending.values()) if not all(map(self._streams.query, st.events)))

    def _release(self, run: _Run, states: List[_IterState], timeout: float) -> Tuple[bool, Optional[Exception]]:
        """Drop ``states``' contexts once the device work of the run completed (a bounded poll).

        Instead of an unconditional ``torch.cuda.synchronize()``, which blocks
        forever on a kernel that never ends (a collective whose peer died)
        and raises after a sticky CUDA error: the device is fenced and polled
        for ``timeout`` s. If it does not finish, or the device fails, the
        contexts are kept alive in ``_limbo`` (memory a stream may still read
        is never handed back to the allocator) and freed by a later fill or
        drain whose poll finds the fence complete. Returns whether the device
        finished, and the device's error when it failed (never raised here:
        on a failure path it must not mask the caller's exception).
        """
        if not states and not run.device_timing:
            return True, None  # nothing waits on the device
        error: Optional[Exception] = None
        try:
            events: Optional[List[Any]] = self._streams.fence(run.streams)
            done = self._streams.wait_events(events, timeout)
        except Exception as exc:  # a sticky device error
            _log.warning("could not wait for the device (%s: %s); keeping %d iteration context(s) alive",
                         type(exc).__name__, exc, len(states))
            events, done, error = None, False, exc
        if done:
            self._streams.recycle(events)
            for st in states:
                self._free_state(run, st)
            self._collect_device_timeline(run)
            return True, None
        if events is not None:
            _log.warning("device work did not complete within %.1f s; keeping %d iteration context(s) alive until "
                         "it does", timeout, len(states))
        self._limbo.append((events, states, list(run.streams)))
        return False, error

    def _prune_limbo(self) -> None:
        """Free the contexts of earlier teardowns whose device fence has completed since.

        An entry whose fence could not even be recorded (the device had
        failed) is fenced now: once the device works again, its contexts go
        as soon as that fence completes.
        """
        kept = []
        for events, states, streams in self._limbo:
            try:
                if events is None:
                    events = self._streams.fence(streams)
                done = self._streams.wait_events(events, 0.0)
            except Exception:  # the device is still broken
                done = False
            if done:
                for st in states:
                    st.ctx = None  # the run they belonged to is gone; their events are dropped with them
            else:
                kept.append((events, states, streams))
        self._limbo = kept

    def _finish(self, run: _Run) -> None:
        """The data ran out and every iteration retired: stop the workers, release what waits on the device."""
        if not run.finished:
            stop_workers(run, self._join_timeout)
            pending = list(run.device_pending.values())
            run.device_pending.clear()
            run.finished = True
            done, error = self._release(run, pending, self.progress_timeout)
            if not done:
                raise self._device_not_done("progress() at the end of the data", error)

    def _teardown(self, cancelling: bool) -> None:
        """Stop this run's workers, wait (bounded) for its device work, release every context, forget the run.

        Never raises on a failure path (``cancelling`` or a cancelled run): the
        caller is usually re-raising a task's exception, which must not be
        masked, and the pipeline is left usable whatever the device does.
        """
        if self._limbo:
            self._prune_limbo()
        run = self._run
        if run is None:
            return
        failing = cancelling or run.cancelled
        if cancelling and not (run.finished or run.cancelled):
            cancel(run, None, "pipeline closed")
        stop_workers(run, self._join_timeout)
        states = list(run.iters.values()) + list(run.device_pending.values())
        run.iters.clear()
        run.device_pending.clear()
        self._run = None
        timeout = self._teardown_timeout if failing else self.progress_timeout
        done, error = self._release(run, states, timeout)
        if not done and not failing:
            raise self._device_not_done("drain()", error)


    def _device_not_done(self, what: str, error: Optional[Exception]) -> RuntimeError:
        """The error for device work that did not complete: the device's own failure, chained, or a timeout."""
        if error is None:
            return RuntimeError(self._device_hung(what))
        failure = RuntimeError(
            f"{what}: the device failed ({type(error).__name__}: {error}). Its iteration contexts are kept alive "
            "until a later fence completes; a CUDA error is sticky, so the process usually cannot use the device "
            "again")
        failure.__cause__ = error
        return failure

    def _device_hung(self, what: str) -> str:
        return (f"{what}: the device work did not complete within {self.progress_timeout:g} s (progress_timeout); a "
                "kernel is hung (a dead peer rank?) or slow (raise progress_timeout). Its iteration contexts are "
                "kept alive; the pipeline can be filled again")

    def _sync_device(self, what: str) -> None:
        """A bounded wait for all work on the pipeline's streams (nothing on CPU)."""
        if not self._streams.synchronize(self.progress_timeout):
            raise RuntimeError(self._device_hung(what))
        self._serial_pending.clear()  # their device work completed

    def _collect_device_timeline(self, run: _Run) -> None:
        """On CUDA with record_timeline: turn timing events into ``kind="device"`` events.

        Device times are placed on the host clock by the origin event recorded
        at fill time (assumed to execute when it was recorded: an idle device).
        """
        origin = run.origin_event
        if not run.device_timing or origin is None or self._recorder is None or not self._streams.query(origin):
            return  # not yet: the origin is read once it completed (at the latest when the run ends)
        dev, origin_host = self._streams.dev, self._recorder.origin
        for ti, i, start_ev, end_ev in run.device_timing:
            start = origin_host + dev.elapsed_s(origin, start_ev)
            end = origin_host + dev.elapsed_s(origin, end_ev)
            self._recorder.record(ti.name, i, ti.group, ti.stream, start, end, kind="device")
            self._streams.recycle((start_ev, end_ev), timing=True)
        run.device_timing.clear()
