"""Issue 46: one set of verbs. A user who learned simulate, what_if, lower_bounds, gantt and the search on a plan uses
the same calls on a GPipe and on PyTorch's schedules, gets the same fields back, and the names before warn."""

from __future__ import annotations

import warnings

import pytest
from torch import nn

import autosched
import swpipe
import swpipe.pp
from autosched.pp.search import pp_search
from autosched.pp.simulate import pp_simulate
from autosched.pp.whatif import pp_compare, pp_what_if
from autosched.results import STEP_TIE, PeakBytes, Prediction, Preference, fastest, fastest_first, pp_preference
from swpipe import (Constraints, CostModel, PipelinePlan, SolverOptions, TaskCost, TaskSchedule, gantt, lower_bounds,
                    search, simulate, what_if)
from swpipe.gpipe import GPipe
from swpipe.gpipe.errors import GPipeArgumentError
from swpipe.gpipe.predict import LayerModel, choose, predict_step
from swpipe.pp import PPCosts, PPError, StageCost, pp_program
from swpipe_core.engine.options import OptionError

PLAN = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
                    intra_iter_deps=[("B", "A")])
PLAN_COSTS = CostModel({"A": TaskCost(0.001, add_bytes=100, free_bytes=0),
                        "B": TaskCost(0.002, add_bytes=0, free_bytes=100)})
PP_COSTS = PPCosts((StageCost(1.0, 2.0, 1.0, 1.0, activation_bytes=100),) * 2)
LAYERS = LayerModel(forward=[(0.0, 0.001)] * 2, backward=[(0.0, 0.002)] * 2, saved_per_sample=[100.0] * 2,
                    output_per_sample=[10.0] * 2)


def _gpipe(schedule: str = "1f1b") -> GPipe:
    return GPipe(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), balance=[1, 1], devices=["cpu", "cpu"], chunks=4,
                 checkpoint="never", schedule=schedule)


def _three():
    """(kind, subject, costs, options, a change) for a plan, a GPipe and a pipeline-parallel program."""
    return [("plan", PLAN, PLAN_COSTS, {}, {"A": 3.0}),
            ("gpipe", _gpipe(), LAYERS, {"batch": 4}, {"chunks": 2}),
            ("pp", pp_program("1F1B", 2, 4), PP_COSTS, {}, {1: 0.5})]


@pytest.mark.parametrize("kind", ["plan", "gpipe", "pp"])
def test_the_same_five_calls_on_each_kind_return_the_same_fields(kind):
    _, subject, costs, options, change = next(t for t in _three() if t[0] == kind)
    result = simulate(subject, costs, **options)
    assert isinstance(result, Prediction)
    assert result.period_s > 0 and isinstance(result.peak_bytes_by, PeakBytes)
    assert result.peak_bytes_by.place == {"plan": "process", "gpipe": "partition", "pp": "rank"}[kind]
    assert result.peak_bytes_by.max_bytes > 0 and result.events and isinstance(result.summary(), str)

    bounds = lower_bounds(subject, costs, **options)
    assert 0 < bounds.period_s <= result.period_s + 1e-12 and isinstance(bounds.binding, str)

    table = what_if(subject, costs, change, **options)
    assert list(table.index) == ["before", "after"]
    assert {"change", "period_s", "lower_bound_s", "speedup"} <= set(table.columns)
    assert table["period_s"].iloc[0] == pytest.approx(result.period_s)

    figure = gantt(result)
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels[:2] == {"plan": ["thread a", "thread b"], "gpipe": ["thread p0", "thread p1"],
                          "pp": ["thread rank0", "thread rank1"]}[kind]

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the new way warns about nothing
        chosen, report = search((["A", "B"], [("B", "A")]) if kind == "plan" else subject, costs,
                                Constraints(max_depth=2, max_memory_bytes=1e9),
                                SolverOptions(time_limit_s=5, method="beam"), **options)
    assert report.period_s == pytest.approx(simulate(chosen, costs, **({} if kind == "gpipe" else options)).period_s
                                            if kind != "gpipe" else chosen.step_s)
    assert report.status in ("OPTIMAL", "FEASIBLE", "HEURISTIC") and report.lower_bound_s <= report.period_s + 1e-9
    assert isinstance(report.summary(), str) and isinstance(report.method, str)


def test_a_programs_period_is_its_step_and_a_gpipes_is_its_predicted_step():
    program = pp_program("1F1B", 2, 4)
    assert simulate(program, PP_COSTS).period_s == pp_simulate(program, PP_COSTS).step_s
    assert dict(simulate(program, PP_COSTS).peak_bytes_by) == pp_simulate(program, PP_COSTS).peak_bytes
    step = predict_step(LAYERS, [1, 1], batch=4, chunks=4, checkpoint="never", schedule="1F1B")
    assert simulate(_gpipe(), LAYERS, batch=4).period_s == step.step_s
    assert list(simulate(_gpipe(), LAYERS, batch=4).peak_bytes_by.values()) == step.activation_by


def test_a_pp_timeline_has_a_track_per_rank_and_the_micro_batch_as_iteration():
    events = simulate(pp_program("1F1B", 2, 4), PP_COSTS).events
    compute = [e for e in events if e.kind == "host"]
    assert {e.thread_group for e in compute} == {"rank0", "rank1"}
    assert [(e.task, e.iteration) for e in compute if e.thread_group == "rank1"][:3] == [("1F", 0), ("1LOSS", 0),
                                                                                         ("1B", 0)]
    assert {e.stream for e in events if e.kind == "device"} == {"rank0.comm", "rank1.comm"}


def test_compare_puts_programs_side_by_side_and_marks_the_cap():
    table = swpipe.compare([pp_program("GPipe", 2, 4), pp_program("1F1B", 2, 4)], PP_COSTS, max_memory_bytes=300)
    # the same step: the tie goes to the lower peak
    assert list(table.index) == ["1F1B", "GPipe"] and list(table["peak_bytes"]) == [200, 400]
    assert list(table["period_s"]) == [15.0, 15.0] and list(table["fits"]) == [True, False]
    gpipes = swpipe.compare({"gpipe": _gpipe("GPipe"), "1f1b": _gpipe("1F1B")}, LAYERS, batch=4)
    assert set(gpipes.index) == {"gpipe", "1f1b"} and {"period_s", "peak_bytes"} <= set(gpipes.columns)


def test_a_verb_given_something_else_says_what_it_takes():
    with pytest.raises(TypeError, match=r"^simulate\(str\)"):
        simulate("1F1B", PP_COSTS)
    with pytest.raises(GPipeArgumentError) as e:
        simulate(_gpipe(), LAYERS)
    assert e.value.argument == "batch"


# --- the names before warn, for one release ----------------------------------------------------------------------

@pytest.mark.parametrize("old, new", [("pp_simulate", "simulate"), ("pp_lower_bounds", "lower_bounds"),
                                      ("pp_what_if", "what_if"), ("pp_compare", "compare"), ("pp_search", "search")])
def test_the_old_pp_verbs_warn_naming_the_new_one(old, new):
    for face in (swpipe.pp, autosched.pp):
        with pytest.warns(FutureWarning, match=f"swpipe.{new}"):
            assert callable(getattr(face, old))
    assert old not in swpipe.pp.__all__


def test_compare_plans_warns_naming_compare():
    with pytest.warns(FutureWarning, match="autosched.compare"):
        assert autosched.compare_plans(
            {"p": PLAN}, PLAN_COSTS)["period_s"].iloc[0] == swpipe.compare({"p": PLAN}, PLAN_COSTS)["period_s"].iloc[0]


def test_old_memory_cap_names_warn_and_mean_max_memory_bytes():
    program = pp_program("1F1B", 2, 4)
    with pytest.warns(FutureWarning, match="max_memory_bytes"):
        w = pp_what_if(program, PP_COSTS, memory_cap_bytes=150)
    assert w.max_memory_bytes == 150 and w.over_cap_ranks == {0: 200}
    with pytest.warns(FutureWarning, match="max_memory_bytes"):
        assert pp_compare(PP_COSTS, 2, 4, memory_cap_bytes=300).best.schedule == "1F1B"
    with pytest.warns(FutureWarning, match="max_memory_bytes"):
        old = choose(LAYERS, 2, batch=4, max_activation_bytes=350, chunks=(4,), checkpoints=("never",))[0]
    assert old == choose(LAYERS, 2, batch=4, max_memory_bytes=350, chunks=(4,), checkpoints=("never",))[0]
    with pytest.raises(OptionError) as e:
        pp_what_if(program, PP_COSTS, memory_cap_bytes=150, max_memory_bytes=150)
    assert e.value.field == "memory_cap_bytes"


def test_pp_search_takes_the_plan_searchs_options_and_its_old_keywords_warn():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        old = pp_search(PP_COSTS, 2, 4, use_cpsat=False, memory_cap_bytes=300)
    assert [(w.category, str(w.message).split(" pass ")[1]) for w in seen] == [
        (FutureWarning, "solver=SolverOptions(method='beam')"),
        (FutureWarning, "constraints=Constraints(max_memory_bytes=300)")]
    new = pp_search(PP_COSTS, 2, 4, constraints=Constraints(max_memory_bytes=300), solver=SolverOptions(method="beam"))
    assert old.cpsat_status == new.cpsat_status == "" and old.period_s == new.period_s
    assert new.max_memory_bytes == 300
    with pytest.warns(FutureWarning, match="max_memory_bytes"):
        assert new.memory_cap_bytes == 300
    with pytest.raises(OptionError) as e:
        pp_search(PP_COSTS, 2, 4, max_depth=2)
    assert (e.value.field, e.value.home) == ("max_depth", "Constraints")


# --- one spelling of a schedule's name ---------------------------------------------------------------------------

@pytest.mark.parametrize("given, spelt", [("1f1b", "1F1B"), ("1F1B", "1F1B"), ("gpipe", "GPipe"), ("GPIPE", "GPipe")])
def test_schedule_names_are_pytorchs_whatever_the_case(given, spelt):
    assert pp_program(given, 2, 4).schedule == spelt
    g = _gpipe(given)
    assert g.schedule == spelt and g.training_plan().kind == spelt
    assert predict_step(LAYERS, [1, 1], batch=4, chunks=4, schedule=given).schedule == spelt


def test_an_unknown_schedule_name_is_refused_by_both():
    with pytest.raises(GPipeArgumentError) as e:
        _gpipe("zb")
    assert (e.value.argument, e.value.value) == ("schedule", "zb")
    with pytest.raises(PPError) as p:
        pp_program("zb", 2, 4)
    assert (p.value.rule, p.value.field) == ("unknown_schedule", "schedule")


# --- which prediction is fastest: one rule (autosched.results.fastest_first) -------------------------------------

def test_fastest_first_ties_steps_within_the_tolerance_and_prefers_the_lower_peak_then_the_smaller():
    rows = {"a": Preference(10.0, 500, (2, 4)), "b": Preference(10.0 * (1 + STEP_TIE / 2), 100, (4, 4)),
            "c": Preference(10.0 * (1 + STEP_TIE / 2), 100, (2, 4)), "d": Preference(10.5, 1, (2, 4)),
            "e": Preference(10.0, 500, (2, 4))}
    # a tie of a, b, c, e: c and b hold less (c has fewer stages); then a before e (listed first); d is 5 % slower
    assert fastest_first(rows, rows.get) == ["c", "b", "a", "e", "d"]
    assert fastest_first(rows, rows.get, tolerance=0.0) == ["a", "e", "c", "b", "d"]  # only equal steps tie
    assert fastest(rows, rows.get) == "c" and fastest(rows, rows.get, tolerance=0.0) == "a"
    assert fastest_first([], rows.get) == []
    with pytest.raises(ValueError, match="^fastest:"):
        fastest([], rows.get)
    with pytest.raises(ValueError, match="tolerance=-1"):
        fastest_first(rows, rows.get, tolerance=-1)


def _tied_costs() -> PPCosts:
    # rank 1 is the bottleneck: GPipe and 1F1B take the same step; GPipe holds all 4 micro-batches
    return PPCosts((StageCost(0.5, 1.0, activation_bytes=100, output_bytes=10),
                    StageCost(1.0, 2.0, activation_bytes=100)))


def test_every_chooser_names_the_lower_peak_of_a_tied_step():
    from swpipe.commands.pp import predicted_preference, summarise

    costs = _tied_costs()
    gpipe, f1b = (pp_simulate(pp_program(n, 2, 4), costs) for n in ("GPipe", "1F1B"))
    assert gpipe.step_s == f1b.step_s and gpipe.max_peak_bytes > f1b.max_peak_bytes
    assert list(swpipe.compare([pp_program("GPipe", 2, 4), pp_program("1F1B", 2, 4)], costs).index)[0] == "1F1B"
    assert pp_compare(costs, 2, 4).best.schedule == "1F1B"
    rows = [{"schedule": n, "n_microbatches": 4, "n_stages": 2, "predicted_step_s": r.step_s,
             "measured_step_s": m, "predicted_peak_bytes": {str(k): v for k, v in r.peak_bytes.items()}}
            for n, r, m in (("GPipe", gpipe, 1.0), ("1F1B", f1b, 1.1))]
    assert summarise({"results": rows}).predicted_fastest["schedule"] == "1F1B"
    assert predicted_preference(rows[0]) == pp_preference(gpipe.step_s, gpipe.max_peak_bytes, 2, 4)
    # the search ties equal steps only (it promises no candidate predicted faster than its answer)
    found = pp_search(costs, 2, 4, solver=SolverOptions(method="beam"))
    assert found.best_seed.program.schedule == "1F1B"
    assert found.best.result.step_s == f1b.step_s and found.best.result.max_peak_bytes <= f1b.max_peak_bytes


def test_simulate_passes_a_programs_device_and_cores_on_to_the_pipeline_parallel_simulator():
    program, costs = pp_program("1F1B", 2, 4), PP_COSTS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for options in ({"device": "cuda"}, {"cores": 1}, {}):
            assert simulate(program, costs, **options).period_s == pp_simulate(program, costs, **options).step_s
    # on CUDA a rank's transfers run on a communication stream of their own: a track the CPU prediction lacks
    # what_if and compare predict with the same options
    for options in ({"device": "cuda"}, {"cores": 1}):
        expected = simulate(program, costs, **options).period_s
        assert what_if(program, costs, {1: 1.0}, **options).loc["before", "period_s"] == expected
        assert swpipe.compare({"p": program}, costs, **options).loc["p", "period_s"] == expected

    def tracks(**options):
        return {(e.kind, e.stream) for e in simulate(program, costs, **options).events}
    assert tracks(device="cuda") - tracks()
