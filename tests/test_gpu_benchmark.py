"""``benchmarks/gpu_overlap.py``, the figures a GPU session records first: it runs on the CPU, on the fake CUDA
device and on a GPU, and every iteration's compute reads every element its copy moved, with values of that
iteration only, exactly, pipelined as serial (on CUDA: the copy on the ``memcpy`` stream is ordered before the
compute that reads it). A compute the device does not order after its copy is reported."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import load_benchmark

from swpipe.testing import RaceError, kernels
from swpipe_core.device import as_device

pytestmark = pytest.mark.timeout(300)


def _bench():
    return load_benchmark("gpu_overlap")


def test_smoke_run_on_a_cpu_prints_every_figure_and_pipelined_equals_serial(capsys):
    got = _bench().main(["--device", "cpu", "--quick"])
    out = capsys.readouterr().out
    assert got["overlap"]["equal"]
    assert got["overlap"]["races"] is None  # no fake, no race check
    assert set(got["overlap"]["predicted"]) == {"serial", "pipelined"}
    assert len(got["overlap"]["times"]["serial"]) == len(got["overlap"]["times"]["pipelined"]) == 2
    for line in ("(a) overlap", "(b) serial", "(b) pipelined", "(c) engine"):
        assert line in out


def test_without_a_gpu_the_default_run_says_what_to_do():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(SystemExit, match="no CUDA device.*--device fake"):
        _bench().main([])


def test_each_iteration_sums_to_its_own_value_and_a_partly_stale_or_partial_read_is_caught():
    """What the old check passed: a read of the first elements only, and a block holding an older batch."""
    bench, dev = _bench(), as_device("cpu")
    k = kernels(dev)
    elems, iters = 1000, 6
    batches = bench.host_batches(k, dev, elems, iters)
    assert len({bench.expected_sum(i, elems) for i in range(iters)}) == iters  # no two iterations look alike
    good = {i: k.sum(b) for i, b in enumerate(batches)}
    assert bench.check_sums(k, good, elems, iters) == []
    half = elems // 2
    bad = dict(good)
    bad[2] = k.sum(batches[2][:half].contiguous())  # the compute read only the part of the copy that came first
    bad[4] = k.sum(torch.cat([batches[4][:half], batches[2][half:]]))  # the rest still iteration 2's: two host
    bad[5] = k.sum(batches[3])                                          # buffers alternating made it look right
    del bad[1]  # an iteration whose compute never ran
    assert [i for i, _, _ in bench.check_sums(k, bad, elems, iters)] == [1, 2, 4, 5]


def _sizes(dev):
    # the fake copies with the CPU: a few MiB; a GPU copies fast enough that 32 MiB keeps its queue busy
    return (2, 6) if getattr(dev, "fake", None) is not None else (32, 12)


@pytest.mark.cuda
def test_pipelined_copy_and_compute_read_every_element_exactly_on_the_fake_and_a_gpu(cuda_device):
    fake = getattr(cuda_device, "fake", None)
    mib, iters = _sizes(cuda_device)
    ov = _bench().measure_overlap(cuda_device, mib=mib, spins=2, iters=iters, rounds=1)
    assert ov["mismatches"] == {"serial": [], "pipelined": []} and ov["equal"]
    assert ov["elements"] == mib * 2 ** 20 // 8  # every element of the copy, float64
    assert ov["costs"]["Copy"].device_s > 0  # the profiler timed the copy on the device
    if fake is not None:
        fake.assert_no_races()
        # the copy and the compute ran on two streams: what ordered them is the engine's device wait
        ran = {(launch.label.split("(")[0], launch.stream) for launch in fake.launches}
        assert {("Copy", "memcpy"), ("Compute", "default")} <= ran


@pytest.mark.cuda
def test_a_compute_that_does_not_wait_on_the_device_for_its_copy_is_reported(fake_cuda, monkeypatch):
    """The fault the benchmark must catch: the engine's Phase 2 wait of Compute's stream on Copy's event dropped.

    The values then depend on timing (a sum that ran before its copy ended reads the poison or another
    iteration's values); the race check reports every such read whatever the timing, so it is what is asserted.
    """
    dev = fake_cuda.device(0)
    default, wait = dev.default_stream(), dev.wait
    dropped = []

    def no_wait_on_the_default_stream(stream, event):
        if stream is default:  # Compute's stream: it no longer waits for Copy's event
            dropped.append(event)
            return
        wait(stream, event)

    monkeypatch.setattr(dev, "wait", no_wait_on_the_default_stream)
    mib, iters = _sizes(dev)
    ov = _bench().measure_overlap(dev, mib=mib, spins=2, iters=iters, rounds=1)
    assert dropped  # the fault was injected
    assert not ov["equal"] or ov["races"]
    unordered = {i for i in range(iters) for race in ov["races"]
                 if f"Compute({i}) on default reads" in race and f"which Copy({i}) on memcpy writes" in race}
    assert unordered == set(range(iters))  # every pipelined iteration's read, named
    with pytest.raises(RaceError):
        fake_cuda.assert_no_races()


@pytest.mark.cuda
def test_the_command_line_run_on_the_fake_prints_every_figure_and_closes_the_fake(capsys):
    before = set(threading.enumerate())
    got = _bench().main(["--device", "fake", "--quick"])
    out = capsys.readouterr().out
    assert got["overlap"]["equal"] and got["overlap"]["races"] == []
    assert "FakeCuda device 0" in out and "races between streams (fake's check): 0" in out
    for line in ("(a) overlap", "(b) serial", "(b) pipelined", "(c) engine"):
        assert line in out
    assert not [t.name for t in set(threading.enumerate()) - before if t.name.startswith("fakecuda")]


@pytest.mark.gpu
def test_on_a_gpu_the_command_line_run_is_exact_and_times_the_copy_on_the_device():
    got = _bench().main(["--device", "cuda", "--mib", "64", "--n", "4", "--iters", "12", "--rounds", "2"])
    assert got["overlap"]["equal"]
    assert got["overlap"]["costs"]["Copy"].device_s > 0  # the profiler timed the copy on the device
