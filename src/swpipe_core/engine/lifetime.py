"""Lifetimes on the device: what a CUDA run keeps alive, until when, and how a run ends without freeing too early.

On CUDA, CPU completion is not device completion (docs/semantics.md,
"Lifetimes on CUDA"). A CUDA run's contexts are :class:`GuardedContext`
objects: they keep everything removed from them, and after each task
(:func:`context_keeper`) the device tensors nested in them and the gradients
of the pipeline's ``state`` (:func:`state_parameters`). A run's
:class:`DeviceLifetimes` holds its retired iterations until the device events
of all their tasks have completed (:meth:`DeviceLifetimes.prune`); only then
is a context released. ``max_device_lag`` bounds how many wait
(:meth:`DeviceLifetimes.bound_lag`).

Every host-side wait for the device is a poll with a deadline
(:meth:`StreamPool.wait_events <swpipe_core.engine.streams.StreamPool.wait_events>`):
a kernel that never finishes (a collective whose peer died) or a sticky CUDA
error must neither hang the caller nor free memory a stream may still read.
The end of a run (:meth:`DeviceLifetimes.finish` when the data ran out,
:meth:`DeviceLifetimes.end` on drain, close or failure) releases the run's
contexts the same way (:meth:`DeviceLifetimes.release`); those the device has
not finished with go to the
pipeline's :class:`Limbo` until a later poll finds their fence complete. On
CPU all of this is (nearly) free: there are no events and nothing to wait for.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from swpipe_core.engine.device import Device
from swpipe_core.engine.failure import RunFailure
from swpipe_core.engine.run import RunSetup
from swpipe_core.engine.streams import StreamPool
from swpipe_core.engine.tasks import DeviceTiming, IterState
from swpipe_core.plan import IterContext

__all__ = ["GuardedContext", "TrainState", "state_parameters", "context_keeper", "Limbo", "DeviceLifetimes"]

_log = logging.getLogger("swpipe_core.engine.pipeline")

#: What tasks train, as ``SWPipeline(state=...)`` and the measurements take it: modules, optimizers,
#: tensors, or lists, tuples and dicts of them.
TrainState = Union[torch.nn.Module, torch.optim.Optimizer, torch.Tensor, Sequence[Any], Mapping[Any, Any], None]

_MISSING = object()
_KEEP_WALK_LIMIT = 2000  # objects walked per task for device tensors nested in the context


def state_parameters(state: TrainState) -> List[torch.Tensor]:
    """The parameters of ``state``: modules, optimizers, tensors, or lists/tuples/dicts of them (each once).

    The one reading of "the parameters of ``state``" (the engine keeps their
    gradients alive on CUDA; strict mode watches them; the gradient recorder
    of :mod:`swpipe_core.dataflow.grads` follows them).

    Raises
    ------
    TypeError
        Something that is none of these.

    Examples
    --------
    >>> lin = torch.nn.Linear(2, 1)
    >>> len(state_parameters([lin, torch.optim.SGD(lin.parameters(), lr=0.1)])), state_parameters(None)
    (2, [])
    """
    out: Dict[int, torch.Tensor] = {}
    items: List[Any] = [state]
    while items:
        obj = items.pop()
        if obj is None:
            continue
        if isinstance(obj, torch.nn.Module):
            out.update((id(p), p) for p in obj.parameters())
        elif isinstance(obj, torch.optim.Optimizer):
            out.update((id(p), p) for group in obj.param_groups for p in group["params"])
        elif isinstance(obj, torch.Tensor):
            out[id(obj)] = obj
        elif isinstance(obj, dict):
            items.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            items.extend(obj)
        else:
            raise TypeError(f"state: expected modules, optimizers, tensors or lists/dicts of them, got "
                            f"{type(obj).__name__}")
    return list(out.values())


class GuardedContext(IterContext):
    """The :class:`~swpipe_core.plan.IterContext` of a CUDA pipeline: keeps what its tasks may still read on the device.

    On CUDA a task may ``del ctx.x`` (or assign ``ctx.x = new``) while a
    kernel launched on *another* stream still reads ``x``; dropping the last
    reference would hand the block back to the caching allocator, which
    reuses it at once on the stream that allocated it. Every value removed
    from the context therefore goes to ``_swp_graveyard``, and what the
    engine collects after each task (:func:`context_keeper`) and what a task
    passes to :meth:`keep_alive` goes to ``_swp_kept``. Both are slots
    (invisible to ``vars(ctx)``, so shortcuts and ``repr`` see the same
    attributes as on CPU) that live as long as the context: the engine
    releases a context only once the device events of all its iteration's
    tasks have completed. CPU pipelines use the plain ``IterContext`` and
    pay nothing.

    Examples
    --------
    >>> ctx = GuardedContext(batch=None, iter_idx=0)
    >>> ctx.x = "first"; ctx.x = "second"; del ctx.x
    >>> ctx.keep_alive("cached")
    >>> ctx._swp_graveyard, list(ctx._swp_kept.values()), vars(ctx)
    (['first', 'second'], ['cached'], {'batch': None, 'iter_idx': 0})
    """

    __slots__ = ("_swp_graveyard", "_swp_kept")

    def __init__(self, batch: Any, iter_idx: int) -> None:
        object.__setattr__(self, "_swp_graveyard", [])
        object.__setattr__(self, "_swp_kept", {})
        super().__init__(batch, iter_idx)

    def __setattr__(self, name: str, value: Any) -> None:
        old = self.__dict__.get(name, _MISSING)
        object.__setattr__(self, name, value)
        if old is not _MISSING and old is not value:
            self._swp_graveyard.append(old)

    def __delattr__(self, name: str) -> None:
        old = self.__dict__.get(name, _MISSING)
        object.__delattr__(self, name)
        if old is not _MISSING:
            self._swp_graveyard.append(old)

    def keep_alive(self, *values: Any) -> None:
        kept = self._swp_kept
        for value in values:
            kept[id(value)] = value


def context_keeper(dev: Device, params: Sequence[torch.Tensor]) -> Callable[[GuardedContext], None]:
    """What the engine runs after each task of a CUDA pipeline: keep the context's nested device values alive.

    A device tensor inside a container or object of the context (``ctx.d[k]``,
    ``ctx.batch.dense``) can be replaced or popped by the next task without
    the context seeing it; so after every task each device tensor reachable
    from the context's non-tensor attributes is kept (top-level tensors need
    nothing: the graveyard catches them when they leave). The gradients of
    ``params`` (the pipeline's ``state``) are kept too:
    ``zero_grad(set_to_none=True)`` in the next iteration drops them while the
    optimizer step may still read them on another stream.
    """
    from swpipe_core.engine.reach import reachable_objects

    def keep(ctx: GuardedContext) -> None:
        kept = ctx._swp_kept
        roots = [v for v in ctx.__dict__.values() if not isinstance(v, (torch.Tensor, int, float, str))]
        if roots:
            for item in reachable_objects(roots, _KEEP_WALK_LIMIT):
                if dev.memory_of(item) is not None:
                    kept[id(item)] = item
        for p in params:
            g = p.grad
            if g is not None:
                kept[id(g)] = g

    return keep


# ------------------------------------------------------------------ the end of a run

class Limbo:
    """Iteration contexts of ended runs whose device work had not completed: kept until a fence says it has.

    One per pipeline. Each entry is ``(events, states, streams)``: the fence
    recorded at the end of the run (``None`` when even that failed, the
    device being broken), the iterations kept, and the run's streams to
    fence again once the device works.
    """

    def __init__(self) -> None:
        self.entries: List[Tuple[Optional[List[Any]], List[IterState], List[Any]]] = []

    def add(self, events: Optional[List[Any]], states: List[IterState], streams: List[Any]) -> None:
        self.entries.append((events, states, streams))

    def contexts(self) -> int:
        """How many iteration contexts are kept."""
        return sum(1 for _, states, _ in self.entries for st in states if st.ctx is not None)

    def prune(self, pool: StreamPool) -> None:
        """Free the contexts whose fence has completed since.

        An entry whose fence could not even be recorded (the device had
        failed) is fenced now: once the device works again, its contexts go
        as soon as that fence completes.
        """
        kept = []
        for events, states, streams in self.entries:
            try:
                if events is None:
                    events = pool.fence(streams)
                done = pool.wait_events(events, 0.0)
            except Exception:  # the device is still broken
                done = False
            if done:
                for st in states:
                    st.ctx = None  # the run they belonged to is gone; their events are dropped with them
            else:
                kept.append((events, states, streams))
        self.entries = kept


# ------------------------------------------------------------------ a run's device lifetimes

class DeviceLifetimes:
    """What one run keeps alive for the device: retired iterations whose device work is not known complete.

    Filled by the period loop as it retires iterations on CUDA
    (:meth:`hold`); emptied as their events complete (:meth:`prune`), when
    run-ahead is bounded (:meth:`bound_lag`), and at the end of the run
    (:meth:`finish`, :meth:`end`). Also the device half of a timeline: the
    timing events read once their iteration completed. On CPU it stays
    empty.
    """

    __slots__ = ("setup", "failure", "pending", "timing", "origin_event")

    def __init__(self, setup: RunSetup, failure: RunFailure, origin_event: Any = None) -> None:
        self.setup = setup
        self.failure = failure
        self.pending: Dict[int, IterState] = {}  # retired, device work not known complete; tasks read its events
        self.timing: List[DeviceTiming] = []     # timing events of completed iterations, not yet on the timeline
        self.origin_event = origin_event         # the timeline's origin on the device clock

    # ---------------------------------------------------------- while the run goes on

    def hold(self, idx: int, st: IterState) -> None:
        """Retired iteration ``idx`` waits here until its device work completed (before it leaves the loop's
        iterations, so a worker looking up ``idx`` always finds its events)."""
        self.pending[idx] = st

    def prune(self, oldest: int) -> None:
        """Release retired contexts (and what their tasks deleted) whose device work has completed.

        The events of a released iteration stay while a task still to launch
        may wait for them (an inter-iteration dependency, up to the plan's
        largest distance, ``CompiledPlan.event_horizon``, before ``oldest``):
        the device order is kept by those waits (on completed events, free),
        never by this thread having seen them complete.
        """
        completed = self.setup.pool.completed
        horizon = oldest - self.setup.compiled.event_horizon
        pending = self.pending
        for j in list(pending):
            st = pending[j]
            if st.ctx is not None:
                if not completed(st.events):
                    continue
                self._release_context(st)
            if j < horizon:
                del pending[j]
                self._free_iteration(st)

    def _release_context(self, st: IterState) -> None:
        """An iteration whose device work has completed: read its timing and drop its context; keep its events."""
        if st.timing:
            self.timing.extend(st.timing)
            st.timing = []
            self.collect_timeline()
        st.ctx = None

    def _free_iteration(self, st: IterState) -> None:
        """An iteration whose device work has completed: its context, timing and events (given back) released."""
        self._release_context(st)
        self.setup.pool.recycle(st.events)
        st.events = [None] * len(st.events)

    def bound_lag(self, retired: int) -> None:
        """Bounded run-ahead: wait for the device events of iteration ``retired - max_device_lag``."""
        setup, failure = self.setup, self.failure
        st = self.pending.get(retired - setup.max_device_lag)
        if st is None or st.ctx is None:  # negative, or already released: its device work completed
            return
        pool, timeout = setup.pool, setup.timeouts.progress_s
        if not pool.wait_events(st.events, timeout, wake=failure.stop):
            if failure.cancelled:  # a failure elsewhere ended the wait: report that one
                failure.surface()
            error = RuntimeError(
                f"progress() waited {timeout:g} s for the device work of iteration {st.idx} "
                f"(max_device_lag={setup.max_device_lag}); tasks whose device work has not completed: "
                f"{[ti.name for ti in setup.compiled.tasks if not pool.query(st.events[ti.idx])]}. A kernel is "
                "hung (a dead peer rank?) or slow (raise Timeouts(progress_s=...)); call drain() or fill_pipeline()")
            failure.fail_now(error, f"device-lag timeout on iteration {st.idx}")
        self._release_context(st)  # its events stay for later waiters; prune gives them back

    def lag(self) -> int:
        """Retired iterations whose device work has not completed yet (0 on CPU)."""
        query = self.setup.pool.query
        return sum(1 for st in list(self.pending.values()) if not all(map(query, st.events)))

    def collect_timeline(self) -> None:
        """On CUDA with a timeline: turn timing events into ``kind="device"`` events.

        Device times are placed on the host clock by the origin event recorded
        at fill time (assumed to execute when it was recorded: an idle device).
        """
        origin, recorder, pool = self.origin_event, self.setup.recorder, self.setup.pool
        if not self.timing or origin is None or recorder is None or not pool.query(origin):
            return  # not yet: the origin is read once it completed (at the latest when the run ends)
        dev, origin_host = pool.dev, recorder.origin
        for ti, i, start_ev, end_ev in self.timing:
            start = origin_host + dev.elapsed_s(origin, start_ev)
            end = origin_host + dev.elapsed_s(origin, end_ev)
            recorder.record(ti.name, i, ti.group, ti.stream, start, end, kind="device")
            pool.recycle((start_ev, end_ev), timing=True)
        self.timing.clear()

    # ---------------------------------------------------------- the end of the run

    def take_pending(self) -> List[IterState]:
        """Every retired iteration still held, no longer held here (the run ends: :meth:`end` releases them)."""
        states = list(self.pending.values())
        self.pending.clear()
        return states

    def release(self, states: List[IterState], timeout: float, limbo: Limbo) -> Tuple[bool, Optional[Exception]]:
        """Drop ``states``' contexts once the device work of the run completed (a bounded poll).

        Instead of an unconditional ``torch.cuda.synchronize()``, which blocks
        forever on a kernel that never ends (a collective whose peer died)
        and raises after a sticky CUDA error: the device is fenced and polled
        for ``timeout`` s. If it does not finish, or the device fails, the
        contexts are kept alive in ``limbo`` (memory a stream may still read
        is never handed back to the allocator) and freed by a later fill or
        drain whose poll finds the fence complete. Returns whether the device
        finished, and the device's error when it failed (never raised here:
        on a failure path it must not mask the caller's exception).
        """
        if not states and not self.timing:
            return True, None  # nothing waits on the device
        pool, streams = self.setup.pool, self.setup.streams
        error: Optional[Exception] = None
        try:
            events: Optional[List[Any]] = pool.fence(streams)
            done = pool.wait_events(events, timeout)
        except Exception as exc:  # a sticky device error
            _log.warning("could not wait for the device (%s: %s); keeping %d iteration context(s) alive",
                         type(exc).__name__, exc, len(states))
            events, done, error = None, False, exc
        if done:
            pool.recycle(events)
            for st in states:
                self._free_iteration(st)
            self.collect_timeline()
            return True, None
        if events is not None:
            _log.warning("device work did not complete within %.1f s; keeping %d iteration context(s) alive until "
                         "it does", timeout, len(states))
        limbo.add(events, states, list(streams))
        return False, error

    def finish(self, limbo: Limbo) -> None:
        """The data ran out and every iteration retired: release what waits on the device.

        Raises
        ------
        RuntimeError
            The device work did not complete within ``Timeouts.progress_s`` (or the device failed).
        """
        timeout = self.setup.timeouts.progress_s
        done, error = self.release(self.take_pending(), timeout, limbo)
        if not done:
            raise device_not_done("progress() at the end of the data", error, timeout)

    def end(self, states: List[IterState], failing: bool, limbo: Limbo) -> None:
        """Wait (bounded) for the device work of a stopped run, release ``states``' contexts.

        Raises only when the run ended normally (a drain) and the device did
        not finish: on a failure path (``failing``) the pipeline is left
        usable whatever the device does, and the contexts wait in ``limbo``.
        """
        timeouts = self.setup.timeouts
        done, error = self.release(states, timeouts.teardown_s if failing else timeouts.progress_s, limbo)
        if not done and not failing:
            raise device_not_done("drain()", error, timeouts.progress_s)


def device_hung(what: str, timeout: float) -> str:
    """The message for device work that did not complete within ``timeout`` s."""
    return (f"{what}: the device work did not complete within {timeout:g} s (Timeouts.progress_s); a kernel is hung "
            "(a dead peer rank?) or slow (raise Timeouts(progress_s=...)). Its iteration contexts are kept alive; the "
            "pipeline can be filled again")


def device_not_done(what: str, error: Optional[Exception], timeout: float) -> RuntimeError:
    """The error for device work that did not complete: the device's own failure, chained, or a timeout."""
    if error is None:
        return RuntimeError(device_hung(what, timeout))
    failure = RuntimeError(
        f"{what}: the device failed ({type(error).__name__}: {error}). Its iteration contexts are kept alive "
        "until a later fence completes; a CUDA error is sticky, so the process usually cannot use the device "
        "again")
    failure.__cause__ = error
    return failure
