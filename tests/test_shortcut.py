"""Shortcut mode: caching, replay, _cache_val/_restore_val, _GraftGrad, DeclaredIO, engine integration."""

from __future__ import annotations

import collections
import threading

import pytest
import torch

from swpipe_core.plan import DeclaredIO, IterContext, PipelinePlan, PipelineTask, TaskSchedule
# the specification's shortcut internals (_cache_val, _restore_val, _GraftGrad, the cache tag) are its API: tested as such
from swpipe_core.engine.shortcut import (
    _CACHE_TAG,
    ShortcutCorruptedError,
    _cache_val,
    _GraftGrad,
    _restore_val,
    _ShortcutState,
)


class Jagged:
    """A jagged-tensor-like object (as TorchRec's JaggedTensor): values, lengths, offsets."""

    def __init__(self, values: torch.Tensor, lengths: torch.Tensor) -> None:
        self.values = values
        self.lengths = lengths
        self.offsets = torch.cat([torch.zeros(1, dtype=lengths.dtype), lengths.cumsum(0)])
        self.keys = ["f1", "f2"]

    def segment(self, i: int) -> torch.Tensor:
        return self.values[self.offsets[i]:self.offsets[i + 1]]


class Slotted:
    __slots__ = ("t", "name")

    def __init__(self, t, name):
        self.t, self.name = t, name


Pair = collections.namedtuple("Pair", "a b")


def _run(state: _ShortcutState, task: PipelineTask, ctx: IterContext) -> None:
    """The engine's dispatch (_exec_task), for unit tests without an engine."""
    if task.name in state.tasks:
        state.execute(task, ctx)
    else:
        task.fn(ctx)


# -- _cache_val / _restore_val ----------------------------------------------

def test_cache_val_detaches_and_clones_tensor():
    t = torch.arange(3.0, requires_grad=True) * 2  # non-leaf
    rec = _cache_val(t)
    assert rec[0] is _CACHE_TAG and rec[1] == "t"
    assert rec[2].grad_fn is None and rec[2].data_ptr() != t.data_ptr()
    assert rec[3] is True
    with torch.no_grad():
        t.add_(100)  # later changes to the original do not reach the cache
    assert _restore_val(rec).tolist() == [0.0, 2.0, 4.0]


def test_restore_val_gives_fresh_leaf_each_time_with_requires_grad():
    rec = _cache_val({"g": torch.ones(2, requires_grad=True), "n": torch.zeros(2)})
    a, b = _restore_val(rec), _restore_val(rec)
    assert a["g"] is not b["g"]
    assert a["g"].is_leaf and a["g"].requires_grad and a["g"].grad_fn is None
    assert not a["n"].requires_grad
    # two replays never share a graph: backward through each succeeds
    (a["g"] * 2).sum().backward()
    (b["g"] * 3).sum().backward()
    assert a["g"].grad.tolist() == [2.0, 2.0] and b["g"].grad.tolist() == [3.0, 3.0]


def test_cache_val_recurses_dict_list_tuple_namedtuple_and_size():
    v = {"l": [torch.ones(1), 3], "u": (torch.zeros(1), "s"), "p": Pair(torch.ones(1), 5), "sz": torch.Size([2, 3])}
    out = _restore_val(_cache_val(v))
    assert type(out["l"]) is list and out["l"][1] == 3 and torch.equal(out["l"][0], torch.ones(1))
    assert type(out["u"]) is tuple and out["u"][1] == "s"
    assert type(out["p"]) is Pair and out["p"].b == 5 and torch.equal(out["p"].a, torch.ones(1))
    assert type(out["sz"]) is torch.Size and out["sz"] == torch.Size([2, 3])
    assert out["l"][0] is not v["l"][0]


def test_cache_val_jagged_object_roundtrip():
    jt = Jagged(torch.arange(5.0), torch.tensor([2, 3]))
    rec = _cache_val(jt)
    assert rec[1] == "o" and rec[2] is Jagged
    out = _restore_val(rec)
    assert type(out) is Jagged and out is not jt
    assert torch.equal(out.values, jt.values) and torch.equal(out.offsets, jt.offsets)
    assert out.values.data_ptr() != jt.values.data_ptr()
    assert out.keys == ["f1", "f2"]
    assert out.segment(1).tolist() == [2.0, 3.0, 4.0]  # methods work on the rebuilt object


def test_cache_val_slots_object_and_plain_object_by_reference():
    s = _restore_val(_cache_val(Slotted(torch.ones(2), "x")))
    assert type(s) is Slotted and s.name == "x" and torch.equal(s.t, torch.ones(2))

    class NoTensors:
        pass

    plain, module = NoTensors(), torch.nn.Linear(2, 2)
    assert _restore_val(_cache_val(plain)) is plain  # nothing to snapshot: kept as is
    assert _restore_val(_cache_val(module)) is module  # a module is state, not task output


def test_cache_val_keeps_aliasing_and_cycles():
    t = torch.ones(2)
    d = {"a": t, "b": t}
    d["self"] = d
    out = _restore_val(_cache_val(d))
    assert out["a"] is out["b"] and out["self"] is out


def test_restore_detects_in_place_corruption_of_cache():
    rec = _cache_val(torch.ones(2))
    first = _restore_val(rec)
    first.mul_(5)  # a downstream task writes into a replayed tensor
    with pytest.raises(ShortcutCorruptedError) as info:
        _restore_val(rec)
    assert (info.value.shape, info.value.dtype) == ((2,), torch.float32)


def test_restore_val_returns_untagged_values_unchanged():
    v = ("x", 1)
    assert _restore_val(v) is v


# -- _GraftGrad --------------------------------------------------------------

def test_graft_grad_passes_grad_to_restored_and_zeros_upstream():
    w = torch.full((3,), 2.0, requires_grad=True)
    up = w * 4
    seen = {}
    up.register_hook(lambda g: seen.setdefault("up", g.clone()))
    restored = torch.ones(3, requires_grad=True)
    out = _GraftGrad.apply(restored, up)
    assert torch.equal(out, restored) and out.data_ptr() == restored.data_ptr()  # identity, zero-copy
    (out * 7).sum().backward()
    assert restored.grad.tolist() == [7.0, 7.0, 7.0]
    assert seen["up"].tolist() == [0.0, 0.0, 0.0]  # upstream backward ran with zeros
    assert w.grad.tolist() == [0.0, 0.0, 0.0]  # parameter upstream: zero contribution


def test_graft_grad_mixed_dtypes_and_shapes():
    a = torch.ones(2, 2, requires_grad=True)
    b = torch.ones(4, dtype=torch.float64, requires_grad=True)
    out = _GraftGrad.apply(torch.ones(1, requires_grad=True), a * 1, b * 1)
    out.sum().backward()
    assert a.grad.shape == (2, 2) and b.grad.dtype == torch.float64 and b.grad.abs().sum() == 0


# -- _ShortcutState: caching and replay ---------------------------------------

def _writer_deleter(calls):
    def fn(ctx):
        calls.append(ctx.iter_idx)
        ctx.out = {"emb": ctx.batch * 2, "jt": Jagged(ctx.batch.clone(), torch.tensor([1, 2]))}
        ctx.tmp = ctx.tmp + 1  # replaced
        ctx.n = 7  # added non-tensor
        del ctx.scratch  # deleted
    return fn


def _fresh_ctx(i, batch):
    ctx = IterContext(batch=batch, iter_idx=i)
    ctx.tmp = torch.zeros(1)
    ctx.scratch = "to be deleted"
    ctx.keep = "untouched"
    return ctx


def test_task_that_writes_and_deletes_replays_identically():
    calls = []
    task = PipelineTask("T", _writer_deleter(calls))
    state = _ShortcutState()
    state.enable(["T"])
    batch = torch.arange(3.0)
    real = _fresh_ctx(0, batch)
    _run(state, task, real)  # caching: runs fn
    replay = _fresh_ctx(1, batch * 0)  # different input: replay ignores it
    _run(state, task, replay)
    assert calls == [0]
    assert set(vars(replay)) == set(vars(real))
    assert not hasattr(replay, "scratch") and replay.keep == "untouched" and replay.iter_idx == 1
    assert torch.equal(replay.out["emb"], real.out["emb"]) and torch.equal(replay.tmp, real.tmp)
    assert torch.equal(replay.out["jt"].offsets, real.out["jt"].offsets)
    assert replay.n == 7
    assert replay.out["emb"] is not real.out["emb"]


def test_normal_mode_runs_fn_and_caches_nothing():
    calls = []
    task = PipelineTask("T", _writer_deleter(calls))
    state = _ShortcutState()
    for i in range(2):
        _run(state, task, _fresh_ctx(i, torch.ones(1)))
    assert calls == [0, 1] and state.cached == frozenset()


def test_disable_clears_cache_and_enable_recaches():
    calls = []
    task = PipelineTask("T", _writer_deleter(calls))
    state = _ShortcutState()
    state.enable(["T"])
    _run(state, task, _fresh_ctx(0, torch.ones(1)))
    assert state.cached == {"T"}
    state.disable(["T"])
    assert state.cached == frozenset() and "T" not in state.tasks
    _run(state, task, _fresh_ctx(1, torch.ones(1)))  # normal again
    state.enable(["T"])
    ctx = _fresh_ctx(2, torch.full((1,), 5.0))
    _run(state, task, ctx)  # caching again with new data
    assert calls == [0, 1, 2] and ctx.out["emb"].item() == 10.0


def test_failed_caching_run_caches_nothing_and_retries():
    calls = []

    def fn(ctx):
        calls.append(ctx.iter_idx)
        if ctx.iter_idx == 0:
            raise RuntimeError("first-run")
        ctx.y = ctx.iter_idx

    task, state = PipelineTask("T", fn), _ShortcutState()
    state.enable(["T"])
    with pytest.raises(RuntimeError, match="first-run"):
        state.execute(task, IterContext(None, 0))
    assert state.cached == frozenset()
    for i in (1, 2):
        ctx = IterContext(None, i)
        state.execute(task, ctx)
        assert ctx.y == 1
    assert calls == [0, 1]


def test_cache_val_single_string_slot():
    class One:
        __slots__ = "t"

    o = One()
    o.t = torch.ones(1)
    assert torch.equal(_restore_val(_cache_val(o)).t, torch.ones(1))


def test_declared_io_restores_external_state():
    table = {"rows": torch.zeros(3), "step": 0}

    def update(ctx):
        table["rows"] = table["rows"] + ctx.batch
        table["step"] += 1

    io = DeclaredIO(capture=lambda: dict(table), restore=table.update)
    task = PipelineTask("Update", update, io=[io])
    state = _ShortcutState()
    state.enable(["Update"])
    _run(state, task, IterContext(torch.ones(3), 0))  # caching: state after one real update
    table["rows"], table["step"] = torch.full((3,), -9.0), -9  # someone else changes it
    _run(state, task, IterContext(torch.ones(3), 1))  # replay restores the captured state
    assert table["step"] == 1 and table["rows"].tolist() == [1.0, 1.0, 1.0]
    table["rows"].add_(1)  # restore handed out a copy: the snapshot is untouched...
    _run(state, task, IterContext(torch.ones(3), 2))
    assert table["rows"].tolist() == [1.0, 1.0, 1.0]  # ...and the next replay restores it again


def test_declared_io_capture_called_once_restore_every_replay():
    counts = collections.Counter()
    io = DeclaredIO(capture=lambda: counts.update(["capture"]) or 1, restore=lambda v: counts.update(["restore"]))
    task = PipelineTask("T", lambda ctx: None, io=[io])
    state = _ShortcutState()
    state.enable(["T"])
    for i in range(4):
        _run(state, task, IterContext(None, i))
    assert counts == {"capture": 1, "restore": 3}


def test_replay_grafts_restored_output_onto_upstream_inputs():
    w_up = torch.ones(2, requires_grad=True)  # "embedding table" upstream of Forward
    w_fwd = torch.ones(2, requires_grad=True)  # parameter used only inside Forward
    fwd = PipelineTask("Forward", lambda ctx: setattr(ctx, "loss", (ctx.emb * w_fwd).sum()))
    state = _ShortcutState()
    state.enable(["Forward"])
    for i in range(3):
        ctx = IterContext(None, i)
        ctx.emb = w_up * 3
        _run(state, fwd, ctx)
        ctx.loss.backward()
    # iteration 0 ran for real (grads 3 and 3); replays send zeros to w_up and nothing to w_fwd
    assert w_up.grad.tolist() == [3.0, 3.0] and w_fwd.grad.tolist() == [3.0, 3.0]
    w_up.grad = w_fwd.grad = None
    ctx = IterContext(None, 9)
    ctx.emb = w_up * 3
    _run(state, fwd, ctx)
    assert ctx.loss.grad_fn is not None  # grafted, not a bare leaf
    ctx.loss.backward()
    assert w_up.grad.tolist() == [0.0, 0.0] and w_fwd.grad is None


def test_first_write_wins_under_concurrent_caching():
    barrier = threading.Barrier(2)
    task = PipelineTask("T", lambda ctx: (barrier.wait(timeout=10), setattr(ctx, "v", ctx.iter_idx)))
    state = _ShortcutState()
    state.enable(["T"])
    ctxs = [IterContext(None, i) for i in range(2)]
    threads = [threading.Thread(target=state.execute, args=(task, c), name=f"t{i}") for i, c in enumerate(ctxs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert state.cached == {"T"}
    replay = IterContext(None, 5)
    state.execute(task, replay)
    assert replay.v in (0, 1)



# -- integration with SWPipeline ----------------------------------------------

from swpipe import Timeouts
from swpipe_core.engine.pipeline import SWPipeline  # noqa: E402


def _produce_consume(calls, seen, depth=1):
    """Produce (thread "io") writes ctx.x from the batch and deletes ctx.batch_tmp; Consume reads it."""

    def produce(ctx):
        calls.append(ctx.iter_idx)
        ctx.x = torch.tensor([float(ctx.batch)])

    def consume(ctx):
        seen.append(float(ctx.x))

    return PipelinePlan(
        schedule={
            PipelineTask("Produce", produce): TaskSchedule(stage=0, thread_group="io"),
            PipelineTask("Consume", consume): TaskSchedule(stage=depth - 1, thread_group="compute"),
        },
        intra_iter_deps=[("Consume", "Produce")],
    )


def test_engine_unknown_shortcut_name_raises_listing_valid_names():
    with SWPipeline(_produce_consume([], []), device="cpu") as pipe:
        with pytest.raises(ValueError, match=r"\['Nope'\].*\['Produce', 'Consume'\]"):
            pipe.enable_shortcut("Produce", "Nope")
        with pytest.raises(ValueError, match=r"\['Nope'\]"):
            pipe.disable_shortcut("Nope")
        assert pipe.shortcuts == []  # nothing half-enabled


@pytest.mark.parametrize("mode", ["run_one_serial_iter", "run_serial", "run"])
def test_engine_shortcut_replays_in_every_run_mode(mode):
    calls, seen = [], []
    with SWPipeline(_produce_consume(calls, seen, depth=2), device="cpu") as pipe:
        pipe.enable_shortcut("Produce")
        batches = [1, 2, 3, 4]
        if mode == "run_one_serial_iter":
            for i, b in enumerate(batches):
                pipe.run_one_serial_iter(b, iter_idx=i)
        else:
            getattr(pipe, mode)(batches)
    assert calls == [0]  # cached on the first iteration, replayed after
    assert seen == [1.0, 1.0, 1.0, 1.0]


def test_engine_drain_keeps_cache_disable_clears_it():
    calls, seen = [], []
    with SWPipeline(_produce_consume(calls, seen, depth=2), device="cpu") as pipe:
        pipe.enable_shortcut("Produce")
        it = pipe.fill_pipeline([5, 6, 7])
        pipe.progress(it)
        pipe.drain()
        pipe.run([8, 9])  # still replaying iteration 0's output
        assert calls == [0] and seen == [5.0] * 5
        pipe.disable_shortcut("Produce")
        assert pipe.cached_shortcuts == []
        pipe.run([10])
    assert calls == [0, 0] and seen[-1] == 10.0


def test_engine_print_schedule_marks_shortcut_tasks(capsys):
    with SWPipeline(_produce_consume([], [], depth=2), device="cpu") as pipe:
        pipe.enable_shortcut("Produce")
        pipe.print_schedule(2)
        text = capsys.readouterr().out
        rows = {line.split()[1]: line.split()[2] for line in text.splitlines()[2:]}  # task -> the next column
        assert rows == {"Produce": "[skip]", "Consume": "compute"}  # only the shortcut task is marked
        assert "Produce" in repr(pipe) and "shortcuts=['Produce']" in repr(pipe)


def test_engine_globally_ordered_shortcut_keeps_its_sequence_turn(monkeypatch):
    from swpipe_core.engine.sequencer import SubmissionSequencer

    order, turn_free_on_arrival = [], []
    arrived = threading.Condition()
    execute_ordered = SubmissionSequencer.execute_ordered

    def arrive(self, seq, fn, *args, **kwargs):  # G2 (thread group b's only task) reaches the sequencer
        if threading.current_thread().name == "swpipe-b":
            with arrived:
                turn_free_on_arrival.append(self.next_seq == seq)
                arrived.notify_all()
        return execute_ordered(self, seq, fn, *args, **kwargs)
    monkeypatch.setattr(SubmissionSequencer, "execute_ordered", arrive)

    def slow(ctx):  # holds G1's thread until G2(i) waits for its turn: G2 would run first if G1 skipped its turn
        with arrived:
            assert arrived.wait_for(lambda: len(turn_free_on_arrival) > ctx.iter_idx, timeout=20.0)

    g1_io = DeclaredIO(capture=lambda: None, restore=lambda _: order.append("G1"))
    plan = PipelinePlan(
        schedule={
            PipelineTask("Slow", slow): TaskSchedule(thread_group="a"),
            PipelineTask("G1", lambda ctx: order.append("G1"), io=[g1_io]): TaskSchedule(thread_group="a", globally_ordered=True),
            PipelineTask("G2", lambda ctx: order.append("G2")): TaskSchedule(thread_group="b", globally_ordered=True),
        },
        intra_iter_deps=[("G1", "Slow")],
        enqueue_order=["Slow", "G1", "G2"],
    )
    with SWPipeline(plan, device="cpu", timeouts=Timeouts(sequencer_s=10.0)) as pipe:
        pipe.enable_shortcut("G1")
        pipe.run(range(4))
    assert turn_free_on_arrival == [False] * 4  # G2 arrived while G1 (not yet run) held the turn
    assert order == ["G1", "G2"] * 4  # caching run, then three replays, each before G2


def _training_plan(model, emb, opt, log):
    def zero_grad(ctx):
        opt.zero_grad(set_to_none=True)

    def embed(ctx):
        ctx.h = emb(ctx.batch[0])

    def forward(ctx):
        ctx.loss = torch.nn.functional.mse_loss(model(ctx.h), ctx.batch[1])

    def backward(ctx):
        ctx.loss.backward()
        log.append((float(ctx.loss.detach()), emb.weight.grad.clone() if emb.weight.grad is not None else None,
                    model.weight.grad))

    def step(ctx):
        opt.step()

    fns = [("ZeroGrad", zero_grad), ("Embed", embed), ("Forward", forward), ("Backward", backward), ("Step", step)]
    return PipelinePlan(
        schedule={PipelineTask(n, f): TaskSchedule() for n, f in fns},
        intra_iter_deps=[(b[0], a[0]) for a, b in zip(fns, fns[1:])],
    )


@pytest.mark.parametrize("mode", ["run_one_serial_iter", "run"])
def test_engine_shortcut_forward_then_real_backward_trains(mode):
    torch.manual_seed(0)
    emb, model = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(list(emb.parameters()) + list(model.parameters()), lr=0.1)
    log = []
    batch = (torch.randn(8, 4), torch.randn(8, 2))
    with SWPipeline(_training_plan(model, emb, opt, log), device="cpu") as pipe:
        pipe.enable_shortcut("Forward")
        if mode == "run":
            pipe.run([batch] * 5)
        else:
            for i in range(5):
                pipe.run_one_serial_iter(batch, iter_idx=i)
    assert len(log) == 5  # five backwards, none raised
    # iteration 0 ran Forward for real; replays feed back the same loss value...
    assert len({round(loss, 6) for loss, _, _ in log}) == 1
    # ...and gradients: upstream parameters (emb) get zeros, Forward's own parameters get none
    assert log[0][1].abs().sum() > 0 and log[0][2] is not None
    for _, emb_grad, model_grad in log[1:]:
        assert emb_grad is not None and emb_grad.abs().sum() == 0
        assert model_grad is None


def test_engine_in_place_write_to_replayed_output_is_reported_with_task_and_attr():
    from swpipe_core.engine.pipeline import PipelineTaskError
    from swpipe_core.engine.shortcut import ShortcutCorruptedError

    plan = PipelinePlan(
        schedule={PipelineTask("Make", lambda ctx: setattr(ctx, "buf", torch.zeros(2))): TaskSchedule(),
                  PipelineTask("Scale", lambda ctx: ctx.buf.add_(1)): TaskSchedule()},
        intra_iter_deps=[("Scale", "Make")],
    )
    with SWPipeline(plan, device="cpu") as pipe:
        pipe.enable_shortcut("Make")
        pipe.run_one_serial_iter(None, 0)  # caching: Scale writes into Make's real output, cache untouched
        pipe.run_one_serial_iter(None, 1)  # replay: Scale writes into the cache's storage
        with pytest.raises(PipelineTaskError) as info:
            pipe.run_one_serial_iter(None, 2)
    assert info.value.task == "Make" and info.value.iteration == 2
    assert isinstance(info.value.__cause__, ShortcutCorruptedError)
    assert "ctx.buf" in str(info.value.__cause__) and "'Make'" in str(info.value.__cause__)
