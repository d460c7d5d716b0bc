"""Fuzz: random plans, valid and invalid mixed; invalid ones are refused at construction, valid ones run.

A plan *spec* (plain data: tasks with stage / stream / group / ordered
flag, dependencies, depth, policy, order) is drawn as a valid plan, then 0-2
random mutations may break it (a negative or non-integer stage, a backward
intra edge, a cycle, a self edge, an unknown task, a bad distance, a
corollary-3 gap, a wrong depth, an unknown policy, a bad or merely shuffled
enqueue order, a wrong field type). An independent reference
(:func:`reference_violations`, written from the rules as docs/semantics.md and
the table in ``src/swpipe_core/validate.py`` state them, not calling ``validate``)
says which rules the spec breaks. The properties:

* the reference finds a violation  ->  ``SWPipeline(plan)`` raises
  ``PlanError`` whose rule is one of those found;
* no violation  ->  ``SWPipeline(plan)`` builds, runs 10 iterations and every
  task runs exactly once per iteration, with no hang (short timeouts turn a
  hang into a failure).

Tasks are no-ops, so 1,000 plans take well under a minute.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any, Dict, List, Optional, Set, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swpipe import Timeouts
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.validate import RULES, PlanError

N_ITERS = 10
GROUPS = ["default", "io", "comm"]
STREAMS = [None, "memcpy", "data_dist"]
POLICIES = ("ready_first", "stage_descending")
MUTATIONS = (
    "stage_negative", "stage_type", "intra_backward", "intra_cycle", "self_dep", "unknown_dep",
    "inter_distance", "inter_gap", "depth", "policy", "order_missing", "order_dup", "order_shuffled",
    "group_empty", "group_type", "ordered_type", "stream_type", "stream_default", "dep_format", "task_ref",
)
# a hang in a valid plan becomes an error after these (the runs themselves take milliseconds)
SIGNAL_TIMEOUT, PROGRESS_TIMEOUT = 10.0, 15.0

Spec = Dict[str, Any]


# ----------------------------------------------------------------------------- generator

@st.composite
def plan_specs(draw, max_tasks: int = 6) -> Spec:
    """A valid plan spec, then (about half the time) one or two mutations that may break it."""
    n = draw(st.integers(1, max_tasks))
    names = draw(st.permutations([f"T{k}" for k in range(n)]))
    stages = sorted(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    tasks = {name: {"stage": s, "stream": draw(st.sampled_from(STREAMS)), "group": draw(st.sampled_from(GROUPS)),
                    "ordered": draw(st.booleans())} for name, s in zip(names, stages)}
    # intra edges from an earlier slot to a later one: acyclic, stage(dep) <= stage(task)
    intra = [[names[b], names[a]] for a in range(n) for b in range(a + 1, n) if draw(st.integers(0, 3)) == 0]
    inter = []
    for _ in range(draw(st.integers(0, 3))):
        t, d, dist = draw(st.sampled_from(names)), draw(st.sampled_from(names)), draw(st.integers(1, 2))
        if tasks[d]["stage"] - tasks[t]["stage"] <= dist:
            inter.append([t, d, dist])
    spec: Spec = {"tasks": tasks, "intra": intra, "inter": inter, "depth": None,
                  "policy": draw(st.sampled_from(POLICIES)), "order": None, "mutations": []}
    if draw(st.integers(0, 3)) == 0:  # a valid explicit order: stage-descending within a topological sort
        spec["order"] = _valid_order(spec)
    # the kind of mutation is drawn uniformly (hypothesis' own choices favour the first options)
    rnd = draw(st.randoms(use_true_random=False))
    if rnd.random() < 0.5:
        for _ in range(rnd.randint(1, 2)):
            _mutate(spec, rnd.choice(MUTATIONS), rnd)
    return spec


def _valid_order(spec: Spec) -> List[str]:
    """Kahn's algorithm on the period-local graph; ties by name (deterministic)."""
    names = list(spec["tasks"])
    edges = _period_local_edges(spec)
    indeg = {n: 0 for n in names}
    for _, t in edges:
        indeg[t] += 1
    order, ready = [], sorted(n for n in names if indeg[n] == 0)
    while ready:
        n = ready.pop(0)
        order.append(n)
        for d, t in edges:
            if d == n:
                indeg[t] -= 1
                if indeg[t] == 0:
                    ready.append(t)
                    ready.sort()
    return order


def _mutate(spec: Spec, kind: str, rnd: random.Random) -> None:
    """Apply one mutation in place (it may or may not break a rule; the reference decides)."""
    tasks, names = spec["tasks"], list(spec["tasks"])
    a, b = rnd.choice(names), rnd.choice(names)
    spec["mutations"].append(kind)
    if kind == "stage_negative":
        tasks[a]["stage"] = -1
    elif kind == "stage_type":
        tasks[a]["stage"] = rnd.choice(["1", 1.0, True, None])
    elif kind == "intra_backward":  # a waits b of a later stage within an iteration: corollary 1
        if a != b and _is_stage(tasks[a]["stage"]) and _is_stage(tasks[b]["stage"]):
            tasks[b]["stage"] = max(tasks[b]["stage"], tasks[a]["stage"] + 1)
        spec["intra"].append([a, b])  # else a self edge or a wrong stage already breaks a rule
    elif kind == "intra_cycle":
        pairs = [d for d in spec["intra"] if len(d) == 2]
        if pairs:
            t, d = rnd.choice(pairs)
            spec["intra"].append([d, t])
        elif a != b:
            spec["intra"] += [[a, b], [b, a]]
        else:
            spec["intra"].append([a, a])
    elif kind == "self_dep":
        spec["intra"].append([a, a])
    elif kind == "unknown_dep":
        spec[rnd.choice(["intra", "inter"])].append([a, "Nope"])
    elif kind == "inter_distance":
        spec["inter"].append([a, b, rnd.choice([0, -1, "1", 1.5, True])])
    elif kind == "inter_gap":  # a(i) waits b(i - N) but b's stage is more than N above a's: corollary 3
        dist = rnd.randint(1, 2)
        if a == b:  # one task waiting on itself is fine across iterations: use (or make) another task
            others = [n for n in names if n != a]
            b = others[0] if others else "TX"
            tasks.setdefault(b, {"stage": 0, "stream": None, "group": "default", "ordered": False})
        if _is_stage(tasks[a]["stage"]) and _is_stage(tasks[b]["stage"]):
            tasks[b]["stage"] = max(tasks[b]["stage"], tasks[a]["stage"] + dist + 1)
        spec["inter"].append([a, b, dist])
    elif kind == "depth":
        spec["depth"] = rnd.randint(0, 5)  # right by chance sometimes: then still valid
    elif kind == "policy":
        spec["policy"] = rnd.choice(["fifo", "", "READY_FIRST"])
    elif kind == "order_missing":
        spec["order"] = names[1:]
    elif kind == "order_dup":
        spec["order"] = names + [a]
    elif kind == "order_shuffled":
        spec["order"] = rnd.sample(names, len(names))  # valid only if it is topological
    elif kind == "group_empty":
        tasks[a]["group"] = ""
    elif kind == "group_type":
        tasks[a]["group"] = rnd.choice([3, None, b"io"])
    elif kind == "ordered_type":
        tasks[a]["ordered"] = rnd.choice([1, "yes", None])
    elif kind == "stream_type":
        tasks[a]["stream"] = rnd.choice([5, 1.5, b"memcpy"])
    elif kind == "stream_default":
        tasks[a]["stream"] = "default"
    elif kind == "dep_format":
        if rnd.random() < 0.5:
            spec["intra"].append([a, b, 1])
        else:
            spec["inter"].append([a, b, 1, 2])
    elif kind == "task_ref":
        spec["intra"].append([a, 3])
    else:
        raise ValueError(f"unknown mutation {kind!r}")


# ----------------------------------------------------------------------------- reference rules

def _is_stage(s: Any) -> bool:
    return isinstance(s, int) and not isinstance(s, bool) and s >= 0


def _period_local_edges(spec: Spec) -> List[Tuple[str, str]]:
    """(dep, task) edges that fall in one period: intra edges within a stage, inter edges whose
    stage gap equals their distance (task(i) in period i + s_t waits dep(i - N) in period i - N + s_d)."""
    stage = {n: t["stage"] for n, t in spec["tasks"].items()}
    edges = [(d, t) for t, d in spec["intra"] if stage[t] == stage[d]]
    edges += [(d, t) for t, d, *rest in spec["inter"] if stage[d] - stage[t] == (rest[0] if rest else 1)]
    return edges


def _has_cycle(names: List[str], edges: List[Tuple[str, str]]) -> bool:
    succ: Dict[str, List[str]] = {n: [] for n in names}
    for d, t in edges:
        succ[d].append(t)
    state: Dict[str, int] = {}

    def visit(n: str) -> bool:
        state[n] = 1
        for m in succ[n]:
            if state.get(m) == 1 or (m not in state and visit(m)):
                return True
        state[n] = 2
        return False

    return any(n not in state and visit(n) for n in names)


def reference_violations(spec: Spec) -> Set[str]:
    """The rules the spec breaks, by an implementation independent of ``swpipe_core.validate``."""
    tasks, names = spec["tasks"], list(spec["tasks"])
    out: Set[str] = set()
    for t in tasks.values():
        if not _is_stage(t["stage"]):
            out.add("stage")
        if not (t["stream"] is None or isinstance(t["stream"], str)):
            out.add("stream-type")
        elif t["stream"] == "default":
            out.add("stream_name")
        if not (isinstance(t["group"], str) and t["group"]):
            out.add("thread-group")
        if not isinstance(t["ordered"], bool):
            out.add("globally-ordered")
    good_intra, good_inter = [], []
    for dep in spec["intra"]:
        if len(dep) != 2:
            out.add("dep-format")
            continue
        if not all(isinstance(e, str) for e in dep):
            out.add("task-ref")
        elif not all(e in tasks for e in dep):
            out.add("unknown-task")
        elif dep[0] == dep[1]:
            out.add("self-dependency")
        else:
            good_intra.append(tuple(dep))
    for dep in spec["inter"]:
        if len(dep) not in (2, 3):
            out.add("dep-format")
            continue
        if not all(isinstance(e, str) for e in dep[:2]):
            out.add("task-ref")
        elif not all(e in tasks for e in dep[:2]):
            out.add("unknown-task")
        elif len(dep) == 3 and not (isinstance(dep[2], int) and not isinstance(dep[2], bool) and dep[2] >= 1):
            out.add("dep-format")
        else:
            good_inter.append((dep[0], dep[1], dep[2] if len(dep) == 3 else 1))
    if _has_cycle(names, [(d, t) for t, d in good_intra]):
        out.add("cycle")
    if out & {"stage", "dep-format", "task-ref", "unknown-task"}:
        return out  # the structural rules below need well-formed stages and edges
    stage = {n: t["stage"] for n, t in tasks.items()}
    if any(stage[d] > stage[t] for t, d in good_intra):
        out.add("corollary-1")
    if any(stage[d] - stage[t] > n for t, d, n in good_inter):
        out.add("corollary-3")
    if spec["depth"] is not None and spec["depth"] != max(stage.values()) + 1:
        out.add("depth-mismatch")
    if out:
        return out
    order = spec["order"]
    if order is None:
        if spec["policy"] not in POLICIES:
            out.add("enqueue-policy")
    elif sorted(order) != sorted(names):
        out.add("enqueue-order")
    else:
        pos = {n: k for k, n in enumerate(order)}
        if any(pos[d] > pos[t] for d, t in _period_local_edges(spec)):
            out.add("enqueue-order")
    return out


# ----------------------------------------------------------------------------- the property

def build(spec: Spec, calls: Optional[List[Tuple[str, int]]] = None) -> PipelinePlan:
    """The spec as a plan whose tasks append ``(name, iteration)`` to ``calls``."""
    calls = [] if calls is None else calls

    def fn_for(name):
        def fn(ctx):
            calls.append((name, ctx.iter_idx))
        return fn

    sched = {PipelineTask(n, fn_for(n)): TaskSchedule(t["stage"], t["stream"], t["group"], t["ordered"])
             for n, t in spec["tasks"].items()}
    return PipelinePlan(sched, [tuple(d) for d in spec["intra"]], [tuple(d) for d in spec["inter"]],
                        pipeline_depth=spec["depth"], enqueue_order=spec["order"], enqueue_policy=spec["policy"])


def check_spec(spec: Spec) -> str:
    """Assert the property for one spec; return ``"rejected:<rule>"`` or ``"ran"``."""
    expected = reference_violations(spec)
    calls: List[Tuple[str, int]] = []
    plan = build(spec, calls)
    if expected:
        with pytest.raises(PlanError) as info:
            SWPipeline(plan, device="cpu")
        assert info.value.rule in expected, (info.value.rule, expected, spec)
        assert info.value.fix, info.value
        return f"rejected:{info.value.rule}"
    pipe = SWPipeline(plan, device="cpu",
                      timeouts=Timeouts(signal_s=SIGNAL_TIMEOUT, sequencer_s=SIGNAL_TIMEOUT,
                                        progress_s=PROGRESS_TIMEOUT))
    pipe.run(range(N_ITERS))  # a hang would raise here after the short timeouts
    assert Counter(calls) == Counter((n, i) for n in spec["tasks"] for i in range(N_ITERS)), spec
    assert not [t for t in threading.enumerate() if t.name.startswith("swpipe-")]
    return "ran"


_SETTINGS = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.timeout(120)
@settings(max_examples=100, **_SETTINGS)
@given(spec=plan_specs())
def test_random_plans_invalid_rejected_at_construction_valid_run_without_hang(spec):
    check_spec(spec)


@pytest.mark.slow
@pytest.mark.timeout(600)
@settings(max_examples=1000, **_SETTINGS)
@given(spec=plan_specs())
def test_random_plans_invalid_rejected_valid_run_1000(spec):
    check_spec(spec)


def test_generator_mixes_valid_and_invalid_plans():
    """Without this the property could pass on a generator that only makes one kind of plan."""
    seen: Counter = Counter()

    @settings(max_examples=300, database=None, deadline=None)
    @given(spec=plan_specs())
    def probe(spec):
        broken = reference_violations(spec)
        seen["invalid" if broken else "valid"] += 1
        seen["explicit order valid"] += bool(spec["order"] is not None and not broken)
        seen["deep valid"] += bool(not broken and max(t["stage"] for t in spec["tasks"].values()) >= 2)

    probe()
    assert seen["valid"] > 60 and seen["invalid"] > 60, seen
    assert seen["explicit order valid"] > 5 and seen["deep valid"] > 10, seen


def _base_spec() -> Spec:
    """Four tasks over three stages with intra and inter edges: room for every mutation to bite."""
    task = lambda s, g: {"stage": s, "stream": None, "group": g, "ordered": False}  # noqa: E731
    return {"tasks": {"A": task(0, "io"), "B": task(0, "io"), "C": task(1, "comm"), "D": task(2, "default")},
            "intra": [["B", "A"], ["C", "B"], ["D", "C"]], "inter": [["A", "D", 2]], "depth": None,
            "policy": "ready_first", "order": None, "mutations": []}


def test_every_mutation_can_break_a_rule_and_together_they_reach_every_rule():
    """Deterministic coverage of the mutations (hypothesis' choices are not uniform)."""
    reached: Set[str] = set()
    for kind in MUTATIONS:
        broke = False
        for seed in range(40):
            spec = _base_spec()
            _mutate(spec, kind, random.Random(seed))
            broken = reference_violations(spec)
            reached |= broken
            broke |= bool(broken)
            if seed < 3:  # and the engine agrees on a few of them
                check_spec(spec)
        assert broke, f"mutation {kind} never breaks a rule"
    reachable = set(RULES) - {"schedule-type", "unique-names", "foreign-task", "period-local-cycle"}
    assert sorted(reachable - reached) == []


def test_reference_agrees_with_known_cases():
    base = {"tasks": {"A": {"stage": 0, "stream": None, "group": "g", "ordered": False},
                      "B": {"stage": 1, "stream": None, "group": "g", "ordered": False}},
            "intra": [["B", "A"]], "inter": [], "depth": None, "policy": "ready_first", "order": None}
    assert reference_violations(base) == set()
    assert reference_violations({**base, "intra": [["A", "B"]]}) == {"corollary-1"}
    assert reference_violations({**base, "inter": [["A", "B", 1]]}) == set()      # gap 1 <= distance 1
    assert reference_violations({**base, "order": ["B", "A"]}) == set()           # different periods
    same = {**base, "tasks": {**base["tasks"], "B": {**base["tasks"]["B"], "stage": 0}}}
    assert reference_violations({**same, "order": ["B", "A"]}) == {"enqueue-order"}
    assert reference_violations({**base, "depth": 3}) == {"depth-mismatch"}
    assert check_spec({**same, "order": ["B", "A"]}) == "rejected:enqueue-order"
    assert check_spec(base) == "ran"
