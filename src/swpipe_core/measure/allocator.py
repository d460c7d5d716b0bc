"""The host allocator's share of a task's cost on CPU: keep glibc's malloc from giving freed memory back each step.

On Linux with glibc, ``malloc`` maps a block above its mmap threshold (128 KiB
at start, raised as such blocks are freed, up to 32 MiB) for that one
allocation and unmaps it when it is freed, and it gives the top of its heaps
back to the system above its trim threshold. A training step on CPU allocates
and frees the same large activations and gradients every iteration, so every
iteration faults those pages in again. How many depends on the allocation
history: on the DLRM demo workload a serial iteration took about 1000 minor
page faults early in a process and about 250 later, a pipelined iteration of
the same tasks 30-180 (they free and allocate in another order), and the
faults cost 2-3 ms of a 7-10 ms iteration. A task's cost measured in serial
iterations then misstates the same task in the pipelined run, by more than the
simulator's other errors.

:func:`keep_freed_memory` fixes both thresholds high, so freed blocks stay in
the process for the next iteration, as the CUDA caching allocator keeps device
memory and as jemalloc or tcmalloc (the usual ``LD_PRELOAD`` for PyTorch on
CPU) do. The cost: the process keeps its peak heap resident. It is a setting of
the whole process; nothing in swpipe calls it implicitly (``swpipe demo`` and
the CPU benchmarks do, at their start).
"""

from __future__ import annotations

import ctypes
import platform
import resource

__all__ = ["keep_freed_memory", "minor_faults"]

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
_INT_MAX = 2**31 - 1  # mallopt takes an int


def keep_freed_memory(threshold_bytes: int = 1 << 30) -> bool:
    """Keep freed blocks up to ``threshold_bytes`` in the process instead of giving them back (glibc only).

    Sets glibc's mmap and trim thresholds (``mallopt``), which also stops
    glibc from adjusting them as blocks are freed.

    Parameters
    ----------
    threshold_bytes : int
        Blocks up to this size come from the heap and stay there when freed,
        and the heap is given back only when more than this much is free at
        its top (default 1 GiB).

    Returns
    -------
    bool
        ``True`` if set; ``False`` where the C library is not glibc (macOS,
        musl: nothing is changed).

    Raises
    ------
    ValueError
        If ``threshold_bytes`` is not in ``[0, 2**31 - 1]`` (``mallopt`` takes an int).

    Examples
    --------
    ``keep_freed_memory()`` at the start of a CPU training script; a threshold
    ``mallopt`` cannot take is refused before anything changes:

    >>> keep_freed_memory(2**40)
    Traceback (most recent call last):
    ...
    ValueError: threshold_bytes must be in [0, 2147483647] (mallopt takes a C int), got 1099511627776
    """
    if not 0 <= threshold_bytes <= _INT_MAX:
        raise ValueError(f"threshold_bytes must be in [0, {_INT_MAX}] (mallopt takes a C int), got {threshold_bytes}")
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold_bytes)) and bool(mallopt(_M_TRIM_THRESHOLD, threshold_bytes))


def minor_faults() -> int:
    """Minor page faults this process has taken so far (``getrusage``): difference two calls to count a step's.

    Examples
    --------
    >>> import mmap
    >>> fresh = mmap.mmap(-1, 1 << 22)  # 4 MiB the process never touched
    >>> before = minor_faults()
    >>> for page in range(0, len(fresh), mmap.PAGESIZE):
    ...     fresh[page] = 1
    >>> minor_faults() > before
    True
    """
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
