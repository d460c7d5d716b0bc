"""``TrainPipeline``: swpipe's engine behind TorchRec's ``TrainPipeline`` interface.

Switching from TorchRec's pipeline is one line::

    pipeline = TrainPipelineSparseDist(model, optimizer, device)               # TorchRec
    pipeline = swpipe.torchrec.TrainPipeline(model, optimizer, device)         # swpipe, plan="sparse_dist"

and the loop stays ``while True: out = pipeline.progress(it)`` until
``StopIteration``. How the calls map onto the engine (a plan of depth ``D``):
the first ``progress`` of a pass fills the pipeline (periods ``0 .. D-1``),
whose last period runs batch 0's forward; call ``k`` then runs period
``k + D - 1``, where batch ``k``'s forward, backward and optimizer step run
(every such task is in the last stage: :func:`~swpipe.torchrec.plans.check_shape`)
while later batches are copied and distributed, and returns batch ``k``'s
output. The model's mode when a call begins is that batch's mode
(:mod:`swpipe.torchrec.tasks`).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, Iterator, List, Optional, Type, Union

import torch

from swpipe_core.analysis import format_schedule
from swpipe_core.distributed import agree_on_end, group_timeout
from swpipe_core.engine.options import Timeouts
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import PipelinePlan

from autosched.search.options import Constraints, SolverOptions
from autosched.verify.measure import VerifyOptions

from swpipe.replan.adaptive import AdaptivePipeline
from swpipe.replan.options import ReplanOptions
from swpipe.torchrec.auto import AutoChoice, auto_options, choose_plan
from swpipe.torchrec.plans import CLASS_NOTES, TORCHREC_CLASSES, named_plan, runnable
from swpipe.torchrec.replan import adaptive_engine, replan_options
from swpipe.torchrec.tasks import TorchRecTasks, toolbox_kind

__all__ = ["TrainPipeline"]

# TorchRec constructor arguments the drop-in takes and checks: the value that asks for what swpipe does
_TORCHREC_FIXED = {"execute_all_batches": True, "apply_jit": False, "enable_inplace_copy_batch": False,
                   "free_features_storage_early": False, "clear_data_dist_inputs": False, "stash_gradients": False,
                   "async_inplace_copy": False, "embedding_lookup_after_data_dist": False}


def _check_torchrec_arguments(given: Dict[str, Any]) -> None:
    """TorchRec's arguments whose other values ask for what the drop-in does not do are errors."""
    for name, ok in _TORCHREC_FIXED.items():
        if given[name] != ok:
            raise ValueError(f"TorchRec's {name}={given[name]!r} is not supported by swpipe.torchrec (it runs as "
                             f"{name}={ok!r}); drop the argument")


class _Feed(Iterator[Any]):
    """The engine's data: batches put back first, then the latest iterator ``progress`` was given."""

    def __init__(self, source: Iterator[Any]) -> None:
        self.source = source
        self.front: List[Any] = []
        self.raised: Optional[BaseException] = None  # the user's iterator's own error: the pass stays intact

    def __next__(self) -> Any:
        if self.front:
            return self.front.pop(0)
        try:
            return next(self.source)
        except StopIteration:
            raise
        except BaseException as exc:
            self.raised = exc
            raise


class _Counted(Iterator[Any]):
    def __init__(self, data: Iterator[Any]) -> None:
        self.data = data
        self.count = 0

    def __next__(self) -> Any:
        batch = next(self.data)
        self.count += 1
        return batch


class TrainPipeline:
    """A TorchRec training pipeline run by swpipe's engine: ``progress(dataloader_iter)`` as TorchRec's.

    Parameters
    ----------
    model : torch.nn.Module
        A ``DistributedModelParallel`` model (``EmbeddingBagCollection``,
        ``EmbeddingCollection``, weighted features) whose forward takes a
        batch and returns ``(losses, output)`` in training, as TorchRec's
        pipelines need.
    optimizer : torch.optim.Optimizer
        E.g. TorchRec's ``CombinedOptimizer`` of the fused and dense optimizers.
    device : torch.device or str
    plan : str or PipelinePlan
        A name of :data:`~swpipe.torchrec.plans.TORCHREC_CLASSES` (``"base"``,
        ``"sparse_dist"``, ``"sparse_dist_lite"``, ``"fused_sparse_dist"``,
        ``"semi_sync"``, ``"sparse_dist_t"``: TorchRec's class of that name),
        ``"auto"`` (:mod:`swpipe.torchrec.auto`: chosen on the first batches
        of the first pass, the model left as it was) or a ``PipelinePlan``
        over the task names of :mod:`swpipe.torchrec.tasks`.
    execute_all_batches, apply_jit, context_type, pipeline_postproc, custom_model_fwd, \
    dmp_collection_sync_interval_batches, enqueue_batch_after_forward, enable_inplace_copy_batch, \
    free_features_storage_early, clear_data_dist_inputs, async_inplace_copy, strict, emb_lookup_stream, \
    embedding_lookup_after_data_dist, start_batch, stash_gradients
        TorchRec's constructor arguments, so the switch is one line.
        ``custom_model_fwd`` (called with the batch instead of the model,
        returns ``(losses, output)``) and ``emb_lookup_stream``
        (``fused_sparse_dist``: the lookup's stream, ``"new"``,
        ``"data_dist"`` or ``"current"``; default the plan's, ``"new"``) are
        used as TorchRec uses them; ``context_type``, ``pipeline_postproc``,
        ``dmp_collection_sync_interval_batches``,
        ``enqueue_batch_after_forward``, ``strict`` and ``start_batch`` are
        accepted and change nothing; the others must keep TorchRec's default
        (a ``ValueError`` names the one that does not).
    order : str, optional
        A named plan's enqueue order (``"torchrec"``: TorchRec's own submission order).
    thread_map : str, optional
        ``"by_stream"``: one thread per stream (the forward's stays the caller's).
    hand_off_after : str, optional
        With ``thread_map``: hand the side threads' tasks off after this task of the caller's.
    agree_on_end : bool, optional
        Stop every rank at the same batch (default: on with several ranks); needs ``torch.distributed``.
    timeouts : Timeouts, optional
        The engine's waits (``swpipe.Timeouts``, as ``SWPipeline`` takes them): a hung task is an error naming it,
        never a hang.
    constraints : Constraints, optional
        ``plan="auto"``: what the plan may be (``max_depth``: the depths
        searched, 2 up to it; ``max_threads``; ``max_memory_bytes``: only the
        candidates whose predicted peak fits are measured; ``streams``,
        ``frozen`` streams or thread groups, ``globally_ordered``). The device
        is the pipeline's. Default ``Constraints()``.
    solver : SolverOptions, optional
        ``plan="auto"``: how the search runs (``time_limit_s`` is shared by the
        depths). Default ``SolverOptions(time_limit_s=6)``.
    verify : VerifyOptions, optional
        ``plan="auto"``: how the candidates are measured (``rounds``,
        ``iterations``, ``margin_pct``, ...) and what is profiled first
        (``profile_batches``, ``calibrate``). Default ``VerifyOptions()``.
    replan : bool or ReplanOptions, optional
        Re-plan while training runs (off by default; ``True`` is
        ``ReplanOptions()``): the plan runs on a
        :class:`~swpipe.replan.AdaptivePipeline`, which searches again when
        the measured period drifts and swaps plans at a drain, the outputs
        equal to those without a swap (:mod:`swpipe.torchrec.replan`: the
        search keeps the plan's depth and the forward in its last stage; on
        several ranks rank 0 decides and every rank swaps at the same batch).

    Attributes
    ----------
    report : str
        What runs and why (the auto choice's search and verification table).
    leftover : list
        With several ranks: the batches this rank took from its iterator but
        did not train because another rank's data ended first (at most one).

    Raises
    ------
    ValueError, TypeError
        A plan or option the drop-in does not take (the message says which are taken), or ``constraints=``,
        ``solver=``, ``verify=`` without ``plan="auto"``, or ``replan=`` of another type (an ``OptionError``).

    Examples
    --------
    TorchRec's ``TestSparseNN`` on one gloo rank (``examples/torchrec_dropin.py`` compares it with TorchRec's
    own pipeline):

    >>> import torch.distributed as dist
    >>> from swpipe.torchrec import TrainPipeline, models
    >>> owns = not dist.is_initialized()
    >>> if owns:
    ...     dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> model, optimizer = models.sparse_nn()
    >>> batches = models.sparse_nn_batches(models.SparseNNConfig(), 5)
    >>> pipeline = TrainPipeline(model, optimizer, torch.device("cpu"), plan="sparse_dist")
    >>> it, outputs = iter(batches), []
    >>> while True:
    ...     try:
    ...         outputs.append(pipeline.progress(it))
    ...     except StopIteration:
    ...         break
    >>> len(outputs), tuple(outputs[0].shape)
    (5, (32,))
    >>> pipeline.close()
    >>> if owns:
    ...     dist.destroy_process_group()
    """

    def __init__(self, model: torch.nn.Module, optimizer: Any, device: Union[str, torch.device],
                 plan: Union[str, PipelinePlan] = "sparse_dist", *,
                 execute_all_batches: bool = True, apply_jit: bool = False, context_type: Optional[Type[Any]] = None,
                 pipeline_postproc: Optional[bool] = None,
                 custom_model_fwd: Optional[Callable[[Any], Any]] = None,
                 dmp_collection_sync_interval_batches: Optional[int] = 1, enqueue_batch_after_forward: bool = False,
                 enable_inplace_copy_batch: bool = False, free_features_storage_early: bool = False,
                 clear_data_dist_inputs: bool = False, async_inplace_copy: bool = False, strict: bool = False,
                 emb_lookup_stream: Optional[str] = None, embedding_lookup_after_data_dist: bool = False,
                 start_batch: Optional[int] = None, stash_gradients: bool = False,
                 order: Optional[str] = None, thread_map: Optional[str] = None, hand_off_after: Optional[str] = None,
                 agree_on_end: Optional[bool] = None, timeouts: Optional[Timeouts] = None,
                 constraints: Optional[Constraints] = None, solver: Optional[SolverOptions] = None,
                 verify: Optional[VerifyOptions] = None, replan: Union[None, bool, ReplanOptions] = None) -> None:
        import torch.distributed as dist

        _check_torchrec_arguments(dict(
            execute_all_batches=execute_all_batches, apply_jit=apply_jit, stash_gradients=stash_gradients,
            enable_inplace_copy_batch=enable_inplace_copy_batch, clear_data_dist_inputs=clear_data_dist_inputs,
            free_features_storage_early=free_features_storage_early, async_inplace_copy=async_inplace_copy,
            embedding_lookup_after_data_dist=embedding_lookup_after_data_dist))
        self._model, self._optimizer = model, optimizer
        self._device = torch.device(device)
        self._timeouts = timeouts
        self._replan = replan_options(replan)
        ready = dist.is_available() and dist.is_initialized()
        self._world = dist.get_world_size() if ready else 1
        if agree_on_end and not ready:
            raise RuntimeError("agree_on_end=True needs torch.distributed: call init_process_group first")
        self._auto = isinstance(plan, str) and plan.strip().lower() == "auto"
        given = [k for k, v in (("constraints", constraints), ("solver", solver), ("verify", verify)) if v is not None]
        if given and not self._auto:
            raise TypeError(f"option(s) {given} are for plan='auto' only")
        if self._auto:
            self._options = auto_options(constraints, solver, verify, self._device)
        shaping = {"order": order, "emb_lookup_stream": emb_lookup_stream}
        if self._auto:
            shaping.update(thread_map=thread_map, hand_off_after=hand_off_after)
        named_only = [k for k, v in shaping.items() if v is not None]
        if named_only and (self._auto or isinstance(plan, PipelinePlan)):
            raise TypeError(f"option(s) {named_only} shape a named plan; plan={'auto' if self._auto else 'a PipelinePlan'} "
                            "takes its schedule as it is")
        self._agree = self._world > 1 and agree_on_end is not False
        self._group: Any = None
        if self._world > 1 and (self._agree or self._auto or self._replan is not None):
            # a gloo group of its own, used only from the caller's thread: the end-of-data exchange, auto's exchanges,
            # re-planning's decisions (a collective: every rank constructs its pipeline at the same point, as with
            # TorchRec's)
            self._group = dist.new_group(backend="gloo", timeout=group_timeout())
        self._plan: Optional[PipelinePlan] = None
        self.report = ""
        self.choice: Optional[AutoChoice] = None
        self.leftover: List[Any] = []
        self._engine: Optional[Union[SWPipeline, AdaptivePipeline]] = None
        self._replanner: Optional[AdaptivePipeline] = None
        self._it: Optional[Iterator[Any]] = None  # the engine's iterator while a pass is in flight
        self._feed: Optional[_Feed] = None
        self._counted: Optional[_Counted] = None
        self._agreed: Any = None
        self._next = 0
        self._ended: Any = None
        self._closed = False
        if self._auto:
            self._tasks = TorchRecTasks(model, optimizer, self._device, "fused", custom_model_fwd)
            self.report = "plan='auto': chosen on the first batches of the first progress() call"
            return
        if isinstance(plan, PipelinePlan):
            base, label = plan, "a PipelinePlan given by the caller"
        elif isinstance(plan, str):
            factory = {k: v for k, v in (("order", order), ("emb_lookup", emb_lookup_stream)) if v is not None}
            base = named_plan(plan, **factory)
            key = plan.strip().lower().replace("-", "_")
            label = f"plan {key!r}, TorchRec's {TORCHREC_CLASSES[key]}" + (
                f" ({CLASS_NOTES[key]})" if key in CLASS_NOTES else "")
        else:
            raise TypeError(f"plan must be a plan name, 'auto' or a PipelinePlan, got {type(plan).__name__}")
        self._tasks = TorchRecTasks(model, optimizer, self._device, toolbox_kind(base.task_names), custom_model_fwd)
        self._use(base, label, thread_map, hand_off_after)

    # ------------------------------------------------------------------------------ setup

    def _use(self, base: PipelinePlan, label: str, thread_map: Optional[str] = None,
             hand_off_after: Optional[str] = None) -> None:
        fns = self._tasks.functions(base.task_names)
        plan = self._plan = runnable(base, fns, self._world, thread_map, hand_off_after)
        if self._replan is None:
            self._engine = SWPipeline(plan, device=self._device, state=self._model, timeouts=self._timeouts)
        else:
            self._engine = self._replanner = adaptive_engine(
                plan, self._tasks, self._device, self._replan, self._world, self._group, state=self._model,
                timeouts=self._timeouts)
        groups = sorted({plan.sched(t).thread_group for t in plan.task_names})
        extra = f"\n{self.choice}" if self.choice is not None else ""
        self.report = (f"swpipe.torchrec.TrainPipeline: {label}; depth {plan.pipeline_depth}, thread group(s) "
                       f"{groups} (the caller runs {plan.caller_group!r}), {self._world} rank(s)"
                       + (", every rank stopping at the same batch" if self._agree else "")
                       + (f", re-planned on drift ({self._replan})" if self._replan is not None else "")
                       + f"\n{format_schedule(plan, plan.pipeline_depth + 1)}{extra}")

    def _choose(self, feed: _Feed) -> None:
        """``plan="auto"``: take the first batches, choose on them, put them back in front of the pass."""
        constraints, solver, verify = self._options
        k = verify.profile_batches
        first = list(itertools.islice(feed.source, k))
        n = len(first)
        if self._world > 1:
            import torch.distributed as dist

            counts: List[Any] = [None] * self._world
            dist.all_gather_object(counts, n, group=self._group)
            n = min(counts)
        if n < 2:
            self.choice = None
            fallback = named_plan("fused_sparse_dist")
            self._use(fallback, f"plan 'fused_sparse_dist' (plan='auto' had {n} batch(es) to measure on, fewer than 2)")
        else:
            self.choice = choose_plan(self._tasks, first[:n], constraints, solver, verify, self._group)
            self._use(self.choice.plan, f"plan='auto' chose {self.choice.label}")
        feed.front = first

    # --------------------------------------------------------------------------- progress

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """Train (or, in eval mode, evaluate) one batch and return its output, as TorchRec's ``progress``.

        Parameters
        ----------
        dataloader_iter : iterator
            The batches (the same iterator on every call of a pass; a new
            one mid-pass feeds the batches not yet fetched).

        Returns
        -------
        Any
            In training, ``output`` of the model's ``(losses, output)``; in
            eval (``model.eval()`` before the call), the same of the forward's
            result (a model that returns one value in eval: that value).

        Raises
        ------
        StopIteration
            The iterator is exhausted and every batch fetched has been
            returned (the pipeline is drained, its threads joined). A new
            iterator then starts a new pass; the exhausted one raises again.
        swpipe_core.engine.pipeline.PipelineTaskError
            A task failed (naming it and the batch); the pass is over, a new
            iterator starts a new one.
        """
        if self._closed:
            raise RuntimeError("progress() on a closed swpipe.torchrec.TrainPipeline; make a new one")
        if not hasattr(dataloader_iter, "__next__"):
            raise TypeError(f"progress() takes an iterator, as TorchRec's: pass iter(dataloader), not a "
                            f"{type(dataloader_iter).__name__}")
        training = self._model.training
        try:
            if self._it is None:
                if dataloader_iter is self._ended:
                    raise StopIteration
                k = self._start(dataloader_iter, training)
            else:
                self._feed.source = dataloader_iter
                k = self._next
                self._tasks.modes[k] = training
                self._engine.progress(self._it)
                self._tasks.modes.pop(k - 1, None)
        except StopIteration:
            raise
        except BaseException as exc:
            if self._feed is not None and exc is self._feed.raised:
                self._feed.raised = None  # the data iterator's own error: nothing changed, call progress again
            else:
                self._abandon()  # a task failed or timed out, or the caller was interrupted: the pass is over
            raise
        if k < self._counted.count:
            self._next = k + 1
            return self._output(k)
        self._finish(dataloader_iter)
        raise StopIteration

    def _start(self, dataloader_iter: Iterator[Any], training: bool) -> int:
        self._tasks.reset()
        self._tasks.keep_outputs = True
        self._feed = _Feed(dataloader_iter)
        if self._auto and self._engine is None:
            self._choose(self._feed)
        data: Iterator[Any] = self._feed
        if self._agree:
            self._agreed = agree_on_end(self._feed, group=self._group)
            data = self._agreed
        self._counted = _Counted(data)
        self._tasks.modes[0] = training
        self._next = 0
        self._it = self._engine.fill_pipeline(self._counted)
        return 0

    def _output(self, k: int) -> Any:
        try:
            return self._tasks.take_output(k)
        except KeyError:
            pass
        # batch k's forward did not run: a task of the period failed; the engine raises it on its next call
        try:
            self._engine.progress(self._it)
        finally:
            self._abandon()
        raise RuntimeError(f"swpipe.torchrec: the forward of batch {k} did not run and the engine reported no "
                           "failure; the pass is abandoned (a new iterator starts a new one)")

    def _finish(self, dataloader_iter: Iterator[Any]) -> None:
        try:
            while True:
                self._engine.progress(self._it)
        except StopIteration:
            pass
        finally:
            self.leftover = list(self._agreed.leftover) if self._agreed is not None else []
            self._it = None
            self._agreed = None
            self._tasks.reset()
        self._ended = dataloader_iter

    def _abandon(self) -> None:
        """Forget the pass in flight (after a failure): the engine is reset, its threads joined."""
        self._it = None
        self._agreed = None
        self._tasks.reset()
        if self._engine is not None:
            self._engine.close()

    # ------------------------------------------------------------------------- lifetime

    @property
    def plan(self) -> Optional[PipelinePlan]:
        """The plan run (None until ``plan="auto"`` has chosen; with ``replan``, the plan running now)."""
        return self._replanner.plan if self._replanner is not None else self._plan

    @property
    def engine(self) -> Optional[SWPipeline]:
        """The :class:`~swpipe_core.engine.pipeline.SWPipeline` running the plan (None before ``plan="auto"`` chose)."""
        return self._replanner.pipeline if self._replanner is not None else self._engine

    @property
    def replanner(self) -> Optional[AdaptivePipeline]:
        """With ``replan``: the :class:`~swpipe.replan.AdaptivePipeline` running the plan (its ``decisions`` and
        ``swaps`` say when and why it re-planned); ``None`` without (or before ``plan="auto"`` chose)."""
        return self._replanner

    def reset(self) -> None:
        """Drop the batches in flight (they are not trained) and stop the threads; the next call starts a pass."""
        self._abandon()
        self._ended = None

    def detach(self) -> torch.nn.Module:
        """Drop the batches in flight and give the model its own forward back (TorchRec's ``detach``).

        The next ``progress`` rewrites it again. Returns the model.
        """
        self.reset()
        if self._tasks.toolbox is not None:
            self._tasks.toolbox.detach()
        return self._model

    def close(self) -> None:
        """:meth:`detach`, and no further use."""
        if not self._closed:
            self.detach()
            self._closed = True

    def __enter__(self) -> "TrainPipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        what = "auto (not chosen yet)" if self.plan is None else f"depth {self.plan.pipeline_depth}"
        return f"swpipe.torchrec.TrainPipeline({what}, {self._world} rank(s), device={self._device})"
