"""The contract's walk: which (task, iteration) each period runs, in what order, handed off after what."""

from __future__ import annotations

from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.walk import PeriodWalk


def _three_stages(caller_group="default"):
    return PipelinePlan({"H2D": TaskSchedule(0, thread_group="io"), "Fwd": TaskSchedule(1),
                         "Log": TaskSchedule(1, thread_group="io"), "Opt": TaskSchedule(2)},
                        intra_iter_deps=[("Fwd", "H2D"), ("Opt", "Fwd")], enqueue_order=["H2D", "Fwd", "Log", "Opt"],
                        caller_group=caller_group)


def test_period_p_runs_iteration_p_minus_stage_of_each_task_whose_iteration_exists():
    walk = PeriodWalk(_three_stages())
    got = {p: [(s.task, s.iteration) for s in steps] for p, steps in walk.periods(3)}
    assert got == {0: [("H2D", 0)],
                   1: [("H2D", 1), ("Fwd", 0), ("Log", 0)],
                   2: [("H2D", 2), ("Fwd", 1), ("Log", 1), ("Opt", 0)],
                   3: [("Fwd", 2), ("Log", 2), ("Opt", 1)],
                   4: [("Opt", 2)]}


def test_a_retired_iteration_is_not_walked_again():
    walk = PeriodWalk(_three_stages())
    assert [(s.task, s.iteration) for s in walk.steps(5, 4, 10)] == [("H2D", 5), ("Fwd", 4), ("Log", 4)]


def test_a_worker_step_after_a_callers_step_is_handed_off_after_it():
    steps = PeriodWalk(_three_stages()).steps(2, 0, 5)
    assert [(s.task, s.inline, s.after) for s in steps] == [
        ("H2D", False, None), ("Fwd", True, None), ("Log", False, 1), ("Opt", True, None)]
    no_caller = PeriodWalk(_three_stages(caller_group=None)).steps(2, 0, 5)
    assert [(s.inline, s.after) for s in no_caller] == [(False, None)] * 4


def test_one_shape_per_set_of_present_stages():
    walk = PeriodWalk(_three_stages())
    steady = [walk.shape(p, p - 2, p + 1) for p in range(2, 30)]
    assert all(shape is steady[0] for shape in steady)
    fill = walk.shape(0, 0, 10)
    assert fill is not steady[0] and walk.shape(0, 0, 10) is fill  # another set of stages: its own shape, kept
