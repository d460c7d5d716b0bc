"""What every rank must agree on: folded results, one shared plan, one cost model (the slowest rank's).

All exchanges run on :attr:`DistEnv.control`, a gloo group of its own used
only from the caller's thread (never by a pipeline task), so they cannot
interleave with the pipeline's collectives. Every function here is a
collective: all ranks call it at the same point. With one rank they return
at once without exchanging anything. A plan travels between ranks, and is
compared, in its dict form (:func:`swpipe_core.planfile.plan_to_dict`).

=========================  ================================================================
``gather``                 every rank's picklable object, on every rank
``all_ranks``              a pass/fail folded over ranks (True only if true everywhere)
``from_rank0``             rank 0's object, on every rank (e.g. the searched plan)
``check_same_plan``        raise :class:`PlanMismatchError` unless every rank runs that plan
``slowest_rank_costs``     per task the slowest rank's measured cost (``autosched.model.costs.combine_slowest``)
=========================  ================================================================
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch.distributed as dist

from autosched.model.costs import combine_slowest
from swpipe_core.plan import PipelinePlan
from swpipe_core.planfile import plan_to_dict

from swpipe.workloads.distenv import DistEnv

__all__ = ["gather", "all_ranks", "from_rank0", "check_same_plan", "PlanMismatchError",
           "combine_slowest", "slowest_rank_costs"]


class PlanMismatchError(RuntimeError):
    """Ranks hold different plans: their collectives would be issued in different orders (a hang).

    ``differences`` is ``{rank: [field, ...]}``: the fields of each rank's plan (its dict form's keys,
    :func:`~swpipe_core.planfile.plan_to_dict`) that differ from rank 0's; ``tasks`` is ``{rank: [task, ...]}``:
    the tasks whose schedule differs.
    """

    def __init__(self, message: str, differences: Optional[Dict[int, List[str]]] = None,
                 tasks: Optional[Dict[int, List[str]]] = None) -> None:
        self.differences, self.tasks = dict(differences or {}), dict(tasks or {})
        super().__init__(message)


def gather(env: DistEnv, obj: Any) -> List[Any]:
    """Every rank's ``obj`` (picklable), indexed by rank, on every rank.

    Examples
    --------
    >>> from swpipe.workloads.distenv import init_distributed
    >>> with init_distributed() as env:
    ...     gather(env, {"loss": 0.5})
    [{'loss': 0.5}]
    """
    if env.world_size == 1:
        return [obj]
    out: List[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj, group=env.control)
    return out


def all_ranks(env: DistEnv, flag: bool) -> bool:
    """True only when ``flag`` is true on every rank (a pass/fail folded over the job).

    Examples
    --------
    >>> from swpipe.workloads.distenv import init_distributed
    >>> with init_distributed() as env:
    ...     all_ranks(env, True), all_ranks(env, False)
    (True, False)
    """
    return all(bool(f) for f in gather(env, bool(flag)))


def from_rank0(env: DistEnv, obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (what other ranks pass is ignored).

    Examples
    --------
    >>> from swpipe.workloads.distenv import init_distributed
    >>> with init_distributed() as env:
    ...     from_rank0(env, [1, 2])
    [1, 2]
    """
    if env.world_size == 1:
        return obj
    box = [obj if env.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=env.control)
    return box[0]


def _tasks_differing(a: Dict[str, Any], b: Dict[str, Any]) -> List[str]:
    """The tasks whose schedule differs between two plans' dict forms."""
    mine, theirs = ({t["name"]: t for t in d.get("tasks", [])} for d in (a, b))
    return sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))


def _differences(a: Dict[str, Any], b: Dict[str, Any]) -> List[str]:
    """The fields in which two plans' dict forms (:func:`~swpipe_core.planfile.plan_to_dict`) differ."""
    out = []
    for key in a:
        if key == "tasks" and a[key] != b.get(key):
            tasks = _tasks_differing(a, b)
            out.append(f"schedule of {', '.join(tasks[:5])}{' ...' if len(tasks) > 5 else ''}")
        elif a[key] != b.get(key):
            out.append(key)
    return out


def check_same_plan(env: DistEnv, plan: PipelinePlan, label: str = "plan") -> None:
    """Raise on every rank unless every rank holds the same plan (its dict form, :func:`~swpipe_core.planfile.plan_to_dict`).

    Parameters
    ----------
    env : DistEnv
    plan : PipelinePlan
    label : str
        Named in the error.

    Raises
    ------
    PlanMismatchError
        Naming the ranks and the fields that differ from rank 0's plan.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> from swpipe.workloads.distenv import init_distributed
    >>> with init_distributed() as env:
    ...     check_same_plan(env, PipelinePlan({"A": TaskSchedule(0)}))
    """
    fields = gather(env, plan_to_dict(plan))
    diffs = {r: _differences(fields[0], f) for r, f in enumerate(fields) if r and f != fields[0]}
    if diffs:
        detail = "; ".join(f"rank {r}: {', '.join(d)}" for r, d in diffs.items())
        raise PlanMismatchError(
            f"{label}: ranks hold different plans, so their collectives would run in different orders "
            f"(a hang or wrong results). Differs from rank 0's: {detail}. Fix: build the plan the same way on "
            f"every rank, or search on rank 0 and share it (swpipe.workloads.agree.from_rank0)",
            {r: [k for k in fields[0] if fields[0][k] != fields[r].get(k)] for r in diffs},
            {r: _tasks_differing(fields[0], fields[r]) for r in diffs})


def slowest_rank_costs(env: DistEnv, costs: Any) -> Any:
    """Every rank's measured cost model combined with :func:`~autosched.model.costs.combine_slowest`, on every rank.

    Examples
    --------
    >>> from swpipe import CostModel, TaskCost
    >>> from swpipe.workloads.distenv import init_distributed
    >>> with init_distributed() as env:
    ...     slowest_rank_costs(env, CostModel({"A": TaskCost(0.001)}))["A"].host_s
    0.001
    """
    from autosched.model.costs import CostModel

    docs = gather(env, costs.to_dict())
    return combine_slowest([CostModel.from_dict(d, where=f"rank {r}") for r, d in enumerate(docs)])
