"""swpipe.gpipe.balance: the optimal balance (against brute force) and the profiles it is computed from."""

from __future__ import annotations

import copy
import itertools
import statistics

import pytest
import torch
from hypothesis import given, strategies as st
from torch import nn

from swpipe.gpipe import GPipe
from swpipe.gpipe.balance import (balance_by_size, balance_by_time, balance_cost, optimal_balance, profile_layers,
                                  robust_times)
from swpipe.gpipe.errors import GPipeArgumentError, ProfilingError
from swpipe.gpipe.skip import pop, skippable, stash


def brute_force(costs, k):
    """Every balance of len(costs) layers into k partitions, with its costliest partition."""
    n = len(costs)
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = (0, *cuts, n)
        balance = [b - a for a, b in zip(edges, edges[1:])]
        yield balance_cost(costs, balance), sum(sum(costs[a:b]) ** 2 for a, b in zip(edges, edges[1:])), balance


@given(st.lists(st.integers(0, 20), min_size=1, max_size=9), st.integers(1, 5))
def test_the_balance_is_optimal_against_brute_force(costs, k):
    if k > len(costs):
        with pytest.raises(GPipeArgumentError) as info:
            optimal_balance(costs, k)
        assert info.value.argument == "partitions"
        return
    balance = optimal_balance(costs, k)
    assert len(balance) == k and sum(balance) == len(costs) and min(balance) >= 1
    best = min(brute_force(costs, k))
    assert balance_cost(costs, balance) == best[0]  # the least costliest partition
    assert sum(sum(costs[sum(balance[:j]):sum(balance[:j + 1])]) ** 2 for j in range(k)) == best[1]  # most even


def test_known_answers_and_bad_input():
    assert optimal_balance([1, 2, 3, 4, 5, 6], 2) == [4, 2]
    assert optimal_balance([6, 5, 4, 3, 2, 1], 2) == [2, 4]
    assert optimal_balance([0, 0], 2) == [1, 1]
    assert optimal_balance([10, 1, 1, 1, 1, 10], 3) == [1, 4, 1]
    for costs, k in (([1, -1], 1), ([float("nan")], 1), ([1], 0)):
        with pytest.raises(GPipeArgumentError):
            optimal_balance(costs, k)


@skippable(stash=["s"])
class Save(nn.Module):
    def forward(self, x):
        yield stash("s", x)
        return x * 2


@skippable(pop=["s"])
class Add(nn.Module):
    def forward(self, x):
        s = yield pop("s")
        return x + s


def test_profiles_count_bytes_per_layer_and_leave_the_module_as_it_was():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.BatchNorm1d(32), Save(), nn.Linear(32, 32), Add())
    model.eval()
    before = copy.deepcopy(model.state_dict())
    profile = profile_layers(model, torch.randn(8, 16), timeout=0.01)
    assert len(profile) == 6 and profile.batch == 8 and profile.device == "cpu"
    # ReLU keeps its 8 x 32 floats of output for backward; the first Linear keeps only the (uncounted) input
    assert profile.saved_bytes[0] == 0 and profile.saved_bytes[1] == 8 * 32 * 4
    assert profile.output_bytes == [8 * 32 * 4] * 6
    assert profile.param_bytes[0] == (16 * 32 + 32) * 4 and profile.param_bytes[1] == 0
    assert all(t >= 0 for t in profile.time_s)
    assert not model.training and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_balance_by_size_splits_by_kept_bytes_and_parameters():
    model = nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(32, 4)
    # activations only: the two wide layers' outputs dominate; with parameters the wide Linears weigh in
    profile = profile_layers(model, x.chunk(2)[0], timeout=0.0, num_rounds=1)
    assert balance_by_size(2, model, x, chunks=2, param_scale=0) == optimal_balance(profile.saved_bytes, 2)
    sizes = [s + 4 * p for s, p in zip(profile.saved_bytes, profile.param_bytes)]
    assert balance_by_size(2, model, x, chunks=2, param_scale=4) == optimal_balance(sizes, 2)


def test_balance_by_time_gives_a_usable_balance_and_refuses_existing_gradients():
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    balance = balance_by_time(3, model, torch.randn(4, 8), timeout=0.01)
    assert len(balance) == 3 and sum(balance) == 5
    GPipe(model, balance, devices=["cpu"] * 3)(torch.randn(4, 8)).sum().backward()
    with pytest.raises(ProfilingError) as info:
        balance_by_time(2, model, torch.randn(4, 8), timeout=0.01)
    assert info.value.problem == "has_grad" and info.value.parameter == "0.weight"


# ---- issue 47.4: balance_by_time stable under load (scripted timings: no clock is read) ----------------------

CLEAN_MS = [3, 3, 3, 3, 3, 3, 6, 6]  # forward + backward per layer; the optimum in 2 is [5, 3] (15 | 15 ms)


def eight_layers():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(8, 8) for _ in CLEAN_MS])


class ScriptedTimer:
    """Runs each task and says it took the scripted time: forward 1/3 and backward 2/3 of the layer's ms,
    times ``slow[round]``; ``spikes[(round, layer)]`` multiplies that layer's backward in that round."""

    def __init__(self, slow=(), spikes=None):
        self.slow, self.spikes, self.calls = dict(slow), dict(spikes or {}), []

    def __call__(self, run, task, round):
        run()
        self.calls.append((round, task))
        j = int(task[1:])
        share = 1 / 3 if task[0] == "F" else 2 / 3 * self.spikes.get((round, j), 1.0)
        return CLEAN_MS[j] * share * self.slow.get(round, 1.0) / 1e3

    def raw_ms(self, rounds):
        """What each layer's forward + backward took in each round, as the timer said."""
        return [[CLEAN_MS[j] * (1 / 3 + 2 / 3 * self.spikes.get((r, j), 1.0)) * self.slow.get(r, 1.0)
                 for j in range(len(CLEAN_MS))] for r in range(rounds)]


# layer 0's backward 50x in rounds 0 and 3 (two spikes: a plain median per layer picks the slow round's 9 ms);
# round 2 three times slower throughout
LOADED = {"slow": {2: 3.0}, "spikes": {(0, 0): 50.0, (3, 0): 50.0}}


def test_a_loaded_profile_gives_the_clean_balance_and_costs():
    x = torch.randn(4, 8)
    clean = balance_by_time(2, eight_layers(), x, num_rounds=5, timer=ScriptedTimer())
    timer = ScriptedTimer(**LOADED)
    loaded = balance_by_time(2, eight_layers(), x, num_rounds=5, timer=timer)
    assert clean == loaded == optimal_balance(CLEAN_MS, 2) == [5, 3]
    # the scenario bites: the mean, or the median per layer without the rounds' normalisation, cut elsewhere
    raw = timer.raw_ms(5)
    columns = list(zip(*raw))
    assert optimal_balance([sum(c) / len(c) for c in columns], 2) != [5, 3]
    assert optimal_balance([statistics.median(c) for c in columns], 2) == [4, 4]


def test_the_profile_reports_the_spikes_the_slow_round_and_the_spread():
    timer = ScriptedTimer(**LOADED)
    profile = profile_layers(eight_layers(), torch.randn(4, 8), num_rounds=5, timer=timer)
    # each round times every layer back to back: forwards in order, then backwards in reverse
    order = [f"F{j}" for j in range(8)] + [f"B{j}" for j in reversed(range(8))]
    assert timer.calls == [(r, task) for r in range(5) for task in order]
    assert profile.spikes == [2, 0, 0, 0, 0, 0, 0, 0]
    assert profile.round_scale == pytest.approx([1, 1, 3, 1, 1])
    assert profile.forward_s == pytest.approx([c / 3e3 for c in CLEAN_MS])
    assert profile.backward_s == pytest.approx([2 * c / 3e3 for c in CLEAN_MS])
    assert profile.spread == pytest.approx([0] * 8)  # what is left after the normalisation is the clean rounds
    assert [t for row in profile.round_time_s for t in row] == pytest.approx(
        [t / 1e3 for row in timer.raw_ms(5) for t in row])
    lines = profile.report().splitlines()
    assert lines[1].split() == ["0", "3.000", "0.0%", "2"] and lines[-1].split()[:2] == ["5", "rounds,"]


def test_robust_times_is_the_documented_statistic():
    # layers A and B take 10, C jitters 1..5; A spikes (100) in round 1; round 3 is twice as slow throughout
    fwd = [[10.0, 10.0, 1.0], [100.0, 10.0, 2.0], [10.0, 10.0, 3.0], [20.0, 20.0, 8.0], [10.0, 10.0, 5.0]]
    bwd = [[0.0] * 3 for _ in fwd]
    r = robust_times(fwd, bwd)
    # slowdowns (median over layers of t / the layer's median 10, 10, 3): 1, 1, 1, 2, 1; medians of t / slowdown:
    # 10, 10, 3; A's 100 > 3 x 10 in round 1 is a spike
    assert r.spikes == [1, 0, 0]
    # each round's total over its kept layers / those layers' medians (23 for all three, 13 without A)
    assert r.round_scale == pytest.approx([21 / 23, 12 / 13, 1, 48 / 23, 25 / 23])
    # costs: medians over the kept rounds of t / scale
    assert r.forward_s[0] == pytest.approx(statistics.median([10 * 23 / 21, 10, 20 * 23 / 48, 10 * 23 / 25]))
    c = [1 * 23 / 21, 2 * 13 / 12, 3, 8 * 23 / 48, 5 * 23 / 25]
    assert r.forward_s[2] == pytest.approx(statistics.median(c)) and r.backward_s == [0.0, 0.0, 0.0]
    q1, _, q3 = statistics.quantiles(c, n=4, method="inclusive")
    assert r.spread[2] == pytest.approx((q3 - q1) / statistics.median(c)) and r.spread[2] > 0.3
    for bad in ({"spike": 1.0}, {"spike": True}):
        with pytest.raises(GPipeArgumentError) as info:
            robust_times(fwd, bwd, **bad)
        assert info.value.argument == "spike"
    with pytest.raises(GPipeArgumentError) as info:
        robust_times([[1.0], [1.0, 2.0]], [[0.0], [0.0, 0.0]])
    assert info.value.argument == "forward" and info.value.value == 1


def test_rounds_default_to_what_the_timeout_allows_within_bounds():
    from swpipe.gpipe.balance.profile import MIN_ROUNDS

    model, x = eight_layers(), torch.randn(4, 8)
    assert len(profile_layers(model, x, timeout=0.0).round_scale) == MIN_ROUNDS
    assert len(profile_layers(model, x, num_rounds=2).round_time_s) == 2
    for bad in (0, 2.5, True):
        with pytest.raises(GPipeArgumentError) as info:
            profile_layers(model, x, num_rounds=bad)
        assert info.value.argument == "num_rounds"


def test_the_default_timer_reads_the_thread_s_cpu_time_with_one_intra_op_thread(monkeypatch):
    import swpipe.gpipe.balance.profile as profile_module

    cpu, wall = iter(range(0, 1000, 1)), iter(range(0, 100000, 100))
    monkeypatch.setattr(profile_module.time, "thread_time", lambda: next(cpu))
    monkeypatch.setattr(profile_module.time, "perf_counter", lambda: next(wall))
    threads = torch.get_num_threads()
    ran = []
    try:
        torch.set_num_threads(1)
        assert profile_module.default_timer("cpu")(lambda: ran.append(1), "F0", 0) == 1  # the thread's CPU time
        torch.set_num_threads(2)
        assert profile_module.default_timer("cpu")(lambda: ran.append(2), "F0", 0) == 100  # wall time
    finally:
        torch.set_num_threads(threads)
    assert ran == [1, 2]
