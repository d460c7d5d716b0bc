"""What the pipeline-parallel entries refuse (issue 45 item 4): a schedule the runtime would not run through, costs
that are not numbers, a time limit or cap out of range; and what they say: pp_compare's left-out schedules, a
search cut by its time limit."""

from __future__ import annotations

import math

import pytest

from autosched.pp import (P2PCost, PPCosts, PPError, PPProgram, PPScheduleError, StageCost, builtin_programs,
                          pp_program, program_from_order, read_csv, validate_program)
from autosched.pp.search import pp_search
from autosched.pp.simulate import pp_simulate
from autosched.pp.whatif import pp_compare, pp_what_if
from autosched.search.options import Constraints, SolverOptions
from swpipe_core.engine.options import OptionError


def _costs(n_stages: int) -> PPCosts:
    return PPCosts(tuple(StageCost(1.0, 2.0, 1.0, 1.0, activation_bytes=100, weight_keep_bytes=50, output_bytes=10)
                         for _ in range(n_stages)), P2PCost(0.05), samples_per_microbatch=8)


def _fields(e: PPScheduleError) -> tuple:
    return e.rule, e.rank, e.action, e.step


def _compute_only(compute: dict) -> dict:
    return {r: tuple(("compute", (a,)) for a in acts) for r, acts in compute.items()}


# --- one validator: every action once, every dependency, no deadlock ------------------------------------------------

def test_every_pytorch_schedule_passes_the_validator() -> None:
    for n_ranks, n_mb in [(2, 2), (2, 4), (3, 6), (4, 8)]:
        for p in builtin_programs(n_ranks, n_mb)[0].values():
            assert validate_program(p) is p


def test_an_action_twice_is_refused_by_program_from_order() -> None:
    p = pp_program("1F1B", 2, 2)
    with pytest.raises(PPScheduleError) as e:
        program_from_order({0: ("0F0", "0F1", "0F1", "0B0", "0B1"), 1: p.compute[1]}, 2, (0, 1))
    assert _fields(e.value) == ("duplicate_action", 0, "0F1", 2)
    assert "0F1" in e.value.fix


def test_an_action_twice_in_a_csv_is_refused_on_read(tmp_path) -> None:
    path = tmp_path / "twice.csv"
    path.write_text("0F0,0F1,0B0,0B0,0B1\n1F0,1B0,1F1,1B1\n")  # PyTorch's loader takes it; its runtime fails
    with pytest.raises(PPScheduleError) as e:
        read_csv(str(path), 2, 2, 2)
    assert _fields(e.value) == ("duplicate_action", 0, "0B0", 3)


def test_to_csv_and_the_simulator_refuse_what_the_runtime_would_not_run(tmp_path) -> None:
    p = pp_program("1F1B", 2, 2)
    compute = {0: ("0F0", "0F1", "0B0", "0B1", "0B1"), 1: p.compute[1]}
    broken = PPProgram("hand", 2, 2, 2, (0, 1), compute, _compute_only(compute))
    path = tmp_path / "out.csv"
    with pytest.raises(PPScheduleError) as e:
        broken.to_csv(str(path))
    assert _fields(e.value) == ("duplicate_action", 0, "0B1", 4)
    assert not path.exists()
    with pytest.raises(PPScheduleError) as e:
        pp_simulate(broken, _costs(2))
    assert _fields(e.value) == ("duplicate_action", 0, "0B1", 4)


@pytest.mark.parametrize("compute, expected", [
    ({0: ("0F0", "0B0"), 1: ("1F0",)}, ("missing_action", 1, "1B0", None)),
    ({0: ("0F0", "0B0"), 1: ("1F0", "1I0")}, ("missing_action", 1, "1W0", None)),
    ({0: ("0F0", "0B0"), 1: ("1F0", "1B0", "1W0")}, ("duplicate_action", 1, "1W0", 2)),
    ({0: ("0F0", "0B0", "1F0"), 1: ("1F0", "1B0")}, ("wrong_rank", 0, "1F0", 2)),
    ({0: ("0F0", "0B0"), 1: ("1F1", "1B0")}, ("bad_action", 1, "1F1", 0)),
    ({0: ("0F0", "0B0"), 1: ("1B0", "1F0")}, ("dependency", 1, "1B0", 0)),
])
def test_each_rule_names_rank_action_and_step(compute: dict, expected: tuple) -> None:
    program = PPProgram("hand", 2, 2, 1, (0, 1), compute, _compute_only(compute))
    with pytest.raises(PPScheduleError) as e:
        validate_program(program)
    assert _fields(e.value) == expected


def test_a_cycle_of_waits_across_ranks_is_a_deadlock() -> None:
    # rank 0 runs stage 2's forward before stage 0's: stage 2 waits for stage 1 (rank 1), which waits for stage 0
    compute = {0: ("2F0", "0F0", "2B0", "0B0"), 1: ("1F0", "3F0", "3B0", "1B0")}
    program = PPProgram("hand", 2, 4, 1, (0, 1, 0, 1), compute, _compute_only(compute))
    with pytest.raises(PPScheduleError) as e:
        pp_simulate(program, _costs(4))
    assert _fields(e.value) == ("deadlock", 0, "2F0", 0)


def test_a_step_before_its_input_arrives_is_refused() -> None:
    gpipe = pp_program("GPipe", 2, 1)
    steps = dict(gpipe.steps)
    steps[1] = tuple(s for s in gpipe.steps[1] if s != ("wait", ("1RECV_F0",)))  # computes 1F0 on nothing
    with pytest.raises(PPScheduleError) as e:
        validate_program(PPProgram("hand", 2, 2, 1, (0, 1), gpipe.compute, steps))
    assert _fields(e.value) == ("dependency", 1, "1F0", 1)


# --- costs: numbers, at construction ----------------------------------------------------------------------------------

@pytest.mark.parametrize("make, field, value", [
    (lambda: StageCost(float("nan"), 2.0), "forward_s", "nan"),
    (lambda: StageCost(1.0, -2.0), "backward_s", -2.0),
    (lambda: StageCost(1.0, 2.0, loss_s=float("inf")), "loss_s", float("inf")),
    (lambda: StageCost(1.0, 2.0, activation_bytes=1.5), "activation_bytes", 1.5),
    (lambda: StageCost(1.0, 2.0, output_bytes=-1), "output_bytes", -1),
    (lambda: P2PCost(latency_s=float("nan")), "latency_s", "nan"),
    (lambda: P2PCost(seconds_per_byte=-1e-9), "seconds_per_byte", -1e-9),
    (lambda: P2PCost(post_s=float("inf")), "post_s", float("inf")),
    (lambda: PPCosts((StageCost(1.0, 2.0),), action_overhead_s=float("nan")), "action_overhead_s", "nan"),
    (lambda: PPCosts((StageCost(1.0, 2.0),), samples_per_microbatch=2.5), "samples_per_microbatch", 2.5),
    (lambda: PPCosts(()), "stages", ()),
])
def test_costs_refuse_what_is_not_a_time_or_a_byte_count(make, field: str, value: object) -> None:
    with pytest.raises(OptionError) as e:
        make()
    assert e.value.field == field
    assert math.isnan(e.value.value) if value == "nan" else e.value.value == value


# --- pp_compare: one split, and what was left out ---------------------------------------------------------------------

def test_compare_takes_one_split_and_says_what_it_left_out() -> None:
    found = pp_compare(_costs(2), 2, 2)
    assert [r.schedule for r in found] == ["GPipe", "1F1B"]
    assert found.best is not None and found.best.schedule in ("GPipe", "1F1B")
    assert set(found.skipped) == {"Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
                                  "DualPipeV"}
    assert "4 stages" in found.skipped["ZBVZeroBubble"]
    refused = builtin_programs(2, 2)[1]  # PyTorch refuses DualPipeV 2 micro-batches for 4 stages: its reason is kept
    assert found.skipped["DualPipeV"].endswith(refused["DualPipeV"])
    assert all(name in found.summary() for name in found.skipped)
    by_split = pp_compare({2: _costs(2), 4: _costs(4)}, 2, 4)
    assert by_split.skipped == {} and len(by_split) == 7


def test_compare_says_what_costs_it_expects() -> None:
    with pytest.raises(PPError) as e:
        pp_compare([_costs(2)], 2, 2)
    assert (e.value.rule, e.value.field, e.value.value) == ("bad_value", "costs", "list")


# --- time limits and caps: one rule everywhere --------------------------------------------------------------------

def _refusal(call, value: float) -> tuple:
    with pytest.raises(OptionError) as e:
        call(value)
    return e.value.field, e.value.expected


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf")])
def test_time_limits_and_caps_are_refused_the_same_way_everywhere(value: float) -> None:
    # the plan search's options classes refuse them; every pipeline-parallel entry refuses them as they do
    limit = _refusal(lambda v: SolverOptions(time_limit_s=v), value)
    cap = _refusal(lambda v: Constraints(max_memory_bytes=v), value)
    # pp_search takes the plan search's options: a bad limit or cap is refused where the options are built
    assert _refusal(lambda v: pp_search(_costs(2), 2, 2, solver=SolverOptions(time_limit_s=v, method="beam")),
                    value) == limit
    for call in (lambda v: pp_search(_costs(2), 2, 2, constraints=Constraints(max_memory_bytes=v)),
                 lambda v: pp_what_if(pp_program("GPipe", 2, 2), _costs(2), max_memory_bytes=v),
                 lambda v: pp_compare(_costs(2), 2, 2, max_memory_bytes=v)):
        assert _refusal(call, value) == ("max_memory_bytes", cap[1])


class _FakeClock:
    """Seconds that advance by one at every read: the search's deadline passes at a read the test chooses."""

    def __init__(self) -> None:
        self.now = -1.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_the_time_limit_bounds_every_stage_of_the_search() -> None:
    costs = _costs(2)
    whole = _FakeClock()
    uncut = pp_search(costs, 2, 2, solver=SolverOptions(time_limit_s=1e9, cpsat_max_tasks=64), clock=whole)
    assert (uncut.cut, uncut.not_tried) == ("", ())
    reads = int(whole.now)
    # the first of PyTorch's schedules is scored whatever the limit (the search always answers): its reads
    first = pp_search(costs, 2, 2, solver=SolverOptions(time_limit_s=1, cpsat_max_tasks=64), clock=_FakeClock())
    stages = set()
    for limit in list(range(6, 16)) + [reads // 2] + list(range(reads - 16, reads - 2)):
        clock = _FakeClock()
        found = pp_search(costs, 2, 2, solver=SolverOptions(time_limit_s=limit, cpsat_max_tasks=64), clock=clock)
        # the first check after the deadline stops the search: at most one read in between, one to say how long
        assert found.elapsed_s == clock.now <= max(limit, first.elapsed_s) + 2
        assert found.cut and found.not_tried and found.time_limit_s == limit
        assert found.cut in found.summary() and found.not_tried[0] in found.summary()
        assert found.best.result.step_s <= min(c.result.step_s for c in found.candidates)
        stages.add(found.cut)
    # PyTorch's schedules, the list scheduler, CP-SAT and the simulator's loop all read the same deadline
    assert stages >= {"seeds", "list", "cpsat", "simulate"}


def test_a_limit_that_passes_before_any_schedule_is_scored_still_answers_with_the_first_builtin() -> None:
    # a loaded machine may take longer than the limit to build PyTorch's first schedule: the search answers with it
    found = pp_search(_costs(2), 2, 2, solver=SolverOptions(time_limit_s=1, cpsat_max_tasks=64), clock=_FakeClock())
    first = next(c for c in found.candidates)
    assert first.origin.startswith("PyTorch ") and found.best_seed is not None
    assert found.cut == "seeds" and found.not_tried and found.best.result.step_s <= first.result.step_s
