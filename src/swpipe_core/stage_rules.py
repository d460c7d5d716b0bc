"""The stage rule: which stages a dependency allows (used by validate and by the searchers).

``T(i)`` waiting for ``D(i - N)`` (``N = 0`` within an iteration) needs that ``D``
to be enqueued no later than ``T``: ``D(i - N)`` runs in period
``i - N + stage(D)`` and ``T(i)`` in ``i + stage(T)``, so
``stage(D) - stage(T) <= N``. See docs/semantics.md ("Rules a plan must satisfy").
"""

from __future__ import annotations

__all__ = ["stage_rule_holds"]


def stage_rule_holds(task_stage: int, dep_stage: int, distance: int = 0) -> bool:
    """Whether a task at ``task_stage`` may wait for a dependency at ``dep_stage`` ``distance`` iterations back.

    Parameters
    ----------
    task_stage, dep_stage : int
        Stages of the waiting task and of its dependency.
    distance : int
        0 for an intra-iteration dependency, ``N >= 1`` for an inter-iteration one.

    Returns
    -------
    bool

    Examples
    --------
    >>> stage_rule_holds(1, 0), stage_rule_holds(0, 1), stage_rule_holds(0, 1, distance=1)
    (True, False, True)
    """
    return dep_stage - task_stage <= distance
