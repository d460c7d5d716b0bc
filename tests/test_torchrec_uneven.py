"""Uneven data across ranks: two spawned gloo ranks, one with fewer batches, stop at the same batch, no hang.

Rank 0 holds 7 batches, rank 1 holds 5. TorchRec's own pipelines hang here
(the longer rank waits in its next all-to-all until the gloo timeout);
``swpipe.torchrec.TrainPipeline`` wraps each rank's iterator in
:func:`swpipe_core.distributed.agree_on_end`, so both ranks return 5 outputs
and then raise ``StopIteration``; each rank's outputs equal its non-pipelined
loop over the 5 batches every rank has, and the batch rank 0 fetched but did
not train is in ``pipeline.leftover``. ``plan="auto"`` runs here too: the
ranks measure, verify in lockstep and train one shared plan.
"""

from __future__ import annotations

import pytest
import torch

from conftest import requires_torchrec
from swpipe import SolverOptions, VerifyOptions

pytestmark = [pytest.mark.peer, pytest.mark.slow, pytest.mark.timeout(300),
              requires_torchrec]

COUNTS = (7, 5)
SCENARIOS = (
    ("sparse_dist", "sparse_dist", {}),
    ("fused_sparse_dist+by_stream", "fused_sparse_dist", {"thread_map": "by_stream"}),
    ("semi_sync", "semi_sync", {}),
    ("auto", "auto", {"solver": SolverOptions(time_limit_s=1.0),
                      "verify": VerifyOptions(rounds=1, iterations=6, profile_batches=3)}),
)


def uneven_rank(env, counts, scenarios):
    """One rank: its plain loop over the batches every rank has, then each scenario's pipeline on all its batches."""
    import logging
    import warnings

    from swpipe.torchrec import TrainPipeline, models

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    cfg = models.SparseNNConfig(batch_size=8)
    batches = models.sparse_nn_batches(cfg, counts[env.rank], world_size=env.world_size, rank=env.rank)
    model, opt = models.sparse_nn(cfg, env.device)
    reference = []
    for b in batches[:min(counts)]:
        opt.zero_grad()
        loss, pred = model(b)
        loss.backward()
        opt.step()
        reference.append(pred)
    out = {"reference": reference}
    for label, plan, options in scenarios:
        model, opt = models.sparse_nn(cfg, env.device)
        with TrainPipeline(model, opt, env.device, plan=plan, **options) as pipeline:
            it = iter(batches)
            got = []
            while True:
                try:
                    got.append(pipeline.progress(it))
                except StopIteration:
                    break
            out[label] = {"outputs": got, "leftover": len(pipeline.leftover), "rest": sum(1 for _ in it),
                          "plan": pipeline.plan.task_names and repr(sorted(
                              (t, pipeline.plan.stage(t), pipeline.plan.sched(t).thread_group)
                              for t in pipeline.plan.task_names))}
    return out


@pytest.fixture(scope="module")
def ranks():
    from swpipe.workloads.launch import spawn

    return spawn(uneven_rank, 2, COUNTS, SCENARIOS, backend="gloo", timeout=240)


@pytest.mark.parametrize("label", [s[0] for s in SCENARIOS])
def test_both_ranks_stop_at_the_same_batch_and_equal_their_plain_loop(ranks, label):
    common = min(COUNTS)
    for rank, r in enumerate(ranks):
        got = r[label]["outputs"]
        assert len(got) == common, f"rank {rank} returned {len(got)} outputs, the other ranks' data ended at {common}"
        for step, (a, b) in enumerate(zip(got, r["reference"])):
            torch.testing.assert_close(a, b, msg=lambda m: f"{label}, rank {rank}, step {step}: {m}")
    # rank 0 took one batch more than it trained (the exchange that found rank 1's data ended), one is left unread
    assert [(r[label]["leftover"], r[label]["rest"]) for r in ranks] == [(1, 1), (0, 0)]
    assert ranks[0][label]["plan"] == ranks[1][label]["plan"]  # one plan on every rank (auto: rank 0's search)
