"""``SearchReport``: what ``auto_schedule`` found, how good it is and why, as figures, a summary and plain words."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from swpipe_core.plan import PipelinePlan

from autosched.model.memory import format_bytes
from autosched.search.tradeoff import tradeoff_plot, tradeoff_table

__all__ = ["SearchReport", "fmt_ms"]


@dataclass
class SearchReport:
    """What ``auto_schedule`` found, how good it is, and why.

    Times are seconds. ``period_s``/``latency_s`` are simulated (steady state);
    ``binding`` is what the simulator says limits this plan and
    ``utilisation`` how busy each resource is. ``lower_bound_s`` is a period
    no plan in the space can beat (``bound_binding`` says why); ``gap_pct`` =
    ``100 * (period / bound - 1)``. ``status`` is ``OPTIMAL`` when CP-SAT proved
    its model's minimum and the simulated plan reaches it, ``FEASIBLE`` when
    CP-SAT ran out of time, ``HEURISTIC`` for beam search alone. Print it
    (``str(report)``) for the summary, the schedule table and the stage
    analysis; :meth:`explain` says it in words.

    Examples
    --------
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> from autosched.search.entry import auto_schedule
    >>> from autosched.search.options import Constraints, SolverOptions
    >>> costs = CostModel({"Load": TaskCost(0.002), "Step": TaskCost(0.003)})
    >>> _, report = auto_schedule((["Load", "Step"], [("Step", "Load")]), costs, Constraints(max_depth=2),
    ...                           solver=SolverOptions(time_limit_s=10))
    >>> print(report.summary().splitlines()[0])
    auto_schedule (cpsat, model OPTIMAL, device=cpu): simulated period 3.000 ms, latency 6.000 ms - NOT VERIFIED
    >>> print(report.explain().splitlines()[-1])
    What would make it faster: halving Step (the largest task on thread:default): simulated period 2.000 ms (33.3% faster).
    """

    plan: PipelinePlan
    period_s: float
    latency_s: float
    lower_bound_s: float
    gap_pct: float
    binding: str
    bound_binding: str
    depth: int
    max_depth: int
    depth_reason: str
    threads: int
    method: str
    status: str
    model_period_s: Optional[float]
    proven_bound_s: Optional[float]
    solver_time_s: float
    search_time_s: float
    tried: Dict[str, int]
    device: str
    serial_period_s: float
    baseline_period_s: Optional[float] = None
    utilisation: Dict[str, float] = field(default_factory=dict)
    what_if: List[Tuple[str, float]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    # memory (when the cost model has bytes): predicted peak, the least any plan needs, and under a cap
    # the best plan per depth cap (autosched.search.tradeoff.TradeoffPoint)
    peak_bytes: Optional[float] = None
    min_memory_bytes: Optional[float] = None
    max_memory_bytes: Optional[float] = None
    memory_tradeoff: List[Any] = field(default_factory=list)

    verify: Optional[Any] = None  # autosched.verify.measure.VerifyTable when the plans were measured on the engine
    iterations_run: int = 0  # iterations of the user's tasks the call ran (verification, recording)
    state_restored: bool = False  # state= was given and restored after those runs
    inferred: Optional[Any] = None  # deps="infer": the swpipe_core.dataflow.InferredDeps the search used


    def tradeoff_table(self) -> str:
        """The period-vs-memory trade-off across depth caps (searched under ``max_memory_bytes``)."""
        return tradeoff_table(self.memory_tradeoff, self.max_memory_bytes)

    def plot_tradeoff(self, path: Optional[str] = None) -> Any:
        """Peak bytes against period per depth cap with the Pareto front and the cap (matplotlib figure)."""
        return tradeoff_plot(self.memory_tradeoff, self.max_memory_bytes, path)
    @property
    def measured(self) -> Optional[Any]:
        """The chosen plan's measurement on the engine (``verify``'s row), or ``None`` when unverified."""
        return None if self.verify is None else self.verify.choose()

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
            f"  lower bound {fmt_ms(self.lower_bound_s)} ({self.bound_binding}); model gap {self.gap_pct:.1f}%",
        ]
        against = self._against_input()
        if against:
            lines.append(against)
        lines.append(f"  depth {self.depth} of max {self.max_depth}: {self.depth_reason}")
        caller = self.plan.caller_group
        inline = f" ({caller} on the caller's thread)" if caller in self.plan.thread_groups else " (each with a worker)"
        lines.append(f"  thread groups {self.threads}{inline}")
        if self.model_period_s is not None:
            bound = "" if self.proven_bound_s is None else f", proven bound {fmt_ms(self.proven_bound_s)}"
            lines.append(f"  CP-SAT model period {fmt_ms(self.model_period_s)}{bound}, solver {self.solver_time_s:.2f}s")
        tried = ", ".join(f"{k} {v}" for k, v in self.tried.items() if v)
        lines.append(f"  tried: {tried}; search {self.search_time_s:.2f}s")
        if self.iterations_run:
            restored = ("your model was restored afterwards" if self.state_restored else
                        "they trained your model (pass state= to restore it)")
            lines.append(f"  ran your tasks {self.iterations_run} iterations on batches=: {restored}")
        if self.peak_bytes is not None:
            cap = "" if self.max_memory_bytes is None else f" (cap {format_bytes(self.max_memory_bytes)})"
            least = "" if self.min_memory_bytes is None else f"; any plan needs >= {format_bytes(self.min_memory_bytes)}"
            lines.append(f"  predicted peak bytes in flight {format_bytes(self.peak_bytes)}{cap}{least}")
        if self.memory_tradeoff:
            lines += ["  " + row for row in self.tradeoff_table().splitlines()]
        lines += [f"  note: {n}" for n in self.notes]
        if self.verify is not None:
            lines.append(self.verify.format(indent="  "))
        return "\n".join(lines)

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
                       f"Depth {self.depth}: {self.depth_reason}.")
        else:
            out.append(f"One iteration is in flight at a time, on {len(groups)} thread group(s) ({members}): "
                       f"{self.depth_reason}.")
        out.append(f"What limits it in the model: {self.binding}.")
        if self.gap_pct <= 0.05:
            out.append(f"In the model it reaches the lower bound {fmt_ms(self.lower_bound_s)} ({self.bound_binding}): "
                       "no plan with these costs and constraints is faster.")
        else:
            proof = " CP-SAT proved no plan in its model is faster." if self.status == "OPTIMAL" else ""
            out.append(f"In the model it is {self.gap_pct:.1f}% above the lower bound {fmt_ms(self.lower_bound_s)} "
                       f"({self.bound_binding}).{proof}")
        limit = self.verify.machine_limit() if self.verify is not None else None
        if limit:
            out.append(limit[0].upper() + limit[1:] + ".")
        for text, period in self.what_if:
            gain = 100 * (1 - period / self.period_s) if self.period_s > 0 else 0.0
            out.append(f"What would make it faster: {text}: simulated period {fmt_ms(period)} ({gain:.1f}% faster).")
        if not self.what_if:
            out.append("What would make it faster: cheaper tasks on what limits it.")
        return "\n".join(out)


def fmt_ms(seconds: float) -> str:
    """Seconds as milliseconds, three decimals (``0.003`` -> ``3.000 ms``)."""
    return f"{seconds * 1e3:.3f} ms"


def _plan_tables(plan: PipelinePlan, num_iterations: int) -> str:
    from swpipe_core.analysis import format_schedule, format_stage_analysis

    return format_schedule(plan, num_iterations) + "\n\n" + format_stage_analysis(plan)
