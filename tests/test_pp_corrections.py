"""A pipeline-parallel prediction's corrections (the runtime's cost per action, the post cost) kept only where they
predict held-out steps better than without them: the decisions on scripted steps, no timing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autosched.pp.costs import P2PCost, PPCosts, StageCost
from autosched.pp.program import pp_program
from autosched.pp.simulate import pp_simulate
from swpipe.commands.pp import corrections_line
from swpipe.pp import check_pp_corrections, fitted_post_s

PROGRAM = pp_program("1F1B", 2, 4)
PLAIN = PPCosts((StageCost(0.010, 0.020), StageCost(0.012, 0.024)), P2PCost(latency_s=1e-4))
OVERHEAD_S, POST_S = 0.001, 0.002
MEASURED = PLAIN.with_action_overhead(OVERHEAD_S)


def _step(costs: PPCosts, **kw) -> float:
    return pp_simulate(PROGRAM, costs, **kw).step_s


def _with_post(costs: PPCosts) -> PPCosts:
    return replace(costs, p2p=replace(costs.p2p, post_s=POST_S))


@pytest.mark.parametrize("truth, kept", [
    (PLAIN, (False, False)),
    (MEASURED, (True, False)),
    (_with_post(PLAIN), (False, True)),
    (_with_post(MEASURED), (True, True)),
])
def test_each_correction_is_kept_exactly_where_the_held_out_steps_need_it(truth, kept):
    steps = [_step(truth) * f for f in (0.999, 1.0, 1.001)]
    costs, decisions = check_pp_corrections(_with_post(MEASURED), PROGRAM, steps)
    assert [d.correction for d in decisions] == ["runtime cost per action", "post cost"]
    assert tuple(d.applied for d in decisions) == kept
    assert costs.action_overhead_s == (OVERHEAD_S if kept[0] else 0.0)
    assert costs.p2p.post_s == (POST_S if kept[1] else 0.0)
    assert costs.p2p.latency_s == PLAIN.p2p.latency_s and all(d.key == 4 and d.steps == 3 for d in decisions)
    assert _step(costs) == pytest.approx(_step(truth))


def test_without_held_out_steps_no_correction_is_kept():
    costs, decisions = check_pp_corrections(_with_post(MEASURED), PROGRAM, [], key="n=4")
    assert [(d.key, d.applied, d.reason) for d in decisions] == [("n=4", False, "no-held-out-steps")] * 2
    assert (costs.action_overhead_s, costs.p2p.post_s) == (0.0, 0.0)


def test_a_correction_that_changes_nothing_is_a_tie_and_not_kept():
    steps = [_step(MEASURED)] * 2
    _, decisions = check_pp_corrections(MEASURED, PROGRAM, steps)  # post_s 0: with and without it are the same
    assert [(d.applied, d.reason) for d in decisions] == [(True, "closer"), (False, "tie")]


def test_the_prediction_it_checks_shares_the_cores_given():
    four = pp_program("1F1B", 4, 4)
    costs = PPCosts((StageCost(0.010, 0.020),) * 4, P2PCost()).with_action_overhead(OVERHEAD_S)
    shared = pp_simulate(four, costs, cores=2).step_s
    assert shared > pp_simulate(four, costs).step_s  # the ranks take turns on 2 cores
    _, on_two = check_pp_corrections(costs, four, [shared] * 3, cores=2)
    assert on_two[0].applied and on_two[0].error_with == pytest.approx(0.0)


def test_the_report_line_gives_every_decision_with_its_micro_batch_count():
    _, decisions = check_pp_corrections(_with_post(MEASURED), PROGRAM, [_step(MEASURED)] * 3)
    report = {"corrections": {"4": [d.__dict__ for d in decisions]}}
    assert [(d.applied, d.reason) for d in decisions] == [(True, "closer"), (False, "farther")]
    assert corrections_line(report) == "corrections: " + "; ".join(d.describe() for d in decisions)
    searched = corrections_line({"search_corrections": report["corrections"]}, "search_corrections")
    assert searched.split(": ", 1)[1] == corrections_line(report).split(": ", 1)[1] != searched  # its own heading
    assert corrections_line({}) == "" and corrections_line(report, "search_corrections") == ""


def test_the_fitted_post_cost_is_the_one_at_which_the_prediction_meets_the_steps_median():
    truth = 0.0035
    step = _step(replace(PLAIN, p2p=replace(PLAIN.p2p, post_s=truth)))
    assert fitted_post_s(_with_post(PLAIN), PROGRAM, [step * 1.2, step, step * 0.7]) == pytest.approx(truth, rel=2e-3)
    assert fitted_post_s(PLAIN, PROGRAM, [_step(PLAIN) * 0.9]) == 0.0  # faster than without any post's cost
    one_rank = pp_program("GPipe", 1, 4)  # posts nothing: no post cost explains a slower step
    alone = PPCosts((StageCost(0.010, 0.020),))
    assert fitted_post_s(alone, one_rank, [pp_simulate(one_rank, alone).step_s * 2]) == 0.0


def test_with_fit_post_the_post_cost_is_fitted_on_every_other_step_and_judged_on_the_rest():
    truth = replace(MEASURED, p2p=replace(MEASURED.p2p, post_s=0.0035))
    # the fitting steps (first, third, ...) ran as the truth; the judging ones a hair off, as a second sample would
    steps = [_step(truth) * f for f in (1.0, 0.999, 1.0, 1.001, 1.0, 1.0)]
    costs, decisions = check_pp_corrections(_with_post(MEASURED), PROGRAM, steps, fit_post=True)
    assert costs.p2p.post_s == pytest.approx(0.0035, rel=2e-3)  # not the busy exchange's 2 ms it was given
    assert [(d.correction, d.applied, d.steps) for d in decisions] == [("runtime cost per action", True, 3),
                                                                      ("post cost", True, 3)]
    # judged on the other half: steps that ran as the plain prediction keep no post cost, whatever the fit says
    odd = [_step(truth), _step(MEASURED), _step(truth), _step(MEASURED)]
    costs, decisions = check_pp_corrections(_with_post(MEASURED), PROGRAM, odd, fit_post=True)
    assert (costs.p2p.post_s, decisions[1].applied, decisions[1].steps) == (0.0, False, 2)
    # one step cannot be halved: as without fitting
    costs, _ = check_pp_corrections(_with_post(MEASURED), PROGRAM, [_step(_with_post(MEASURED))], fit_post=True)
    assert costs.p2p.post_s == POST_S
