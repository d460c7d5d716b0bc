"""GPipe: an ``nn.Sequential`` split into partitions on devices, micro-batches through them on swpipe's engine."""

from __future__ import annotations

import numbers
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
from torch import nn

from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.engine.options import Timeouts

from swpipe.gpipe.batchnorm import DeferredBatchNorm
from swpipe.gpipe.errors import GPipeArgumentError, PartitionTimeoutError, StepModeError
from swpipe.gpipe.microbatch import Tensors, batch_size, check, gather, scatter
from swpipe.gpipe.partition import (check_balance, check_checkpoint, check_chunks, check_timeout, resolve_devices,
                                    split_module, verify_module)
from swpipe.gpipe.runtime import Call, MicroBatch, TorchOps
from swpipe.gpipe.schedule import (TASK_KINDS, check_schedule, GPipePlan, bind, forward_plan, placements, step_plan,
                                   task_partition)
from swpipe.gpipe.skip.layout import skip_routes, verify_skippables
from swpipe.gpipe.state import ModuleState

__all__ = ["GPipe"]


class GPipe(nn.Module):
    """An ``nn.Sequential`` trained on GPipe: partitions on devices, micro-batches pipelined through them.

    ``balance[j]`` consecutive layers make partition ``j``, placed on
    ``devices[j]``. ``forward`` splits its input into ``chunks`` micro-batches
    and runs them through the partitions as a :class:`~swpipe_core.plan.PipelinePlan`
    on swpipe's engine: at clock cycle ``k`` partition ``j`` works on
    micro-batch ``k - j``, each partition on a thread of its own (on the CPU)
    or of its device (on CUDA, with compute and copy streams); the output is
    on the last device, and ``loss.backward()`` gives the gradients of the
    module run whole. :meth:`step` runs a whole training step (forward, loss,
    backward) as one plan, by GPipe's schedule or 1F1B's.

    Parameters
    ----------
    module : nn.Sequential
        The model; its layers must be distinct modules sharing no parameter.
    balance : sequence of int
        Layers per partition; sums to ``len(module)``. Find one with
        :func:`swpipe.gpipe.balance.balance_by_time`.
    devices : sequence of devices, optional
        One per partition (``"cpu"``, ``"cuda:1"``, ``torch.device``, an int for
        a CUDA device, or for the CPU on a machine without CUDA, as
        ``SWPipeline``'s ``device=``). Default: every CUDA device. Extra devices
        are ignored.
        (The schedule's plans also run on ``swpipe.testing.FakeCuda`` devices,
        with kernels of the fake: :func:`swpipe.gpipe.schedule.placements`.)
    chunks : int
        Micro-batches per mini-batch (fewer when the batch is smaller).
    checkpoint : {"except_last", "always", "never"}
        Which micro-batches keep only their inputs and recompute their
        activations in backward: all but the last, all, or none. Only in
        training with gradients on.
    deferred_batch_norm : bool
        Replace batch norm layers with :class:`~swpipe.gpipe.batchnorm.DeferredBatchNorm`
        (running statistics over the whole mini-batch).
    schedule : {"GPipe", "1F1B"}
        The schedule of :meth:`step`, spelt as PyTorch's; any case (``"1f1b"``) is taken, and
        ``gpipe.schedule`` reads PyTorch's spelling.
    timeout_s : float
        Seconds a partition may take over one micro-batch (its forward, its
        backward, a copy) and wait for another's; past it the run stops with
        :class:`~swpipe.gpipe.errors.PartitionTimeoutError` naming the
        partition and micro-batch, never hangs. (A task no other task waits
        for, the last partition's forward or the first's backward, is
        watched by the wait for its whole micro-batch, which allows
        ``2 * (clock cycles + 1) * timeout_s``.) The attribute ``timeout_s``
        may be changed between runs.

    Raises
    ------
    GPipeArgumentError
        (``ValueError``) ``balance`` missing, of the wrong sum or with a value < 1;
        ``chunks`` < 1; an unknown ``checkpoint`` or ``schedule``; ``timeout_s``
        not a positive number.
    ModuleTypeError
        (``TypeError``) ``module`` is not an ``nn.Sequential``.
    ModuleStructureError, SkipLayoutError
        Shared children or parameters; skip declarations that do not pair up.
    TooFewDevicesError
        (``IndexError``) fewer devices than partitions.

    Examples
    --------
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> gpipe = GPipe(model, balance=[2, 1], devices=["cpu", "cpu"], chunks=4)
    >>> y = gpipe(torch.randn(16, 4))
    >>> y.shape, len(gpipe), gpipe.balance
    (torch.Size([16, 2]), 3, [2, 1])
    >>> y.sum().backward()
    """

    def __init__(self, module: nn.Sequential, balance: Optional[Iterable[int]] = None, *,
                 devices: Optional[Iterable[Any]] = None, chunks: int = 1, checkpoint: str = "except_last",
                 deferred_batch_norm: bool = False, schedule: str = "GPipe", timeout_s: float = 300.0) -> None:
        super().__init__()
        if balance is None:
            check_balance(module if isinstance(module, nn.Sequential) else nn.Sequential(), None)
        chunks = check_chunks(chunks)
        checkpoint = check_checkpoint(checkpoint)
        timeout_s = check_timeout(timeout_s)
        schedule = check_schedule(schedule)
        verify_module(module)
        verify_skippables(module)
        balance = check_balance(module, balance)
        seam = resolve_devices(devices, len(balance))
        if deferred_batch_norm:
            module = DeferredBatchNorm.convert_deferred_batch_norm(module, chunks)
        self.partitions = split_module(module, balance, seam)
        self.balance: List[int] = balance
        self.devices: List[torch.device] = [d.torch_device for d in seam]
        self.chunks: int = chunks
        self.checkpoint: str = checkpoint
        self.schedule: str = schedule
        self.timeout_s: float = timeout_s
        self._seam = seam
        self._places = placements(seam)
        self._routes = skip_routes(self.partitions)
        cpu_threads = sum(1 for d in seam if not d.is_async)
        self._ops = TorchOps(self.partitions, seam, self._places, self._routes,
                             [not d.is_async and cpu_threads > 1 for d in seam])
        self._pipes: Dict[Tuple[str, int, bool, float], SWPipeline] = {}
        self._state = ModuleState(self.partitions)
        self._last: Optional[SWPipeline] = None
        #: Record a timeline of each task (``timeline``) in the next runs; off by default (the hot path stays lean).
        self.record_timeline = False

    # -- nn.Sequential-like access ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return sum(len(p) for p in self.partitions)

    def __getitem__(self, index: int) -> nn.Module:
        layers = list(self)
        if not -len(layers) <= index < len(layers):
            raise IndexError(f"layer index {index} out of range: the module has {len(layers)} layers")
        return layers[index]

    def __iter__(self) -> Iterator[nn.Module]:
        for partition in self.partitions:
            yield from partition

    # -- no moving after construction --------------------------------------------------------------------------
    def cuda(self, device: Any = None) -> "GPipe":
        raise TypeError("GPipe's partitions stay on the devices given at construction; build a new GPipe with "
                        "other devices=[...] instead of calling .cuda()")

    def cpu(self) -> "GPipe":
        raise TypeError("GPipe's partitions stay on the devices given at construction; build a new GPipe with "
                        "other devices=[...] instead of calling .cpu()")

    def to(self, *args: Any, **kwargs: Any) -> "GPipe":
        if "device" in kwargs or "tensor" in kwargs:
            raise TypeError("GPipe's partitions stay on their devices: .to() may change the dtype only")
        for arg in args:
            if isinstance(arg, (torch.device, torch.Tensor, str)) or (isinstance(arg, numbers.Integral)
                                                                     and not isinstance(arg, bool)):
                raise TypeError("GPipe's partitions stay on their devices: .to() may change the dtype only")
        return super().to(*args, **kwargs)

    # -- the plans -------------------------------------------------------------------------------------------
    @property
    def plan(self) -> GPipePlan:
        """The forward's plan for ``chunks`` micro-batches (``print`` it: the clock cycles)."""
        return forward_plan(self._places, self._routes, self.chunks)

    def training_plan(self, microbatches: Optional[int] = None, schedule: Optional[str] = None) -> GPipePlan:
        """The plan of :meth:`step` for ``microbatches`` (default ``chunks``) by ``schedule`` (default the GPipe's)."""
        return step_plan(self._places, schedule or self.schedule, microbatches or self.chunks, self._routes)

    def _pipe(self, kind: str, microbatches: int) -> SWPipeline:
        timeout_s = check_timeout(self.timeout_s)
        key = (kind, microbatches if kind == "GPipe" else 0, bool(self.record_timeline), timeout_s)
        pipe = self._pipes.get(key)
        if pipe is None:
            plan = (forward_plan(self._places, self._routes, microbatches) if kind == "forward"
                    else step_plan(self._places, kind, microbatches, self._routes))
            device = next((d for d in self._seam if d.is_async), self._seam[0])
            pipe = self._pipes[key] = SWPipeline(bind(plan, self._ops.ops()), device=device,
                                                 timeouts=self._timeouts(plan, timeout_s),
                                                 record_timeline=bool(self.record_timeline))
        return pipe

    @staticmethod
    def _timeouts(plan: GPipePlan, timeout_s: float) -> Timeouts:
        # A task waits timeout_s for one it depends on; the caller waits for the oldest micro-batch, which on a
        # partition's thread follows at most two tasks (a forward, a backward) per clock cycle of the plan. A
        # failed run waits for a blocked thread no longer than it waited for the task.
        cycles = int(plan.pipeline_depth or 1)
        return Timeouts(signal_s=timeout_s, progress_s=2 * (cycles + 1) * timeout_s,
                        join_s=min(timeout_s, Timeouts().join_s))

    @property
    def timeline(self) -> List[Any]:
        """The tasks of the last ``forward`` or :meth:`step` as timeline events (with ``record_timeline = True``).

        ``swpipe.gantt(gpipe.timeline)`` draws them.
        """
        if self._last is None or not self._last.record_timeline:
            raise RuntimeError("no timeline: set gpipe.record_timeline = True before the run")
        return self._last.timeline

    def pipeline(self, kind: str = "forward", microbatches: Optional[int] = None) -> SWPipeline:
        """The engine's pipeline that runs ``kind`` (``"forward"``, ``"GPipe"``, ``"1F1B"``) over ``microbatches``."""
        return self._pipe(kind if kind == "forward" else check_schedule(kind), microbatches or self.chunks)

    # -- running -----------------------------------------------------------------------------------------------
    def _checkpoint_stop(self, m: int) -> int:
        if not (self.training and torch.is_grad_enabled()) or torch.is_inference_mode_enabled():
            return 0
        return {"always": m, "except_last": m - 1, "never": 0}[self.checkpoint]

    def _run(self, pipe: SWPipeline, call: Call) -> None:
        """Run ``call`` on ``pipe``; a failure puts the module's state back (:mod:`swpipe.gpipe.state`) first."""
        self._last = pipe
        saved = self._state.save(gradients=call.step)
        try:
            pipe.run(MicroBatch(call, i) for i in range(len(call.microbatches)))
        except BaseException as err:
            saved.restore()
            if isinstance(err, Exception):
                self._raise(err, call)
            raise
        saved.keep()

    def _raise(self, err: Exception, call: Call) -> None:
        """Raise what a partition raised (a note names where), or name the partition the run stopped waiting for."""
        cause = err.__cause__ if isinstance(err, PipelineTaskError) else None
        if cause is not None and any(cause is raised for raised in call.raised):
            kind, j = task_partition(err.task)
            cause.add_note(f"swpipe.gpipe: raised by the {TASK_KINDS[kind]} of partition {j} ({self.devices[j]}) on "
                           f"micro-batch {err.iteration}; the run stopped there (no clock cycle started after it)")
            raise cause.with_traceback(cause.__traceback__) from None
        if call.active:  # the engine's wait timed out: a task still inside a partition's code is what it waited for
            kind, j, i = next(iter(call.active))
            raise PartitionTimeoutError(j, i, TASK_KINDS[kind], self.devices[j], self.timeout_s) from None

    def _seed(self, microbatches: int) -> int:
        if not any(self._ops.own_draws(j, microbatches) for j in range(len(self.partitions))):
            return 0  # nothing draws from it: the caller's generator advances as the module run whole would
        # drawn from the caller's generator: each call draws anew, torch.manual_seed makes runs repeat
        return int(torch.randint(0, 2 ** 62, (), dtype=torch.int64).item())

    def forward(self, input: Tensors) -> Tensors:  # type: ignore[override]
        """Run ``input`` (a tensor or a tuple of tensors, batch along dimension 0) through the partitions.

        Returns the output of the last partition, on its device, for the
        whole batch. A partition's exception is raised here as it was raised
        (a note names the partition and micro-batch); no micro-batch starts
        after it, and the module's batch norm statistics are as before the
        call (:mod:`swpipe.gpipe.state`). With more than one micro-batch, an
        output whose dimension 0 is not the micro-batch's size raises
        :class:`~swpipe.gpipe.errors.BatchDimensionError`.
        """
        check(input)
        if not self.partitions:
            return input
        microbatches = scatter(input, self.chunks)
        m = len(microbatches)
        call = Call(microbatches, grad=torch.is_grad_enabled(), inference=torch.is_inference_mode_enabled(),
                    checkpoint_stop=self._checkpoint_stop(m), seed=self._seed(m))
        self._run(self._pipe("forward", m), call)
        return gather(call.outputs)

    def step(self, input: Tensors, target: Any, loss_fn: Callable[[Tensors, Any], torch.Tensor], *,
             reduction: str = "mean", meter: Any = None) -> torch.Tensor:
        """One training step as one plan: forward, ``loss_fn``, backward, by the GPipe's ``schedule``.

        Gradients accumulate into the parameters' ``.grad`` (and an input's,
        if it requires them) exactly as ``loss_fn(gpipe(input), target).backward()``
        would give them: each micro-batch's loss is weighted by its share of
        the batch (``reduction="mean"``, for a loss that averages over
        samples) or not (``"sum"``).

        Parameters
        ----------
        input : tensor or tuple of tensors
        target : tensor or tuple of tensors
            Split into micro-batches as ``input``.
        loss_fn : callable
            ``loss_fn(output, target) -> scalar tensor`` for one micro-batch.
        reduction : {"mean", "sum"}
        meter : swpipe.gpipe.memory.ActivationMeter, optional
            Counts the activations the step keeps, per partition (its ``peak``).

        Returns
        -------
        torch.Tensor
            The loss of the whole batch (detached), on the last device.

        Raises
        ------
        StepModeError
            (``RuntimeError``) called under ``torch.no_grad()`` or
            ``torch.inference_mode()``, or with the GPipe in ``eval()`` mode:
            a step computes gradients, so it is refused there (for a loss
            without gradients, ``loss_fn(gpipe(input), target)`` under
            ``torch.no_grad()``; to train with some layers in eval mode, call
            ``.eval()`` on those layers).
        LossFunctionError
            (``ValueError``) ``loss_fn`` returned no scalar tensor that
            depends on the output (a float, an unreduced tensor, a detached one).

        Notes
        -----
        A step that fails (a layer's exception, :class:`~swpipe.gpipe.errors.PartitionTimeoutError`)
        leaves the module as before it: the gradients and the batch norm
        statistics (:mod:`swpipe.gpipe.state`). While the step runs, the
        gradients accumulate from ``None`` and the ones from before are
        added when it succeeds.
        """
        if torch.is_inference_mode_enabled():
            raise StepModeError("inference_mode")
        if not torch.is_grad_enabled():
            raise StepModeError("no_grad")
        if not self.training:
            raise StepModeError("eval")
        check(input)
        check(target, "target")
        if reduction not in ("mean", "sum"):
            raise GPipeArgumentError("reduction", reduction, "not 'mean' or 'sum'",
                                     "'mean' for a loss averaged over samples, 'sum' for one summed over them")
        if not self.partitions:
            raise GPipeArgumentError("module", "nn.Sequential()", "an empty module has nothing to train",
                                     "give a module with layers")
        microbatches, targets = scatter(input, self.chunks), scatter(target, self.chunks)
        if len(targets) != len(microbatches) or batch_size(target) != batch_size(input):
            raise GPipeArgumentError("target", batch_size(target), f"the batch sizes of input ({batch_size(input)}) "
                                     "and target differ", "give one target per sample")
        total = batch_size(input)
        weights = [batch_size(mb) / total if reduction == "mean" else 1.0 for mb in microbatches]
        m = len(microbatches)
        call = Call(microbatches, grad=True, inference=False, checkpoint_stop=self._checkpoint_stop(m),
                    seed=self._seed(m), step=True, targets=targets, loss_fn=loss_fn, weights=weights, meter=meter)
        self._run(self._pipe(check_schedule(self.schedule), m), call)
        losses = call.losses
        return torch.stack(losses).sum() if len(losses) > 1 else losses[0]
