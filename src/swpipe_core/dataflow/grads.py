"""Which tasks allocate, make and free the parameters' gradients: two recorded serial iterations.

On CUDA a gradient is *allocated* on the stream of the forward op whose backward
produced it (autograd runs each backward op on its forward op's stream, and
``AccumulateGrad`` keeps that buffer as ``.grad``), whatever stream the task
calling ``backward()`` runs on. Freed (``zero_grad(set_to_none=True)``,
``p.grad = None``) by a task on another stream, it goes back to its allocating
stream's pool at once: that stream's next allocation may reuse the memory while
the freeing stream still reads it (docs/semantics.md, "Lifetimes on CUDA").
:func:`record_grads` runs two serial iterations of the tasks on the CPU, with the
user's state put back afterwards, and says per task whose gradients it allocates
(runs the forward ops of), makes and frees, so a stream map can be checked (and
repaired) before it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Set, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from swpipe_core.plan import PipelinePlan

__all__ = ["GradTraffic", "record_grads"]


@dataclass(frozen=True)
class GradTraffic:
    """What two serial iterations did to the gradients of the state's parameters.

    Parameters
    ----------
    makers : tuple of str
        Tasks that gave a parameter a new ``.grad`` tensor (from ``None``, or a new object), in serial order.
    freers : tuple of str
        Tasks that set a parameter's ``.grad`` from a tensor to ``None``, in serial order.
    frees : dict
        ``{freer: (maker, ...)}``: the tasks that made the gradients each freer frees (a gradient made before
        the iteration counts as made by the task that makes, or else first accumulates into, that parameter's
        gradient in it).
    allocators : dict
        ``{freer: (task, ...)}``: the tasks whose forward ops (a differentiable op that reads the parameter,
        with grad mode on) allocate the gradients each freer frees: on CUDA their backward ops run on those
        tasks' streams, so the gradients live in those streams' pools. A gradient no forward op produced (set
        by hand) counts as allocated by the task that set it.
    """

    makers: Tuple[str, ...] = ()
    freers: Tuple[str, ...] = ()
    frees: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    allocators: Dict[str, Tuple[str, ...]] = field(default_factory=dict)


class _ForwardUses(TorchFunctionMode):
    """Which parameters a task's differentiable ops read (their backward will produce those gradients)."""

    def __init__(self, params: List[torch.Tensor]) -> None:
        super().__init__()
        self._ids = {id(p) for p in params}
        self.task = ""
        self.uses: Dict[int, List[str]] = {}  # id(parameter) -> tasks whose ops read it since its gradient was made

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if torch.is_grad_enabled():
            read = [id(a) for a in tree_flatten((args, kwargs or {}))[0] if id(a) in self._ids]
            if read and any(isinstance(t, torch.Tensor) and t.grad_fn is not None for t in tree_flatten(out)[0]):
                for i in read:
                    tasks = self.uses.setdefault(i, [])
                    if self.task not in tasks:
                        tasks.append(self.task)
        return out


def record_grads(plan: PipelinePlan, batch: Any, state: Any) -> GradTraffic:
    """Run two serial iterations of ``plan``'s tasks on the CPU and record who makes and frees gradients.

    Two, so that a task that frees the gradients at the start of an iteration (``zero_grad`` before the
    forward) is seen freeing those the previous iteration made.

    Parameters
    ----------
    plan : PipelinePlan
        A bound plan (every task has a function); its intra-iteration dependencies give the serial order.
    batch : Any
        The iteration's batch.
    state : modules, optimizers, or a list/dict of them
        What the tasks train: its parameters are watched, and it is put back exactly afterwards
        (:func:`swpipe_core.measure.state.restore_state`).

    Returns
    -------
    GradTraffic

    Raises
    ------
    PipelineTaskError
        A task raised (the state is put back first).

    Examples
    --------
    >>> import torch
    >>> from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
    >>> lin = torch.nn.Linear(2, 1)
    >>> opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    >>> def backward(ctx): lin(ctx.batch).sum().backward()
    >>> def step(ctx): opt.step(); opt.zero_grad(set_to_none=True)
    >>> plan = PipelinePlan({PipelineTask("Backward", backward): TaskSchedule(0),
    ...                      PipelineTask("Step", step): TaskSchedule(1)}, intra_iter_deps=[("Step", "Backward")])
    >>> before = lin.weight.detach().clone()
    >>> traffic = record_grads(plan, torch.ones(4, 2), [lin, opt])
    >>> traffic.makers, traffic.freers, traffic.frees, traffic.allocators
    (('Backward',), ('Step',), {'Step': ('Backward',)}, {'Step': ('Backward',)})
    >>> torch.equal(lin.weight, before), lin.weight.grad is None
    (True, True)
    """
    from swpipe_core.engine.pipeline import SWPipeline
    from swpipe_core.engine.lifetime import state_parameters  # the engine's own reading of "state's parameters"
    from swpipe_core.measure.state import restore_state, snapshot_state

    params = state_parameters(state)
    makers: List[str] = []
    made_by: Dict[int, str] = {}               # id(parameter) -> the task that last made its gradient
    allocated_by: Dict[int, Tuple[str, ...]] = {}  # id(parameter) -> the tasks whose forward ops allocated it
    freed: Dict[str, Set[int]] = {}             # freer -> ids of the parameters whose gradient it freed
    frees: Dict[str, Set[str]] = {}
    wrote: Dict[int, str] = {}                  # id(parameter) -> the first task that accumulated into its gradient
    forward = _ForwardUses(params)
    serial: List[str] = []                      # the tasks in the order they ran

    def watch(run_task: Any, task: Any, ctx: Any) -> None:
        if task.name not in serial:
            serial.append(task.name)
        before = [(p.grad, None if p.grad is None else p.grad._version) for p in params]
        forward.task = task.name
        with forward:
            run_task(task, ctx)
        for p, (old, version) in zip(params, before):
            new = p.grad
            if new is not None and new is not old:
                made_by[id(p)] = task.name
                allocated_by[id(p)] = tuple(forward.uses.pop(id(p), None) or [task.name])
                if task.name not in makers:
                    makers.append(task.name)
            elif new is not None and new._version != version:
                wrote.setdefault(id(p), task.name)
            elif new is None and old is not None:
                freed.setdefault(task.name, set()).add(id(p))
                maker = made_by.get(id(p))
                frees.setdefault(task.name, set()).update([maker] if maker is not None else [])

    snapshot = snapshot_state(state)
    try:
        pipe = SWPipeline(plan, device="cpu")
        with pipe.instrument(watch):
            for _ in range(2):
                pipe.run_one_serial_iter(batch)
    finally:
        restore_state(state, snapshot)
    allocators: Dict[str, Set[str]] = {}
    for task, ids in freed.items():  # a gradient made before the iteration: by whoever makes or accumulates it in one
        frees[task].update(made_by.get(i, wrote.get(i)) for i in ids if i in made_by or i in wrote)
        allocators[task] = {a for i in ids for a in allocated_by.get(i, [wrote[i]] if i in wrote else [])}
    order = {n: k for k, n in enumerate(makers + sorted(set(wrote.values()) - set(makers)))}
    return GradTraffic(makers=tuple(makers), freers=tuple(freed),
                       frees={t: tuple(sorted(m, key=order.__getitem__)) for t, m in frees.items()},
                       allocators={t: tuple(sorted(a, key=serial.index)) for t, a in allocators.items()})
