"""Schedule tables and stage analysis: TorchRec's schedule tables reproduced, LDS <= minimum depth <= depth."""

from __future__ import annotations

import itertools
import random

import pytest

from swpipe_core import pipelines
from swpipe_core.analysis import (
    format_plan_repr,
    format_schedule,
    format_stage_analysis,
    lds,
    min_depth,
    min_stages,
    removable_boundaries,
)
from swpipe_core.order import enqueue_order
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.validate import PlanError, validate

S = TaskSchedule

# The worked FusedSparseDist example: print_schedule(5) of TorchRec's
# TrainPipelineFusedSparseDist as a plan (lookup on its own stream), the
# reference layout of every table. Compared byte for byte.
FUSED_TABLE = """\
   #  Task               Thread   Stream        | P0    P1    P2    P3    P4
  --  -----------------  -------  ------------  + ----- ----- ----- ----- -----
   0  EmbLookup          default  emb_lookup    |  --    --   i0    i1    i2
   1  ZeroGrad           default  default       |  --    --   i0    i1    i2
   2  WaitBatch          default  default       |  --    --   i0    i1    i2
   3  Forward            default  default       |  --    --   i0    i1    i2
   4  Backward           default  default       |  --    --   i0    i1    i2
   5  OptimizerStep      default  default       |  --    --   i0    i1    i2
   6  InputDistStart     default  data_dist     |  --   i0    i1    i2    i3
   7  InputDistWait      default  data_dist     |  --   i0    i1    i2    i3
   8  H2D                default  memcpy        | i0    i1    i2    i3    i4"""

# print_schedule of each TorchRec pipeline's plan, written out by hand from
# the class's progress() (which batch each call works on); kept as one line,
# so compared whitespace-normalised: (pipeline, periods, table).
_HDR5 = "# Task Thread Stream | P0 P1 P2 P3 P4 -- ----------------- ------- ------------ + ----- ----- ----- ----- -----"
TORCHREC_TABLES = [
    ("base", 5, _HDR5 + " 0 ZeroGrad default default | -- i0 i1 i2 i3 1 WaitBatch default default | -- i0 i1 i2 i3"
     " 2 Forward default default | -- i0 i1 i2 i3 3 Backward default default | -- i0 i1 i2 i3 4 OptimizerStep default"
     " default | -- i0 i1 i2 i3 5 H2D default memcpy | i0 i1 i2 i3 i4"),
    ("sparse_dist", 5, _HDR5 + " 0 ZeroGrad default default | -- -- i0 i1 i2 1 WaitBatch default default | -- -- i0 i1 i2"
     " 2 Forward default default | -- -- i0 i1 i2 3 Backward default default | -- -- i0 i1 i2 4 OptimizerStep default"
     " default | -- -- i0 i1 i2 5 InputDistStart default data_dist | -- i0 i1 i2 i3 6 InputDistWait default data_dist"
     " | -- i0 i1 i2 i3 7 H2D default memcpy | i0 i1 i2 i3 i4"),
    ("sparse_dist_lite", 5, _HDR5 + " 0 ZeroGrad default default | -- i0 i1 i2 i3 1 WaitBatch default default | -- i0"
     " i1 i2 i3 2 InputDistStart default default | -- i0 i1 i2 i3 3 InputDistWait default default | -- i0 i1 i2 i3 4"
     " Forward default default | -- i0 i1 i2 i3 5 Backward default default | -- i0 i1 i2 i3 6 OptimizerStep default"
     " default | -- i0 i1 i2 i3 7 H2D default memcpy | i0 i1 i2 i3 i4"),
    ("fused_sparse_dist", 5, _HDR5 + " 0 EmbLookup default emb_lookup | -- -- i0 i1 i2 1 ZeroGrad default default | --"
     " -- i0 i1 i2 2 WaitBatch default default | -- -- i0 i1 i2 3 Forward default default | -- -- i0 i1 i2 4 Backward"
     " default default | -- -- i0 i1 i2 5 OptimizerStep default default | -- -- i0 i1 i2 6 InputDistStart default"
     " data_dist | -- i0 i1 i2 i3 7 InputDistWait default data_dist | -- i0 i1 i2 i3 8 H2D default memcpy | i0 i1 i2"
     " i3 i4"),
    ("semi_sync", 6, "# Task Thread Stream | P0 P1 P2 P3 P4 P5 -- ----------------- ------- ------------ + ----- -----"
     " ----- ----- ----- ----- 0 ZeroGrad default default | -- -- -- i0 i1 i2 1 Forward default default | -- -- -- i0"
     " i1 i2 2 Backward default default | -- -- -- i0 i1 i2 3 EmbBackward default default | -- -- -- i0 i1 i2 4"
     " OptimizerStep default default | -- -- -- i0 i1 i2 5 EmbLookup default default | -- -- i0 i1 i2 i3 6"
     " InputDistStart default data_dist | -- i0 i1 i2 i3 i4 7 InputDistWait default data_dist | -- i0 i1 i2 i3 i4 8"
     " H2D default memcpy | i0 i1 i2 i3 i4 i5"),
    ("prefetch", 5, _HDR5 + " 0 ZeroGrad default default | -- -- i0 i1 i2 1 WaitBatch default default | -- -- i0 i1 i2"
     " 2 Forward default default | -- -- i0 i1 i2 3 Backward default default | -- -- i0 i1 i2 4 OptimizerStep default"
     " default | -- -- i0 i1 i2 5 InputDistWait default data_dist | -- i0 i1 i2 i3 6 EmbPrefetch default prefetch | --"
     " i0 i1 i2 i3 7 H2D default memcpy | i0 i1 i2 i3 i4 8 InputDistStart default data_dist | i0 i1 i2 i3 i4"),
    ("sparse_dist_comp_autograd", 5, _HDR5 + " 0 ZeroGrad default default | -- -- i0 i1 i2 1 WaitBatch default"
     " default | -- -- i0 i1 i2 2 Forward default default | -- -- i0 i1 i2 3 Backward default default | -- -- i0 i1 i2"
     " 4 OptimizerStep default default | -- -- i0 i1 i2 5 InputDistStart default data_dist | -- i0 i1 i2 i3 6"
     " InputDistWait default data_dist | -- i0 i1 i2 i3 7 H2D default memcpy | i0 i1 i2 i3 i4"),
]


def _norm(text: str) -> str:
    return " ".join(text.split())


def _fused_plan_by_hand() -> PipelinePlan:
    """The FusedSparseDist plan written out by hand (only the EmbLookup inter dependency)."""
    names = ["H2D", "InputDistStart", "InputDistWait", "EmbLookup", "ZeroGrad", "WaitBatch", "Forward",
             "Backward", "OptimizerStep"]
    t = {n: PipelineTask(n) for n in names}
    return PipelinePlan(
        schedule={
            t["H2D"]: S(stage=0, stream="memcpy"),
            t["InputDistStart"]: S(stage=1, stream="data_dist", globally_ordered=True),
            t["InputDistWait"]: S(stage=1, stream="data_dist"),
            t["EmbLookup"]: S(stage=2, stream="emb_lookup"),
            t["ZeroGrad"]: S(stage=2), t["WaitBatch"]: S(stage=2), t["Forward"]: S(stage=2),
            t["Backward"]: S(stage=2), t["OptimizerStep"]: S(stage=2),
        },
        intra_iter_deps=[
            (t["InputDistStart"], t["H2D"]), (t["InputDistWait"], t["InputDistStart"]),
            (t["EmbLookup"], t["InputDistWait"]), (t["Forward"], t["EmbLookup"]), (t["WaitBatch"], t["ZeroGrad"]),
            (t["Forward"], t["WaitBatch"]), (t["Backward"], t["Forward"]), (t["OptimizerStep"], t["Backward"]),
        ],
        inter_iter_deps=[(t["EmbLookup"], t["Backward"])],
    )


def test_fused_table_byte_for_byte_from_plan_by_hand():
    plan = _fused_plan_by_hand()
    validate(plan)
    assert plan.pipeline_depth == 3
    assert format_schedule(plan, 5) == FUSED_TABLE


def test_fused_table_byte_for_byte_from_factory():
    assert format_schedule(pipelines.get("fused_sparse_dist"), 5) == FUSED_TABLE


@pytest.mark.parametrize("name,periods,expected", TORCHREC_TABLES, ids=[t[0] for t in TORCHREC_TABLES])
def test_torchrec_tables_reproduced(name, periods, expected):
    table = format_schedule(pipelines.get(name), periods)
    assert _norm(table) == expected
    # the layout is FUSED_TABLE's: every row's "|" in one column, no trailing spaces
    lines = table.splitlines()
    assert len({line.index("|") if "|" in line else line.index("+") for line in lines}) == 1
    assert all(line == line.rstrip() for line in lines)


def test_shortcut_example_whitespace_normalised():
    # print_schedule(3) of a one-stage plan with a shortcut task. This example
    # was first written with narrower Stream (7) and period (4) columns than
    # FUSED_TABLE, whose widths this module follows; so its rows are compared
    # whitespace-normalised and the dash line only in the Task/Thread columns.
    plan = PipelinePlan(
        {"H2DAndShuffle": S(0), "EmbInputDistStart": S(0), "EmbInputDistWait": S(0)},
        intra_iter_deps=[("EmbInputDistStart", "H2DAndShuffle"), ("EmbInputDistWait", "EmbInputDistStart")],
    )
    lines = format_schedule(plan, 3, shortcuts=["EmbInputDistStart"]).splitlines()
    assert _norm(lines[0]) == "# Task Thread Stream | P0 P1 P2"
    assert lines[1].split()[:3] == ["--", "-" * 24, "-" * 7]  # 24 = len("EmbInputDistStart [skip]")
    assert [_norm(x) for x in lines[2:]] == [
        "0 H2DAndShuffle default default | i0 i1 i2",
        "1 EmbInputDistStart [skip] default default | . . .",
        "2 EmbInputDistWait default default | i0 i1 i2",
    ]


def test_shortcut_task_shows_dashes_before_its_first_iteration_then_dots():
    plan = pipelines.get("base")
    row = [line for line in format_schedule(plan, 3, shortcuts=[PipelineTask("Forward")]).splitlines()
           if "Forward" in line][0]
    assert _norm(row) == "2 Forward [skip] default default | -- . ."


def test_table_widens_for_long_names():
    plan = PipelinePlan({"AVeryLongTaskNameIndeed": S(0, "a_rather_long_stream", "thread_group_x")})
    lines = format_schedule(plan, 12).splitlines()
    assert lines[2].startswith("   0  AVeryLongTaskNameIndeed  thread_group_x  a_rather_long_stream  | i0    i1")
    assert lines[0].endswith("P10   P11") and lines[2].endswith("i10   i11")
    assert lines[1].split()[1:4] == ["-" * 23, "-" * 14, "-" * 20]


def test_format_schedule_rejects_bad_arguments():
    plan = pipelines.get("base")
    with pytest.raises(ValueError, match="num_iterations"):
        format_schedule(plan, 0)
    with pytest.raises(ValueError, match=r"\['Nope'\] are not in the plan"):
        format_schedule(plan, 3, shortcuts=["Nope"])


def test_repr_is_summary_line_blank_line_then_table():
    plan = PipelinePlan({"H2DAndShuffle": S(0), "MPEmbForward": S(0)}, intra_iter_deps=[("MPEmbForward", "H2DAndShuffle")])
    lines = format_plan_repr(plan, 0, ["MPEmbForward"]).splitlines()
    assert lines[0] == "SWPipeline(device=0, depth=1, tasks=['H2DAndShuffle', 'MPEmbForward'], shortcuts=['MPEmbForward'])"
    assert lines[1] == ""
    assert _norm(lines[2]) == "# Task Thread Stream | P0"
    assert _norm(lines[4]) == "0 H2DAndShuffle default default | i0"


STAGE_ANALYSIS_COPY_BATCH = """\
Task schedule (topological order):
  Pos  Task              Idx  Stage  Type
  --------------------------------------------------
    0  CopyBatch           0      0  stream
    1  Forward             1      1  stream"""

VERDICT_COPY_BATCH = """\
LDS = 2  (example: (1, 0))
Pipeline depth = 2
  ✓  LDS == depth (Dilworth-optimal)"""


def _copy_batch_plan(policy="stage_descending"):
    # A copy-then-compute pipeline: CopyBatch on an IO worker at stage 0, Forward
    # and Backward on a compute worker at stage 1, enqueued stage-descending.
    return PipelinePlan(
        {"CopyBatch": S(0, "memcpy", "io"), "Forward": S(1, None, "compute"), "Backward": S(1, None, "compute")},
        intra_iter_deps=[("Forward", "CopyBatch"), ("Backward", "Forward")],
        enqueue_policy=policy,
    )


def test_stage_analysis_copy_batch_example_reproduced():
    text = format_stage_analysis(_copy_batch_plan())
    assert text.startswith(STAGE_ANALYSIS_COPY_BATCH + "\n")
    assert VERDICT_COPY_BATCH in text
    assert "Minimum depth for this enqueue order = 2" in text


def test_stage_analysis_flags_removable_boundary():
    # Enqueued CopyBatch first, nothing forces two stages: the boundary is superfluous.
    text = format_stage_analysis(_copy_batch_plan("ready_first"))
    assert "LDS = 1" in text and "Pipeline depth = 2" in text
    assert "  +  depth 2 > minimum depth 1 for this enqueue order: removable stage boundaries 0|1" in text


def test_stage_analysis_exact_minimum_beyond_lds():
    # prefetch under ready-first: LDS 2 < minimum depth 3 == depth; only the exact check proves optimality.
    text = format_stage_analysis(pipelines.get("prefetch"))
    assert "LDS = 2" in text and "Pipeline depth = 3" in text
    assert "  ✓  depth == minimum depth for this enqueue order (LDS = 2 is only a lower bound)" in text


def test_stage_analysis_marks_globally_ordered_tasks_and_validates():
    text = format_stage_analysis(pipelines.get("sparse_dist"))
    assert "    1  InputDistStart      1      1  global" in text
    with pytest.raises(PlanError):
        format_stage_analysis(PipelinePlan({"A": S(1), "B": S(0)}, intra_iter_deps=[("B", "A")]))


def _random_plan(rng: random.Random, max_tasks: int = 5) -> PipelinePlan:
    n = rng.randint(2, max_tasks)
    names = [f"T{i}" for i in range(n)]
    stage = {t: rng.randint(0, 2) for t in names}
    intra = [(a, b) for i, a in enumerate(names) for b in names[:i] if stage[b] <= stage[a] and rng.random() < 0.35]
    inter = [(a, b) for a in names for b in names if stage[b] - stage[a] <= 1 and rng.random() < 0.15]
    policy = rng.choice(["ready_first", "stage_descending"])
    return PipelinePlan({t: S(stage[t], rng.choice([None, "x"])) for t in names}, intra, inter, enqueue_policy=policy)


def _deadlock_free(plan: PipelinePlan, stages: dict, order: list) -> bool:
    """Independent oracle: validate() accepts these stages with this explicit order."""
    sched = {t: S(stages[t], plan.sched(t).stream) for t in plan.task_names}
    try:
        validate(plan.replace(schedule=sched, enqueue_order=order))
    except PlanError:
        return False
    return True


def test_min_depth_is_exact_against_brute_force():
    rng = random.Random(7)
    checked = nontrivial = 0
    while checked < 60:
        plan = _random_plan(rng)
        try:
            validate(plan)
        except PlanError:
            continue
        order = enqueue_order(plan)
        names = plan.task_names
        depth = min_depth(plan)
        # achievable: the minimal stages are deadlock-free with this order ...
        assert _deadlock_free(plan, min_stages(plan), order)
        assert max(min_stages(plan).values()) + 1 == depth
        # ... and minimal: no assignment with fewer stages is (exhaustive).
        assert not any(_deadlock_free(plan, dict(zip(names, s)), order)
                       for s in itertools.product(range(depth - 1), repeat=len(names))), (plan, order)
        checked += 1
        nontrivial += depth >= 2
    assert nontrivial >= 10


def test_lds_le_min_depth_le_depth_for_every_pipeline_and_policy():
    for name in pipelines.PIPELINES:
        for policy in ("ready_first", "stage_descending"):
            plan = pipelines.get(name).replace(enqueue_policy=policy)
            text = format_stage_analysis(plan)
            k = int(text.split("LDS = ")[1].split()[0])
            assert 1 <= k <= min_depth(plan) <= plan.pipeline_depth, (name, policy)


def test_stage_descending_torchrec_plans_need_their_depth():
    # Enqueued stage-descending (older iterations first), every TorchRec plan's depth is minimal.
    for name in pipelines.PIPELINES:
        plan = pipelines.get(name).replace(enqueue_policy="stage_descending", caller_group=None)
        assert min_depth(plan) == plan.pipeline_depth, name


def test_handing_worker_tasks_off_first_can_lower_the_depth_needed():
    # With the caller's group inline the policy hands the H2D of a side thread (the eval pipeline's loader,
    # SparseDistT's copy thread) off before the caller's older tasks, so their order needs one stage less;
    # the other TorchRec plans keep theirs.
    shallower = []
    for name in pipelines.PIPELINES:
        plan = pipelines.get(name).replace(enqueue_policy="stage_descending")
        assert min_depth(plan) <= plan.pipeline_depth, name
        if min_depth(plan) < plan.pipeline_depth:
            shallower.append(name)
    assert shallower == ["eval_sparse_dist", "sparse_dist_t"]


def test_lds_bound_holds_on_random_plans():
    rng = random.Random(11)
    seen = 0
    while seen < 150:
        plan = _random_plan(rng, 6)
        try:
            validate(plan)
        except PlanError:
            continue
        text = format_stage_analysis(plan)
        k = int(text.split("LDS = ")[1].split()[0])
        assert k <= min_depth(plan) <= plan.pipeline_depth
        seen += 1


def test_plain_lds_of_stages_is_not_a_lower_bound():
    # Why the analysis takes the LDS along dependency chains: two independent
    # tasks at stages 1, 0 enqueued in that order form a decreasing pair, yet
    # one stage suffices.
    plan = PipelinePlan({"A": S(1), "B": S(0)}, enqueue_policy="stage_descending")
    assert enqueue_order(plan) == ["A", "B"]
    assert lds([1, 0])[0] == 2 and min_depth(plan) == 1
    assert "LDS = 1" in format_stage_analysis(plan)


def test_removable_boundaries_keep_the_order_deadlock_free():
    rng = random.Random(3)
    found = 0
    for _ in range(300):
        plan = _random_plan(rng)
        try:
            validate(plan)
        except PlanError:
            continue
        order = enqueue_order(plan)
        for k in range(plan.pipeline_depth - 1):
            merged = {t: s if s <= k else s - 1 for t, s in ((t, plan.stage(t)) for t in plan.task_names)}
            assert (k in removable_boundaries(plan, order)) == _deadlock_free(plan, merged, order)
            found += 1
    assert found > 50


def test_min_depth_rejects_an_order_no_stages_can_fix():
    # C(i) waits B(i) waits A(i) waits C(i-1); enqueued C, B, A each wait runs
    # against the order and the cycle gains a stage per turn.
    plan = PipelinePlan({"A": S(0), "B": S(0), "C": S(0)}, intra_iter_deps=[("B", "A"), ("C", "B")],
                        inter_iter_deps=[("A", "C")])
    with pytest.raises(ValueError, match="no stage assignment makes enqueue order"):
        min_depth(plan, ["C", "B", "A"])
    with pytest.raises(ValueError, match="every task"):
        min_depth(plan, ["A", "B"])
    assert min_depth(plan, ["A", "B", "C"]) == 1


def test_lds_matches_brute_force():
    rng = random.Random(5)
    for _ in range(200):
        seq = [rng.randint(0, 4) for _ in range(rng.randint(0, 8))]
        best = max((len(c) for r in range(len(seq) + 1) for c in itertools.combinations(seq, r)
                    if all(a > b for a, b in zip(c, c[1:]))), default=0)
        length, example = lds(seq)
        assert length == best == len(example)
        assert all(a > b for a, b in zip(example, example[1:]))
        it = iter(seq)
        assert all(x in it for x in example)  # a subsequence
        assert lds(seq, related=lambda i, j: True)[0] == best
