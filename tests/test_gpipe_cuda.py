"""GPipe's plans on CUDA semantics: two fake devices, copies on copy streams, events between, exact values, no race.

``swpipe.testing.FakeCuda`` runs each stream on an executor thread with
random kernel delays and reuses a freed block at once on the stream that
allocated it, so a missing event wait or an early free gives wrong numbers
and a reported race. The partitions here are kernels of the fake (a partition
adds ``j + 1``; its backward adds ``10 (j + 1)`` to the gradient), run by the
same plans GPipe builds (:mod:`swpipe.gpipe.schedule`) on the engine.
"""

from __future__ import annotations

import pytest

from swpipe import SWPipeline, validate
from swpipe.gpipe.schedule import bind, forward_plan, placements, step_plan

pytestmark = pytest.mark.cuda

N = 64  # elements per micro-batch


class FakeOps:
    """The task functions of a GPipe plan, on a fake device's kernels (ctx keys as swpipe.gpipe.runtime's)."""

    def __init__(self, devices, places, results):
        self.devices, self.places, self.results = devices, places, results
        self.n = len(devices)

    def ops(self):
        return {"F": self.forward, "C": self.copy, "B": self.backward, "G": self.grad_copy}

    def _copy_to(self, j, x):
        k = self.devices[j].kernels  # launched on device j's current stream: the task's copy stream
        y = k.empty(N)
        k.copy_(y, x)
        return y

    def forward(self, j, ctx):
        k = self.devices[j].kernels
        if j == 0:
            ctx.inp, ctx.grads = {}, {}
            x = ctx.batch[1]
        else:
            x = ctx.inp.pop(j)
        y = k.empty(N)
        k.copy_(y, x)
        k.add_(y, k.full(N, float(j + 1)))
        if j + 1 < self.n:
            ctx.inp[j + 1] = y
        else:
            self.results.setdefault("out", {})[ctx.batch[0]] = y

    def copy(self, j, ctx):
        ctx.inp[j] = self._copy_to(j, ctx.inp[j])

    def grad_copy(self, j, ctx):
        ctx.grads[j] = self._copy_to(j, ctx.grads.pop(j))

    def backward(self, j, ctx):
        k = self.devices[j].kernels
        g = k.full(N, 1.0) if j == self.n - 1 else ctx.grads.pop(j)
        out = k.empty(N)
        k.copy_(out, g)
        k.add_(out, k.full(N, 10.0 * (j + 1)))
        if j > 0:
            ctx.grads[j - 1] = out
        else:
            self.results.setdefault("grad", {})[ctx.batch[0]] = out


def run(fake, plan_of, microbatches=6):
    devices = [fake.device(0), fake.device(1)]
    places = placements(devices)
    plan = plan_of(places)
    validate(plan)
    results = {}
    ops = FakeOps(devices, places, results)
    k0 = devices[0].kernels
    batches = [(i, k0.full(N, float(i))) for i in range(microbatches)]
    SWPipeline(bind(plan, ops.ops()), device=devices[0]).run(batches)
    return plan, results


def test_forward_across_two_devices_copies_on_copy_streams_without_a_race(fake_cuda):
    plan, results = run(fake_cuda, lambda places: forward_plan(places, microbatches=6))
    assert plan.task_names == ["F0", "C1", "F1"]
    k1 = fake_cuda.device(1).kernels
    assert {i: k1.to_host(y).tolist() for i, y in results["out"].items()} == {i: [i + 3.0] * N for i in range(6)}
    fake_cuda.assert_no_races()
    streams = {launch.label.split("(")[0]: set() for launch in fake_cuda.launches}
    for launch in fake_cuda.launches:
        streams[launch.label.split("(")[0]].add(launch.stream)
    assert streams["C1"] == {"gpipe-copy"} and streams["F0"] == streams["F1"] == {"default"}


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_a_training_step_runs_backward_in_order_across_devices(fake_cuda, schedule):
    plan, results = run(fake_cuda, lambda places: step_plan(places, schedule, 6))
    assert plan.task_names == ["F0", "C1", "F1", "B1", "G0", "B0"]
    k0 = fake_cuda.device(0).kernels
    assert {i: k0.to_host(g).tolist() for i, g in results["grad"].items()} == {i: [31.0] * N for i in range(6)}
    fake_cuda.assert_no_races()
    launches = {}
    for launch in fake_cuda.launches:
        launches.setdefault(launch.label, []).append(launch)
    for i in range(6):
        # on the device: B1's kernels, then the gradient's copy on device 0's copy stream, then B0's
        assert all(a.before(b) for a in launches[f"B1({i})"] for b in launches[f"G0({i})"])
        assert all(a.before(b) for a in launches[f"G0({i})"] for b in launches[f"B0({i})"])
        assert {launch.stream for launch in launches[f"G0({i})"]} == {"gpipe-copy"}
