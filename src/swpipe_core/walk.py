"""The execution contract's walk: which task instances a period runs, in the order the main thread reaches them.

Period ``p`` runs, for every task ``T``, iteration ``p - stage(T)`` when that
iteration exists (it has a batch and has not retired). The main thread walks
the period's tasks in the enqueue order: it hands a task of a worker group to
its worker when the walk reaches it, and runs a task of the caller's group
itself then, so a worker task placed after a caller's task is handed off only
once that task has run (docs/semantics.md, "The caller's group").

This module is the one place that turns a period into task instances. The
engine, the simulator, the happens-before model of ``swpipe_core.dataflow``,
the schedule tables and the tests' contract checker all read it; nothing else
computes an iteration from a period and a stage. A period's *shape* (which
tasks are present, and after which caller's step each worker step is handed
off) depends only on which stages have an iteration, so it is computed once
per shape and cached: a run's fill periods, its steady periods and its drain
periods have a handful of shapes between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from swpipe_core.order import enqueue_order
from swpipe_core.plan import PipelinePlan

__all__ = ["Step", "Shape", "PeriodWalk"]


@dataclass(frozen=True)
class Step:
    """One task instance of a period.

    Attributes
    ----------
    task : str
    iteration : int
    inline : bool
        Run by the main thread itself (the task belongs to the caller's group).
    after : int or None
        For a worker task: the position, in the period's steps, of the
        caller's step the walk passed last, which it is handed off after;
        ``None`` when it is handed off at the period's start. Always ``None``
        for an inline step.
    """

    task: str
    iteration: int
    inline: bool
    after: Optional[int]


@dataclass(frozen=True)
class Shape:
    """The steps of every period with the same stages present: ``(task, stage, inline, after)`` each, in order.

    ``after`` is as in :class:`Step`. Hot paths key their own compiled form
    of a period by the shape (it is hashable and cached by the walk).
    """

    steps: Tuple[Tuple[str, int, bool, Optional[int]], ...]

    def at(self, period: int) -> List[Step]:
        """The steps of ``period``: each task's iteration is ``period - stage``."""
        return [Step(task, period - stage, inline, after) for task, stage, inline, after in self.steps]


class PeriodWalk:
    """The walk of a plan's periods (built once per plan; :meth:`shape` is cached).

    Parameters
    ----------
    plan : PipelinePlan
    order : sequence of str, optional
        The enqueue order, if the caller already has it
        (default :func:`swpipe_core.order.enqueue_order`).

    Examples
    --------
    H2D on an io thread, Forward on the caller's thread one stage later,
    Log on the io thread after Forward in the enqueue order:

    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"H2D": TaskSchedule(0, thread_group="io"), "Forward": TaskSchedule(1),
    ...                      "Log": TaskSchedule(1, thread_group="io")},
    ...                     intra_iter_deps=[("Forward", "H2D")], enqueue_order=["H2D", "Forward", "Log"])
    >>> walk = PeriodWalk(plan)
    >>> [(s.task, s.iteration, s.inline, s.after) for s in walk.steps(1, 0, 3)]
    [('H2D', 1, False, None), ('Forward', 0, True, None), ('Log', 0, False, 1)]
    >>> [[(s.task, s.iteration) for s in steps] for _, steps in walk.periods(2)]
    [[('H2D', 0)], [('H2D', 1), ('Forward', 0), ('Log', 0)], [('Forward', 1), ('Log', 1)]]
    """

    def __init__(self, plan: PipelinePlan, order: Optional[Sequence[str]] = None) -> None:
        self.order: List[str] = list(order) if order is not None else enqueue_order(plan)
        self.stage: Dict[str, int] = {n: plan.stage(n) for n in self.order}
        groups = {plan.sched(n).thread_group for n in self.order}
        self.caller: Optional[str] = plan.caller_group if plan.caller_group in groups else None
        self.group: Dict[str, str] = {n: plan.sched(n).thread_group for n in self.order}
        self.depth = plan.pipeline_depth
        self._shapes: Dict[Tuple[int, int], Shape] = {}

    @classmethod
    def one_stage(cls, order: Sequence[str], group: Dict[str, str]) -> "PeriodWalk":
        """The walk of a plan of one stage with no caller's group, built from its order without the plan.

        Every task is handed off at the period's start, in ``order``; ``group`` gives each
        task's thread group. For a program of many tasks compiled straight into the
        simulator's tables (a pipeline-parallel step: :mod:`autosched.pp.simulate`).

        Examples
        --------
        >>> walk = PeriodWalk.one_stage(["a", "b"], {"a": "x", "b": "y"})
        >>> [(s.task, s.iteration, s.inline, s.after) for s in walk.steps(0, 0, 1)]
        [('a', 0, False, None), ('b', 0, False, None)]
        """
        walk = cls.__new__(cls)
        walk.order = list(order)
        walk.stage = dict.fromkeys(walk.order, 0)
        walk.caller = None
        walk.group = dict(group)
        walk.depth = 1
        walk._shapes = {}
        return walk

    def key(self, period: int, first: int, end: int) -> Tuple[int, int]:
        """Which stages have an iteration in ``[first, end)`` at ``period``: ``(highest, lowest - 1)``, clipped."""
        return min(period - first, self.depth - 1), max(period - end, -1)

    def shape(self, period: int, first: int, end: int) -> Shape:
        """The shape of ``period`` when the iterations ``first .. end - 1`` exist (cached per shape)."""
        key = self.key(period, first, end)
        found = self._shapes.get(key)
        if found is None:
            found = self._shapes[key] = self._walk(*key)
        return found

    def _walk(self, top: int, below: int) -> Shape:
        steps = []
        last_inline: Optional[int] = None
        for task in self.order:
            stage = self.stage[task]
            if not below < stage <= top:
                continue
            inline = self.group[task] == self.caller
            steps.append((task, stage, inline, None if inline else last_inline))
            if inline:
                last_inline = len(steps) - 1
        return Shape(tuple(steps))

    def steps(self, period: int, first: int, end: int) -> List[Step]:
        """The steps of ``period`` when the iterations ``first .. end - 1`` exist, in the walk's order."""
        return self.shape(period, first, end).at(period)

    def periods(self, num_iterations: int) -> Iterator[Tuple[int, List[Step]]]:
        """Every period of a run of ``num_iterations`` iterations, with its steps (``0 .. n + depth - 2``)."""
        for period in range(num_iterations + self.depth - 1):
            yield period, self.steps(period, 0, num_iterations)

    def sequence(self, num_iterations: int) -> List[Tuple[str, int]]:
        """Every ``(task, iteration)`` of a run, in the order the main thread reaches them."""
        return [(s.task, s.iteration) for _, steps in self.periods(num_iterations) for s in steps]
