"""``schedule_for``: the PyTorch schedule object that runs a program.

PyTorch's own class for one of its schedules; for any other order a ``_PipelineScheduleRuntime`` that runs the
program's lowered order as it stands (each receive deferred to just before its use). Then, on two gloo ranks
(spawned, a ``FileStore``, a hard deadline), the same model trained by ``Schedule1F1B`` and by the custom path
running 1F1B's order, GPipe's order, and Interleaved1F1B's and ZBVZeroBubble's orders over four stages (in a loop;
in a V, with I and W split) gives the same losses.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Dict, List

import pytest

from autosched.pp.program import DEFER_RECV, PPError, program_from_order, pp_program, schedule_for
from conftest import rank_results, ranks_that_ended, spawned_ranks


class _Shape:
    """What a schedule's constructor and schedule_for read of a stage."""

    submod = None

    def __init__(self, index: int, n_stages: int, rank: int, n_ranks: int) -> None:
        self.stage_index, self.num_stages, self.group_rank, self.group_size = index, n_stages, rank, n_ranks


def _stages(program: Any, rank: int) -> List[_Shape]:
    return [_Shape(s, program.n_stages, rank, program.n_ranks) for s in program.rank_stages(rank)]


@pytest.mark.parametrize("name, cls", [("1F1B", "Schedule1F1B"), ("GPipe", "ScheduleGPipe"),
                                       ("Interleaved1F1B", "ScheduleInterleaved1F1B"),
                                       ("ZBVZeroBubble", "ScheduleZBVZeroBubble")])
def test_a_builtin_program_gets_pytorchs_own_class(name: str, cls: str) -> None:
    program = pp_program(name, 2, 4)
    schedule = schedule_for(program, _stages(program, 1), lambda out, target: out.sum())
    assert type(schedule).__name__ == cls


@pytest.mark.parametrize("name", ["1F1B", "GPipe", "Interleaved1F1B", "ZBVZeroBubble"])
def test_a_custom_program_runs_its_own_lowered_order(name: str) -> None:
    order = pp_program(name, 2, 4)
    program = program_from_order(order.compute, 4, order.stage_to_rank, schedule="mine")
    assert program.source == "swpipe"
    for rank in range(2):
        schedule = schedule_for(program, _stages(program, rank), lambda out, target: out.sum(), n_microbatches=4)
        assert type(schedule).__name__ == "_PipelineScheduleRuntime"
        runs = {r: tuple(str(a) for a in acts) for r, acts in schedule.pipeline_order_with_comms.items()}
        assert runs == dict(program.lowered)
        assert [str(a) for a in schedule.pipeline_order[rank]] == list(program.compute[rank])


def test_the_custom_lowering_posts_each_receive_just_before_its_use() -> None:
    order = pp_program("1F1B", 2, 4)
    deferred = program_from_order(order.compute, 4, order.stage_to_rank)
    early = program_from_order(order.compute, 4, order.stage_to_rank, defer_recv=False)
    assert DEFER_RECV
    assert deferred.compute == early.compute == order.compute
    assert sorted(deferred.lowered[1]) == sorted(early.lowered[1])  # the same actions, receives moved
    # rank 1: PyTorch's default posts 1RECV_F1 before 1B0; deferred, after it (just before 1F1)
    assert early.lowered[1].index("1RECV_F1") < early.lowered[1].index("1B0")
    assert deferred.lowered[1].index("1RECV_F1") == deferred.lowered[1].index("1F1") - 1


def test_wrong_stages_or_micro_batches_are_refused() -> None:
    program = pp_program("Interleaved1F1B", 2, 4)
    with pytest.raises(PPError) as err:
        schedule_for(program, _stages(program, 0)[:1], lambda out, target: out.sum())
    assert err.value.field == "stages" and "(0, 2)" in str(err.value)
    with pytest.raises(PPError) as err:
        schedule_for(program, _stages(program, 0), lambda out, target: out.sum(), n_microbatches=8)
    assert err.value.field == "n_microbatches"


# -- two gloo ranks ------------------------------------------------------------------------------------------------

N_MB, STEPS, DEADLINE_S = 4, 3, 180.0
RUNS = {"builtin 1F1B": ("1F1B", False), "custom 1F1B": ("1F1B", True), "custom GPipe": ("GPipe", True),
        "custom Interleaved1F1B": ("Interleaved1F1B", True), "custom ZBVZeroBubble": ("ZBVZeroBubble", True)}


def _train(rank: int, name: str, custom: bool) -> List[float]:
    import torch
    from torch.distributed.pipelining import PipelineStage

    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()) for _ in range(4)]
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
    builtin = pp_program(name, 2, N_MB)
    program = program_from_order(builtin.compute, N_MB, builtin.stage_to_rank, name) if custom else builtin
    per = 4 // program.n_stages
    modules = [torch.nn.Sequential(*blocks[s * per:(s + 1) * per]) for s in range(program.n_stages)]
    mine = program.rank_stages(rank)
    stages = [PipelineStage(modules[s], s, program.n_stages, torch.device("cpu")) for s in mine]
    schedule = schedule_for(program, stages, torch.nn.functional.mse_loss, N_MB)
    opt = torch.optim.SGD([p for s in mine for p in modules[s].parameters()], lr=0.1)
    last = program.n_stages - 1 in mine
    out = []
    for _ in range(STEPS):
        opt.zero_grad()
        losses: List[Any] = []
        schedule.step(*((x,) if 0 in mine else ()), **({"target": y} if last else {}),
                      losses=losses if last else None)
        opt.step()
        if last:
            out.append(float(sum(float(v.detach()) for v in losses) / N_MB))
    return out


def _rank_main(rank: int, store: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    with rank_results(out_dir, rank) as results:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                                timeout=timedelta(seconds=60))
        for label, (name, custom) in RUNS.items():
            results[label] = _train(rank, name, custom)
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks() -> Dict[str, Any]:
    return spawned_ranks(_rank_main, deadline_s=DEADLINE_S)


@pytest.mark.slow
@pytest.mark.timeout(int(DEADLINE_S) + 60)
def test_every_path_trains_like_schedule1f1b_on_two_ranks(two_ranks: Dict[str, Any]) -> None:
    ranks = ranks_that_ended(two_ranks)
    # the losses are on the last stage's rank: rank 1 in a loop, rank 0 in a V (stage 3 back on rank 0)
    losses = {label: next(res[label] for res in ranks if res[label]) for label in RUNS}
    assert ranks[1]["builtin 1F1B"] and ranks[0]["custom ZBVZeroBubble"]
    reference = losses["builtin 1F1B"]
    assert len(reference) == STEPS and reference[0] > reference[-1]  # it trains
    for label in RUNS:
        assert losses[label] == pytest.approx(reference, rel=1e-6), label


def test_receives_out_of_a_peers_send_order_are_refused_and_the_custom_lowering_keeps_the_order() -> None:
    """gloo matches a pair's operations in posting order. PyTorch's deferred receives can break that order where
    two ranks exchange forwards and backwards both (ZBV's V): the validator refuses such steps, and a custom
    order's lowering falls back to PyTorch's default there, which keeps it."""
    from dataclasses import replace

    from autosched.pp.program import PPScheduleError, transfer_order_mismatch, validate_program

    zbv = pp_program("ZBVZeroBubble", 2, 4)
    mine = list(zbv.steps[1])
    assert mine[6] == ("post", ("1RECV_F2",)) and mine[11] == ("post", ("2RECV_B0",))
    mine[6], mine[11] = mine[11], mine[6]  # each still posted before it is waited for (steps 15 and 12)
    swapped = replace(zbv, steps={0: zbv.steps[0], 1: tuple(mine)})
    assert transfer_order_mismatch(swapped.steps, zbv.stage_to_rank) == (
        1, "2RECV_B0", 6, "it is receive 2 from rank 0, whose send 2 to it carries F of stage 0, micro-batch 2")
    with pytest.raises(PPScheduleError) as err:
        validate_program(swapped)
    assert (err.value.rule, err.value.rank, err.value.action, err.value.step) == ("transfer_order", 1, "2RECV_B0", 6)
    custom = program_from_order(zbv.compute, 4, zbv.stage_to_rank)
    assert custom.lowered == zbv.lowered  # PyTorch's default lowering, as ScheduleZBVZeroBubble runs it
    one = pp_program("1F1B", 2, 4)
    assert program_from_order(one.compute, 4, one.stage_to_rank).lowered != program_from_order(
        one.compute, 4, one.stage_to_rank, defer_recv=False).lowered  # deferred where the order allows
