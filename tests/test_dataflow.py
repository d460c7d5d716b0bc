"""Observed dataflow: the recorder, the inferred dependencies and the plan checker (issue 17)."""

import sys
import weakref
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from swpipe_core import pipelines
from swpipe_core.dataflow import (DataflowRecordError, check_dataflow, infer_deps, infer_plan, record_dataflow)
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import DeclaredIO, PipelinePlan, PipelineTask, TaskSchedule

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the README MLP

def _mlp(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 8, dtype=torch.float64, generator=gen), torch.randn(32, 1, generator=gen))
               for _ in range(6)]

    def load(ctx):
        x, y = ctx.batch
        ctx.x, ctx.y = x.to(torch.float32), y

    def forward(ctx):
        ctx.loss = torch.nn.functional.mse_loss(model(ctx.x), ctx.y)

    def backward(ctx):
        opt.zero_grad()
        ctx.loss.backward()

    def step(ctx):
        opt.step()

    tasks = {"Load": PipelineTask("Load", load), "Forward": PipelineTask("Forward", forward),
             "Backward": PipelineTask("Backward", backward), "Step": PipelineTask("Step", step)}
    return model, opt, batches, tasks


README_INTRA = [("Forward", "Load"), ("Backward", "Forward"), ("Step", "Backward")]
README_INTER = [("Forward", "Step", 1)]


def _mlp_plan(tasks, intra=README_INTRA, inter=README_INTER, fwd_group="default", step_stage=1):
    return PipelinePlan({tasks["Load"]: TaskSchedule(0, thread_group="io"),
                         tasks["Forward"]: TaskSchedule(1, thread_group=fwd_group),
                         tasks["Backward"]: TaskSchedule(step_stage), tasks["Step"]: TaskSchedule(step_stage)},
                        intra_iter_deps=intra, inter_iter_deps=inter)


def test_recorder_names_parameters_grads_and_optimizer_state():
    model, opt, batches, tasks = _mlp()
    rec = record_dataflow(list(tasks.values()), batches[:2], state=[model, opt])
    assert rec.touched("Load", "write") == ["ctx.x", "ctx.y"]
    assert "0.weight" in rec.touched("Forward", "read")
    assert "0.weight.grad" in rec.touched("Backward", "write")  # autograd's writes count for backward()'s caller
    assert "0.weight" in rec.touched("Step", "write") and "0.weight.grad" in rec.touched("Step", "read")
    assert "optimizer.state[0.weight].momentum_buffer" in rec.touched("Step", "write")
    assert "Step" in str(rec) and "ctx.x" in str(rec)


def test_readme_mlp_inferred_deps_equal_hand_written_and_run_bit_identical():
    model, opt, batches, tasks = _mlp()
    deps = infer_plan(list(tasks.values()), batches[:3], state=[model, opt])
    assert deps.intra == README_INTRA and deps.inter == README_INTER
    assert deps.plan.pipeline_depth == 1 and "('Forward', 'Step', 1)" in str(deps)
    # rebuilt with the inferred deps, pipelined, against a serial run from the same start
    results = []
    for pipelined in (False, True):
        model, opt, batches, tasks = _mlp()
        plan = _mlp_plan(tasks, deps.intra, deps.inter)
        with SWPipeline(plan, device="cpu") as pipe:
            (pipe.run if pipelined else pipe.run_serial)(iter(batches))
        results.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_custom_plan_example_deps_equal_inferred():
    from swpipe.workloads import DLRMConfig, DLRMWorkload, SyntheticData, init_distributed, task_fns
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from custom_plan import lookup_ahead_plan
    finally:
        sys.path.remove(str(ROOT / "examples"))
    env = init_distributed()
    try:
        cfg = DLRMConfig.preset("test")
        wl = DLRMWorkload(cfg, env)
        hand = lookup_ahead_plan()
        deps = infer_plan(hand.bind(task_fns(wl, hand.task_names)), SyntheticData(cfg).batches(3),
                          state=[wl.model, wl.dense_opt])
        assert sorted(deps.intra) == sorted(hand.intra_edges())
        assert sorted(deps.inter) == sorted(hand.inter_edges())
    finally:
        env.close()


# ------------------------------------------------------------ what the checker catches

def test_checker_catches_removed_intra_dependency_ctx_race():
    model, opt, batches, tasks = _mlp()
    plan = _mlp_plan(tasks, intra=[("Backward", "Forward"), ("Step", "Backward")])
    report = check_dataflow(plan, batches[:3], state=[model, opt])
    assert not report.ok
    fixes = {f.fix for f in report.missing}
    assert ("Forward", "Load") in fixes
    msg = next(str(f) for f in report.missing if f.fix == ("Forward", "Load"))
    assert "ctx.x" in msg and "RAW" in msg and "intra_iter_deps" in msg
    with pytest.raises(Exception, match="Forward"):
        report.raise_if_missing()


def test_checker_catches_removed_step_forward_ordering_at_stage_gap():
    model, opt, batches, tasks = _mlp()
    # Forward one stage ahead, on its own thread: nothing orders it after Step(i-1) any more
    plan = _mlp_plan(tasks, inter=[], fwd_group="fwd", step_stage=2)
    plan = plan.replace(intra_iter_deps=README_INTRA)
    report = check_dataflow(plan, batches[:3], state=[model, opt])
    hit = [f for f in report.missing if f.fix == ("Forward", "Step", 1)]
    assert hit and "0.weight" in str(hit[0]) and "inter_iter_deps" in str(hit[0])
    assert check_dataflow(_mlp_plan(tasks, fwd_group="fwd"), batches[:3], state=[model, opt]).ok


def test_checker_reports_staleness_when_one_thread_runs_the_reader_first():
    model, opt, batches, tasks = _mlp()
    plan = _mlp_plan(tasks, inter=[], step_stage=2).replace(intra_iter_deps=README_INTRA)
    report = check_dataflow(plan, batches[:3], state=[model, opt])
    assert report.ok  # deterministic, so not a race: a stale read
    stale = [f for f in report.stale if f.tasks == ("Forward", "Step")]
    assert stale and stale[0].stale_by == 1 and "0.weight" in str(stale[0]) and "1 iteration(s) stale" in str(stale[0])


def test_checker_reports_task_mutating_the_batch_in_place():
    def load(ctx):
        ctx.batch.mul_(2)
        ctx.x = ctx.batch + 0

    def use(ctx):
        ctx.y = ctx.x * 3

    plan = PipelinePlan({PipelineTask("Load", load): TaskSchedule(0), PipelineTask("Use", use): TaskSchedule(0)},
                        intra_iter_deps=[("Use", "Load")])
    report = check_dataflow(plan, [torch.ones(3) for _ in range(2)])
    bad = [f for f in report.missing if f.kind == "mutates_batch"]
    assert bad and bad[0].tasks == ("Load",) and "batch" in bad[0].message and "clone" in bad[0].message


def test_checker_catches_two_tasks_writing_one_attribute():
    def a(ctx): ctx.y = ctx.batch + 1
    def b(ctx): ctx.y = ctx.batch + 2
    def c(ctx): ctx.z = ctx.y * 2
    plan = PipelinePlan({PipelineTask("A", a): TaskSchedule(0, thread_group="ta"),
                         PipelineTask("B", b): TaskSchedule(0, thread_group="tb"),
                         PipelineTask("C", c): TaskSchedule(0)},
                        intra_iter_deps=[("C", "A"), ("C", "B")])
    report = check_dataflow(plan, [torch.ones(2)] * 2)
    waw = [f for f in report.missing if f.fix == ("B", "A")]
    assert waw and "WAW" in waw[0].message and "ctx.y" in waw[0].message


def test_redundant_declared_dependency_is_information():
    model, opt, batches, tasks = _mlp()
    plan = _mlp_plan(tasks, intra=README_INTRA + [("Step", "Load")])
    report = check_dataflow(plan, batches[:3], state=[model, opt])
    assert report.ok
    red = [f for f in report.redundant if f.tasks == ("Step", "Load")]
    assert red and red[0].level == "info" and "removing" in red[0].message  # information: it may be removed


# ------------------------------------------------------------ every TorchRec plan

def _dlrm_plan(name, wl, order):
    from swpipe.workloads import fns_for
    from swpipe.workloads.tasks import STAGED_STAGES
    opts = {"stages": list(STAGED_STAGES)} if name == "staged" else {}
    try:
        unbound = pipelines.get(name, order=order, **opts)
    except ValueError:
        return None  # this pipeline has no TorchRec submission order
    fns = fns_for(name, wl, unbound, compile_backend=None, compiled_autograd=None)
    return pipelines.get(name, fns, order=order, **opts)


@pytest.mark.parametrize("name", list(pipelines.PIPELINES))
def test_torchrec_plans_have_no_missing_dependency_and_documented_staleness(name):
    from swpipe.workloads import DLRMConfig, DLRMWorkload, SyntheticData, emb_staleness, init_distributed
    env = init_distributed()
    try:
        cfg = DLRMConfig.preset("test")
        batches = SyntheticData(cfg).batches(3)
        for order in (None, "torchrec"):
            wl = DLRMWorkload(cfg, env)
            plan = _dlrm_plan(name, wl, order)
            if plan is None:
                continue
            report = check_dataflow(plan, batches, state=[wl.model, wl.dense_opt])
            assert report.ok, str(report)
            cuda = check_dataflow(plan, record=report.record, device="cuda")
            assert cuda.ok, str(cuda)
            lag = max([f.stale_by for f in report.stale if "emb_weights" in f.message] + [0])
            assert lag == emb_staleness(plan)
    finally:
        env.close()


def test_semi_sync_lookup_before_update_reports_one_iteration_stale():
    from swpipe.workloads import DLRMConfig, DLRMWorkload, SyntheticData, emb_staleness, fns_for, init_distributed
    env = init_distributed()
    try:
        cfg = DLRMConfig.preset("test")
        wl = DLRMWorkload(cfg, env)
        lookup_first = ["H2D", "InputDistStart", "ZeroGrad", "InputDistWait", "Forward", "Backward",
                        "EmbLookup", "EmbBackward", "OptimizerStep"]
        plan = pipelines.get("semi_sync", fns_for("semi_sync", wl)).replace(enqueue_order=lookup_first)
        report = check_dataflow(plan, SyntheticData(cfg).batches(3), state=[wl.model, wl.dense_opt])
        assert report.ok and emb_staleness(plan) == 1
        [stale] = [f for f in report.stale if "emb_weights" in f.message]
        assert stale.tasks == ("EmbLookup", "EmbBackward") and stale.stale_by == 1
        assert "emb_weights" in stale.message  # the state read stale
    finally:
        env.close()


# ------------------------------------------------------------------- bad input

def test_task_raising_during_recording_names_task_and_iteration():
    def bad(ctx):
        if ctx.iter_idx == 1:
            raise KeyError("boom")

    with pytest.raises(DataflowRecordError) as info:
        record_dataflow([PipelineTask("Bad", bad)], [torch.ones(1)] * 3)
    assert isinstance(info.value.__cause__, KeyError)
    assert (info.value.task, info.value.iteration, info.value.order) == ("Bad", 1, ["Bad"])
    assert "order=" in str(info.value)  # the fix: the serial loop's order


def test_non_tensor_attributes_are_tracked_and_opaque_ones_noted():
    class Box:
        def __init__(self):
            self.items = None

    def make(ctx):
        ctx.count, ctx.box, ctx.lock = 3, Box(), torch.Generator()

    def fill(ctx):
        ctx.box.items = [ctx.count]  # an in-place change of a Python object held in ctx

    def use(ctx):
        ctx.total = sum(ctx.box.items)

    tasks = [PipelineTask("Make", make), PipelineTask("Fill", fill), PipelineTask("Use", use)]
    deps = infer_plan(tasks, [None] * 2)
    assert deps.intra == [("Fill", "Make"), ("Use", "Fill")]
    assert any("ctx.lock" in n and "Generator" in n for n in deps.notes)  # the attribute and what it holds


def test_task_never_touching_ctx_is_noted():
    def load(ctx): ctx.x = ctx.batch + 1
    def idle(ctx): return None
    deps = infer_plan([PipelineTask("Load", load), PipelineTask("Idle", idle)], [torch.ones(1)] * 2)
    assert deps.intra == [] and [n.split()[0] for n in deps.notes] == ["Idle"]  # one note, on the idle task


def test_tensor_created_outside_any_task_is_noted_and_tracked():
    counter = torch.zeros(1)

    def bump(ctx): counter.add_(1)
    def read(ctx): ctx.v = counter * 2

    deps = infer_plan([PipelineTask("Bump", bump), PipelineTask("Read", read)], [None] * 2)
    assert deps.intra == [("Read", "Bump")] and deps.inter == [("Bump", "Read", 1)]
    assert any("state=" in n for n in deps.notes)  # the fix: name it with state=
    named = infer_plan([PipelineTask("Bump", bump), PipelineTask("Read", read)], [None] * 2, state={"counter": counter})
    assert "counter" in str(named) and not any("state=" in n for n in named.notes)


def test_declared_io_capture_counts_as_the_tasks_write():
    ext = torch.zeros(2)

    def w(ctx): ext.copy_(ctx.batch)
    def r(ctx): ctx.y = ext + 1
    tasks = [PipelineTask("W", w, [DeclaredIO(capture=lambda: ext.clone(), restore=ext.copy_)]), PipelineTask("R", r)]
    rec = record_dataflow(tasks, [torch.ones(2)] * 2, state={"ext": ext})
    assert any(a.via == "io" and a.name == "ext" and a.task == "W" for a in rec.accesses)
    assert infer_deps(rec).intra == [("R", "W")]


# ------------------------------------------------------------------- strict mode

def _two_writers_plan():
    def a(ctx): ctx.y = ctx.batch + 1
    def b(ctx): ctx.y = ctx.batch + 2
    def c(ctx): ctx.z = ctx.y * 2
    return PipelinePlan({PipelineTask("A", a): TaskSchedule(0, thread_group="ta"),
                         PipelineTask("B", b): TaskSchedule(0, thread_group="tb"),
                         PipelineTask("C", c): TaskSchedule(0)}, intra_iter_deps=[("C", "A"), ("C", "B")])


@pytest.mark.timeout(60)
def test_strict_mode_raises_on_first_unordered_attribute_access():
    from swpipe_core.dataflow.strict import StrictDataflowError
    from swpipe_core.engine.pipeline import PipelineTaskError
    with SWPipeline(_two_writers_plan(), device="cpu", strict=True) as pipe:
        with pytest.raises(PipelineTaskError) as info:
            pipe.run(iter([torch.ones(2)] * 4))
    cause = info.value.__cause__
    assert isinstance(cause, StrictDataflowError) and cause.attribute == "ctx.y" and cause.fix == ("B", "A")
    assert cause.task in ("A", "B") and cause.iteration == 0
    # the serial run is not checked, and a fixed plan runs clean
    with SWPipeline(_two_writers_plan(), device="cpu", strict=True) as pipe:
        pipe.run_serial(iter([torch.ones(2)] * 2))
    fixed = _two_writers_plan()
    fixed = fixed.replace(intra_iter_deps=fixed.intra_iter_deps + [("B", "A")])
    with SWPipeline(fixed, device="cpu", strict=True) as pipe:
        pipe.run(iter([torch.ones(2)] * 6))


@pytest.mark.cuda
@pytest.mark.timeout(60)
def test_strict_mode_raises_on_a_cuda_pipeline_too(fake_cuda):
    """A CUDA pipeline's context keeps what tasks drop (the graveyard); strict mode must still watch it."""
    from swpipe_core.dataflow.strict import StrictDataflowError
    from swpipe_core.engine.pipeline import PipelineTaskError

    dev = fake_cuda.device(0)
    with SWPipeline(_two_writers_plan(), device=dev, strict=True) as pipe:
        with pytest.raises(PipelineTaskError) as info:
            pipe.run(iter([torch.ones(2)] * 4))
    cause = info.value.__cause__
    assert isinstance(cause, StrictDataflowError) and cause.attribute == "ctx.y" and cause.fix == ("B", "A")
    fixed = _two_writers_plan()
    fixed = fixed.replace(intra_iter_deps=fixed.intra_iter_deps + [("B", "A")])
    kept = []

    def watch(run, task, ctx):
        replaced = weakref.ref(ctx.y) if task.name == "B" else None  # A's value, which B replaces
        run(task, ctx)
        if replaced is not None:
            kept.append(replaced() is not None)

    with SWPipeline(fixed, device=dev, strict=True) as pipe:
        with pipe.instrument(watch):
            pipe.run(iter([torch.ones(2)] * 6))
    # the watched context still kept A's ctx.y alive for the device (a CPU context drops it at once)
    assert kept and all(kept)


@pytest.mark.timeout(60)
def test_strict_mode_names_stale_weights_and_passes_correct_plans():
    from swpipe_core.dataflow.strict import StrictDataflowError
    from swpipe_core.engine.pipeline import PipelineTaskError
    model, opt, batches, tasks = _mlp()
    broken = _mlp_plan(tasks, inter=[], fwd_group="fwd", step_stage=2).replace(intra_iter_deps=README_INTRA)
    with SWPipeline(broken, device="cpu", strict=[model, opt]) as pipe:
        with pytest.raises(PipelineTaskError) as info:
            pipe.run(iter(batches))
    cause = info.value.__cause__
    assert isinstance(cause, StrictDataflowError) and cause.fix == ("Forward", "Step", 1)
    assert cause.attribute.endswith(("weight", "bias"))
    results = []
    for strict in (False, [model, opt]):
        model, opt, batches, tasks = _mlp()
        plan = _mlp_plan(tasks, fwd_group="fwd")
        with SWPipeline(plan, device="cpu", strict=strict if strict is False else [model, opt]) as pipe:
            pipe.run(iter(batches))
        results.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.timeout(60)
def test_strict_true_checks_the_pipelines_state_when_one_is_given():
    """A plan missing ("Forward", "Step", 1): strict=True with state= names it, as strict=[model, opt] does."""
    from swpipe_core.dataflow.strict import StrictDataflowError
    from swpipe_core.engine.pipeline import PipelineTaskError
    model, opt, batches, tasks = _mlp()
    broken = _mlp_plan(tasks, inter=[], fwd_group="fwd", step_stage=2).replace(intra_iter_deps=README_INTRA)
    with SWPipeline(broken, device="cpu", strict=True, state=[model, opt]) as pipe:
        with pytest.raises(PipelineTaskError) as info:
            pipe.run(iter(batches))
    cause = info.value.__cause__
    assert isinstance(cause, StrictDataflowError) and cause.fix == ("Forward", "Step", 1)
    assert cause.attribute.endswith(("weight", "bias"))


@pytest.mark.timeout(120)
def test_strict_mode_passes_fused_sparse_dist_one_thread_per_stream():
    from swpipe.workloads import DLRMConfig, DLRMWorkload, SyntheticData, fns_for, init_distributed, train_reference
    from swpipe.workloads import same_results
    from swpipe_core.engine.workers import with_thread_map
    env = init_distributed()
    try:
        cfg = DLRMConfig.preset("test")
        batches = SyntheticData(cfg).batches(6)
        wl = DLRMWorkload(cfg, env)
        plan = with_thread_map(pipelines.get("fused_sparse_dist", fns_for("fused_sparse_dist", wl)), "by_stream")
        with SWPipeline(plan, device="cpu", strict=[wl.model, wl.dense_opt]) as pipe:
            pipe.run(iter(batches))
        assert same_results(wl.loss_list(), train_reference(DLRMWorkload(cfg, env), batches))
    finally:
        env.close()


# ------------------------------------------------------------ inferred dependencies in the search

@pytest.mark.timeout(120)
def test_auto_schedule_infers_deps_and_reports_them_honoured():
    from autosched.model.costs import CostModel, TaskCost
    from autosched.search.options import Constraints, SolverOptions
    from swpipe import auto_schedule
    model, opt, batches, tasks = _mlp()
    costs = CostModel({"Load": TaskCost(0.002), "Forward": TaskCost(0.004), "Backward": TaskCost(0.006),
                       "Step": TaskCost(0.001)})
    inferred = infer_plan(list(tasks.values()), batches[:2], state=[model, opt])
    plan, report = auto_schedule(inferred, costs, Constraints(max_depth=2, max_threads=2),
                                 solver=SolverOptions(time_limit_s=5))
    assert sorted(plan.intra_edges()) == sorted(README_INTRA) and plan.inter_edges() == README_INTER
    assert any("('Forward', 'Step', 1)" in n and "RAW" in n for n in report.notes)  # the dependency and its hazard
    assert report.inferred.intra == README_INTRA and "inferred ('Forward', 'Step', 1)" in report.summary()
    # the searched plan runs bit-identical to the serial loop
    results = []
    for pipelined in (False, True):
        model, opt, batches, tasks = _mlp()
        bound = plan.bind({n: tasks[n].fn for n in tasks})
        with SWPipeline(bound, device="cpu") as pipe:
            (pipe.run if pipelined else pipe.run_serial)(iter(batches))
        results.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*results))


# ------------------------------------------------------------- property and CUDA


@st.composite
def _random_tasks(draw):
    """2-5 tasks in serial order; each reads some attributes earlier tasks wrote and writes some."""
    n = draw(st.integers(2, 5))
    spec, written = [], []
    for k in range(n):
        reads = draw(st.lists(st.sampled_from(written), unique=True, max_size=3)) if written else []
        writes = draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), unique=True, max_size=2))
        spec.append((f"T{k}", reads, writes))
        written = sorted(set(written) | set(writes))
    return spec


def _make(spec):
    def fn_for(reads, writes):
        def fn(ctx):
            total = sum((getattr(ctx, r) for r in reads), ctx.batch)
            for w in writes:
                setattr(ctx, w, total + 1)
        return fn
    return [PipelineTask(name, fn_for(r, w)) for name, r, w in spec]


@settings(max_examples=30, deadline=None, derandomize=True)
@given(_random_tasks())
def test_inferred_deps_are_sufficient_and_each_one_necessary(spec):
    tasks = _make(spec)
    deps = infer_plan(tasks, [torch.zeros(1)] * 2)
    # every task on its own thread: only the dependencies order tasks within an iteration
    sched = {t: TaskSchedule(0, thread_group=f"g{k}") for k, t in enumerate(tasks)}
    plan = PipelinePlan(sched, intra_iter_deps=deps.intra, caller_group=None)
    assert check_dataflow(plan, record=record_dataflow(tasks, [torch.zeros(1)] * 2)).ok
    for edge in deps.intra:
        fewer = plan.replace(intra_iter_deps=[e for e in deps.intra if e != edge])
        report = check_dataflow(fewer, [torch.zeros(1)] * 2)
        assert not report.ok and any(f.fix == edge for f in report.missing)


@pytest.mark.gpu
def test_recorder_on_cuda_names_weights_grads_and_state():
    model = torch.nn.Linear(4, 1).cuda()
    opt = torch.optim.Adam(model.parameters())

    def fwd(ctx): ctx.loss = model(ctx.batch.cuda(non_blocking=True)).sum()
    def bwd(ctx): opt.zero_grad(); ctx.loss.backward()
    def step(ctx): opt.step()
    tasks = [PipelineTask("Fwd", fwd), PipelineTask("Bwd", bwd), PipelineTask("Step", step)]
    deps = infer_plan(tasks, [torch.ones(2, 4)] * 2, state=[model, opt])
    assert deps.intra == [("Bwd", "Fwd"), ("Step", "Bwd")] and deps.inter == [("Fwd", "Step", 1)]
    assert "optimizer.state[weight].exp_avg" in record_dataflow(tasks, [torch.ones(2, 4)] * 2,
                                                                state=[model, opt]).touched("Step", "write")


def test_a_late_hand_off_orders_the_worker_task_after_the_callers():
    shared = torch.zeros(1)

    def caller(ctx): shared.add_(1)
    def worker(ctx): ctx.y = shared * 2
    plan = PipelinePlan({PipelineTask("C", caller): TaskSchedule(0),
                         PipelineTask("W", worker): TaskSchedule(0, thread_group="io")})
    # handed off after the caller's C, W reads what C wrote: ordered, with no dependency declared
    late = check_dataflow(plan.replace(enqueue_order=["C", "W"]), [None] * 3, state={"shared": shared})
    assert late.ok and late.missing == []
    early = check_dataflow(plan.replace(enqueue_order=["W", "C"]), [None] * 3, state={"shared": shared})
    assert [f.tasks for f in early.missing] == [("W", "C")]  # handed off first: nothing orders them
    workers = check_dataflow(plan.replace(enqueue_order=["C", "W"], caller_group=None), [None] * 3,
                             state={"shared": shared})
    assert ("W", "C") in [f.tasks for f in workers.missing]  # C on a worker too: no hand-off after it
    cuda = check_dataflow(plan.replace(enqueue_order=["C", "W"]), [None] * 3, state={"shared": shared}, device="cuda")
    assert ("W", "C") in [f.tasks for f in cuda.missing]  # on CUDA the host's order does not order the device
