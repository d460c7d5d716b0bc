"""The profiler's report: each exposed time with its noise, flagged within noise, checked against the baseline."""

from __future__ import annotations

from swpipe_core.measure.result import ProfileResult


def _result(**exposed_rounds):
    base = [0.010, 0.011, 0.010]
    shortcut = {name: [b - e for b, e in zip(base, rounds)] for name, rounds in exposed_rounds.items()}
    exposed = {name: sorted(rounds)[1] for name, rounds in exposed_rounds.items()}
    return ProfileResult(0.010, exposed, host_s={n: 0.001 for n in exposed},
                         meta={"baseline_rounds_s": base, "shortcut_rounds_s": shortcut})


def test_each_exposed_time_shows_its_noise_and_a_task_within_noise_is_flagged():
    r = _result(Forward=[0.004, 0.0042, 0.0041], Cast=[0.0, 0.0001, -0.0001])
    noise = r.exposed_noise_s()
    assert abs(noise["Forward"] - 0.0001) < 1e-12 and abs(noise["Cast"] - 0.0001) < 1e-12
    rows = {line.split()[0]: line for line in r.format_report().splitlines() if line.startswith("  ")}
    assert rows["Cast"].split()[2].endswith("~") and not rows["Forward"].split()[2].endswith("~")
    assert "Within noise: Cast" in r.format_report()


def test_exposed_times_that_add_up_to_more_than_the_step_are_explained():
    over = _result(A=[0.006] * 3, B=[0.006] * 3)
    assert "The exposed times sum to 120 % of the baseline" in over.format_report()
    under = _result(A=[0.004] * 3, B=[0.004] * 3)
    assert "sum to" not in under.format_report() and "Within noise" not in under.format_report()
