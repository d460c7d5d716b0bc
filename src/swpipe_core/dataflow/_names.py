"""Readable names for what a task touches: the user's state, the batch, ctx attributes.

``state`` given to the recorder names parameters (``0.weight``), their
gradients (``0.weight.grad``), buffers and optimizer state
(``optimizer.state[0.weight].momentum_buffer``). The batch and ctx attributes
are walked a few levels deep so a storage reads as ``batch.dense`` or
``ctx.emb.pooled`` rather than a number. Fingerprints of non-tensor values
let the recorder notice a task changing a Python object held in ``ctx`` in
place (``ctx.idist.recv_values = ...``), which the dispatcher cannot see.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from swpipe_core.dataflow._watch import storage_key

__all__: list = []

State = Union[None, Mapping[str, Any], Sequence[Any], torch.nn.Module, torch.optim.Optimizer]

_PRIMITIVES = (int, float, str, bool, bytes, complex, type(None), range, torch.dtype, torch.device)


def _items(state: State) -> List[Tuple[str, Any]]:
    if state is None:
        return []
    if isinstance(state, (torch.nn.Module, torch.optim.Optimizer, torch.Tensor)):
        state = [state]
    if isinstance(state, Mapping):
        return [(str(k), v) for k, v in state.items()]
    out, n_opt = [], 0
    for obj in state:
        if isinstance(obj, torch.optim.Optimizer):
            out.append(("optimizer" if n_opt == 0 else f"optimizer{n_opt}", obj))
            n_opt += 1
        elif isinstance(obj, torch.nn.Module):
            out.append(("", obj))
        else:
            raise TypeError(f"state: {type(obj).__name__} is not a Module, Optimizer or Tensor; pass "
                            "state={'name': tensor} to name a plain tensor")
    return out


def check_state(state: State) -> None:
    """Raise a ``TypeError`` naming the entry for state the recorder cannot name."""
    for name, obj in _items(state):
        if not isinstance(obj, (torch.nn.Module, torch.optim.Optimizer, torch.Tensor)):
            raise TypeError(f"state[{name!r}] is a {type(obj).__name__}; give a Module, an Optimizer or a Tensor")


def named_state(state: State) -> Dict[str, Optional[torch.Tensor]]:
    """``{name: tensor or None}`` for every parameter, gradient slot, buffer and optimizer state tensor.

    A gradient slot is listed with ``None`` while the gradient is unset, so
    that setting it to ``None`` (``zero_grad(set_to_none=True)``) shows as a
    change of that name.
    """
    items = _items(state)
    out: Dict[str, Optional[torch.Tensor]] = {}
    pnames: Dict[int, str] = {}
    for prefix, obj in items:
        if isinstance(obj, torch.nn.Module):
            dot = f"{prefix}." if prefix else ""
            for n, p in obj.named_parameters(remove_duplicate=False):
                pnames.setdefault(id(p), dot + n)
                out.setdefault(dot + n, p)
                if p.requires_grad:
                    out.setdefault(f"{dot}{n}.grad", p.grad)
            for n, b in obj.named_buffers(remove_duplicate=False):
                out.setdefault(dot + n, b)
        elif isinstance(obj, torch.Tensor):
            out.setdefault(prefix, obj)
    for prefix, obj in items:
        if isinstance(obj, torch.optim.Optimizer):
            k = 0
            for group in obj.param_groups:
                for p in group["params"]:
                    pname = pnames.get(id(p), f"param{k}")
                    k += 1
                    if id(p) not in pnames:
                        out.setdefault(pname, p)
                        out.setdefault(f"{pname}.grad", p.grad)
                    for key, v in obj.state.get(p, {}).items():
                        if isinstance(v, torch.Tensor):
                            out[f"{prefix}.state[{pname}].{key}"] = v
    return out


def storage_names(named: Mapping[str, Optional[torch.Tensor]]) -> Dict[int, str]:
    """Storage key -> the best name: the tensor covering most of the storage, then the first given."""
    best: Dict[int, Tuple[int, str]] = {}
    for name, t in named.items():
        if t is None:
            continue
        key = storage_key(t)
        if key is None:
            continue
        if key not in best or t.numel() > best[key][0]:
            best[key] = (t.numel(), name)
    return {k: v[1] for k, v in best.items()}


def walk(value: Any, path: str, depth: int = 3, limit: int = 64) -> Iterator[Tuple[str, torch.Tensor]]:
    """``(path, tensor)`` for the tensors inside a value, a few levels deep.

    Examples
    --------
    >>> [p for p, _ in walk({"x": torch.zeros(1), "y": [torch.ones(1)]}, "batch")]
    ['batch[x]', 'batch[y][0]']
    """
    if isinstance(value, torch.Tensor):
        yield path, value
        return
    if depth <= 0 or isinstance(value, _PRIMITIVES):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value[:limit]):
            yield from walk(v, f"{path}[{i}]", depth - 1, limit)
    elif isinstance(value, Mapping):
        for i, (k, v) in enumerate(value.items()):
            if i >= limit:
                break
            yield from walk(v, f"{path}[{k}]", depth - 1, limit)
    elif hasattr(value, "__dict__"):
        for i, (k, v) in enumerate(vars(value).items()):
            if i >= limit or k.startswith("_"):
                continue
            yield from walk(v, f"{path}.{k}", depth - 1, limit)


def fingerprint(value: Any) -> Any:
    """A shallow identity of a non-tensor value, to notice in-place changes; ``None`` if not needed.

    Tensors are watched by storage and primitives are immutable, so both give
    ``None``. ``"opaque"`` marks a value the recorder cannot look into.

    Examples
    --------
    >>> box = {"a": 1}; fp = fingerprint(box); box["b"] = 2; fp == fingerprint(box)
    False
    >>> fingerprint(torch.zeros(1)) is None, fingerprint(3) is None
    (True, True)
    """
    if isinstance(value, (torch.Tensor,) + _PRIMITIVES):
        return None
    try:
        if isinstance(value, (list, tuple)):
            return (type(value).__name__, tuple(id(v) for v in value))
        if isinstance(value, Mapping):
            return ("map", tuple((k, id(v)) for k, v in value.items()))
        if isinstance(value, (set, frozenset)):
            return ("set", frozenset(id(v) for v in value))
        if hasattr(value, "__dict__"):
            return ("obj", tuple((k, id(v)) for k, v in vars(value).items()))
    except Exception:  # noqa: BLE001 - a user object whose iteration fails is just opaque
        pass
    return "opaque"
