"""The simulator reproduces hand-computed schedules of the engine's semantics."""

from __future__ import annotations

import os

import pytest

from autosched.search.bounds import lower_bounds
from autosched.model.costs import CostModel, TaskCost
from autosched.model.simulate import simulate
from swpipe_core import pipelines
from swpipe_core.order import enqueue_order
from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.measure.trace import read_chrome_trace
from swpipe_core.validate import PlanError

MS = 1e-3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ms(x: float) -> float:
    return round(x / MS, 6)


def costs_ms(**kw) -> CostModel:
    """``name=host_ms`` or ``name=(host_ms, device_ms[, resources])``."""
    out = {}
    for name, v in kw.items():
        v = v if isinstance(v, tuple) else (v,)
        out[name] = TaskCost(v[0] * MS, (v[1] if len(v) > 1 else 0.0) * MS, v[2] if len(v) > 2 else ())
    return CostModel(out)


TWO = costs_ms(A=1.0, B=2.0)


def test_two_tasks_on_two_threads_period_is_the_longer():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
                        intra_iter_deps=[("B", "A")])
    r = simulate(plan, TWO)
    assert ms(r.period_s) == 2.0
    assert r.binding == "thread:b"
    assert r.utilisation["thread:b"] == pytest.approx(1.0) and r.utilisation["thread:a"] == pytest.approx(0.5)
    assert ms(r.idle["thread:a"]) == 1.0
    # A(i) at stage 0 runs alongside B(i-1): B(i) starts when both A(i) and B(i-1) are done
    b = {e.iteration: e for e in r.events if e.task == "B"}
    assert ms(b[10].start) == ms(b[9].end)


def test_the_same_tasks_on_one_thread_add_up():
    plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1)}, intra_iter_deps=[("B", "A")])
    r = simulate(plan, TWO)
    assert ms(r.period_s) == 3.0
    assert r.binding == "thread:default"


def test_depth_one_on_two_threads_is_held_by_the_progress_barrier():
    # nothing of iteration i+1 may start before iteration i retires: A and B never overlap
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(0, thread_group="b")},
                        intra_iter_deps=[("B", "A")])
    r = simulate(plan, TWO)
    assert ms(r.period_s) == 3.0
    assert r.binding.split()[:2] == ["progress", "barrier"] and "(depth 1)" in r.binding
    assert "barrier" in r.critical_cycle.kinds
    assert ms(lower_bounds(plan, TWO).critical_path) == 3.0


def test_independent_tasks_at_depth_one_overlap_up_to_the_longer():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(0, thread_group="b")})
    assert ms(simulate(plan, TWO).period_s) == 2.0


def test_recurrence_bound_period_equals_rec_mii():
    # A(i) waits B(i-1) across threads: the cycle A -> B -> A costs 3 ms per iteration although
    # no thread is busy more than 2 ms
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b"),
                         "C": TaskSchedule(1, thread_group="c")},
                        intra_iter_deps=[("B", "A")], inter_iter_deps=[("A", "B")])
    costs = costs_ms(A=1.0, B=2.0, C=0.5)
    r = simulate(plan, costs)
    b = lower_bounds(plan, costs)
    assert ms(b.rec_mii) == 3.0 and ms(b.res_mii) == 2.0
    assert ms(r.period_s) == ms(b.rec_mii)
    assert r.binding.startswith("recurrence:")
    assert {s[0] for s in r.critical_cycle.steps} == {"A", "B"} and r.critical_cycle.iterations == 1
    assert ms(r.critical_cycle.ratio) == 3.0


def test_device_recurrence_of_fused_sparse_dist_binds_on_cuda():
    # EmbLookup(i) waits Backward(i-1)'s device event: Backward -> EmbLookup -> Forward -> Backward on the GPU
    plan = pipelines.get("fused_sparse_dist")
    costs = CostModel.load(os.path.join(ROOT, "cost_models", "fused_sparse_dist.json"))
    r = simulate(plan, costs, device="cuda")
    b = lower_bounds(plan, costs, device="cuda")
    expected = costs["Backward"].device_s + costs["EmbLookup"].device_s + costs["Forward"].device_s
    assert r.period_s == pytest.approx(expected, rel=1e-9)
    assert b.rec_mii == pytest.approx(expected, rel=1e-9)
    assert r.binding.startswith("recurrence:") and "EmbLookup" in r.binding


def test_pqra_ready_first_has_lower_latency_than_stage_descending_on_cuda():
    """The P/Q/R/A example (one worker, three streams) as a valid plan.

    In its textbook form R (stage 0) waits Q (stage 1) within an iteration, which
    breaks the stage rule (an intra-iteration dependency may not point to a later
    stage: R(i) would wait for Q(i), enqueued a period later, a deadlock). The variant keeps the wait the example is about — R waits, on
    stream X, for Q on stream Y *in the same period* — by declaring it
    inter-iteration: R(i) waits Q(i-1), which runs in the same period as R(i).
    Ready-first enqueues P, Q, A, R; stage-descending Q, P, A, R.

    One thread, costs (host, device) in ms: P (1, 1) on X, Q (0.1, 1) on Y,
    R and A (0.1, 0). The worker is busy 1.3 ms per period; let period i start
    at t. Ready-first: P(i) 0..1 (device 1..2), Q(i-1) ends at 1.1, retiring
    iteration i-1, so batch i+1 enters at t+1.1, i.e. batch i entered at
    t-0.2; Q(i) runs in the next period and ends its host part at t+2.4, its
    device part 2.4..3.4: latency 3.6 ms. Stage-descending runs Q(i-1) first,
    so batch i+1 enters at t+0.1 (batch i at t-1.2) and waits 1.2 ms for the
    worker; P(i)'s device part is pushed to 1.1..2.1, Q(i)'s to 2.1..3.1:
    latency 4.3 ms. Same period, lower latency: ready-first submits the
    stall-free P ahead of Q. (The device span of an iteration is 3.4 vs 3.1 ms:
    the gain is the time a batch waits after entering the pipeline.)
    """
    s = {"P": TaskSchedule(0, "X"), "Q": TaskSchedule(1, "Y"), "R": TaskSchedule(0, "X"), "A": TaskSchedule(0, "Z")}
    costs = costs_ms(P=(1.0, 1.0), Q=(0.1, 1.0), R=(0.1, 0.0), A=(0.1, 0.0))
    result = {}
    for policy in ("ready_first", "stage_descending"):
        # caller_group=None: the reasoning above is about one worker thread fed by the main thread
        plan = PipelinePlan(s, intra_iter_deps=[("Q", "P")], inter_iter_deps=[("A", "Q"), ("R", "Q")],
                            enqueue_policy=policy, caller_group=None)
        result[policy] = simulate(plan, costs, device="cuda")
        assert ms(result[policy].period_s) == 1.3
        assert abs(result[policy].latency_growth) < 1e-9  # host-bound: latency is steady
    assert enqueue_order(result["ready_first"].plan) == ["P", "Q", "A", "R"]
    assert enqueue_order(result["stage_descending"].plan) == ["Q", "P", "A", "R"]
    assert ms(result["ready_first"].latency) == 3.6
    assert ms(result["stage_descending"].latency) == 4.3


def test_cuda_cpu_completion_is_not_device_completion():
    # host parts are short: the host retires iterations long before their device work ends and runs ahead
    plan = PipelinePlan({"A": TaskSchedule(0, "s1"), "B": TaskSchedule(1, "s2")}, intra_iter_deps=[("B", "A")])
    costs = costs_ms(A=(0.1, 2.0), B=(0.1, 1.0))
    r = simulate(plan, costs, device="cuda")
    assert ms(r.period_s) == 2.0 and r.binding == "stream:s1"
    assert r.latency_growth > 0  # progress() waits CPU signals only
    b = [e for e in r.events if e.task == "B" and e.iteration == 5]
    host, dev = (b[0], b[1]) if b[0].kind == "host" else (b[1], b[0])
    a_dev = next(e for e in r.events if e.task == "A" and e.iteration == 5 and e.kind == "device")
    assert dev.start >= a_dev.end and dev.start >= host.end  # device part after its submission and A's event


def test_cpu_mode_charges_device_time_to_the_thread():
    plan = PipelinePlan({"A": TaskSchedule(0, "s1"), "B": TaskSchedule(0, "s2")})
    costs = costs_ms(A=(0.1, 2.0), B=(0.1, 1.0))
    r = simulate(plan, costs, device="cpu")
    assert ms(r.period_s) == 3.2
    assert all(e.kind == "host" for e in r.events)


def test_same_stream_serialises_device_work_from_two_threads():
    plan = PipelinePlan({"A": TaskSchedule(0, "s", "a"), "B": TaskSchedule(0, "s", "b")})
    r = simulate(plan, costs_ms(A=(0.1, 1.0), B=(0.1, 1.5)), device="cuda")
    assert ms(r.period_s) == 2.5 and r.binding == "stream:s"


def test_one_communicator_serialises_collectives_on_different_streams():
    tags = ("comm:nccl",)
    plan = PipelinePlan({"A": TaskSchedule(0, "s1", "a"), "B": TaskSchedule(0, "s2", "b")})
    r = simulate(plan, costs_ms(A=(0.1, 1.0, tags), B=(0.1, 1.5, tags)), device="cuda")
    assert ms(r.period_s) == 2.5 and r.binding == "comm:nccl"
    free = simulate(plan, costs_ms(A=(0.1, 1.0), B=(0.1, 1.5)), device="cuda")
    assert ms(free.period_s) == 1.5


def test_pcie_copies_contend_on_the_host_too():
    plan = PipelinePlan({"A": TaskSchedule(0, "s1", "a"), "B": TaskSchedule(0, "s2", "b")})
    r = simulate(plan, costs_ms(A=(1.0, 0, ("pcie",)), B=(1.5, 0, ("pcie",))), device="cpu")
    assert ms(r.period_s) == 2.5 and r.binding == "pcie"
    assert any(s.cause == "pcie" for s in r.stalls)


def test_sequencer_turns_serialise_globally_ordered_tasks_across_threads():
    s = {"A": TaskSchedule(0, thread_group="a", globally_ordered=True),
         "B": TaskSchedule(1, thread_group="b", globally_ordered=True)}
    plan = PipelinePlan(s)
    costs = costs_ms(A=2.5, B=2.0)
    r = simulate(plan, costs)
    assert ms(r.period_s) == 4.5 and r.binding == "sequencer"
    assert ms(lower_bounds(plan, costs).value) == 4.5
    unordered = PipelinePlan({k: TaskSchedule(v.stage, thread_group=v.thread_group) for k, v in s.items()})
    assert ms(simulate(unordered, costs).period_s) == 2.5


def _pooled(costs: CostModel, cores) -> CostModel:
    return CostModel(costs.tasks, cores=cores)


def test_one_free_core_serialises_independent_threads_and_two_do_not():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(0, thread_group="b")})
    costs = costs_ms(A=1.0, B=2.0)
    assert ms(simulate(plan, costs).period_s) == 2.0
    one = simulate(plan, _pooled(costs, 1))
    assert ms(one.period_s) == 3.0 and one.binding == "cores"
    assert one.utilisation["cores"] == pytest.approx(1.0)
    assert any(cause == "cores" and part == "host" for _, part, cause, _ in one.stall_summary())
    assert "cores" in one.critical_cycle.kinds
    # the pool's host parts never overlap on the one core
    host = sorted((e.start, e.end) for e in one.events if e.kind == "host")
    assert all(b[0] >= a[1] - 1e-12 for a, b in zip(host, host[1:]))
    two = simulate(plan, _pooled(costs, 2))
    assert ms(two.period_s) == 2.0 and two.binding == "thread:b"
    assert "cores" not in two.utilisation and not any(c == "cores" for _, _, c, _ in two.stall_summary())


def test_a_nocore_task_leaves_the_pool_to_the_others():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(0, thread_group="b")})
    blocking = CostModel({"A": TaskCost(1 * MS, 0.0, ("nocore",)), "B": TaskCost(2 * MS)}, cores=1)
    r = simulate(plan, blocking)
    assert ms(r.period_s) == 2.0 and r.utilisation["cores"] == pytest.approx(1.0)
    assert not any(c == "cores" for _, _, c, _ in r.stall_summary())
    assert ms(lower_bounds(plan, blocking).value) == 2.0


def test_core_pool_counts_the_caller_groups_main_thread():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(0, thread_group="b")},
                        caller_group="a")
    costs = costs_ms(A=1.0, B=2.0)
    assert ms(simulate(plan, costs).period_s) == 2.0
    r = simulate(plan, _pooled(costs, 1))
    assert ms(r.period_s) == 3.0 and r.binding == "cores"


def test_a_worker_task_placed_after_a_callers_task_waits_for_it():
    # The main thread hands W off when its walk of the enqueue order reaches it: after running C.
    plan = PipelinePlan({"C": TaskSchedule(0), "W": TaskSchedule(0, thread_group="io")})
    costs = costs_ms(C=3.0, W=1.0)
    late = simulate(plan.replace(enqueue_order=["C", "W"]), costs)
    assert ms(late.period_s) == 4.0  # W after C, then the next period after W retires the iteration
    assert any(step[0] == "C" and step[3] == "thread:default" for step in late.critical_cycle.steps)
    assert ms(simulate(plan.replace(enqueue_order=["W", "C"]), costs).period_s) == 3.0
    assert ms(simulate(plan, costs).period_s) == 3.0  # the policy hands W off first


def test_core_pool_of_two_for_three_threads_bounds_and_binds():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b"),
                         "C": TaskSchedule(2, thread_group="c")})
    costs = _pooled(costs_ms(A=1.0, B=1.0, C=1.0), 2)
    r = simulate(plan, costs)
    # two of the three 1 ms parts run at once; the third waits for a core
    assert ms(r.period_s) == 2.0 and r.utilisation["cores"] == pytest.approx(0.75)
    assert {c for _, _, c, _ in r.stall_summary() if c == "cores"} == {"cores"}
    assert ms(lower_bounds(plan, costs).value) == 1.5 <= ms(r.period_s)


def test_core_pool_holds_host_parts_only_on_cuda():
    plan = PipelinePlan({"A": TaskSchedule(0, "s1", thread_group="a"), "B": TaskSchedule(0, "s2", thread_group="b")})
    device_bound = costs_ms(A=(1.0, 5.0), B=(1.0, 5.0))
    assert ms(simulate(plan, _pooled(device_bound, 1), device="cuda").period_s) == 5.0
    host_bound = costs_ms(A=(3.0, 1.0), B=(3.0, 1.0))
    assert ms(simulate(plan, host_bound, device="cuda").period_s) == 3.0
    r = simulate(plan, _pooled(host_bound, 1), device="cuda")
    assert ms(r.period_s) == 6.0 and r.binding == "cores"


def test_stalls_name_the_dependency_and_the_fifo():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(0, thread_group="b"),
                         "C": TaskSchedule(0, thread_group="b")}, intra_iter_deps=[("B", "A")])
    r = simulate(plan, costs_ms(A=2.0, B=1.0, C=1.0))
    assert enqueue_order(plan) == ["A", "C", "B"]  # ready-first: B waits A, so C goes first
    rows = {(t, c): s for t, p, c, s in r.stall_summary()}
    # on thread b, B sits behind C for 1 ms, then waits A's CPU signal for 1 ms more; C never waits
    assert ms(rows[("B", "fifo:b")]) == 1.0
    assert ms(rows[("B", "dep:A")]) == 1.0
    assert not any(t == "C" for t, _ in rows)
    top = r.stall_summary(top=2)
    assert len(top) == 2 and top[0][3] >= top[1][3] and {top[0][2], top[1][2]} == {"fifo:b", "dep:A"}


def test_main_thread_overhead_adds_to_a_barrier_bound_period():
    plan = PipelinePlan({"A": TaskSchedule(0)})
    r = simulate(plan, costs_ms(A=1.0), period_overhead_s=0.25 * MS)
    assert ms(r.period_s) == 1.25
    r = simulate(plan, costs_ms(A=1.0), task_overhead_s=0.1 * MS)
    assert ms(r.period_s) == 1.1


def test_every_task_iteration_appears_once_on_its_tracks():
    plan = pipelines.get("sparse_dist")
    costs = CostModel.load(os.path.join(ROOT, "cost_models", "sparse_dist.json"))
    r = simulate(plan, costs, num_iterations=20, device="cuda")
    host = [(e.task, e.iteration) for e in r.events if e.kind == "host"]
    assert sorted(host) == sorted((t, i) for t in plan.task_names for i in range(r.num_iterations))
    for e in r.events:
        assert e.thread_group == plan.sched(e.task).thread_group and e.stream == plan.stream_of(e.task)
        assert e.end >= e.start
    dev = {(e.task, e.iteration) for e in r.events if e.kind == "device"}
    assert ("WaitBatch", 3) not in dev and ("Forward", 3) in dev  # zero device time draws no device bar


def test_host_parts_on_one_thread_never_overlap():
    plan = pipelines.get("prefetch")
    costs = CostModel.load(os.path.join(ROOT, "cost_models", "prefetch.json"))
    r = simulate(plan, costs, num_iterations=30, device="cuda")
    for kind, key in (("host", "thread_group"), ("device", "stream")):
        tracks = {}
        for e in r.events:
            if e.kind == kind:
                tracks.setdefault(getattr(e, key), []).append(e)
        for evs in tracks.values():
            evs.sort(key=lambda e: e.start)
            assert all(a.end <= b.start + 1e-12 for a, b in zip(evs, evs[1:]))


def test_simulated_trace_has_the_measured_format(tmp_path):
    plan = PipelinePlan({"A": TaskSchedule(0, "s1", "io"), "B": TaskSchedule(1)}, intra_iter_deps=[("B", "A")])
    r = simulate(plan, costs_ms(A=(0.1, 1.0), B=(0.5, 0.5)), num_iterations=10, device="cuda")
    path = r.write_chrome_trace(str(tmp_path / "sim.trace.json"))
    back = read_chrome_trace(path)
    assert len(back) == len(r.events)
    assert {(e.kind, e.thread_group if e.kind == "host" else e.stream) for e in back} == \
           {("host", "io"), ("host", "default"), ("device", "s1"), ("device", "default")}
    names = {m["args"]["name"] for m in r.to_chrome_trace()["traceEvents"] if m.get("name") == "thread_name"}
    assert {("thread", "io"), ("stream", "s1")} <= {tuple(n.split()) for n in names}


def test_simulation_is_deterministic():
    plan = pipelines.get("semi_sync")
    costs = CostModel.load(os.path.join(ROOT, "cost_models", "semi_sync.json"))
    a = simulate(plan, costs, num_iterations=30, device="cuda")
    b = simulate(plan, costs, num_iterations=30, device="cuda")
    assert a.events == b.events and a.period_s == b.period_s and a.stalls == b.stalls


def test_simulate_validates_plan_and_arguments():
    bad = PipelinePlan({"A": TaskSchedule(1), "B": TaskSchedule(0)}, intra_iter_deps=[("B", "A")])
    with pytest.raises(PlanError):
        simulate(bad, costs_ms(A=1, B=1))
    ok = PipelinePlan({"A": TaskSchedule(0)})
    with pytest.raises(ValueError, match="num_iterations"):
        simulate(ok, costs_ms(A=1), num_iterations=1)
    with pytest.raises(ValueError, match="device"):
        simulate(ok, costs_ms(A=1), device="tpu")
    with pytest.raises(ValueError, match="period_overhead_s"):
        simulate(ok, costs_ms(A=1), period_overhead_s=-1)


def test_summary_names_period_binding_and_waits():
    plan = PipelinePlan({"A": TaskSchedule(0, thread_group="a"), "B": TaskSchedule(1, thread_group="b")},
                        intra_iter_deps=[("B", "A")])
    text = simulate(plan, TWO).summary()
    assert "period 2.000 ms/iter" in text and "binding: thread:b" in text and "thread:b 100%" in text


@pytest.mark.timeout(60)  # a deadlock guard; the simulator's speed is a figure of benchmarks/sim_device_bound.py
def test_a_twenty_task_plan_simulates_ten_thousand_task_iterations_to_a_steady_period():
    names = [f"T{k}" for k in range(20)]
    sched = {n: TaskSchedule(k % 3, f"s{k % 4}", f"g{k % 3}", k == 5) for k, n in enumerate(names)}
    deps = [(names[k], names[k - 1]) for k in range(1, 20) if k % 3 >= (k - 1) % 3]
    plan = PipelinePlan(sched, intra_iter_deps=deps, inter_iter_deps=[("T0", "T19")])
    costs = CostModel({n: TaskCost((1 + k % 5) * MS, 2 * MS, ("comm:x",) if k % 7 == 0 else ())
                       for k, n in enumerate(names)})
    for device in ("cpu", "cuda"):
        r = simulate(plan, costs, num_iterations=500, device=device)
        assert r.num_iterations * len(names) >= 10_000
        host = [e for e in r.events if e.kind == "host"]
        assert len(host) == r.num_iterations * len(names)  # every task of every iteration ran once
        assert r.period_s >= lower_bounds(plan, costs, device=device).value * (1 - 1e-9)


def _slow_queue(kind: str):
    """X's resource needs 1.01 ms per iteration; the Z chain completes iterations every 1 ms, 3 ms after entry.

    Completion is ``max((i + 1) * 1.01, (i + 3) * 1.0)`` ms: X's backlog grows by 0.01 ms per
    iteration and overtakes the chain only around iteration 200, after which the period is 1.01 ms.
    ``kind`` picks which resource X loads: its thread, its stream (CUDA), a communicator or PCIe
    (two tasks on two threads / streams sharing it, so no thread or stream is the bottleneck).
    """
    sched = {"Z1": TaskSchedule(0, thread_group="a"), "Z2": TaskSchedule(1, thread_group="b"),
             "Z3": TaskSchedule(3, thread_group="c")}
    cost = {"Z1": 1.0, "Z2": 1.0, "Z3": 1.0}
    device = "cpu"
    if kind == "thread":
        sched["X"] = TaskSchedule(0, thread_group="w")
        cost["X"] = 1.01
    elif kind == "stream":
        sched["X"] = TaskSchedule(0, stream="s", thread_group="w")
        cost["X"] = (0.01, 1.01)
        device = "cuda"
    elif kind == "comm":
        sched.update(X1=TaskSchedule(0, thread_group="w1"), X2=TaskSchedule(0, thread_group="w2"))
        cost.update(X1=(0.505, 0.0, ("comm:x",)), X2=(0.505, 0.0, ("comm:x",)))
    else:  # pcie on CUDA: two copies on two streams share the bus
        sched.update(X1=TaskSchedule(0, stream="s1", thread_group="w1"),
                     X2=TaskSchedule(0, stream="s2", thread_group="w2"))
        cost.update(X1=(0.01, 0.505, ("pcie",)), X2=(0.01, 0.505, ("pcie",)))
        device = "cuda"
    plan = PipelinePlan(sched, intra_iter_deps=[("Z2", "Z1"), ("Z3", "Z2")], pipeline_depth=4)
    return plan, costs_ms(**cost), device


@pytest.mark.parametrize("kind", ["thread", "stream", "comm", "pcie"])
def test_a_slowly_growing_queue_is_simulated_until_it_binds(kind):
    plan, costs, device = _slow_queue(kind)
    load = 1.01 * MS  # the busiest resource's work per iteration
    long_run = simulate(plan, costs, num_iterations=2000, device=device)
    assert long_run.period_s == pytest.approx(load, rel=1e-9)
    for n in (50, 60, 120):
        r = simulate(plan, costs, num_iterations=n, device=device)
        # 50 iterations alone show the chain's transient 1.000 ms/iter; the run must go on until X's queue binds
        assert r.period_s >= load * (1 - 1e-9), (n, r.num_iterations, r.period_s)
        assert r.period_s == pytest.approx(long_run.period_s, rel=1e-9)
        assert r.num_iterations > 200
        assert max(r.utilisation.values()) <= 1 + 1e-6


def test_the_best_beam_plan_of_a_random_graph_is_simulated_to_its_resource_bound():
    # the case that showed the transient: beam search's best plan for random_graph(20, 20)
    # simulated at 15.497 ms/iter on 60 iterations, 15.524 ms (its busiest thread) from 120 on
    from swpipe.testing.plan_space import random_graph
    from autosched.search.problem import make_problem
    from autosched.search.beam import beam_search
    from autosched.search.bounds import plan_resource_bound
    from autosched.search.options import Constraints

    graph, costs = random_graph(20, 20)
    problem = make_problem(graph, costs, Constraints())
    plan = beam_search(problem, seed=0, time_limit_s=300).plan  # rounds and patience end it, not the clock
    bound = plan_resource_bound(problem, plan)
    long_run = simulate(plan, costs, num_iterations=960).period_s
    assert long_run >= bound * (1 - 1e-9)
    for n in (40, 60, 120):
        period = simulate(plan, costs, num_iterations=n).period_s
        assert period >= bound * (1 - 1e-9)
        assert period == pytest.approx(long_run, rel=1e-9)
