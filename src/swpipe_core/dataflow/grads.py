"""Which tasks make the parameters' gradients and which free them: one recorded serial iteration.

On CUDA a gradient freed (``zero_grad(set_to_none=True)``, ``p.grad = None``) by a
task on one stream, when another stream's backward allocated it, goes back to
that other stream's pool at once: its next backward may reuse the memory while
the freeing stream still reads it (docs/semantics.md, "Lifetimes on CUDA").
:func:`record_grads` runs two serial iterations of the tasks on the CPU, with the
user's state put back afterwards, and says per task whose gradients it makes
and frees, so a stream map can be checked (and repaired) before it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Set, Tuple

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
        gradient in it: in the steady state that task allocates it).
    """

    makers: Tuple[str, ...] = ()
    freers: Tuple[str, ...] = ()
    frees: Dict[str, Tuple[str, ...]] = field(default_factory=dict)


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
    >>> traffic.makers, traffic.freers, traffic.frees
    (('Backward',), ('Step',), {'Step': ('Backward',)})
    >>> torch.equal(lin.weight, before), lin.weight.grad is None
    (True, True)
    """
    from swpipe_core.engine.pipeline import SWPipeline
    from swpipe_core.engine.lifetime import state_parameters  # the engine's own reading of "state's parameters"
    from swpipe_core.measure.state import restore_state, snapshot_state

    params = state_parameters(state)
    makers: List[str] = []
    made_by: Dict[int, str] = {}               # id(parameter) -> the task that last made its gradient
    freed: Dict[str, Set[int]] = {}             # freer -> ids of the parameters whose gradient it freed
    frees: Dict[str, Set[str]] = {}
    wrote: Dict[int, str] = {}                  # id(parameter) -> the first task that accumulated into its gradient

    def watch(run_task: Any, task: Any, ctx: Any) -> None:
        before = [(p.grad, None if p.grad is None else p.grad._version) for p in params]
        run_task(task, ctx)
        for p, (old, version) in zip(params, before):
            new = p.grad
            if new is not None and new is not old:
                made_by[id(p)] = task.name
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
    for task, ids in freed.items():  # a gradient made before the iteration: by whoever makes or accumulates it in one
        frees[task].update(made_by.get(i, wrote.get(i)) for i in ids if i in made_by or i in wrote)
    order = {n: k for k, n in enumerate(makers + sorted(set(wrote.values()) - set(makers)))}
    return GradTraffic(makers=tuple(makers), freers=tuple(freed),
                       frees={t: tuple(sorted(m, key=order.__getitem__)) for t, m in frees.items()})
