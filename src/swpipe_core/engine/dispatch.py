"""The one point every task execution goes through: instrument() wrappers, shortcuts, strict mode, per-task generators.

A pipeline has one :class:`Dispatch`. Every mode (pipelined, serial, one
serial iteration; on a worker or on the caller's thread) runs a task's
function through it: the wrappers of ``SWPipeline.instrument`` (outermost
first), then per-task generators (``rng="per_task"``), strict mode's checks
(pipelined runs only) and a shortcut's replay, then ``task.fn(ctx)``. With
none of them, a call is ``task.fn(ctx)`` and nothing else; a CPU pipelined run
whose dispatch is :attr:`Dispatch.plain` skips even that
(:mod:`swpipe_core.engine.tasks`). Also here: the names of the profiler's
ranges around tasks, and whether a torch profiler is recording.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

import torch

from swpipe_core.engine.rng import PerTaskRng
from swpipe_core.engine.shortcut import _ShortcutState
from swpipe_core.plan import IterContext, PipelineTask

if TYPE_CHECKING:
    from swpipe_core.dataflow.strict import StrictGuard

__all__ = ["Dispatch", "TaskWrapper", "profiler_active"]

#: How a task runs: ``run_task(task, ctx)``.
RunTask = Callable[[PipelineTask, IterContext], None]
#: ``wrapper(run_task, task, ctx)``, where ``run_task(task, ctx)`` runs the task (``SWPipeline.instrument``).
TaskWrapper = Callable[[RunTask, PipelineTask, IterContext], Any]


def profiler_active() -> bool:
    """Whether a torch profiler is recording: the thread-local C++ flag, or the
    module flag torch.profiler sets (also in all-threads mode, where the C++
    flag reads False).

    Examples
    --------
    >>> profiler_active()
    False
    """
    return bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", False)) or torch.autograd._profiler_enabled()


def _rng_active() -> bool:
    """Whether this thread already runs inside a task's generator scope (the scope is entered once)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return any(type(mode).__name__ == "_OwnGenerators" for mode in _get_current_dispatch_mode_stack())


class Dispatch:
    """How a pipeline calls its tasks' functions.

    Parameters
    ----------
    strict : StrictGuard, optional
        Strict mode's guard (``SWPipeline(strict=...)``); checks pipelined runs only.
    rng : PerTaskRng, optional
        Per-task generators (``SWPipeline(rng="per_task")``).

    Examples
    --------
    >>> seen = []
    >>> dispatch = Dispatch()
    >>> task = PipelineTask("A", lambda ctx: seen.append(ctx.iter_idx))
    >>> token = dispatch.add(lambda run_task, task, ctx: (seen.append("before"), run_task(task, ctx)))
    >>> dispatch.call_serial(task, IterContext(None, 3)); seen
    ['before', 3]
    >>> dispatch.remove(token); dispatch.plain
    True
    """

    def __init__(self, strict: Optional["StrictGuard"] = None, rng: Optional[PerTaskRng] = None) -> None:
        self.shortcut = _ShortcutState()
        self.strict = strict
        self.rng = rng
        self._entries: Tuple[Tuple[object, TaskWrapper], ...] = ()  # (token, wrapper), outermost first
        self._pipelined: Optional[RunTask] = None  # the wrappers composed around _call; None: none installed
        self._serial: Optional[RunTask] = None

    @property
    def wrappers(self) -> Tuple[TaskWrapper, ...]:
        """The wrappers every task runs through, outermost first."""
        return tuple(w for _, w in self._entries)

    @property
    def plain(self) -> bool:
        """Nothing runs around the tasks: no wrapper, shortcut, strict mode or per-task generator."""
        return not self._entries and self.strict is None and self.rng is None and not self.shortcut.tasks

    def add(self, wrapper: TaskWrapper) -> object:
        """Run every task through ``wrapper`` too (innermost so far); the token :meth:`remove` takes."""
        token = object()  # the same wrapper may be added twice: each token removes its own
        self._install(self._entries + ((token, wrapper),))
        return token

    def remove(self, token: object) -> None:
        """Stop running the tasks through the wrapper :meth:`add` returned ``token`` for."""
        self._install(tuple(e for e in self._entries if e[0] is not token))

    def _install(self, entries: Tuple[Tuple[object, TaskWrapper], ...]) -> None:
        self._entries = entries
        self._pipelined = self._chain(self._call_pipelined)
        self._serial = self._chain(self._call_serial)

    def _chain(self, innermost: RunTask) -> Optional[RunTask]:
        if not self._entries:
            return None
        chain = innermost
        for _, wrapper in reversed(self._entries):
            chain = functools.partial(wrapper, chain)
        return chain

    def call_pipelined(self, task: PipelineTask, ctx: IterContext) -> None:
        """Run one task of a pipelined run (strict mode checks it when on)."""
        chain = self._pipelined
        if chain is not None:
            chain(task, ctx)
        elif self.strict is not None or self.rng is not None or task.name in self.shortcut.tasks:
            self._call_pipelined(task, ctx)
        else:  # nothing around the task: no second call
            task.fn(ctx)

    def call_serial(self, task: PipelineTask, ctx: IterContext) -> None:
        """Run one task of a serial run (never checked by strict mode: one task runs at a time)."""
        chain = self._serial
        if chain is not None:
            chain(task, ctx)
        elif self.rng is not None or task.name in self.shortcut.tasks:
            self._call(task, ctx, None)
        else:
            task.fn(ctx)

    def _call_pipelined(self, task: PipelineTask, ctx: IterContext) -> None:
        self._call(task, ctx, self.strict)

    def _call_serial(self, task: PipelineTask, ctx: IterContext) -> None:
        self._call(task, ctx, None)

    def _call(self, task: PipelineTask, ctx: IterContext, strict: Optional["StrictGuard"]) -> None:
        """Run one task on one context: ``task.fn(ctx)``, or its shortcut when enabled, in its scopes."""
        if self.rng is not None and not _rng_active():
            with self.rng.scope(task.name, ctx.iter_idx):  # the task's own generators (rng="per_task")
                return self._call(task, ctx, strict)
        if strict is not None and not strict.active():
            with strict.watch(task.name, ctx):  # strict mode: check every access against the plan
                return self._call(task, ctx, strict)
        if task.name in self.shortcut.tasks:
            self.shortcut.execute(task, ctx)
        else:
            task.fn(ctx)

    def range_name(self, prefix: str, name: str, iteration: int) -> str:
        """The profiler's (and NVTX's) range around a task execution: ``SWP/Forward/iter3`` (``[skip]`` if shortcut)."""
        skip = " [skip]" if name in self.shortcut.tasks else ""
        return f"{prefix}/{name}{skip}/iter{iteration}"
