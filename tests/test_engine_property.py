"""Property test: any plan validation accepts runs pipelined and serial, exactly as the semantics say.

Random DAGs with stages obeying the corollaries, random thread groups and
streams, inter deps of distance 1-2, globally ordered tasks. For each plan,
20+ iterations pipelined and serial must finish (no hang), run every task
exactly once per iteration, satisfy every dependency on the recorded
timeline, keep each thread group's order equal to the enqueue order, and run
globally ordered tasks in ticket (enqueue) order.
"""

from __future__ import annotations

import itertools
import threading

import pytest
from conftest import check_contract, enqueue_sequence, swpipe_threads
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swpipe import Timeouts
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.validate import PlanError, validate

GROUPS = ["default", "io", "comm"]
STREAMS = [None, "memcpy", "data_dist"]


@st.composite
def valid_plans(draw, max_tasks=7):
    n = draw(st.integers(1, max_tasks))
    stages = sorted(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    names = [f"T{k}" for k in range(n)]
    # Shuffle names over the stage-sorted slots so that names do not reveal the order.
    names = draw(st.permutations(names))
    stage = dict(zip(names, stages))
    # Intra deps go from earlier to later slot: acyclic and stage(dep) <= stage(task) (corollary 1).
    intra = []
    for a in range(n):
        for b in range(a + 1, n):
            if draw(st.booleans()) and draw(st.booleans()):
                intra.append((names[b], names[a]))
    inter = []
    for _ in range(draw(st.integers(0, 3))):
        t, d = draw(st.sampled_from(names)), draw(st.sampled_from(names))
        dist = draw(st.integers(1, 2))
        if stage[d] - stage[t] <= dist:  # corollary 3
            inter.append((t, d, dist))
    sched = {}
    for name in names:
        sched[name] = TaskSchedule(stage=stage[name], stream=draw(st.sampled_from(STREAMS)),
                                   thread_group=draw(st.sampled_from(GROUPS)),
                                   globally_ordered=draw(st.booleans()))
    policy = draw(st.sampled_from(["ready_first", "stage_descending"]))
    # The stage list was sorted then used as given, so depth may exceed what is needed: that is valid.
    plan = PipelinePlan(sched, intra_iter_deps=intra, inter_iter_deps=inter, enqueue_policy=policy)
    validate(plan)  # the generator only builds valid plans; a PlanError here is a generator bug
    return plan


class Recorder:
    def __init__(self):
        self.calls = []
        self.ordered = []
        self._tick = itertools.count()

    def bind(self, plan):
        ordered = {n for n in plan.task_names if plan.sched(n).globally_ordered}

        def make(name):
            def fn(ctx):
                self.calls.append((next(self._tick), name, ctx.iter_idx, threading.current_thread().name))
                if name in ordered:
                    self.ordered.append((name, ctx.iter_idx))
            return fn

        return plan.bind({n: make(n) for n in plan.task_names})


def check_run(plan, n_iters):
    rec = Recorder()
    bound = rec.bind(plan)
    pipe = SWPipeline(bound, device="cpu", record_timeline=True, timeouts=Timeouts(signal_s=20, progress_s=30))
    pipe.run(range(n_iters))

    # every task exactly once per iteration
    runs = sorted((name, i) for _, name, i, _ in rec.calls)
    assert runs == sorted((n, i) for n in plan.task_names for i in range(n_iters))

    # the timeline obeys the contract: dependencies, FIFO groups, depth in flight, hand-offs, sequencer
    check_contract(plan, pipe.timeline, n_iters)

    # each thread group runs its tasks in the enqueue order, on its own named thread
    seq = enqueue_sequence(plan, n_iters)
    for group in {plan.sched(n).thread_group for n in plan.task_names}:
        want = [x for x in seq if plan.sched(x[0]).thread_group == group]
        got = [(name, i) for _, name, i, thread in sorted(rec.calls) if plan.sched(name).thread_group == group]
        assert got == want, group
        thread = threading.current_thread().name if group == plan.caller_group else f"swpipe-{group}"
        assert {thread for _, name, _, thread in rec.calls if plan.sched(name).thread_group == group} == {thread}

    # globally ordered tasks run in ticket order, identical to the enqueue order
    assert rec.ordered == [x for x in seq if plan.sched(x[0]).globally_ordered]

    # serial: same task set, topological per iteration, iterations in order
    rec.calls.clear()
    pipe.run_serial(range(n_iters))
    serial = [(name, i) for _, name, i, _ in rec.calls]
    assert [i for _, i in serial] == sorted(i for _, i in serial)
    pos = {x: k for k, x in enumerate(serial)}
    assert len(pos) == len(plan.task_names) * n_iters
    for t, d in plan.intra_edges():
        for i in range(n_iters):
            assert pos[(d, i)] < pos[(t, i)]
    assert swpipe_threads() == []


@pytest.mark.timeout(120)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=valid_plans(), n_iters=st.integers(20, 24))
def test_random_valid_plans_run_correctly(plan, n_iters):
    check_run(plan, n_iters)  # the "default" group inline on the caller's thread
    check_run(plan.replace(caller_group=None, pipeline_depth=plan.pipeline_depth), n_iters)  # every group a worker


@pytest.mark.slow
@pytest.mark.timeout(900)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=valid_plans(max_tasks=10), n_iters=st.integers(20, 40))
def test_random_valid_plans_run_correctly_high_volume(plan, n_iters):
    check_run(plan, n_iters)


def test_generator_only_builds_valid_plans_and_covers_the_space():
    """The strategy hits inter deps, several groups, ordered tasks and depth > 1 (else the property is weak)."""
    seen = {"inter": False, "groups": False, "ordered": False, "deep": False, "dist2": False}

    @settings(max_examples=80, deadline=None, database=None)
    @given(plan=valid_plans())
    def probe(plan):
        validate(plan)
        seen["inter"] |= bool(plan.inter_iter_deps)
        seen["dist2"] |= any(n == 2 for *_, n in plan.inter_edges())
        seen["groups"] |= len({plan.sched(n).thread_group for n in plan.task_names}) > 1
        seen["ordered"] |= any(plan.sched(n).globally_ordered for n in plan.task_names)
        seen["deep"] |= plan.pipeline_depth > 2

    probe()
    assert all(seen.values()), seen


def test_generator_rejects_nothing_validate_would_accept():
    """A corollary-3 violation is what the generator filters out; validate agrees it is invalid."""
    plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(3)}, inter_iter_deps=[("A", "B", 2)])
    with pytest.raises(PlanError, match="corollary-3"):
        validate(plan)
