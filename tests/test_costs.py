"""Cost models: the JSON schema, clear errors for bad files, builders and what-if edits."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from autosched.model.costs import SCHEMA, CostModel, CostModelError, TaskCost
from swpipe_core.plan import PipelinePlan, TaskSchedule
from swpipe_core.measure.result import ProfileResult

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COST_DIR = os.path.join(ROOT, "cost_models")


def _write(tmp_path, doc, name="c.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def _doc(**over):
    doc = {"schema": SCHEMA, "version": 1, "machine": "m", "method": "by hand",
           "tasks": {"A": {"host_s": 0.001, "device_s": 0.002, "resources": ["comm:nccl"]}, "B": {"host_s": 0.003}}}
    doc.update(over)
    return doc


def test_save_load_round_trip_keeps_every_field(tmp_path):
    m = CostModel({"A": TaskCost(0.001, 0.002, ("comm:nccl", "pcie")), "B": TaskCost(0.003)},
                  machine="2-core CPU", method="by hand", notes="n", pipeline="base")
    path = str(tmp_path / "m.json")
    m.save(path)
    back = CostModel.load(path)
    assert back == m
    assert json.load(open(path))["version"] == 1


@pytest.mark.parametrize("doc, where, what", [
    (_doc(tasks={"A": {"host_s": -0.001}}), "tasks.A.host_s", "negative cost"),
    (_doc(tasks={"A": {"host_s": 0.001, "device_s": -1}}), "tasks.A.device_s", "negative cost"),
    (_doc(tasks={"A": {"host_s": 0.001, "gpu_s": 0.1}}), "tasks.A", "unknown field(s) ['gpu_s']"),
    (_doc(tasks={"A": {"device_s": 0.001}}), "tasks.A", "missing host_s"),
    (_doc(tasks={"A": {"host_s": "fast"}}), "tasks.A.host_s", "not a number"),
    (_doc(tasks={"A": {"host_s": 0.001, "resources": ["nvlink"]}}), "tasks.A.resources",
     "unknown resource tag 'nvlink'"),
    (_doc(tasks={"A": {"host_s": 0.001, "resources": "pcie"}}), "tasks.A.resources", "not a list"),
    (_doc(tasks={}), "tasks", "not a non-empty object"),
    (_doc(version=4), "version", "version 4 is not supported"),
    (_doc(version=2, cores=2), "version", "in a version 2 file"),
    (_doc(version=1, cores=2), "version", "in a version 1 file"),
    (_doc(version=2, tasks={"A": {"host_s": 0.001, "resources": ["nocore"]}}), "version", '"nocore" tag) in a version 2'),
    (_doc(version=3, cores=0), "cores", "not an integer >= 1"),
    (_doc(version=3, cores=1.5), "cores", "not an integer >= 1"),
    (_doc(version=3, cores=True), "cores", "not an integer >= 1"),
    (_doc(version=3, cores="2"), "cores", "not an integer >= 1"),
    (_doc(schema="something-else"), "schema", "expected 'swpipe-cost-model'"),
    (_doc(extra=1), "top level", "unknown field(s) ['extra']"),
    (_doc(machine=3), "machine", "not a string"),
])
def test_load_rejects_a_bad_file_naming_file_field_and_fix(tmp_path, doc, where, what):
    path = _write(tmp_path, doc)
    with pytest.raises(CostModelError) as err:
        CostModel.load(path)
    msg = str(err.value)
    assert path in msg and where in msg and what in msg and "Fix:" in msg


def test_core_pool_round_trips_as_version_3_and_older_versions_still_load(tmp_path):
    m = CostModel({"A": TaskCost(0.001), "B": TaskCost(0.002, 0.0, ("pcie",))}, machine="m", cores=2)
    path = str(tmp_path / "pool.json")
    m.save(path)
    doc = json.load(open(path))
    assert doc["version"] == 3 and doc["cores"] == 2
    back = CostModel.load(path)
    assert back == m and back.cores == 2
    # a what-if edit keeps the pool
    assert back.scaled("A", 2.0).cores == 2 and back.replace("B", host_s=0.003).cores == 2
    blocking = CostModel({"A": TaskCost(0.001, 0.0, ("nocore",))})
    assert blocking.to_dict()["version"] == 3 and "cores" not in blocking.to_dict()
    assert CostModel.from_dict(blocking.to_dict()) == blocking
    for version in (1, 2):
        old = CostModel.load(_write(tmp_path, _doc(version=version), f"v{version}.json"))
        assert old.cores is None and old["B"].host_s == 0.003
        assert old.to_dict()["version"] == 1 and "cores" not in old.to_dict()


@pytest.mark.parametrize("cores", [0, -1, 1.5, True, "2"])
def test_cost_model_rejects_a_bad_core_pool(cores):
    with pytest.raises(CostModelError) as err:
        CostModel({"A": TaskCost(0.001)}, cores=cores)
    assert (err.value.field, err.value.value) == ("cores", cores) and err.value.fix


def test_load_rejects_invalid_json(tmp_path):
    path = _write(tmp_path, '{"schema": "swpipe-cost-model", "version": 1, "tasks": {')
    with pytest.raises(CostModelError, match="JSON") as err:
        CostModel.load(path)
    assert (err.value.source, err.value.field) == (str(path), "")  # the file, as a whole


def test_load_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        CostModel.load(str(tmp_path / "nope.json"))


def test_check_names_the_tasks_without_a_cost():
    plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(1), "C": TaskSchedule(1)})
    with pytest.raises(CostModelError) as err:
        CostModel({"A": TaskCost(0.001)}).check(plan)
    assert "['B', 'C']" in str(err.value)
    CostModel({"A": TaskCost(0.001), "B": TaskCost(0), "C": TaskCost(0), "Extra": TaskCost(1)}).check(plan)


def test_simulating_with_a_missing_cost_fails_before_running():
    from autosched.model.simulate import simulate

    plan = PipelinePlan({"A": TaskSchedule(0), "B": TaskSchedule(0)})
    with pytest.raises(CostModelError, match="'B'"):
        simulate(plan, CostModel({"A": TaskCost(0.001)}))


@pytest.mark.parametrize("kwargs, what", [
    (dict(host_s=-1.0), "negative cost"),
    (dict(host_s=float("nan")), "not finite"),
    (dict(host_s=True), "not a number"),
    (dict(host_s=0.0, resources=("comm:",)), "unknown resource tag"),
    (dict(host_s=0.0, resources=("pcie", "pcie")), "repeat"),
])
def test_task_cost_rejects_bad_values(kwargs, what):
    with pytest.raises(CostModelError, match=what):
        TaskCost(**kwargs)


def test_cpu_time_is_host_plus_device_and_comms_are_named():
    c = TaskCost(0.001, 0.002, ("comm:nccl", "pcie", "comm:gloo"))
    assert c.cpu_s == pytest.approx(0.003)
    assert c.comms == ("nccl", "gloo")


def test_from_profile_uses_exposed_time_as_host_time():
    r = ProfileResult(baseline_s=0.01, exposed_s={"A": 0.004, "B": 0.0})
    m = CostModel.from_profile(r, machine="box")
    assert m["A"] == TaskCost(0.004) and m["B"] == TaskCost(0.0)
    assert m.machine == "box" and "exposed" in m.method


def test_from_profile_prefers_measured_host_and_device_times():
    r = ProfileResult(baseline_s=0.01, exposed_s={"A": 0.004}, host_s={"A": 0.001}, device_s={"A": 0.003})
    assert CostModel.from_profile(r)["A"] == TaskCost(0.001, 0.003)


def test_from_timeline_takes_the_median_per_task_and_kind():
    ev = [SimpleNamespace(task="A", kind="host", start=0.0, end=d) for d in (0.001, 0.010, 0.002)]
    ev += [SimpleNamespace(task="A", kind="device", start=1.0, end=1.0 + d) for d in (0.004, 0.005)]
    ev += [SimpleNamespace(task="B", kind="host", start=0.5, end=0.503)]
    m = CostModel.from_timeline(ev, machine="x")
    assert m["A"].host_s == pytest.approx(0.002)
    assert m["A"].device_s == pytest.approx(0.0045)
    assert m["B"] == TaskCost(0.003)
    with pytest.raises(CostModelError) as err:
        CostModel.from_timeline([])
    assert err.value.field == "events"


def test_from_timeline_of_a_recorded_engine_run_costs_every_task(monkeypatch):
    import swpipe_core.engine.tasks as tasks
    from conftest import FakeClock
    from swpipe_core.engine.pipeline import SWPipeline
    from swpipe_core.plan import PipelineTask

    clock = FakeClock()  # the recorder's clock, moved only by the tasks (both on the one "default" thread)
    monkeypatch.setattr(tasks, "time", clock)
    took = iter([0.001, 0.010, 0.002, 0.003, 0.004])  # A's five executions: the median 0.003 (the mean 0.004)
    plan = PipelinePlan({PipelineTask("A", lambda ctx: clock.advance(next(took))): TaskSchedule(0),
                         PipelineTask("B", lambda ctx: None): TaskSchedule(1)}, [("B", "A")])
    with SWPipeline(plan, device="cpu", record_timeline=True) as pipe:
        pipe.run(range(5))
        m = CostModel.from_timeline(pipe.timeline)
    m.check(plan)
    assert (m["A"].host_s, m["B"].host_s) == (pytest.approx(0.003), 0.0) and m["A"].device_s == 0.0


def test_scaled_and_replace_return_new_models_and_leave_the_original():
    m = CostModel({"A": TaskCost(0.001, 0.002), "B": TaskCost(0.004)}, notes="base")
    s = m.scaled("A", 2.0)
    assert s["A"] == TaskCost(0.002, 0.004) and s["B"] == m["B"] and m["A"] == TaskCost(0.001, 0.002)
    assert m.scaled(None, 0.5, part="host")["B"].host_s == pytest.approx(0.002)
    assert m.scaled("A", 3, part="device")["A"] == TaskCost(0.001, 0.006)
    r = m.replace("B", device_s=0.001, resources=["pcie"])
    assert r["B"] == TaskCost(0.004, 0.001, ("pcie",)) and m["B"] == TaskCost(0.004)
    assert "what-if" in r.notes
    with pytest.raises(KeyError, match="'Z'"):
        m.scaled("Z", 2)
    with pytest.raises(CostModelError) as err:
        m.replace("A", speed=1)
    assert (err.value.task, err.value.value) == ("A", ["speed"])
    with pytest.raises(CostModelError) as err:
        m.scaled("A", -1)
    assert (err.value.field, err.value.value) == ("factor", -1)


def _shipped():
    out = []
    for root, _, files in os.walk(COST_DIR):
        out += [os.path.relpath(os.path.join(root, f), COST_DIR) for f in files if f.endswith(".json")]
    return sorted(out)


def test_every_torchrec_pipeline_has_a_hand_written_cost_model():
    from swpipe_core import pipelines

    hand = {f[:-5] for f in _shipped() if os.sep not in f}
    assert set(pipelines.PIPELINES) <= hand
    for name in pipelines.PIPELINES:
        # the method's wording is the behaviour: it is what tells a shipped hand-written model from a measured one
        assert CostModel.load(os.path.join(COST_DIR, f"{name}.json")).method == "by hand"


@pytest.mark.parametrize("path", _shipped())
def test_shipped_cost_model_loads_states_its_source_and_covers_its_pipeline(path):
    from swpipe_core import pipelines

    m = CostModel.load(os.path.join(COST_DIR, path))
    assert m.machine and m.method and m.notes
    if m.pipeline:
        m.check(pipelines.get(m.pipeline))


def test_readme_version_3_example_loads_with_its_core_pool():
    import re

    text = open(os.path.join(COST_DIR, "README.md")).read()
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", text, re.S)]
    v3 = [b for b in blocks if b["version"] == 3]
    assert v3, "cost_models/README.md shows a version 3 example"
    assert CostModel.from_dict(v3[0]).cores == v3[0]["cores"]
