"""Several ranks re-plan as one: rank 0 decides, and every rank swaps at the same iteration to the same plan.

After every ``exchange_every``-th retired iteration (:func:`~swpipe.replan.rules.exchange_step`, the run-wide
index alone: the same iterations on every rank) each rank takes part in one exchange on a gloo group of its own
(the scheme :func:`~swpipe_core.distributed.agree_on_end` uses for uneven data: a small CPU tensor, on the
caller's thread, never the group the tasks' collectives run on). Between two exchanges no rank waits for another:
rank 0's decision waits for the next exchange, and so does its failure. Rank 0 broadcasts ``[what, iteration]``:
nothing decided, a swap (followed by the decision with the plan in its shareable form,
:func:`~swpipe_core.planfile.plan_to_dict`), or its re-planning failed (every rank then raises instead of waiting
for a collective that never comes). The other ranks neither watch nor search: what their own clocks and cost
sources say does not matter, so no rank can swap alone. Because every rank retires the same iterations (the same
plan and the same data count, ``agree_on_end`` for uneven data), the exchange pairs rank 0's iteration with every
rank's, and the iteration is checked.

The same exchange carries any picklable decision (:meth:`DecisionExchange.tell_object`, what PyTorch's pipelining
schedules and GPipe switch to) and, when rank 0 saw a drift, one gather of every rank's measured costs first
(:meth:`DecisionExchange.poll`, :meth:`DecisionExchange.gather`): each rank measures only its own stages.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional

import torch

from swpipe.replan.log import ReplanDecision, ReplanError
from swpipe.replan.rules import exchange_step
from swpipe_core.plan import PipelinePlan
from swpipe_core.planfile import plan_from_dict, plan_to_dict

__all__ = ["DecisionExchange"]

_NOTHING, _SWAP, _FAILED, _GATHER = 0, 1, 2, 3


class DecisionExchange:
    """Rank 0's re-planning decisions, told to every rank of ``group`` after every ``every``-th retired iteration.

    The callers exchange only after the iterations :meth:`due` names; the calls themselves do not check it.

    Parameters
    ----------
    group : torch.distributed.ProcessGroup
        A gloo group used for this exchange only (``torch.distributed.new_group(backend="gloo")``); every rank
        of it must run the same iterations.
    every : int
        ``ReplanOptions.exchange_every`` (default 1: after every iteration).

    Attributes
    ----------
    rank, world : int
        This rank in ``group``, and the group's size.
    every : int
        The iterations between two exchanges.

    Examples
    --------
    A one-rank group shows the calls (rank 0 tells, and is the only rank):

    >>> import torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> exchange = DecisionExchange(dist.group.WORLD, every=8)
    >>> exchange.rank, exchange.due(7), exchange.tell(7, None)
    (0, True, None)
    >>> dist.destroy_process_group()
    """

    def __init__(self, group: Any, every: int = 1) -> None:
        import torch.distributed as dist

        exchange_step(0, every)  # a bad count fails here, not at the first iteration
        self._dist = dist
        self.group = group
        self.every = every
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self._src = dist.get_global_rank(group, 0) if group is not None and group is not dist.group.WORLD else 0

    def due(self, iteration: int) -> bool:
        """Whether the ranks exchange after ``iteration`` (:func:`~swpipe.replan.rules.exchange_step`)."""
        return exchange_step(iteration, self.every)

    def _head(self, what: int, iteration: int) -> torch.Tensor:
        head = torch.tensor([what, iteration], dtype=torch.int64)
        self._dist.broadcast(head, src=self._src, group=self.group)
        return head

    def tell(self, iteration: int, swap: Optional[ReplanDecision]) -> None:
        """Rank 0, after ``iteration`` retired: ``swap`` (a decision that swapped) or nothing."""
        self.tell_object(iteration, None if swap is None else
                         [dataclasses.replace(swap, plan=None), plan_to_dict(swap.plan)])

    def tell_failure(self, iteration: int) -> None:
        """Rank 0, whose re-planning raised after ``iteration``: every other rank raises too."""
        self._head(_FAILED, iteration)

    def hear(self, iteration: int, running: PipelinePlan) -> Optional[ReplanDecision]:
        """Any other rank, after ``iteration`` retired: rank 0's swap, its plan bound to ``running``'s functions.

        Raises
        ------
        ReplanError
            Rank 0's re-planning failed (``reason="failed on rank 0"``), or rank 0 told about another iteration
            (``reason="out of step"``: the ranks do not run the same iterations).
        """
        told = self.hear_object(iteration)
        if told is None:
            return None
        shared, doc = told
        tasks = running.tasks
        plan = plan_from_dict(doc, source="rank 0's plan").bind({t.name: t.fn for t in tasks},
                                                                 {t.name: t.io for t in tasks})
        return dataclasses.replace(shared, plan=plan)

    # ------------------------------------------------- any decision (a schedule, a balance), and the ranks' costs

    def tell_object(self, iteration: int, obj: Any) -> None:
        """Rank 0, after ``iteration``: ``obj`` (any picklable decision) to every rank, or ``None``: nothing."""
        self._head(_NOTHING if obj is None else _SWAP, iteration)
        if obj is not None:
            self._dist.broadcast_object_list([obj], src=self._src, group=self.group)

    def hear_object(self, iteration: int) -> Any:
        """Any other rank, after ``iteration``: what rank 0 told with :meth:`tell_object` (``None``: nothing).

        Raises
        ------
        ReplanError
            As :meth:`hear`.
        """
        what = self._heard(iteration)
        if what == _NOTHING:
            return None
        box: list = [None]
        self._dist.broadcast_object_list(box, src=self._src, group=self.group)
        return box[0]

    def poll(self, iteration: int, drift: bool = False) -> bool:
        """Every rank, after ``iteration``: whether rank 0 (its ``drift``; the others' is not read) asks for costs.

        When it returns ``True``, every rank calls :meth:`gather` next and rank 0 then tells its decision.

        Raises
        ------
        ReplanError
            On a rank other than 0, as :meth:`hear`.
        """
        if self.rank == 0:
            self._head(_GATHER if drift else _NOTHING, iteration)
            return bool(drift)
        return self._heard(iteration) == _GATHER

    def gather(self, mine: Any) -> List[Any]:
        """Every rank's ``mine`` (its measured costs), in rank order, on every rank."""
        out: List[Any] = [None] * self.world
        self._dist.all_gather_object(out, mine, group=self.group)
        return out

    def _heard(self, iteration: int) -> int:
        """Rank 0's head for ``iteration``: what it tells, checked (out of step, a failure on rank 0)."""
        what, told = (int(x) for x in self._head(0, iteration).tolist())
        if told != iteration:
            raise ReplanError(iteration, "out of step",
                              f"rank 0 decided after iteration {told}, rank {self.rank} is after {iteration}; every "
                              f"rank must run the same batches (wrap each rank's data in agree_on_end)")
        if what == _FAILED:
            raise ReplanError(iteration, "failed on rank 0", "rank 0's search raised (see rank 0's log)")
        return what
