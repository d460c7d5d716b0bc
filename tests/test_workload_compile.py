"""PT2 (torch.compile with inductor) and CompAutograd (compiled autograd) really compile on CPU.

Slow: inductor generates and builds C++ for the dense arch (20-60 s on a
shared 2-core machine). Compiled kernels fuse and reorder float ops, so the
comparison with the eager serial loop uses a tolerance (rtol 1e-5, atol 1e-6)
instead of bit equality.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from swpipe import Timeouts
from swpipe_core.engine.pipeline import SWPipeline
from swpipe.workloads.dlrm import DLRMConfig, DLRMWorkload, SyntheticData, init_distributed
from swpipe.workloads.reference import train_reference
from swpipe.workloads.tasks import plan_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CFG = DLRMConfig.preset("test")
N = 6


@pytest.fixture(scope="module")
def env():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    e = init_distributed(backend="gloo", device=torch.device("cpu"))
    yield e
    e.close()
    torch.set_num_threads(before)


def _compiled_run(env, name, **options):
    # torch's own count of compiled frames, graph breaks and captures: private to torch, which has no public one
    from torch._dynamo.utils import counters

    counters.clear()
    batches = SyntheticData(CFG).batches(N)
    ref = DLRMWorkload(CFG, env)
    want = train_reference(ref, batches)
    wl = DLRMWorkload(CFG, env)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager would warn: fail instead
        with SWPipeline(plan_for(name, wl, **options), device="cpu",
                        timeouts=Timeouts(progress_s=600, signal_s=600)) as pipe:
            pipe.run(iter(batches))
    got = wl.loss_list()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    snap, ref_snap = wl.snapshot(), ref.snapshot()
    for k in ref_snap:
        torch.testing.assert_close(snap[k], ref_snap[k], rtol=1e-5, atol=1e-6)
    return {k: dict(v) for k, v in counters.items()}


def test_pt2_compiles_the_dense_arch_with_inductor(env):
    counters = _compiled_run(env, "pt2", compile_backend="inductor")
    assert counters["frames"]["ok"] >= 1
    assert sum(counters.get("inductor", {}).values()) > 0


def test_comp_autograd_captures_the_backward_graph(env):
    counters = _compiled_run(env, "sparse_dist_comp_autograd", compiled_autograd="aot_eager")
    assert counters["compiled_autograd"]["captures"] >= 1
