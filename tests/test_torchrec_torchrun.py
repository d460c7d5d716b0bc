"""Two ranks under ``torchrun`` with uneven batch counts end together (``swpipe.torchrec.TrainPipeline``).

``tests/torchrun_torchrec_worker.py`` runs on each rank (rank 0 holds 6 batches,
rank 1 holds 4); both must train 4, raise ``StopIteration`` and exit, within
the launcher's wall clock (``tests/test_torchrun.py``'s ``torchrun``: on
overrun the process group is killed and the test fails, it never hangs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import requires_torchrec
from test_torchrun import torchrun

pytestmark = [pytest.mark.peer, pytest.mark.slow, pytest.mark.timeout(400),
              requires_torchrec]

WORKER = Path(__file__).with_name("torchrun_torchrec_worker.py")


def test_two_ranks_with_uneven_batches_end_together(tmp_path):
    proc = torchrun(2, str(WORKER), str(tmp_path))
    assert proc.returncode == 0, f"torchrun failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world_size"], r["launcher"]) for r in ranks] == [(0, 2, True), (1, 2, True)]
    assert [r["batches"] for r in ranks] == [6, 4]
    assert [r["trained"] for r in ranks] == [4, 4], "the ranks did not stop at the same batch"
    assert [r["leftover"] for r in ranks] == [1, 0]
    assert all(r["equal"] for r in ranks), "a rank's outputs differ from its non-pipelined loop"
