"""AdaptiveGPipe: a GPipe whose balance and chunks are chosen again between steps when the measured step drifts.

Each :meth:`AdaptiveGPipe.step`'s time goes through :class:`~swpipe.replan.watch.PeriodWatch` (the re-planning
rules). On drift the layers' costs are measured again (default: :func:`profiled_layers`, a copy of the layers
profiled on one micro-batch of the last input, so the training state is not touched), the balance of each chunk
count allowed is the optimum of the layers' times (:func:`~swpipe.gpipe.predict.choose`:
:func:`~swpipe.gpipe.balance.optimal_balance`, the dynamic programme of ``balance_by_time``) and each is predicted
(:func:`~swpipe.gpipe.predict.predict_step`); when the fastest beats the running configuration by more than the
noise (:func:`~swpipe.replan.rules.swap_worth_it`), a new :class:`~swpipe.gpipe.GPipe` is built from the same layer
objects on the same devices before the next step. The parameters stay the same tensors (an optimizer built on them
keeps working) and the math is the same: a step's gradients are the whole batch's whatever the balance and chunks.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import OrderedDict
from typing import Any, Callable, List, Optional, Sequence

import torch
from torch import nn

from swpipe.gpipe.batchnorm import DeferredBatchNorm
from swpipe.gpipe.gpipe import GPipe
from swpipe.gpipe.microbatch import Tensors, batch_size, scatter
from swpipe.gpipe.predict import LayerModel, choose, predict_step
from swpipe.replan.log import SwitchDecision
from swpipe.replan.options import ReplanOptions
from swpipe.replan.rules import swap_worth_it
from swpipe.replan.watch import PeriodWatch
from swpipe_core.engine.options import OptionError

__all__ = ["AdaptiveGPipe", "profiled_layers", "gpipe_label"]

_log = logging.getLogger(__name__)

LayerCosts = Callable[[GPipe, Tensors], LayerModel]


def gpipe_label(balance: Sequence[int], chunks: int) -> str:
    """How a decision names a configuration: ``"balance [3, 2] chunks 4"``."""
    return f"balance {list(balance)} chunks {chunks}"


def profiled_layers(gpipe: GPipe, sample: Tensors, timeout: float = 0.5) -> LayerModel:
    """The layers' costs now: a copy of ``gpipe``'s layers profiled on ``sample`` (one micro-batch).

    The copy has no gradients (``profile_layers`` refuses parameters that have some) and runs where the layers
    are; the GPipe's own parameters, gradients and statistics are not touched.

    Examples
    --------
    >>> gpipe = GPipe(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), balance=[1, 1], devices=["cpu", "cpu"])
    >>> len(profiled_layers(gpipe, torch.randn(2, 4), timeout=0.05))
    2
    """
    from swpipe.gpipe.balance import profile_layers

    layers = copy.deepcopy(_layers(gpipe))
    for p in layers.parameters():
        p.grad = None
    return LayerModel.fit([profile_layers(layers, sample, timeout=timeout)])


def _layers(gpipe: GPipe) -> nn.Sequential:
    """The GPipe's layer objects, with their names, as one ``nn.Sequential`` (no copy)."""
    return nn.Sequential(OrderedDict((name, m) for part in gpipe.partitions for name, m in part.named_children()))


class AdaptiveGPipe:
    """A :class:`~swpipe.gpipe.GPipe` trained step by step whose balance and chunks follow the machine.

    Parameters
    ----------
    gpipe : GPipe
        The GPipe to start with; its devices, checkpoint mode, schedule and timeout are kept.
    chunks : sequence of int, optional
        The chunk counts it may switch to (default: ``gpipe.chunks`` only: the balance alone is chosen).
    replan : ReplanOptions or None
        When to choose again (``warmup``, ``window``, ``patience``, ``min_noise``, ``spread_k``;
        ``constraints.max_memory_bytes`` caps the predicted activation bytes); ``None``: never.
    layer_costs : callable, optional
        ``layer_costs(gpipe, sample) -> LayerModel``: the layers' costs now (default :func:`profiled_layers`).
    clock : callable, optional
        Seconds around each step (default ``time.perf_counter``); tests script it.

    Attributes
    ----------
    gpipe : GPipe
        The GPipe running now (a new object after a switch, over the same layers).
    decisions : list of SwitchDecision
    steps : int

    Raises
    ------
    OptionError
        ``replan`` is not a ``ReplanOptions``, or several chunk counts with deferred batch norm (its statistics are
        kept per chunk count).

    Examples
    --------
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    >>> adaptive = AdaptiveGPipe(GPipe(model, balance=[2, 1], devices=["cpu", "cpu"], chunks=2), chunks=[2, 4])
    >>> loss = adaptive.step(torch.randn(8, 4), torch.randn(8, 2), nn.functional.mse_loss)
    >>> adaptive.gpipe.balance, adaptive.decisions
    ([2, 1], [])
    """

    def __init__(self, gpipe: GPipe, *, chunks: Optional[Sequence[int]] = None,
                 replan: Optional[ReplanOptions] = ReplanOptions(), layer_costs: Optional[LayerCosts] = None,
                 clock: Optional[Callable[[], float]] = None) -> None:
        if replan is not None and not isinstance(replan, ReplanOptions):
            raise OptionError("AdaptiveGPipe", "replan", replan, expected="a ReplanOptions or None")
        counts = sorted(set(chunks)) if chunks is not None else [gpipe.chunks]
        if len(counts) > 1 and any(isinstance(m, DeferredBatchNorm) for m in gpipe.modules()):
            raise OptionError("AdaptiveGPipe", "chunks", counts, expected=f"[{gpipe.chunks}] with deferred batch norm",
                              fix="deferred batch norm keeps its statistics per chunk count: allow one count")
        self.gpipe, self.chunk_counts, self.replan = gpipe, counts, replan
        self._layer_costs = layer_costs if layer_costs is not None else profiled_layers
        self._clock = clock if clock is not None else time.perf_counter
        self._watch = PeriodWatch(replan if replan is not None else ReplanOptions())
        self.decisions: List[SwitchDecision] = []
        self.steps = 0

    def __call__(self, input: Tensors) -> Tensors:
        """The running GPipe's forward."""
        return self.gpipe(input)

    def parameters(self) -> Any:
        """The layers' parameters (the same tensors across switches)."""
        return self.gpipe.parameters()

    @property
    def swaps(self) -> List[SwitchDecision]:
        """The decisions that switched, in order."""
        return [d for d in self.decisions if d.swapped]

    @property
    def reference_s(self) -> Optional[float]:
        """The step time the running configuration is watched against (``None`` until its baseline is measured)."""
        return self._watch.reference_s

    def step(self, input: Tensors, target: Any, loss_fn: Callable[[Tensors, Any], torch.Tensor], *,
             reduction: str = "mean", meter: Any = None) -> torch.Tensor:
        """:meth:`GPipe.step <swpipe.gpipe.GPipe.step>` on the running GPipe, then the check and, on drift, the
        choice (the next step runs the new GPipe)."""
        t0 = self._clock()
        loss = self.gpipe.step(input, target, loss_fn, reduction=reduction, meter=meter)
        elapsed = self._clock() - t0
        if self.replan is not None:
            said = self._watch.add(elapsed)
            if said == "baseline" and self.decisions:
                self.decisions[-1].measured_after(self._watch.reference_s)
            elif said == "drift":
                self._decide(self.steps, input)
        self.steps += 1
        return loss

    def _decide(self, idx: int, input: Tensors) -> None:
        g, watch, opts = self.gpipe, self._watch, self.replan
        layers = self._layer_costs(g, scatter(input, g.chunks)[0])
        batch = batch_size(input)
        cap = opts.constraints.max_memory_bytes if opts.constraints is not None else None
        best, candidates = choose(layers, len(g.balance), batch, cap, chunks=self.chunk_counts,
                                  checkpoints=[g.checkpoint], schedules=[g.schedule])
        now = predict_step(layers, g.balance, batch, g.chunks, g.checkpoint, g.schedule)
        best = best if best is not None else now
        running, chosen = gpipe_label(g.balance, g.chunks), gpipe_label(best.balance, best.chunks)
        worth = chosen != running and swap_worth_it(now.step_s, best.step_s, watch.noise)
        predicted = {gpipe_label(p.balance, p.chunks): float(p.step_s) for p in candidates}
        predicted[running] = float(now.step_s)
        decision = SwitchDecision(
            step=idx, reference_s=watch.reference_s, measured_s=watch.last_s, noise=watch.noise, costs=layers,
            predicted=predicted, running=running, chosen=chosen, predicted_old_s=float(now.step_s),
            predicted_new_s=float(best.step_s), swapped=worth, starts_at=idx + 1 if worth else None,
            choice=(list(best.balance), best.chunks))
        self.decisions.append(decision)
        _log.info("re-planning: %s", decision)
        if worth:
            self.gpipe = self._rebuilt(list(best.balance), best.chunks)
            self._watch = PeriodWatch(opts)
        else:
            watch.rebase(decision.measured_s)

    def _rebuilt(self, balance: List[int], chunks: int) -> GPipe:
        """A GPipe over the same layer objects on the same devices, by ``balance`` and ``chunks``."""
        g = self.gpipe
        new = GPipe(_layers(g), balance, devices=g.devices, chunks=chunks, checkpoint=g.checkpoint,
                    schedule=g.schedule, timeout_s=g.timeout_s)
        new.train(g.training)
        new.record_timeline = g.record_timeline
        return new
