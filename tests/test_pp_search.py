"""The pipeline-parallel search: never predicted slower than PyTorch's best, within the cap, loadable by PyTorch."""

from __future__ import annotations

import pytest

from autosched.pp import (P2PCost, PPCosts, PPError, StageCost, read_csv)
from autosched.pp.bounds import pp_lower_bounds
from autosched.pp.search import pp_search
from autosched.pp.simulate import pp_simulate
from autosched.pp.program import parse_action
from autosched.search.options import Constraints, SolverOptions
from swpipe_core.engine.options import OptionError


def _costs(n_stages: int, scale: float, skew: float = 1.0) -> PPCosts:
    stages = []
    for s in range(n_stages):
        f = scale * (skew if s == n_stages - 1 else 1.0)
        stages.append(StageCost(f, 2 * f, f, f, loss_s=0.05 * scale if s == n_stages - 1 else 0.0,
                                activation_bytes=100, weight_keep_bytes=50, output_bytes=10, grad_input_bytes=10))
    return PPCosts(tuple(stages), P2PCost(0.05 * scale, 0.0), samples_per_microbatch=8)


BY_STAGES = {2: _costs(2, 1.0), 4: _costs(4, 0.5)}
SKEWED = {2: _costs(2, 1.0, skew=1.6), 4: _costs(4, 0.5, skew=1.6)}


@pytest.mark.parametrize("costs", [BY_STAGES, SKEWED], ids=["uniform", "skewed"])
@pytest.mark.parametrize("n_mb", [4, 8])
def test_search_is_never_predicted_slower_than_pytorchs_best(costs: dict, n_mb: int) -> None:
    found = pp_search(costs, 2, n_mb, solver=SolverOptions(method="beam"))
    assert found.best_seed is not None
    assert found.best.result.step_s <= found.best_seed.result.step_s + 1e-12
    assert found.bound_s <= found.best.result.step_s + 1e-9
    seeds = [c for c in found.candidates if c.origin.startswith("PyTorch ")]
    assert {c.program.schedule for c in seeds} >= {"GPipe", "1F1B", "ZBVZeroBubble"}
    assert all(found.best.result.step_s <= c.result.step_s + 1e-12 for c in found.candidates)


def test_search_respects_the_memory_cap() -> None:
    cap = 150  # below every PyTorch schedule's predicted peak for these costs
    found = pp_search(BY_STAGES, 2, 4, constraints=Constraints(max_memory_bytes=cap),
                      solver=SolverOptions(method="beam"))
    assert found.best.result.max_peak_bytes <= cap
    assert found.best_seed is None or found.best_seed.result.max_peak_bytes <= cap
    with pytest.raises(PPError) as e:
        pp_search(BY_STAGES, 2, 4, constraints=Constraints(max_memory_bytes=10), solver=SolverOptions(method="beam"))
    assert (e.value.rule, e.value.field, e.value.value) == ("memory_cap", "max_memory_bytes", 10)


def test_search_chooses_the_microbatch_count() -> None:
    found = pp_search(BY_STAGES, 2, [4, 8], solver=SolverOptions(method="beam"))
    counts = {c.program.n_microbatches for c in found.candidates}
    assert counts == {4, 8}
    assert all(found.best.result.step_s <= c.result.step_s + 1e-12 for c in found.candidates)


def test_cpsat_candidates_are_scored_beside_the_seeds() -> None:
    found = pp_search({2: _costs(2, 1.0)}, 2, 2, solver=SolverOptions(time_limit_s=5, cpsat_max_tasks=64))
    assert "OPTIMAL" in found.cpsat_status or "FEASIBLE" in found.cpsat_status
    assert any(c.origin.startswith("cpsat") for c in found.candidates)
    assert found.best.result.step_s <= found.best_seed.result.step_s + 1e-12


def test_exported_csv_reads_back_through_pytorchs_loader(tmp_path) -> None:
    found = pp_search(BY_STAGES, 2, 4, solver=SolverOptions(method="beam"))
    exported = found.exported.program
    path = exported.to_csv(str(tmp_path / "schedule.csv"))
    # a custom order is lowered with its receives deferred; one of PyTorch's multi-stage classes lowers its own
    back = read_csv(path, exported.n_ranks, exported.n_stages, exported.n_microbatches,
                    defer_recv=exported.source != "pytorch")
    assert back.compute == exported.compute
    assert back.lowered == exported.lowered
    assert back.stage_to_rank == exported.stage_to_rank
    costs = BY_STAGES[exported.n_stages]
    assert pp_simulate(back, costs).step_s == pytest.approx(found.exported.result.step_s)
    rows = open(path).read().splitlines()
    assert len(rows) == exported.n_ranks
    assert all(parse_action(a)[1] in "FIWB" for row in rows for a in row.split(","))


def test_pytorchs_loader_refusal_is_a_field_error(tmp_path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("0B0,0F0\n1F0,1B0\n")  # a backward before its forward
    with pytest.raises(PPError) as e:
        read_csv(str(path), 2, 2, 1)
    assert (e.value.rule, e.value.field) == ("bad_order", "path")


def test_bound_of_the_found_schedule() -> None:
    found = pp_search(BY_STAGES, 2, 4, solver=SolverOptions(method="beam"))
    p = found.best.program
    assert found.bound_s == pytest.approx(pp_lower_bounds(BY_STAGES[p.n_stages], 4, p.stage_to_rank).value)


def test_a_custom_order_is_chosen_only_when_it_beats_pytorchs_by_more_than_its_path_costs() -> None:
    """One stage per rank, a heavier last stage: an order with I and W split beats 1F1B by 2.05 s predicted. A
    custom order runs on _PipelineScheduleRuntime (schedule_for), whose cost per action is priced in: at 0.01 s
    per action the custom order still wins, at 1 s (16 actions per rank) 1F1B is kept."""
    from dataclasses import replace

    from autosched.pp.program import pp_program

    base = {2: _costs(2, 1.0, skew=1.6)}
    cheap = pp_search(base, 2, 4, solver=SolverOptions(method="beam"))
    assert cheap.best.program.source == "swpipe" and cheap.best.result.step_s == pytest.approx(20.6)
    assert cheap.best_seed.origin == "PyTorch 1F1B" and cheap.best_seed.result.step_s == pytest.approx(22.65)
    priced = {k: replace(v, custom_overhead_s=0.01) for k, v in base.items()}
    found = pp_search(priced, 2, 4, solver=SolverOptions(method="beam"))
    assert found.best.program.source == "swpipe"
    assert found.best.result.step_s == pytest.approx(pp_simulate(found.best.program, priced[2].custom_path()).step_s)
    assert found.best_seed.result.step_s == pytest.approx(22.65)  # PyTorch's own class pays no path cost
    dear = {k: replace(v, custom_overhead_s=1.0) for k, v in base.items()}
    kept = pp_search(dear, 2, 4, solver=SolverOptions(method="beam"))
    assert kept.best.origin == "PyTorch 1F1B" and kept.best.program == pp_program("1F1B", 2, 4)
    csv_1f1b = next(c for c in kept.candidates if c.origin == "1F1B order as CSV")
    assert csv_1f1b.result.step_s > kept.best.result.step_s  # the same order, its path's cost on top


def test_a_custom_order_is_best_only_where_it_beats_pytorchs_best_by_more_than_the_margin() -> None:
    found = pp_search(BY_STAGES, 2, 4, solver=SolverOptions(method="beam"))
    assert not found.best.origin.startswith("PyTorch ")  # these costs: a custom order predicted faster
    gain_pct = (found.gain_over_seed - 1) * 100
    assert gain_pct > 0
    within = pp_search(BY_STAGES, 2, 4, solver=SolverOptions(method="beam"), margin_pct=gain_pct * 2)
    assert within.best is within.best_seed and within.best.origin == found.best_seed.origin
    beyond = pp_search(BY_STAGES, 2, 4, solver=SolverOptions(method="beam"), margin_pct=gain_pct / 2)
    assert beyond.best.origin == found.best.origin
    with pytest.raises(OptionError) as e:
        pp_search(BY_STAGES, 2, 4, solver=SolverOptions(method="beam"), margin_pct=-1)
    assert (e.value.given_to, e.value.field) == ("pp_search", "margin_pct")
