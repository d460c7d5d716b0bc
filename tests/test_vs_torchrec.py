"""Peer check against TorchRec itself (needs the [peer] extra; skipped without TorchRec).

Our base / sparse_dist / sparse_dist_lite plans drive TorchRec's sharded DLRM
and must give the per-step outputs TorchRec's TrainPipelineBase /
TrainPipelineSparseDist / TrainPipelineSparseDistLite give on the same model,
weights and batches (``torch.testing.assert_close``, as TorchRec's
``test_equal_to_non_pipelined``), and both must equal the non-pipelined loop.
"""

from __future__ import annotations

import pytest
import torch

from swpipe.workloads.torchrec_peer import PEERS
from conftest import requires_torchrec

pytestmark = [pytest.mark.peer, pytest.mark.timeout(300),
              requires_torchrec]


@pytest.fixture(scope="module")
def setup():
    from swpipe.workloads.dlrm import DLRMConfig, init_distributed
    from swpipe.workloads.torchrec_peer import build_model, run_plain, to_torchrec_batches

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    env = init_distributed(backend="gloo", device=torch.device("cpu"))
    config = DLRMConfig.preset("test")
    batches = to_torchrec_batches(config, 6)
    plain, _ = run_plain(build_model(config), batches)
    yield config, batches, plain
    env.close()
    torch.set_num_threads(before)


@pytest.mark.parametrize("thread_map, after", [(None, None), ("by_stream", None), ("by_stream", "Forward")])
@pytest.mark.parametrize("name", list(PEERS))
def test_our_plan_gives_torchrecs_outputs_on_torchrecs_model(setup, name, thread_map, after):
    from swpipe.workloads.torchrec_peer import build_model, run_swpipe, run_torchrec

    config, batches, plain = setup
    theirs, _ = run_torchrec(name, build_model(config), batches)
    ours, _ = run_swpipe(name, build_model(config), batches, thread_map, after)
    assert len(theirs) == len(ours) == len(plain) == len(batches)
    for step, (a, b, c) in enumerate(zip(ours, theirs, plain)):
        torch.testing.assert_close(a, b, msg=lambda m: f"step {step}: ours vs TorchRec: {m}")
        torch.testing.assert_close(b, c, msg=lambda m: f"step {step}: TorchRec vs plain loop: {m}")
    assert not torch.equal(ours[0], ours[-1])  # the model trains; the steps are not trivially equal
