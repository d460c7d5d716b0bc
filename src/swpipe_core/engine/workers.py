"""Thread groups: one named worker thread per group, fed through a FIFO queue.

The engine's main thread puts each period's tasks, in the enqueue order, on
the queue of each task's thread group; the group's worker (thread name
``swpipe-<group>``) runs them one after another. Tasks of one group therefore
never overlap, and tasks of different groups overlap freely (their order is
carried by CPU signals, see :mod:`swpipe_core.engine.pipeline`).

:func:`with_thread_map` rewrites a plan's thread groups with a thread-map
strategy (``"by_stream"``, ``"per_task"``, a dict, a callable),
as a plan transform: the engine only ever sees ``TaskSchedule.thread_group``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, Iterable, List, Mapping, Optional, Union

from swpipe_core.plan import PipelinePlan, PipelineTask, StreamSpec, ref_name, stream_name

__all__ = ["ScheduledTask", "with_thread_map", "THREAD_MAP_STRATEGIES", "Workers"]

_log = logging.getLogger(__name__)

THREAD_MAP_STRATEGIES = ("by_stream", "per_task")

_STOP = object()


@dataclass(frozen=True)
class ScheduledTask:
    """What a callable thread map sees about a task.

    Attributes
    ----------
    name : str
    task : PipelineTask
    stage : int
    stream : str
        Readable stream name (``"default"`` for the default stream).
    stream_spec : None, str or torch stream
        The schedule's stream spec as given.
    thread_group : str
        The current thread group.
    globally_ordered : bool
    """

    name: str
    task: PipelineTask
    stage: int
    stream: str
    stream_spec: StreamSpec
    thread_group: str
    globally_ordered: bool


ThreadMap = Union[str, Mapping[Any, str], Callable[[ScheduledTask], str]]


def with_thread_map(plan: PipelinePlan, thread_map: ThreadMap) -> PipelinePlan:
    """A copy of ``plan`` whose thread groups follow a thread-map strategy.

    Parameters
    ----------
    plan : PipelinePlan
    thread_map : {"by_stream", "per_task"}, dict or callable
        ``"by_stream"``: one thread per stream (group = stream name, the
        default stream's tasks in ``"default"``). ``"per_task"``: one thread
        per task (group = task name). A dict ``{task: group}`` (keys are names
        or tasks) pins tasks; tasks not in it go to ``"default"``. A callable
        receives a :class:`ScheduledTask` and returns the group name.

    Returns
    -------
    PipelinePlan
        Same tasks, stages, streams, dependencies and depth; new thread groups.
        An explicit ``enqueue_order`` is kept.

    Raises
    ------
    ValueError
        Unknown strategy name, a dict key that is not a task of the plan, or
        a group that is not a non-empty string.
    TypeError
        ``thread_map`` is none of the accepted kinds.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule, with_thread_map
    >>> plan = PipelinePlan({"H2D": TaskSchedule(0, "memcpy"), "Fwd": TaskSchedule(1), "Bwd": TaskSchedule(1)})
    >>> def groups(p):
    ...     return {n: p.sched(n).thread_group for n in p.task_names}
    >>> groups(with_thread_map(plan, "by_stream"))
    {'H2D': 'memcpy', 'Fwd': 'default', 'Bwd': 'default'}
    >>> groups(with_thread_map(plan, "per_task"))
    {'H2D': 'H2D', 'Fwd': 'Fwd', 'Bwd': 'Bwd'}
    >>> groups(with_thread_map(plan, {"H2D": "io", "Fwd": "compute"}))
    {'H2D': 'io', 'Fwd': 'compute', 'Bwd': 'default'}
    >>> groups(with_thread_map(plan, lambda t: "io" if t.stream == "memcpy" else "compute"))
    {'H2D': 'io', 'Fwd': 'compute', 'Bwd': 'compute'}
    """
    names = plan.task_names
    if isinstance(thread_map, str):
        if thread_map == "by_stream":
            resolve: Callable[[ScheduledTask], str] = lambda t: t.stream
        elif thread_map == "per_task":
            resolve = lambda t: t.name
        else:
            raise ValueError(f"unknown thread_map strategy {thread_map!r}; use one of {list(THREAD_MAP_STRATEGIES)}, "
                             "a dict {task: group} or a callable(ScheduledTask) -> group")
    elif isinstance(thread_map, Mapping):
        pinned = {ref_name(k): v for k, v in thread_map.items()}
        unknown = sorted(set(pinned) - set(names))
        if unknown:
            raise ValueError(f"thread_map names task(s) {unknown} that are not in the plan; tasks: {names}")
        resolve = lambda t: pinned.get(t.name, "default")
    elif callable(thread_map):
        resolve = thread_map
    else:
        raise TypeError(f"thread_map must be 'by_stream', 'per_task', a dict or a callable, got {type(thread_map).__name__}")

    schedule = {}
    for key, sched in plan.schedule.items():
        task = plan.task(key)
        view = ScheduledTask(task.name, task, sched.stage, stream_name(sched.stream), sched.stream,
                             sched.thread_group, sched.globally_ordered)
        group = resolve(view)
        if not isinstance(group, str) or not group:
            raise ValueError(f"thread_map gave task {task.name!r} the thread group {group!r}; a group is a non-empty string")
        schedule[key] = dataclasses.replace(sched, thread_group=group)
    return plan.replace(schedule=schedule, pipeline_depth=plan.pipeline_depth)


class Workers:
    """One daemon thread ``swpipe-<group>`` per group, each draining a FIFO queue.

    ``run_items(group, items)`` is called on the worker thread for every list
    put with :meth:`submit`; it must not raise (the engine catches task
    failures itself), but if it does the error is logged and handed to
    ``on_crash`` so the engine can cancel instead of hanging. ``setup`` runs
    first on each thread and ``scope()``, a context manager, is entered
    around its whole loop (per-thread state such as ``emit_nvtx``).

    Examples
    --------
    >>> seen = []
    >>> w = Workers(["io", "compute"], lambda g, items: seen.extend((g, x) for x in items))
    >>> w.start(); w.submit("io", [1, 2]); w.submit("compute", [3])
    >>> w.stop()
    []
    >>> sorted(seen), w.alive()
    ([('compute', 3), ('io', 1), ('io', 2)], [])
    """

    def __init__(self, groups: Iterable[str], run_items: Callable[[str, List[Any]], None],
                 setup: Optional[Callable[[], None]] = None,
                 on_crash: Optional[Callable[[str, BaseException], None]] = None,
                 scope: Optional[Callable[[], ContextManager]] = None) -> None:
        self.groups = list(dict.fromkeys(groups))
        self._scope = scope  # a context each worker enters around its loop (per-thread state, e.g. emit_nvtx)
        self._run_items = run_items
        self._setup = setup
        self._on_crash = on_crash
        self._queues: Dict[str, "queue.SimpleQueue[Any]"] = {g: queue.SimpleQueue() for g in self.groups}
        self._threads: Dict[str, threading.Thread] = {}
        self._waited: Dict[str, float] = {}  # seconds stop() already waited in vain, per thread

    def start(self) -> None:
        """Start one named daemon thread per group."""
        for group in self.groups:
            t = threading.Thread(target=self._loop, args=(group,), name=f"swpipe-{group}", daemon=True)
            self._threads[group] = t
            t.start()

    def submit(self, group: str, items: List[Any]) -> None:
        """Append ``items`` (run in list order) to ``group``'s FIFO queue."""
        self._queues[group].put(items)

    def _loop(self, group: str) -> None:
        q = self._queues[group]
        run_items = self._run_items
        stopped = False
        try:
            if self._setup is not None:
                self._setup()
            with self._scope() if self._scope is not None else contextlib.nullcontext():
                while True:
                    items = q.get()
                    if items is _STOP:
                        stopped = True
                        break
                    run_items(group, items)
                    # Drop the reference now: the worker would otherwise keep the
                    # last items (and their iteration contexts) alive while it waits.
                    del items
        except BaseException as exc:  # a bug in the engine (or the scope failed), not in a task
            _log.exception("worker swpipe-%s crashed", group)
            if self._on_crash is not None:
                self._on_crash(group, exc)
            # keep consuming so that stop() still finds a live, responsive queue
            while not stopped and q.get() is not _STOP:
                pass

    def stop(self, timeout: float = 5.0) -> List[str]:
        """Ask every worker to finish what is queued before the stop, join them.

        Returns
        -------
        list of str
            Names of threads still alive after ``timeout`` seconds each (a task
            blocked in user code cannot be interrupted); empty normally. The
            timeout is per thread over all calls: a later call waits only for
            what is left of it.
        """
        for group, t in self._threads.items():
            if t.is_alive():
                self._queues[group].put(_STOP)
        stuck = []
        for t in self._threads.values():
            # The wait is a budget per thread over all calls: a thread an earlier stop() already
            # waited for in vain is blocked in user code, and waiting again (the engine stops its
            # workers once when it reports a failure and once when it resets) only delays the caller.
            budget = max(0.0, timeout - self._waited.get(t.name, 0.0))
            t0 = time.perf_counter()
            t.join(budget)
            if t.is_alive():
                self._waited[t.name] = self._waited.get(t.name, 0.0) + time.perf_counter() - t0
                stuck.append(t.name)
        if stuck:
            _log.warning("worker thread(s) %s did not stop within %.1f s (a task is blocked in user code); "
                         "they are daemon threads and will not keep the process alive", stuck, timeout)
        return stuck

    def alive(self) -> List[str]:
        """Names of this object's threads that are still running."""
        return [t.name for t in self._threads.values() if t.is_alive()]
