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
    flagged = [line.split(":")[1].split()[0] for line in r.format_report().splitlines() if "~" not in line
               and line.strip().startswith("Within")]
    assert flagged == ["Cast"]  # the tasks within noise, named on their line


def test_exposed_times_that_add_up_to_more_than_the_step_are_explained():
    over = _result(A=[0.006] * 3, B=[0.006] * 3)
    assert _baseline_pct(over.format_report()) == ["120"]  # the sum, in % of the baseline, on the line explaining it
    under = _result(A=[0.004] * 3, B=[0.004] * 3)
    assert _baseline_pct(under.format_report()) == [] and "Within" not in under.format_report()


def _baseline_pct(report: str) -> list:
    """The percentages on the report's lines that compare the exposed times with the baseline."""
    return [w for line in report.splitlines() if "baseline:" in line.split() for w in line.split() if w.isdigit()]
