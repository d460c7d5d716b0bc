"""GPipe and 1F1B written twice agree: as plans (swpipe.gpipe + the plan simulator) and as PyTorch's actions (pp).

The plan path runs :func:`swpipe.gpipe.schedule.step_plan` through :func:`autosched.model.simulate.simulate`
and reads its activation peaks with :func:`swpipe.gpipe.predict.activation_peaks`; the PP path runs
``pp_program("GPipe" / "1F1B")`` through :func:`autosched.pp.pp_simulate`. On the same costs (a stage's
forward, loss and backward; a transfer's time as the plan's copy task) both give the same step time and the
same peak bytes per partition (= rank): the activations (the plan does not hold the runtime's send buffers, so
the PP path lets a sent output go once its transfer lands).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import List, Optional, Sequence, Tuple

import pytest

from autosched.model.costs import CostModel, TaskCost
from autosched.model.simulate import simulate
from autosched.pp import P2PCost, PPCosts, StageCost, pp_program
from autosched.pp.simulate import pp_simulate  # the simulator itself (autosched.pp.pp_simulate warns: its verb is simulate)
from swpipe.gpipe.predict import activation_peaks
from swpipe.gpipe.schedule import Placement, step_plan, task_partition

# unequal stages: a slow first forward, a slow last backward, and stages whose activations and outputs differ
FORWARD = (1.0, 2.5, 0.5, 1.5)
BACKWARD = (2.0, 0.5, 4.0, 3.0)
LOSS = 0.25
SAVED = (1000, 5000, 300, 2000)
OUTPUT = (100, 700, 40, 0)
LINKS = {"no transfer cost": None, "latency and bandwidth": P2PCost(latency_s=0.3, seconds_per_byte=0.002),
         "slow link": P2PCost(latency_s=4.0)}
# PyTorch's 1F1B needs at least as many micro-batches as stages
CASES = [(kind, n, m) for kind, n, m in itertools.product(("gpipe", "1f1b"), (2, 3, 4), (1, 2, 3, 4, 8))
         if kind == "gpipe" or m >= n]


def _plan_path(kind: str, n: int, m: int, p2p: Optional[P2PCost]) -> Tuple[float, List[float]]:
    """The step through swpipe.gpipe's plan: a thread per partition, a copy task per crossing when a link costs."""
    # partitions on distinct devices have copy tasks (C<j> forward, G<j> backward); on one device none
    places = [Placement(f"cpu:{j}" if p2p else "cpu", f"p{j}") for j in range(n)]
    plan = step_plan(places, kind, m)
    seconds = {"F": lambda j: FORWARD[j] + (LOSS if j == n - 1 else 0.0), "B": lambda j: BACKWARD[j],
               "C": lambda j: p2p.seconds(OUTPUT[j - 1]), "G": lambda j: p2p.seconds(OUTPUT[j])}
    tasks = {}
    for name in plan.task_names:
        k, j = task_partition(name)
        tasks[name] = TaskCost(seconds[k](j))
    sim = simulate(plan, CostModel(tasks), num_iterations=m, lengthen=False)
    _, by = activation_peaks(sim.events, SAVED[:n])
    return sim.makespan, by


def _pp_path(kind: str, n: int, m: int, p2p: Optional[P2PCost]) -> Tuple[float, List[float]]:
    stages = tuple(StageCost(FORWARD[j], BACKWARD[j], loss_s=LOSS if j == n - 1 else 0.0,
                             activation_bytes=SAVED[j], output_bytes=OUTPUT[j] if j < n - 1 else 0)
                   for j in range(n))
    program = pp_program({"gpipe": "GPipe", "1f1b": "1F1B"}[kind], n, m)
    # the plan counts activations, not the runtime's send buffers: a sent output goes once its transfer lands
    # (PyTorch's loops hold some longer: tests/test_pp.py)
    program = dataclasses.replace(program, send_retention="transfer")
    result = pp_simulate(program, PPCosts(stages, p2p or P2PCost()))
    return result.step_s, [result.peak_bytes[r] for r in range(n)]


@pytest.mark.parametrize("link", list(LINKS))
@pytest.mark.parametrize("kind,n,m", CASES)
def test_gpipe_and_1f1b_predict_the_same_step_as_plans_and_as_pytorch_actions(kind: str, n: int, m: int,
                                                                                link: str) -> None:
    plan_step, plan_peaks = _plan_path(kind, n, m, LINKS[link])
    pp_step, pp_peaks = _pp_path(kind, n, m, LINKS[link])
    assert plan_step == pytest.approx(pp_step, rel=1e-12, abs=1e-12)
    assert plan_peaks == pp_peaks


def _peaks(kind: str, n: int, m: int) -> Sequence[float]:
    return _pp_path(kind, n, m, None)[1]


def test_the_agreement_is_not_vacuous_gpipe_holds_every_microbatch_1f1b_at_most_n_minus_rank() -> None:
    # both paths agree above; here what they agree on: GPipe keeps all m micro-batches, 1F1B n - rank of them
    assert _peaks("gpipe", 3, 8) == [8 * s for s in SAVED[:3]]
    assert _peaks("1f1b", 3, 8) == [(3 - r) * SAVED[r] for r in range(3)]
