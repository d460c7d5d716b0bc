"""Long runs leak nothing: threads, iteration contexts, tensors and memory stay flat.

Two workloads on a small three-task plan (two thread groups, depth 3, a
globally ordered task, an inter-iteration dependency), each task making a
tensor so that a leaked context would hold memory:

* :func:`fill_drain_cycles`: 1,000 ``fill_pipeline`` / ``progress`` / ``drain``
  cycles, each starting and joining the worker threads;
* :func:`long_run`: one 10,000-iteration pipelined run, sampled every 1,000
  iterations.

Live contexts and tensors are counted with ``weakref.WeakSet`` (after
``gc.collect()`` at each sample), memory with ``tracemalloc`` (Python heap,
traced from after a warm-up) and the process RSS. ``benchmarks/reliability.py``
reports the same figures. The two long tests take 5-15 s each on a shared
two-core machine and are marked slow (CI runs them).
"""

from __future__ import annotations

import gc
import os
import threading
import time
import tracemalloc
import weakref
from typing import Any, Dict, List

import pytest
import torch

from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from conftest import swpipe_threads as _swpipe_threads

DEPTH = 3
GROUPS = 2


class Tracked:
    """A small plan whose tasks register every context and tensor they make in weak sets."""

    def __init__(self) -> None:
        self.contexts: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.tensors: "weakref.WeakSet[torch.Tensor]" = weakref.WeakSet()
        self.max_threads = 0
        self.steps = 0

    def plan(self) -> PipelinePlan:
        def load(ctx):
            self.contexts.add(ctx)
            ctx.x = torch.full((256,), float(ctx.iter_idx))  # 1 KiB per iteration
            self.tensors.add(ctx.x)

        def forward(ctx):
            ctx.y = ctx.x * 2
            self.tensors.add(ctx.y)

        def step(ctx):
            self.steps += 1
            if ctx.iter_idx % 100 == 0:
                self.max_threads = max(self.max_threads, threading.active_count())

        return PipelinePlan(
            {PipelineTask("Load", load): TaskSchedule(0, thread_group="io"),
             PipelineTask("Forward", forward): TaskSchedule(1, thread_group="compute", globally_ordered=True),
             PipelineTask("Step", step): TaskSchedule(2, thread_group="compute")},
            intra_iter_deps=[("Forward", "Load"), ("Step", "Forward")],
            inter_iter_deps=[("Forward", "Step", 1)],
        )

    def live(self) -> Dict[str, int]:
        gc.collect()
        return {"contexts": len(self.contexts), "tensors": len(self.tensors)}


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def fill_drain_cycles(cycles: int = 1000, warmup: int = 100) -> Dict[str, Any]:
    """``cycles`` x (fill_pipeline, one progress, drain); figures after each phase."""
    tracked = Tracked()
    pipe = SWPipeline(tracked.plan(), device="cpu")
    threads_before = threading.active_count()
    thread_counts = set()
    t0 = time.perf_counter()

    def cycle(k: int) -> None:
        it = pipe.fill_pipeline(range(k, k + 5))
        pipe.progress(it)
        thread_counts.add(threading.active_count())
        pipe.drain()

    for k in range(warmup):
        cycle(k)
    tracemalloc.start()
    try:
        gc.collect()
        heap0, rss0 = tracemalloc.get_traced_memory()[0], rss_bytes()
        for k in range(warmup, cycles):
            cycle(k)
        gc.collect()
        heap1, rss1 = tracemalloc.get_traced_memory()[0], rss_bytes()
    finally:
        tracemalloc.stop()
    live = tracked.live()
    return {
        "cycles": cycles, "seconds": time.perf_counter() - t0,
        "threads_before": threads_before, "threads_during": sorted(thread_counts),
        "threads_after": threading.active_count(), "swpipe_threads_after": _swpipe_threads(),
        "live_contexts_after": live["contexts"], "live_tensors_after": live["tensors"],
        "iterations_completed": tracked.steps, "heap_delta_bytes": heap1 - heap0, "rss_delta_bytes": rss1 - rss0,
        "measured_cycles": cycles - warmup,
    }


def long_run(iterations: int = 10_000, sample_every: int = 1000) -> Dict[str, Any]:
    """One pipelined run of ``iterations``; live objects, threads and memory sampled every ``sample_every``."""
    tracked = Tracked()
    pipe = SWPipeline(tracked.plan(), device="cpu")
    threads_before = threading.active_count()
    samples: List[Dict[str, int]] = []
    heap_at: Dict[int, int] = {}
    t0 = time.perf_counter()
    tracemalloc.start()
    try:
        it = pipe.fill_pipeline(range(iterations))
        while True:
            try:
                idx = pipe.progress(it)
            except StopIteration:
                break
            if (idx + 1) % sample_every == 0:
                live = tracked.live()
                samples.append({"iteration": idx, "threads": threading.active_count(), "rss": rss_bytes(),
                                "heap": tracemalloc.get_traced_memory()[0], **live})
        pipe.drain()
    finally:
        tracemalloc.stop()
    seconds = time.perf_counter() - t0
    live = tracked.live()
    first, last = samples[0], samples[-1]
    return {
        "iterations": iterations, "seconds": seconds, "samples": samples,
        "threads_before": threads_before, "threads_during": sorted({s["threads"] for s in samples}),
        "threads_after": threading.active_count(), "swpipe_threads_after": _swpipe_threads(),
        "max_live_contexts": max(s["contexts"] for s in samples),
        "max_live_tensors": max(s["tensors"] for s in samples),
        "live_contexts_after": live["contexts"], "live_tensors_after": live["tensors"],
        "iterations_completed": tracked.steps,
        # from the first sample (after warm-up) to the last
        "heap_delta_bytes": last["heap"] - first["heap"], "rss_delta_bytes": last["rss"] - first["rss"],
        "measured_iterations": last["iteration"] - first["iteration"],
    }


# A leak of one small object per iteration or cycle (>= 64 bytes) exceeds these; the measured deltas are
# reported by benchmarks/reliability.py.
HEAP_PER_STEP_LIMIT = 64


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_thousand_fill_drain_cycles_keep_threads_contexts_and_memory_flat():
    out = fill_drain_cycles(1000)
    # fill takes DEPTH batches, progress one more; drain completes those in flight and takes no new data
    assert out["iterations_completed"] == (DEPTH + 1) * 1000
    assert out["threads_during"] == [out["threads_before"] + GROUPS]
    assert out["threads_after"] == out["threads_before"] and out["swpipe_threads_after"] == []
    assert out["live_contexts_after"] == 0 and out["live_tensors_after"] == 0
    assert out["heap_delta_bytes"] < HEAP_PER_STEP_LIMIT * out["measured_cycles"], out["heap_delta_bytes"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ten_thousand_iterations_hold_at_most_depth_contexts_and_flat_memory():
    out = long_run(10_000)
    assert out["iterations_completed"] == 10_000
    assert len(out["samples"]) == 10
    # at each sample the retired iterations are gone: no more than `depth` contexts and their tensors
    assert out["max_live_contexts"] <= DEPTH, out["samples"]
    assert out["max_live_tensors"] <= 2 * DEPTH, out["samples"]
    assert out["threads_during"] == [out["threads_before"] + GROUPS]
    assert out["threads_after"] == out["threads_before"] and out["swpipe_threads_after"] == []
    assert out["live_contexts_after"] == 0 and out["live_tensors_after"] == 0
    assert out["heap_delta_bytes"] < HEAP_PER_STEP_LIMIT * out["measured_iterations"], out["heap_delta_bytes"]


def test_leak_detector_sees_a_leak():
    """The counters are not blind: contexts kept alive by the caller are counted."""
    tracked = Tracked()
    kept = []
    plan = tracked.plan()
    load = plan.task("Load").fn
    pipe = SWPipeline(plan.bind({"Load": lambda ctx: (load(ctx), kept.append(ctx))}), device="cpu")
    pipe.run(range(50))
    assert tracked.live() == {"contexts": 50, "tensors": 100}
    kept.clear()
    assert tracked.live() == {"contexts": 0, "tensors": 0}
