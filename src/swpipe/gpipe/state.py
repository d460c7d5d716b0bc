"""What one GPipe run changes in the module: kept when the run succeeds, put back when it fails.

A run (a ``forward``, or a whole ``step``) changes three kinds of module
state, micro-batch by micro-batch; a run that fails part-way would leave
some micro-batches' share in place, and every later run would mix it in:

* :class:`~swpipe.gpipe.batchnorm.DeferredBatchNorm`'s moments: committed
  to the running statistics only when the run succeeded, discarded when it
  failed (and before each run: what a thread stopped by a timeout added
  after its run failed is not counted in the next);
* a plain batch norm's running statistics, updated once per micro-batch:
  copied before the run, copied back when it fails;
* in a step, the parameters' gradients: the step accumulates into ``.grad``
  from ``None``; when it succeeds each gradient from before is added back
  (the same tensor, ``+=``), when it fails the gradients from before are
  put back as they were. No copy of the gradients is made.

Other state a layer changes in place (a buffer of its own, an attribute) is
not put back.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from swpipe.gpipe.batchnorm import DeferredBatchNorm

__all__ = ["RunState"]


class RunState:
    """The module's state a run may change, saved when the run starts (:meth:`keep` or :meth:`restore` after it).

    Parameters
    ----------
    module : nn.Module
        The partitions.
    gradients : bool
        Whether the run accumulates gradients (a step).

    Examples
    --------
    >>> layer = nn.Linear(1, 1)
    >>> layer.weight.grad = torch.ones(1, 1)
    >>> saved = RunState(layer, gradients=True)
    >>> layer.weight.grad is None
    True
    >>> layer.weight.grad = torch.full((1, 1), 5.0)   # what a failed step left
    >>> saved.restore(); layer.weight.grad.tolist()
    [[1.0]]
    """

    def __init__(self, module: nn.Module, gradients: bool) -> None:
        self.deferred: List[DeferredBatchNorm] = []
        self.copies: List[Tuple[torch.Tensor, torch.Tensor]] = []
        # on the caller's thread, with inference mode off: the copies are ordinary tensors whatever the caller's mode
        with torch.inference_mode(False), torch.no_grad():
            for m in module.modules():
                if isinstance(m, DeferredBatchNorm):
                    m.discard()
                    self.deferred.append(m)
                elif isinstance(m, _BatchNorm) and m.track_running_stats and m.training:
                    self.copies += [(t, t.clone()) for t in (m.running_mean, m.running_var, m.num_batches_tracked)
                                    if t is not None]
        self.grads: List[Tuple[nn.Parameter, Optional[torch.Tensor]]] = []
        if gradients:
            self.grads = [(p, p.grad) for p in module.parameters() if p.requires_grad]
            for p, _ in self.grads:
                p.grad = None

    def keep(self) -> None:
        """The run succeeded: commit the deferred statistics; add the gradients from before to the run's."""
        for m in self.deferred:
            m.commit()
        with torch.no_grad():
            for p, before in self.grads:
                if before is not None and p.grad is not None:
                    p.grad = before.add_(p.grad)
                elif before is not None:
                    p.grad = before

    def restore(self) -> None:
        """The run failed: the module's state as before it."""
        for m in self.deferred:
            m.discard()
        with torch.inference_mode(False), torch.no_grad():
            for t, copy in self.copies:
                t.copy_(copy)
        for p, before in self.grads:
            p.grad = before
