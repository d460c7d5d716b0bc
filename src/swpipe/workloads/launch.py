"""Run a function on every rank of a fresh loopback process group (``torch.multiprocessing`` spawn).

``spawn(fn, world_size, *args)`` starts ``world_size`` processes, each joins a
gloo (or NCCL) group through a file store in a fresh temporary directory,
calls ``fn(env, *args)`` with its :class:`~swpipe.workloads.distenv.DistEnv`, and
returns the per-rank results (which must be picklable by ``torch.save``).
A failure on any rank raises in the caller with that rank's traceback.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.multiprocessing as mp

from swpipe.workloads.distenv import DistEnv, init_distributed

__all__ = ["spawn", "rank_info"]


def rank_info(env: DistEnv) -> Tuple[int, int, str]:
    """``(rank, world_size, backend)`` of a rank: the smallest function worth spawning.

    Examples
    --------
    >>> from swpipe.workloads.dlrm import init_distributed
    >>> env = init_distributed(); rank_info(env); env.close()
    (0, 1, 'gloo')
    """
    return env.rank, env.world_size, env.backend


def _entry(rank: int, fn: Callable[..., Any], world_size: int, workdir: str, backend: Optional[str],
           num_threads: Optional[int], args: tuple) -> None:
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    env = init_distributed(world_size, rank, init_method="file://" + os.path.join(workdir, "store"),
                           backend=backend)
    try:
        result = fn(env, *args)
        torch.save(result, os.path.join(workdir, f"result{rank}.pt"))
    finally:
        env.close()


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, backend: Optional[str] = None,
          num_threads: Optional[int] = 1, timeout: float = 300.0) -> List[Any]:
    """Call ``fn(env, *args)`` on ``world_size`` spawned ranks and return their results by rank.

    Parameters
    ----------
    fn : callable
        A module-level function (spawned processes import it by name).
    world_size : int
    *args
        Passed after ``env``; must be picklable.
    backend : {"gloo", "nccl"}, optional
    num_threads : int or None
        ``torch.set_num_threads`` in each rank (default 1: ranks share the cores).
    timeout : float
        Seconds to wait for all ranks before raising ``TimeoutError``.

    Returns
    -------
    list
        ``[result of rank 0, result of rank 1, ...]``.

    Raises
    ------
    ValueError
        If ``world_size < 1``.
    torch.multiprocessing.ProcessRaisedException
        If a rank raised (carries its traceback).
    TimeoutError
        If the ranks did not finish in ``timeout`` seconds (they are terminated).

    Examples
    --------
    >>> spawn(rank_info, 2, backend="gloo")
    [(0, 2, 'gloo'), (1, 2, 'gloo')]
    """
    if world_size < 1:
        raise ValueError(f"spawn: world_size must be >= 1, got {world_size}")
    workdir = tempfile.mkdtemp(prefix="swpipe-spawn-")
    try:
        ctx = mp.start_processes(_entry, args=(fn, world_size, workdir, backend, num_threads, args),
                                 nprocs=world_size, join=False, start_method="spawn")
        import time
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.terminate()
                raise TimeoutError(f"spawn: {world_size} ranks of {getattr(fn, '__name__', fn)} did not finish "
                                   f"within {timeout:.0f} s (a collective mismatch between ranks hangs gloo)")
        return [torch.load(os.path.join(workdir, f"result{r}.pt"), weights_only=False) for r in range(world_size)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
