"""Host batches bound for a CUDA device are pinned where they are made, once each; on CPU nothing is pinned.

A ``non_blocking`` host-to-GPU copy from pageable memory blocks the host, so
the DLRM workload's H2D task would overlap nothing while the simulator models
it as asynchronous (issue 31, defect 5). There is no GPU here: the tests tell
the workload's device check (``swpipe.workloads.dlrm_data.pins_batches``) that the
device is CUDA and make ``Batch.pin_memory`` record its calls and return a
new batch (the CPU build of torch cannot pin), then follow which batch
objects reach :meth:`DLRMWorkload.h2d`, the H2D task's copy.
"""

from __future__ import annotations

from typing import Any, List

import pytest
from conftest import requires_torchrec
import torch

from swpipe.workloads import dlrm_data, torchrec_peer
from swpipe.workloads.bench import default_specs, measure
from swpipe.workloads.checks import run_all
from swpipe.workloads.dlrm import DLRMWorkload
from swpipe.workloads.dlrm_data import KJT, Batch, DLRMConfig, SyntheticData

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_intra_op_thread")]

CFG = DLRMConfig.preset("test", batch_size=8)


class Pins:
    """``Batch.pin_memory`` made to record its calls and return a new batch (page-locked, as far as the test knows)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: List[Batch] = []  # kept alive, so identities stay unique

        def pin_memory(batch: Batch) -> Batch:
            assert not self.holds(batch), "a pinned batch was pinned again"
            pinned = Batch(batch.dense, batch.sparse, batch.labels)
            self.made.append(pinned)
            return pinned

        monkeypatch.setattr(Batch, "pin_memory", pin_memory)

    def holds(self, batch: Any) -> bool:
        return any(batch is b for b in self.made)


@pytest.fixture
def copied(monkeypatch) -> List[Batch]:
    """The batches :meth:`DLRMWorkload.h2d` (the H2D task's copy) is given, in order."""
    seen: List[Batch] = []
    real = DLRMWorkload.h2d

    def h2d(self: DLRMWorkload, batch: Batch, non_blocking: bool = True) -> Batch:
        seen.append(batch)
        return real(self, batch, non_blocking)

    monkeypatch.setattr(DLRMWorkload, "h2d", h2d)
    return seen


@pytest.fixture
def cuda_bound(monkeypatch) -> Pins:
    """The workload's device (CPU here) counts as CUDA for pinning; pinning is recorded."""
    # raising=False: without the device check the workload pins nothing, which the tests then say
    monkeypatch.setattr(dlrm_data, "pins_batches", lambda device: device is not None, raising=False)
    return Pins(monkeypatch)


def _measure(env: Any) -> None:
    measure(CFG, env, default_specs(["sparse_dist"]), iters=3, repeats=2, warmup=1, record_best=False)


def _run_all(env: Any) -> None:
    run_all(env, CFG, ["sparse_dist"], iters=3, thread_maps=[None, "by_stream"])


@pytest.mark.parametrize("run, batches", [(_measure, 3 + 1), (_run_all, 3)], ids=["demo", "multirank-checks"])
def test_on_cuda_the_h2d_copy_gets_the_batches_pinned_once_each_where_they_are_made(run, batches, env, copied,
                                                                                    cuda_bound):
    run(env)
    assert len(cuda_bound.made) == batches  # once per batch, though every run of every round copies them
    assert len(copied) > 2 * batches
    assert all(cuda_bound.holds(b) for b in copied)


def test_the_auto_plan_measures_and_verifies_on_pinned_batches(env, copied, cuda_bound):
    pytest.importorskip("autosched.search.autoschedule")
    from swpipe.workloads.autoplan import auto_spec

    handed = SyntheticData(CFG).batches(3)  # as a caller makes them, not pinned
    auto_spec(CFG, env, handed, time_limit_s=1.0, verify_rounds=0)
    assert len(cuda_bound.made) == len(handed)
    assert copied and all(cuda_bound.holds(b) for b in copied)


def test_synthetic_data_for_a_cuda_device_yields_pinned_batches(cuda_bound):
    out = SyntheticData(CFG, device="cuda:0").batches(2)
    assert len(cuda_bound.made) == 2 and all(cuda_bound.holds(b) for b in out)


@pytest.mark.parametrize("run", [_measure, _run_all], ids=["demo", "multirank-checks"])
def test_on_cpu_nothing_is_pinned(run, env, copied, monkeypatch):
    from swpipe.workloads.dlrm_data import pin_for

    calls = []

    def record(what: str) -> Any:
        def pin_memory(self: Any, *args: Any, **kw: Any) -> Any:
            calls.append(what)
            return self
        return pin_memory

    for cls in (Batch, KJT, torch.Tensor):
        monkeypatch.setattr(cls, "pin_memory", record(cls.__name__))
    run(env)
    assert copied and calls == []
    batches = SyntheticData(CFG, device="cpu").batches(2)
    assert all(a is b for a, b in zip(pin_for(batches, env.device), batches)) and calls == []


@requires_torchrec
def test_torchrec_peer_batches_for_a_cuda_device_are_pinned(monkeypatch):
    from torchrec.datasets.utils import Batch as TorchRecBatch

    pinned = []

    def pin_memory(batch: Any) -> Any:
        pinned.append(TorchRecBatch(batch.dense_features, batch.sparse_features, batch.labels))
        return pinned[-1]

    monkeypatch.setattr(TorchRecBatch, "pin_memory", pin_memory)
    assert torchrec_peer.to_torchrec_batches(CFG, 2) and torchrec_peer.to_torchrec_batches(CFG, 2, device="cpu")
    assert pinned == []
    out = torchrec_peer.to_torchrec_batches(CFG, 2, device=torch.device("cuda", 0))
    assert len(pinned) == 2 and all(a is b for a, b in zip(out, pinned))
