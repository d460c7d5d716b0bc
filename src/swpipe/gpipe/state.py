"""What one GPipe run changes in the module: kept when the run succeeds, put back when it fails.

A run (a ``forward``, or a whole ``step``) changes three kinds of module
state, micro-batch by micro-batch; a run that fails part-way would leave
some micro-batches' share in place, and every later run would mix it in:

* :class:`~swpipe.gpipe.batchnorm.DeferredBatchNorm`'s moments: committed
  to the running statistics only when the run succeeded, discarded when it
  failed (and before each run: what a thread stopped by a timeout added
  after its run failed is not counted in the next);
* a plain batch norm's running statistics, updated once per micro-batch:
  copied before the run (one concatenated copy per device and dtype),
  copied back when it fails;
* in a step, the parameters' gradients: a gradient from before the step is
  set aside and the step accumulates from ``None``; when it succeeds the
  one set aside is added (the same tensor, ``+=``), when it fails every
  gradient is put back as it was. No copy of the gradients is made.

Other state a layer changes in place (a buffer of its own, an attribute) is
not put back. The modules and parameters are found once, when the GPipe is
made (its partitions are fixed then).
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from swpipe.gpipe.batchnorm import DeferredBatchNorm

__all__ = ["ModuleState", "SavedState"]


class SavedState:
    """The state one run may change, saved when it started: keep() after success, restore() after failure."""

    def __init__(self, deferred: List[DeferredBatchNorm], stats: List[torch.Tensor],
                 params: List[nn.Parameter], gradients: bool) -> None:
        self.deferred = deferred
        for m in deferred:
            if m.tracked:
                m.discard()
        # plain batch norm statistics: one concatenated copy per (device, dtype), on the caller's thread with
        # inference mode off, so the copy is an ordinary tensor whatever the caller's mode
        self.groups: Dict[Tuple[torch.device, torch.dtype], Tuple[List[torch.Tensor], torch.Tensor]] = {}
        if stats:
            by: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
            for t in stats:
                by.setdefault((t.device, t.dtype), []).append(t)
            with torch.inference_mode(False), torch.no_grad():
                self.groups = {key: (ts, torch.cat([t.reshape(-1) for t in ts])) for key, ts in by.items()}
        self.params = params if gradients else []
        self.aside: List[Tuple[nn.Parameter, torch.Tensor]] = []
        for p in self.params:
            if p.grad is not None:
                self.aside.append((p, p.grad))
                p.grad = None

    def keep(self) -> None:
        """The run succeeded: commit the deferred statistics; add the gradients set aside to the run's."""
        for m in self.deferred:
            m.commit()
        with torch.no_grad():
            for p, before in self.aside:
                p.grad = before if p.grad is None else before.add_(p.grad)

    def restore(self) -> None:
        """The run failed: the module's state as before it."""
        for m in self.deferred:
            m.discard()
        with torch.inference_mode(False), torch.no_grad():
            for ts, flat in self.groups.values():
                for t, old in zip(ts, flat.split([t.numel() for t in ts])):
                    t.copy_(old.view_as(t))
        for p in self.params:
            p.grad = None
        for p, before in self.aside:
            p.grad = before


class ModuleState:
    """The batch norm layers and parameters of ``module`` whose state a run changes; :meth:`save` before each run.

    Parameters
    ----------
    module : nn.Module
        The partitions.

    Examples
    --------
    >>> layer = nn.Linear(1, 1)
    >>> layer.weight.grad = torch.ones(1, 1)
    >>> saved = ModuleState(layer).save(gradients=True)
    >>> layer.weight.grad is None                      # set aside: the step accumulates from None
    True
    >>> layer.weight.grad = torch.full((1, 1), 5.0)    # what a failed step left
    >>> saved.restore(); layer.weight.grad.tolist()
    [[1.0]]
    """

    def __init__(self, module: nn.Module) -> None:
        modules = list(module.modules())
        self.deferred = [m for m in modules if isinstance(m, DeferredBatchNorm)]
        self.plain = [m for m in modules if isinstance(m, _BatchNorm) and not isinstance(m, DeferredBatchNorm)
                      and m.track_running_stats]
        self.params = list(module.parameters())

    def save(self, gradients: bool) -> SavedState:
        """The state a run may change, saved now; ``gradients``: the run accumulates them (a step)."""
        stats = [t for m in self.plain if m.training
                 for t in (m.running_mean, m.running_var, m.num_batches_tracked) if t is not None]
        params: List[nn.Parameter] = [p for p in self.params if p.requires_grad] if gradients else []
        return SavedState(self.deferred, stats, params, gradients)
