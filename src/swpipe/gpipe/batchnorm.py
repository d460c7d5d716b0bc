"""Deferred batch norm: running statistics over the whole mini-batch, as if it were not split.

Batch norm in training normalises each micro-batch with that micro-batch's
statistics (as torchgpipe does), but a plain ``BatchNorm`` would also update
its running mean and variance once per *micro-batch*, from small samples.
:class:`DeferredBatchNorm` instead sums each micro-batch's moments and
updates the running statistics once per mini-batch, with the statistics of
the whole mini-batch: the running statistics end as those of the module run
whole. A recomputation (checkpointing) counts nothing twice.

Inside :class:`~swpipe.gpipe.GPipe` the update is made when the run (a
``forward``, or a whole ``step``) has succeeded: GPipe calls :meth:`~DeferredBatchNorm.commit`;
a run that fails calls :meth:`~DeferredBatchNorm.discard` instead, so a failed
step leaves the statistics as they were and mixes nothing into the next.
"""

from __future__ import annotations

from typing import Optional, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from swpipe.gpipe.checkpoint import is_recomputing
from swpipe.gpipe.microbatch import current

__all__ = ["DeferredBatchNorm"]

M = TypeVar("M", bound=nn.Module)


class DeferredBatchNorm(_BatchNorm):
    """A batch norm layer whose running statistics are updated once per mini-batch of ``chunks`` micro-batches.

    Inside :class:`~swpipe.gpipe.GPipe` the statistics of the mini-batch's
    micro-batches (a small batch may give fewer than ``chunks``) are
    committed once the run succeeded, and discarded if it failed; alone,
    they are committed after every ``chunks`` calls.

    Parameters
    ----------
    num_features, eps, momentum, affine
        As ``nn.BatchNorm2d``.
    chunks : int
        Micro-batches per mini-batch when used outside GPipe.

    Examples
    --------
    >>> bn, dbn = nn.BatchNorm1d(2), DeferredBatchNorm(2, chunks=2)
    >>> x = torch.arange(8.0).reshape(4, 2)
    >>> _ = bn(x); _ = dbn(x[:2]); _ = dbn(x[2:])
    >>> torch.allclose(bn.running_mean, dbn.running_mean), torch.allclose(bn.running_var, dbn.running_var)
    (True, True)
    """

    sum: torch.Tensor
    sum_squares: torch.Tensor
    counter: int
    tracked: int

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, chunks: int = 1) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats=True)
        self.chunks = chunks
        self.register_buffer("sum", torch.zeros(num_features, dtype=torch.float64), persistent=False)
        self.register_buffer("sum_squares", torch.zeros(num_features, dtype=torch.float64), persistent=False)
        self.counter = 0
        self.tracked = 0

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected an input of at least 2 dimensions (batch, channels, ...), got {input.dim()}")

    def _track(self, input: torch.Tensor) -> None:
        dims = [0, *range(2, input.dim())]
        with torch.no_grad():
            x = input.detach().to(torch.float64)
            self.sum += x.sum(dims)
            self.sum_squares += (x * x).sum(dims)
        self.counter += input.numel() // input.shape[1]
        self.tracked += 1

    def commit(self) -> None:
        """Update the running statistics with the moments tracked since the last commit (if any), then forget them.

        Examples
        --------
        >>> dbn = DeferredBatchNorm(1, momentum=None, chunks=4)
        >>> _ = dbn(torch.tensor([[1.0], [3.0]]))
        >>> int(dbn.num_batches_tracked), dbn.commit(), dbn.running_mean.tolist(), int(dbn.num_batches_tracked)
        (0, None, [2.0], 1)
        """
        if self.tracked == 0:
            return
        with torch.no_grad():
            mean = self.sum / self.counter
            var = self.sum_squares / self.counter - mean * mean
            unbiased = var * (self.counter / max(self.counter - 1, 1))
            self.num_batches_tracked += 1
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
            self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)
        self.discard()

    def discard(self) -> None:
        """Forget the moments tracked since the last commit: the running statistics stay as they are.

        Examples
        --------
        >>> dbn = DeferredBatchNorm(1, chunks=4)
        >>> _ = dbn(torch.tensor([[1.0], [3.0]]))
        >>> dbn.tracked, dbn.discard(), dbn.tracked, dbn.running_mean.tolist()
        (1, None, 0, [0.0])
        """
        with torch.no_grad():
            self.sum.zero_()
            self.sum_squares.zero_()
        self.counter = 0
        self.tracked = 0

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        if not is_recomputing():
            self._track(input)
            if current() is None and self.tracked >= self.chunks:  # inside GPipe, GPipe commits after the run
                self.commit()
        return F.batch_norm(input, None, None, self.weight, self.bias, True, 0.0, self.eps)

    @classmethod
    def convert_deferred_batch_norm(cls, module: M, chunks: int = 1) -> M:
        """``module`` with every batch norm that tracks running statistics made a :class:`DeferredBatchNorm`.

        A ``DeferredBatchNorm`` of the same ``chunks`` is kept as is; parameters
        and buffers are carried over.
        """
        if isinstance(module, DeferredBatchNorm) and module.chunks == chunks:
            return cast(M, module)
        converted: nn.Module = module
        if isinstance(module, _BatchNorm) and module.track_running_stats:
            converted = cls(module.num_features, module.eps, module.momentum, module.affine, chunks)
            converted.to(module.running_mean.device)
            if module.affine:
                converted.register_parameter("weight", module.weight)
                converted.register_parameter("bias", module.bias)
            converted.register_buffer("running_mean", module.running_mean)
            converted.register_buffer("running_var", module.running_var)
            converted.register_buffer("num_batches_tracked", module.num_batches_tracked)
            converted.train(module.training)
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_deferred_batch_norm(child, chunks))
        return cast(M, converted)
