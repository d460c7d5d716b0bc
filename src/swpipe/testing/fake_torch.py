"""torch tensors on the fake device: each op a kernel on the current stream, autograd with CUDA's stream rules.

:class:`FakeCudaTensor` is a ``torch.Tensor`` subclass whose data lives in the
fake device's memory (a block of its caching allocator, in the pool of the
stream that allocated it). Each aten op on it (``__torch_dispatch__``) is a
kernel: its outputs' shapes are worked out at once on meta tensors, the outputs
allocated on the current stream, and the real CPU op runs when that stream
reaches it; its reads and writes go to the race check. What the host needs to
see (``.item()``, ``torch.equal``, a copy into a CPU tensor, an output whose
shape depends on the values such as ``nonzero``) is a copy on the current
stream that the host waits for, as on CUDA. A non-blocking copy from pageable
host memory returns once the data is staged.

Autograd follows CUDA's rules (PyTorch's CUDA semantics notes, "Stream semantics
of backward passes"), modelled on the graph autograd builds:

* each backward op runs on the stream of its forward op: every node of the
  graph takes the stream current when the forward call that made it ran
  (``AccumulateGrad`` too: the first forward op that used the parameter in that
  graph made it);
* a node whose incoming gradient was produced on another stream first makes
  its own stream wait for that one (the engine's input-buffer sync);
* when backward ends, the stream current on the calling thread waits for the
  streams the graph's leaves ran on, so the gradients may be used there.

So a parameter's gradient is *allocated* on the stream of the forward op whose
backward produced it (``AccumulateGrad`` keeps that buffer as ``.grad``), and
``zero_grad(set_to_none=True)`` hands it back to that stream's pool.

Examples
--------
>>> import torch
>>> from swpipe.testing import FakeCuda
>>> with FakeCuda(num_devices=1) as fake:
...     dev = fake.device(0)
...     lin = dev.module(torch.nn.Linear(3, 1))
...     side = dev.draw_stream()
...     side.wait_stream(dev.default_stream())                # the parameters were copied on the default stream
...     with dev.use(side):
...         loss = lin(dev.tensor(torch.ones(2, 3))).sum()   # forward on ``side``
...     loss.backward()                                      # backward ops run on ``side`` too
...     grad_home = dev.stream_of(lin.weight.grad)
...     total = lin.weight.grad.sum().item()                 # on the default stream, after backward's final wait
...     races = fake.races
>>> grad_home is side, total, races
(True, 6.0, [])
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

__all__ = ["FakeCudaTensor"]

_STREAM = "swpipe_fake_stream"  # a graph node's metadata key: the fake stream its backward ops run on
# ops that read only their inputs' shape and dtype, never the data (a kernel that writes its output alone)
_SHAPE_ONLY = frozenset(f"aten::{name}" for name in (
    "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like", "new_empty",
    "new_empty_strided", "new_zeros", "new_ones", "new_full"))


class _Storage:
    """The fake device memory behind a tensor and its views: one block of the caching allocator."""

    __slots__ = ("device", "block", "writer", "by_backward", "__weakref__")

    def __init__(self, device: Any, block: Any) -> None:
        self.device, self.block = device, block
        self.writer = block.stream  # the stream of the last kernel that wrote it: a gradient's producer
        self.by_backward = False  # last written by a backward op (else: an initial gradient, made by the caller)

    def real(self, dtype: torch.dtype, size: Sequence[int], stride: Sequence[int], offset: int) -> torch.Tensor:
        """The bytes as a CPU tensor of this layout (read and written by the kernels when they run)."""
        return self.block.raw.view(dtype).as_strided(size, stride, offset)

    def __del__(self) -> None:
        try:
            self.device._allocator.free(self.block)
        except Exception:  # interpreter shutdown, or a closed fake: nothing to give back to
            pass


class FakeCudaTensor(torch.Tensor):
    """A tensor in a fake device's memory: torch's ops run as kernels on the calling thread's current stream.

    Make one with :meth:`FakeCudaDevice.tensor <swpipe.testing.FakeCudaDevice.tensor>` (a host-to-device copy)
    or move a module's parameters and buffers with :meth:`FakeCudaDevice.module
    <swpipe.testing.FakeCudaDevice.module>`; every op on it gives fake tensors again. Its ``device`` reads
    ``cpu`` (torch has no device of this kind); :meth:`FakeCudaDevice.memory_of
    <swpipe.testing.FakeCudaDevice.memory_of>` and ``fake_device`` say where it lives.
    """

    _fake: _Storage

    @staticmethod
    def __new__(cls, storage: _Storage, size: Sequence[int], stride: Sequence[int], offset: int,
                dtype: torch.dtype) -> "FakeCudaTensor":
        t = torch.Tensor._make_wrapper_subclass(cls, size, strides=stride, storage_offset=offset, dtype=dtype,
                                                device="cpu", requires_grad=False)
        t._fake = storage
        return t

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    @property
    def fake_device(self) -> Any:
        """The :class:`~swpipe.testing.FakeCudaDevice` whose memory holds it."""
        return self._fake.device

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # never reads the device
        return (f"FakeCudaTensor(shape={tuple(self.shape)}, dtype={self.dtype}, block=#{self._fake.block.id}, "
                f"device={self._fake.device.torch_device})")

    def _real(self) -> torch.Tensor:
        return self._fake.real(self.dtype, self.size(), self.stride(), self.storage_offset())

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        if torch.is_grad_enabled():
            with torch._C.DisableTorchFunctionSubclass():  # the walk reads grad_fn: no call back in here
                _tag_new_nodes(out)
        return out

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        dev = _device_of(func, args, kwargs)
        # torch's (private) record of the node autograd is running: below autograd, the only way to tell which
        # backward op this is, hence its forward op's stream
        node = torch._C._current_autograd_node()
        stream = node.metadata.get(_STREAM) if node is not None else None
        if stream is None:
            stream = dev.current_stream()
        if func is torch.ops.aten.copy_.default:
            special = _copy(dev, stream, *args, **kwargs)
            if special is not None:
                return special
        return _kernel(dev, stream, func, args, kwargs)


# -- where an op runs ------------------------------------------------------------------------------------------

def _device_of(func: Any, args: Any, kwargs: Any) -> Any:
    """The fake device of the op's fake tensors; other tensors may only be CPU scalars (or a copy's other side)."""
    devices = {id(x._fake.device): x._fake.device for x in tree_flatten((args, kwargs))[0]
               if isinstance(x, FakeCudaTensor)}
    if len(devices) != 1 and func is not torch.ops.aten.copy_.default:
        raise RuntimeError(f"{func}: expected all tensors to be on the same device, got fake tensors of "
                           f"{sorted(str(d.torch_device) for d in devices.values())}")
    if func is not torch.ops.aten.copy_.default:
        for x in tree_flatten((args, kwargs))[0]:
            if isinstance(x, torch.Tensor) and not isinstance(x, FakeCudaTensor) and x.dim() > 0:
                raise RuntimeError(f"{func}: expected all tensors to be on the same device, but found a CPU tensor "
                                   f"of shape {tuple(x.shape)} beside tensors of the fake CUDA device (copy it with "
                                   "FakeCudaDevice.tensor first)")
    return next(iter(devices.values()))


def _tag_new_nodes(out: Any) -> None:
    """Give every new node of the graph behind ``out`` the stream its backward ops will run on, and the syncs."""
    roots = [t.grad_fn for t in tree_flatten(out)[0] if isinstance(t, FakeCudaTensor) and t.grad_fn is not None]
    if not roots:
        return
    current = torch._C._current_autograd_node()  # a forward call inside a backward (a custom Function)
    stream = current.metadata.get(_STREAM) if current is not None else None
    todo = list(roots)
    while todo:
        node = todo.pop()
        if node is None or _STREAM in node.metadata:
            continue
        if stream is None:
            stream = _any_fake(out).fake_device.current_stream()
        node.metadata[_STREAM] = stream
        node.register_prehook(functools.partial(_before_node, stream, not node.next_functions))
        todo.extend(fn for fn, _ in node.next_functions)


def _any_fake(out: Any) -> FakeCudaTensor:
    return next(t for t in tree_flatten(out)[0] if isinstance(t, FakeCudaTensor))


def _before_node(stream: Any, leaf: bool, grad_outputs: Sequence[Any]) -> None:
    """Before a node runs: its stream waits for the streams its incoming gradients came from (an initial gradient:
    the caller's current stream, wherever it was made); once backward ends, the caller's current stream waits for a
    leaf's stream."""
    for g in grad_outputs:
        if isinstance(g, FakeCudaTensor):
            producer = g._fake.writer if g._fake.by_backward else g._fake.device.current_stream()
            if producer is not stream:
                _stream_waits(stream, producer)
    if leaf:
        torch.autograd.Variable._execution_engine.queue_callback(functools.partial(_caller_waits, stream))


def _caller_waits(leaf_stream: Any) -> None:
    """Backward ended: the calling thread's current stream (of the leaf's device) waits for a leaf's stream."""
    current = leaf_stream._dev.current_stream()
    if current is not leaf_stream:
        _stream_waits(current, leaf_stream)


def _stream_waits(stream: Any, other: Any) -> None:
    event = other._dev.event()
    other._dev.record(event, other)
    stream._dev.wait(stream, event)


# -- the kernels -----------------------------------------------------------------------------------------------

def _meta(x: Any) -> Any:
    if not isinstance(x, FakeCudaTensor):
        return x
    numel = x._fake.block.raw.numel() // x.element_size()
    return torch.empty(numel, dtype=x.dtype, device="meta").as_strided(x.size(), x.stride(), x.storage_offset())


def _real(x: Any) -> Any:
    return x._real() if isinstance(x, FakeCudaTensor) else x


def _schema_args(func: Any, args: Any, kwargs: Any) -> List[Tuple[Any, Any]]:
    """(argument schema, value) of each argument given."""
    out = []
    for k, arg in enumerate(func._schema.arguments):
        if k < len(args):
            out.append((arg, args[k]))
        elif arg.name in kwargs:
            out.append((arg, kwargs[arg.name]))
    return out


def _kernel(dev: Any, stream: Any, func: Any, args: Any, kwargs: Any) -> Any:
    """One op as a kernel on ``stream``: outputs shaped on meta tensors now, the real op when the stream runs it."""
    given = _schema_args(func, args, kwargs)
    written = [x for x in tree_flatten([v for a, v in given if a.alias_info is not None and a.alias_info.is_write])[0]
               if isinstance(x, FakeCudaTensor)]
    fakes_in = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, FakeCudaTensor)]
    try:
        meta_out = func(*tree_map(_meta, args), **tree_map(_meta, kwargs))
    except Exception:  # no meta kernel, or the output's shape depends on the values (nonzero): the host waits
        return _on_host(dev, stream, func, args, kwargs, written)
    returns = func._schema.returns
    per_return = list(meta_out) if len(returns) > 1 else [meta_out]
    leaves, spec = tree_flatten(meta_out)
    if any(not isinstance(m, torch.Tensor) for m in leaves):
        return _on_host(dev, stream, func, args, kwargs, written)
    aliases = {}
    for ret, out in zip(returns, per_return):
        source = None
        if ret.alias_info is not None:
            source = next((v for a, v in given if a.alias_info is not None
                           and a.alias_info.before_set & ret.alias_info.before_set), None)
        for m in tree_flatten(out)[0]:
            aliases[id(m)] = (source, ret.alias_info is not None and ret.alias_info.is_write)
    label = dev.fake._label() or str(func)
    result, fresh = [], []
    for k, m in enumerate(leaves):
        source, in_place = aliases.get(id(m), (None, False))
        if isinstance(source, FakeCudaTensor):
            result.append(source if in_place else
                          FakeCudaTensor(source._fake, m.size(), m.stride(), m.storage_offset(), m.dtype))
            continue
        storage = _Storage(dev, dev._allocator.block(m.untyped_storage().nbytes(), stream, label))
        out = FakeCudaTensor(storage, m.size(), m.stride(), m.storage_offset(), m.dtype)
        result.append(out)
        fresh.append((k, out._real()))
    if not fresh and not written:  # views only: no kernel, no access
        return tree_unflatten(result, spec)
    real_args, real_kwargs = tree_map(_real, args), tree_map(_real, kwargs)

    def run() -> None:
        got = tree_flatten(func(*real_args, **real_kwargs))[0]
        for k, dst in fresh:
            dst.copy_(got[k])
    writes = [result[k] for k, _ in fresh] + written
    _launch(dev, stream, run, label, [] if func._schema.name in _SHAPE_ONLY else fakes_in, writes)
    return tree_unflatten(result, spec)


def _launch(dev: Any, stream: Any, fn: Any, label: str, reads: Sequence[FakeCudaTensor],
            writes: Sequence[FakeCudaTensor]) -> None:
    dev._launch(stream, fn, label, reads=tuple({id(x._fake): x._fake.block for x in reads}.values()),
                writes=tuple({id(x._fake): x._fake.block for x in writes}.values()))
    in_backward = torch._C._current_autograd_node() is not None
    for x in writes:
        x._fake.writer, x._fake.by_backward = stream, in_backward


def _on_host(dev: Any, stream: Any, func: Any, args: Any, kwargs: Any, written: Sequence[Any]) -> Any:
    """An op whose result the host needs now: run it on ``stream`` and wait (as CUDA syncs the stream)."""
    label = dev.fake._label() or str(func)
    fakes_in = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, FakeCudaTensor)]
    real_args, real_kwargs = tree_map(_real, args), tree_map(_real, kwargs)
    box: Dict[str, Any] = {}

    def run() -> None:
        box["out"] = func(*real_args, **real_kwargs)
    _launch(dev, stream, run, label, fakes_in, written)
    dev.fake._sync_stream(stream, f"{func} (the host needs its result)")
    storages = {x._fake.block.raw.untyped_storage().data_ptr(): x for x in fakes_in}

    def back(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        source = storages.get(t.untyped_storage().data_ptr())
        if source is None:
            return _from_host(dev, stream, t.detach(), label, staged=True)
        layout = (t.size(), t.stride(), t.storage_offset(), t.dtype)
        if any(w is source for w in written) and layout == (source.size(), source.stride(),
                                                              source.storage_offset(), source.dtype):
            return source  # an in-place op returns its input
        return FakeCudaTensor(source._fake, *layout)
    return tree_map(back, box["out"])


def _from_host(dev: Any, stream: Any, host: torch.Tensor, label: str, staged: bool) -> FakeCudaTensor:
    """A new fake tensor filled from ``host`` by a copy on ``stream`` (``staged``: from a copy taken now)."""
    host = host.contiguous()
    storage = _Storage(dev, dev._allocator.block(host.untyped_storage().nbytes(), stream, label))
    out = FakeCudaTensor(storage, host.size(), host.stride(), host.storage_offset(), host.dtype)
    dst, src = out._real(), (host.clone() if staged else host)
    _launch(dev, stream, lambda: dst.copy_(src), label, [], [out])
    return out


def _copy(dev: Any, stream: Any, dst: Any, src: Any, non_blocking: bool = False) -> Optional[Any]:
    """``dst.copy_(src)`` across the host and the fake device (``None``: both on the device, an ordinary kernel).

    Host to device: from pinned memory with ``non_blocking`` the copy reads ``src`` when it runs; from pageable
    memory the host returns once the data is staged; without ``non_blocking`` the host waits for the copy (PyTorch
    synchronises the stream). Device to host: the host waits, unless ``non_blocking`` into pinned memory.
    """
    label = dev.fake._label() or "copy_"
    if isinstance(dst, FakeCudaTensor) and not isinstance(src, FakeCudaTensor):
        view = dst._real()
        source = src if (non_blocking and dev.fake.is_pinned(src)) else src.clone()
        _launch(dev, stream, lambda: view.copy_(source), label, [], [dst])
        if not non_blocking:
            dev.fake._sync_stream(stream, "a blocking copy to the device")
        return dst
    if isinstance(src, FakeCudaTensor) and not isinstance(dst, FakeCudaTensor):
        view = src._real()
        _launch(dev, stream, lambda: dst.copy_(view), label, [src], [])
        if not (non_blocking and dev.fake.is_pinned(dst)):
            dev.fake._sync_stream(stream, "a copy to the host")
        return dst
    return None


def host_tensor(dev: Any, data: Any) -> FakeCudaTensor:
    """``data`` (anything ``torch.as_tensor`` takes) copied to ``dev`` on its current stream, non-blocking."""
    host = torch.as_tensor(data)
    if host.device.type != "cpu":
        raise ValueError(f"FakeCudaDevice.tensor: data must be on the host, got a tensor on {host.device}")
    label = dev.fake._label() or "tensor"
    return _from_host(dev, dev.current_stream(), host, label, staged=not dev.fake.is_pinned(host))


def move_module(dev: Any, module: torch.nn.Module) -> torch.nn.Module:
    """Every parameter and buffer of ``module`` copied to ``dev`` (as ``module.to(device)``); returns ``module``."""
    with torch.no_grad():
        for m in module.modules():
            for name, p in list(m._parameters.items()):
                if p is not None and not isinstance(p, FakeCudaTensor):
                    m._parameters[name] = torch.nn.Parameter(host_tensor(dev, p.detach()), p.requires_grad)
            for name, b in list(m._buffers.items()):
                if b is not None and not isinstance(b, FakeCudaTensor):
                    m._buffers[name] = host_tensor(dev, b)
    return module
