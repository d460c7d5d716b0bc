"""Random numbers in a pipeline: which ops draw from torch's default generators, and per-task generators.

torch's default generators (one for the CPU, one per CUDA device) are state
that every task drawing random numbers changes: dropout in Forward, random
masking in an augmentation task. Serially the draws come in one order;
pipelined, tasks of different iterations on different threads draw in an
order the plan does not fix, so the same plan gives other numbers than the
serial loop. Two ways out:

* order the tasks that draw (``swpipe_core.dataflow`` records each draw as a
  write of the generator, so ``check_dataflow`` names the missing order and
  strict mode raises on it);
* give each task its own generator: ``SWPipeline(plan, rng="per_task")``.
  Every random op a task runs then draws from a generator of that task and
  iteration alone, seeded from the seed the user set (``torch.initial_seed()``
  when the pipeline is made), on pipelined and serial runs alike, so a
  pipelined run equals its serial run bit for bit whatever the thread
  timing. It watches every op through a dispatch mode (a debugging and
  reproducibility mode: it costs a few microseconds per op).

:func:`default_generator_draw` is the one place that says which ops draw
from a default generator (torch tags them ``nondeterministic_seeded``) and
from which device's.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any, Dict, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from swpipe_core.engine.device import as_device

__all__ = ["default_generator_draw", "PerTaskRng"]

# torch's default generators are one per process and device: a swap of their state is made under one lock
_SWAP = threading.Lock()


def _device_of(args: Any, kwargs: Dict[str, Any]) -> str:
    device = kwargs.get("device")
    if device is not None:
        return str(torch.device(device))
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            return str(value.device)
    return "cpu"


def default_generator_draw(func: Any, args: Any, kwargs: Dict[str, Any]) -> Optional[str]:
    """The device whose default generator the op ``func(*args, **kwargs)`` draws from, or ``None``.

    An op draws when torch tags it ``nondeterministic_seeded`` and it is not
    given a generator of its own.

    Examples
    --------
    >>> default_generator_draw(torch.ops.aten.randn.default, ([2],), {"device": torch.device("cpu")})
    'cpu'
    >>> g = torch.Generator()
    >>> default_generator_draw(torch.ops.aten.randn.generator, ([2],), {"generator": g}) is None
    True
    >>> default_generator_draw(torch.ops.aten.add.Tensor, (torch.ones(1), torch.ones(1)), {}) is None
    True
    """
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return None
    generator = kwargs.get("generator")
    if generator is None:
        for arg, value in zip(func._schema.arguments, args):
            if arg.name == "generator":
                generator = value
    return None if generator is not None else _device_of(args, kwargs)


def _default_generator(device: str) -> torch.Generator:
    dev = torch.device(device)
    if dev.type == "cpu":
        return torch.default_generator
    return as_device(dev).default_generator()


class _OwnGenerators(TorchDispatchMode):
    """While a task runs on this thread: each random op draws from the task's own generator state."""

    def __init__(self, states: Dict[str, torch.Tensor], seed_of: Any) -> None:
        super().__init__()
        self._states = states
        self._seed_of = seed_of

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105 - the dispatcher hook
        kwargs = kwargs or {}
        device = default_generator_draw(func, args, kwargs)
        if device is None:
            return func(*args, **kwargs)
        default = _default_generator(device)
        with _SWAP:  # the op draws from the default generator, set to this task's state for the op alone
            state = self._states.get(device)
            if state is None:
                state = torch.Generator(device=device).manual_seed(self._seed_of(device)).get_state()
            saved = default.get_state()
            default.set_state(state)
            try:
                return func(*args, **kwargs)
            finally:
                self._states[device] = default.get_state()
                default.set_state(saved)


class PerTaskRng:
    """Per-task generators for one pipeline: task ``T`` of iteration ``i`` draws from its own stream.

    Parameters
    ----------
    seed : int
        The user's seed; each (task, iteration, device) gets a seed derived
        from it (a hash, so neighbouring iterations share no state).

    Examples
    --------
    The same task and iteration draw the same numbers, whatever ran before:

    >>> rng = PerTaskRng(seed=7)
    >>> with rng.scope("Augment", 3):
    ...     a = torch.rand(2)
    >>> _ = torch.rand(5)  # other draws in between
    >>> with rng.scope("Augment", 3):
    ...     b = torch.rand(2)
    >>> bool((a == b).all())
    True
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def seed_for(self, task: str, iteration: int, device: str) -> int:
        """The seed of ``task``'s generator on ``device`` in ``iteration``."""
        digest = hashlib.sha256(f"{self.seed}/{task}/{iteration}/{device}".encode()).digest()
        return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)

    def scope(self, task: str, iteration: int) -> _OwnGenerators:
        """The context in which one execution of ``task`` on ``iteration`` runs (on the task's thread)."""
        return _OwnGenerators({}, lambda device: self.seed_for(task, iteration, device))
