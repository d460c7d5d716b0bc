"""A correction is applied per key only where it predicts held-out measured steps better (issue 47)."""

from __future__ import annotations

import pytest

from autosched.model.corrections import (REASONS, CorrectionCheckError, CorrectionDecision, HeldOutStep,
                                         decide_corrections, decisions_line)


def test_applied_where_it_helps_and_not_where_it_hurts_key_by_key():
    steps = [HeldOutStep(8, 0.10, 0.12, 0.12),    # plain 16.7 % low, corrected exact
             HeldOutStep(16, 0.20, 0.30, 0.20)]   # plain exact, corrected 50 % high
    got = decide_corrections("slowdown", steps)
    assert [(k, d.applied, d.reason) for k, d in got.items()] == [(8, True, "closer"), (16, False, "farther")]
    assert got[8].error_without == pytest.approx(1 - 0.10 / 0.12)
    assert got[8].error_with == 0.0 and got[16].error_with == pytest.approx(0.5)
    assert got[8].steps == 1 and got[8].correction == "slowdown" and got[8].key == 8


def test_a_tie_keeps_the_plain_prediction():
    # 10 % low without, 10 % high with: the same error
    got = decide_corrections("slowdown", [HeldOutStep("a", 0.9, 1.1, 1.0)])
    assert (got["a"].applied, got["a"].reason) == (False, "tie")
    assert got["a"].error_without == pytest.approx(got["a"].error_with)


def test_no_held_out_step_means_not_applied():
    got = decide_corrections("slowdown", [], keys=[4, 8])
    assert {k: (d.applied, d.reason, d.error_without, d.error_with, d.steps) for k, d in got.items()} == {
        4: (False, "no-held-out-steps", None, None, 0), 8: (False, "no-held-out-steps", None, None, 0)}


def test_each_key_is_judged_by_the_median_error_of_its_own_steps():
    # key 2: two of three steps say the correction helps; the third (a burst of load) says it hurts a lot
    steps = [HeldOutStep(2, 1.0, 1.2, 1.2), HeldOutStep(2, 1.0, 1.2, 1.25), HeldOutStep(2, 1.0, 1.2, 0.5),
             HeldOutStep(4, 1.0, 1.2, 1.0)]
    got = decide_corrections("slowdown", steps, keys=[2])
    assert (got[2].applied, got[2].steps) == (True, 3)
    assert got[2].error_with == pytest.approx(0.04) and got[2].error_without == pytest.approx(0.2)
    assert (got[4].applied, got[4].reason) == (False, "farther")


def test_every_reason_is_a_known_one():
    steps = [HeldOutStep(1, 1.0, 1.1, 1.1), HeldOutStep(2, 1.0, 1.1, 1.0), HeldOutStep(3, 0.9, 1.1, 1.0)]
    got = decide_corrections("slowdown", steps, keys=[4])
    assert [d.reason for d in got.values()] == list(REASONS)


@pytest.mark.parametrize("field, values", [("measured_s", (1.0, 1.0, 0.0)), ("with_s", (1.0, -1.0, 1.0)),
                                           ("without_s", (float("nan"), 1.0, 1.0))])
def test_a_step_that_cannot_judge_is_refused_naming_its_field_and_key(field, values):
    with pytest.raises(CorrectionCheckError) as err:
        HeldOutStep(8, *values)
    assert (err.value.field, err.value.key) == (field, 8)


def test_the_summary_line_names_every_key_once():
    got = decide_corrections("slowdown", [HeldOutStep(8, 0.1, 0.12, 0.12), HeldOutStep(16, 0.2, 0.3, 0.2)],
                             keys=[32])
    line = decisions_line(got.values())
    assert [line.count(f" {k} (") for k in (8, 16, 32)] == [1, 1, 1]
    assert line.index(" 8 (") < line.index(" 16 (") and line.index(" 8 (") < line.index(" 32 (")  # applied first
    assert isinstance(got[8], CorrectionDecision) and got[8].describe().count("%") == 2
