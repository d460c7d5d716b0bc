"""``benchmarks/gpu_overlap.py``, the figures a GPU session records first: it runs, and its pipelined results
equal the serial ones (on CUDA: the copy on the ``memcpy`` stream is ordered before the compute that reads it)."""

from __future__ import annotations

import pytest
import torch
from conftest import load_benchmark

pytestmark = pytest.mark.timeout(300)


def _bench():
    return load_benchmark("gpu_overlap")


def test_smoke_run_on_a_cpu_prints_every_figure_and_pipelined_equals_serial(capsys):
    got = _bench().main(["--device", "cpu", "--quick"])
    out = capsys.readouterr().out
    assert got["overlap"]["equal"]
    assert set(got["overlap"]["predicted"]) == {"serial", "pipelined"}
    assert len(got["overlap"]["times"]["serial"]) == len(got["overlap"]["times"]["pipelined"]) == 2
    for line in ("(a) overlap", "(b) serial", "(b) pipelined", "(c) engine"):
        assert line in out


def test_without_a_gpu_the_default_run_says_what_to_do():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(SystemExit, match="no CUDA device"):
        _bench().main([])


@pytest.mark.cuda
def test_on_a_gpu_pipelined_copy_and_compute_equal_serial():
    got = _bench().main(["--device", "cuda", "--mib", "64", "--n", "1024", "--iters", "12", "--rounds", "2"])
    assert got["overlap"]["equal"]
    assert got["overlap"]["costs"]["Copy"].device_s > 0  # the profiler timed the copy on the device
