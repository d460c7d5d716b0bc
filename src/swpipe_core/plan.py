"""The plan model: what a pipeline runs (tasks) and how (schedule, dependencies).

These are data classes with no behaviour beyond normalisation helpers; the
rules a plan must satisfy live in :mod:`swpipe_core.validate`, the order in
which a period's tasks are enqueued in :mod:`swpipe_core.order`, and the
execution in :mod:`swpipe_core.engine.pipeline`. :class:`PipelinePlan` is
here; the parts it is made of (:class:`PipelineTask`, :class:`TaskSchedule`,
:class:`IterContext`, :class:`DeclaredIO`, ``ref_name``, ``stream_name``, the
enqueue policies) are in :mod:`swpipe_core.planparts` and re-exported here.
``str(plan)`` and :meth:`PipelinePlan.from_text` use the text form of
:mod:`swpipe_core.planform` and :func:`~swpipe_core.validate.validate`, both
of which build on the parts, not on this module.

A task is referred to either by its :class:`PipelineTask` object or by its
name (``TaskRef``); the two are interchangeable everywhere, because a
``PipelineTask`` hashes and compares equal to its name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from swpipe_core.planform import PlanFileError, plan_arguments, plan_to_text, text_to_dict
from swpipe_core.planparts import (ENQUEUE_POLICIES, DeclaredIO, IterContext, PipelineTask, StreamSpec, TaskRef,
                                   TaskSchedule, ref_name, stream_name)
from swpipe_core.validate import PlanError, validate

__all__ = [
    "IterContext",
    "DeclaredIO",
    "PipelineTask",
    "TaskSchedule",
    "PipelinePlan",
    "TaskRef",
    "StreamSpec",
    "ENQUEUE_POLICIES",
    "ref_name",
    "stream_name",
]


def _stage_of(sched: Any) -> Optional[int]:
    stage = getattr(sched, "stage", None)
    return stage if isinstance(stage, int) and not isinstance(stage, bool) else None


@dataclass
class PipelinePlan:
    """A complete scheduling plan: the task set with each task's schedule and dependencies.

    Parameters
    ----------
    schedule : dict
        ``{TaskRef: TaskSchedule}``; the keys define the task set.
    intra_iter_deps : list of (task, depends_on)
        Same-iteration data dependencies: ``task(i)`` waits ``depends_on(i)``.
    inter_iter_deps : list of (task, depends_on) or (task, depends_on, N)
        Cross-iteration dependencies: ``task(i)`` waits ``depends_on(i - N)``
        (``N`` defaults to 1; the first ``N`` iterations wait for nothing).
    same_period_deps : list of (task, depends_on)
        Same-period waits, whichever iterations the two tasks work on: in every
        period ``task`` waits that period's ``depends_on``. With ``depends_on``
        at a lower stage it works on a *newer* iteration: ``task(i)`` waits
        ``depends_on(i + stage(task) - stage(depends_on))`` (e.g. the id
        prefetch of batch ``i + 1`` must be done before the backward of batch
        ``i`` goes on: ``("Backward", "EmbPrefetch")`` with ``EmbPrefetch`` one
        stage below). In the last periods, where ``depends_on`` has no
        iteration left, nothing is waited; a serial run (one iteration at a
        time) cannot wait for a later iteration and skips such a wait.
    pipeline_depth : int, optional
        Number of iterations in flight, ``max(stage) + 1``; inferred when omitted.
    enqueue_order : list of TaskRef, optional
        An explicit per-period enqueue order (a topological order of the
        period-local graph), e.g. a fire order found by the searcher.
    enqueue_policy : {"ready_first", "stage_descending"}
        The policy used when ``enqueue_order`` is not given.
    caller_group : str or None
        The thread group whose tasks run inline on the thread that calls
        ``fill_pipeline``/``progress`` (no hand-off to a worker); ``"default"``
        unless given. ``None`` runs every group on its own worker thread.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan(
    ...     schedule={"H2D": TaskSchedule(stage=0, stream="memcpy"), "Forward": TaskSchedule(stage=1)},
    ...     intra_iter_deps=[("Forward", "H2D")],
    ... )
    >>> plan.pipeline_depth, plan.task_names
    (2, ['H2D', 'Forward'])
    >>> plan.inter_edges()
    []
    """

    schedule: Dict[TaskRef, TaskSchedule]
    intra_iter_deps: List[Tuple[TaskRef, TaskRef]] = field(default_factory=list)
    inter_iter_deps: List[tuple] = field(default_factory=list)
    pipeline_depth: Optional[int] = None
    enqueue_order: Optional[List[TaskRef]] = None
    enqueue_policy: str = "ready_first"
    caller_group: Optional[str] = "default"
    same_period_deps: List[Tuple[TaskRef, TaskRef]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.intra_iter_deps = list(self.intra_iter_deps)
        self.inter_iter_deps = list(self.inter_iter_deps)
        self.same_period_deps = list(self.same_period_deps)
        if self.pipeline_depth is None:
            self.pipeline_depth = self.inferred_depth()

    # -- the text form, and equality --

    def __str__(self) -> str:
        """The plan's text form (:func:`swpipe_core.planform.plan_to_text`), which :meth:`from_text` reads back."""
        try:
            return plan_to_text(self)
        except TypeError:  # a task reference that is neither a name nor a task: validate() names it
            return repr(self)

    @classmethod
    def from_text(cls, text: str, fns: Optional[Dict[str, Callable[[IterContext], None]]] = None, *,
                  source: str = "plan text") -> "PipelinePlan":
        """The plan a text form describes (what ``str(plan)`` prints), validated.

        Parameters
        ----------
        text : str
            One line of the plan's fields, then one line per task: ``STAGE NAME [on GROUP] [stream STREAM]
            [global] [after DEP ...]``, a dependency ``DEP`` written ``X`` (same iteration), ``X[i-N]`` (``N``
            iterations back) or ``X[period]`` (same period); an ``order`` line for an explicit enqueue order
            (the grammar: :mod:`swpipe_core.planform`).
        fns : dict, optional
            ``{task_name: fn}``; tasks without a function stay unbound (analysis only).
        source : str
            Where the text came from, named in errors.

        Returns
        -------
        PipelinePlan

        Raises
        ------
        swpipe_core.planfile.PlanFileError
            A line that does not parse, or a field the dict form refuses; ``line`` and ``field`` say where.
        PlanError
            The plan breaks a rule; ``rule``, ``task``, ``field`` and ``line`` say which and where.

        Examples
        --------
        >>> from swpipe import PipelinePlan, TaskSchedule
        >>> plan = PipelinePlan({"H2D": TaskSchedule(0, "memcpy", "io"), "Forward": TaskSchedule(1)},
        ...                     intra_iter_deps=[("Forward", "H2D")], inter_iter_deps=[("H2D", "Forward")])
        >>> print(plan)
        plan depth=2 policy=ready_first caller=default
        0 H2D     on io      stream memcpy  after Forward[i-1]
        1 Forward on default stream default after H2D
        >>> PipelinePlan.from_text(str(plan)) == plan
        True
        >>> PipelinePlan.from_text("plan depth=2\\n0 H2D\\n0 Forward after H2D[i-1]")
        Traceback (most recent call last):
        ...
        swpipe_core.validate.PlanError: [depth-mismatch] line 1: pipeline_depth=2 but max(stage) + 1 = 1. Fix: set pipeline_depth=1 or omit it to have it inferred
        """
        doc, lines = text_to_dict(text, source)
        try:
            plan = cls(**plan_arguments(doc, fns, source=source))
            validate(plan)
        except PlanFileError as exc:
            raise exc.at_line(lines.get(exc.field.split(".")[0])) from None
        except PlanError as exc:
            raise exc.at_line(lines.get(f"task {exc.task}", lines[""])) from None
        return plan

    def __eq__(self, other: object) -> bool:
        """Equal plans schedule alike: the same task names in the same order (functions are not compared: a task
        equals any task of its name, bound or not), the same schedules, the same dependencies (in any order),
        depth, enqueue order, policy and caller group."""
        if not isinstance(other, PipelinePlan):
            return NotImplemented
        return list(self.schedule) == list(other.schedule) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, as a dataclass with eq is

    def _fields(self) -> tuple:
        scheds = [(s.stage, None if s.stream is None else stream_name(s.stream), s.thread_group, s.globally_ordered)
                  for s in self.schedule.values()]
        order = None if self.enqueue_order is None else [ref_name(r) for r in self.enqueue_order]
        return (scheds, frozenset(self.intra_edges()), frozenset(self.declared_inter_edges()),
                frozenset((ref_name(t), ref_name(d)) for t, d in self.same_period_deps), self.pipeline_depth, order,
                self.enqueue_policy, self.caller_group)

    # -- normalised views (tolerant of malformed input; validate() reports it) --

    def inferred_depth(self) -> int:
        """``max(stage) + 1`` over the schedule's integer stages (1 for an empty plan)."""
        stages = [s for s in (_stage_of(v) for v in self.schedule.values()) if s is not None]
        return max(stages) + 1 if stages else 1

    @property
    def tasks(self) -> List[PipelineTask]:
        """The tasks in schedule order; a string key becomes an unbound ``PipelineTask``."""
        return [k if isinstance(k, PipelineTask) else PipelineTask(ref_name(k)) for k in self.schedule]

    @property
    def task_names(self) -> List[str]:
        """Task names in schedule order."""
        return [ref_name(k) for k in self.schedule]

    @property
    def thread_groups(self) -> Tuple[str, ...]:
        """The plan's thread groups, sorted (one thread each; the caller group's is the calling thread).

        Examples
        --------
        >>> from swpipe import PipelinePlan, TaskSchedule
        >>> PipelinePlan({"A": TaskSchedule(0, thread_group="io"), "B": TaskSchedule(1)}).thread_groups
        ('default', 'io')
        """
        return tuple(sorted({s.thread_group for s in self.schedule.values()}))

    def task(self, ref: TaskRef) -> PipelineTask:
        """The ``PipelineTask`` for a reference (unbound if the schedule key is a string)."""
        name = ref_name(ref)
        for k in self.schedule:
            if ref_name(k) == name:
                return k if isinstance(k, PipelineTask) else PipelineTask(name)
        raise KeyError(f"task {name!r} is not in the plan's schedule; tasks: {self.task_names}")

    def sched(self, ref: TaskRef) -> TaskSchedule:
        """The ``TaskSchedule`` of a task, looked up by name or object."""
        name = ref_name(ref)
        # a PipelineTask key hashes and compares equal to its name: O(1) in the common case
        found = self.schedule.get(name)
        if found is not None:
            return found
        for k, v in self.schedule.items():
            if ref_name(k) == name:
                return v
        raise KeyError(f"task {name!r} is not in the plan's schedule; tasks: {self.task_names}")

    def stage(self, ref: TaskRef) -> int:
        return self.sched(ref).stage

    def stream_of(self, ref: TaskRef) -> str:
        """Readable stream name of a task (``"default"`` for ``None``)."""
        return stream_name(self.sched(ref).stream)

    def intra_edges(self) -> List[Tuple[str, str]]:
        """Intra-iteration dependencies as ``(task_name, dep_name)`` pairs."""
        return [(ref_name(d[0]), ref_name(d[1])) for d in self.intra_iter_deps]

    def inter_edges(self) -> List[Tuple[str, str, int]]:
        """Inter-iteration dependencies as ``(task_name, dep_name, distance)`` triples.

        ``task(i)`` waits ``dep(i - distance)``. The :meth:`same_period_edges`
        follow the declared ones: everything that runs or models a plan
        honours both through this one list.

        Examples
        --------
        >>> from swpipe import PipelinePlan, TaskSchedule
        >>> plan = PipelinePlan({"P": TaskSchedule(0), "B": TaskSchedule(1)}, inter_iter_deps=[("P", "B")],
        ...                     same_period_deps=[("B", "P")])
        >>> plan.inter_edges()
        [('P', 'B', 1), ('B', 'P', -1)]
        """
        return self.declared_inter_edges() + self.same_period_edges()

    def declared_inter_edges(self) -> List[Tuple[str, str, int]]:
        """The ``inter_iter_deps`` alone as ``(task_name, dep_name, distance)`` (what a copy of the plan keeps)."""
        return [(ref_name(d[0]), ref_name(d[1]), d[2] if len(d) > 2 else 1) for d in self.inter_iter_deps]

    def same_period_edges(self) -> List[Tuple[str, str, int]]:
        """The ``same_period_deps`` as ``(task_name, dep_name, distance)`` with ``distance = stage(dep) - stage(task)``.

        A negative distance waits a newer iteration. Entries whose stages are
        not integers are left out (``validate`` reports them).
        """
        stages = {ref_name(k): _stage_of(v) for k, v in self.schedule.items()}
        out = []
        for d in self.same_period_deps:
            t, dep = ref_name(d[0]), ref_name(d[1])
            if stages.get(t) is not None and stages.get(dep) is not None:
                out.append((t, dep, stages[dep] - stages[t]))
        return out

    def unbound_tasks(self) -> List[str]:
        """Names of tasks with no function (analysis-only)."""
        return [t.name for t in self.tasks if t.fn is None]

    def replace(self, **changes: Any) -> "PipelinePlan":
        """A copy of the plan with some fields replaced (depth re-inferred unless given)."""
        fields = dict(
            schedule=dict(self.schedule),
            intra_iter_deps=list(self.intra_iter_deps),
            inter_iter_deps=list(self.inter_iter_deps),
            pipeline_depth=None,
            enqueue_order=None if self.enqueue_order is None else list(self.enqueue_order),
            enqueue_policy=self.enqueue_policy,
            caller_group=self.caller_group,
            same_period_deps=list(self.same_period_deps),
        )
        fields.update(changes)
        return PipelinePlan(**fields)

    def bind(self, fns: Dict[str, Callable[[IterContext], None]], io: Optional[Dict[str, Sequence[DeclaredIO]]] = None) -> "PipelinePlan":
        """A copy of the plan whose tasks carry the given functions (by task name).

        Tasks without an entry in ``fns`` keep their current function.
        """
        io = io or {}
        new_sched = {}
        for k, v in self.schedule.items():
            t = k if isinstance(k, PipelineTask) else PipelineTask(ref_name(k))
            fn = fns.get(t.name, t.fn)
            new_sched[PipelineTask(t.name, fn, list(io.get(t.name, t.io)))] = v
        return self.replace(schedule=new_sched, pipeline_depth=self.pipeline_depth)
