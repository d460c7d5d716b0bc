"""Task shortcuts: replay a task's cached effect instead of running it.

A shortcut task runs once for real (*caching*): its function runs, the
changes it made to the :class:`~swpipe_core.plan.IterContext` (attributes
added, replaced and deleted, found by identity) are detached, cloned and
cached, and every :class:`~swpipe_core.plan.DeclaredIO` of the task captures
its external state. Every later execution is a *replay* (*shortcut*): the
function is skipped, the cached changes are applied to the new context with
fresh tensors, gradients are bridged by :class:`_GraftGrad`, and each
``DeclaredIO`` restores its state. A task that is not shortcut (*normal*)
never reaches this module: the engine's dispatch is one set look-up.

The profiler (:mod:`swpipe_core.measure.profiler`) shortcuts one task at a time to
measure how much of the serial iteration that task exposes.

Limits, all by design: a task's in-place mutation of an object that already
was in the context (``ctx.d["k"] = v``) is not seen by the identity diff
(declare such state with ``DeclaredIO`` or assign a new object); replayed
tensors share storage with the cache, so a later task that modifies one in
place corrupts the cache, which the next replay detects and reports
(``DeclaredIO.restore`` gets copies instead: external state is long-lived
and commonly updated in place).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

__all__ = ["ShortcutCorruptedError"]

# Attributes the engine owns: a replay never overwrites them.
_ENGINE_ATTRS = frozenset({"iter_idx"})


class _CacheTag:
    """The sentinel type of :data:`_CACHE_TAG` (one instance, readable repr)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "_CACHE_TAG"


#: Marks a tuple produced by :func:`_cache_val`, so :func:`_restore_val` can
#: tell cached records from plain tuples the task stored.
_CACHE_TAG = _CacheTag()


class ShortcutCorruptedError(RuntimeError):
    """A shortcut's cached tensor was modified in place after a replay handed it out.

    Replayed tensors share storage with the cache (replay is zero-copy so that
    it costs nearly nothing in a measurement); a later task that writes into
    one in place changes every future replay. Raised by the next replay.

    Attributes
    ----------
    task : str or None
        The shortcut task whose replay found it.
    attribute : str or None
        The ``ctx`` attribute holding the tensor.
    shape : tuple of int
    dtype : torch.dtype
    """

    def __init__(self, shape: Tuple[int, ...], dtype: torch.dtype, task: Optional[str] = None,
                 attribute: Optional[str] = None) -> None:
        self.shape, self.dtype, self.task, self.attribute = tuple(shape), dtype, task, attribute
        where = f"replaying shortcut task {task!r}, ctx.{attribute}: " if task is not None else ""
        super().__init__(
            f"{where}a shortcut's cached tensor (shape {self.shape}, {dtype}) was modified in place after a replay "
            "handed it out; replays share storage with the cache. Fix: make the task that consumes it work out of "
            "place, or do not shortcut the task that produces it.")

    def __reduce__(self):
        return (type(self), (self.shape, self.dtype, self.task, self.attribute))


# ---------------------------------------------------------------------------
# _cache_val / _restore_val
# ---------------------------------------------------------------------------

def _holds_tensor(v: Any, seen: Optional[set] = None) -> bool:
    """Whether ``v`` is, or transitively holds, a tensor (cycle safe)."""
    if isinstance(v, torch.Tensor) or hasattr(type(v), "__swpipe_clone__"):
        return True
    if seen is None:
        seen = set()
    if id(v) in seen:
        return False
    if isinstance(v, dict):
        seen.add(id(v))
        return any(_holds_tensor(x, seen) for x in v.values())
    if isinstance(v, (list, tuple)):
        seen.add(id(v))
        return any(_holds_tensor(x, seen) for x in v)
    attrs = _object_attrs(v)
    if attrs is None:
        return False
    seen.add(id(v))
    return any(_holds_tensor(x, seen) for x in attrs.values())


def _object_attrs(v: Any) -> Optional[Dict[str, Any]]:
    """The instance attributes of a plain object (``__dict__`` and ``__slots__``), else None.

    Modules, classes, functions and other objects the task merely refers to
    (rather than produces) are not taken apart: they return None and are
    cached by reference.
    """
    if isinstance(v, (torch.nn.Module, type)) or callable(v):
        return None
    attrs: Dict[str, Any] = {}
    d = getattr(v, "__dict__", None)
    if isinstance(d, dict):
        attrs.update(d)
    for klass in type(v).__mro__[:-1]:  # every class but object
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(v, slot):
                attrs[slot] = getattr(v, slot)
    if not attrs and d is None:
        return None
    return attrs


def _cache_val(v: Any, _memo: Optional[Dict[int, Any]] = None) -> Any:
    """Recursively snapshot a value, detaching and cloning every tensor.

    Records are tuples tagged with :data:`_CACHE_TAG`:

    - tensor: ``(_CACHE_TAG, "t", t.detach().clone(), requires_grad, version)``
    - dict: ``(_CACHE_TAG, "d", {key: cached}, type)``
    - list: ``(_CACHE_TAG, "l", [cached], type)``
    - tuple: ``(_CACHE_TAG, "u", [cached], type)`` (namedtuples keep their type)
    - object holding tensors (e.g. a jagged tensor): ``(_CACHE_TAG, "o", cls, {attr: cached})``
    - device memory of another runtime, whose type has ``__swpipe_clone__`` (a copy of itself, as
      ``swpipe.testing.FakeTensor``): ``(_CACHE_TAG, "x", clone)``

    Anything else (numbers, strings, modules, objects without tensors) is kept
    by reference. Aliasing inside one call is preserved: a tensor reachable
    twice is cloned once and restored as one tensor.

    Parameters
    ----------
    v : Any
        The value to snapshot.

    Returns
    -------
    Any
        A record for :func:`_restore_val`.

    Examples
    --------
    >>> import torch
    >>> rec = _cache_val({"a": torch.ones(2), "n": 3})
    >>> rec[0] is _CACHE_TAG, rec[1], rec[2]["n"]
    (True, 'd', 3)
    >>> _restore_val(rec)
    {'a': tensor([1., 1.]), 'n': 3}
    """
    memo: Dict[int, Any] = {} if _memo is None else _memo
    key = id(v)
    if key in memo:
        return memo[key]
    if isinstance(v, torch.Tensor):
        clone = v.detach().clone()
        rec = (_CACHE_TAG, "t", clone, v.requires_grad, _version_of(clone))
    elif isinstance(v, dict):
        items: Dict[Any, Any] = {}
        rec = (_CACHE_TAG, "d", items, type(v))
        memo[key] = rec  # before recursing: a dict may contain itself
        for k, x in v.items():
            items[k] = _cache_val(x, memo)
        return rec
    elif isinstance(v, list):
        elems: List[Any] = []
        rec = (_CACHE_TAG, "l", elems, type(v))
        memo[key] = rec
        elems.extend(_cache_val(x, memo) for x in v)
        return rec
    elif isinstance(v, tuple):
        rec = (_CACHE_TAG, "u", [_cache_val(x, memo) for x in v], type(v))
    elif hasattr(type(v), "__swpipe_clone__"):  # device memory of another runtime (swpipe.testing.FakeTensor)
        rec = (_CACHE_TAG, "x", v.__swpipe_clone__())
    else:
        attrs = _object_attrs(v)
        if attrs is None or not _holds_tensor(v):
            return v
        cached: Dict[str, Any] = {}
        rec = (_CACHE_TAG, "o", type(v), cached)
        memo[key] = rec
        for k, x in attrs.items():
            cached[k] = _cache_val(x, memo)
        return rec
    memo[key] = rec
    return rec


def _restore_val(
    v: Any,
    graft: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    copy: bool = False,
    _memo: Optional[Dict[int, Any]] = None,
) -> Any:
    """Rebuild a value from a :func:`_cache_val` record with brand-new tensors.

    Each tensor comes back as ``cached.detach()`` (zero-copy) with the
    original ``requires_grad``: a fresh leaf on every call, so two replays
    never share an autograd graph and ``backward()`` never runs through a
    graph a second time.

    Parameters
    ----------
    v : Any
        A record from :func:`_cache_val` (other values are returned as is).
    graft : callable, optional
        Applied to every restored tensor that requires grad (the shortcut
        passes :class:`_GraftGrad` here).
    copy : bool
        Clone tensors instead of sharing the cache's storage. Used for
        ``DeclaredIO.restore``: external state outlives the iteration and is
        typically updated in place (an optimizer step), which must not change
        the snapshot.

    Returns
    -------
    Any

    Raises
    ------
    ShortcutCorruptedError
        If a cached tensor was modified in place since it was cached (through
        a tensor an earlier zero-copy restore returned).

    Examples
    --------
    >>> import torch
    >>> rec = _cache_val(torch.zeros(2, requires_grad=True))
    >>> a, b = _restore_val(rec), _restore_val(rec)
    >>> a is b, a.is_leaf, a.requires_grad
    (False, True, True)
    """
    if not (isinstance(v, tuple) and len(v) >= 2 and v[0] is _CACHE_TAG):
        return v
    memo: Dict[int, Any] = {} if _memo is None else _memo
    key = id(v)
    if key in memo:
        return memo[key]
    kind = v[1]
    if kind == "t":
        _, _, cached, requires_grad, version = v
        if version is not None and _version_of(cached) != version:
            raise ShortcutCorruptedError(tuple(cached.shape), cached.dtype)
        out: Any = (cached.clone() if copy else cached.detach()).requires_grad_(requires_grad)
        if requires_grad and graft is not None:
            out = graft(out)
    elif kind == "d":
        _, _, items, typ = v
        out = dict() if typ is dict else _new_like(typ)
        memo[key] = out
        for k, x in items.items():
            out[k] = _restore_val(x, graft, copy, memo)
        return out
    elif kind == "l":
        _, _, elems, typ = v
        out = [] if typ is list else _new_like(typ)
        memo[key] = out
        out.extend(_restore_val(x, graft, copy, memo) for x in elems)
        return out
    elif kind == "u":
        _, _, elems, typ = v
        vals = [_restore_val(x, graft, copy, memo) for x in elems]
        out = tuple(vals) if typ is tuple else (typ(*vals) if hasattr(typ, "_fields") else typ(vals))
    elif kind == "x":
        out = v[2].__swpipe_clone__() if copy else v[2]
    elif kind == "o":
        _, _, cls, cached_attrs = v
        out = cls.__new__(cls)
        memo[key] = out
        for k, x in cached_attrs.items():
            object.__setattr__(out, k, _restore_val(x, graft, copy, memo))
        return out
    else:  # pragma: no cover - records are only made by _cache_val
        raise ValueError(f"unknown shortcut cache record kind {kind!r}")
    memo[key] = out
    return out


def _version_of(t: torch.Tensor) -> Optional[int]:
    """A tensor's in-place version counter (None for inference tensors, which have none)."""
    try:
        return t._version
    except RuntimeError:
        return None


def _new_like(typ: type) -> Any:
    """An empty instance of a dict/list subclass (falls back to ``typ.__new__``)."""
    try:
        return typ()
    except TypeError:
        return typ.__new__(typ)


def _grad_tensors(values: Iterable[Any]) -> List[torch.Tensor]:
    """Tensors requiring grad reachable from ``values`` (each once, cycle safe)."""
    out: List[torch.Tensor] = []
    seen: set = set()
    stack = list(values)
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, torch.Tensor):
            if v.requires_grad:
                out.append(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        else:
            attrs = _object_attrs(v)
            if attrs:
                stack.extend(attrs.values())
    return out


# ---------------------------------------------------------------------------
# _GraftGrad
# ---------------------------------------------------------------------------

class _GraftGrad(torch.autograd.Function):
    """The gradient bridge of a shortcut task: identity forward, split backward.

    ``_GraftGrad.apply(restored, *upstream)`` returns ``restored`` unchanged
    (zero-copy) but attached to the autograd graph of ``upstream``, the
    tensors requiring grad that were in the context before the shortcut task
    (its possible inputs). In backward the incoming gradient goes to
    ``restored`` and zeros go to every upstream tensor. So when ``Forward`` is
    shortcut, a following ``Backward``'s ``loss.backward()`` still runs, and
    the backward of upstream tasks (e.g. an embedding lookup) still executes,
    as it would in the real step.

    Parameter gradients: the shortcut path contributes nothing to them.
    Parameters used only inside the shortcut task are not in the graph, so
    their ``.grad`` is left as it was (``None`` after ``zero_grad()``).
    Parameters upstream of the task receive exactly zero from this path (their
    ``.grad`` becomes a zero tensor if it was ``None``). An optimizer step
    after a shortcut therefore does not move parameters through the
    shortcut path (plain SGD leaves them unchanged; optimizers with momentum
    or weight decay still apply those terms to parameters that have a grad).

    Examples
    --------
    >>> import torch
    >>> w = torch.ones(2, requires_grad=True)
    >>> upstream = w * 3                      # built before the shortcut task
    >>> restored = torch.ones(2, requires_grad=True)
    >>> out = _GraftGrad.apply(restored, upstream)
    >>> (out * 5).sum().backward()
    >>> restored.grad, w.grad
    (tensor([5., 5.]), tensor([0., 0.]))
    """

    @staticmethod
    def forward(ctx: Any, restored: torch.Tensor, *upstream: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        # Zero gradients are prepared here, outside the timed backward: one
        # scalar per dtype/device expanded to each shape, so no memory is filled.
        scalars: Dict[Tuple[torch.dtype, torch.device], torch.Tensor] = {}
        zeros = []
        for u in upstream:
            k = (u.dtype, u.device)
            if k not in scalars:
                scalars[k] = torch.zeros((), dtype=u.dtype, device=u.device)
            zeros.append(scalars[k].expand(u.shape))
        ctx.zeros = zeros
        return restored.detach()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:  # type: ignore[override]
        return (grad_output, *ctx.zeros)


def _graft_to(upstream: List[torch.Tensor]) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
    if not upstream:
        return None
    return lambda restored: _GraftGrad.apply(restored, *upstream)


# ---------------------------------------------------------------------------
# The shortcut state the engine holds
# ---------------------------------------------------------------------------

@dataclass
class _TaskCache:
    """What one caching run of a task recorded."""

    changes: Any                    # _cache_val record of {attr: new value}
    deleted: Tuple[str, ...]        # attributes the task deleted
    io: List[Any] = field(default_factory=list)  # one _cache_val record per DeclaredIO
    needs_graft: bool = False       # some cached tensor requires grad


class _ShortcutState:
    """Which tasks are shortcut, their caches, and the caching/replay logic.

    The engine holds one and dispatches ``task.fn(ctx)`` unless
    ``task.name in state.tasks``, in which case it calls
    ``state.execute(task, ctx)``. The first execution caches, later ones
    replay. ``tasks`` is replaced (never mutated) on enable/disable, so
    readers on worker threads always see a consistent set. Caches are
    written first-wins under a lock: two concurrent first executions of one
    task both run it and one cache is kept.

    Examples
    --------
    >>> from swpipe import IterContext, PipelineTask
    >>> calls = []
    >>> def fwd(ctx):
    ...     calls.append(ctx.iter_idx); ctx.y = ctx.batch * 2; del ctx.tmp
    >>> task, state = PipelineTask("Forward", fwd), _ShortcutState()
    >>> state.enable(["Forward"])
    >>> for i in range(3):
    ...     ctx = IterContext(batch=i + 1, iter_idx=i); ctx.tmp = 0
    ...     state.execute(task, ctx)
    ...     print(ctx.y, hasattr(ctx, "tmp"))
    2 False
    2 False
    2 False
    >>> calls                       # ran once (caching), then replayed
    [0]
    >>> state.disable(["Forward"]); state.tasks, state.cached
    (frozenset(), frozenset())
    """

    def __init__(self) -> None:
        self.tasks: frozenset = frozenset()
        self._cache: Dict[str, _TaskCache] = {}
        self._lock = threading.Lock()

    @property
    def cached(self) -> frozenset:
        """Names of tasks whose cache is filled (they replay on next execution)."""
        return frozenset(self._cache)

    def enable(self, names: Iterable[str]) -> None:
        """Shortcut ``names`` (already validated by the engine); existing caches are kept."""
        with self._lock:
            self.tasks = self.tasks | frozenset(names)

    def disable(self, names: Iterable[str]) -> None:
        """Stop shortcutting ``names`` and drop their caches."""
        names = frozenset(names)
        with self._lock:
            self.tasks = self.tasks - names
            for n in names:
                self._cache.pop(n, None)

    def execute(self, task: Any, ctx: Any) -> None:
        """Run ``task`` on ``ctx`` in caching mode the first time, replay it afterwards."""
        cache = self._cache.get(task.name)
        if cache is not None:
            self._replay(task, ctx, cache)
            return
        before = dict(vars(ctx))  # holds references, so no id is reused during fn
        task.fn(ctx)
        after = vars(ctx)
        changes = {k: v for k, v in after.items() if k not in _ENGINE_ATTRS and (k not in before or before[k] is not v)}
        deleted = tuple(k for k in before if k not in after and k not in _ENGINE_ATTRS)
        record = _TaskCache(
            changes=_cache_val(changes),
            deleted=deleted,
            io=[_cache_val(io.capture()) for io in task.io],
            needs_graft=bool(_grad_tensors(changes.values())),
        )
        with self._lock:
            if task.name in self.tasks:  # a disable() racing with this run drops it
                self._cache.setdefault(task.name, record)

    def _replay(self, task: Any, ctx: Any, cache: _TaskCache) -> None:
        graft = _graft_to(_grad_tensors(vars(ctx).values())) if cache.needs_graft else None
        memo: Dict[int, Any] = {}  # shared, so aliasing between attributes survives
        values = {}
        for k, rec in cache.changes[2].items():
            try:
                values[k] = _restore_val(rec, graft, False, memo)
            except ShortcutCorruptedError as exc:
                raise ShortcutCorruptedError(exc.shape, exc.dtype, task.name, k) from None
        for k in cache.deleted:
            if k in vars(ctx):
                delattr(ctx, k)
        for k, v in values.items():
            setattr(ctx, k, v)
        # A CUDA pipeline's context keeps what leaves it until its iteration's device work is done
        # (engine.lifetime.GuardedContext); the external values a restore replaces go there too, as
        # capture() returns them (the live objects for the usual capture=lambda: dict(state)).
        graveyard = getattr(ctx, "_swp_graveyard", None)
        for io, snap in zip(task.io, cache.io):
            if graveyard is not None:
                graveyard.append(io.capture())
            io.restore(_restore_val(snap, copy=True))
