"""TaskProfiler and ProfileResult: exposed-time accuracy, phases, syncs, report, persistence."""

from __future__ import annotations

import contextlib
import json
import math
import time

import pytest
import torch

from swpipe_core.plan import IterContext, PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.measure.profiler import TaskProfiler
from swpipe_core.measure.result import ProfileResult
from conftest import FakeClock


def _work(seconds, clock=None):
    """A task that takes ``seconds``: on ``clock`` (the profiler's, faked) when given, else a real sleep."""
    def fn(ctx):
        if clock is None:
            time.sleep(seconds)  # the workload
        else:
            clock.advance(seconds)
        ctx.out = getattr(ctx, "out", 0) + 1
    return fn


def _serial_plan(costs, clock=None):
    """A one-stage plan of tasks of the given lengths, run one after another."""
    names = list(costs)
    schedule = {PipelineTask(n, _work(s, clock)): TaskSchedule() for n, s in costs.items()}
    return PipelinePlan(schedule=schedule, intra_iter_deps=list(zip(names[1:], names[:-1])))


@pytest.fixture
def clock(monkeypatch):
    """The profiler's clock, moved only by the tasks: what it measures is exactly what they take."""
    import swpipe_core.measure.profiler as profiler

    fake = FakeClock()
    monkeypatch.setattr(profiler, "time", fake)
    return fake


class FakePipe:
    """The slice of SWPipeline the profiler uses, with a device it can pretend to have."""

    def __init__(self, plan, device="cpu"):
        from swpipe import Timeouts
        from swpipe_core.engine.dispatch import Dispatch
        from swpipe_core.engine.streams import StreamPool

        self.plan = plan
        self.streams = StreamPool(device)
        self.device = self.streams.device
        self.timeouts = Timeouts()
        self.dispatch = Dispatch()  # the engine's own: instrument() wrappers and shortcuts as the engine runs them
        self.iterations = 0

    @property
    def shortcuts(self):
        return sorted(self.dispatch.shortcut.tasks)

    @property
    def cached_shortcuts(self):
        return sorted(self.dispatch.shortcut.cached)

    @property
    def instruments(self):
        return self.dispatch.wrappers

    def enable_shortcut(self, *names):
        self.dispatch.shortcut.enable(names)

    def disable_shortcut(self, *names):
        self.dispatch.shortcut.disable(names)

    @contextlib.contextmanager
    def instrument(self, wrapper):
        token = self.dispatch.add(wrapper)
        try:
            yield wrapper
        finally:
            self.dispatch.remove(token)

    def run_one_serial_iter(self, batch, iter_idx=0):
        self.iterations += 1
        ctx = IterContext(batch, iter_idx)
        for task in self.plan.tasks:
            self.dispatch.call_serial(task, ctx)


# -- ProfileResult -----------------------------------------------------------

SPEC_REPORT = """\
Baseline serial iteration: 8.503 ms

  Task                       Exposed   % baseline
  ------------------------ ---------- ------------
  CopyBatch                  0.521ms        6.1%
  EmbLookup                  1.234ms       14.5%
  ------------------------ ---------- ------------
  SUM                        1.755ms       20.6%"""


def test_report_matches_spec_format(capsys):
    r = ProfileResult(baseline_s=0.008503, exposed_s={"CopyBatch": 0.000521, "EmbLookup": 0.001234})
    assert r.format_report() == SPEC_REPORT
    r.print_report()
    assert capsys.readouterr().out == SPEC_REPORT + "\n"


def test_report_widens_for_long_names_and_shows_overlap_above_100_percent():
    long = "InputDistStartAndWaitForEverything"
    text = ProfileResult(0.001, {long: 0.0008, "B": 0.0007}).format_report()
    lines = text.splitlines()
    assert lines[4].startswith(f"  {long} ")
    total = next(k for k, line in enumerate(lines) if line.strip().startswith("SUM"))
    assert len({len(lines[3]), len(lines[total - 1])}) == 1  # both rules equally wide
    explained = [line.split() for line in lines[total + 1:] if "baseline:" in line.split()]
    assert lines[total].endswith("150.0%") and len(explained) == 1 and "150" in explained[0]


def test_save_load_roundtrip(tmp_path):
    r = ProfileResult(0.01, {"A": 0.004}, host_s={"A": 0.005}, device_s=None, meta={"device": "cpu", "rounds": [1.0]})
    path = tmp_path / "p.json"
    r.save(path)
    assert json.loads(path.read_text())["version"] == 1
    assert ProfileResult.load(path) == r


def test_load_rejects_unknown_version(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"version": 99, "baseline_s": 1.0}))
    with pytest.raises(ValueError, match="version 99"):
        ProfileResult.load(path)


def test_to_dataframe_has_exposed_pct_host_and_device_columns():
    df = ProfileResult(0.02, {"A": 0.01, "B": 0.0}, host_s={"A": 0.012, "B": 0.003, "C": 0.001}).to_dataframe()
    assert list(df.columns) == ["exposed_s", "pct_baseline", "host_s", "device_s"]
    assert df.loc["A", "pct_baseline"] == pytest.approx(50.0)
    assert df.loc["C", "host_s"] == pytest.approx(0.001) and math.isnan(df.loc["C", "exposed_s"])
    assert df["device_s"].isna().all()


# -- TaskProfiler with a fake pipe (phases, syncs, validation) ----------------

@pytest.mark.cuda
@pytest.mark.parametrize("interleave", [True, False])
def test_two_device_syncs_per_round_on_cuda(fake_cuda, monkeypatch, interleave):
    calls = []
    pipe = FakePipe(_serial_plan({"A": 0.0, "B": 0.0, "C": 0.0}), device=fake_cuda.device(0))
    synchronize = pipe.streams.synchronize
    monkeypatch.setattr(pipe.streams, "synchronize", lambda timeout: calls.append(timeout) or synchronize(timeout))
    r = TaskProfiler(pipe, num_warmup=2, num_measure=4, num_rounds=3, interleave=interleave).profile(None,
                                                                                                  task_times=False)
    rounds = 3 * (1 + 3)  # baseline + one per task
    assert len(calls) == 2 * rounds
    caching = 3 * 3 if interleave else 3  # one untimed caching iteration per task (per round if interleaved)
    assert pipe.iterations == 2 + rounds * 4 + caching
    assert {n: len(v) for n, v in r.meta["shortcut_rounds_s"].items()} == {"A": 3, "B": 3, "C": 3}
    assert len(r.meta["baseline_rounds_s"]) == 3 and r.meta["interleave"] is interleave


def test_interleaved_rounds_rotate_task_order():
    pipe = FakePipe(_serial_plan({"A": 0.0, "B": 0.0}))
    enabled = []
    real_enable = pipe.enable_shortcut
    pipe.enable_shortcut = lambda *n: (enabled.append(n[0]), real_enable(*n))
    TaskProfiler(pipe, num_warmup=0, num_measure=1, num_rounds=3).profile(None, task_times=False)
    assert enabled == ["A", "B", "B", "A", "A", "B"]  # round r starts at task r mod 2


def test_no_device_sync_on_cpu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    TaskProfiler(FakePipe(_serial_plan({"A": 0.0})), num_warmup=1, num_measure=2, num_rounds=2).profile(None)
    assert calls == []


def test_unknown_skip_task_raises_listing_valid_names():
    pipe = FakePipe(_serial_plan({"A": 0.0, "B": 0.0}))
    with pytest.raises(ValueError, match=r"\['Nope'\].*\['A', 'B'\]"):  # the unknown task, then the valid ones
        TaskProfiler(pipe).profile(None, skip_tasks={"Nope"})


@pytest.mark.parametrize("kw", [{"num_measure": 0}, {"num_rounds": 0}, {"num_warmup": -1}, {"num_rounds": 1.5}])
def test_bad_counts_raise_naming_the_count(kw):
    from swpipe_core.engine.options import OptionError

    with pytest.raises(OptionError) as info:
        TaskProfiler(FakePipe(_serial_plan({"A": 0.0})), **kw)
    (option, value), = kw.items()
    assert (info.value.given_to, info.value.field, info.value.value) == ("TaskProfiler", option, value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("keyword, home, fix", [
    ("calibrate", "TaskProfiler", "TaskProfiler(pipe, calibrate=2)"),
    ("interleave", "TaskProfiler", "TaskProfiler(pipe, interleave=2)"),
    ("strict", "SWPipeline", "SWPipeline(plan, strict=2)"),
    ("progress_timeout", "Timeouts", "SWPipeline(plan, timeouts=Timeouts(progress_s=2))"),
    ("skip_task", None, "did you mean skip_tasks=2?"),
])
def test_a_keyword_profile_does_not_take_names_its_home(keyword, home, fix):
    from swpipe_core.engine.options import OptionError

    with pytest.raises(OptionError) as info:
        TaskProfiler(FakePipe(_serial_plan({"A": 0.0}))).profile(None, **{keyword: 2})
    assert (info.value.given_to, info.value.field, info.value.home, info.value.fix) == (
        "TaskProfiler.profile", keyword, home, fix)


def _iterations(warmup, measure, rounds, tasks):
    """Serial iterations of an interleaved profile without task times: warmup, the timed rounds of the baseline and
    of each task, and one untimed caching iteration per task per round."""
    return warmup + rounds * (1 + tasks) * measure + rounds * tasks


@pytest.mark.parametrize("call", [
    lambda prof: prof.profile(None, num_warmup=5, num_measure=20, num_rounds=5, task_times=False),  # the reference's
    lambda prof: prof.profile(None, 5, 20, 5, None, task_times=False),  # its positional form
])
def test_the_counts_a_profile_call_gives_override_the_profilers_for_that_call_only(call):
    pipe = FakePipe(_serial_plan({"A": 0.0, "B": 0.0}))
    profiler = TaskProfiler(pipe, num_warmup=1, num_measure=2, num_rounds=1)
    r = call(profiler)
    assert pipe.iterations == _iterations(5, 20, 5, tasks=2)
    assert (r.meta["num_warmup"], r.meta["num_measure"], r.meta["num_rounds"]) == (5, 20, 5)
    assert len(r.meta["baseline_rounds_s"]) == 5 and {n: len(v) for n, v in r.meta["shortcut_rounds_s"].items()} == {
        "A": 5, "B": 5}
    pipe.iterations = 0
    r = profiler.profile(None, num_measure=3, task_times=False)  # one count given: the others are the profiler's
    assert pipe.iterations == _iterations(1, 3, 1, tasks=2)
    assert (r.meta["num_warmup"], r.meta["num_measure"], r.meta["num_rounds"]) == (1, 3, 1)


def test_the_reference_positional_form_takes_skip_tasks_fifth():
    r = TaskProfiler(FakePipe(_serial_plan({"A": 0.0, "Loss": 0.0}))).profile(None, 0, 1, 1, {"Loss"})
    assert list(r.exposed_s) == ["A"] and r.meta["skip_tasks"] == ["Loss"]


def test_profile_many_takes_the_reference_counts_for_every_batch():
    pipe = FakePipe(_serial_plan({"A": 0.0}))
    results = TaskProfiler(pipe).profile_many([1, 2, 3], num_warmup=0, num_measure=2, num_rounds=2, task_times=False)
    assert [r.meta["batch_index"] for r in results] == [0, 1, 2]
    assert {(r.meta["num_warmup"], r.meta["num_measure"], r.meta["num_rounds"]) for r in results} == {(0, 2, 2)}
    assert pipe.iterations == 3 * _iterations(0, 2, 2, tasks=1)


@pytest.mark.parametrize("method", ["profile", "profile_many"])
@pytest.mark.parametrize("kw", [{"num_measure": 0}, {"num_rounds": 1.5}, {"num_warmup": -1}])
def test_a_bad_count_given_to_a_call_is_refused_before_any_iteration(method, kw):
    from swpipe_core.engine.options import OptionError

    pipe = FakePipe(_serial_plan({"A": 0.0}))
    with pytest.raises(OptionError) as info:
        getattr(TaskProfiler(pipe), method)(None if method == "profile" else [None], **kw)
    (option, value), = kw.items()
    assert (info.value.given_to, info.value.field, info.value.value) == (f"TaskProfiler.{method}", option, value)
    # the range the count takes is a field, the one the constructor's error gives: the same check for both
    assert info.value.expected == f"an integer >= {0 if option == 'num_warmup' else 1}" and pipe.iterations == 0


def test_refuses_when_a_shortcut_is_already_enabled():
    pipe = FakePipe(_serial_plan({"A": 0.0, "B": 0.0}))
    pipe.enable_shortcut("B")
    with pytest.raises(ValueError, match=r"\['B'\].*disable_shortcut\('B'\)"):  # the task, the call to make
        TaskProfiler(pipe).profile(None)


def test_skip_tasks_are_not_shortcut_but_still_timed():
    pipe = FakePipe(_serial_plan({"A": 0.0, "Loss": 0.0}))
    r = TaskProfiler(pipe, num_warmup=0, num_measure=1, num_rounds=1).profile(None, skip_tasks=["Loss"])
    assert list(r.exposed_s) == ["A"] and set(r.host_s) == {"A", "Loss"}
    assert r.meta["skip_tasks"] == ["Loss"]


def test_shortcut_disabled_after_task_failure():
    state = {"n": 0}

    def flaky(ctx):
        state["n"] += 1
        if state["n"] > 3:
            raise RuntimeError("boom")

    plan = PipelinePlan(schedule={PipelineTask("A", lambda ctx: None): TaskSchedule(), PipelineTask("F", flaky): TaskSchedule()})
    pipe = FakePipe(plan)
    with pytest.raises(RuntimeError, match="boom"):
        TaskProfiler(pipe, num_warmup=0, num_measure=2, num_rounds=1).profile(None)
    assert pipe.shortcuts == [] and pipe.cached_shortcuts == []
    assert pipe.instruments == ()  # the per-task timing wrapper is removed again


def test_progress_bar_counts_baseline_and_task_rounds(capsys):
    pipe = FakePipe(_serial_plan({"A": 0.0, "B": 0.0}))
    TaskProfiler(pipe, num_warmup=0, num_measure=1, num_rounds=2, progress=True).profile(None)
    err = capsys.readouterr().err
    assert "profile" in err and "6/6" in err  # (1 + 2 tasks) x 2 rounds


def test_profile_many_one_result_per_batch_tracks_the_data(clock):
    plan = PipelinePlan(schedule={
        PipelineTask("Work", lambda ctx: clock.advance(ctx.batch)): TaskSchedule(),
        PipelineTask("Tiny", lambda ctx: None): TaskSchedule(),
    })
    results = TaskProfiler(FakePipe(plan), num_warmup=0, num_measure=3, num_rounds=1).profile_many([0.001, 0.02])
    assert [r.meta["batch_index"] for r in results] == [0, 1]
    assert [r.exposed_s["Work"] for r in results] == pytest.approx([0.001, 0.02])


def test_cpu_records_host_time_only_and_says_so(clock):
    pipe = FakePipe(_serial_plan({"A": 0.002, "B": 0.0}, clock))
    r = TaskProfiler(pipe, num_warmup=0, num_measure=3, num_rounds=1).profile(None)
    assert r.device_s is None and r.meta["device_time"].split(":")[0].split()[-2:] == ["on", "CPU"]
    assert r.host_s == pytest.approx({"A": 0.002, "B": 0.0}) and r.meta["device"] == "cpu"


# -- TaskProfiler on the real engine -------------------------------------------

from swpipe_core.engine.pipeline import SWPipeline  # noqa: E402


def test_exposed_and_host_times_are_what_the_tasks_take(clock):
    truth = {"A": 0.005, "B": 0.010, "C": 0.020}
    with SWPipeline(_serial_plan(truth, clock), device="cpu") as pipe:
        r = TaskProfiler(pipe, num_warmup=1, num_measure=5, num_rounds=3).profile(None)
    assert r.exposed_s == pytest.approx(truth) and r.host_s == pytest.approx(truth)
    assert r.baseline_s == pytest.approx(sum(truth.values()))
    assert pipe.instruments == ()  # the per-task timing wrapper is removed again


def test_a_task_whose_time_another_wait_covers_exposes_nothing(clock):
    """A job runs 15 ms beside Start..Wait; Compute (5 ms) hides under it, Wait's wait is what skipping Wait saves."""
    def start(ctx):
        ctx.job_done_at = clock.now + 0.015

    def wait(ctx):
        clock.advance(max(0.0, ctx.job_done_at - clock.now))

    plan = PipelinePlan(
        schedule={PipelineTask("Start", start): TaskSchedule(),
                  PipelineTask("Compute", lambda ctx: clock.advance(0.005)): TaskSchedule(),
                  PipelineTask("Wait", wait): TaskSchedule()},
        intra_iter_deps=[("Compute", "Start"), ("Wait", "Compute")],
    )
    with SWPipeline(plan, device="cpu") as pipe:
        r = TaskProfiler(pipe, num_warmup=1, num_measure=5, num_rounds=3).profile(None, skip_tasks=["Start"])
    assert r.host_s["Compute"] == pytest.approx(0.005)
    assert r.exposed_s == pytest.approx({"Compute": 0.0, "Wait": 0.010})


def test_profile_multi_stage_plan_with_skip_and_backward():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def fwd(ctx):
        ctx.loss = model(ctx.batch).pow(2).mean()

    plan = PipelinePlan(
        schedule={PipelineTask("ZeroGrad", lambda ctx: opt.zero_grad()): TaskSchedule(stage=0, thread_group="io"),
                  PipelineTask("Forward", fwd): TaskSchedule(stage=1),
                  PipelineTask("Backward", lambda ctx: ctx.loss.backward()): TaskSchedule(stage=1),
                  PipelineTask("Step", lambda ctx: opt.step()): TaskSchedule(stage=1)},
        intra_iter_deps=[("Forward", "ZeroGrad"), ("Backward", "Forward"), ("Step", "Backward")],
    )
    with SWPipeline(plan, device="cpu") as pipe:
        r = TaskProfiler(pipe, num_warmup=1, num_measure=2, num_rounds=1).profile(torch.randn(16, 8),
                                                                                  skip_tasks={"Step"})
        assert pipe.shortcuts == []
    assert list(r.exposed_s) == ["ZeroGrad", "Forward", "Backward"]
    assert set(r.host_s) == {"ZeroGrad", "Forward", "Backward", "Step"}


@pytest.mark.cuda
def test_cuda_records_host_and_device_time(cuda_device, monkeypatch):
    """On the fake's virtual time (``device_clock``) a kernel's launch costs the host nothing and a spin lasts its
    seconds on the device, so each measured time is exact; on a real GPU only the keys are checked (the timings
    are ``benchmarks/profiler_host_sync.py``'s)."""
    import swpipe_core.measure.profiler as profiler
    from swpipe.testing import kernels
    from swpipe_core.engine.pipeline import SWPipeline
    from conftest import device_clock

    clock = device_clock(monkeypatch, cuda_device, profiler)
    k = kernels(cuda_device)

    def heavy(ctx):
        ctx.y = k.full(1 << 10, 1.0)
        k.spin(0.02)  # device work far longer than its launch

    plan = PipelinePlan(
        schedule={PipelineTask("Heavy", heavy): TaskSchedule(),
                  PipelineTask("Reduce", lambda ctx: setattr(ctx, "s", k.sum(ctx.y))): TaskSchedule()},
        intra_iter_deps=[("Reduce", "Heavy")],
    )
    with SWPipeline(plan, device=cuda_device) as pipe:
        r = TaskProfiler(pipe, num_warmup=1, num_measure=3, num_rounds=2).profile(None)
    assert set(r.device_s) == set(r.host_s) == set(r.exposed_s) == {"Heavy", "Reduce"}
    assert "CUDA" in r.meta["device_time"].split()  # measured with CUDA events
    if clock is not None:
        assert r.device_s == pytest.approx({"Heavy": 0.02, "Reduce": 0.0})  # the device's own work
        assert r.host_s == pytest.approx({"Heavy": 0.0, "Reduce": 0.0})  # host time is submission only
        assert r.exposed_s == pytest.approx({"Heavy": 0.02, "Reduce": 0.0})  # the serial step waits for the spin


@pytest.mark.cuda
def test_a_task_that_waits_for_the_device_is_timed_without_the_profilers_spin(cuda_device, monkeypatch):
    """``.item()`` in a task waits for everything queued on its stream; the profiler's spin must not be there.

    The device-time spin holds the stream for twice the task's host time plus 1 ms. Were it queued in the
    iterations that time the host, this task's host time would include it. Without the memory measurement,
    the profile's last ``num_measure`` executions time the device, the ``num_measure`` before them the host:
    the spin comes before each of the last ones and before no other.
    """
    import swpipe_core.measure.profiler as profiler
    from swpipe.testing import kernels
    from swpipe_core.engine.pipeline import SWPipeline
    from conftest import device_clock

    clock = device_clock(monkeypatch, cuda_device, profiler)
    k = kernels(cuda_device)
    host_work = 0.02
    log = []  # "spin" (the profiler holds the stream) and "Sync" (the task runs), in order
    spin = cuda_device.spin
    monkeypatch.setattr(cuda_device, "spin", lambda seconds: (log.append("spin"), spin(seconds))[1])

    def syncing(ctx):
        log.append("Sync")
        (clock or time).sleep(host_work)  # the workload: host work
        ctx.n = k.item(k.sum(k.full(16, 1.0)))  # then a read back: the host waits for its stream

    plan = PipelinePlan({PipelineTask("Sync", syncing): TaskSchedule()})
    with SWPipeline(plan, device=cuda_device) as pipe:
        r = TaskProfiler(pipe, num_warmup=1, num_measure=4, num_rounds=1).profile(None, memory=False)
    assert log[-12:] == ["Sync"] * 4 + ["spin", "Sync"] * 4 and log.count("spin") == 4
    assert set(r.host_s) == set(r.device_s) == {"Sync"}
    if clock is not None:  # the spin (41 ms) is in none of the host-timed iterations: the host time is the task's
        assert r.host_s["Sync"] == pytest.approx(host_work) and r.device_s["Sync"] == pytest.approx(0.0)
