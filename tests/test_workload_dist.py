"""World size 2 (two spawned gloo ranks on loopback): every plan equals the serial loop on every rank.

One spawn runs the serial loops and every TorchRec plan (single thread and one
thread per stream) on both ranks; the tests then compare. Also checked: the
two-rank model computes what one rank computes on the whole global batch (to a
stated float tolerance: the reductions are grouped differently).
"""

from __future__ import annotations

import pytest
import torch

from swpipe.workloads.checks import run_all
from swpipe.workloads.dlrm import DLRMConfig, DLRMWorkload, SyntheticData, init_distributed
from swpipe.workloads.launch import spawn
from swpipe.workloads.reference import train_reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORLD = 2
ITERS = 5
CFG = DLRMConfig.preset("test", batch_size=16)
SYNC = ["base", "pt2", "sparse_dist", "sparse_dist_lite", "fused_sparse_dist", "prefetch",
        "sparse_dist_comp_autograd", "staged", "semi_sync"]
EVAL = ["eval_sparse_dist", "eval_fused_sparse_dist"]
THREAD_MAPS = (None, "by_stream")


@pytest.fixture(scope="module")
def ranks():
    return spawn(run_all, WORLD, CFG, SYNC + EVAL, ITERS, THREAD_MAPS, backend="gloo", timeout=240)


def _same_training(a, b):
    assert len(a["losses"]) == len(b["losses"]) == ITERS
    for i, (x, y) in enumerate(zip(a["losses"], b["losses"])):
        assert torch.equal(x, y), f"iteration {i}: {x.item()!r} != {y.item()!r}"
    assert a["params"].keys() == b["params"].keys()
    for k in a["params"]:
        assert torch.equal(a["params"][k], b["params"][k]), k


@pytest.mark.parametrize("thread_map", THREAD_MAPS)
@pytest.mark.parametrize("name", SYNC)
def test_every_rank_trains_exactly_like_the_serial_loop(ranks, name, thread_map):
    for rank, out in enumerate(ranks):
        _same_training(out[(name, thread_map)], out[("reference", None)])


@pytest.mark.parametrize("thread_map", THREAD_MAPS)
def test_torchrec_order_semi_sync_equals_the_stale_reference_on_every_rank(ranks, thread_map):
    for out in ranks:
        _same_training(out[("semi_sync_torchrec_order", thread_map)], out[("semi_sync_reference_lag1", None)])
        stale, sync = out[("semi_sync_reference_lag1", None)]["losses"], out[("reference", None)]["losses"]
        assert any(not torch.equal(a, b) for a, b in zip(stale, sync))


@pytest.mark.parametrize("thread_map", THREAD_MAPS)
@pytest.mark.parametrize("name", EVAL)
def test_eval_pipelines_equal_model_eval_on_every_rank(ranks, name, thread_map):
    for out in ranks:
        got, want = out[(name, thread_map)]["outputs"], out[("eval_reference", None)]["outputs"]
        assert len(got) == ITERS and all(torch.equal(a, b) for a, b in zip(got, want))


def test_ranks_hold_replicated_dense_weights_and_disjoint_tables(ranks):
    p0, p1 = ranks[0][("reference", None)]["params"], ranks[1][("reference", None)]["params"]
    dense = [k for k in p0 if k.startswith("param.dense_arch")]
    assert dense and all(torch.equal(p0[k], p1[k]) for k in dense)
    tables0 = {k for k in p0 if k.startswith("param.tables")}
    tables1 = {k for k in p1 if k.startswith("param.tables")}
    assert tables0 == {"param.tables.t0.weight", "param.tables.t2.weight"}
    assert tables1 == {"param.tables.t1.weight", "param.tables.t3.weight"}


def test_two_ranks_compute_what_one_rank_computes_on_the_global_batch(ranks):
    # Same global batches on one rank (batch 32 = 2 x 16). Float sums are grouped differently
    # (two local means then an all-reduce), so equality holds to ~1e-6, not bit for bit.
    torch.set_num_threads(1)
    env = init_distributed(backend="gloo", device=torch.device("cpu"))
    try:
        wl = DLRMWorkload(DLRMConfig.preset("test", batch_size=32), env)
        single = train_reference(wl, SyntheticData(wl.config).batches(ITERS))
        snap = wl.snapshot()
    finally:
        env.close()
    for i in range(ITERS):
        mean = (ranks[0][("reference", None)]["losses"][i] + ranks[1][("reference", None)]["losses"][i]) / 2
        torch.testing.assert_close(mean, single[i], rtol=1e-5, atol=1e-6)
    for k, v in snap.items():
        if k.startswith("grad."):
            continue
        owner = int(k.split(".")[2][1:]) % WORLD if k.startswith("param.tables") else 0
        torch.testing.assert_close(ranks[owner][("reference", None)]["params"][k], v, rtol=1e-5, atol=1e-6)
