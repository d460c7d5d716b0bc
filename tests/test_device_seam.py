"""The device seam: one module names torch.cuda; named streams are made once per device and name."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

from swpipe_core.engine import device as device_module
from swpipe_core.engine.device import CpuDevice, CudaDevice, as_device

ROOT = Path(__file__).resolve().parents[1]


def test_only_the_seam_names_torch_cuda():
    """Swapping the device for tests is one switch: no other module of the library calls torch.cuda."""
    seam = ROOT / "src" / "swpipe_core" / "engine" / "device.py"
    offenders = []
    for package in ("swpipe_core", "autosched", "swpipe"):
        for path in sorted((ROOT / "src" / package).rglob("*.py")):
            if path == seam:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if re.search(r"\btorch\.cuda\b", code) and "``" not in code:
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []


class _PooledStream:
    """What torch.cuda.Stream() gives: the next of a pool of 32 ids per device, round robin."""

    next_id = 1

    def __init__(self, device=None, priority=0):
        self.stream_id = _PooledStream.next_id
        _PooledStream.next_id = _PooledStream.next_id % 32 + 1
        self.device = torch.device("cuda", 0)


def test_a_stream_name_that_lands_on_a_taken_pool_stream_is_reported(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Stream", _PooledStream)
    monkeypatch.setattr(torch.cuda, "default_stream", lambda index=None: type("S", (), {"stream_id": 0})())
    _PooledStream.next_id = 1
    dev = CudaDevice(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = [dev.new_stream(f"s{i}") for i in range(32)]  # 32 distinct queues: no warning
    assert len({s.stream_id for s in first}) == 32
    assert dev.new_stream("s0") is first[0]  # a name is made once
    with pytest.warns(RuntimeWarning, match="'one-too-many'.*'s0'"):  # the new stream, the one it shares a queue with
        dev.new_stream("one-too-many")


def test_as_device_keeps_one_cuda_device_per_index_and_takes_devices_as_given(monkeypatch):
    monkeypatch.setattr(device_module, "cuda_available", lambda: True)
    monkeypatch.setattr(device_module, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(device_module, "_CUDA_DEVICES", {})
    a, b = as_device("cuda:1"), as_device(torch.device("cuda", 1))
    assert a is b and isinstance(a, CudaDevice) and a.index == 1
    cpu = CpuDevice()
    assert as_device(cpu) is cpu and as_device("cpu").torch_device == torch.device("cpu")


# -- an integer device where CUDA is not available (issue 45) ------------------------------------------------------

def _one_task_plan():
    from swpipe import PipelinePlan, PipelineTask, TaskSchedule

    return PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule()})


@pytest.mark.parametrize("device", [0, 1])
def test_an_integer_device_without_cuda_warns_where_the_pipeline_is_made(monkeypatch, device):
    from swpipe import SWPipeline
    from swpipe_core.engine.device import CpuFallbackWarning

    monkeypatch.setattr(device_module, "cuda_available", lambda: False)
    with pytest.warns(CpuFallbackWarning) as caught:
        pipe = SWPipeline(_one_task_plan(), device=device)
    (warning,) = [w for w in caught if w.category is CpuFallbackWarning]
    assert warning.message.requested == device and warning.filename == __file__  # the user's line, not ours
    assert pipe.device == torch.device("cpu") and isinstance(warning.message, RuntimeWarning)
    for cpu in ("cpu", torch.device("cpu"), CpuDevice()):  # asking for the CPU warns nothing
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert SWPipeline(_one_task_plan(), device=cpu).device == torch.device("cpu")
