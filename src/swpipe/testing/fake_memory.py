"""The fake device's memory: blocks of host bytes behind FakeTensor handles, and CUDA's caching allocator.

A block freed on the host (the last reference to its :class:`FakeTensor`
dropped) goes back at once to the pool of the stream that allocated it; the
next allocation of that size on that stream gets it and queues a *poison*
kernel there that overwrites it, as CUDA's caching allocator reuses memory.
A missing wait or an early free then gives wrong numbers.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Hashable, List, Set, Tuple

import torch

from swpipe_core.engine.device import Device

from swpipe.testing.fake_streams import FakeStream


__all__ = ["FakeTensor"]

_BLOCK_ROUND = 512  # bytes: the caching allocator's size rounding


class _Block:
    """Bytes of fake device memory, allocated from one stream's pool."""

    __slots__ = ("id", "raw", "stream", "owner", "record_streams", "free_clocks")

    def __init__(self, block_id: int, nbytes: int, stream: FakeStream) -> None:
        self.id = block_id
        self.raw = torch.zeros(nbytes, dtype=torch.uint8)
        self.stream = stream
        self.owner = ""
        self.record_streams: Set[FakeStream] = set()
        self.free_clocks: List[Any] = []  # tokens of record_stream streams at the free (reuse waits for them)


class FakeTensor:
    """A 1-D array in fake device memory; freed (back to its stream's pool) when the last reference goes.

    Hold the values only through kernels (:class:`FakeKernels`); ``is_cuda`` is
    true so code that looks for device tensors finds it.
    """

    __slots__ = ("device", "numel", "dtype", "_block", "__weakref__")

    is_cuda = True

    def __init__(self, device: Device, block: _Block, numel: int, dtype: torch.dtype) -> None:
        self.device, self.numel, self.dtype, self._block = device, numel, dtype, block

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def _view(self) -> torch.Tensor:
        return self._block.raw[:self.nbytes].view(self.dtype)

    def __swpipe_clone__(self) -> "FakeTensor":
        """A copy on the calling thread's current stream (what a shortcut caches, as ``Tensor.clone``)."""
        kernels = self.device.kernels
        return kernels.copy_(kernels.empty(self.numel, self.dtype), self)

    def record_stream(self, stream: FakeStream) -> None:
        """As ``Tensor.record_stream``: on free, the block is reused only after ``stream``'s work so far."""
        self._block.record_streams.add(stream)

    def __repr__(self) -> str:
        return f"FakeTensor(numel={self.numel}, dtype={self.dtype}, block=#{self._block.id})"

    def __del__(self) -> None:
        try:
            self.device._allocator.free(self._block)
        except Exception:  # interpreter shutdown, or a closed fake: nothing to give back to
            pass


class _Allocator:
    """CUDA's caching allocator, as far as reuse goes: per stream and size, a freed block is reused at once."""

    def __init__(self, device: Device) -> None:
        self._dev = device
        self._free: Dict[Tuple[Hashable, int], List[_Block]] = {}
        self._ids = device.fake._block_ids  # unique across the fake's devices: the race check keys blocks by id
        self.allocated = 0
        self.freed = 0

    def alloc(self, numel: int, dtype: torch.dtype, stream: FakeStream, label: str) -> FakeTensor:
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        return FakeTensor(self._dev, self.block(nbytes, stream, label), numel, dtype)

    def block(self, nbytes: int, stream: FakeStream, label: str) -> _Block:
        """A block of at least ``nbytes`` from ``stream``'s pool: a freed one of its size (poisoned there), else new."""
        size = max(_BLOCK_ROUND, -(-nbytes // _BLOCK_ROUND) * _BLOCK_ROUND)
        fake = self._dev.fake
        with fake._lock:
            pool = self._free.get((stream.key, size))
            block = None
            if pool:
                for k, candidate in enumerate(pool):  # record_stream: reused once those streams reached the free
                    if all(token.done for token in candidate.free_clocks):
                        block = pool.pop(k)
                        break
            self.allocated += size
        if block is None:
            block = _Block(next(self._ids), size, stream)
        else:
            raw = block.raw
            self._dev._launch(stream, lambda: raw.fill_(0xFF), f"{label} [reuses the block]", writes=(block,))
        block.owner, block.record_streams, block.free_clocks = label, set(), []
        return block

    def free(self, block: _Block) -> None:
        dev = self._dev
        fake = dev.fake
        if fake._closed:
            return
        tokens = [dev._record_token(s) for s in block.record_streams] if block.record_streams else []
        label = fake._label()
        stamp = fake.hb.free_stamp(fake._host(), block.stream.key, [t.clock for t in tokens], label,
                                   threading.current_thread().name)
        fake.hb.access(block.id, stamp, "free", dev._block_name(block))
        size = block.raw.numel()
        with fake._lock:
            block.free_clocks = tokens
            self._free.setdefault((block.stream.key, size), []).append(block)
            self.freed += size
