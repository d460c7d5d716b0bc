"""TorchRec's twelve pipelines as plans: names, stages, streams, threads, binding, options."""

from __future__ import annotations

import pytest

from swpipe_core import pipelines
from swpipe_core.plan import PipelinePlan
from swpipe_core.validate import validate

ALLOWED_TASKS = {
    "H2D", "InputDistStart", "InputDistWait", "EmbLookup", "EmbPrefetch", "ZeroGrad", "WaitBatch", "Forward",
    "Backward", "EmbBackward", "OptimizerStep", "LoadBatch", "InputTransform",
}

# name -> (TorchRec class, depth, streams, thread groups): what each TorchRec
# class keeps in flight and on which streams/threads. semi_sync is depth 4
# (H2D, input dist, embedding lookup, dense step each a stage), although a
# count of its sparse stages alone, sometimes quoted for it, gives 3.
EXPECTED = {
    "base": ("TrainPipelineBase", 2, {"memcpy", "default"}, {"default"}),
    "pt2": ("TrainPipelinePT2", 1, {"default"}, {"default"}),
    "sparse_dist": ("TrainPipelineSparseDist", 3, {"memcpy", "data_dist", "default"}, {"default"}),
    "sparse_dist_lite": ("TrainPipelineSparseDistLite", 2, {"memcpy", "default"}, {"default"}),
    "fused_sparse_dist": ("TrainPipelineFusedSparseDist", 3, {"memcpy", "data_dist", "emb_lookup", "default"}, {"default"}),
    "semi_sync": ("TrainPipelineSemiSync", 4, {"memcpy", "data_dist", "default"}, {"default"}),
    "prefetch": ("PrefetchTrainPipelineSparseDist", 3, {"memcpy", "data_dist", "prefetch", "default"}, {"default"}),
    "eval_sparse_dist": ("EvalPipelineSparseDist", 2, {"memcpy", "data_dist", "default"}, {"loader", "default"}),
    "eval_fused_sparse_dist": ("EvalPipelineFusedSparseDist", 3, {"memcpy", "data_dist", "emb_lookup", "default"},
                               {"default"}),
    "staged": ("StagedTrainPipeline", 2, {"data_copy", "gpu_postproc"}, {"default"}),
    "sparse_dist_comp_autograd": ("TrainPipelineSparseDistCompAutograd", 3, {"memcpy", "data_dist", "default"},
                                  {"default"}),
    "sparse_dist_t": ("TrainPipelineSparseDistT", 3, {"memcpy", "data_dist", "default"}, {"copy", "default"}),
}


def test_twelve_pipelines_registered():
    assert list(pipelines.PIPELINES) == list(EXPECTED)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_pipeline_shape_matches_torchrec_class(name):
    cls, depth, streams, threads = EXPECTED[name]
    plan = pipelines.get(name)
    validate(plan)
    assert isinstance(plan, PipelinePlan)
    assert plan.pipeline_depth == depth
    assert {plan.stream_of(t) for t in plan.task_names} == streams
    assert {plan.sched(t).thread_group for t in plan.task_names} == threads
    assert pipelines.describe(name).startswith(cls + ":")
    if name != "staged":
        assert set(plan.task_names) <= ALLOWED_TASKS


@pytest.mark.parametrize("name", list(EXPECTED))
def test_without_fns_plan_is_unbound_and_with_fns_bound(name):
    plan = pipelines.get(name)
    assert plan.unbound_tasks() == plan.task_names
    fns = {t: (lambda ctx, t=t: setattr(ctx, t, True)) for t in plan.task_names}
    bound = pipelines.get(name, fns)
    assert bound.unbound_tasks() == []
    assert all(bound.task(t).fn is fns[t] for t in plan.task_names)
    assert str(bound) == str(plan)  # the same schedule, functions aside
    validate(bound)


def test_partial_fns_leave_the_rest_unbound():
    plan = pipelines.get("base", {"H2D": print})
    assert "H2D" not in plan.unbound_tasks() and "Forward" in plan.unbound_tasks()


def test_fns_for_unknown_task_is_an_error():
    with pytest.raises(ValueError, match=r"'sparse_dist'.*\['Fwd'\]"):  # the pipeline, the task it lacks
        pipelines.get("sparse_dist", {"Fwd": print})


def test_globally_ordered_input_dist_start():
    for name in EXPECTED:
        plan = pipelines.get(name)
        ordered = [t for t in plan.task_names if plan.sched(t).globally_ordered]
        assert ordered == (["InputDistStart"] if "InputDistStart" in plan.task_names else []), name


@pytest.mark.parametrize("option,stream", [("new", "emb_lookup"), ("data_dist", "data_dist"), ("current", "default")])
def test_fused_emb_lookup_stream_option(option, stream):
    for name in ("fused_sparse_dist", "eval_fused_sparse_dist"):
        plan = pipelines.get(name, emb_lookup=option)
        validate(plan)
        assert plan.stream_of("EmbLookup") == stream


def test_fused_rejects_unknown_emb_lookup():
    with pytest.raises(ValueError, match="emb_lookup.*'current'"):  # the option and the values it takes
        pipelines.get("fused_sparse_dist", emb_lookup="fresh")


def test_fused_lookup_waits_previous_backward_and_forward_previous_step():
    assert pipelines.get("fused_sparse_dist").inter_edges() == [("EmbLookup", "Backward", 1), ("Forward", "OptimizerStep", 1)]
    assert pipelines.get("eval_fused_sparse_dist").inter_edges() == []


def test_eval_pipelines_have_no_training_tasks():
    for name in ("eval_sparse_dist", "eval_fused_sparse_dist"):
        names = set(pipelines.get(name).task_names)
        assert not names & {"ZeroGrad", "Backward", "OptimizerStep", "EmbBackward"}, name


def test_eval_sparse_dist_natural_chain():
    plan = pipelines.get("eval_sparse_dist")
    assert plan.intra_edges() == [("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"),
                                  ("WaitBatch", "InputDistWait"), ("Forward", "WaitBatch")]


@pytest.mark.parametrize("stages,names", [
    (None, ["data_copy", "gpu_postproc"]),
    (3, ["stage0", "stage1", "stage2"]),
    (["load", "post", "sdd", "fwd"], ["load", "post", "sdd", "fwd"]),
    ("a, b", ["a", "b"]),
    (1, ["stage0"]),
])
def test_staged_stages_each_on_own_stream_chained(stages, names):
    plan = pipelines.get("staged", stages=stages) if stages is not None else pipelines.get("staged")
    validate(plan)
    assert plan.task_names == names and plan.pipeline_depth == len(names)
    assert [plan.stage(n) for n in names] == list(range(len(names)))
    assert [plan.stream_of(n) for n in names] == names
    assert plan.intra_edges() == [(names[k], names[k - 1]) for k in range(1, len(names))]


@pytest.mark.parametrize("bad", [0, [], ["a", "a"], True, [""]])
def test_staged_rejects_bad_stages(bad):
    with pytest.raises(ValueError, match="stage"):
        pipelines.get("staged", stages=bad)


def test_get_forgives_case_and_dashes_and_rejects_unknown():
    assert pipelines.get("Sparse-Dist").task_names == pipelines.get("sparse_dist").task_names
    with pytest.raises(KeyError, match="'nope'.*base, pt2"):  # the name, then the known ones
        pipelines.get("nope")
    with pytest.raises(ValueError, match=r"\['emb_lookup'\].*: order"):  # the option refused, the ones it takes
        pipelines.get("sparse_dist", emb_lookup="new")
    with pytest.raises(ValueError, match=": emb_lookup, order"):
        pipelines.get("fused_sparse_dist", stages=2)


def test_sparse_dist_lite_input_dist_on_critical_path():
    plan = pipelines.get("sparse_dist_lite")
    assert plan.stream_of("InputDistStart") == plan.stream_of("Forward") == "default"
    assert plan.stage("InputDistStart") == plan.stage("Forward") == 1


def test_semi_sync_lookup_one_stage_before_dense():
    plan = pipelines.get("semi_sync")
    assert plan.stage("EmbLookup") + 1 == plan.stage("Forward") == 3
    assert ("EmbLookup", "Backward", 1) in plan.inter_edges()
