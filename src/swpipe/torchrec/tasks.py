"""The task functions of swpipe's TorchRec plans, over a user's TorchRec model and optimizer.

One function per task name of :mod:`swpipe_core.pipelines`, each doing what
TorchRec's ``progress()`` does at that point, with TorchRec's own machinery
(:class:`~swpipe.torchrec._private.Toolbox`):

==================  ===================================================================
task                does (TorchRec's call)
==================  ===================================================================
``H2D``             ``batch.to(device, non_blocking=True)`` and the batch's TorchRec context
``InputDistStart``  ``start_sparse_data_dist`` (the first one rewrites the model: FX, pipelined forwards)
``InputDistWait``   ``wait_sparse_data_dist``
``EmbLookup``       each sharded module's lookup and output all-to-all (``start_embedding_lookup``)
``ZeroGrad``        ``optimizer.zero_grad()`` (training batches)
``WaitBatch``       nothing: the engine's dependency and stream waits are the synchronisation
``Forward``         the model's forward (pipelined forwards pointed at the batch's context)
``Backward``        ``torch.sum(losses, dim=0).backward()`` (training batches)
``EmbBackward``     semi-sync: the embeddings' own backward (``embedding_backward``)
``OptimizerStep``   ``optimizer.step()`` (training batches)
==================  ===================================================================

Train or eval is decided per batch: :attr:`TorchRecTasks.modes` holds the
mode of each iteration the pipeline registered (the model's mode when the
``progress`` call that returns that batch began); a batch with none takes the
model's mode when its forward runs. In eval, ``Forward`` runs under
``torch.no_grad()`` and the backward tasks, the optimizer step and
``zero_grad`` do nothing, as TorchRec's pipelines skip them when
``model.training`` is false.

Which of these issue a collective on a sharded model is said once,
:data:`COLLECTIVE_TASKS`: on several ranks those tasks are globally ordered.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional

import torch

from swpipe_core.plan import IterContext

from swpipe.torchrec._private import Toolbox

__all__ = ["TorchRecTasks", "TASK_NAMES", "COLLECTIVE_TASKS", "MODE_TASKS", "toolbox_kind", "split_output"]

TASK_NAMES = ("H2D", "InputDistStart", "InputDistWait", "EmbLookup", "ZeroGrad", "WaitBatch", "Forward", "Backward",
              "EmbBackward", "OptimizerStep")

#: tasks that issue a collective on a sharded model: the input all-to-alls, the output all-to-all (in the lookup,
#: or in the forward's pipelined modules; DDP's forward with ``broadcast_buffers``), the backward's all-to-all and
#: all-reduce
COLLECTIVE_TASKS = frozenset({"InputDistStart", "InputDistWait", "EmbLookup", "Forward", "Backward", "EmbBackward"})

#: tasks whose work depends on train/eval: they must run in the period of the batch's ``progress`` call
MODE_TASKS = ("Forward", "Backward", "EmbBackward", "OptimizerStep")


def toolbox_kind(names: Any) -> Optional[str]:
    """Which TorchRec machinery a plan over these task names needs (``None``: the model as it is).

    Examples
    --------
    >>> toolbox_kind(["H2D", "Forward"]), toolbox_kind(["InputDistStart", "Forward"])
    (None, 'sparse_dist')
    >>> toolbox_kind(["InputDistStart", "EmbLookup"]), toolbox_kind(["EmbLookup", "EmbBackward"])
    ('fused', 'semi_sync')
    """
    names = set(names)
    if "EmbBackward" in names:
        return "semi_sync"
    if "EmbLookup" in names:
        return "fused"
    if "InputDistStart" in names or "InputDistWait" in names:
        return "sparse_dist"
    return None


def split_output(result: Any) -> Any:
    """The output TorchRec's pipelines return for a model's result: ``output`` of ``(losses, output)``.

    A model that returns something else in eval (TorchRec's ``TestSparseNN``
    returns its prediction alone) has that returned as it is.

    Examples
    --------
    >>> split_output((1.0, "out")), split_output("pred")
    ('out', 'pred')
    """
    if isinstance(result, tuple) and len(result) == 2:
        return result[1]
    return result


class TorchRecTasks:
    """Task functions over one TorchRec model, for plans over :data:`TASK_NAMES`.

    Parameters
    ----------
    model : torch.nn.Module
        Usually ``DistributedModelParallel``; its forward takes the batch and
        returns ``(losses, output)`` in training.
    optimizer : torch.optim.Optimizer
        Its ``zero_grad`` and ``step`` (TorchRec's ``CombinedOptimizer`` included).
    device : torch.device
        Where the batches go.
    kind : {None, "sparse_dist", "fused", "semi_sync"}
        The TorchRec machinery (:func:`toolbox_kind`); ``None`` runs the model as it is (``base``).
    custom_model_fwd : callable, optional
        TorchRec's ``custom_model_fwd``: called instead of the model, returns ``(losses, output)``.

    Attributes
    ----------
    modes : dict
        ``{iteration: training?}`` registered by the pipeline.
    outputs : dict
        ``{iteration: output}`` of the forwards run while :attr:`keep_outputs` is true.
    keep_outputs : bool
    """

    def __init__(self, model: torch.nn.Module, optimizer: Any, device: torch.device, kind: Optional[str],
                 custom_model_fwd: Optional[Callable[[Any], Any]] = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self.kind = kind
        self.toolbox = Toolbox(kind, model, optimizer, device) if kind is not None else None
        self.forward_fn = custom_model_fwd
        self.modes: Dict[int, bool] = {}
        self.outputs: Dict[int, Any] = {}
        self.keep_outputs = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ modes and outputs

    def training(self, iteration: int) -> bool:
        """The iteration's mode: registered, else the model's now."""
        mode = self.modes.get(iteration)
        return self.model.training if mode is None else mode

    def take_output(self, iteration: int) -> Any:
        """Remove and return the output of ``iteration`` (KeyError when its forward has not run)."""
        with self._lock:
            return self.outputs.pop(iteration)

    def reset(self) -> None:
        """Forget the modes and outputs of a pass (a new pass numbers its iterations from 0 again)."""
        with self._lock:
            self.modes.clear()
            self.outputs.clear()

    def functions(self, names: Any) -> Dict[str, Callable[[IterContext], None]]:
        """``{name: fn(ctx)}`` for the given task names.

        Raises
        ------
        ValueError
            A name is not one of :data:`TASK_NAMES`, or needs machinery this object was not built with.
        """
        names = list(names)
        unknown = [n for n in names if n not in TASK_NAMES]
        if unknown:
            raise ValueError(f"swpipe.torchrec has no task function for {unknown}; a plan for a TorchRec model may use "
                             f"{', '.join(TASK_NAMES)}")
        need = toolbox_kind(names)
        fns = {n: getattr(self, n) for n in names}
        if need is None and self.kind is not None and "H2D" in fns:
            fns["H2D"] = self._h2d_own_forward  # a plan of the model's own forward, on a model rewritten before
        elif need != self.kind:
            raise ValueError(f"tasks {names} need TorchRec's {need or 'plain'} machinery, these were built for "
                             f"{self.kind or 'plain'}")
        return fns

    # ------------------------------------------------------------------------------ tasks

    def H2D(self, ctx: IterContext) -> None:
        ctx.dev = ctx.batch.to(device=self.device, non_blocking=True)
        if self.toolbox is not None:
            ctx.tr = self.toolbox.new_context(ctx.iter_idx)

    def _h2d_own_forward(self, ctx: IterContext) -> None:
        """H2D of a plan without input-dist tasks (``base``): the sharded modules get their own forward back first
        (they may have run pipelined in an earlier run: ``plan="auto"`` measures both kinds on one model)."""
        if self.toolbox.rewritten:
            self.toolbox.detach()
        self.H2D(ctx)

    def InputDistStart(self, ctx: IterContext) -> None:
        self.toolbox.start_input_dist(ctx.dev, ctx.tr)

    def InputDistWait(self, ctx: IterContext) -> None:
        self.toolbox.wait_input_dist(ctx.tr)

    def EmbLookup(self, ctx: IterContext) -> None:
        self.toolbox.start_embedding_lookup(ctx.tr)

    def ZeroGrad(self, ctx: IterContext) -> None:
        # a batch whose mode is not known yet is zeroed: harmless in eval, needed in training
        if self.modes.get(ctx.iter_idx, True):
            self.optimizer.zero_grad()

    def WaitBatch(self, ctx: IterContext) -> None:
        return None

    def Forward(self, ctx: IterContext) -> None:
        if self.toolbox is not None:
            self.toolbox.set_context(ctx.tr)
        fn = self.forward_fn or self.model
        if self.training(ctx.iter_idx):
            ctx.losses, output = fn(ctx.dev)
        else:
            with torch.no_grad():
                output = split_output(fn(ctx.dev))
        if self.keep_outputs:
            with self._lock:
                self.outputs[ctx.iter_idx] = output

    def Backward(self, ctx: IterContext) -> None:
        if self.training(ctx.iter_idx):
            torch.sum(ctx.losses, dim=0).backward()
            del ctx.losses

    def EmbBackward(self, ctx: IterContext) -> None:
        if self.training(ctx.iter_idx):
            self.toolbox.embedding_backward(ctx.tr)

    def OptimizerStep(self, ctx: IterContext) -> None:
        if self.training(ctx.iter_idx):
            self.optimizer.step()
