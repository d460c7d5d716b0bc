"""Strict mode of :class:`~swpipe_core.engine.pipeline.SWPipeline`: raise on the first access the plan does not order.

``SWPipeline(plan, strict=True)`` watches, during pipelined runs, every
``ctx`` attribute each task reads, writes or deletes, and every draw from
torch's default generators (unless the pipeline gives each task its own,
``rng="per_task"``); with the pipeline's ``state=[model, optimizer]`` it
also watches in-place reads and writes of those parameters, buffers and
optimizer state through the dispatcher. ``strict=[model, optimizer]`` (any
``state`` the recorder takes) watches that state instead of ``state=``'s.
Each conflicting pair of accesses (a write and any other access of one
thing, by two tasks) must be ordered by the plan
(:class:`~._happens.PlanOrder`); the first pair that is not raises
:class:`StrictDataflowError` inside the second task, naming both tasks,
their iterations, the attribute and the dependency to add. The engine
surfaces it like any task failure. It costs a lock and a dict lookup per
access: a debugging mode, off by default.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Hashable, Iterator, List, Optional, Tuple

import torch

from swpipe_core.plan import IterContext, PipelinePlan
from swpipe_core.dataflow._happens import PlanOrder
from swpipe_core.dataflow._names import check_state, named_state, storage_names
from swpipe_core.dataflow._watch import StorageWatch, WatchStop

__all__ = ["StrictDataflowError", "StrictGuard", "strict_guard"]

Event = Tuple[str, int]


class StrictDataflowError(WatchStop):
    """An access the plan does not order; ``task``, ``iteration``, ``attribute`` and ``fix`` say which."""

    def __init__(self, task: str, iteration: int, attribute: str, message: str, fix: tuple) -> None:
        self.task, self.iteration, self.attribute, self.fix = task, iteration, attribute, fix
        super().__init__(message)


def _strict_read(self: IterContext, name: str) -> Any:
    if not name.startswith("_") and name not in ("iter_idx", "keep_alive"):
        object.__getattribute__(self, "_swp_guard").access(("ctx", name), f"ctx.{name}", "read")
    return object.__getattribute__(self, name)


def _strict_missing(self: IterContext, name: str) -> Any:
    if name.startswith("_"):
        raise AttributeError(name)
    guard = object.__getattribute__(self, "_swp_guard")
    event = getattr(guard._tls, "event", None) or ("?", self.__dict__.get("iter_idx", "?"))
    raise AttributeError(
        f"strict mode: {event[0]}({event[1]}) reads ctx.{name}, which no task has written in iteration "
        f"{event[1]} before it. Add a dependency on the task that sets ctx.{name} "
        f"(swpipe_core.dataflow.check_dataflow names it with the tuple to add)", name=name, obj=self)


def _strict_repr(self: IterContext) -> str:
    attrs = sorted(k for k in vars(self) if k not in ("batch", "iter_idx") and not k.startswith("_"))
    return f"IterContext(iter_idx={self.iter_idx}, attrs={attrs})"


def _strict_class(base: type) -> type:
    """The class a watched context of class ``base`` is switched to: ``base`` reporting every access to its guard.

    One subclass per context class the engine makes (``IterContext`` on CPU,
    the CUDA pipeline's context that keeps what it drops), with no state of
    its own, so the switch keeps the object as it is.
    """
    found = _STRICT_CLASSES.get(base)
    if found is None:
        def setattr_(self: IterContext, name: str, value: Any) -> None:
            object.__getattribute__(self, "_swp_guard").access(("ctx", name), f"ctx.{name}", "write")
            base.__setattr__(self, name, value)

        def delattr_(self: IterContext, name: str) -> None:
            object.__getattribute__(self, "_swp_guard").access(("ctx", name), f"ctx.{name}", "write")
            base.__delattr__(self, name)

        found = _STRICT_CLASSES[base] = type(f"Strict{base.__name__}", (base,), {
            "__slots__": (), "__getattribute__": _strict_read, "__getattr__": _strict_missing,
            "__setattr__": setattr_, "__delattr__": delattr_, "__repr__": _strict_repr,
            "__module__": __name__, "__doc__": f"A watched {base.__name__}: reports accesses to its guard."})
    return found


_STRICT_CLASSES: Dict[type, type] = {}


class StrictGuard:
    """Checks each access of a pipelined run against the plan's order (one guard per pipeline)."""

    def __init__(self, plan: PipelinePlan, state: Any = None, device: str = "cpu", shared_rng: bool = True) -> None:
        check_state(state)
        self._shared_rng = shared_rng  # tasks share torch's default generators: a draw is an access
        self._order = PlanOrder(plan, device=device)
        self._pos = {n: k for k, n in enumerate(_serial_names(plan))}
        self._state = state
        self._names: Dict[int, str] = storage_names(named_state(state)) if state is not None else {}
        self._lock = threading.Lock()
        self._tls = threading.local()
        self._last: Dict[Hashable, Tuple[Optional[Event], List[Event]]] = {}
        self._newest = -1

    @property
    def watches_state(self) -> bool:
        """Whether in-place accesses of a model's and optimizer's tensors are checked (not only ``ctx``)."""
        return self._state is not None

    def active(self) -> bool:
        """Whether this thread is inside a watched task."""
        return getattr(self._tls, "event", None) is not None

    @contextlib.contextmanager
    def watch(self, task: str, ctx: IterContext) -> Iterator[None]:
        """Run a task's body with its accesses checked."""
        if isinstance(ctx, IterContext) and type(ctx) not in _STRICT_CLASSES.values():  # not watched yet
            object.__setattr__(ctx, "_swp_guard", self)
            ctx.__class__ = _strict_class(type(ctx))
        self._tls.event = (task, ctx.iter_idx)
        watched = self._state is not None or self._shared_rng
        mode = (StorageWatch(self._tensor, set(), lambda exc, func: None, self._draw if self._shared_rng else None)
                if watched else contextlib.nullcontext())
        try:
            with mode:
                yield
        finally:
            self._tls.event = None

    def _draw(self, device: str) -> None:
        name = f"torch's default generator ({device})"
        self.access(("rng", device), name, "write")

    def _tensor(self, key: int, t: torch.Tensor, mode: str) -> None:
        name = self._names.get(key)
        if name is not None and mode != "new":
            self.access(("state", name), name, mode)

    def _ordered(self, a: Event, b: Event) -> bool:
        shift = max(0, max(a[1], b[1]) - (self._order.window - 1))
        if a[1] - shift < 0 or b[1] - shift < 0:
            return True  # further apart than the window: the retire barrier / FIFO separate them
        return self._order.before((a[0], a[1] - shift), (b[0], b[1] - shift))

    def access(self, obj: Hashable, name: str, mode: str) -> None:
        """Check one access of this thread's current task; raise on an unordered conflict."""
        ev = getattr(self._tls, "event", None)
        if ev is None:
            return
        if obj[0] == "ctx":
            obj = (obj[0], ev[1], obj[1])
        with self._lock:
            if ev[1] > self._newest:
                self._newest = ev[1]
                self._forget(ev[1] - 2 * self._order.window)
            writer, readers = self._last.get(obj, (None, []))
            if mode == "read":
                self._check(writer, ev, name, "reads", "wrote")
                readers.append(ev)
                self._last[obj] = (writer, readers)
                return
            for r in readers:
                self._check(r, ev, name, "writes", "read")
            self._check(writer, ev, name, "writes", "wrote")
            self._last[obj] = (ev, [])

    def _forget(self, older_than: int) -> None:
        """Drop the ctx entries of iterations long retired, so a long run keeps bounded state."""
        for key in [k for k in self._last if k[0] == "ctx" and k[1] < older_than]:
            del self._last[key]

    def _check(self, other: Optional[Event], ev: Event, name: str, verb: str, other_verb: str) -> None:
        if other is None or other[0] == ev[0] or self._ordered(other, ev):
            return
        a, b = sorted([other, ev], key=lambda e: (e[1], self._pos.get(e[0], 0)))
        d = b[1] - a[1]
        fix = (b[0], a[0]) if d == 0 else (b[0], a[0], d)
        raise StrictDataflowError(
            ev[0], ev[1], name,
            f"strict mode: {ev[0]}({ev[1]}) {verb} {name} that {other[0]}({other[1]}) {other_verb}, but the plan does "
            f"not order {other[0]}({other[1]}) before {ev[0]}({ev[1]}): a race. Fix: add {fix!r} to "
            f"{'intra_iter_deps' if d == 0 else 'inter_iter_deps'} (swpipe_core.dataflow.check_dataflow lists them all)",
            fix)


def _serial_names(plan: PipelinePlan) -> List[str]:
    from swpipe_core.dataflow.record import serial_order
    return [t.name for t in serial_order(plan)]


def strict_guard(plan: PipelinePlan, strict: Any, device: Any = "cpu", shared_rng: bool = True,
                 state: Any = None) -> Optional[StrictGuard]:
    """The guard for ``SWPipeline(strict=..., state=...)``: ``None`` when off, else a :class:`StrictGuard`.

    What each form watches:

    * ``strict=False`` (or ``None``): nothing;
    * ``strict=True``: every ``ctx`` attribute, every draw from torch's
      default generators when ``shared_rng``, and, when ``state`` (the
      pipeline's ``state=``) is given, the parameters, buffers and optimizer
      state it holds;
    * ``strict=<modules, optimizers, a list or mapping of them>``: the same,
      with that state instead of ``state``.

    Examples
    --------
    >>> import torch
    >>> from swpipe_core.plan import TaskSchedule
    >>> plan = PipelinePlan({"A": TaskSchedule()})
    >>> strict_guard(plan, False) is None
    True
    >>> model = torch.nn.Linear(2, 1)
    >>> strict_guard(plan, True, state=[model]).watches_state, strict_guard(plan, True).watches_state
    (True, False)
    """
    if strict is None or strict is False:
        return None
    kind = "cuda" if str(getattr(device, "type", device)).startswith("cuda") else "cpu"
    return StrictGuard(plan, state if strict is True else strict, kind, shared_rng)
