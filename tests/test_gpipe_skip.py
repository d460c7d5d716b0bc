"""swpipe.gpipe.skip: skippable layers, their checks, and skips carried across partitions with their gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from swpipe.gpipe import GPipe
from swpipe.gpipe.errors import SkipDeclarationError, SkipLayoutError
from swpipe.gpipe.skip import Namespace, pop, skippable, stash, verify_skippables


@skippable(stash=["skip"])
class Save(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        yield stash("skip", x)
        return torch.tanh(self.fc(x))


@skippable(pop=["skip"])
class Add(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        skip = yield pop("skip")
        return self.fc(x) + 2 * skip


def unet() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(Save(), nn.Linear(4, 4), nn.Tanh(), Add(), nn.Linear(4, 4)).double()


def test_a_skippable_layer_works_alone_and_wraps_its_module():
    model = unet()
    assert isinstance(model[0].module.fc, nn.Linear)
    assert repr(model[0]).startswith("@skippable(Save(")
    x = torch.ones(2, 4, dtype=torch.float64)
    assert model(x).shape == (2, 4)


@pytest.mark.parametrize("balance", [[5], [1, 4], [3, 2], [4, 1], [1, 1, 1, 1, 1]])
@pytest.mark.parametrize("checkpoint", ["always", "never"])
def test_skips_across_partitions_give_the_module_s_values_and_gradients(balance, checkpoint):
    model = unet()
    whole = copy.deepcopy(model)
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    expected = whole(x)
    expected.sum().backward()
    expected_x = x.grad.clone()
    x.grad = None
    gpipe = GPipe(model, balance, devices=["cpu"] * len(balance), chunks=3, checkpoint=checkpoint)
    y = gpipe(x)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-12)
    y.sum().backward()
    torch.testing.assert_close(x.grad, expected_x, rtol=0, atol=1e-12)
    for got, want in zip(gpipe.parameters(), whole.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=1e-12)


def test_namespaces_keep_two_copies_apart():
    ns1, ns2 = Namespace(), Namespace()
    model = nn.Sequential(Save().isolate(ns1), Save().isolate(ns2), Add().isolate(ns2), Add().isolate(ns1))
    verify_skippables(model)
    gpipe = GPipe(model, [1, 1, 1, 1], devices=["cpu"] * 4, chunks=2)
    x = torch.randn(4, 4)
    torch.testing.assert_close(gpipe(x), model(x))
    assert copy.copy(ns1) == ns1 and ns1 != ns2


def test_verify_skippables_lists_every_problem():
    @skippable(stash=["a"], pop=["a"])
    class Both(nn.Module):
        pass

    @skippable(pop=["b"])
    class PopB(nn.Module):
        pass

    @skippable(stash=["c"])
    class StashC(nn.Module):
        pass

    with pytest.raises(SkipLayoutError) as info:
        verify_skippables(nn.Sequential(Both(), PopB(), StashC(), StashC()))
    assert isinstance(info.value, TypeError)
    assert info.value.problems == [("0", "a", "both"), ("1", "b", "pop_unstashed"), ("3", "c", "stash_again"),
                                   (None, "c", "never_popped")]
    with pytest.raises(SkipLayoutError):  # GPipe checks at construction
        GPipe(nn.Sequential(StashC()), [1], devices=["cpu"])


@pytest.mark.parametrize("layer, problem", [("undeclared_stash", "stash_undeclared"),
                                            ("unused_stash", "not_stashed"), ("unstashed_pop", "pop_missing")])
def test_runtime_skip_mistakes_name_layer_and_skip(layer, problem):
    @skippable()
    class UndeclaredStash(nn.Module):
        def forward(self, x):
            yield stash("s", x)
            return x

    @skippable(stash=["s"])
    class UnusedStash(nn.Module):
        def forward(self, x):
            return x

    @skippable(pop=["never"])
    class UnstashedPop(nn.Module):
        def forward(self, x):
            value = yield pop("never")
            return value

    cls = {"undeclared_stash": UndeclaredStash, "unused_stash": UnusedStash, "unstashed_pop": UnstashedPop}[layer]
    with pytest.raises(SkipDeclarationError) as info:
        cls()(torch.ones(1))
    assert isinstance(info.value, RuntimeError) and info.value.problem == problem
    assert info.value.layer == cls.__name__ and info.value.name in ("s", "never")


def test_stashing_none_crosses_partitions():
    @skippable(stash=["maybe"])
    class Nothing(nn.Module):
        def forward(self, x):
            yield stash("maybe", None)
            return x + 1

    @skippable(pop=["maybe"])
    class Take(nn.Module):
        def forward(self, x):
            value = yield pop("maybe")
            return x if value is None else x * 0

    gpipe = GPipe(nn.Sequential(Nothing(), Take()), [1, 1], devices=["cpu", "cpu"], chunks=2,
                  checkpoint="always")
    x = torch.zeros(4, requires_grad=True)
    y = gpipe(x)
    assert y.tolist() == [1.0] * 4
    y.sum().backward()
    assert x.grad.tolist() == [1.0] * 4
