"""``SearchReport``: what ``auto_schedule`` found, how good it is and why, as figures, a summary and plain words."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from swpipe_core.plan import PipelinePlan

from autosched.model.memory import format_bytes
from autosched.search.tradeoff import MemoryTradeoff, tradeoff_plot, tradeoff_table

if TYPE_CHECKING:  # the verification's and the recorder's types, for the annotations only
    from matplotlib.figure import Figure
    from swpipe_core.dataflow import InferredDeps

    from autosched.verify.measure import PlanMeasurement, VerifyTable

__all__ = ["SearchReport", "Reasons", "SearchRun", "fmt_ms"]


@dataclass
class Reasons:
    """Why the plan is what it is: what sets the lower bound, why its depth, how busy each resource is, what-ifs.

    Attributes
    ----------
    bound_binding : str
        What sets ``SearchReport.lower_bound_s`` (a resource, a cycle, CP-SAT's proof).
    depth_reason : str
        Why the plan keeps this many iterations in flight (a quick search one iteration shallower).
    max_depth : int
        The deepest plan the search was allowed (``Constraints.max_depth``).
    utilisation : dict
        How busy each resource is in the simulated steady state, ``{resource: share of the period}``.
    what_if : list of (str, float)
        Simulated periods of the same plan after a change of costs: ``(what changed, period_s)``.
    """

    bound_binding: str
    depth_reason: str
    max_depth: int
    utilisation: Dict[str, float] = field(default_factory=dict)
    what_if: List[Tuple[str, float]] = field(default_factory=list)


@dataclass
class SearchRun:
    """How the search ran: its time, what each searcher tried, and CP-SAT's model period and proof.

    Attributes
    ----------
    time_s : float
        The search's wall time (the verification's runs not included).
    tried : dict
        Counts of what was tried, by name (``"beam candidates"``, ``"CP-SAT solves"``, ...).
    model_period_s : float or None
        CP-SAT's period in its model (None: CP-SAT did not run or found nothing).
    model_optimal : bool
        CP-SAT proved ``model_period_s`` its model's minimum; False: it ran out of time first.
    proven_bound_s : float or None
        The largest period CP-SAT proved a lower bound in its model (every shorter one infeasible).
    solver_time_s : float
        CP-SAT's solve time.
    """

    time_s: float
    tried: Dict[str, int] = field(default_factory=dict)
    model_period_s: Optional[float] = None
    model_optimal: bool = False
    proven_bound_s: Optional[float] = None
    solver_time_s: float = 0.0


@dataclass
class SearchReport:
    """What ``auto_schedule`` found, how good it is, and why.

    Print it (``str(report)``) for the summary, the schedule table and the stage analysis; :meth:`explain` says it
    in words. Times are seconds.

    The model's figures (``period_s``, ``latency_s``, ``binding``, ``lower_bound_s``, ``serial_period_s``) are the
    simulator's, for the search's machine model. What the engine measured is in :attr:`measured_period_s` (the
    chosen plan's measured period) and ``verify`` (every plan measured, side by side), when ``auto_schedule`` ran
    the candidates on ``batches``.

    Attributes
    ----------
    plan : PipelinePlan
        The plan returned (validated; its ``enqueue_order`` written out).
    period_s, latency_s : float
        The plan's simulated steady-state period and one iteration's latency (the model's, not measured).
    lower_bound_s : float
        A period no plan with these costs and constraints can beat in the model (``why.bound_binding`` says
        what sets it); :attr:`gap_pct` is how far the plan is above it.
    binding : str
        What limits the plan in the simulation.
    status : str
        What is proven about the plan, in the model:

        * ``OPTIMAL``: no plan is faster. Either its simulated period equals the lower bound (whichever searcher
          found it), or CP-SAT proved its model's minimum period and the simulated plan reaches it.
        * ``FEASIBLE``: CP-SAT ran and found plans, but the proof did not close: it ran out of time before
          proving its model's minimum (``search.proven_bound_s`` below ``search.model_period_s``), or it proved
          it and the simulated plan runs slower than that minimum (the model approximates the simulator, e.g.
          CUDA streams). The summary's CP-SAT line says which.
        * ``HEURISTIC``: the beam search (or a seed plan) alone, above the lower bound.
    method : str
        Which searcher's plan it is: ``"beam"``, ``"cpsat"``, a seed's label (``"seed:<label>"``), then
        ``"+verify"`` when measurement chose another plan and ``"+refit"`` when a second search did.
    device : str
        The semantics searched (``Constraints.device``).
    serial_period_s : float
        The serial plan's simulated period (every task one after the other).
    baseline_period_s : float or None
        The input plan's simulated period, when the input was a plan.
    peak_bytes : float or None
        The plan's predicted peak bytes in flight (when the cost model has memory figures).
    min_memory_bytes : float or None
        The least memory any plan needs (one iteration's own high-water mark).
    notes : list of str
        What the search says about its choice (the machine model, seeds, repairs, ...).
    why : Reasons
        Why the plan is what it is: ``bound_binding``, ``depth_reason``, ``max_depth``, ``utilisation``,
        ``what_if``.
    search : SearchRun
        How the search ran: ``time_s``, ``tried``, CP-SAT's ``model_period_s``, ``proven_bound_s`` and
        ``solver_time_s``, and whether CP-SAT proved its model period minimal (``model_optimal``).
    tradeoff : MemoryTradeoff or None
        Under ``Constraints(max_memory_bytes=...)``: the cap and the best plan per depth cap
        (:meth:`tradeoff_table`, :meth:`plot_tradeoff`).
    verify : VerifyTable or None
        Every plan measured on the engine, side by side (:class:`autosched.verify.measure.VerifyTable`), when
        the candidates were verified; :attr:`measured` is the chosen plan's row.
    iterations_run : int
        Iterations of your tasks the call ran (the verification's runs).
    state_restored : bool
        ``state=`` was given and restored after those runs.
    inferred : InferredDeps or None
        The dependencies searched, when the input was :func:`swpipe.infer_plan`'s result.

    Examples
    --------
    >>> from swpipe import Constraints, CostModel, SolverOptions, TaskCost, auto_schedule
    >>> costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    >>> _, report = auto_schedule((["Load", "Step"], [("Step", "Load")]), costs, Constraints(max_depth=2),
    ...                           solver=SolverOptions(time_limit_s=10))
    >>> print(report.summary().splitlines()[0])
    auto_schedule (cpsat, model OPTIMAL, device=cpu): simulated period 3.000 ms, latency 6.000 ms - NOT VERIFIED
    >>> report.measured_period_s is None   # not measured: no batches were given
    True
    >>> print(report.explain().splitlines()[-1])
    What would make it faster: halving Step (the largest task on thread:default): simulated period 2.000 ms (33.3% faster).
    """

    plan: PipelinePlan
    period_s: float
    latency_s: float
    lower_bound_s: float
    binding: str
    status: str
    method: str
    device: str
    serial_period_s: float
    why: Reasons
    search: SearchRun
    baseline_period_s: Optional[float] = None
    peak_bytes: Optional[float] = None
    min_memory_bytes: Optional[float] = None
    notes: List[str] = field(default_factory=list)
    tradeoff: Optional[MemoryTradeoff] = None
    verify: Optional["VerifyTable"] = None
    iterations_run: int = 0
    state_restored: bool = False
    inferred: Optional["InferredDeps"] = None

    @property
    def measured(self) -> Optional["PlanMeasurement"]:
        """The chosen plan's measurement on the engine (its row of ``verify``: periods per round, the prediction),
        or None when the plans were not measured (:class:`autosched.verify.measure.PlanMeasurement`)."""
        return None if self.verify is None else self.verify.choose()

    @property
    def measured_period_s(self) -> Optional[float]:
        """The chosen plan's measured period on the engine (the median over the verification's rounds), or None
        when the plans were not measured (``auto_schedule`` without ``batches``). ``period_s`` is the model's."""
        chosen = self.measured
        return None if chosen is None else chosen.period_s

    @property
    def gap_pct(self) -> float:
        """``100 * (period_s / lower_bound_s - 1)``: how far above the lower bound the plan is, in the model."""
        bound = min(self.lower_bound_s, self.period_s)
        return 100.0 * (self.period_s / bound - 1.0) if bound > 0 else 0.0

    @property
    def depth(self) -> int:
        """Iterations the plan keeps in flight (``plan.pipeline_depth``)."""
        return self.plan.pipeline_depth

    @property
    def threads(self) -> int:
        """The plan's thread groups (the caller's group included)."""
        return len(self.plan.thread_groups)

    def tradeoff_table(self) -> str:
        """The period-vs-memory trade-off across depth caps (searched under ``max_memory_bytes``; else empty)."""
        if self.tradeoff is None:
            return ""
        return tradeoff_table(self.tradeoff.points, self.tradeoff.cap_bytes)

    def plot_tradeoff(self, path: Optional[str] = None) -> "Figure":
        """Peak bytes against period per depth cap with the Pareto front and the cap (matplotlib figure)."""
        points, cap = (self.tradeoff.points, self.tradeoff.cap_bytes) if self.tradeoff is not None else ([], None)
        return tradeoff_plot(points, cap, path)

    def _machine_model(self) -> str:
        folded = [n for n in self.notes if n.startswith("searched with the machine calibration")]
        return folded[0] if folded else "searched with the cost model as given (no machine calibration)"

    def _headline(self) -> List[str]:
        """The first lines: measured figures when verified, else the simulated ones marked unverified."""
        chosen = self.measured
        if chosen is None:
            return [f"auto_schedule ({self.method}, model {self.status}, device={self.device}): simulated period "
                    f"{fmt_ms(self.period_s)}, latency {fmt_ms(self.latency_s)} - NOT VERIFIED",
                    f"  {self._machine_model()}; pass batches=[...] to measure the candidates on the engine",
                    f"  serial {fmt_ms(self.serial_period_s)} simulated -> "
                    f"x{self.serial_period_s / max(self.period_s, 1e-30):.2f}"]
        table = self.verify
        serial = table["serial"].period_s if "serial" in table else None
        speedup = f", x{serial / chosen.period_s:.2f} the serial loop measured in the same rounds" if serial else ""
        return [f"auto_schedule ({self.method}, device={self.device}): measured period {fmt_ms(chosen.period_s)}{speedup} "
                f"({chosen.label}, {table.verdict()})",
                f"  simulated period {fmt_ms(self.period_s)} (model {self.status}), latency {fmt_ms(self.latency_s)}"]

    def _against_input(self) -> Optional[str]:
        """How the result compares with the input plan: measured when both were measured."""
        table, chosen = self.verify, self.measured
        if table is not None and "input" in table:
            given = table["input"]
            if chosen is given:
                return f"  input plan {fmt_ms(given.period_s)} measured: kept (nothing measured beats it)"
            if table.beats(chosen, given):
                return (f"  input plan {fmt_ms(given.period_s)} measured -> "
                        f"{100 * (1 - chosen.period_s / given.period_s):.1f}% faster (measured)")
            return (f"  input plan {fmt_ms(given.period_s)} measured: no measurable difference (within the noise band "
                    f"+-{table.noise_pct:.1f}%)")
        if self.baseline_period_s is None or self.baseline_period_s <= 0:
            return None
        gain = 100 * (1 - self.period_s / self.baseline_period_s)
        word = "faster" if gain >= 0 else "slower"
        return f"  input plan {fmt_ms(self.baseline_period_s)} simulated -> {abs(gain):.1f}% {word} (simulated)"

    def summary(self) -> str:
        """A few lines: the period (measured when verified), what binds, bound and gap, depth, what was tried."""
        lines = self._headline() + [
            f"  binding (model): {self.binding}",
            f"  lower bound {fmt_ms(self.lower_bound_s)} ({self.why.bound_binding}); model gap {self.gap_pct:.1f}%",
        ]
        against = self._against_input()
        if against:
            lines.append(against)
        lines.append(f"  depth {self.depth} of max {self.why.max_depth}: {self.why.depth_reason}")
        caller = self.plan.caller_group
        inline = f" ({caller} on the caller's thread)" if caller in self.plan.thread_groups else " (each with a worker)"
        lines.append(f"  thread groups {self.threads}{inline}")
        cpsat = self._cpsat_line()
        if cpsat:
            lines.append(cpsat)
        tried = ", ".join(f"{k} {v}" for k, v in self.search.tried.items() if v)
        lines.append(f"  tried: {tried}; search {self.search.time_s:.2f}s")
        if self.iterations_run:
            restored = ("your model was restored afterwards" if self.state_restored else
                        "they trained your model (pass state= to restore it)")
            lines.append(f"  ran your tasks {self.iterations_run} iterations on batches=: {restored}")
        if self.peak_bytes is not None:
            cap = "" if self.tradeoff is None else f" (cap {format_bytes(self.tradeoff.cap_bytes)})"
            least = "" if self.min_memory_bytes is None else f"; any plan needs >= {format_bytes(self.min_memory_bytes)}"
            lines.append(f"  predicted peak bytes in flight {format_bytes(self.peak_bytes)}{cap}{least}")
        if self.tradeoff is not None and self.tradeoff.points:
            lines += ["  " + row for row in self.tradeoff_table().splitlines()]
        lines += [f"  note: {n}" for n in self.notes]
        if self.verify is not None:
            lines.append(self.verify.format(indent="  "))
        return "\n".join(lines)

    def _cpsat_line(self) -> Optional[str]:
        """What CP-SAT proved, in one line (what ``status`` rests on), or None when it found no plan."""
        run = self.search
        if run.model_period_s is None:
            return None
        if not run.model_optimal:
            bound = "" if run.proven_bound_s is None else f" (proven bound {fmt_ms(run.proven_bound_s)})"
            what = f"out of time before proving it minimal{bound}"
        elif self.status == "OPTIMAL" or self.period_s <= run.model_period_s * (1 + 1e-6):
            what = "proven minimal in its model"
        else:
            what = (f"proven minimal in its model, but no plan found reaches it in the simulator (best "
                    f"{fmt_ms(self.period_s)}): the model approximates the engine's {self.device} semantics")
        return f"  CP-SAT: model period {fmt_ms(run.model_period_s)}, {what}; solver {run.solver_time_s:.2f}s"

    def format(self, num_iterations: int = 3) -> str:
        """Summary, schedule table and stage analysis of the plan."""
        return "\n".join([self.summary(), "", _plan_tables(self.plan, num_iterations)])

    def __str__(self) -> str:
        return self.format()

    def explain(self) -> str:
        """Why the plan is fast and what would make it faster, in plain words.

        Returns
        -------
        str
        """
        groups: Dict[str, List[str]] = {}
        for n in self.plan.task_names:
            groups.setdefault(self.plan.sched(n).thread_group, []).append(n)
        members = "; ".join(f"{g}: " + ", ".join(v) for g, v in groups.items())
        chosen = self.measured
        if chosen is not None and "serial" in self.verify:
            serial = self.verify["serial"].period_s
            out = [f"Measured on the engine, this plan finishes one iteration every {fmt_ms(chosen.period_s)}, "
                   f"x{serial / max(chosen.period_s, 1e-30):.2f} the serial loop ({fmt_ms(serial)}) in the same rounds "
                   f"({self.verify.verdict()}); the model predicts {fmt_ms(self.period_s)}."]
        else:
            out = [f"The model predicts this plan finishes one iteration every {fmt_ms(self.period_s)} in steady state, "
                   f"x{self.serial_period_s / max(self.period_s, 1e-30):.2f} the serial loop "
                   f"({fmt_ms(self.serial_period_s)}); not verified (pass batches= to measure it)."]
        if self.depth > 1:
            by_stage: Dict[int, List[str]] = {}
            for n in self.plan.task_names:
                by_stage.setdefault(self.plan.stage(n), []).append(n)
            stages = "; ".join(f"stage {s}: {', '.join(v)}" for s, v in sorted(by_stage.items()))
            out.append(f"It is fast because {self.depth} iterations are in flight ({stages}), so work of different "
                       f"iterations overlaps across {len(groups)} thread group(s) ({members}). "
                       f"Depth {self.depth}: {self.why.depth_reason}.")
        else:
            out.append(f"One iteration is in flight at a time, on {len(groups)} thread group(s) ({members}): "
                       f"{self.why.depth_reason}.")
        out.append(f"What limits it in the model: {self.binding}.")
        if self.gap_pct <= 0.05:
            out.append(f"In the model it reaches the lower bound {fmt_ms(self.lower_bound_s)} ({self.why.bound_binding}): "
                       "no plan with these costs and constraints is faster.")
        else:
            proof = " CP-SAT proved no plan in its model is faster." if self.status == "OPTIMAL" else ""
            out.append(f"In the model it is {self.gap_pct:.1f}% above the lower bound {fmt_ms(self.lower_bound_s)} "
                       f"({self.why.bound_binding}).{proof}")
        limit = self.verify.machine_limit() if self.verify is not None else None
        if limit:
            out.append(limit[0].upper() + limit[1:] + ".")
        for text, period in self.why.what_if:
            gain = 100 * (1 - period / self.period_s) if self.period_s > 0 else 0.0
            out.append(f"What would make it faster: {text}: simulated period {fmt_ms(period)} ({gain:.1f}% faster).")
        if not self.why.what_if:
            out.append("What would make it faster: cheaper tasks on what limits it.")
        return "\n".join(out)


def fmt_ms(seconds: float) -> str:
    """Seconds as milliseconds, three decimals (``0.003`` -> ``3.000 ms``)."""
    return f"{seconds * 1e3:.3f} ms"


def _plan_tables(plan: PipelinePlan, num_iterations: int) -> str:
    from swpipe_core.analysis import format_schedule, format_stage_analysis

    return format_schedule(plan, num_iterations) + "\n\n" + format_stage_analysis(plan)
