"""Pipeline parallelism across ranks: PyTorch's schedules read as programs, simulated and bounded."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from autosched.pp import (LiveTensorBytes, P2PCost, PPCosts, PPError, PPProgram, PPScheduleError, StageCost,
                          builtin_programs, measure_stage_costs, pp_program, program_from_order, split_module)
from autosched.pp.bounds import pp_lower_bounds
from autosched.pp.simulate import pp_simulate
from autosched.pp.whatif import pp_compare, pp_what_if
from autosched.pp.program import parse_action

SIZES = [(2, 4), (2, 8), (4, 8)]


def _uniform(n_stages: int, f: float = 1.0, b: float = 2.0, act: int = 100, p2p: P2PCost = P2PCost()) -> PPCosts:
    return PPCosts((StageCost(f, b, b / 2, b / 2, activation_bytes=act, weight_keep_bytes=act // 2),) * n_stages, p2p,
                   samples_per_microbatch=8)


@pytest.mark.parametrize("n_ranks,n_mb", SIZES)
def test_every_schedule_runs_each_microbatch_once_per_stage(n_ranks: int, n_mb: int) -> None:
    programs, refused = builtin_programs(n_ranks, n_mb)
    assert "GPipe" in programs and "1F1B" in programs
    for name, p in programs.items():
        assert len(p.stage_to_rank) == p.n_stages == n_ranks * p.stages_per_rank
        seen = {}
        for rank, actions in p.compute.items():
            for a in actions:
                stage, kind, mb = parse_action(a)
                assert p.stage_to_rank[stage] == rank, (name, a)
                seen.setdefault((stage, kind), []).append(mb)
        for stage in range(p.n_stages):
            assert sorted(seen[(stage, "F")]) == list(range(n_mb)), (name, stage)
            backward = sorted(seen.get((stage, "B"), []) + seen.get((stage, "I"), []))
            assert backward == list(range(n_mb)), (name, stage)
            assert sorted(seen.get((stage, "W"), [])) == sorted(seen.get((stage, "I"), [])), (name, stage)


def test_single_stage_schedules_are_read_from_their_step_loop() -> None:
    p = pp_program("1F1B", 2, 4)
    assert p.lowered is None  # no _PipelineScheduleRuntime order: its own loop posts and waits
    assert p.compute[0] == ("0F0", "0F1", "0B0", "0F2", "0B1", "0F3", "0B2", "0B3")
    kinds = [k for k, _ in p.steps[0]]
    assert "wait" in kinds and "post" in kinds
    # the last forward send of the warm-up goes out with the first backward receive, in one batch
    assert ("post", ("0SEND_F1", "0RECV_B0")) in p.steps[0]


def test_multi_stage_lowering_is_pytorchs() -> None:
    p = pp_program("Interleaved1F1B", 2, 4)
    assert p.lowered is not None
    flat = [a for acts in p.lowered.values() for a in acts]
    assert any("SEND_F" in a for a in flat) and any("RECV_B" in a for a in flat)
    again = program_from_order(p.compute, 4, p.stage_to_rank, defer_recv=False)  # PyTorch's default lowering
    assert again.lowered == p.lowered


def test_grid_is_a_step_by_rank_table() -> None:
    p = pp_program("GPipe", 2, 4)
    lines = p.grid().splitlines()
    assert lines[0].split() == ["Rank", "0", "Rank", "1"]
    rows = [line.split() for line in lines[1:]]
    assert len(rows) == max(len(a) for a in p.compute.values())
    assert rows[0][2:] == [p.compute[0][0], p.compute[1][0]]
    assert any("SEND_F0" in line for line in p.grid(comms=True).splitlines())


def test_errors_carry_fields() -> None:
    with pytest.raises(PPError) as e:
        pp_program("NoSuchSchedule", 2, 4)
    assert (e.value.rule, e.value.field) == ("unknown_schedule", "schedule")
    with pytest.raises(PPError) as e:
        pp_program("1F1B", 4, 2)
    assert (e.value.rule, e.value.field, e.value.schedule) == ("torch_rejects", "n_microbatches", "1F1B")
    with pytest.raises(PPError) as e:
        pp_program("GPipe", 2, 4, stages_per_rank=2)
    assert e.value.field == "stages_per_rank"
    with pytest.raises(PPError) as e:
        pp_simulate(pp_program("GPipe", 2, 4), _uniform(4))
    assert (e.value.rule, e.value.field) == ("missing_cost", "costs.stages")
    with pytest.raises(PPError) as e:
        parse_action("0X1")
    assert e.value.rule == "bad_action"


@pytest.mark.parametrize("n_mb", [4, 8])
def test_gpipe_and_1f1b_bubble_and_memory(n_mb: int) -> None:
    costs = _uniform(2, f=1.0, b=2.0, act=100)
    gpipe = pp_simulate(pp_program("GPipe", 2, n_mb), costs)
    ofob = pp_simulate(pp_program("1F1B", 2, n_mb), costs)
    # fill and drain: (n + S - 1) slots of F + B; one slot of bubble per rank either way
    assert gpipe.step_s == pytest.approx((n_mb + 1) * 3.0)
    assert ofob.step_s == pytest.approx(gpipe.step_s)
    assert gpipe.bubble_s == pytest.approx({0: 3.0, 1: 3.0})
    assert ofob.bubble_s == pytest.approx({0: 3.0, 1: 3.0})
    # GPipe holds every micro-batch's activations; 1F1B at most (S - rank)
    assert gpipe.peak_bytes == {0: 100 * n_mb, 1: 100 * n_mb}
    assert ofob.peak_bytes == {0: 200, 1: 100}


def test_transfers_add_their_latency_to_the_critical_path() -> None:
    p = pp_program("1F1B", 2, 4)
    free = pp_simulate(p, _uniform(2)).step_s
    slow = pp_simulate(p, _uniform(2, p2p=P2PCost(latency_s=0.25))).step_s
    assert slow >= free + 2 * 0.25  # at least the first forward's and the last backward's hops


def test_each_posted_op_takes_the_posting_rank_post_s() -> None:
    # GPipe, 1 micro-batch, F 1 and B 2, a free wire: rank 1 posts RECV_F0 at 0, computes F0 and
    # B0 from 1 to 4, then posts SEND_B0; rank 0 receives it at 4 and runs B0 to 6
    p = pp_program("GPipe", 2, 1)
    base = pp_simulate(p, PPCosts((StageCost(1.0, 2.0),) * 2))
    posting = pp_simulate(p, PPCosts((StageCost(1.0, 2.0),) * 2, P2PCost(post_s=0.1)))
    assert base.end_s == {0: pytest.approx(6.0), 1: pytest.approx(4.0)}
    # rank 1's RECV_F0 post ends before F0 can start anyway; its SEND_B0 post comes after B0
    assert posting.end_s[1] == pytest.approx(4.1)
    # rank 0 posts SEND_F0 after F0 (1 -> 1.1) and RECV_B0 (-> 1.2), long before B0's gradient comes
    assert posting.end_s[0] == pytest.approx(6.0)
    assert posting.busy_s == base.busy_s  # posting is not compute: it counts in the bubble
    # where every rank posts on its critical path, each post lengthens the step
    many = pp_program("LoopedBFS", 2, 8)
    assert pp_simulate(many, _uniform(4, p2p=P2PCost(post_s=0.1))).step_s > pp_simulate(many, _uniform(4)).step_s + 0.1


def test_reduce_grad_is_a_cost_per_step() -> None:
    costs = PPCosts((StageCost(1.0, 2.0, reduce_grad_s=0.5),) * 2, samples_per_microbatch=8)
    r = pp_simulate(pp_program("GPipe", 2, 4), costs)
    assert r.step_s == pytest.approx(15.0 + 0.5)  # rank 0's REDUCE_GRAD after its last backward
    assert r.busy_s[0] == pytest.approx(4 * 3.0 + 0.5)
    assert costs.stage(0).action_s("REDUCE_GRAD") == 0.5
    # per step, not per sample: half-size micro-batches keep it; a stage twice as fast halves it
    assert costs.rescaled(4).stage(0).reduce_grad_s == 0.5
    assert costs.rescaled(4).stage(0).forward_s == pytest.approx(0.5)
    assert costs.with_stage_factor({1: 0.5}).stage(1).reduce_grad_s == 0.25
    assert pp_lower_bounds(costs, 4, (0, 1)).value <= r.step_s


def test_input_gradient_lives_until_its_send() -> None:
    costs = PPCosts((StageCost(1.0, 2.0, activation_bytes=100, output_bytes=10),
                     StageCost(1.0, 2.0, activation_bytes=100, grad_input_bytes=1000)))
    res = pp_simulate(pp_program("GPipe", 2, 4), costs)
    assert res.peak_bytes[1] >= 1000 + 300  # B0's gradient waits for rank 0 to receive it


def test_a_receive_no_rank_sends_is_a_deadlock() -> None:
    gpipe = pp_program("GPipe", 2, 1)
    # rank 0 waits for the gradient before it sends the forward that rank 1 waits for
    steps = {0: (("compute", ("0F0",)), ("post", ("0RECV_B0",)), ("wait", ("0RECV_B0",)), ("post", ("0SEND_F0",)),
                 ("wait", ("0SEND_F0",)), ("compute", ("0B0",))), 1: gpipe.steps[1]}
    p = PPProgram("broken", 2, 2, 1, (0, 1), gpipe.compute, steps)
    with pytest.raises(PPScheduleError) as e:
        pp_simulate(p, _uniform(2))
    assert (e.value.rule, e.value.rank, e.value.action, e.value.step) == ("deadlock", 0, "0RECV_B0", 2)


def test_bounds_never_exceed_the_simulated_step() -> None:
    rng = random.Random(7)
    for (n_ranks, n_mb), _ in itertools.product(SIZES, range(3)):
        programs, _ = builtin_programs(n_ranks, n_mb)
        by_stages = {}
        for p in programs.values():
            if p.n_stages not in by_stages:
                by_stages[p.n_stages] = PPCosts(
                    tuple(StageCost(rng.uniform(0.5, 2), b := rng.uniform(1, 4), b * rng.uniform(0.4, 0.7),
                                    b * rng.uniform(0.4, 0.7), loss_s=0.1 if s == p.n_stages - 1 else 0.0,
                                    output_bytes=1000) for s in range(p.n_stages)),
                    P2PCost(rng.uniform(0, 0.2), 1e-5))
            costs = by_stages[p.n_stages]
            bound = pp_lower_bounds(costs, n_mb, p.stage_to_rank)
            assert bound.value <= pp_simulate(p, costs).step_s + 1e-9, (p.schedule, n_ranks, n_mb)
            assert bound.binding in dict(bound.components)


def test_bound_is_tight_for_gpipe_on_uniform_costs() -> None:
    b = pp_lower_bounds(_uniform(2, b=2.0), 4, (0, 1))
    assert b.value <= 15.0
    no_split = PPCosts((StageCost(1.0, 2.0),) * 2)
    assert pp_lower_bounds(no_split, 4, (0, 1)).value == pytest.approx(15.0)
    # the binding is a label: which bound and where
    assert pp_lower_bounds(no_split, 4, (0, 1)).binding == "fill + work + drain: rank 1"


def test_what_if_more_microbatches_same_batch() -> None:
    costs = _uniform(2, f=1.0, b=2.0, act=100)
    w = pp_what_if(pp_program("GPipe", 2, 4), costs, n_microbatches=8)
    assert w.after.step_s == pytest.approx(9 * 1.5)  # (8 + 1) slots of half the work
    assert w.after.peak_bytes[0] == 8 * 50
    assert w.speedup == pytest.approx(15.0 / 13.5)
    with pytest.raises(PPError) as e:
        pp_what_if(pp_program("GPipe", 2, 4), costs, n_microbatches=3)
    assert e.value.field == "n_microbatches"


def test_what_if_stage_twice_as_fast_and_cap() -> None:
    costs = _uniform(2, f=1.0, b=2.0, act=100)
    w = pp_what_if(pp_program("1F1B", 2, 4), costs, stage_factors={1: 0.5}, max_memory_bytes=150)
    assert w.after.step_s < w.before.step_s
    assert w.after.busy_s[1] == pytest.approx(w.before.busy_s[1] / 2)
    assert w.over_cap_ranks == {0: 200} and not w.fits_cap


def test_compare_marks_the_fastest_schedule_within_the_cap() -> None:
    rows = pp_compare({2: _uniform(2), 4: _uniform(4, f=0.5, b=1.0, act=50)}, 2, 4, max_memory_bytes=250)
    assert {r.schedule for r in rows} >= {"GPipe", "1F1B", "ZBVZeroBubble"}
    best = [r for r in rows if r.best]
    assert len(best) == 1 and best[0].fits_cap
    assert all(best[0].step_s <= r.step_s for r in rows if r.fits_cap)
    assert not next(r for r in rows if r.schedule == "GPipe").fits_cap


def test_live_tensor_bytes_counts_new_storages_once() -> None:
    with LiveTensorBytes() as mem:
        a = torch.ones(256)
        b = a.view(16, 16)
        a.add_(1)
        c = torch.ones(512)
        del c
    assert (mem.live_bytes, mem.peak_bytes) == (1024, 3072)
    del a, b
    assert mem.live_bytes == 0


def test_stage_costs_measure_the_bytes_each_stage_keeps() -> None:
    torch.manual_seed(0)
    layers = [m for _ in range(4) for m in (torch.nn.Linear(16, 16), torch.nn.ReLU())]
    stages = split_module(layers, 2)
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    costs = measure_stage_costs(stages, x, y, torch.nn.functional.mse_loss, repeats=1, warmup=0)
    relu_out = 4 * 16 * 4
    assert costs[0].output_bytes == relu_out and costs[1].output_bytes == 0
    assert costs[0].activation_bytes >= relu_out  # the output the stage caches for its backward
    assert costs[1].grad_input_bytes == relu_out and costs[0].grad_input_bytes == 0
    assert costs[0].backward_input_s == 0.0  # the runtime skips the first stage's I; its W does it all
    assert all(c.forward_s > 0 and c.backward_s > 0 and c.reduce_grad_s > 0 for c in costs)
    assert all(p.grad is not None and not p.grad.any() for st in stages for p in st.parameters())


def test_a_sent_tensor_lives_as_long_as_the_runtime_holds_the_send() -> None:
    import dataclasses

    costs = PPCosts((StageCost(1.0, 2.0, activation_bytes=100, output_bytes=40),
                     StageCost(1.0, 2.0, activation_bytes=100)))
    p = pp_program("1F1B", 2, 4)
    assert p.send_retention == "traced" and pp_program("Interleaved1F1B", 2, 4).send_retention == "step"
    # 1F1B's loop: the warmup's fired send (0F0's) stays in send_work until the steady phase ends (after 0B2); a
    # pending fwd_sends until the next forward's replaces it (0F1's after 0F2)
    assert p.send_release[0]["0SEND_F0"] == "0B2" and p.send_release[0]["0SEND_F1"] == "0F2"
    traced = pp_simulate(p, costs).peak_bytes[0]
    until_next = pp_simulate(dataclasses.replace(p, send_retention="next"), costs).peak_bytes[0]
    until_end = pp_simulate(dataclasses.replace(p, send_retention="step"), costs).peak_bytes[0]
    assert until_next == 200  # two micro-batches in flight on the first rank
    assert traced == 2 * 100 + 40  # at 0F3: 0F2 and 0F3 in flight, and 0F0's output its send_work still holds
    # held to the end: at 0F3, 0F2 and 0F3 in flight and the outputs of micro-batches 0 and 1, done, held by their sends
    assert until_end == 2 * 100 + 2 * 40


# measured on the unequal MLP of benchmarks/unseen_models.py, cut in 4 stages, 8 micro-batches of 16: each stage's
# bytes (measure_stage_costs) and each rank's peak in PyTorch's 1F1B runtime (LiveTensorBytes around schedule.step)
_MLP4_BYTES = (
    dict(activation_bytes=4096, output_bytes=4096, forward_peak_bytes=4096, backward_peak_bytes=65536,
         backward_weight_peak_bytes=65536),
    dict(activation_bytes=4096, weight_keep_bytes=4096, output_bytes=4096, grad_input_bytes=4096,
         forward_peak_bytes=8192, backward_peak_bytes=24832, backward_input_peak_bytes=8192,
         backward_weight_peak_bytes=16640),
    dict(activation_bytes=4096, weight_keep_bytes=4096, output_bytes=4096, grad_input_bytes=4096,
         forward_peak_bytes=8192, backward_peak_bytes=24832, backward_input_peak_bytes=8192,
         backward_weight_peak_bytes=16640),
    dict(activation_bytes=196616, weight_keep_bytes=294912, grad_input_bytes=4096, loss_keep_bytes=4,
         forward_peak_bytes=196616, backward_peak_bytes=4231168, backward_input_peak_bytes=229380,
         backward_weight_peak_bytes=6166528))
_MLP4_1F1B_MEASURED = {0: 86016, 1: 45312, 2: 41216, 3: 4431908}


def test_1f1b_peaks_count_the_warmup_send_its_loop_still_holds() -> None:
    """On 4 ranks the first three stages' 1F1B peaks include the last warmup send's output that ``send_work`` holds
    past its backward: without it every rank but the last was one micro-batch's output short (up to 10 %)."""
    import dataclasses

    costs = PPCosts(tuple(StageCost(1.0, 2.0, **b) for b in _MLP4_BYTES))
    p = pp_program("1F1B", 4, 8)
    assert pp_simulate(p, costs).peak_bytes == _MLP4_1F1B_MEASURED
    short = pp_simulate(dataclasses.replace(p, send_retention="next"), costs).peak_bytes
    assert {r: _MLP4_1F1B_MEASURED[r] - short[r] for r in short} == {0: 4096, 1: 4096, 2: 4096, 3: 0}


def test_the_last_stage_keeps_what_its_loss_holds_to_the_end_of_the_step() -> None:
    keep = StageCost(1.0, 2.0, activation_bytes=100, loss_keep_bytes=30)
    costs = PPCosts((StageCost(1.0, 2.0, activation_bytes=100), keep))
    res = pp_simulate(pp_program("1F1B", 2, 4), costs)
    # the last rank holds one micro-batch at a time, plus what each finished micro-batch's loss keeps
    assert res.peak_bytes[1] == 100 + 3 * 30


# ----------------------------------------------------------------------------- memory on a transformer

_VOCAB, _WIDTH, _SEQ, _MB, _N_MB = 64, 32, 16, 2, 4


class _Embed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(_VOCAB, _WIDTH)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens)


def _lm_stages() -> list:
    """A tiny language model in 3 stages: embedding + attention block | attention block + LayerNorm | head."""
    torch.manual_seed(0)
    blocks = [torch.nn.TransformerEncoderLayer(_WIDTH, 2, 2 * _WIDTH, dropout=0.0, batch_first=True) for _ in range(2)]
    return split_module([_Embed(), *blocks, torch.nn.LayerNorm(_WIDTH), torch.nn.Linear(_WIDTH, _VOCAB)], 3)


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def _lm_batch() -> tuple:
    g = torch.Generator().manual_seed(0)
    shape = (_MB * _N_MB, _SEQ)
    return torch.randint(0, _VOCAB, shape, generator=g), torch.randint(0, _VOCAB, shape, generator=g)


@pytest.fixture(scope="module")
def lm_costs() -> PPCosts:
    x, y = _lm_batch()
    return PPCosts(measure_stage_costs(_lm_stages(), x[:_MB], y[:_MB], _lm_loss, repeats=1, warmup=0), P2PCost())


def test_a_stage_keeps_what_autograd_saves_and_what_the_runtime_caches(lm_costs: PPCosts) -> None:
    # what each stage's forward leaves alive, counted apart from the meter: the storages autograd saves
    # (softmax's output, LayerNorm's mean and rstd, cross-entropy's log_softmax...), the stage's output
    # (the runtime's fwd_cache holds it to the backward, though cross-entropy does not save the logits)
    # and the loss; less the weights, the input and the target, made elsewhere
    x, y = _lm_batch()
    stages = _lm_stages()
    inp = x[:_MB]
    expected = []
    for s, stage in enumerate(stages):
        saved: dict = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = stage(inp)
            loss = _lm_loss(out, y[:_MB]) if s == len(stages) - 1 else None
        alive = dict(saved)
        for t in (out, loss):
            if t is not None:
                alive[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        for t in [*stage.parameters(), inp, y]:
            alive.pop(t.untyped_storage().data_ptr(), None)
        expected.append(sum(alive.values()))
        inp = out.detach().requires_grad_(True)
    assert [c.activation_bytes for c in lm_costs.stages] == expected
    logits = _MB * _SEQ * _VOCAB * 4
    assert lm_costs.stages[-1].activation_bytes > logits  # the logits are among them


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("split", [False, True])
def test_predicted_peak_is_the_runtime_step_metered(lm_costs: PPCosts, one_rank_group, split: bool, tmp_path) -> None:
    """PyTorch's runtime runs the 3 stages on one rank (every forward, then every backward); its step, metered by
    LiveTensorBytes, peaks where the simulator says: with I and W, when every I has left what W needs."""
    from torch.distributed.pipelining import PipelineStage

    # PyTorch's CSV loader is private to torch (autosched.pp._torch isolates it behind a version check)
    from autosched.pp import _torch

    n = 3
    back = [f"{s}{k}{m}" for k in (("I", "W") if split else ("B",)) for s in reversed(range(n)) for m in range(_N_MB)]
    program = program_from_order({0: [f"{s}F{m}" for s in range(n) for m in range(_N_MB)] + back}, _N_MB, (0,) * n)
    modules = _lm_stages()
    stages = [PipelineStage(modules[s], s, n, torch.device("cpu")) for s in range(n)]
    schedule = _torch.runtime_from_csv(stages, _N_MB, _lm_loss, program.to_csv(str(tmp_path / "order.csv")), n)
    x, y = _lm_batch()
    for p in (p for m in modules for p in m.parameters()):
        p.grad = torch.zeros_like(p)  # gradients exist before the metered step, as in training
    schedule.step(x, target=y, losses=[], return_outputs=False)  # the first step allocates the receive buffers
    with LiveTensorBytes() as mem:
        schedule.step(x, target=y, losses=[], return_outputs=False)
    predicted = pp_simulate(program, lm_costs).peak_bytes[0]
    assert predicted == pytest.approx(mem.peak_bytes, rel=0.01)

# -- the step on the plan simulator's event core (ranks as thread groups, transfers as tasks, a core pool) ----------


def _varied(n_stages: int, seed: int, p2p: P2PCost) -> PPCosts:
    rng = random.Random(seed)
    return PPCosts(tuple(StageCost(rng.choice([1.0, 2.0]), rng.choice([2.0, 3.0]), rng.choice([1.0, 1.5]),
                                   rng.choice([0.5, 1.0]), loss_s=0.1, reduce_grad_s=0.2, activation_bytes=1000,
                                   weight_keep_bytes=300, output_bytes=rng.choice([0, 100]),
                                   grad_input_bytes=rng.choice([0, 50]), loss_keep_bytes=10,
                                   forward_peak_bytes=rng.choice([0, 70]), backward_peak_bytes=90)
                         for _ in range(n_stages)), p2p)


def test_gpipe_with_link_and_posting_costs_runs_as_derived_by_hand() -> None:
    # F 1 s, B 2 s, a transfer 0.5 s after both sides posted, each post 0.1 s of the posting rank:
    # rank 0: 0F0 0-1, post, 0F1 1.1-2.1, post (2.2), waits F1's transfer (2.5-3.0), posts RECV_B0 (3.1),
    #         B0 lands 6.5 (sent at 6.0): 0B0 6.5-8.5, posts RECV_B1 (8.6), B1 lands 9.0 (8.5): 0B1 9-11
    # rank 1: F0 lands 1.5: 1F0 1.5-2.5, posts RECV_F1 2.5, F1 lands 3.0: 1F1 3-4, 1B0 4-6, post, 1B1 6.1-8.1,
    #         post (8.2), waits B1's transfer: 9.0
    costs = PPCosts((StageCost(1.0, 2.0),) * 2, P2PCost(latency_s=0.5, post_s=0.1))
    r = pp_simulate(pp_program("GPipe", 2, 2), costs)
    assert r.step_s == pytest.approx(11.0)
    assert (r.end_s, r.busy_s) == (pytest.approx({0: 11.0, 1: 9.0}), pytest.approx({0: 6.0, 1: 6.0}))
    got = [(e.rank, e.action, e.start_s, e.end_s) for e in r.timeline if "LOSS" not in e.action and "REDUCE" not in e.action]
    assert [(rank, action, pytest.approx(t0), pytest.approx(t1)) for rank, action, t0, t1 in got] == [
        (0, "0F0", 0.0, 1.0), (0, "0SEND_F0", 1.0, 1.5), (0, "0F1", 1.1, 2.1), (1, "1F0", 1.5, 2.5),
        (0, "0SEND_F1", 2.1, 3.0), (1, "1F1", 3.0, 4.0), (1, "1B0", 4.0, 6.0), (1, "1SEND_B0", 6.0, 6.5),
        (1, "1B1", 6.1, 8.1), (0, "0B0", 6.5, 8.5), (1, "1SEND_B1", 8.1, 9.0), (0, "0B1", 9.0, 11.0)]


# step_s and per-rank peak of every built-in schedule on 4 ranks, 8 micro-batches, _varied(n_stages, index + 7,
# _LINK) (index: the schedule's place in sorted order; its own send_retention): what the rank-by-rank loop swpipe ran before the event core
# predicted (the loop was checked against PyTorch's runtime, tests/test_pp_torchrun.py); but 1F1B's rank 1 holds
# 100 bytes more: the output of its last warmup send, which 1F1B's send_work keeps past its backward (traced)
_LINK = P2PCost(latency_s=0.3, seconds_per_byte=0.001, post_s=0.05)
_BEFORE = {
    "1F1B": (47.45, {0: 4090, 1: 3240, 2: 2090, 3: 1210}),
    "DualPipeV": (84.2, {0: 9330, 1: 9740, 2: 9290, 3: 9940}),
    "GPipe": (59.55, {0: 8090, 1: 8090, 2: 8090, 3: 8090}),
    "Interleaved1F1B": (91.15, {0: 11090, 1: 9590, 2: 7690, 3: 5760}),
    "InterleavedZeroBubble": (72.0, {0: 8600, 1: 7800, 2: 7200, 3: 6720}),
    "LoopedBFS": (108.5, {0: 16090, 1: 16090, 2: 16090, 3: 16090}),
    "ZBVZeroBubble": (73.05, {0: 8040, 1: 8700, 2: 8450, 3: 9200}),
}


def test_every_schedule_predicts_the_step_and_peaks_the_rank_loop_predicted() -> None:
    programs, _ = builtin_programs(4, 8)
    assert sorted(programs) == sorted(_BEFORE)
    for k, (name, program) in enumerate(sorted(programs.items())):
        r = pp_simulate(program, _varied(program.n_stages, k + 7, _LINK))
        assert (r.step_s, r.peak_bytes) == (pytest.approx(_BEFORE[name][0]), _BEFORE[name][1]), name


@pytest.mark.parametrize("n_ranks,n_mb", [(2, 4), (3, 6), (4, 8)])
def test_every_schedule_runs_its_steps_in_order_on_its_costs(n_ranks: int, n_mb: int) -> None:
    programs, _ = builtin_programs(n_ranks, n_mb)
    for k, (name, program) in enumerate(sorted(programs.items())):
        for p2p in (P2PCost(), _LINK):
            costs = _varied(program.n_stages, k, p2p)
            r = pp_simulate(program, costs)
            for rank in range(n_ranks):
                ran = [e for e in r.timeline if e.rank == rank and "SEND" not in e.action]
                order = [a for kind, acts in program.steps[rank] if kind == "compute" for a in acts]
                assert [e.action for e in ran] == order, (name, rank)
                cost = [costs.stage(parse_action(a)[0]).action_s(parse_action(a)[1]) for a in order]
                assert [e.end_s - e.start_s for e in ran] == pytest.approx(cost), (name, rank)
                assert all(b.start_s >= a.end_s - 1e-12 for a, b in zip(ran, ran[1:])), (name, rank)
                assert r.busy_s[rank] == pytest.approx(sum(cost)) and r.end_s[rank] >= ran[-1].end_s - 1e-12
            start = {e.action: e.start_s for e in r.timeline}
            for e in r.timeline:
                if "SEND" in e.action:  # the action that reads the transfer starts once it landed
                    stage, kind, mb = parse_action(e.action)
                    reader = f"{stage + 1}F{mb}" if kind == "SEND_F" else next(
                        f"{stage - 1}{b}{mb}" for b in ("B", "I") if f"{stage - 1}{b}{mb}" in start)
                    nbytes = costs.stage(stage if kind == "SEND_F" else stage - 1).output_bytes
                    assert e.end_s - e.start_s >= p2p.seconds(nbytes) - 1e-12, (name, e)
                    assert start[reader] >= e.end_s - 1e-12, (name, e.action, reader)
            assert r.step_s == max(r.end_s.values()) and r.bubble_s == pytest.approx(
                {q: r.step_s - b for q, b in r.busy_s.items()}), name
            # a core per rank (or more) is no pool at all
            assert pp_simulate(program, costs, cores=n_ranks) == r, name


def test_ranks_that_share_cores_take_turns_on_them() -> None:
    costs = PPCosts((StageCost(1.0, 2.0),) * 2)
    gpipe = pp_program("GPipe", 2, 4)
    alone = pp_simulate(gpipe, costs)
    shared = pp_simulate(gpipe, costs, cores=1)
    assert (alone.step_s, shared.step_s) == (15.0, 24.0)  # one core: every action of both ranks one after another
    assert shared.busy_s == alone.busy_s  # the work is the same; the wait for the core is bubble
    three = pp_simulate(pp_program("GPipe", 3, 6), PPCosts((StageCost(1.0, 2.0),) * 3), cores=2)
    assert pp_simulate(pp_program("GPipe", 3, 6), PPCosts((StageCost(1.0, 2.0),) * 3)).step_s < three.step_s < 54.0


def test_a_stop_asked_every_256_events_ends_the_simulation() -> None:
    from autosched.pp.simulate import SimCut

    program, costs = pp_program("LoopedBFS", 4, 8), _uniform(8, p2p=P2PCost(latency_s=0.1, post_s=0.01))
    asked = []

    def stop() -> bool:
        asked.append(True)
        return len(asked) == 2

    with pytest.raises(SimCut) as cut:
        pp_simulate(program, costs, stop=stop)
    assert (cut.value.events, len(asked)) == (256, 2)  # asked before the first event, then after 256
    never = pp_simulate(program, costs, stop=lambda: False)
    assert never == pp_simulate(program, costs)


def _posted_early(rank0_recv_first: bool, rank1_recv_first: bool) -> PPProgram:
    """Two ranks, two micro-batches; each rank posts a receive before (or after) a send of its own, in another step."""
    sends = [("post", ("0SEND_F1",)), ("post", ("0RECV_B0",))]
    r0 = (("compute", ("0F0",)), ("post", ("0SEND_F0",)), ("compute", ("0F1",)),
          *(sends[::-1] if rank0_recv_first else [("post", ("0SEND_F1", "0RECV_B0"))]),
          ("wait", ("0RECV_B0",)), ("compute", ("0B0",)), ("post", ("0RECV_B1",)), ("wait", ("0RECV_B1",)),
          ("compute", ("0B1",)), ("wait", ("0SEND_F0", "0SEND_F1")))
    mid = ([("post", ("1RECV_F1",)), ("compute", ("1B0",)), ("post", ("1SEND_B0",))] if rank1_recv_first else
           [("compute", ("1B0",)), ("post", ("1SEND_B0",)), ("post", ("1RECV_F1",))])
    r1 = (("post", ("1RECV_F0",)), ("wait", ("1RECV_F0",)), ("compute", ("1F0",)), *mid, ("wait", ("1RECV_F1",)),
          ("compute", ("1F1",)), ("compute", ("1B1",)), ("post", ("1SEND_B1",)), ("wait", ("1SEND_B0", "1SEND_B1")))
    return PPProgram("posted early", 2, 2, 2, (0, 1), {0: ("0F0", "0F1", "0B0", "0B1"),
                                                       1: ("1F0", "1B0", "1F1", "1B1")}, {0: r0, 1: r1})


def test_on_cuda_a_send_posted_behind_a_receive_waits_until_the_receive_lands() -> None:
    # stage 0's forward 3 s, the rest 1 s, transfers 0.5 s. Rank 1 posts its receive of F1 (at 4.5, after 1F0) before
    # its send of B0 (ready at 5.5, after 1B0): on CUDA the receive holds rank 1's NCCL stream until F1 lands (sent at
    # 6.0 once 0F1 ends: 6.5), so B0 goes at 6.5, lands at 7.0, and 0B0 runs 7-8 (on CPU: sent at 5.5, 0B0 at 6.5)
    costs = PPCosts((StageCost(3.0, 1.0), StageCost(1.0, 1.0)), P2PCost(latency_s=0.5))
    program = _posted_early(rank0_recv_first=False, rank1_recv_first=True)

    def timeline(device: str):
        r = pp_simulate(program, costs, device=device)
        return {e.action: (pytest.approx(e.start_s), pytest.approx(e.end_s)) for e in r.timeline}, r

    cpu, on_cpu = timeline("cpu")
    cuda, on_cuda = timeline("cuda")
    assert (cpu["1SEND_B0"], cpu["0B0"]) == ((5.5, 6.5), (6.5, 7.5))
    assert (cuda["1SEND_B0"], cuda["0B0"]) == ((6.5, 7.0), (7.0, 8.0))
    assert cuda["1F1"] == cpu["1F1"] == (6.5, 7.5) and cuda["0B1"] == (9.0, 10.0)
    assert on_cuda.end_s == on_cpu.end_s == {0: 10.0, 1: 9.0}
    # a send holds the stream as well: posted before the receive, it keeps F1 from arriving before B0 landed (6.5)
    other = pp_simulate(_posted_early(False, False), costs, device="cuda")
    assert [(e.start_s, e.end_s) for e in other.timeline if e.action in ("0SEND_F1", "1F1")] == [(6.0, 7.0), (7.0, 8.0)]
    assert other.step_s == 10.5 and pp_simulate(_posted_early(False, False), costs).step_s == 10.0
    # costs measured over NCCL are CUDA's
    nccl = PPCosts(costs.stages, P2PCost(latency_s=0.5, backend="nccl"))
    assert pp_simulate(program, nccl).timeline == on_cuda.timeline


def test_on_cuda_receives_posted_before_sends_on_both_ranks_deadlock() -> None:
    program = _posted_early(rank0_recv_first=True, rank1_recv_first=True)
    costs = PPCosts((StageCost(3.0, 1.0), StageCost(1.0, 1.0)), P2PCost(latency_s=0.5))
    assert pp_simulate(program, costs).step_s == 10.0  # gloo's CPU transfers do not queue on a stream
    with pytest.raises(PPScheduleError) as e:
        pp_simulate(program, costs, device="cuda")
    assert (e.value.rule, e.value.rank, e.value.action, e.value.step) == ("stream_deadlock", 0, "0RECV_B0", 3)
    with pytest.raises(PPError) as bad:
        pp_simulate(program, costs, device="tpu")
    assert (bad.value.rule, bad.value.field, bad.value.value) == ("bad_value", "device", "tpu")


def test_gantt_draws_a_pp_step_a_row_per_rank_and_stream() -> None:
    from autosched.plots import gantt

    costs = PPCosts((StageCost(3.0, 1.0), StageCost(1.0, 1.0)), P2PCost(latency_s=0.5))
    program = _posted_early(rank0_recv_first=False, rank1_recv_first=True)
    for device, rows in (("cpu", ["thread rank0", "thread rank1", "stream rank0.comm", "stream rank1.comm"]),
                         ("cuda", ["stream rank0.comm", "stream rank0.compute", "stream rank1.comm",
                                   "stream rank1.compute"])):
        r = pp_simulate(program, costs, device=device)
        assert r.device == device
        fig = gantt(r.events)
        assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == rows, device
        assert len(fig.axes[0].collections) == len(r.events) == len(r.timeline), device  # a bar per interval
        # a rank's actions on its own row, as its timeline has them; B0's transfer on rank 1's link row
        got = {(e.thread_group, e.task, e.iteration, e.start, e.end) for e in r.events}
        assert ("rank1", "1SEND_B", 0, *[(e.start_s, e.end_s) for e in r.timeline if e.action == "1SEND_B0"][0]) in got
        for e in r.timeline:
            stage, kind, mb = parse_action(e.action)
            assert (f"rank{e.rank}", f"{stage}{kind}", mb, e.start_s, e.end_s) in got, (device, e)
        assert [t.get_text() for t in r.gantt().axes[0].get_yticklabels()] == rows
