"""The DLRM workload under every TorchRec plan, world size 1: pipelining changes when work runs, never what.

Checked the way TorchRec checks its pipelines (``test_equal_to_non_pipelined``):
per-iteration losses and final parameters of a pipelined run equal a plain
serial loop over the same batches — here bit for bit (``torch.equal``), since
on CPU the ops and their order are the same. Plus: determinism, thread maps,
semi-sync staleness, eval outputs, and a proof that a dropped dependency is
caught.
"""

from __future__ import annotations

import collections
import threading
import warnings
from typing import Any, Dict, List, Tuple

import pytest
from conftest import word_after
import torch

from swpipe_core import pipelines
from swpipe import Timeouts
from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.engine.workers import with_thread_map
from swpipe.workloads.dlrm import DLRMConfig, DLRMWorkload, SyntheticData
from swpipe.workloads.dlrm_data import KJT
from swpipe.workloads.reference import emb_staleness, eval_reference, semi_sync_reference, train_reference
from swpipe.workloads.tasks import fns_for, plan_for, task_fns

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_intra_op_thread")]

CFG = DLRMConfig.preset("test")
N = 6
# Plans whose semantics are a plain training loop (semi_sync's own plan has staleness 0 here, see below).
SYNC_TRAIN = ["base", "pt2", "sparse_dist", "sparse_dist_lite", "fused_sparse_dist", "prefetch",
              "sparse_dist_comp_autograd", "staged", "semi_sync"]
TORCHREC_SEMI_SYNC_ORDER = ["H2D", "InputDistStart", "ZeroGrad", "InputDistWait", "Forward", "Backward",
                            "EmbLookup", "EmbBackward", "OptimizerStep"]


@pytest.fixture(scope="module")
def batches():
    return SyntheticData(CFG).batches(N)


@pytest.fixture(scope="module")
def reference(env, batches):
    wl = DLRMWorkload(CFG, env)
    losses = train_reference(wl, batches)
    return losses, wl.snapshot()


def _eager(name, wl, **options):
    return plan_for(name, wl, compile_backend=None, compiled_autograd=None, **options)


def _run(plan, batches, serial=False):
    with SWPipeline(plan, device="cpu", timeouts=Timeouts(signal_s=30, progress_s=60)) as pipe:
        (pipe.run_serial if serial else pipe.run)(iter(batches))


def _train(env, batches, build, serial=False, thread_map=None):
    wl = DLRMWorkload(CFG, env)
    plan = build(wl)
    if thread_map is not None:
        plan = with_thread_map(plan, thread_map)
    _run(plan, batches, serial)
    return wl.loss_list(), wl.snapshot()


def _assert_same(a, b):
    (la, sa), (lb, sb) = a, b
    assert len(la) == len(lb) == N
    for i, (x, y) in enumerate(zip(la, lb)):
        assert torch.equal(x, y), f"loss of iteration {i} differs: {x.item()!r} vs {y.item()!r}"
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{k} differs by {(sa[k] - sb[k]).abs().max().item():.3g}"


# ------------------------------------------------------------------------------------- model & data

def test_synthetic_data_is_seeded_and_rank_slices_tile_the_global_batch():
    whole = SyntheticData(CFG, world_size=2).global_batch(3)
    r0, r1 = SyntheticData(CFG, 2, 0)[3], SyntheticData(CFG, 2, 1)[3]
    assert torch.equal(torch.cat([r0.dense, r1.dense]), whole.dense)
    assert torch.equal(torch.cat([r0.labels, r1.labels]), whole.labels)
    for t in range(CFG.num_tables):
        ids = torch.cat([r0.sparse.values_per_key()[t], r1.sparse.values_per_key()[t]])
        assert torch.equal(ids, whole.sparse.values_per_key()[t])
    assert torch.equal(SyntheticData(CFG)[5].sparse.values, SyntheticData(CFG)[5].sparse.values)
    assert not torch.equal(SyntheticData(CFG)[5].dense, SyntheticData(CFG)[6].dense)
    other_seed = SyntheticData(DLRMConfig.preset("test", seed=1))[5]
    assert not torch.equal(other_seed.dense, SyntheticData(CFG)[5].dense)


def test_kjt_rejects_lengths_that_do_not_split_over_keys():
    with pytest.raises(ValueError, match=r"\b3\b.*\b2\b"):  # the lengths, the keys they do not split over
        KJT(["a", "b"], torch.tensor([1, 2, 3]), torch.tensor([1, 1, 1]))


def test_lookup_equals_the_embedding_bag_tables_and_their_gradient(env, batches):
    wl = DLRMWorkload(CFG, env)
    dev = wl.h2d(batches[0])
    emb = wl.lookup(wl.input_dist(dev.sparse))
    weights = {t: wl.model.tables[f"t{t}"].weight.detach().clone().requires_grad_(True) for t in range(CFG.num_tables)}
    lengths = dev.sparse.lengths.view(CFG.num_tables, -1)
    grad = torch.randn_like(emb.pooled)
    emb.pooled.backward(grad)
    for t in range(CFG.num_tables):
        ids = dev.sparse.values_per_key()[t]
        offsets = torch.cumsum(lengths[t], 0) - lengths[t]
        # the module itself (its weight is a view of the fused storage) ...
        assert torch.equal(wl.model.tables[f"t{t}"](ids, offsets), emb.pooled[:, t])
        # ... and autograd through a plain embedding_bag on a copy of it give the same rows' gradient
        ref = torch.nn.functional.embedding_bag(ids, weights[t], offsets, mode="sum")
        ref.backward(grad[:, t])
    full = torch.cat([weights[t].grad for t in range(CFG.num_tables)])
    assert torch.allclose(full[emb.uniq], emb.rows.grad, atol=1e-6)
    untouched = torch.ones(full.shape[0], dtype=torch.bool)
    untouched[emb.uniq] = False
    assert torch.count_nonzero(full[untouched]) == 0


def test_input_dist_is_two_async_all_to_alls_lengths_then_ids(env, batches):
    wl = DLRMWorkload(CFG, env)
    dev = wl.h2d(batches[1])
    state = wl.input_dist_start(dev.sparse)
    assert state.lengths_work is not None and state.values_work is None  # phase 2 not started yet
    wl.input_dist_wait(state)
    assert state.values_work is not None
    assert state.value_recv_splits == [int(dev.sparse.lengths.sum())]
    shard = wl.input_dist_finish(state)
    assert torch.equal(shard.lengths, dev.sparse.lengths)
    expected = torch.cat([v + t * CFG.num_embeddings for t, v in enumerate(dev.sparse.values_per_key())])
    assert torch.equal(shard.ids, expected)


def test_h2d_casts_to_model_dtypes(env, batches):
    dev = DLRMWorkload(CFG, env).h2d(batches[0])
    assert (dev.dense.dtype, dev.sparse.values.dtype, dev.labels.dtype) == (torch.float32, torch.int64, torch.float32)
    assert torch.equal(dev.dense, batches[0].dense.float())


# ------------------------------------------------------------------------------ plans == serial loop

def test_every_torchrec_pipeline_gets_all_its_task_functions(env):
    wl = DLRMWorkload(CFG, env)
    for name in pipelines.PIPELINES:
        plan = plan_for(name, wl)
        assert plan.unbound_tasks() == [], name
        assert set(fns_for(name, wl)) == set(plan.task_names), name


@pytest.mark.parametrize("name", SYNC_TRAIN)
def test_pipelined_training_equals_the_serial_loop(name, env, batches, reference):
    _assert_same(_train(env, batches, lambda wl: _eager(name, wl)), reference)


@pytest.mark.parametrize("emb_lookup", ["data_dist", "current"])
def test_fused_sparse_dist_lookup_streams_equal_the_serial_loop(emb_lookup, env, batches, reference):
    _assert_same(_train(env, batches, lambda wl: _eager("fused_sparse_dist", wl, emb_lookup=emb_lookup)), reference)


@pytest.mark.parametrize("name", ["sparse_dist", "fused_sparse_dist", "prefetch", "semi_sync", "eval_sparse_dist"])
def test_one_thread_per_stream_is_bit_identical_to_the_single_thread_serial_run(name, env, batches):
    if name.startswith("eval"):
        outs = []
        for tm, serial in ((None, True), ("by_stream", False)):
            wl = DLRMWorkload(CFG, env)
            plan = _eager(name, wl)
            _run(with_thread_map(plan, tm) if tm else plan, batches, serial)
            outs.append([wl.outputs[i] for i in range(N)])
        assert all(torch.equal(a, b) for a, b in zip(*outs))
        return
    serial = _train(env, batches, lambda wl: _eager(name, wl), serial=True)
    threaded = _train(env, batches, lambda wl: _eager(name, wl), thread_map="by_stream")
    threaded_plan = with_thread_map(pipelines.get(name), "by_stream")
    assert len({threaded_plan.sched(t).thread_group for t in threaded_plan.task_names}) >= 3
    _assert_same(threaded, serial)
    assert any(k.startswith("grad.") for k in threaded[1])  # gradients are compared too


def test_two_runs_of_one_plan_are_bit_identical(env, batches):
    runs = [_train(env, batches, lambda wl: _eager("prefetch", wl), thread_map="by_stream") for _ in range(2)]
    _assert_same(*runs)


def test_safe_task_plan_is_correct_under_one_thread_per_task(env, batches, reference):
    from swpipe.workloads.autoplan import safe_task_plan

    _assert_same(_train(env, batches, safe_task_plan, thread_map="per_task"), reference)


# ------------------------------------------------------------------------------ semi-sync & eval

def test_semi_sync_equals_its_reference_at_its_documented_staleness(env, batches, reference):
    plan = pipelines.get("semi_sync")
    # our engine enqueues EmbBackward(i-1) before EmbLookup(i) in a period: no embedding staleness
    assert emb_staleness(plan) == 0
    stale_plan = plan.replace(enqueue_order=TORCHREC_SEMI_SYNC_ORDER)
    assert emb_staleness(stale_plan) == 1
    got = _train(env, batches, lambda wl: pipelines.get("semi_sync", fns_for("semi_sync", wl),
                                                        ).replace(enqueue_order=TORCHREC_SEMI_SYNC_ORDER))
    want_wl = DLRMWorkload(CFG, env)
    want = semi_sync_reference(want_wl, batches, lag=1)
    assert all(torch.equal(a, b) for a, b in zip(got[0], want))
    snap = want_wl.snapshot()
    assert all(torch.equal(got[1][k], snap[k]) for k in snap)
    # and the staleness is real: losses after the first differ from synchronous training
    assert torch.equal(got[0][0], reference[0][0])
    assert any(not torch.equal(a, b) for a, b in zip(got[0][1:], reference[0][1:]))


@pytest.mark.parametrize("name", ["eval_sparse_dist", "eval_fused_sparse_dist"])
def test_eval_pipelines_equal_model_eval_inference(name, env, batches):
    want = eval_reference(DLRMWorkload(CFG, env), batches)
    wl = DLRMWorkload(CFG, env)
    _run(_eager(name, wl), batches)
    assert sorted(wl.outputs) == list(range(N))
    for i in range(N):
        assert torch.equal(wl.outputs[i], want[i])
    assert not wl.model.training


# ------------------------------------------------------------------------- mistakes are caught

def _deep_fused(wl, with_dep: bool, order=None) -> PipelinePlan:
    """FusedSparseDist with EmbLookup one stage ahead of the dense step (depth 4)."""
    sched = {"H2D": TaskSchedule(0, "memcpy"), "InputDistStart": TaskSchedule(1, "data_dist", globally_ordered=True),
             "InputDistWait": TaskSchedule(1, "data_dist"), "EmbLookup": TaskSchedule(2, "emb_lookup")}
    sched.update({n: TaskSchedule(3) for n in ("ZeroGrad", "WaitBatch", "Forward", "Backward", "OptimizerStep")})
    plan = PipelinePlan(sched, intra_iter_deps=[("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"),
                                                ("EmbLookup", "InputDistWait"), ("Forward", "EmbLookup"),
                                                ("WaitBatch", "ZeroGrad"), ("Forward", "WaitBatch"),
                                                ("Backward", "Forward"), ("OptimizerStep", "Backward")],
                        inter_iter_deps=[("Forward", "OptimizerStep")] + ([("EmbLookup", "Backward")] if with_dep else []),
                        enqueue_order=order)
    return plan.bind(task_fns(wl, plan.task_names))


def test_dropping_the_embedding_dependency_makes_training_differ(env, batches, reference):
    # with EmbLookup(i) waiting Backward(i-1) (which applies the fused embedding update) it is exact ...
    _assert_same(_train(env, batches, lambda wl: _deep_fused(wl, True)), reference)
    # ... without it, an order that looks up first reads embeddings one update stale: the test sees it
    lookup_first = ["EmbLookup", "H2D", "InputDistStart", "InputDistWait", "ZeroGrad", "WaitBatch", "Forward",
                    "Backward", "OptimizerStep"]
    losses, _ = _train(env, batches, lambda wl: _deep_fused(wl, False, lookup_first))
    assert torch.equal(losses[0], reference[0][0])  # nothing to be stale about yet
    assert not torch.equal(losses[1], reference[0][1])  # EmbLookup(1) ran before Backward(0) updated the tables
    with pytest.raises(AssertionError, match="differs"):
        _assert_same((losses, reference[1]), reference)


def test_a_missing_intra_dependency_is_reported_not_silently_recomputed(env, batches):
    wl = DLRMWorkload(CFG, env)
    plan = PipelinePlan({n: TaskSchedule(0) for n in ("H2D", "Forward", "Backward", "OptimizerStep")},
                        intra_iter_deps=[("Backward", "Forward"), ("OptimizerStep", "Backward")],
                        enqueue_order=["Forward", "H2D", "Backward", "OptimizerStep"])
    plan = plan.bind(task_fns(wl, plan.task_names))
    with pytest.raises(PipelineTaskError) as info:
        _run(plan, batches)
    assert info.value.task == "Forward" and info.value.iteration == 0
    assert "('Forward', 'H2D')" in str(info.value.__cause__)


def test_unknown_task_name_is_rejected(env):
    with pytest.raises(ValueError, match="'Fwd'"):
        task_fns(DLRMWorkload(CFG, env), ["Fwd"])


def test_pt2_falls_back_to_eager_with_a_warning_when_compile_fails(env, batches, reference):
    def broken_backend(gm, example_inputs):
        raise RuntimeError("no compiler here")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _train(env, batches, lambda wl: plan_for("pt2", wl, compile_backend=broken_backend))
    assert any("eager" in str(w.message).split() for w in caught)  # the warning says it runs eager
    _assert_same(got, reference)


# -- on a real GPU, with device work queued ----------------------------------------------------------------------

# Seconds of spin queued ahead of a late producer: far longer than the host takes (a few ms of Python) between a
# producer's launch and the launch of the task on another stream that reads its output.
SPIN_S = 0.025


def _cross_stream_deps(plan: PipelinePlan) -> Dict[str, List[Tuple[str, int]]]:
    """``{task: [(producer, distance)]}``: the dependencies of each task on a task of another stream."""
    deps: Dict[str, List[Tuple[str, int]]] = {t: [] for t in plan.task_names}
    for t, d, dist in [(t, d, 0) for t, d in plan.intra_edges()] + list(plan.inter_edges()):
        if plan.stream_of(t) != plan.stream_of(d):
            deps[t].append((d, dist))
    return deps


def late_producers(plan: PipelinePlan, late: str) -> List[str]:
    """The tasks whose kernels a run delays with a spin: ``"batch copy"`` (H2D) or ``"default stream"``.

    Only producers that another stream reads and that do not wait on the host for their own stream: a task
    that synchronises the host (``.tolist()``, ``unique_consecutive``, ``repeat_interleave`` without a size:
    the input distribution, and the lookup plan of EmbPrefetch, of EmbLookup without a prefetch and of a
    Forward without an EmbLookup) would turn a spin ahead of it into host waiting, not into queued work.
    ``"default stream"``: the default-stream tasks a side stream reads (fused_sparse_dist's Backward, read by
    the next EmbLookup; prefetch's Forward, read by the next EmbPrefetch); none in sparse_dist.
    """
    read_across = {d for reads in _cross_stream_deps(plan).values() for d, _ in reads}
    if late == "batch copy":
        return [t for t in ("H2D",) if t in read_across]
    return [t for t in ("Forward", "Backward") if t in read_across and plan.sched(t).stream is None]


class QueuedWork:
    """A plan whose late producers start with a spin on their stream, and how often a reader found them unfinished.

    Each task of ``spun`` queues ``spin_s`` of spin on its stream before its own kernels, so they complete that
    long after the task was launched at the earliest. Every task records an event after its kernels; a task
    launched while a producer it depends on, on another stream, has not completed on the device counts in
    ``pending[(task, producer)]`` (of ``checked[(task, producer)]`` launches): only the engine's device wait
    orders that read after those kernels, and without it the read would see memory not yet written.

    Parameters
    ----------
    plan : PipelinePlan
        A bound plan; :attr:`plan` is it with every task wrapped.
    device : swpipe_core.engine.device.Device
    spun : iterable of str
    spin_s : float
    """

    def __init__(self, plan: PipelinePlan, device: Any, spun: Any, spin_s: float) -> None:
        self.dev, self.spun, self.spin_s = device, set(spun), spin_s
        self.deps = _cross_stream_deps(plan)
        self.pending: collections.Counter = collections.Counter()
        self.checked: collections.Counter = collections.Counter()
        self._done: Dict[Tuple[str, int], Any] = {}
        self._lock = threading.Lock()  # tasks run on several threads
        self.plan = plan.bind({t.name: self._wrap(t.name, t.fn) for t in plan.tasks})

    def _wrap(self, name: str, fn: Any) -> Any:
        dev = self.dev

        def task(ctx: Any) -> None:
            i = ctx.iter_idx
            for d, dist in self.deps[name]:
                with self._lock:
                    if (d, i - dist) not in self._done:  # an iteration before the first
                        continue
                    event = self._done[(d, i - dist)]
                unfinished = not dev.query(event)  # (None on a CPU: finished with the host)
                with self._lock:
                    self.checked[(name, d)] += 1
                    self.pending[(name, d)] += unfinished
            if name in self.spun:
                dev.spin(self.spin_s)  # the task's stream is current: its kernels queue behind the spin
            fn(ctx)
            event = dev.event()
            dev.record(event, dev.current_stream())
            with self._lock:
                self._done[(name, i)] = event
        return task


def train_with_device_work_queued(env: Any, config: DLRMConfig, names: List[str], iters: int,
                                  spin_s: float) -> Dict[Any, Any]:
    """On one rank: the serial loop, then each plan under each thread map with each kind of late producer.

    Spawned (module level); returns ``{"reference": result, (name, thread_map, late): result}``, a result
    being losses and parameters, plus ``pending`` / ``checked`` / ``spun`` for the plans.
    """
    from swpipe_core.engine.device import as_device

    dev = as_device(env.device)
    dev.spin(1e-4)  # the first spin times the spin rate (one synchronisation): here, not inside a task
    batches = SyntheticData(config, env.world_size, env.rank, device=env.device).batches(iters)  # pinned
    wl = DLRMWorkload(config, env)
    train_reference(wl, batches)
    out: Dict[Any, Any] = {"reference": {"losses": wl.loss_list(), "params": wl.snapshot()}}
    for name in names:
        for tm in (None, "by_stream"):
            for late in ("batch copy", "default stream"):
                wl = DLRMWorkload(config, env)
                plan = plan_for(name, wl, compile_backend=None, compiled_autograd=None)
                if tm is not None:
                    plan = with_thread_map(plan, tm)
                spun = late_producers(plan, late)
                if not spun:
                    continue
                queued = QueuedWork(plan, dev, spun, spin_s)
                with SWPipeline(queued.plan, device=env.device, state=wl.state) as pipe:
                    pipe.run(iter(batches))
                out[(name, tm, late)] = {"losses": wl.loss_list(), "params": wl.snapshot(), "spun": spun,
                                         "pending": dict(queued.pending), "checked": dict(queued.checked)}
    return out


@pytest.mark.gpu
@pytest.mark.timeout(300)  # a fresh process with CUDA and NCCL, then ten runs of twelve iterations
def test_plans_on_cuda_match_the_serial_loop_to_tolerance():
    """NCCL and torch's CUDA kernels on a real GPU (``gpu``: the fake device runs neither).

    With the test model (batch 32) every kernel takes microseconds and the host far longer, so the device never
    has work queued: by the time a task on another stream is launched to read a producer's output, the
    producer's kernels have long completed, and neither a missing device wait nor an early free could change a
    value. So each run queues a spin (``SPIN_S``, far longer than the host's few milliseconds between the two
    launches) on a producer's stream ahead of its kernels: the batch copy (H2D, which InputDistStart reads on
    the data_dist stream) in one run; in another, the default-stream tasks a side stream waits for
    (fused_sparse_dist's Backward, whose embedding update the next EmbLookup reads; prefetch's Forward, which
    the next EmbPrefetch waits for), so the default stream lags and still reads blocks the host is done with.
    Only the engine's device waits and its keep-alive of freed memory order those reads: without the wait a
    read sees a batch not yet copied or tables one update old, without the keep-alive a block is handed to the
    next allocation while it is read; either changes the losses far beyond the tolerance. Twelve iterations
    run the pipeline (depth 3) well past its fill. The test asserts that readers were indeed launched before
    their producer finished (``pending``, in at least half of the launches), so it cannot pass with an idle
    device. Equality is to a tolerance: CUDA's kernels need not reduce in the serial loop's order.
    """
    from swpipe.workloads.launch import spawn

    names, iters = ["sparse_dist", "fused_sparse_dist", "prefetch"], 12
    # one NCCL rank in a fresh process (this one already holds a gloo group)
    (out,) = spawn(train_with_device_work_queued, 1, CFG, names, iters, SPIN_S, backend="nccl", timeout=240)
    want = out.pop("reference")
    assert {key[0] for key in out} == set(names)
    assert {key[2] for key in out if key[0] != "sparse_dist"} == {"batch copy", "default stream"}
    for key, got in out.items():
        early = {edge: (got["pending"].get(edge, 0), n) for edge, n in got["checked"].items()
                 if edge[1] in got["spun"]}
        assert early, f"{key}: no task reads {got['spun']} from another stream"
        for edge, (pending, n) in early.items():
            assert 2 * pending >= n, f"{key}: {edge[0]} found {edge[1]} finished on the device in {n - pending} " \
                                     f"of {n} launches: the device was not kept busy ({early})"
        assert len(got["losses"]) == iters and got["losses"][0].is_cuda
        for a, b in zip(got["losses"], want["losses"]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{key}: {m}")
        assert got["params"].keys() == want["params"].keys()
        for k in want["params"]:
            torch.testing.assert_close(got["params"][k], want["params"][k], rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"{key}, {k}: {m}")


@pytest.mark.cuda
def test_queued_work_keeps_a_late_producer_unfinished_when_its_reader_is_launched(fake_cuda):
    """The GPU test's instrument, on the fake: the spin delays the producer, the reader counts it, values hold."""
    from swpipe.testing import kernels

    dev = fake_cuda.device(0)
    k = kernels(dev)
    n, iters, sums = 256, 6, {}

    def copy(ctx):
        ctx.x = k.to_device(k.pin(torch.full((n,), float(ctx.batch + 1))))

    def total(ctx):
        sums[ctx.iter_idx] = k.sum(ctx.x)

    plan = PipelinePlan({PipelineTask("Copy", copy): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Sum", total): TaskSchedule(1)}, intra_iter_deps=[("Sum", "Copy")])
    assert late_producers(plan, "batch copy") == [] and _cross_stream_deps(plan)["Sum"] == [("Copy", 0)]
    queued = QueuedWork(plan, dev, ["Copy"], spin_s=SPIN_S)
    with SWPipeline(queued.plan, device=dev) as pipe:
        pipe.run(iter(range(iters)))
    assert [k.item(sums[i]) for i in range(iters)] == [n * (i + 1.0) for i in range(iters)]
    fake_cuda.assert_no_races()
    assert queued.checked == {("Sum", "Copy"): iters}
    # Sum(i) is launched one period (a millisecond or two on the host) after Copy(i), whose kernels queue behind
    # SPIN_S of spin: the GPU test's criterion, met by a wide margin
    assert 2 * queued.pending[("Sum", "Copy")] >= iters


def test_the_auto_scheduled_plan_trains_exactly_like_the_serial_loop(env, batches, reference):
    pytest.importorskip("autosched.search.autoschedule")
    from swpipe.workloads.autoplan import auto_spec

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the hook warns instead of failing: make it fail here
        spec = auto_spec(CFG, env, batches, max_depth=3, max_threads=2, time_limit_s=3.0)
    assert spec is not None and spec.label == "auto"
    assert word_after(spec.note, "calibrated") is not None and "(" in word_after(spec.note, "calibrated")  # cores free
    assert spec.predicted_speedup is not None and spec.predicted_speedup > 0  # the demo checks it against its row
    from swpipe.workloads.autoplan import AUTO_SEEDS

    assert set(spec.predicts) == set(AUTO_SEEDS) and all(x > 0 for x in spec.predicts.values())  # the seeds' rows
    if spec.same_as is not None:  # the seed kept: its row and the auto row share one prediction
        assert spec.predicted_speedup == spec.predicts[spec.same_as]
    wl = DLRMWorkload(CFG, env)
    plan = spec.plan(wl)
    assert plan.unbound_tasks() == [] and plan.enqueue_order is not None
    _run(plan, batches)
    _assert_same((wl.loss_list(), wl.snapshot()), reference)


def test_a_searched_rows_prediction_is_compared_with_its_speedup_measured_in_the_same_rounds(env):
    """The demo's prediction check: the model's speedup against the row's, so the machine's drift cancels."""
    from swpipe.workloads.bench import PlanSpec, format_table, measure

    specs = [PlanSpec("searched", "base", predicted_speedup=1.5), PlanSpec("hand-written", "base")]
    m = measure(CFG, env, specs, iters=3, repeats=3, record_best=False)
    searched, hand = m.rows
    assert searched.predicted_speedup == 1.5 and hand.predicted_speedup is None
    # measured: the median over the 3 rounds of (serial loop / row) in the same round, not fastest over fastest
    assert searched.paired_speedup is not None and hand.paired_speedup is not None
    assert searched.prediction_error_pct == pytest.approx(100 * (searched.paired_speedup / 1.5 - 1))
    assert hand.prediction_error_pct is None
    table = {line.split()[0]: line.split() for line in format_table(m).splitlines()}
    assert table["searched"][4:6] == [f"{searched.paired_speedup:.2f}x", "1.50x"]  # measured, predicted
    assert table["hand-written"][5] == "-"


def test_search_costs_leave_out_the_cold_first_iterations():
    """A fresh model's first iterations run slow; the search's costs come from the warm ones."""
    from swpipe.workloads.autoplan import COST_WARMUP, serial_costs
    from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule

    calls = []
    plan = PipelinePlan({PipelineTask("Step", lambda ctx: calls.append(ctx.batch)): TaskSchedule(0)})
    costs = serial_costs(plan, list(range(4)), "cpu")
    assert calls[:8] == [0, 1, 2, 3, 0, 1, 2, 3]  # the batches are cycled
    assert COST_WARMUP > 0 and len(calls) > COST_WARMUP
    assert word_after(costs.method, "median", "of") == str(len(calls) - COST_WARMUP)  # only the warm iterations count
    assert word_after(costs.notes, "first") == str(COST_WARMUP)  # left out


def test_demo_rounds_turn_the_order_of_the_plans(env):
    """Round r starts r plans further on, so no plan always runs last in a round."""
    from swpipe.workloads.bench import PlanSpec, measure

    built = []

    def builder(label):
        def build(workload):
            built.append(label)
            return plan_for("base", workload)
        return build

    specs = [PlanSpec(label, "base", build=builder(label)) for label in ("a", "b", "c")]
    m = measure(CFG, env, specs, iters=3, repeats=3, record_best=False)
    assert built == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert m.meta["runs"] == {"a": 3, "b": 3, "c": 3}


def test_each_seed_runs_the_schedule_of_the_demo_row_it_is_named_after(env):
    """What lets the demo show a seed the search kept in that row: same stages, threads, streams, order."""
    from swpipe.workloads.autoplan import AUTO_SEEDS, auto_seeds, safe_task_plan
    from swpipe.workloads.bench import PlanSpec
    from swpipe_core.planfile import plan_to_dict

    def deps(doc, field):
        return {tuple(d) for d in doc[field]}

    wl = DLRMWorkload(CFG, env)
    for label, seed in auto_seeds(wl, safe_task_plan(wl)):
        name, _, thread_map = label.partition("+")
        row = plan_to_dict(PlanSpec(label, name, thread_map or None).plan(wl))
        got = plan_to_dict(seed)
        schedule = {t["name"]: t for t in got["tasks"]}
        assert schedule == {t["name"]: t for t in row["tasks"]}, f"seed {label}: schedule differs from the row's"
        for key in ("enqueue_order", "caller_group", "pipeline_depth", "enqueue_policy"):
            assert got[key] == row[key], f"seed {label}: {key} differs from the row's"
        assert deps(row, "intra_iter_deps") <= deps(got, "intra_iter_deps")  # the seed only adds dependencies
        assert deps(row, "inter_iter_deps") <= deps(got, "inter_iter_deps")
        order = got["enqueue_order"]
        for t, d, dist in deps(got, "inter_iter_deps") - deps(row, "inter_iter_deps"):
            # each added one is met by the schedule already: d(i - dist) is enqueued before t(i) on t's thread
            st, gt, sd, gd = (schedule[t]["stage"], schedule[t]["thread_group"], schedule[d]["stage"],
                              schedule[d]["thread_group"])
            assert gt == gd and (sd - dist < st or (sd - dist == st and order.index(d) < order.index(t))), (label, t, d)
        assert deps(got, "intra_iter_deps") == deps(row, "intra_iter_deps")
    assert len(AUTO_SEEDS) == 2


def test_a_row_with_the_schedule_of_another_is_measured_once_and_shows_its_runs(env):
    from swpipe.workloads.bench import PlanSpec, measure

    built = []

    def twin(workload):
        built.append("twin")
        return plan_for("sparse_dist", workload)

    specs = [PlanSpec("sparse_dist", "sparse_dist"), PlanSpec("auto", "auto", build=twin, same_as="sparse_dist"),
             PlanSpec("other", "auto", build=twin, same_as="not a row")]  # no such row: measured itself
    m = measure(CFG, env, specs, iters=3, repeats=2, record_best=False)
    rows = {r.label: r for r in m.rows}
    assert built == ["twin", "twin"]  # only the row whose twin is absent ran, once per round
    assert rows["auto"].iters_per_s == rows["sparse_dist"].iters_per_s and rows["auto"].matches
    assert word_after(rows["auto"].note, "schedule", "of") == "sparse_dist," and "schedule" not in rows["other"].note


@pytest.mark.parametrize("band, raced", [(1e6, ["a", "b", "sparse_dist"]), (0.0, [])])
def test_demo_races_only_the_training_rows_near_the_fastest(env, band, raced):
    """Rows within the band run the extra rounds (with the serial loop); eval rows and the rest do not.

    A band of 0 leaves only the fastest row itself: nothing to race against, no extra round.
    """
    from swpipe.workloads.bench import PlanSpec, measure

    specs = [PlanSpec("a", "base"), PlanSpec("b", "base"), PlanSpec("sparse_dist", "sparse_dist"),
             PlanSpec("eval_sparse_dist", "eval_sparse_dist")]
    m = measure(CFG, env, specs, iters=3, repeats=2, record_best=False, race_rounds=2, race_band_pct=band)
    assert m.meta["raced"] == raced
    assert m.meta["runs"] == {s.label: 2 + 2 * (s.label in raced) for s in specs}
    assert all(r.matches for r in m.rows)  # the extra rounds check the losses too
    with pytest.raises(ValueError, match="race_rounds"):
        measure(CFG, env, specs, iters=3, repeats=1, race_rounds=-1)
