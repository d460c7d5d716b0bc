"""The DLRM workload's task functions, by task name, for every pipeline of :mod:`swpipe_core.pipelines`.

A task function takes the iteration's :class:`~swpipe_core.plan.IterContext`
and passes results to later tasks through it (``ctx.dev``, ``ctx.idist``,
``ctx.shard``, ``ctx.emb``, ``ctx.loss``). The functions are generic over the
plan: a task consumes what an earlier task of the same plan produced and does
itself only the steps whose task the plan does not have (in ``base`` the
Forward runs the input all-to-all and the lookup inline, as an unpipelined
model does). A step whose task *is* in the plan but has not run yet is a
missing dependency and raises an error that says which.

==================  ===================================================================
task                does
==================  ===================================================================
``LoadBatch``       check the batch from the data iterator (PT2's ``next(dataloader)``)
``H2D``             host batch -> device with dtype casts (``ctx.dev``)
``InputTransform``  PT2: the sparse input all-to-all and dedup, outside the compiled graph
``InputDistStart``  phase 1 of the input all-to-all: lengths (async; ``ctx.idist``)
``InputDistWait``   wait phase 1, start phase 2: ids (async)
``EmbPrefetch``     wait phase 2 and dedup ids per table: the lookup plan (``ctx.shard``)
``EmbLookup``       gather rows, pool, output all-to-all (``ctx.emb``)
``ZeroGrad``        dense ``zero_grad(set_to_none=True)``
``WaitBatch``       a synchronisation point only: the engine's stream waits do the work
``Forward``         dense forward + loss; records ``workload.losses[i]`` (or eval outputs)
``Backward``        backward, dense all-reduce, fused embedding SGD (dense only in semi-sync)
``EmbBackward``     semi-sync: embedding backward + fused embedding SGD
``OptimizerStep``   dense optimizer step
``TrainStep``       zero_grad + forward + backward + step in one task (the ``staged`` plan)
==================  ===================================================================

Which of them issue a collective is said in one place, :func:`collective_tasks`
(it depends on the plan: ``Forward`` runs the lookup's all-to-all itself only
when the plan has no ``EmbLookup``). :func:`plan_for` marks those tasks
``globally_ordered`` when the workload runs on more than one rank, so every
rank issues its collectives, on all communicators together, in one order
(:func:`with_collectives_ordered`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch

from swpipe_core.plan import IterContext, PipelinePlan

from swpipe.workloads.dlrm import DLRMWorkload
from swpipe.workloads.dlrm_data import Batch

__all__ = ["task_fns", "fns_for", "plan_for", "collective_tasks", "with_collectives_ordered", "STAGED_STAGES",
           "TASK_NAMES", "EVAL_PIPELINES"]

_log = logging.getLogger(__name__)

TASK_NAMES = ("LoadBatch", "H2D", "InputTransform", "InputDistStart", "InputDistWait", "EmbPrefetch",
              "EmbLookup", "ZeroGrad", "WaitBatch", "Forward", "Backward", "EmbBackward", "OptimizerStep",
              "TrainStep")
STAGED_STAGES = ("H2D", "InputDistStart", "InputDistWait", "TrainStep")
EVAL_PIPELINES = ("eval_sparse_dist", "eval_fused_sparse_dist")
TaskFn = Callable[[IterContext], None]

# Which task functions below issue a collective (the one place that says so; tests/test_collective_order.py
# checks it against the collectives each task of every TorchRec plan really issues). These always do:
_COLLECTIVE_ALWAYS = frozenset({
    "InputTransform",  # both input all-to-alls (lengths, ids)
    "InputDistStart",  # the lengths all-to-all
    "InputDistWait",   # the ids all-to-all (phase 2)
    "EmbLookup",       # the pooled embeddings' all-to-all
    "Backward",        # the pooled gradients' all-to-all (not in semi-sync) and the dense all-reduce
    "EmbBackward",     # the pooled gradients' all-to-all
    "TrainStep",       # everything of one step
})
# These do the step of the named task themselves when the plan lacks that task (see _Tasks._emb, EmbPrefetch):
_COLLECTIVE_UNLESS = {
    "Forward": "EmbLookup",          # the lookup (and the input dist, when the plan has none) inside Forward
    "EmbPrefetch": "InputDistWait",  # phase 2 of the input dist
}


def _missing(task: str, needs: str, iter_idx: int) -> RuntimeError:
    return RuntimeError(
        f"{task}({iter_idx}) found no result of {needs}({iter_idx}): the plan has {needs} but {task} does not "
        f"wait for it; add the intra-iteration dependency ({task!r}, {needs!r}) or a chain that implies it")


class _Tasks:
    """The closures of one workload bound to one plan's task set."""

    def __init__(self, wl: DLRMWorkload, names: Iterable[str], train: bool, compile_backend: Optional[str],
                 compile_on_iter: int, compiled_autograd: Optional[str]) -> None:
        self.wl = wl
        self.names = set(names)
        self.train = train
        self.semi_sync = "EmbBackward" in self.names
        self.compile_backend = compile_backend
        self.compile_on_iter = compile_on_iter
        self.compiled_autograd = compiled_autograd
        self._compiled: Optional[Callable[..., Any]] = None
        self._compile_failed = False
        self._ca_failed = False

    # -------------------------------------------------------------- helpers

    def _dev(self, ctx: IterContext, task: str) -> Batch:
        if hasattr(ctx, "dev"):
            return ctx.dev
        if "H2D" in self.names:
            raise _missing(task, "H2D", ctx.iter_idx)
        ctx.dev = self.wl.h2d(ctx.batch)
        return ctx.dev

    def _shard(self, ctx: IterContext, task: str):
        if hasattr(ctx, "shard"):
            return ctx.shard
        for producer in ("EmbPrefetch", "InputTransform"):
            if producer in self.names:
                raise _missing(task, producer, ctx.iter_idx)
        if not hasattr(ctx, "idist"):
            if "InputDistStart" in self.names:
                raise _missing(task, "InputDistStart", ctx.iter_idx)
            ctx.idist = self.wl.input_dist_start(self._dev(ctx, task).sparse)
        if ctx.idist.values_work is None:
            if "InputDistWait" in self.names:
                raise _missing(task, "InputDistWait", ctx.iter_idx)
            self.wl.input_dist_wait(ctx.idist)
        ctx.shard = self.wl.input_dist_finish(ctx.idist)
        del ctx.idist
        return ctx.shard

    def _emb(self, ctx: IterContext, task: str):
        if hasattr(ctx, "emb"):
            return ctx.emb
        if "EmbLookup" in self.names:
            raise _missing(task, "EmbLookup", ctx.iter_idx)
        ctx.emb = self.wl.lookup(self._shard(ctx, task), train=self.train)
        return ctx.emb

    def _dense_fn(self, iter_idx: int) -> Callable[..., Any]:
        if self.compile_backend is None or self._compile_failed or iter_idx < self.compile_on_iter - 1:
            return self.wl.model.dense_arch
        if self._compiled is None:
            self._compiled = torch.compile(self.wl.model.dense_arch, backend=self.compile_backend, dynamic=False)
        return self._compiled

    def _run_dense(self, ctx: IterContext, pooled: torch.Tensor):
        dev = self._dev(ctx, "Forward")
        fn = self._dense_fn(ctx.iter_idx)
        self.wl.dense_fn = fn
        try:
            return self.wl.dense_forward(dev, pooled)
        except Exception as exc:  # noqa: BLE001 - any compile failure falls back to eager, loudly
            if fn is self.wl.model.dense_arch:
                raise
            self._compile_failed = True
            warnings.warn(f"torch.compile(backend={self.compile_backend!r}) failed on this machine "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                          "the PT2 plan runs eager", RuntimeWarning, stacklevel=2)
            self.wl.dense_fn = self.wl.model.dense_arch
            return self.wl.dense_forward(dev, pooled)

    def _autograd_ctx(self, iter_idx: int):
        # TorchRec enables compiled autograd from the second iteration on.
        if self.compiled_autograd is None or self._ca_failed or iter_idx < 1:
            return contextlib.nullcontext()
        from torch._dynamo import compiled_autograd
        backend = self.compiled_autograd
        return compiled_autograd._enable(lambda gm: torch.compile(gm, backend=backend, fullgraph=False))

    def _backward(self, tensors: Any, grads: Any, iter_idx: int) -> None:
        try:
            with self._autograd_ctx(iter_idx):
                torch.autograd.backward(tensors, grads)
        except Exception as exc:  # noqa: BLE001 - compiled autograd is optional, fall back loudly
            if self.compiled_autograd is None or self._ca_failed or iter_idx < 1:
                raise
            self._ca_failed = True
            warnings.warn(f"compiled autograd (backend={self.compiled_autograd!r}) failed on this machine "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                          "backward runs eager", RuntimeWarning, stacklevel=2)
            torch.autograd.backward(tensors, grads)

    # ---------------------------------------------------------------- tasks

    def LoadBatch(self, ctx: IterContext) -> None:
        if not isinstance(ctx.batch, Batch):
            raise TypeError(f"LoadBatch({ctx.iter_idx}): the data iterator must yield swpipe.workloads.Batch, "
                            f"got {type(ctx.batch).__name__}")

    def H2D(self, ctx: IterContext) -> None:
        ctx.dev = self.wl.h2d(ctx.batch)

    def InputTransform(self, ctx: IterContext) -> None:
        ctx.shard = self.wl.dedup(self.wl.input_dist(self._dev(ctx, "InputTransform").sparse))

    def InputDistStart(self, ctx: IterContext) -> None:
        ctx.idist = self.wl.input_dist_start(self._dev(ctx, "InputDistStart").sparse)

    def InputDistWait(self, ctx: IterContext) -> None:
        if not hasattr(ctx, "idist"):
            raise _missing("InputDistWait", "InputDistStart", ctx.iter_idx)
        self.wl.input_dist_wait(ctx.idist)

    def EmbPrefetch(self, ctx: IterContext) -> None:
        if not hasattr(ctx, "idist"):
            raise _missing("EmbPrefetch", "InputDistStart", ctx.iter_idx)
        if ctx.idist.values_work is None:
            if "InputDistWait" in self.names:
                raise _missing("EmbPrefetch", "InputDistWait", ctx.iter_idx)
            self.wl.input_dist_wait(ctx.idist)
        ctx.shard = self.wl.dedup(self.wl.input_dist_finish(ctx.idist))
        del ctx.idist

    def EmbLookup(self, ctx: IterContext) -> None:
        with torch.set_grad_enabled(self.train):
            ctx.emb = self.wl.lookup(self._shard(ctx, "EmbLookup"), train=self.train)

    def ZeroGrad(self, ctx: IterContext) -> None:
        self.wl.zero_grad()

    def WaitBatch(self, ctx: IterContext) -> None:
        # The wait *is* the task's dependencies: the engine makes this task's stream wait the device
        # events of its dependencies on other streams. Memory is the engine's too, for what it can see: on
        # CUDA every value a task deletes or replaces in ctx (the early ``del ctx.idist`` / ``del ctx.emb``
        # here), every device tensor nested in ctx and the gradients of SWPipeline(state=wl.state) are kept
        # alive until the device events of all that iteration's tasks have completed, so TorchRec's
        # record_stream is not needed for those. A tensor handed between tasks outside ctx would need
        # ctx.keep_alive (docs/semantics.md, "Lifetimes on CUDA"); these tasks hand everything through ctx.
        # (In fused_sparse_dist WaitBatch depends only on ZeroGrad, so it must not touch the batch.)
        return None

    def Forward(self, ctx: IterContext) -> None:
        if not self.train:
            with torch.no_grad():
                self.wl.model.eval()
                emb = self._emb(ctx, "Forward")
                _, logits = self._run_dense(ctx, emb.pooled)
                self.wl.record_output(ctx.iter_idx, logits)
            del ctx.emb
            return
        emb = self._emb(ctx, "Forward")
        pooled = emb.pooled
        if self.semi_sync:
            # dense forward on a detached copy: Backward stops here, EmbBackward continues from it
            ctx.pooled_leaf = pooled.detach().requires_grad_(True)
            pooled = ctx.pooled_leaf
        loss, _ = self._run_dense(ctx, pooled)
        self.wl.record_loss(ctx.iter_idx, loss)
        ctx.loss = loss

    def Backward(self, ctx: IterContext) -> None:
        if not hasattr(ctx, "loss"):
            raise _missing("Backward", "Forward", ctx.iter_idx)
        self._backward(self.wl.scaled(ctx.loss), None, ctx.iter_idx)
        del ctx.loss
        self.wl.sync_dense_grads()
        if not self.semi_sync:
            self.wl.emb_update(ctx.emb)
            del ctx.emb

    def EmbBackward(self, ctx: IterContext) -> None:
        if not hasattr(ctx, "pooled_leaf") or ctx.pooled_leaf.grad is None:
            raise _missing("EmbBackward", "Backward", ctx.iter_idx)
        self._backward(ctx.emb.pooled, ctx.pooled_leaf.grad, ctx.iter_idx)
        self.wl.emb_update(ctx.emb)
        del ctx.emb, ctx.pooled_leaf

    def OptimizerStep(self, ctx: IterContext) -> None:
        self.wl.step()

    def TrainStep(self, ctx: IterContext) -> None:
        self.ZeroGrad(ctx)
        self.Forward(ctx)
        self.Backward(ctx)
        self.OptimizerStep(ctx)


def task_fns(workload: DLRMWorkload, names: Iterable[str], train: bool = True, *,
             compile_backend: Optional[str] = None, compile_on_iter: int = 3,
             compiled_autograd: Optional[str] = None) -> Dict[str, TaskFn]:
    """Task functions for the given task names (any plan over the standard names).

    Parameters
    ----------
    workload : DLRMWorkload
    names : iterable of str
        The plan's task names; each must be one of ``TASK_NAMES``.
    train : bool
        ``False`` for inference (Forward under ``no_grad`` records predictions).
    compile_backend : str, optional
        ``torch.compile`` backend for the dense arch from iteration
        ``compile_on_iter - 1`` on (PT2); a failure warns and runs eager.
    compiled_autograd : str, optional
        Backend of ``torch._dynamo.compiled_autograd`` around backward from
        iteration 1 on; a failure warns and runs eager.

    Returns
    -------
    dict
        ``{name: fn(ctx)}``.

    Raises
    ------
    ValueError
        For a name that is not a task of this workload.

    Examples
    --------
    >>> from swpipe.workloads.dlrm import DLRMConfig, init_distributed
    >>> env = init_distributed()
    >>> wl = DLRMWorkload(DLRMConfig.preset("test"), env)
    >>> sorted(task_fns(wl, ["H2D", "Forward"]))
    ['Forward', 'H2D']
    >>> task_fns(wl, ["Fwd"])
    Traceback (most recent call last):
    ...
    ValueError: the DLRM workload has no task 'Fwd'; its tasks: LoadBatch, H2D, InputTransform, InputDistStart, InputDistWait, EmbPrefetch, EmbLookup, ZeroGrad, WaitBatch, Forward, Backward, EmbBackward, OptimizerStep, TrainStep
    >>> env.close()
    """
    names = list(names)
    for n in names:
        if n not in TASK_NAMES:
            raise ValueError(f"the DLRM workload has no task {n!r}; its tasks: {', '.join(TASK_NAMES)}")
    tasks = _Tasks(workload, names, train, compile_backend, compile_on_iter, compiled_autograd)
    return {n: getattr(tasks, n) for n in names}


def collective_tasks(names: Iterable[str]) -> List[str]:
    """The tasks, of a plan over ``names``, whose functions issue a collective on this workload.

    ``H2D``, ``LoadBatch``, ``ZeroGrad``, ``WaitBatch`` and ``OptimizerStep``
    never do; the input-distribution tasks, ``EmbLookup``, ``Backward``,
    ``EmbBackward``, ``InputTransform`` and ``TrainStep`` always do;
    ``Forward`` does when the plan has no ``EmbLookup`` (it looks the
    embeddings up itself) and ``EmbPrefetch`` when it has no
    ``InputDistWait``.

    Parameters
    ----------
    names : iterable of str
        The plan's task names (all of them: whether a task issues a
        collective depends on which other tasks the plan has).

    Returns
    -------
    list of str
        In the order of ``names``.

    Examples
    --------
    >>> collective_tasks(["H2D", "InputDistStart", "InputDistWait", "Forward", "Backward", "OptimizerStep"])
    ['InputDistStart', 'InputDistWait', 'Forward', 'Backward']
    >>> collective_tasks(["H2D", "InputDistStart", "InputDistWait", "EmbLookup", "Forward"])
    ['InputDistStart', 'InputDistWait', 'EmbLookup']
    """
    names = list(names)
    present = set(names)
    return [n for n in names
            if n in _COLLECTIVE_ALWAYS or (n in _COLLECTIVE_UNLESS and _COLLECTIVE_UNLESS[n] not in present)]


def with_collectives_ordered(plan: PipelinePlan) -> PipelinePlan:
    """``plan`` with every task that issues a collective (:func:`collective_tasks`) marked ``globally_ordered``.

    The engine's sequencer then hands those tasks their turns in the plan's
    enqueue order on every rank, whichever thread runs them, so every rank
    issues its collectives in the same order *across* communicators. Each
    channel (``swpipe.workloads.distenv.CHANNELS``) being used by one task
    kind keeps the order within a communicator, which is all gloo needs; NCCL
    documents that ranks issuing operations on several communicators in
    different orders may deadlock (their kernels wait for each other on the
    device), which one thread group per stream otherwise makes
    rank-dependent. The price: two ordered tasks never run their host parts
    at the same time, and each waits for the ones enqueued before it. The
    other tasks, the stages, streams, thread groups, dependencies and the
    enqueue order are kept.

    Parameters
    ----------
    plan : PipelinePlan
        A plan over this workload's task names (bound or not).

    Returns
    -------
    PipelinePlan

    Examples
    --------
    >>> from swpipe import pipelines
    >>> plan = with_collectives_ordered(pipelines.get("sparse_dist"))
    >>> [n for n in plan.task_names if plan.sched(n).globally_ordered]
    ['InputDistStart', 'InputDistWait', 'Forward', 'Backward']
    """
    ordered = set(collective_tasks(plan.task_names))
    schedule = {k: dataclasses.replace(v, globally_ordered=True) if plan.task(k).name in ordered else v
                for k, v in plan.schedule.items()}
    return plan.replace(schedule=schedule, pipeline_depth=plan.pipeline_depth)


def _factory_options(name: str, options: Dict[str, Any]) -> Dict[str, Any]:
    if name == "staged" and "stages" not in options:
        return {**options, "stages": list(STAGED_STAGES)}
    return options


def fns_for(pipeline_name: str, workload: DLRMWorkload, plan: Optional[PipelinePlan] = None, *,
            compile_backend: Optional[str] = "auto", compiled_autograd: Optional[str] = "auto",
            **options: Any) -> Dict[str, TaskFn]:
    """The task functions a TorchRec pipeline of :mod:`swpipe_core.pipelines` needs on this workload.

    Parameters
    ----------
    pipeline_name : str
        A name of ``swpipe_core.pipelines.PIPELINES``.
    workload : DLRMWorkload
    plan : PipelinePlan, optional
        The (unbound) plan; default ``pipelines.get(pipeline_name, **options)``
        (``staged`` defaults to ``stages=STAGED_STAGES``).
    compile_backend : str or None
        PT2's ``torch.compile`` backend; ``"auto"`` means ``"inductor"`` for
        ``pt2`` and nothing otherwise; ``None`` runs eager.
    compiled_autograd : str or None
        Compiled-autograd backend; ``"auto"`` means ``"inductor"`` for
        ``sparse_dist_comp_autograd``; ``None`` runs eager.
    **options
        Factory options (``emb_lookup``, ``stages``).

    Returns
    -------
    dict
        ``{task_name: fn(ctx)}`` for exactly the plan's tasks.

    Examples
    --------
    >>> from swpipe.workloads.dlrm import DLRMConfig, init_distributed
    >>> env = init_distributed()
    >>> wl = DLRMWorkload(DLRMConfig.preset("test"), env)
    >>> sorted(fns_for("fused_sparse_dist", wl))[:3]
    ['Backward', 'EmbLookup', 'Forward']
    >>> env.close()
    """
    from swpipe_core import pipelines

    if plan is None:
        plan = pipelines.get(pipeline_name, **_factory_options(pipeline_name, options))
    if compile_backend == "auto":
        compile_backend = "inductor" if pipeline_name == "pt2" else None
    if compiled_autograd == "auto":
        compiled_autograd = "inductor" if pipeline_name == "sparse_dist_comp_autograd" else None
    train = pipeline_name not in EVAL_PIPELINES and "Backward" in plan.task_names or "TrainStep" in plan.task_names
    return task_fns(workload, plan.task_names, train=train, compile_backend=compile_backend,
                    compiled_autograd=compiled_autograd)


def plan_for(pipeline_name: str, workload: DLRMWorkload, *, order_collectives: Optional[bool] = None,
             **options: Any) -> PipelinePlan:
    """A runnable plan of a TorchRec pipeline on ``workload``; on several ranks its collectives are ordered.

    ``pipelines.get(name, fns_for(name, workload), **options)``:
    ``compile_backend`` and ``compiled_autograd`` in ``options`` go to
    :func:`fns_for`; the rest to the factory.

    Parameters
    ----------
    pipeline_name : str
        A name of ``swpipe_core.pipelines.PIPELINES``.
    workload : DLRMWorkload
    order_collectives : bool, optional
        Mark every task that issues a collective ``globally_ordered``
        (:func:`with_collectives_ordered`). Default: when the workload runs
        on more than one rank. On one rank there is no peer to agree with, and
        the mark would only serialise those tasks' host parts across thread
        groups, so the factory's plan is kept as it is (only
        ``InputDistStart`` ordered).
    **options
        The factory's options, ``compile_backend`` and ``compiled_autograd``.

    Returns
    -------
    PipelinePlan

    Examples
    --------
    >>> from swpipe.workloads.dlrm import DLRMConfig, init_distributed
    >>> env = init_distributed()
    >>> plan = plan_for("staged", DLRMWorkload(DLRMConfig.preset("test"), env))
    >>> plan.task_names, plan.unbound_tasks()
    (['H2D', 'InputDistStart', 'InputDistWait', 'TrainStep'], [])
    >>> plan = plan_for("sparse_dist", DLRMWorkload(DLRMConfig.preset("test"), env), order_collectives=True)
    >>> [n for n in plan.task_names if plan.sched(n).globally_ordered]
    ['InputDistStart', 'InputDistWait', 'Forward', 'Backward']
    >>> env.close()
    """
    from swpipe_core import pipelines

    fn_opts = {k: options.pop(k) for k in ("compile_backend", "compiled_autograd") if k in options}
    options = _factory_options(pipeline_name, options)
    unbound = pipelines.get(pipeline_name, **options)
    fns = fns_for(pipeline_name, workload, unbound, **fn_opts)
    plan = pipelines.get(pipeline_name, fns, **options)
    if order_collectives is None:
        order_collectives = workload.env.world_size > 1
    return with_collectives_ordered(plan) if order_collectives else plan
