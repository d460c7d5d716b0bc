"""Join the job a launcher describes (``torchrun``, a scheduler) or make a one-rank group; create the workload's groups.

:func:`init_distributed` with no arguments reads the launcher environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
the variables ``torchrun`` sets in every process it starts) and joins that
job through ``env://``: device ``cuda:<LOCAL_RANK>`` with NCCL when CUDA is
available, CPU with gloo otherwise. Only when none of these variables is set
does it fall back to a private one-rank group (a file store, no port). A
half-set environment is an error naming the variables, never a silent
single-rank job: two processes each believing they are "rank 0 of 1" train
side by side and nothing says so.

Every process group the workload creates (the per-channel groups, the
control group used for cross-rank agreement) gets the same timeout as the
default group: ``torch.distributed.new_group`` does not inherit it (its own
default is 30 minutes), so without this a dead peer would hang a rank for
half an hour.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
import torch.distributed as dist

from swpipe_core.distributed import group_timeout
from swpipe_core.engine.device import as_device, cuda_available, cuda_device_count

__all__ = ["DistEnv", "init_distributed", "launcher_env", "group_timeout", "LAUNCHER_VARS", "CHANNELS",
           "DEFAULT_TIMEOUT_S"]

# One process group per issuing task kind (see swpipe.workloads.dlrm's module docstring).
CHANNELS = ("input_lengths", "input_values", "emb_fwd", "emb_bwd", "dense_grad")
# The variables torchrun (and schedulers imitating it) set in every process it starts.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# Long enough for a slow first iteration (lazy init, compilation), short enough that a dead peer
# fails the job in minutes rather than torch's 30-minute default.
DEFAULT_TIMEOUT_S = 300.0

_FIX = ("launch with `torchrun --nproc-per-node N script.py` (it sets all five), set all of "
        "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself, or unset them all for a single process")


@dataclass
class DistEnv:
    """A rank's view of the process group, its per-channel sub-groups and its control group.

    Create with :func:`init_distributed`; ``close()`` destroys the groups if
    this object initialised them. A context manager.

    Attributes
    ----------
    rank, world_size : int
    backend : str
        Of the default group and the channel groups.
    device : torch.device
    groups : dict
        ``{channel: ProcessGroup}`` for every name in ``CHANNELS``.
    owns_default_group : bool
        ``close()`` destroys the default group.
    control : ProcessGroup or None
        A gloo group for exchanges on the caller's thread (agreeing on results,
        plans, costs), never used by a task, so those exchanges cannot
        interleave with the pipeline's collectives.
    timeout : datetime.timedelta
        The timeout of every group above.
    local_rank : int
        The rank on this machine (``LOCAL_RANK`` under a launcher).
    launcher : bool
        True when the job came from a launcher environment.

    Examples
    --------
    >>> with init_distributed() as env:
    ...     env.rank, env.world_size, env.device.type, env.group("input_lengths") is not None, env.launcher
    (0, 1, 'cpu', True, False)
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device
    groups: Dict[str, Any] = field(default_factory=dict)
    owns_default_group: bool = False
    control: Any = None
    timeout: timedelta = timedelta(seconds=DEFAULT_TIMEOUT_S)
    local_rank: int = 0
    launcher: bool = False

    def group(self, channel: str) -> Any:
        """The process group of a channel (see ``CHANNELS``)."""
        try:
            return self.groups[channel]
        except KeyError:
            raise KeyError(f"DistEnv has no channel {channel!r}; channels: {sorted(self.groups)}") from None

    def new_group(self, backend: Optional[str] = None) -> Any:
        """A new group of all ranks with this env's timeout (a collective: every rank must call it).

        Examples
        --------
        >>> with init_distributed(timeout=timedelta(seconds=42)) as env:
        ...     group_timeout(env.new_group("gloo"))
        datetime.timedelta(seconds=42)
        """
        return dist.new_group(list(range(self.world_size)), backend=backend or self.backend, timeout=self.timeout)

    def close(self) -> None:
        """Destroy the process groups if this env created the default group."""
        if self.owns_default_group and dist.is_initialized():
            dist.destroy_process_group()
        self.groups.clear()
        self.control = None
        self.owns_default_group = False

    def __enter__(self) -> "DistEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _int_var(environ: Mapping[str, str], name: str) -> int:
    raw = environ[name]
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"init_distributed: {name}={raw!r} is not an integer; {_FIX}") from None
    if value < 0:
        raise ValueError(f"init_distributed: {name}={value} is negative; {_FIX}")
    return value


def launcher_env(environ: Optional[Mapping[str, str]] = None) -> Optional[Tuple[int, int, int]]:
    """``(rank, world_size, local_rank)`` from a launcher environment, or None when none is set.

    Parameters
    ----------
    environ : mapping, optional
        Defaults to ``os.environ``.

    Returns
    -------
    tuple of int or None
        None when none of ``LAUNCHER_VARS`` is set. ``LOCAL_RANK`` defaults to
        ``RANK`` (one machine) when the launcher does not set it.

    Raises
    ------
    ValueError
        For a half-set environment: ``RANK`` without ``WORLD_SIZE`` (or the
        reverse), ``MASTER_ADDR`` / ``MASTER_PORT`` missing, a non-integer
        value, or ``RANK >= WORLD_SIZE``. The message names the variables and
        how to fix them.

    Examples
    --------
    >>> launcher_env({})
    >>> launcher_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
    ...               "MASTER_PORT": "29500"})
    (1, 2, 1)
    >>> launcher_env({"RANK": "0"})
    Traceback (most recent call last):
    ...
    ValueError: init_distributed: a launcher environment is half set: RANK is set but WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not; ...
    """
    environ = os.environ if environ is None else environ
    present = [v for v in LAUNCHER_VARS if environ.get(v, "") != ""]
    if not present:
        return None
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    missing = [v for v in needed if v not in present]
    if missing:
        raise ValueError(f"init_distributed: a launcher environment is half set: {', '.join(present)} "
                         f"{'is' if len(present) == 1 else 'are'} set but {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} not; {_FIX}")
    rank, world = _int_var(environ, "RANK"), _int_var(environ, "WORLD_SIZE")
    local = _int_var(environ, "LOCAL_RANK") if "LOCAL_RANK" in present else rank
    if world < 1 or rank >= world:
        raise ValueError(f"init_distributed: RANK={rank} with WORLD_SIZE={world}: the rank must be in "
                         f"[0, WORLD_SIZE); {_FIX}")
    return rank, world, local


def _pick_backend(world_size: int, launched: bool) -> str:
    if not (cuda_available() and dist.is_nccl_available()):
        return "gloo"
    # Under a launcher every process owns cuda:<LOCAL_RANK>; spawned ranks need one GPU each here.
    return "nccl" if launched or cuda_device_count() >= world_size else "gloo"


def _check_existing(world_size: int, rank: int, source: str) -> None:
    if dist.get_world_size() != world_size or dist.get_rank() != rank:
        raise ValueError(
            f"init_distributed: a default process group already exists with world size {dist.get_world_size()} "
            f"and rank {dist.get_rank()}, but {source} says world size {world_size}, rank {rank}; destroy it first "
            f"(torch.distributed.destroy_process_group()) or make them agree")


def init_distributed(world_size: Optional[int] = None, rank: Optional[int] = None,
                     init_method: Optional[str] = None, backend: Optional[str] = None,
                     device: Optional[torch.device] = None,
                     timeout: timedelta = timedelta(seconds=DEFAULT_TIMEOUT_S)) -> DistEnv:
    """Join the launcher's job (or create / reuse a group) and create the workload's groups.

    With no ``world_size``/``rank``: a launcher environment (``torchrun``)
    is joined through ``env://``; without one, a private one-rank group is
    made (file store in a fresh temporary directory, no port). With explicit
    ``world_size``/``rank`` the environment is not read (``spawn`` passes
    them with a file ``init_method``). An existing default group is reused
    when it agrees with the launcher environment or the arguments.

    Parameters
    ----------
    world_size, rank : int, optional
        Explicit layout (``init_method`` then needed when ``world_size > 1``).
    init_method : str, optional
        e.g. ``"file:///tmp/x"`` or ``"tcp://127.0.0.1:29500"``; ``env://``
        under a launcher.
    backend : {"gloo", "nccl"}, optional
        Default: NCCL when CUDA is available (and, for explicit layouts, one
        GPU per rank), gloo otherwise.
    device : torch.device, optional
        Default: ``cuda:<LOCAL_RANK>`` with NCCL (``rank % device_count``
        without a launcher), else ``cpu``.
    timeout : datetime.timedelta
        Of the default group (when created here) and of every group created
        here: the channel groups and the control group.

    Returns
    -------
    DistEnv

    Raises
    ------
    ValueError
        A half-set launcher environment (see :func:`launcher_env`); an
        existing default group whose world size or rank disagrees with the
        environment or the arguments; ``world_size > 1`` without an
        ``init_method`` and without a launcher; ``LOCAL_RANK`` beyond the
        visible GPUs with NCCL.

    Examples
    --------
    >>> env = init_distributed()
    >>> env.world_size, env.backend, sorted(env.groups) == sorted(CHANNELS), group_timeout(env.control)
    (1, 'gloo', True, datetime.timedelta(seconds=300))
    >>> env.close()
    """
    launched = None
    local_rank = 0
    if world_size is None and rank is None:
        launched = launcher_env()
    if launched is not None:
        rank, world_size, local_rank = launched
        source = "the launcher environment (RANK, WORLD_SIZE)"
        if init_method is None:
            init_method = "env://"
    else:
        world_size = 1 if world_size is None else world_size
        rank = 0 if rank is None else rank
        local_rank = rank
        source = "the arguments"
    if backend is None:
        backend = _pick_backend(world_size, launched is not None)
    owns = False
    if dist.is_initialized():
        _check_existing(world_size, rank, source)
        backend = dist.get_backend()
    else:
        if init_method is None and world_size != 1:
            raise ValueError("init_distributed: world_size > 1 needs an init_method shared by all ranks "
                             "(launch with torchrun, or use swpipe.workloads.launch.spawn, which makes one)")
        # one rank alone rendezvous with itself: an in-memory store, no file left behind
        where = {"init_method": init_method} if init_method is not None else {"store": dist.HashStore()}
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout, **where)
        owns = True
    if device is None:
        device = _default_device(backend, local_rank, launched is not None)
    if device.type == "cuda":
        as_device(device).set_current()
    ranks = list(range(world_size))
    groups = {name: dist.new_group(ranks, backend=backend, timeout=timeout) for name in CHANNELS}
    control = dist.new_group(ranks, backend="gloo", timeout=timeout)
    return DistEnv(rank, world_size, backend, device, groups, owns, control, timeout, local_rank,
                   launched is not None)


def _default_device(backend: str, local_rank: int, launched: bool) -> torch.device:
    if backend != "nccl":
        return torch.device("cpu")
    count = cuda_device_count()
    if not launched:
        return torch.device("cuda", local_rank % count)
    if local_rank >= count:
        raise ValueError(f"init_distributed: LOCAL_RANK={local_rank} but this machine shows {count} GPU(s); "
                         f"start at most {count} processes per node (torchrun --nproc-per-node {count}) "
                         f"or check CUDA_VISIBLE_DEVICES")
    return torch.device("cuda", local_rank)
