"""Timeline events and their Chrome/Perfetto trace export."""

from __future__ import annotations

import json

import pytest

from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.measure.trace import TimelineEvent, TimelineRecorder, read_chrome_trace, to_chrome_trace, write_chrome_trace


def events():
    return [TimelineEvent("H2D", 0, "io", "memcpy", 0.0, 0.001),
            TimelineEvent("Fwd", 0, "compute", "default", 0.001, 0.004),
            TimelineEvent("H2D", 1, "io", "memcpy", 0.001, 0.002),
            TimelineEvent("Fwd", 0, "compute", "default", 0.0015, 0.0035, "device")]


def test_one_track_per_thread_group_and_per_stream():
    trace = to_chrome_trace(events(), name="demo")
    meta = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert sorted(meta.values()) == ["stream default", "thread compute", "thread io"]
    procs = sorted(e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name")
    assert procs == ["demo device", "demo host"]
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(x["name"], x["ts"], x["dur"]) for x in xs] == [
        ("H2D/iter0", 0.0, 1000.0), ("Fwd/iter0", 1000.0, 3000.0), ("H2D/iter1", 1000.0, 1000.0), ("Fwd/iter0", 1500.0, 2000.0)]
    io_tid = next(t for (p, t), n in meta.items() if n == "thread io")
    assert {x["tid"] for x in xs if x["args"]["thread_group"] == "io"} == {io_tid}


def test_round_trip_through_a_file(tmp_path):
    path = write_chrome_trace(events(), tmp_path / "t.json")
    data = json.loads(open(path).read())
    assert data["displayTimeUnit"] == "ms" and data["otherData"]["name"] == "swpipe"
    back = read_chrome_trace(path)
    assert [(e.task, e.iteration, e.thread_group, e.stream, e.kind) for e in back] == \
        [(e.task, e.iteration, e.thread_group, e.stream, e.kind) for e in events()]
    assert all(abs(a.start - b.start) < 1e-6 and abs(a.end - b.end) < 1e-6 for a, b in zip(back, events()))


def test_bad_kind_and_bad_file_rejected(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        to_chrome_trace([TimelineEvent("A", 0, "g", "s", 0, 1, "gpu")])
    bad = tmp_path / "bad.json"
    bad.write_text('{"foo": 1}')
    with pytest.raises(ValueError, match="traceEvents"):
        read_chrome_trace(bad)


def test_recorder_times_are_relative_to_origin():
    rec = TimelineRecorder(origin=10.0)
    rec.record("A", 2, "g", "s", 10.25, 10.5)
    assert rec.events == [TimelineEvent("A", 2, "g", "s", 0.25, 0.5)]
    rec.clear(origin=0.0)
    assert rec.events == [] and rec.origin == 0.0


def test_engine_timeline_exports_to_a_loadable_trace(tmp_path):
    plan = PipelinePlan({PipelineTask("Load", lambda ctx: None): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Step", lambda ctx: None): TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("Step", "Load")])
    pipe = SWPipeline(plan, device="cpu", record_timeline=True)
    pipe.run(range(6))
    path = write_chrome_trace(pipe.timeline, tmp_path / "run.json")
    back = read_chrome_trace(path)
    assert len(back) == 12
    assert {(e.task, e.thread_group, e.stream) for e in back} == {("Load", "io", "memcpy"), ("Step", "compute", "default")}
    for i in range(6):
        load = next(e for e in back if e.task == "Load" and e.iteration == i)
        step = next(e for e in back if e.task == "Step" and e.iteration == i)
        assert step.start >= load.end - 1e-6  # microsecond rounding in the file
