"""SWPipeline behaviour: its public methods, period/iteration/stage, memory, observability."""

from __future__ import annotations

import gc
import itertools
import logging
import re
import threading
import weakref

import pytest
import torch

from swpipe import Timeouts
from swpipe_core.engine.pipeline import PipelineTaskError, SWPipeline
from swpipe_core.plan import IterContext, PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.measure.trace import to_chrome_trace
from swpipe_core.validate import PlanError
from conftest import drive, swpipe_threads

pytestmark = pytest.mark.timeout(60)


class Log:
    """Thread-safe record of (task, iteration, thread name) in call order."""

    def __init__(self):
        self.calls = []
        self._counter = itertools.count()

    def fn(self, name, body=None):
        def run(ctx):
            self.calls.append((next(self._counter), name, ctx.iter_idx, threading.current_thread().name))
            if body is not None:
                body(ctx)
        run.__name__ = name
        return run

    def by_task(self):
        out = {}
        for _, name, i, _ in self.calls:
            out.setdefault(name, []).append(i)
        return out


def three_stage_plan(log):
    """SparseDist's shape: H2D(0, io) -> DistStart/DistWait(1, dist) -> Fwd/Bwd/Opt(2, compute)."""
    t = {n: PipelineTask(n, log.fn(n)) for n in ["H2D", "DistStart", "DistWait", "Fwd", "Bwd", "Opt"]}
    return PipelinePlan(
        schedule={
            t["H2D"]: TaskSchedule(0, "memcpy", "io"),
            t["DistStart"]: TaskSchedule(1, "data_dist", "dist", globally_ordered=True),
            t["DistWait"]: TaskSchedule(1, "data_dist", "dist"),
            t["Fwd"]: TaskSchedule(2, None, "compute"),
            t["Bwd"]: TaskSchedule(2, None, "compute"),
            t["Opt"]: TaskSchedule(2, None, "compute"),
        },
        intra_iter_deps=[("DistStart", "H2D"), ("DistWait", "DistStart"), ("Fwd", "DistWait"),
                         ("Bwd", "Fwd"), ("Opt", "Bwd")],
    )


def test_progress_retires_iterations_in_order_and_runs_every_task_once():
    log = Log()
    pipe = SWPipeline(three_stage_plan(log), device="cpu")
    assert drive(pipe, range(7)) == list(range(7))
    for name, iters in log.by_task().items():
        assert sorted(iters) == list(range(7)), name
    assert swpipe_threads() == []


def test_tasks_run_on_their_named_thread_group():
    log = Log()
    pipe = SWPipeline(three_stage_plan(log), device="cpu")
    pipe.run(range(3))
    groups = {name: pipe.plan.sched(name).thread_group for name in pipe.plan.task_names}
    for _, name, _, thread in log.calls:
        assert thread == f"swpipe-{groups[name]}"


def test_period_runs_iteration_period_minus_stage():
    """After fill (3 periods of a depth-3 plan) stage s has run iterations 0 .. 2-s."""
    log = Log()
    pipe = SWPipeline(three_stage_plan(log), device="cpu")
    it = pipe.fill_pipeline(range(10))
    assert pipe.in_flight == 3
    first = pipe.progress(it)  # waits iteration 0, which needs all of period 2
    assert first == 0
    seen = log.by_task()
    assert seen["H2D"][:3] == [0, 1, 2]
    assert 0 in seen["Opt"]
    pipe.drain()
    seen = log.by_task()
    # drain retires everything in flight but fetches nothing new: iterations 0..3 complete
    assert all(sorted(v) == [0, 1, 2, 3] for v in seen.values()), seen
    assert pipe.in_flight == 0 and swpipe_threads() == []


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_iterables_shorter_than_depth(n):
    log = Log()
    pipe = SWPipeline(three_stage_plan(log), device="cpu")
    assert drive(pipe, iter(range(n))) == list(range(n))
    assert all(sorted(v) == list(range(n)) for v in log.by_task().values())
    assert len(log.calls) == 6 * n
    with pytest.raises(StopIteration):
        pipe.progress()
    assert swpipe_threads() == []


def test_fill_twice_without_drain_raises_and_keeps_the_first_run():
    log = Log()
    pipe = SWPipeline(three_stage_plan(log), device="cpu")
    it = pipe.fill_pipeline(range(5))
    with pytest.raises(RuntimeError, match="drain"):
        pipe.fill_pipeline(range(5))
    assert pipe.in_flight == 3
    rest = []
    while True:
        try:
            rest.append(pipe.progress(it))
        except StopIteration:
            break
    assert rest == [0, 1, 2, 3, 4]


def test_drain_then_fill_again_works():
    log = Log()
    pipe = SWPipeline(three_stage_plan(log), device="cpu")
    it = pipe.fill_pipeline(range(100))
    pipe.progress(it)
    pipe.drain()
    assert swpipe_threads() == [] and pipe.in_flight == 0
    log.calls.clear()
    assert drive(pipe, range(4)) == [0, 1, 2, 3]
    assert all(sorted(v) == [0, 1, 2, 3] for v in log.by_task().values())


def test_fill_after_natural_end_needs_no_drain():
    pipe = SWPipeline(three_stage_plan(Log()), device="cpu")
    assert drive(pipe, range(2)) == [0, 1]
    assert drive(pipe, range(3)) == [0, 1, 2]


def test_progress_none_drains_without_new_data():
    log = Log()
    pipe = SWPipeline(three_stage_plan(log), device="cpu")
    it = pipe.fill_pipeline(range(50))
    assert pipe.progress(it) == 0
    assert [pipe.progress(None) for _ in range(3)] == [1, 2, 3]
    with pytest.raises(StopIteration):
        pipe.progress(None)
    assert sorted(log.by_task()["Opt"]) == [0, 1, 2, 3]
    assert next(it) == 4  # nothing beyond iteration 3 was taken from the data


def test_progress_after_progress_none_with_data_raises():
    pipe = SWPipeline(three_stage_plan(Log()), device="cpu")
    it = pipe.fill_pipeline(range(50))
    pipe.progress(None)
    with pytest.raises(RuntimeError, match="draining"):
        pipe.progress(it)
    pipe.drain()
    assert swpipe_threads() == []


def test_progress_with_another_iterator_raises():
    pipe = SWPipeline(three_stage_plan(Log()), device="cpu")
    it = pipe.fill_pipeline(range(10))
    with pytest.raises(RuntimeError, match=r"drain\(\)"):  # the call to make first
        pipe.progress(iter(range(10)))
    assert pipe.progress(it) == 0
    pipe.drain()


def test_progress_accepts_the_original_iterable():
    data = list(range(4))
    pipe = SWPipeline(three_stage_plan(Log()), device="cpu")
    pipe.fill_pipeline(data)
    assert [pipe.progress(data) for _ in range(4)] == [0, 1, 2, 3]
    pipe.drain()


def test_progress_before_fill_raises():
    pipe = SWPipeline(three_stage_plan(Log()), device="cpu")
    with pytest.raises(RuntimeError, match="fill_pipeline"):
        pipe.progress()


def test_inter_dependency_distance_n_honoured_and_first_n_wait_nothing():
    """Acc(i) waits Acc(i-2): the running value reads what was written two iterations earlier."""
    values = {}

    def acc(ctx):
        prev = values.get(ctx.iter_idx - 2, 0)
        values[ctx.iter_idx] = prev + ctx.batch

    src = PipelineTask("Src", lambda ctx: None)
    plan = PipelinePlan({src: TaskSchedule(0, thread_group="io"),
                         PipelineTask("Acc", acc): TaskSchedule(1, thread_group="compute")},
                        intra_iter_deps=[("Acc", "Src")], inter_iter_deps=[("Acc", "Acc", 2), ("Src", "Acc", 1)])
    pipe = SWPipeline(plan, device="cpu", record_timeline=True)
    pipe.run(range(1, 9))
    assert values == {0: 1, 1: 2, 2: 4, 3: 6, 4: 9, 5: 12, 6: 16, 7: 20}
    ev = {(e.task, e.iteration): e for e in pipe.timeline}
    for i in range(2, 8):
        assert ev[("Acc", i)].start >= ev[("Acc", i - 2)].end
    for i in range(1, 8):
        assert ev[("Src", i)].start >= ev[("Acc", i - 1)].end


def test_run_returns_wall_seconds_and_logs_when_verbose(caplog, monkeypatch):
    import swpipe_core.engine.pipeline as pipeline
    from conftest import FakeClock

    clock = FakeClock()  # the engine's clock, moved only by Fwd: the run's wall time is Fwd's four half seconds
    monkeypatch.setattr(pipeline, "time", clock)
    log = Log()
    pipe = SWPipeline(three_stage_plan(log).bind({"Fwd": log.fn("Fwd", lambda ctx: clock.advance(0.5))}), device="cpu")
    with caplog.at_level(logging.INFO, logger="swpipe_core.engine.pipeline"):
        elapsed = pipe.run(range(4), verbose=True, emit_nvtx=True)  # emit_nvtx: ignored on CPU
    assert isinstance(elapsed, float) and elapsed == pytest.approx(2.0)  # every task's time is inside the run's
    retired = [r.getMessage() for r in caplog.records if "retired iteration" in r.getMessage()]
    assert len(retired) == 4
    assert any("4 iteration(s)" in r.getMessage() for r in caplog.records)
    assert swpipe_threads() == []


def _verbose_lines(err, mode):
    """The iteration numbers of ``mode``'s per-iteration lines and the count its summary line gives."""
    found = [int(i) for i in re.findall(rf"^SWPipeline\.{mode}: (?:retired|finished) iteration (\d+) at [\d.]+ ms$",
                                         err, re.M)]
    summary = re.findall(rf"^SWPipeline\.{mode}: (\d+) iteration\(s\) in [\d.]+ s", err, re.M)
    return found, [int(n) for n in summary]


@pytest.mark.parametrize("mode", ["run", "run_serial"])
def test_verbose_lines_reach_stderr_where_logging_is_not_configured(capsys, monkeypatch, mode):
    monkeypatch.setattr(logging.getLogger(), "level", logging.WARNING)  # Python's default: INFO is shown nowhere
    logger = logging.getLogger("swpipe_core.engine.pipeline")
    before = (list(logger.handlers), logger.level, logger.propagate)
    pipe = SWPipeline(three_stage_plan(Log()), device="cpu")
    getattr(pipe, mode)(range(4), verbose=True)
    assert _verbose_lines(capsys.readouterr().err, mode) == ([0, 1, 2, 3], [4])  # a line per iteration, a summary
    assert (list(logger.handlers), logger.level, logger.propagate) == before  # for that run only
    getattr(pipe, mode)(range(2))
    assert _verbose_lines(capsys.readouterr().err, mode) == ([], [])  # not asked: nothing

    def fail(ctx):
        if ctx.iter_idx == 2:
            raise ValueError("bad batch")

    failing = SWPipeline(PipelinePlan({PipelineTask("A", fail): TaskSchedule(1)}), device="cpu")
    with pytest.raises(PipelineTaskError) as info:
        getattr(failing, mode)(range(5), verbose=True)
    assert (info.value.task, info.value.iteration) == ("A", 2)
    assert (list(logger.handlers), logger.level, logger.propagate) == before  # a failed run removes it too
    done, _ = _verbose_lines(capsys.readouterr().err, mode)
    assert done == list(range(len(done))) and 0 < len(done) <= 2  # the iterations before the failure, in order


def test_verbose_output_goes_to_the_users_logging_alone_where_it_shows_info(caplog, capsys, monkeypatch):
    monkeypatch.setattr(logging.getLogger(), "level", logging.WARNING)
    pipe = SWPipeline(three_stage_plan(Log()), device="cpu")
    pipe.run(range(3), verbose=True)
    assert _verbose_lines(capsys.readouterr().err, "run") == ([0, 1, 2], [3])  # logging shows no INFO: stderr
    with caplog.at_level(logging.INFO, logger="swpipe_core.engine.pipeline"):
        pipe.run(range(3), verbose=True)
    assert [r.args[0] for r in caplog.records if r.getMessage().startswith("SWPipeline.run: retired")] == [0, 1, 2]
    assert _verbose_lines(capsys.readouterr().err, "run") == ([], [])  # no second copy on stderr


def test_run_serial_runs_topologically_on_the_caller_thread(monkeypatch):
    import swpipe_core.engine.pipeline as pipeline
    from conftest import FakeClock

    clock = FakeClock()  # the engine's clock, moved only by Fwd
    monkeypatch.setattr(pipeline, "time", clock)
    log = Log()
    pipe = SWPipeline(three_stage_plan(log).bind({"Fwd": log.fn("Fwd", lambda ctx: clock.advance(0.5))}), device="cpu")
    elapsed = pipe.run_serial(range(3))
    assert elapsed == pytest.approx(1.5)  # the three iterations' Fwd, inside the call
    assert [(n, i) for _, n, i, _ in log.calls] == [
        (n, i) for i in range(3) for n in ["H2D", "DistStart", "DistWait", "Fwd", "Bwd", "Opt"]]
    assert {thread for *_, thread in log.calls} == {threading.current_thread().name}


def test_a_run_numbers_its_iterations_from_first_iter_idx_everywhere():
    """ctx.iter_idx, what progress returns and the timeline count from first_iter_idx; a run split in two at a
    drain, the second part starting where the first stopped, runs every (task, iteration) of the whole run."""
    log = Log()
    plan = three_stage_plan(log)
    # the inter-iteration dependency reaching back before the first iteration is met: the earlier run drained
    plan = plan.replace(inter_iter_deps=[("H2D", "Opt", 3)], pipeline_depth=plan.pipeline_depth)
    pipe = SWPipeline(plan, device="cpu", record_timeline=True)
    assert drive(pipe, range(4)) == [0, 1, 2, 3]
    it = pipe.fill_pipeline(range(4, 9), first_iter_idx=4)
    retired = []
    while True:
        try:
            retired.append(pipe.progress(it))
        except StopIteration:
            break
    assert retired == [4, 5, 6, 7, 8]
    assert sorted({e.iteration for e in pipe.timeline}) == [4, 5, 6, 7, 8]
    for name, iters in log.by_task().items():
        assert iters == list(range(9)), name  # each task in iteration order, continuous across the two runs
    seen = []
    one = PipelinePlan({PipelineTask("A", lambda ctx: seen.append((ctx.batch, ctx.iter_idx))): TaskSchedule()})
    SWPipeline(one, device="cpu").run("ab", first_iter_idx=7)
    SWPipeline(one, device="cpu").run_serial("cd", first_iter_idx=9)
    assert seen == [("a", 7), ("b", 8), ("c", 9), ("d", 10)]
    assert swpipe_threads() == []


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_a_first_iter_idx_that_is_no_index_is_refused_naming_the_call(bad):
    from swpipe_core.engine.options import OptionError

    pipe = SWPipeline(PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule()}), device="cpu")
    for call, name in ((pipe.fill_pipeline, "SWPipeline.fill_pipeline"), (pipe.run, "SWPipeline.run"),
                       (pipe.run_serial, "SWPipeline.run_serial")):
        with pytest.raises(OptionError) as caught:
            call(range(2), first_iter_idx=bad)
        assert (caught.value.given_to, caught.value.field, caught.value.value) == (name, "first_iter_idx", bad)
    assert pipe.in_flight == 0 and swpipe_threads() == []


def test_run_one_serial_iter_uses_the_given_batch_and_index():
    seen = []
    plan = PipelinePlan({PipelineTask("A", lambda ctx: seen.append((ctx.batch, ctx.iter_idx))): TaskSchedule(1)})
    pipe = SWPipeline(plan, device="cpu")
    pipe.run_one_serial_iter({"x": 1}, iter_idx=5)
    pipe.run_one_serial_iter("b")
    assert seen == [({"x": 1}, 5), ("b", 0)]
    assert swpipe_threads() == []


def test_serial_modes_refuse_while_pipelined_iterations_are_in_flight():
    pipe = SWPipeline(three_stage_plan(Log()), device="cpu")
    pipe.fill_pipeline(range(10))
    with pytest.raises(RuntimeError, match="drain"):
        pipe.run_one_serial_iter(0)
    with pytest.raises(RuntimeError, match="drain"):
        pipe.run_serial(range(2))
    pipe.drain()
    pipe.run_one_serial_iter(0)


def test_unbound_plan_constructs_but_refuses_to_run_naming_tasks():
    plan = PipelinePlan({"H2D": TaskSchedule(0), PipelineTask("Fwd", print): TaskSchedule(1)},
                        intra_iter_deps=[("Fwd", "H2D")])
    pipe = SWPipeline(plan, device="cpu")
    assert "H2D" in repr(pipe)
    for call in (lambda: pipe.fill_pipeline([1]), lambda: pipe.run([1]), lambda: pipe.run_serial([1]),
                 lambda: pipe.run_one_serial_iter(1)):
        with pytest.raises(PlanError, match=r"unbound-task.*H2D") as info:
            call()
        assert info.value.tasks == ["H2D"] and "bind" in info.value.fix
    assert swpipe_threads() == []


def test_invalid_plan_rejected_at_construction():
    plan = PipelinePlan({"A": TaskSchedule(1), "B": TaskSchedule(0)}, intra_iter_deps=[("B", "A")])
    with pytest.raises(PlanError, match="corollary-1"):
        SWPipeline(plan, device="cpu")


def test_infinite_timeouts_mean_no_limit():
    pipe = SWPipeline(three_stage_plan(Log()), device="cpu",
                      timeouts=Timeouts(signal_s=float("inf"), sequencer_s=float("inf"), progress_s=float("inf")))
    assert pipe.run(range(3)) > 0 and pipe.timeouts.progress_s == threading.TIMEOUT_MAX


@pytest.mark.parametrize("bad", [0, -1.0, "5", float("nan"), True])
def test_bad_timeout_rejected(bad):
    with pytest.raises(ValueError) as info:  # an OptionError: a ValueError and a TypeError
        Timeouts(signal_s=bad)
    assert (info.value.given_to, info.value.field) == ("Timeouts", "signal_s")


@pytest.mark.parametrize("keyword, home, fix", [
    ("signal_timeout", "Timeouts", "SWPipeline(plan, timeouts=Timeouts(signal_s=5))"),
    ("progress_s", "Timeouts", "SWPipeline(plan, timeouts=Timeouts(progress_s=5))"),
    ("emit_nvtx", "SWPipeline.run", "pipe.run(data, emit_nvtx=5)"),
    ("num_measure", "TaskProfiler", "TaskProfiler(pipe, num_measure=5)"),
    ("calibrate", "TaskProfiler", "TaskProfiler(pipe, calibrate=5)"),
    ("skip_tasks", "TaskProfiler.profile", "TaskProfiler(pipe).profile(batch, skip_tasks=5)"),
    ("strikt", None, "did you mean strict=5?"),
])
def test_a_keyword_swpipeline_does_not_take_names_its_home(keyword, home, fix):
    from swpipe_core.engine.options import OptionError

    with pytest.raises(OptionError) as info:
        SWPipeline(three_stage_plan(Log()), device="cpu", **{keyword: 5})
    assert (info.value.given_to, info.value.field, info.value.value) == ("SWPipeline", keyword, 5)
    assert (info.value.home, info.value.fix) == (home, fix)
    assert isinstance(info.value, TypeError)  # what an unexpected keyword always raised


def test_device_integer_falls_back_to_cpu_without_cuda():
    pipe = SWPipeline(three_stage_plan(Log()), device=0)
    expected = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert pipe.device == expected


def test_explicit_cuda_device_without_cuda_raises():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(RuntimeError, match=r"cuda:0.*device='cpu'"):  # the device asked for, the one to use
        SWPipeline(three_stage_plan(Log()), device="cuda:0")


def test_retired_contexts_are_released_and_at_most_depth_alive():
    refs = []

    def keep(ctx):
        if ctx.iter_idx >= len(refs):
            refs.append(weakref.ref(ctx))
        ctx.payload = bytearray(1024)

    plan = PipelinePlan({PipelineTask("A", keep): TaskSchedule(0, thread_group="io"),
                         PipelineTask("B", lambda ctx: None): TaskSchedule(1, thread_group="compute"),
                         PipelineTask("C", lambda ctx: None): TaskSchedule(2)},
                        intra_iter_deps=[("B", "A"), ("C", "B")])
    pipe = SWPipeline(plan, device="cpu")
    it = pipe.fill_pipeline(range(30))
    max_alive = 0
    while True:
        try:
            idx = pipe.progress(it)
        except StopIteration:
            break
        # no gc.collect(): the release is by reference count, the moment progress() returns
        assert refs[idx]() is None, f"context of retired iteration {idx} is still alive"
        max_alive = max(max_alive, sum(r() is not None for r in refs))
    assert max_alive <= plan.pipeline_depth
    gc.collect()
    assert all(r() is None for r in refs)


def test_context_manager_closes_workers_and_cancels_in_flight_work():
    log = Log()
    with SWPipeline(three_stage_plan(log), device="cpu") as pipe:
        pipe.fill_pipeline(range(100))
        assert pipe.worker_threads
    assert swpipe_threads() == [] and pipe.in_flight == 0
    assert len(log.calls) < 6 * 100
    assert drive(pipe, range(2)) == [0, 1]  # still usable after close


def test_every_mode_runs_its_tasks_through_instrument():
    """The profiler, memory and calibration measure through instrument(); every mode must go through it."""
    log = Log()
    pipe = SWPipeline(three_stage_plan(log), device="cpu")
    seen = []
    with pipe.instrument(lambda run, task, ctx: (seen.append((task.name, ctx.iter_idx)), run(task, ctx))):
        pipe.run(range(2))
        pipe.run_serial(range(2))
        pipe.run_one_serial_iter(0, iter_idx=9)
    assert len(seen) == len(log.calls) == 6 * 5
    assert ("Opt", 9) in seen


def test_shortcut_replays_cache_and_unknown_name_raises():
    calls = []

    def fwd(ctx):
        calls.append(ctx.iter_idx)
        ctx.y = ctx.batch * 2

    out = []
    plan = PipelinePlan({PipelineTask("Fwd", fwd): TaskSchedule(0),
                         PipelineTask("Use", lambda ctx: out.append(ctx.y)): TaskSchedule(1, thread_group="t2")},
                        intra_iter_deps=[("Use", "Fwd")])
    pipe = SWPipeline(plan, device="cpu")
    with pytest.raises(ValueError, match=r"\['Nope'\]"):
        pipe.enable_shortcut("Nope")
    pipe.enable_shortcut("Fwd")
    assert pipe.shortcuts == ["Fwd"] and "shortcuts=['Fwd']" in repr(pipe)
    pipe.run([1, 2, 3])
    assert calls == [0] and out == [2, 2, 2]  # cached on iteration 0, replayed after
    pipe.disable_shortcut("Fwd")
    pipe.run([5])
    assert calls == [0, 0] and out[-1] == 10


def test_shortcut_change_refused_while_in_flight():
    pipe = SWPipeline(three_stage_plan(Log()), device="cpu")
    pipe.fill_pipeline(range(10))
    with pytest.raises(RuntimeError, match="drain"):
        pipe.enable_shortcut("Fwd")
    pipe.drain()
    pipe.enable_shortcut("Fwd")


def test_format_and_print_schedule_delegate_to_analysis(capsys):
    pipe = SWPipeline(three_stage_plan(Log()), device="cpu")
    text = pipe.format_schedule(4)
    assert "P3" in text and "DistStart" in text
    pipe.print_schedule(4)
    assert capsys.readouterr().out.strip() == text.strip()
    pipe.print_stage_analysis()
    assert "LDS" in capsys.readouterr().out
    assert repr(pipe).startswith("SWPipeline(device=cpu, depth=3")


def test_timeline_recorded_per_task_and_exported():
    log = Log()
    pipe = SWPipeline(three_stage_plan(log), device="cpu", record_timeline=True)
    pipe.run(range(5))
    events = pipe.timeline
    assert len(events) == 30
    assert {(e.task, e.iteration) for e in events} == {(n, i) for n in pipe.plan.task_names for i in range(5)}
    assert all(0 <= e.start <= e.end for e in events)
    assert {e.thread_group for e in events} == {"io", "dist", "compute"}
    trace = to_chrome_trace(events)
    assert sum(1 for e in trace["traceEvents"] if e["ph"] == "X") == 30
    pipe.run_serial(range(2))
    assert {e.thread_group for e in pipe.timeline} == {"serial"} and len(pipe.timeline) == 12


def test_timeline_without_recording_raises():
    with pytest.raises(RuntimeError, match="record_timeline=True"):
        SWPipeline(three_stage_plan(Log()), device="cpu").timeline


def test_profiler_shows_pipelined_and_serial_ranges():
    pipe = SWPipeline(three_stage_plan(Log()), device="cpu")
    # torch's own (private) switch for recording every thread: the workers' ranges are what is checked
    cfg = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], experimental_config=cfg) as prof:
        pipe.run(range(2))
        pipe.run_serial(range(1))
    names = {e.name for e in prof.events()}
    assert "SWP/Fwd/iter1" in names and "SWP/H2D/iter0" in names
    assert "SWP_serial/Opt/iter0" in names


def test_no_profiler_ranges_when_profiler_is_off(monkeypatch):
    """The hot path builds no range names when nothing records them."""
    from swpipe_core.engine.dispatch import Dispatch, profiler_active

    built = []
    original = Dispatch.range_name
    monkeypatch.setattr(Dispatch, "range_name", lambda self, *a: built.append(a) or original(self, *a))
    SWPipeline(three_stage_plan(Log()), device="cpu").run(range(3))
    assert built == [] and profiler_active() is False


def test_globally_ordered_tasks_follow_enqueue_order_across_threads():
    """Two groups each issue 'collectives'; their global order is the enqueue order every period."""
    order = []
    lock = threading.Lock()

    def coll(name):
        def fn(ctx):
            with lock:
                order.append((name, ctx.iter_idx))
        return fn

    plan = PipelinePlan({PipelineTask("A2A", coll("A2A")): TaskSchedule(0, "dist", "io", globally_ordered=True),
                         PipelineTask("AllReduce", coll("AllReduce")): TaskSchedule(1, None, "compute", globally_ordered=True),
                         PipelineTask("Fwd", lambda ctx: None): TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("Fwd", "A2A"), ("AllReduce", "Fwd")])
    pipe = SWPipeline(plan, device="cpu")
    pipe.run(range(20))
    from swpipe_core.walk import PeriodWalk

    assert order == [x for x in PeriodWalk(plan).sequence(20) if x[0] in ("A2A", "AllReduce")]


def test_iter_context_is_fresh_per_iteration():
    seen = []
    plan = PipelinePlan({PipelineTask("W", lambda ctx: setattr(ctx, "v", ctx.batch)): TaskSchedule(0),
                         PipelineTask("R", lambda ctx: seen.append((ctx.v, type(ctx)))): TaskSchedule(1, thread_group="r")},
                        intra_iter_deps=[("R", "W")])
    SWPipeline(plan, device="cpu").run(["a", "b", "c"])
    assert seen == [("a", IterContext), ("b", IterContext), ("c", IterContext)]


def test_signal_flag_wakes_every_waiter_and_tolerates_concurrent_sets():
    from swpipe_core.engine.tasks import Flag

    flag = Flag()
    assert flag.wait(0.01) is False
    woke = []
    waiters = [threading.Thread(target=lambda: woke.append(flag.wait(10)), name=f"flag-{k}") for k in range(4)]
    for t in waiters:
        t.start()
    setters = [threading.Thread(target=flag.set, name=f"flag-set-{k}") for k in range(4)]
    for t in setters:
        t.start()
    for t in setters + waiters:
        t.join(10)
    assert woke == [True] * 4 and flag.is_set and flag.wait(0) is True
    flag.set()  # idempotent
