"""Live tensor bytes on the CPU: what torch ops allocate and what is still alive, with its peak.

torch's CPU build has no allocator statistics (``torch.cuda.memory_stats`` is CUDA's). This
module counts, under a ``TorchDispatchMode`` on the calling thread, every tensor storage an
op creates (an output whose storage no input of the op shares: views and in-place results
are not new bytes) and drops it when the storage is freed (a ``weakref.finalize`` on it).
``live_bytes`` is then the bytes of storages created since :class:`LiveTensorBytes` was
entered and still alive; ``peak_bytes`` its most. Storages made before (weights, the
pipeline stage's preallocated receive buffers, gradients zeroed in place) are not counted,
nor are allocations outside torch ops (gloo's internal buffers, Python objects). On a GPU,
``torch.cuda.max_memory_allocated`` measures the same thing at the allocator.

The mode costs a Python call per op: measure memory in a run of its own, not a timed one.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, Optional

__all__ = ["LiveTensorBytes"]


class LiveTensorBytes:
    """Count live tensor bytes created by torch ops on this thread while entered.

    Examples
    --------
    >>> import torch
    >>> with LiveTensorBytes() as mem:
    ...     a = torch.ones(256)          # 1024 bytes
    ...     b = a.view(16, 16)           # a view: no new bytes
    ...     c = torch.ones(512)          # 2048 bytes
    ...     del c
    >>> mem.live_bytes, mem.peak_bytes
    (1024, 3072)
    """

    def __init__(self) -> None:
        self.live_bytes = 0
        self.peak_bytes = 0
        self._sizes: Dict[int, int] = {}
        self._lock = threading.Lock()
        self._mode: Optional[Any] = None

    def reset_peak(self) -> int:
        """Start a new peak at the bytes live now; returns them."""
        with self._lock:
            self.peak_bytes = self.live_bytes
            return self.live_bytes

    def _add(self, storage: Any) -> None:
        key = storage.data_ptr()
        if not key:
            return
        with self._lock:
            if key in self._sizes:
                return
            n = storage.nbytes()
            self._sizes[key] = n
            self.live_bytes += n
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        with self._lock:
            self.live_bytes -= self._sizes.pop(key, 0)

    def __enter__(self) -> "LiveTensorBytes":
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                          if isinstance(t, torch.Tensor)}
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                        storage = t.untyped_storage()
                        if storage.data_ptr() not in inputs:
                            counter._add(storage)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._mode is not None
        self._mode.__exit__(*exc)
        self._mode = None
