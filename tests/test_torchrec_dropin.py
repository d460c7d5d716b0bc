"""swpipe.torchrec.TrainPipeline against TorchRec's own pipeline classes, on TorchRec's own models (1 rank, gloo).

For each plan name the per-step outputs equal those of TorchRec's class of that
name on the same model, weights and batches (``torch.testing.assert_close``, as
TorchRec's ``test_equal_to_non_pipelined`` checks), and both equal the
non-pipelined loop. Models: TorchRec's ``TestSparseNN`` with unweighted and
weighted tables (``ModelInput.generate`` batches), its
``TestMixedEmbeddingSparseArch`` (``EmbeddingCollection`` tables too) and its
DLRM. ``plan="auto"`` equals the non-pipelined loop (its measurements leave
the model as it was); train -> eval -> train on one pipeline equals the
non-pipelined loop doing the same.

TorchRec's ``TrainPipelineFusedSparseDist`` and ``TrainPipelineSemiSync`` do
not run on CPU as shipped: they ask for the CPU stream's ``device`` and record
streams on CPU tensors. :func:`torchrec_on_cpu` runs them with those stream
calls made no-ops (what they are on a CPU), the rest of their ``progress()``
as TorchRec wrote it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings

import pytest
import torch

from conftest import requires_torchrec, torchrec_usable, word_after

pytestmark = [pytest.mark.peer, pytest.mark.timeout(300),
              requires_torchrec]

CPU = torch.device("cpu")
N = 6


@pytest.fixture(scope="module", autouse=True)
def process_group():
    import torch.distributed as dist

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    if owns:
        dist.destroy_process_group()
    torch.set_num_threads(before)


def _build(model):
    from swpipe.torchrec import models

    if model == "dlrm":
        return models.dlrm(models.DLRMConfig())
    return models.sparse_nn(models.SparseNNConfig(ec=model == "ec"))


def _batches(model, n=N):
    from swpipe.torchrec import models

    if model == "dlrm":
        return models.dlrm_batches(models.DLRMConfig(), n)
    return models.sparse_nn_batches(models.SparseNNConfig(ec=model == "ec"), n)


def _drive(pipeline, batches, modes=None, model=None):
    """``progress`` until StopIteration; ``modes[k]`` (True = train) set on ``model`` before call ``k``."""
    it = iter(batches)
    out = []
    while True:
        if modes is not None and len(out) < len(modes):
            model.train(modes[len(out)])
        try:
            out.append(pipeline.progress(it))
        except StopIteration:
            return out


def _plain(model_name, batches, modes=None):
    """The non-pipelined loop (TorchRec's test_equal_to_non_pipelined), in the given mode per batch."""
    from swpipe.torchrec.tasks import split_output

    model, opt = _build(model_name)
    out = []
    for k, b in enumerate(batches):
        train = True if modes is None else modes[k]
        model.train(train)
        if train:
            opt.zero_grad()
            loss, pred = model(b)
            loss.backward()
            opt.step()
        else:
            with torch.no_grad():
                pred = split_output(model(b))
        out.append(pred)
    return out


@contextlib.contextmanager
def torchrec_on_cpu():
    """TorchRec's fused / semi-sync classes on CPU: their stream calls (no-ops on a CPU) made no-ops."""
    from torchrec.sparse.jagged_tensor import KeyedTensor

    saved = torch.cpu.current_stream, torch.cuda.current_stream, KeyedTensor.record_stream
    torch.cpu.current_stream = lambda *a, **k: None
    torch.cuda.current_stream = lambda *a, **k: None
    KeyedTensor.record_stream = lambda self, stream: None
    try:
        yield
    finally:
        torch.cpu.current_stream, torch.cuda.current_stream, KeyedTensor.record_stream = saved


def _torchrec(name, model_name, batches):
    from torchrec.distributed.train_pipeline import experimental_pipelines, train_pipelines

    from swpipe.torchrec import TORCHREC_CLASSES

    cls_name = TORCHREC_CLASSES[name]
    cls = getattr(train_pipelines, cls_name, None) or getattr(experimental_pipelines, cls_name)
    model, opt = _build(model_name)
    with torchrec_on_cpu():
        return _drive(cls(model, opt, CPU), batches)


def _swpipe(plan, model_name, batches, modes=None, **options):
    from swpipe.torchrec import TrainPipeline

    model, opt = _build(model_name)
    with TrainPipeline(model, opt, CPU, plan=plan, **options) as pipeline:
        out = _drive(pipeline, batches, modes, model)
    return out, pipeline


def _same(a, b, what):
    assert len(a) == len(b), f"{what}: {len(a)} steps vs {len(b)}"
    for step, (x, y) in enumerate(zip(a, b)):
        torch.testing.assert_close(x, y, msg=lambda m: f"{what}, step {step}: {m}")


_PLAIN = {}


def _reference(model_name):
    if model_name not in _PLAIN:
        _PLAIN[model_name] = _plain(model_name, _batches(model_name))
    return _PLAIN[model_name]


# ----------------------------------------------------------------------- each plan == TorchRec's class of its name

def _plans():
    from swpipe.torchrec import TORCHREC_CLASSES

    return list(TORCHREC_CLASSES)


@pytest.mark.parametrize("name", _plans() if torchrec_usable() else [])
@pytest.mark.parametrize("model_name", ["sparse_nn", "dlrm"])
def test_each_plan_gives_the_outputs_of_torchrecs_class_of_its_name(model_name, name):
    batches = _batches(model_name)
    ours, pipeline = _swpipe(name, model_name, batches)
    theirs = _torchrec(name, model_name, batches)
    _same(ours, theirs, f"{name} vs TorchRec's class")
    _same(theirs, _reference(model_name), f"TorchRec's {name} vs the non-pipelined loop")
    assert not torch.equal(_first(ours[0]), _first(ours[-1]))  # it trains: the steps are not trivially equal
    assert swpipe_threads() == []
    assert name in pipeline.report and "TorchRec's" in pipeline.report


def _first(out):
    return out[1] if isinstance(out, tuple) else out


def swpipe_threads():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("swpipe-"))


@pytest.mark.parametrize("name", ["sparse_dist", "fused_sparse_dist"])
def test_embedding_collection_tables_too(name):
    batches = _batches("ec")
    ours, _ = _swpipe(name, "ec", batches)
    _same(ours, _torchrec(name, "ec", batches), f"{name} vs TorchRec's class (EmbeddingCollection)")
    _same(ours, _reference("ec"), f"{name} vs the non-pipelined loop (EmbeddingCollection)")


def test_one_thread_per_stream_and_torchrecs_order_give_the_same_outputs():
    batches = _batches("sparse_nn")
    by_stream, pipeline = _swpipe("fused_sparse_dist", "sparse_nn", batches, thread_map="by_stream",
                                  order="torchrec")
    assert {pipeline.plan.sched(t).thread_group for t in pipeline.plan.task_names} > {"default"}
    _same(by_stream, _reference("sparse_nn"), "fused_sparse_dist+by_stream vs the non-pipelined loop")
    assert swpipe_threads() == []


# --------------------------------------------------------------------------------------- auto, train/eval, passes

def test_auto_equals_the_non_pipelined_loop_and_reports_its_choice():
    from swpipe import SolverOptions, VerifyOptions

    batches = _batches("sparse_nn", 10)
    ours, pipeline = _swpipe("auto", "sparse_nn", batches, solver=SolverOptions(time_limit_s=2.0),
                             verify=VerifyOptions(rounds=1, iterations=8, profile_batches=4))
    _same(ours, _plain("sparse_nn", batches), "auto vs the non-pipelined loop")
    report = pipeline.report
    assert pipeline.choice is not None and pipeline.choice.label in report
    assert word_after(report, "engine:") and "<- chosen" in report and "seed:fused_sparse_dist" in report
    assert "depth 2:" in report and "depth 3:" in report
    assert "each paired with seed:base's run in its round" in report  # TorchRec's base plan: the simplest
    table = pipeline.choice.table
    assert table.baseline == "seed:base" and table.choose().label == pipeline.choice.label
    for row in table.rows:  # every candidate ran in the rounds base ran, and has its paired ratio
        if row.label != "seed:base":
            pair = table.paired(row.label)
            assert pair.rounds == len(row.rounds_s) and pair.q1 <= pair.median <= pair.q3


def test_auto_can_measure_the_models_own_forward_and_the_pipelined_one_on_one_model():
    """plan='auto' runs TorchRec's base plan (the sharded modules' own forward) between pipelined plans."""
    from swpipe.torchrec.auto import task_graph
    from swpipe.torchrec.plans import named_plan, runnable
    from swpipe.torchrec.tasks import TorchRecTasks
    from swpipe_core.engine.pipeline import SWPipeline

    batches = _batches("sparse_nn", 8)
    model, opt = _build("sparse_nn")
    tasks = TorchRecTasks(model, opt, CPU, "fused")
    tasks.keep_outputs = True
    out = []
    for plan, part in ((task_graph(), batches[:3]), (named_plan("base"), batches[3:6]), (task_graph(), batches[6:])):
        tasks.reset()
        with SWPipeline(runnable(plan, tasks.functions(plan.task_names)), device=CPU) as pipe:
            pipe.run(iter(part))
        out += [tasks.take_output(i) for i in range(len(part))]
    _same(out, _plain("sparse_nn", batches), "fused, base, fused on one model vs the non-pipelined loop")


def test_auto_under_a_memory_cap_verifies_only_the_plans_that_fit_or_says_how_much_is_needed():
    from autosched.search.memcap import MemoryCapError

    from swpipe import Constraints, SolverOptions, VerifyOptions
    from swpipe.torchrec import TrainPipeline

    small = dict(solver=SolverOptions(time_limit_s=1.0),
                 verify=VerifyOptions(rounds=1, iterations=6, profile_batches=3, calibrate=False))
    batches = _batches("sparse_nn", 8)
    model, opt = _build("sparse_nn")
    with TrainPipeline(model, opt, CPU, plan="auto", constraints=Constraints(max_memory_bytes=1), **small) as pipeline:
        with pytest.raises(MemoryCapError) as info:
            pipeline.progress(iter(batches))
        assert info.value.cap_bytes == 1 and info.value.leanest_bytes >= info.value.min_bytes > 1  # the least it needs
    # the failed choice left the model as it was: the same model trains to the loop's outputs under a loose cap
    loose = Constraints(max_memory_bytes=2**40, max_depth=2)
    with TrainPipeline(model, opt, CPU, plan="auto", constraints=loose, **small) as pipeline:
        ours = _drive(pipeline, batches)
    _same(ours, _plain("sparse_nn", batches), "auto under a memory cap vs the non-pipelined loop")
    assert word_after(pipeline.report, "memory", "cap") == "1024.00"  # the cap, each candidate's peak under it
    assert "depth 2:" in pipeline.report and "depth 3:" not in pipeline.report  # Constraints.max_depth searched
    assert word_after(pipeline.report, "depth", "2:") == "simulated"  # the search under the cap found a plan
    assert "auto:depth2" in pipeline.report  # ... and it is a candidate, measured beside the seeds


@pytest.mark.parametrize("name", _plans() if torchrec_usable() else [])
def test_train_eval_train_on_one_pipeline_equals_the_loop_doing_the_same(name):
    modes = [True, True, False, False, True, False, True, True]
    batches = _batches("sparse_nn", len(modes))
    ours, _ = _swpipe(name, "sparse_nn", batches, modes)
    _same(ours, _plain("sparse_nn", batches, modes), f"{name}, train/eval/train vs the loop")


def test_train_eval_train_on_dlrm():
    modes = [True, False, True, True, False, True]
    batches = _batches("dlrm", len(modes))
    ours, _ = _swpipe("sparse_dist", "dlrm", batches, modes)
    _same(ours, _plain("dlrm", batches, modes), "dlrm train/eval/train vs the loop")


def test_a_new_iterator_after_stop_iteration_starts_a_new_pass():
    from swpipe.torchrec import TrainPipeline

    batches = _batches("sparse_nn", 8)
    model, opt = _build("sparse_nn")
    with TrainPipeline(model, opt, CPU, plan="sparse_dist") as pipeline:
        first = iter(batches[:3])
        one = _drive_iter(pipeline, first)
        with pytest.raises(StopIteration):  # the exhausted iterator stays exhausted, as TorchRec's
            pipeline.progress(first)
        two = _drive_iter(pipeline, iter(batches[3:]))
        assert _drive_iter(pipeline, iter([])) == []
    _same(one + two, _plain("sparse_nn", batches), "two passes vs one loop")


def _drive_iter(pipeline, it):
    out = []
    while True:
        try:
            out.append(pipeline.progress(it))
        except StopIteration:
            return out


def test_a_failing_forward_is_reported_naming_the_task_and_the_pass_can_restart():
    from swpipe.torchrec import TrainPipeline
    from swpipe_core.engine.pipeline import PipelineTaskError

    batches = _batches("sparse_nn", 5)
    model, opt = _build("sparse_nn")
    calls = {"n": 0}

    def fwd(batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("boom")
        return model(batch)

    with TrainPipeline(model, opt, CPU, plan="sparse_dist", custom_model_fwd=fwd) as pipeline:
        it = iter(batches)
        pipeline.progress(it)
        pipeline.progress(it)
        with pytest.raises(PipelineTaskError) as info:
            pipeline.progress(it)
        assert (info.value.task, info.value.iteration) == ("Forward", 2)
        assert isinstance(info.value.__cause__, ValueError)
        assert len(_drive_iter(pipeline, iter(batches))) == 5  # a new iterator starts a new pass
    assert swpipe_threads() == []


# --------------------------------------------------------------------------------------------- errors and options

def test_plans_and_options_the_drop_in_does_not_take_are_errors_that_say_what_it_takes():
    from swpipe import Constraints, SolverOptions, VerifyOptions
    from swpipe.torchrec import TrainPipeline
    from swpipe_core import pipelines

    model, opt = _build("sparse_nn")
    with pytest.raises(ValueError, match=r"plan='prefetch'.*base"):  # the plan refused, the ones it runs
        TrainPipeline(model, opt, CPU, plan="prefetch")
    with pytest.raises(ValueError, match=r"'nope'"):
        TrainPipeline(model, opt, CPU, plan="nope")
    with pytest.raises(TypeError, match=r"'threads'"):  # the option refused
        TrainPipeline(model, opt, CPU, threads=2)
    with pytest.raises(TypeError, match=r"\['solver'\]"):  # for plan='auto' only
        TrainPipeline(model, opt, CPU, solver=SolverOptions(time_limit_s=3))
    with pytest.raises(TypeError, match=r"constraints=.*Constraints"):  # the argument and the type it takes
        TrainPipeline(model, opt, CPU, plan="auto", constraints=SolverOptions())
    with pytest.raises(ValueError, match=r"\['Forward'\]"):  # the task whose stage the drop-in fixes
        TrainPipeline(model, opt, CPU, plan="auto", constraints=Constraints(frozen={"Forward": {"stage": 0}}))
    with pytest.raises(ValueError, match=r"VerifyOptions\(device='cuda'\)"):
        TrainPipeline(model, opt, CPU, plan="auto", verify=VerifyOptions(device="cuda"))
    with pytest.raises(TypeError, match=r"\['thread_map'\]"):  # shapes a named plan, not plan='auto'
        TrainPipeline(model, opt, CPU, plan="auto", thread_map="by_stream")
    with pytest.raises(ValueError, match="execute_all_batches=False"):
        TrainPipeline(model, opt, CPU, execute_all_batches=False)
    deep = pipelines.get("sparse_dist")
    deep = deep.replace(schedule={k: (v if deep.task(k).name != "OptimizerStep" else
                                      type(v)(stage=3, stream=v.stream)) for k, v in deep.schedule.items()})
    with pytest.raises(ValueError, match=r"Forward\D+2\D+Backward\D+2"):  # the tasks and the stages it cannot run
        TrainPipeline(model, opt, CPU, plan=deep)
    pipeline = TrainPipeline(model, opt, CPU, execute_all_batches=True)  # TorchRec's arguments, as TorchRec runs
    with pytest.raises(TypeError, match="iterator"):  # what progress() takes
        pipeline.progress(_batches("sparse_nn", 2))
    pipeline.close()


@pytest.mark.parametrize("name", _plans() if torchrec_usable() else [])
def test_the_constructor_takes_every_argument_of_torchrecs_class_with_torchrecs_defaults(name):
    """The switch is one line: whatever TorchRec's class of that name takes, the drop-in takes too."""
    import inspect

    from torchrec.distributed.train_pipeline import experimental_pipelines, train_pipelines

    from swpipe.torchrec import TORCHREC_CLASSES, TrainPipeline

    cls_name = TORCHREC_CLASSES[name]
    cls = getattr(train_pipelines, cls_name, None) or getattr(experimental_pipelines, cls_name)
    theirs = inspect.signature(cls.__init__).parameters
    ours = inspect.signature(TrainPipeline.__init__).parameters
    assert set(theirs) <= set(ours)
    # a default of None accepts whatever TorchRec's class would be given; any other default is TorchRec's
    differ = {k: (p.default, ours[k].default) for k, p in theirs.items()
              if ours[k].default not in (None, inspect.Parameter.empty) and ours[k].default != p.default}
    assert differ == {}


def test_a_torchrec_without_an_internal_is_a_clear_error(monkeypatch):
    # private on purpose: the version check is the seam tested. No TorchRec lacking an internal can be installed
    # here, so the list of internals gets one more and the check, made once per process, is made again
    from swpipe.torchrec import _private

    monkeypatch.setattr(_private, "_checked", None)
    monkeypatch.setattr(_private, "NEEDED", _private.NEEDED + (("torchrec.distributed.train_pipeline.utils",
                                                                "_gone_in_a_later_release"),))
    with pytest.raises(_private.TorchRecVersionError) as info:
        _private.check_torchrec()
    assert info.value.version.startswith("1.9.") and info.value.missing == [
        "torchrec.distributed.train_pipeline.utils._gone_in_a_later_release"]
    assert "scripts/install_peer.sh" in str(info.value)  # the fix: install a tested TorchRec
