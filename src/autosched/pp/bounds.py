"""Lower bounds on a pipeline-parallel step: no action order on these ranks runs faster.

Three bounds, each true of every schedule of the same stages on the same ranks:

* **rank work**: a rank runs its stages' F, LOSS and backward (B, or I + W) for every
  micro-batch and their REDUCE_GRAD once, one at a time;
* **fill + work + drain**: a rank cannot start before the first micro-batch's forward
  reaches its first stage (the earlier stages' F and the transfers between ranks), then
  does its work; after its last input gradient the earlier stages' backwards still run,
  less the weight gradients (W) it may have deferred past it;
* **last micro-batch**: the first stage issues every forward (``n * F0`` at least), and the
  last micro-batch then still goes forward through every stage and back to the first
  (each later stage's F, the loss, each later stage's I, or B where no I is cheaper, the
  transfers between ranks, then the first stage's backward).

Memory: a rank holds at least one micro-batch of its stage at some point, so its peak is
at least that stage's activation plus the backward's transient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

from autosched.pp.costs import PPCosts, StageCost
from autosched.pp.program import PPError, PPProgram

__all__ = ["PPBounds", "pp_lower_bounds"]


@dataclass(frozen=True)
class PPBounds:
    """Lower bounds on the step and on each rank's peak memory.

    Attributes
    ----------
    value : float
        The largest bound: no schedule of these stages on these ranks has a shorter step.
    binding : str
        Which bound it is (``"rank work: rank 1"``, ``"fill + work + drain: rank 1"``,
        ``"last micro-batch"``).
    components : tuple of (str, float)
        Every bound.
    min_peak_bytes : dict
        Per rank: no schedule peaks lower on it.
    """

    value: float
    binding: str
    components: Tuple[Tuple[str, float], ...]
    min_peak_bytes: Dict[int, int]

    @property
    def period_s(self) -> float:
        """:attr:`value`, the least step (the verbs' common name for a bound's time, :mod:`autosched.results`)."""
        return self.value

    def summary(self) -> str:
        lines = [f"lower bound {self.value * 1e3:.3f} ms/step, binding: {self.binding}"]
        lines += [f"  {name:<24} {v * 1e3:9.3f} ms" for name, v in self.components]
        return "\n".join(lines)


def _backward_s(c: StageCost) -> float:
    """The least a stage's backward of one micro-batch occupies its rank: B, or I + W."""
    split = c.backward_input_s + c.backward_weight_s
    return min(c.backward_s, split) if split > 0 else c.backward_s


def _chain_backward_s(c: StageCost, first: bool) -> float:
    """What must precede the previous stage's backward: the input gradient (I, or B)."""
    if first:
        return _backward_s(c)
    return min(c.backward_s, c.backward_input_s) if c.backward_input_s > 0 else c.backward_s


def pp_lower_bounds(costs: PPCosts, n_microbatches: int, stage_to_rank: Sequence[int]) -> PPBounds:
    """Lower bounds on the step of any schedule of ``costs``' stages on these ranks.

    Parameters
    ----------
    costs : PPCosts
    n_microbatches : int
    stage_to_rank : sequence of int
        Which rank holds each stage (``PPProgram.stage_to_rank``).

    Returns
    -------
    PPBounds

    Examples
    --------
    >>> from swpipe.pp import PPCosts, StageCost
    >>> b = pp_lower_bounds(PPCosts((StageCost(1.0, 2.0),) * 2), 4, (0, 1))
    >>> b.value, b.binding
    (15.0, 'fill + work + drain: rank 1')
    """
    if len(stage_to_rank) != costs.n_stages:
        raise PPError("missing_cost", "costs.stages", costs.n_stages,
                      detail=f"stage_to_rank names {len(stage_to_rank)} stages")
    if n_microbatches < 1:
        raise PPError("bad_value", "n_microbatches", n_microbatches, detail="an integer >= 1")
    n, stages = n_microbatches, costs.stages
    ranks = sorted(set(stage_to_rank))

    def hop(s: int) -> float:  # the transfer after stage s's forward (and before its backward), if it crosses ranks
        if s + 1 >= len(stages) or stage_to_rank[s] == stage_to_rank[s + 1]:
            return 0.0
        return costs.p2p.seconds(stages[s].output_bytes)

    components = []
    for r in ranks:
        mine = [s for s, rr in enumerate(stage_to_rank) if rr == r]
        work = n * sum(stages[s].forward_s + stages[s].loss_s + _backward_s(stages[s]) for s in mine)
        work += sum(stages[s].reduce_grad_s for s in mine)
        head = sum(stages[s].forward_s + hop(s) for s in range(min(mine)))
        drain = sum(_chain_backward_s(stages[s], s == 0) + hop(s) for s in range(min(mine)))
        deferrable = n * sum(stages[s].backward_weight_s for s in mine if stages[s].backward_input_s > 0)
        components.append((f"rank work: rank {r}", work))
        components.append((f"fill + work + drain: rank {r}", head + work + max(0.0, drain - deferrable)))
    last = n * stages[0].forward_s + hop(0)
    last += sum(stages[s].forward_s + hop(s) for s in range(1, len(stages)))
    last += stages[-1].loss_s
    last += sum(_chain_backward_s(stages[s], False) + hop(s - 1) for s in range(len(stages) - 1, 0, -1))
    last += _backward_s(stages[0])
    components.append(("last micro-batch", last))
    name, value = max(components, key=lambda c: c[1])
    min_peak = {}
    for r in ranks:
        mine = [stages[s] for s, rr in enumerate(stage_to_rank) if rr == r]
        min_peak[r] = max(max(c.forward_peak_bytes, c.activation_bytes + min(c.backward_peak_bytes,
                                                                              c.backward_input_peak_bytes or c.backward_peak_bytes))
                          for c in mine)
    return PPBounds(value, name, tuple(components), min_peak)


def program_bounds(program: PPProgram, costs: PPCosts) -> PPBounds:
    """:func:`pp_lower_bounds` for ``program``'s micro-batches and stage placement."""
    return pp_lower_bounds(costs, program.n_microbatches, program.stage_to_rank)
