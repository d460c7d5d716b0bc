"""Measuring an iteration's bytes: storages reachable from a context, per-task deltas, profiler, CUDA allocator."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from autosched.model.costs import CostModel
from swpipe_core import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.measure.memory import measure_task_memory, reachable_bytes, reachable_storages
from swpipe_core.plan import IterContext
from swpipe_core.measure.profiler import TaskProfiler
from swpipe_core.measure.result import ProfileResult


@dataclasses.dataclass
class _Pair:
    a: torch.Tensor
    b: torch.Tensor


class _Slotted:
    __slots__ = ("t", "unset")

    def __init__(self, t):
        self.t = t


def test_shared_storage_counted_once_across_views_containers_and_objects():
    x = torch.zeros(1000, dtype=torch.float32)  # 4000 bytes
    y = torch.ones(10, dtype=torch.float64)  # 80 bytes
    ctx = IterContext({"x": x, "nested": [(x[5:], {"v": x.view(10, 100)})]}, 0)
    ctx.pair = _Pair(x[:3], y)
    ctx.slotted = _Slotted(y[1:])
    ctx.again = ctx.batch  # a second path to the same objects
    assert reachable_bytes(ctx) == 4080
    assert len(reachable_storages(ctx)) == 2


def test_modules_are_not_counted_as_iteration_state():
    ctx = IterContext(None, 0)
    ctx.model = torch.nn.Linear(100, 100)
    ctx.out = torch.zeros(5)
    assert reachable_bytes(ctx) == 20


def test_cyclic_references_terminate():
    a: list = [torch.zeros(4)]
    a.append(a)
    assert reachable_bytes({"a": a, "self": a}) == 16


def test_leaf_grad_is_counted():
    w = torch.zeros(8, requires_grad=True)
    w.sum().backward()
    assert reachable_bytes([w]) == 64


def _plan():
    def load(ctx):
        ctx.x = torch.zeros(1024)  # 4096 bytes
        ctx.alias = ctx.x[:10]  # no new storage

    def step(ctx):
        tmp = torch.ones(2048)  # a temporary: never in the context
        ctx.y = tmp[:16].clone()  # 64 bytes
        del ctx.x, ctx.alias

    return PipelinePlan({PipelineTask("Load", load): TaskSchedule(0), PipelineTask("Step", step): TaskSchedule(1)},
                        intra_iter_deps=[("Step", "Load")])


def test_measure_task_memory_reports_adds_frees_and_batch():
    with SWPipeline(_plan(), device="cpu") as pipe:
        m = measure_task_memory(pipe, torch.zeros(25, dtype=torch.float64), num_iterations=2)
        assert pipe.instruments == ()  # the wrapper is removed
    assert m.batch_bytes == 200
    assert (m.tasks["Load"].add_bytes, m.tasks["Load"].free_bytes) == (4096, 0)
    assert (m.tasks["Step"].add_bytes, m.tasks["Step"].free_bytes) == (64, 4096)
    # CPU: the device figures are the context figures
    assert (m.tasks["Step"].device_alloc_bytes, m.tasks["Step"].device_free_bytes) == (64, 4096)


def test_measure_task_memory_rejects_zero_iterations():
    with SWPipeline(_plan(), device="cpu") as pipe:
        with pytest.raises(ValueError, match="num_iterations"):
            measure_task_memory(pipe, None, num_iterations=0)


def test_profiler_records_memory_and_cost_model_keeps_it(tmp_path):
    with SWPipeline(_plan(), device="cpu") as pipe:
        r = TaskProfiler(pipe, num_warmup=0, num_measure=2, num_rounds=1).profile(torch.zeros(4))
    assert r.memory["tasks"]["Load"]["add_bytes"] == 4096
    path = tmp_path / "p.json"
    r.save(path)
    assert json.loads(path.read_text())["version"] == 2
    back = ProfileResult.load(path)
    assert back.memory == r.memory
    costs = CostModel.from_profile(back)
    assert costs.batch_bytes == 16 and costs["Step"].free_bytes == 4096 and costs["Step"].add_bytes == 64


def test_profiler_memory_off_leaves_version_1():
    with SWPipeline(_plan(), device="cpu") as pipe:
        r = TaskProfiler(pipe, num_warmup=0, num_measure=1, num_rounds=1).profile(torch.zeros(4), memory=False)
    assert r.memory is None and r.to_dict()["version"] == 1


def test_profile_result_version_1_still_loads():
    r = ProfileResult.from_dict({"version": 1, "baseline_s": 0.01, "exposed_s": {"A": 0.002}})
    assert r.memory is None and r.exposed_s == {"A": 0.002}


# -- CUDA: the caching allocator's counters around each task ------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.timeout(120)
def test_cuda_device_bytes_include_temporaries_context_bytes_do_not(cuda_device):
    from swpipe.testing import kernels

    k, mib = kernels(cuda_device), 1 << 20

    def load(ctx):
        ctx.x = k.empty(mib // 4)  # 1 MiB kept in the context

    def step(ctx):
        tmp = k.empty(2 * mib // 4)  # 2 MiB temporary, released before the task returns
        ctx.y = k.sum(tmp)
        del tmp, ctx.x

    plan = PipelinePlan({PipelineTask("Load", load): TaskSchedule(0), PipelineTask("Step", step): TaskSchedule(1)},
                        intra_iter_deps=[("Step", "Load")])
    with SWPipeline(plan, device=cuda_device) as pipe:
        m = measure_task_memory(pipe, k.empty(4), num_iterations=3)
    load_m, step_m = m.tasks["Load"], m.tasks["Step"]
    assert load_m.add_bytes == mib and load_m.device_alloc_bytes >= mib
    assert step_m.free_bytes == mib and step_m.add_bytes < 1024  # context: the one-element sum only
    assert step_m.device_alloc_bytes >= 2 * mib  # the allocator saw the temporary
    # the temporary went back; ctx.x goes back once the iteration's device work completed (the context keeps it)
    assert 2 * mib <= step_m.device_free_bytes < 3 * mib
    assert "allocator" in m.method  # measured by the device's allocator


@pytest.mark.cuda
@pytest.mark.timeout(120)
def test_cuda_profiler_records_device_bytes(cuda_device):
    from swpipe.testing import kernels

    k = kernels(cuda_device)

    def work(ctx):
        ones = k.full(1 << 18, 1.0)  # a 1 MiB temporary
        ctx.out = k.add_(k.full(1 << 18, 2.0), ones)  # 1 MiB kept

    plan = PipelinePlan({PipelineTask("Work", work): TaskSchedule(0)})
    with SWPipeline(plan, device=cuda_device) as pipe:
        r = TaskProfiler(pipe, num_warmup=1, num_measure=2, num_rounds=1).profile(k.empty(1))
    w = r.memory["tasks"]["Work"]
    assert w["add_bytes"] == 1 << 20
    assert w["device_alloc_bytes"] >= 2 << 20 and w["device_free_bytes"] >= 1 << 20
    assert CostModel.from_profile(r)["Work"].device_alloc_bytes == w["device_alloc_bytes"]


def test_transient_bytes_are_what_a_task_holds_only_while_it_runs():
    def grow(ctx):
        ctx.small = torch.zeros(5)  # 20 bytes, kept
        ctx.big = torch.zeros(500)  # 2000 bytes, held during the task only
        ctx.big.sum()  # a call returning while both are held: the sampler sees 2020 here
        del ctx.big

    plan = PipelinePlan({PipelineTask("Grow", grow): TaskSchedule(0)})
    with SWPipeline(plan, device="cpu") as pipe:
        m = measure_task_memory(pipe, None, num_iterations=1)
    g = m.tasks["Grow"]
    assert (g.add_bytes, g.free_bytes) == (20, 0)
    assert g.transient_bytes == 2000  # 2020 at most during the task, 20 after it


def test_a_task_that_frees_a_tensor_and_makes_one_at_its_address_counts_both():
    """A new tensor at the address a freed one gave back is still another storage: both are counted."""
    size = 1 << 18  # 1 MiB of float32: the allocator usually hands a freed block of this size out again at once

    def load(ctx):
        ctx.x = torch.zeros(size)

    def swap(ctx):
        freed = ctx.x.untyped_storage().data_ptr()
        del ctx.x
        others = []  # kept until the freed block comes back, so each try gets another block
        for _ in range(16):
            y = torch.zeros(size)
            if y.untyped_storage().data_ptr() == freed:
                break
            others.append(y)
        ctx.y = y

    plan = PipelinePlan({PipelineTask("Load", load): TaskSchedule(0), PipelineTask("Swap", swap): TaskSchedule(0)},
                        intra_iter_deps=[("Swap", "Load")])
    with SWPipeline(plan, device="cpu") as pipe:
        m = measure_task_memory(pipe, None, num_iterations=3)
    assert (m.tasks["Swap"].add_bytes, m.tasks["Swap"].free_bytes) == (4 * size, 4 * size)
