"""What-if questions on a pipeline-parallel step, and every PyTorch schedule side by side.

:func:`pp_what_if` answers "with 8 micro-batches instead of 4", "with this stage twice as
fast" and "with a 2-GiB cap per rank" for one schedule; :func:`pp_compare` predicts every
PyTorch schedule (and any program given) for the same model, marking which fit a memory
cap and which is fastest among those.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

from autosched._fields import memory_cap
from autosched.pp.bounds import pp_lower_bounds
from autosched.pp.costs import PPCosts
from autosched.pp.program import PPError, PPProgram, builtin_programs, pp_program
from autosched.pp.simulate import PPSimResult, pp_simulate
from autosched.results import fastest, pp_preference

__all__ = ["PPWhatIf", "pp_what_if", "PPRow", "PPComparison", "pp_compare"]


@dataclass(frozen=True)
class PPWhatIf:
    """A schedule predicted before and after a change.

    Attributes
    ----------
    change : str
        What changed, in words.
    before, after : PPSimResult
    before_bound_s, after_bound_s : float
        :func:`~autosched.pp.bounds.pp_lower_bounds` of each.
    max_memory_bytes : float or None
        The cap per rank (``memory_cap_bytes``, its old name, still reads it and warns).
    """

    change: str
    before: PPSimResult
    after: PPSimResult
    before_bound_s: float
    after_bound_s: float
    max_memory_bytes: Optional[float] = None

    @property
    def memory_cap_bytes(self) -> Optional[float]:
        """Deprecated: :attr:`max_memory_bytes` (one name for a memory cap); warns with ``FutureWarning``."""
        warnings.warn("PPWhatIf.memory_cap_bytes is renamed max_memory_bytes; read .max_memory_bytes", FutureWarning,
                      stacklevel=2)
        return self.max_memory_bytes

    @property
    def speedup(self) -> float:
        """``before.step_s / after.step_s``."""
        return self.before.step_s / self.after.step_s if self.after.step_s > 0 else float("inf")

    @property
    def over_cap_ranks(self) -> Dict[int, int]:
        """After the change, the ranks whose predicted peak exceeds the cap, with that peak."""
        if self.max_memory_bytes is None:
            return {}
        return {r: p for r, p in self.after.peak_bytes.items() if p > self.max_memory_bytes}

    @property
    def fits_cap(self) -> bool:
        return not self.over_cap_ranks

    def summary(self) -> str:
        def line(label: str, res: PPSimResult, bound: float) -> str:
            return (f"  {label:<7} step {res.step_s * 1e3:9.3f} ms (bound {bound * 1e3:.3f}), bubble "
                    f"{max(res.bubble_fraction.values()):.0%}, peak {res.max_peak_bytes / 2**20:.2f} MiB")
        out = [f"{self.before.schedule}: {self.change}", line("before", self.before, self.before_bound_s),
               line("after", self.after, self.after_bound_s), f"  speedup {self.speedup:.2f}x"]
        if self.max_memory_bytes is not None:
            out.append(f"  cap {self.max_memory_bytes / 2**20:.0f} MiB per rank: "
                       + ("fits" if self.fits_cap else f"over on ranks {sorted(self.over_cap_ranks)}"))
        return "\n".join(out)


def pp_what_if(program: PPProgram, costs: PPCosts, *, n_microbatches: Optional[int] = None,
               stage_factors: Optional[Mapping[int, float]] = None, max_memory_bytes: Optional[float] = None,
               same_global_batch: bool = True, memory_cap_bytes: Optional[float] = None,
               cores: Optional[int] = None, device: Optional[str] = None) -> PPWhatIf:
    """``program`` predicted before and after a change of micro-batches, stage speed or memory cap.

    Parameters
    ----------
    program : PPProgram
        One of PyTorch's schedules (:func:`~autosched.pp.program.pp_program`); a searched
        program keeps its micro-batch count.
    costs : PPCosts
    n_microbatches : int, optional
        Run the same schedule with this many micro-batches.
    stage_factors : dict, optional
        ``{stage: factor}`` multiplying that stage's times (``0.5``: twice as fast).
    max_memory_bytes : float, optional
        A cap per rank: the result says which ranks exceed it after the change
        (``memory_cap_bytes``, its old name, is taken for one release with a ``FutureWarning``).
    same_global_batch : bool
        With ``n_microbatches``: keep the batch and shrink the micro-batch, scaling the
        costs by :meth:`PPCosts.rescaled <autosched.pp.costs.PPCosts.rescaled>` (needs
        ``costs.samples_per_microbatch``); ``False`` keeps the micro-batch (a larger batch).
    cores, device : optional
        As :func:`~autosched.pp.simulate.pp_simulate` takes them, for both predictions.

    Raises
    ------
    OptionError
        ``max_memory_bytes`` not a finite number > 0 (the rule of every search's cap).

    Examples
    --------
    >>> from swpipe.pp import PPCosts, StageCost
    >>> costs = PPCosts((StageCost(1.0, 2.0, activation_bytes=100),) * 2, samples_per_microbatch=8)
    >>> w = pp_what_if(pp_program("GPipe", 2, 4), costs, n_microbatches=8, max_memory_bytes=300)
    >>> round(w.after.step_s, 3), w.after.peak_bytes[0], w.fits_cap
    (13.5, 400, False)
    """
    max_memory_bytes = memory_cap("pp_what_if", max_memory_bytes, "memory_cap_bytes", memory_cap_bytes)
    changes = []
    after_costs = costs
    after_program = program
    if stage_factors:
        after_costs = after_costs.with_stage_factor(dict(stage_factors))
        changes.append(", ".join(f"stage {s} x{f:g}" for s, f in sorted(stage_factors.items())))
    if n_microbatches is not None and n_microbatches != program.n_microbatches:
        if program.source != "pytorch":
            raise PPError("bad_value", "n_microbatches", n_microbatches, program.schedule,
                          "a searched program is for its own micro-batch count: search again")
        after_program = pp_program(program.schedule, program.n_ranks, n_microbatches, program.stages_per_rank)
        if same_global_batch:
            batch = costs.samples_per_microbatch * program.n_microbatches
            if batch % n_microbatches:
                raise PPError("bad_value", "n_microbatches", n_microbatches, program.schedule,
                              f"the batch of {batch} samples does not split into {n_microbatches} micro-batches")
            after_costs = after_costs.rescaled(batch // n_microbatches)
            changes.append(f"{n_microbatches} micro-batches of {batch // n_microbatches} instead of "
                           f"{program.n_microbatches}")
        else:
            changes.append(f"{n_microbatches} micro-batches instead of {program.n_microbatches} (a larger batch)")
    if max_memory_bytes is not None:
        changes.append(f"cap {max_memory_bytes:g} bytes per rank")
    before = pp_simulate(program, costs, cores=cores, device=device)
    after = pp_simulate(after_program, after_costs, cores=cores, device=device)
    return PPWhatIf("; ".join(changes) or "no change", before, after,
                    pp_lower_bounds(costs, program.n_microbatches, program.stage_to_rank).value,
                    pp_lower_bounds(after_costs, after_program.n_microbatches, after_program.stage_to_rank).value,
                    max_memory_bytes)


@dataclass(frozen=True)
class PPRow:
    """One schedule predicted: :func:`pp_compare`'s row."""

    schedule: str
    n_microbatches: int
    n_stages: int
    step_s: float
    bound_s: float
    bubble: float
    peak_bytes: int
    fits_cap: bool
    best: bool


@dataclass(frozen=True)
class PPComparison:
    """:func:`pp_compare`'s answer: one row per schedule predicted, and what was left out and why.

    Iterating over it gives the rows (``for row in pp_compare(...)``).

    Attributes
    ----------
    rows : tuple of PPRow
    skipped : dict
        ``{schedule: why}`` for each schedule not predicted: PyTorch refused these sizes, or
        no costs were given for its stage split.
    """

    rows: Tuple[PPRow, ...]
    skipped: Dict[str, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[PPRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> PPRow:
        return self.rows[index]

    @property
    def best(self) -> Optional[PPRow]:
        """The fastest row within the cap (None when none fits)."""
        return next((r for r in self.rows if r.best), None)

    def summary(self) -> str:
        """One line per row, then one per schedule left out."""
        lines = [f"{r.schedule:<22} {r.n_stages:>2} stages {r.step_s * 1e3:9.3f} ms (bound {r.bound_s * 1e3:.3f}), "
                 f"peak {r.peak_bytes / 2**20:.2f} MiB{'' if r.fits_cap else ', over the cap'}"
                 f"{'  <- best' if r.best else ''}" for r in self.rows]
        lines += [f"{name:<22} left out: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def pp_compare(costs: Union[PPCosts, Mapping[int, PPCosts]], n_ranks: int, n_microbatches: int,
               max_memory_bytes: Optional[float] = None, programs: Sequence[PPProgram] = (), *,
               memory_cap_bytes: Optional[float] = None) -> PPComparison:
    """Every PyTorch schedule (and ``programs``) predicted on the same model; the best that fits marked.

    Parameters
    ----------
    costs : PPCosts or dict
        The model's costs for one stage split (a :class:`~autosched.pp.costs.PPCosts`: the
        schedules of that many stages are predicted), or ``{n_stages: PPCosts}`` for each
        split measured (GPipe and 1F1B run ``n_ranks`` stages, the others ``2 * n_ranks``).
        A schedule whose split has no costs is left out, and ``.skipped`` says so.
    n_ranks, n_microbatches : int
    max_memory_bytes : float, optional
        The cap per rank (``memory_cap_bytes``, its old name, is taken for one release with a ``FutureWarning``).
    programs : sequence of PPProgram
        More programs (e.g. searched) to rank beside them.

    Returns
    -------
    PPComparison
        The rows (iterate over it), and ``.skipped``: ``{schedule: why}``.

    Raises
    ------
    PPError
        ``rule="bad_value"``, ``field="costs"`` for costs neither a PPCosts nor a dict of them.
    OptionError
        ``max_memory_bytes`` not a finite number > 0.

    Examples
    --------
    >>> from swpipe.pp import PPCosts, StageCost
    >>> found = pp_compare(PPCosts((StageCost(1.0, 2.0),) * 2), n_ranks=2, n_microbatches=4)
    >>> [(r.schedule, r.step_s) for r in found]
    [('GPipe', 15.0), ('1F1B', 15.0)]
    >>> found.skipped["ZBVZeroBubble"]
    'no costs for its 4 stages (costs given for 2)'
    """
    max_memory_bytes = memory_cap("pp_compare", max_memory_bytes, "memory_cap_bytes", memory_cap_bytes)
    if isinstance(costs, PPCosts):
        by_stages: Dict[int, PPCosts] = {costs.n_stages: costs}
    elif isinstance(costs, Mapping) and all(isinstance(c, PPCosts) for c in costs.values()):
        by_stages = dict(costs)
    else:
        raise PPError("bad_value", "costs", type(costs).__name__,
                      detail="a PPCosts (one stage split) or {n_stages: PPCosts}")
    built, refused = builtin_programs(n_ranks, n_microbatches)
    skipped = {name: f"PyTorch refuses {n_ranks} ranks x {n_microbatches} micro-batches: {why}"
               for name, why in refused.items()}
    given = ", ".join(str(k) for k in sorted(by_stages))
    rows = []
    for p in list(built.values()) + list(programs):
        c = by_stages.get(p.n_stages)
        if c is None:
            skipped[p.schedule] = f"no costs for its {p.n_stages} stages (costs given for {given})"
            continue
        res = pp_simulate(p, c)
        fits = max_memory_bytes is None or res.max_peak_bytes <= max_memory_bytes
        rows.append(PPRow(p.schedule, p.n_microbatches, p.n_stages, res.step_s,
                          pp_lower_bounds(c, p.n_microbatches, p.stage_to_rank).value,
                          max(res.bubble_fraction.values()), res.max_peak_bytes, fits, False))
    fitting = [r for r in rows if r.fits_cap]
    if fitting:
        best = fastest(fitting, lambda r: pp_preference(r.step_s, r.peak_bytes, r.n_stages, r.n_microbatches))
        rows = [PPRow(**{**r.__dict__, "best": r is best}) for r in rows]
    return PPComparison(tuple(rows), skipped)
