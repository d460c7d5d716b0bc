"""Snapshot and restore training state exactly: weights, buffers, gradients, optimizer state, RNG.

A measurement that really trains (profiling a training step, verifying
candidate plans on the engine, recording its dataflow) changes the model it
measures. :func:`snapshot_state` records what such a run can change and
:func:`restore_state` puts it back, so the measurement leaves the user's
training exactly where it was:

* every parameter and buffer registered anywhere in a module's tree (walked
  through ``nn.Module``'s own registries, so the buffers of a fused embedding
  kernel count even where a wrapper hides them from ``named_buffers``), its
  gradient, and which tensor object each module attribute holds (a parameter
  replaced after the snapshot is put back);
* an optimizer's per-parameter state (entries created later are removed;
  tensors are restored in place, so state that aliases module storage stays
  aliased) and its hyper-parameters; TorchRec's ``CombinedOptimizer`` through
  its ``optimizers``, sharded tensors through their local shards;
* any other object with ``state_dict()`` / ``load_state_dict()`` (an LR
  scheduler, a gradient scaler) through those;
* torch's CPU random generator and, when CUDA is initialised, every CUDA
  device's.

Values are copied (``clone``); the snapshot holds one copy of the state.
"""

from __future__ import annotations

import copy
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

__all__ = ["StateSnapshot", "snapshot_state", "restore_state"]

_NONE = object()  # "this slot held None" (a gradient, a registered parameter)


@dataclass
class StateSnapshot:
    """What :func:`snapshot_state` recorded; pass it to :func:`restore_state`.

    Attributes
    ----------
    tensors : int
        How many tensors were copied (parameters, buffers, gradients, optimizer state).
    nbytes : int
        Bytes those copies hold.
    """

    roots: List[int]
    modules: List[Tuple[torch.nn.Module, str, str, Any, Any]] = field(default_factory=list)
    grads: List[Tuple[torch.Tensor, Any]] = field(default_factory=list)
    optimizers: List[Tuple[Any, Any]] = field(default_factory=list)
    stateful: List[Tuple[Any, Any]] = field(default_factory=list)
    rng_cpu: Optional[torch.Tensor] = None
    rng_accel: Dict[str, List[torch.Tensor]] = field(default_factory=dict)
    tensors: int = 0
    nbytes: int = 0

    def __repr__(self) -> str:
        return (f"StateSnapshot({len(self.roots)} object(s), {self.tensors} tensors, "
                f"{self.nbytes / 2**20:.1f} MiB, rng {'+'.join(['cpu', *self.rng_accel]) if self.rng_cpu is not None else 'off'})")


# ----------------------------------------------------------------------------------- tensors


def _is_sharded(t: Any) -> bool:
    return callable(getattr(t, "local_shards", None))


def _copy(t: Any, snap: StateSnapshot) -> Any:
    """A detached copy of a tensor (a sharded tensor: of each local shard)."""
    if _is_sharded(t):
        return [_copy(s.tensor, snap) for s in t.local_shards()]
    c = t.detach().clone()
    snap.tensors += 1
    snap.nbytes += c.numel() * c.element_size()
    return c


def _put(live: Any, saved: Any) -> None:
    """Write ``saved`` back into ``live`` in place (same object afterwards)."""
    if _is_sharded(live):
        for s, v in zip(live.local_shards(), saved):
            _put(s.tensor, v)
        return
    with torch.no_grad():
        if live.shape == saved.shape and live.dtype == saved.dtype and live.device == saved.device:
            live.copy_(saved)
        else:  # resized or cast since the snapshot
            live.data = saved.clone()


def _save_value(v: Any, snap: StateSnapshot) -> Any:
    if isinstance(v, torch.Tensor) or _is_sharded(v):
        return ("tensor", v, _copy(v, snap))
    return ("value", None, copy.deepcopy(v))


def _restore_value(container: Any, key: Any, saved: Any) -> None:
    kind, obj, value = saved
    if kind == "tensor":
        current = container.get(key) if hasattr(container, "get") else None
        if current is obj:
            _put(obj, value)
        else:  # replaced since the snapshot: the original object comes back, with its values
            _put(obj, value)
            container[key] = obj
    else:
        container[key] = copy.deepcopy(value)


# ----------------------------------------------------------------------------------- modules


def _walk_modules(root: torch.nn.Module) -> List[torch.nn.Module]:
    """Every module of the tree, each once, through ``_modules`` (not the overridable ``named_modules``)."""
    out: Dict[int, torch.nn.Module] = {}
    stack = [root]
    while stack:
        m = stack.pop()
        if id(m) in out:
            continue
        out[id(m)] = m
        stack.extend(c for c in m._modules.values() if c is not None)
    return list(out.values())


def _snapshot_module(module: torch.nn.Module, snap: StateSnapshot, seen: Dict[int, Any]) -> None:
    for m in _walk_modules(module):
        for kind in ("_parameters", "_buffers"):
            for name, t in getattr(m, kind).items():
                if t is None:
                    snap.modules.append((m, kind, name, _NONE, None))
                    continue
                if id(t) not in seen:
                    seen[id(t)] = _copy(t, snap)
                    if kind == "_parameters" and not _is_sharded(t):
                        g = t.grad
                        snap.grads.append((t, _NONE if g is None else _copy(g, snap)))
                snap.modules.append((m, kind, name, t, seen[id(t)]))


def _restore_modules(snap: StateSnapshot) -> None:
    done = set()
    for m, kind, name, t, value in snap.modules:
        registry = getattr(m, kind)
        if t is _NONE:
            registry[name] = None
            continue
        if registry.get(name) is not t:
            registry[name] = t
        if id(t) not in done:
            done.add(id(t))
            _put(t, value)
    for p, g in snap.grads:
        if g is _NONE:
            p.grad = None
        elif p.grad is not None and p.grad.shape == g.shape and p.grad.dtype == g.dtype:
            with torch.no_grad():
                p.grad.copy_(g)
        else:
            p.grad = g.clone()


# -------------------------------------------------------------------------------- optimizers


def _sub_optimizers(opt: Any) -> Optional[List[Any]]:
    """TorchRec's ``CombinedOptimizer`` exposes its parts as ``optimizers = [(key, optimizer), ...]``."""
    subs = getattr(opt, "optimizers", None)
    if isinstance(subs, (list, tuple)) and all(isinstance(s, tuple) and len(s) == 2 for s in subs):
        return [o for _, o in subs]
    return None


def _snapshot_optimizer(opt: Any, snap: StateSnapshot) -> Any:
    subs = _sub_optimizers(opt)
    if subs is not None:
        return ("combined", [(o, _snapshot_optimizer(o, snap)) for o in subs])
    state = {id(p): (p, {k: _save_value(v, snap) for k, v in s.items()}) for p, s in opt.state.items()}
    groups = [{k: _save_value(v, snap) for k, v in g.items() if k != "params"} for g in opt.param_groups]
    return ("state", state, groups)


def _restore_optimizer(opt: Any, saved: Any) -> None:
    if saved[0] == "combined":
        for o, s in saved[1]:
            _restore_optimizer(o, s)
        return
    _, state, groups = saved
    live = opt.state
    if isinstance(live, MutableMapping):
        for p in [p for p in live if id(p) not in state]:
            del live[p]  # state the run created: the optimizer had none for this parameter
    for p, entries in state.values():
        current = live.get(p) if hasattr(live, "get") else None
        if current is None or not isinstance(current, MutableMapping):
            if not isinstance(live, MutableMapping):
                raise RuntimeError(f"restore_state: {type(opt).__name__} lost the state of a parameter and its "
                                   "state mapping cannot be written; snapshot and restore its parts instead")
            current = live[p] = {}
        for k in [k for k in current if k not in entries]:
            del current[k]
        for k, v in entries.items():
            _restore_value(current, k, v)
    for g, saved_group in zip(opt.param_groups, groups):
        for k in [k for k in g if k != "params" and k not in saved_group]:
            del g[k]
        for k, v in saved_group.items():
            _restore_value(g, k, v)


# ----------------------------------------------------------------------------------- the API


def _roots(state: Any) -> List[Any]:
    """The objects of ``state`` (modules, optimizers, stateful objects), flattened, each once."""
    out: Dict[int, Any] = {}
    items: List[Any] = [state]
    while items:
        obj = items.pop(0)
        if obj is None:
            continue
        if isinstance(obj, dict):
            items[:0] = list(obj.values())
        elif isinstance(obj, (list, tuple)):
            items[:0] = list(obj)
        elif isinstance(obj, (torch.nn.Module, torch.optim.Optimizer)) or _sub_optimizers(obj) is not None or (
                callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            out.setdefault(id(obj), obj)
        else:
            raise TypeError(f"state: expected modules, optimizers, objects with state_dict()/load_state_dict(), "
                            f"or lists/dicts of them; got {type(obj).__name__}")
    return list(out.values())


def _accelerators() -> List[str]:
    """Accelerator kinds whose generators exist now (CUDA once initialised), through the device seam."""
    from swpipe_core.engine.device import cuda_available

    if not cuda_available():
        return []
    mod = torch.get_device_module("cuda")
    return ["cuda"] if mod.is_initialized() else []


def snapshot_state(state: Any, rng: bool = True) -> StateSnapshot:
    """Record the state a training run can change, for :func:`restore_state`.

    Parameters
    ----------
    state : module, optimizer, stateful object, or a list/tuple/dict of them
        ``torch.nn.Module`` (every parameter, buffer and gradient in its
        tree), optimizers (``torch.optim`` and TorchRec's keyed, fused and
        combined ones), other objects with ``state_dict()`` and
        ``load_state_dict()`` (LR schedulers).
    rng : bool
        Also record torch's random generators (CPU, and CUDA's when initialised).

    Returns
    -------
    StateSnapshot

    Raises
    ------
    TypeError
        ``state`` holds something that is none of the above.

    Examples
    --------
    >>> _ = torch.manual_seed(0)
    >>> model = torch.nn.Linear(3, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> before = {k: v.clone() for k, v in model.state_dict().items()}
    >>> snap = snapshot_state([model, opt])
    >>> for _ in range(3):  # a measurement that trains
    ...     opt.zero_grad(); model(torch.randn(4, 3)).sum().backward(); opt.step()
    >>> restore_state([model, opt], snap)
    >>> all(torch.equal(before[k], v) for k, v in model.state_dict().items()), opt.state_dict()["state"]
    (True, {})
    >>> model.weight.grad is None
    True
    """
    roots = _roots(state)
    snap = StateSnapshot(roots=[id(r) for r in roots])
    seen: Dict[int, Any] = {}
    for obj in roots:
        if isinstance(obj, torch.nn.Module):
            _snapshot_module(obj, snap, seen)
        elif isinstance(obj, torch.optim.Optimizer) or _sub_optimizers(obj) is not None:
            snap.optimizers.append((obj, _snapshot_optimizer(obj, snap)))
        else:
            snap.stateful.append((obj, _clone_tree(obj.state_dict(), snap)))
    if rng:
        snap.rng_cpu = torch.get_rng_state()
        for kind in _accelerators():
            snap.rng_accel[kind] = torch.get_device_module(kind).get_rng_state_all()
    return snap


def _clone_tree(obj: Any, snap: StateSnapshot) -> Any:
    if isinstance(obj, torch.Tensor):
        return _copy(obj, snap)
    if isinstance(obj, dict):
        return {k: _clone_tree(v, snap) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone_tree(v, snap) for v in obj]
    if type(obj) is tuple:
        return tuple(_clone_tree(v, snap) for v in obj)
    return copy.deepcopy(obj)


def restore_state(state: Any, snapshot: StateSnapshot) -> None:
    """Put back what :func:`snapshot_state` recorded for the same ``state``.

    Tensors are written back in place (the objects the model and the
    optimizer hold stay the same objects); a parameter or buffer replaced
    since the snapshot is registered again; gradients and optimizer state
    created since are removed. The snapshot stays valid: restore it again to
    go back once more.

    Parameters
    ----------
    state : as given to :func:`snapshot_state`
    snapshot : StateSnapshot

    Raises
    ------
    ValueError
        ``state`` is not the set of objects the snapshot was taken of.

    Examples
    --------
    >>> lin = torch.nn.Linear(2, 2)
    >>> snap = snapshot_state(lin, rng=False)
    >>> with torch.no_grad():
    ...     _ = lin.weight.mul_(0)
    >>> restore_state(lin, snap); bool(lin.weight.abs().sum() > 0)
    True
    >>> restore_state(torch.nn.Linear(2, 2), snap)
    Traceback (most recent call last):
    ...
    ValueError: restore_state: the state given (1 object(s): Linear) is not the one snapshotted (1 object(s)); pass the same modules and optimizers to snapshot_state and restore_state
    """
    roots = _roots(state)
    if [id(r) for r in roots] != snapshot.roots:
        names = ", ".join(type(r).__name__ for r in roots)
        raise ValueError(f"restore_state: the state given ({len(roots)} object(s): {names}) is not the one "
                         f"snapshotted ({len(snapshot.roots)} object(s)); pass the same modules and optimizers to "
                         "snapshot_state and restore_state")
    _restore_modules(snapshot)
    for opt, saved in snapshot.optimizers:
        _restore_optimizer(opt, saved)
    for obj, saved in snapshot.stateful:
        obj.load_state_dict(_clone_tree(saved, StateSnapshot(roots=[])))
    if snapshot.rng_cpu is not None:
        torch.set_rng_state(snapshot.rng_cpu)
        for kind, states in snapshot.rng_accel.items():
            torch.get_device_module(kind).set_rng_state_all(states)
