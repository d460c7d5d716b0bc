"""swpipe.gpipe.balance: the optimal balance (against brute force) and the profiles it is computed from."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from hypothesis import given, strategies as st
from torch import nn

from swpipe.gpipe import GPipe
from swpipe.gpipe.balance import balance_by_size, balance_by_time, balance_cost, optimal_balance, profile_layers
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
