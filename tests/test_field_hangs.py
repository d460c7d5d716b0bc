"""What hangs other pipelines in this field, and what swpipe does instead.

* Uneven data across ranks (one rank's loader ends first): wrapped in
  :func:`swpipe_core.distributed.agree_on_end`, every rank stops at the same
  batch; the batches the longer ranks already took stay in ``.leftover`` /
  ``.rest()``. The two-rank case runs on real gloo in
  ``tests/test_multirank.py`` (slow); here the single-process mechanics.
* A new iterator passed to ``progress()`` mid-run: a clear error, the run
  untouched (no silent restart, no lost or repeated batch); the documented
  reset is ``drain()`` + ``fill_pipeline(new)``.
* An empty iterator, or one shorter than the pipeline depth.
* A batch that cannot be moved to the device: ``PipelineTaskError`` naming the
  copy task and the iteration.
"""

from __future__ import annotations

from typing import Any, List

import pytest
import torch

from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from conftest import progress_until_end, swpipe_threads

pytestmark = pytest.mark.timeout(60)


def make_pipe(seen: List[Any], h2d=None, **kw) -> SWPipeline:
    """H2D (io, stage 0) -> Forward (compute, stage 1) -> Step (compute, stage 2): depth 3."""

    def copy(ctx):
        ctx.x = ctx.batch.to("cpu") if isinstance(ctx.batch, torch.Tensor) else ctx.batch

    def step(ctx):
        seen.append((ctx.iter_idx, ctx.batch if not isinstance(ctx.batch, torch.Tensor) else int(ctx.batch[0])))

    plan = PipelinePlan({PipelineTask("H2D", h2d or copy): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Forward", lambda ctx: None): TaskSchedule(1, thread_group="compute"),
                         PipelineTask("Step", step): TaskSchedule(2, thread_group="compute")},
                        intra_iter_deps=[("Forward", "H2D"), ("Step", "Forward")])
    return SWPipeline(plan, device="cpu", **kw)


# ----------------------------------------------------------------------------- a new iterator mid-run

def test_new_iterator_mid_run_is_refused_and_the_run_continues_unharmed():
    seen: List[Any] = []
    pipe = make_pipe(seen)
    data = iter(["a0", "a1", "a2", "a3", "a4", "a5"])
    it = pipe.fill_pipeline(data)
    assert pipe.progress(it) == 0
    with pytest.raises(RuntimeError, match=r"drain\(\).*fill_pipeline\(new_data\)"):  # the calls to make
        pipe.progress(iter(["b0", "b1"]))
    assert pipe.in_flight == 3  # nothing was fetched, retired or restarted
    assert progress_until_end(pipe, it) == [1, 2, 3, 4, 5]
    assert seen == [(i, f"a{i}") for i in range(6)]  # each batch exactly once, in order
    assert swpipe_threads() == []


def test_switching_data_by_drain_and_fill_starts_a_fresh_run_at_iteration_zero():
    seen: List[Any] = []
    pipe = make_pipe(seen)
    it = pipe.fill_pipeline(["a0", "a1", "a2", "a3", "a4"])
    pipe.progress(it)
    pipe.drain()  # completes what is in flight (a0..a3), takes no new batch
    assert seen == [(i, f"a{i}") for i in range(4)]
    seen.clear()
    assert progress_until_end(pipe, pipe.fill_pipeline(["b0", "b1"])) == [0, 1]
    assert seen == [(0, "b0"), (1, "b1")]
    assert swpipe_threads() == []


def test_the_iterable_given_to_fill_is_accepted_by_progress_as_the_same_data():
    seen: List[Any] = []
    pipe = make_pipe(seen)
    data = ["a0", "a1", "a2", "a3"]
    pipe.fill_pipeline(data)
    assert progress_until_end(pipe, data) == [0, 1, 2, 3]  # the list stands for its iterator: no restart from a0
    assert [b for _, b in seen] == data


def test_progress_with_data_after_progress_none_is_refused():
    seen: List[Any] = []
    pipe = make_pipe(seen)
    it = pipe.fill_pipeline(range(10))
    assert pipe.progress(None) == 0
    with pytest.raises(RuntimeError, match="draining"):
        pipe.progress(it)
    assert progress_until_end(pipe, None) == [1, 2]
    pipe.drain()
    assert swpipe_threads() == []


# ----------------------------------------------------------------------------- empty and short data

@pytest.mark.parametrize("data", [[], iter([]), (x for x in []), range(0)], ids=["list", "iter", "gen", "range"])
def test_empty_iterator_runs_zero_iterations_and_leaves_no_thread(data):
    seen: List[Any] = []
    pipe = make_pipe(seen)
    it = pipe.fill_pipeline(data)
    with pytest.raises(StopIteration):
        pipe.progress(it)
    assert seen == [] and swpipe_threads() == []
    pipe.drain()
    make_pipe(seen).run([])
    assert seen == [] and swpipe_threads() == []


def test_exhausted_generator_reused_is_just_empty():
    seen: List[Any] = []
    pipe = make_pipe(seen)
    gen = (i for i in range(2))
    pipe.run(gen)
    assert [i for i, _ in seen] == [0, 1]
    seen.clear()
    pipe.run(gen)  # nothing left: no error, no hang, no repeat
    assert seen == [] and swpipe_threads() == []


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_data_shorter_than_or_equal_to_the_depth_runs_every_batch_once(n):
    seen: List[Any] = []
    pipe = make_pipe(seen)
    assert progress_until_end(pipe, pipe.fill_pipeline(range(n))) == list(range(n))
    assert seen == [(i, i) for i in range(n)]
    pipe.run_serial(range(n))
    assert seen[n:] == [(i, i) for i in range(n)]


# ----------------------------------------------------------------------------- a batch that cannot be moved

def test_batch_that_cannot_be_moved_to_the_device_fails_naming_h2d_and_iteration():
    def h2d(ctx):
        ctx.x = ctx.batch.to("cpu", non_blocking=True)  # iteration 3's batch is not a tensor

    seen: List[Any] = []
    batches = [torch.tensor([i]) for i in range(3)] + [{"ids": [3]}] + [torch.tensor([i]) for i in range(4, 8)]
    pipe = make_pipe(seen, h2d=h2d)
    with pytest.raises(PipelineTaskError) as info:
        pipe.run(batches)
    err = info.value
    assert (err.task, err.iteration, err.thread_group) == ("H2D", 3, "io")
    assert isinstance(err.__cause__, AttributeError) and (err.__cause__.name, type(err.__cause__.obj)) == ("to", dict)
    # the failure cancels what is in flight (iterations 1-2 may not finish); nothing at or after 3 trains
    done = [i for i, _ in seen]
    assert done == list(range(len(done))) and len(done) <= 3
    assert swpipe_threads() == []
    seen.clear()
    pipe.run(batches[:3])  # usable again
    assert [i for i, _ in seen] == [0, 1, 2]


def test_pinning_or_copying_to_an_absent_device_fails_naming_h2d():
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")

    def h2d(ctx):
        ctx.x = ctx.batch.to("cuda", non_blocking=True)

    pipe = make_pipe([], h2d=h2d)
    with pytest.raises(PipelineTaskError) as info:
        pipe.run([torch.ones(2)] * 4)
    assert (info.value.task, info.value.iteration) == ("H2D", 0)
    assert "CUDA" in str(info.value)
    assert swpipe_threads() == []


# ----------------------------------------------------------------------------- agree_on_end, one process

def test_agree_on_end_needs_an_initialised_process_group():
    import torch.distributed as dist

    from swpipe_core.distributed import agree_on_end

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        agree_on_end(range(3))


def test_agree_on_end_feeds_a_pipeline_every_batch(one_rank):
    from swpipe_core.distributed import agree_on_end

    seen: List[Any] = []
    data = agree_on_end(range(7))
    make_pipe(seen).run(data)
    assert [b for _, b in seen] == list(range(7))
    assert data.batches == 7 and data.ended_ranks == (0,) and data.leftover == [] and list(data.rest()) == []
    with pytest.raises(StopIteration):
        next(data)  # stays stopped, exchanges nothing more


def test_agree_on_end_raises_the_local_loader_error_after_telling_the_group(one_rank):
    from swpipe_core.distributed import agree_on_end

    def loader():
        yield from range(3)
        raise OSError("disk-gone")

    data = agree_on_end(loader())
    seen: List[Any] = []
    with pytest.raises(OSError, match="disk-gone"):
        make_pipe(seen).run(data)
    assert data.batches == 3 and swpipe_threads() == []
    with pytest.raises(StopIteration):
        next(data)
