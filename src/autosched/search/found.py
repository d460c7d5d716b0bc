"""What a searcher found: the one result type the beam search, CP-SAT and the seed plans all return.

:class:`Found` holds the plan, the simulator's figures for it and how it was found (the searcher's status,
CP-SAT's model period and proof, what was tried, the candidates for verification); :class:`Timetable` is a
searcher's model of one period in integer time units, from which the plan's stages were read;
:class:`Candidate` is one point of the beam's search space and :class:`Scored` that candidate with its derived
stages and scores (the beam's best is CP-SAT's hint). The searchers' modules all build on these types.
:func:`autosched.search.searchers.run_searchers` keeps the best of them and
:func:`autosched.search.assess.assess` turns it into the :class:`~autosched.search.report.SearchReport`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from swpipe_core.plan import PipelinePlan, stream_name

__all__ = ["Found", "Timetable", "Scorer", "Candidate", "Scored"]

#: ``plan -> (period_s, latency_s)``: how a searcher's plans are scored (the simulator, :func:`sim_scorer`)
Scorer = Callable[[PipelinePlan], Tuple[float, float]]


@dataclass
class Timetable:
    """A searcher's model of one period in integer time units (``Problem.unit_s`` seconds each).

    Every task ``t`` of iteration ``i`` starts at ``i * ii + start[t]``, with ``start[t] = ii * stage[t] +
    offset[t]`` and ``0 <= offset[t] < ii``: the stage map is read off the timetable.
    """

    ii: int
    start: Dict[str, int]
    stage: Dict[str, int]
    offset: Dict[str, int]


@dataclass(frozen=True)
class Candidate:
    """One point of the search space (stages are derived, not searched)."""

    group: Tuple[str, ...]      # thread-group label per task, in problem.names order
    stream: Tuple[Any, ...]     # stream per task, in problem.names order
    priority: Tuple[str, ...]   # fire order: a topological order of the intra DAG
    origin: str = field(default="", compare=False)
    near: Optional[int] = field(default=None, compare=False)   # the parent's period, a bisection hint
    # the caller's thread runs this task's group (its first task in problem.names order; None: every group has a
    # worker), and hands the other groups' tasks off after ``handoff`` (None: where the timetable starts them)
    inline: Optional[str] = None
    handoff: Optional[str] = None

    def key(self) -> tuple:
        return (self.group, tuple(stream_name(s) for s in self.stream), self.priority, self.inline, self.handoff)


@dataclass
class Scored:
    """A candidate with its derived stages and its scores.

    ``ii``/``span`` (time units) come from the modulo timetable and rank
    candidates cheaply; ``period``/``latency`` (seconds) are the simulator's
    and are set once the candidate is simulated (``plan`` is built then).
    """

    cand: Candidate
    ii: int                      # period of the modulo timetable, in time units (0: stages not derived)
    stage: Dict[str, int]
    offset: Dict[str, int]
    span: int = 0                # one iteration's length in the timetable, time units
    plan: Optional[PipelinePlan] = None
    period: float = math.inf     # simulated steady-state period, seconds
    latency: float = math.inf

    @property
    def simulated(self) -> bool:
        return math.isfinite(self.period)

    @property
    def depth(self) -> int:
        return max(self.stage.values()) + 1 if self.stage else 1

    @property
    def threads(self) -> int:
        """Worker threads the plan starts: its groups, less the one on the caller's thread."""
        return len(set(self.cand.group)) - (self.cand.inline is not None)

    def rank(self, unit: float) -> tuple:
        """Simulated rank: period, then depth (memory), latency, worker threads, a late hand-off last."""
        return (round(self.period / unit, 3), self.depth, round(self.latency / unit, 3), self.threads,
                self.cand.handoff is not None)

    def proxy_rank(self) -> tuple:
        """Timetable rank, before simulation (a late hand-off, which the timetable does not see, last)."""
        return (self.ii, self.depth, self.span, self.threads, self.cand.handoff is not None)

    def timetable(self) -> Optional[Timetable]:
        """The modulo timetable the stages were read from (None for stages given, not derived)."""
        if not self.ii:
            return None
        start = {t: self.ii * s + self.offset[t] for t, s in self.stage.items()}
        return Timetable(self.ii, start, dict(self.stage), dict(self.offset))


@dataclass
class Found:
    """What a searcher found: its plan, the simulator's figures for it, and how it was found.

    Attributes
    ----------
    plan : PipelinePlan or None
        The best plan (None: the searcher found none in time).
    period, latency : float
        The plan's simulated steady-state period and one iteration's latency, seconds (``inf`` without a plan).
    method : str
        Which searcher's plan it is: ``"beam"``, ``"cpsat"``, or a seed's label (``"seed:<label>"``).
    scorer : callable, optional
        ``plan -> (period, latency)``: the simulator that scored it (the search's machine model).
    status : str
        ``OPTIMAL`` (CP-SAT proved its model's minimum period and the simulated plan reaches it), ``FEASIBLE``
        (CP-SAT found a plan but the proof did not close: out of time, or the simulated plan runs slower than the
        model's minimum), ``HEURISTIC`` (the beam search or a seed alone) or ``UNKNOWN`` (CP-SAT found no plan).
    timetable : Timetable, optional
        The searcher's model of one period for the plan (the beam's modulo timetable, CP-SAT's solution).
    model_period : float, optional
        CP-SAT's period in its model, seconds.
    model_optimal : bool
        CP-SAT proved ``model_period`` its model's minimum (every shorter period infeasible).
    bound : float, optional
        A period proven to be a lower bound by CP-SAT (every shorter one infeasible in its model), seconds.
    depth_proven : bool
        CP-SAT proved no shallower plan reaches the period.
    solver_time : float
        CP-SAT's solve time, seconds.
    stopped : str
        Why the beam search stopped: ``"rounds"``, ``"patience"`` or ``"time limit"``.
    solves : list of (int, str)
        CP-SAT: each period tried (time units) and the solver's status for it.
    tried : dict
        Counts of what was tried, by name (``"beam candidates"``, ``"CP-SAT solves"``, ...).
    notes : list of str
        What the searchers say about their plans.
    pool : list of (str, PipelinePlan)
        The labelled candidates the verification measures (the searchers' bests, the seeds).
    candidate : Scored, optional
        The beam's candidate behind the plan (its thread-map labels and timetable): CP-SAT's hint.
    """

    plan: Optional[PipelinePlan]
    period: float = math.inf
    latency: float = math.inf
    method: str = ""
    scorer: Optional[Scorer] = None
    status: str = "HEURISTIC"
    timetable: Optional[Timetable] = None
    model_period: Optional[float] = None
    model_optimal: bool = False
    bound: Optional[float] = None
    depth_proven: bool = False
    solver_time: float = 0.0
    stopped: str = ""
    solves: List[Tuple[int, str]] = field(default_factory=list)
    tried: Dict[str, int] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    pool: List[Tuple[str, PipelinePlan]] = field(default_factory=list)
    candidate: Optional[Scored] = None
