"""Reliability table: faults, bad input, fuzzed plans, multi-rank ordering, leaks, stress.

Runs the same scenarios as the reliability tests (it imports them from
``tests/``), measures them, prints the tables and writes
``benchmarks/RELIABILITY.md``:

1. fault matrix (``tests/test_faults.py``): per fault the error type and
   message, seconds from the fault to the caller's exception, ``swpipe-*``
   threads alive afterwards, and whether the pipeline runs again after
   ``drain()``;
2. bad input (``tests/test_bad_input.py``): bad plans refused at
   construction, bad engine arguments, malformed plan / task-graph /
   cost-model files, each error checked for the field and the fix;
3. fuzz (``tests/test_fuzz_plans.py``): random plans, valid and invalid mixed;
4. multi-rank (``tests/test_multirank.py``): two gloo ranks on loopback,
   globally ordered collectives, with an unordered control; uneven data; a
   failing rank;
5. long runs (``tests/test_long_runs.py``): 1,000 fill/drain cycles and a
   10,000-iteration run;
6. stress (``tests/test_stress.py``): random plan pairs run concurrently with
   jittered workloads, timeline checks; chaos rounds;
7. CUDA pipelines on the fake device (``tests/test_cuda_faults.py``): the
   fault matrix of the engine's CUDA path on ``swpipe.testing.FakeCuda`` (a
   kernel that never completes, a sticky device error, a task that raises
   after enqueuing kernels, Ctrl-C in the caller and in an inline task, a
   peer rank that dies), with the contexts the engine keeps for the device.

Run: ``python benchmarks/reliability.py`` (about 3-5 minutes on two shared
cores), ``--quick`` for a smaller smoke run (not written unless ``--out`` is
given), ``--skip-multirank`` where processes cannot be spawned (it also
skips the CUDA matrix's two-rank row). ``--device fake`` runs section 7 alone
(about a minute) and replaces that section of the existing file;
``--device cpu`` runs sections 1-6 and keeps an existing section 7.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402


def _fmt_s(x: float) -> str:
    return f"{x:.2f}"


def _short(text: str, n: int = 110) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= n else text[: n - 3] + "..."


def _table(headers: List[str], rows: List[List[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


# ----------------------------------------------------------------------------- sections

def fault_matrix() -> Dict[str, Any]:
    import test_faults as tf

    rows, outcomes = [], []
    for fault in tf.FAULTS:
        out = tf.measure(fault)
        ok_type = isinstance(out.error, fault.error)
        ok_text = all(p in out.message for p in fault.message)
        outcomes.append((fault, out, ok_type and ok_text))
        leaked = len(out.threads_after)
        rows.append([fault.name, fault.where, out.error_type, _short(out.message, 260) or "(no message)", _fmt_s(out.seconds),
                     f"{fault.timeout_s:g}" if fault.timeout_s else "-", len(out.threads_at_raise), leaked,
                     "yes" if out.usable_after_drain else f"NO ({out.rerun_error})"])
    surfaced = [o for f, o, ok in outcomes if ok]
    return {
        "rows": rows,
        "tried": len(outcomes),
        "surfaced": len(surfaced),
        "max_s": max(o.seconds for _, o, _ in outcomes),
        "max_s_non_blocking": max(o.seconds for f, o, _ in outcomes if not f.blocks),
        "hangs": sum(1 for _, o, _ in outcomes if o.error is None),
        "leaked": sum(len(o.threads_after) for _, o, _ in outcomes),
        "usable": sum(1 for _, o, _ in outcomes if o.usable_after_drain),
    }


def bad_input() -> Dict[str, Any]:
    import pytest

    import test_bad_input as tb
    from swpipe_core.engine.options import OptionError
    from swpipe_core.engine.pipeline import SWPipeline
    from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
    from swpipe_core.validate import PlanError

    counts: Dict[str, List[int]] = {}  # category -> [tried, rejected with field + fix]
    failures: List[str] = []

    def tally(cat: str, ok: bool, what: str) -> None:
        c = counts.setdefault(cat, [0, 0])
        c[0] += 1
        c[1] += ok
        if not ok:
            failures.append(f"{cat}: {what}")

    for rule, (make, names) in sorted(tb.BAD_PLANS.items()):
        try:
            SWPipeline(make(), device="cpu")
            tally("plans breaking a validation rule (SWPipeline(plan))", False, f"{rule} accepted")
        except PlanError as err:
            tally("plans breaking a validation rule (SWPipeline(plan))",
                  err.rule == rule and bool(err.fix) and all(n in str(err) for n in names), rule)
    for case, (kwargs, option) in sorted(tb.BAD_OPTIONS.items()):
        plan = PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule()})
        try:
            SWPipeline(plan, **{"device": "cpu", **kwargs})
            tally("engine arguments", False, f"{case} accepted")
        except OptionError as err:  # names the option and what it takes
            tally("engine arguments", err.field == option and bool(err.expected), case)
    for not_a_plan in ("plan", None, {"A": TaskSchedule(0)}, [1]):
        try:
            SWPipeline(not_a_plan, device="cpu")
            tally("not a plan", False, repr(not_a_plan))
        except TypeError as err:
            tally("not a plan", "PipelinePlan(schedule=" in str(err), repr(not_a_plan))
    with tempfile.TemporaryDirectory() as tmp:
        for kind, (cases, _, _) in tb.FILE_KINDS.items():
            for case in cases:
                try:
                    tb.check_bad_file(kind, case, Path(tmp))
                    tally(f"malformed {kind} JSON files", True, case)
                except (AssertionError, pytest.fail.Exception) as err:
                    tally(f"malformed {kind} JSON files", False, f"{case}: {err}")
    tried = sum(c[0] for c in counts.values())
    rejected = sum(c[1] for c in counts.values())
    return {"counts": counts, "tried": tried, "rejected": rejected, "failures": failures}


def fuzz(examples: int) -> Dict[str, Any]:
    from hypothesis import HealthCheck, given, settings

    import test_fuzz_plans as tz

    results: Counter = Counter()
    problems: List[str] = []

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(spec=tz.plan_specs())
    def run(spec):
        valid = not tz.reference_violations(spec)
        try:
            results[tz.check_spec(spec)] += 1
        except BaseException as exc:  # counted and listed, not re-raised: the table must show it
            results["hang" if "waited" in str(exc) else "property failed"] += 1
            problems.append(f"{'valid' if valid else 'invalid'} plan: {type(exc).__name__}: {_short(str(exc), 200)}")

    t0 = time.perf_counter()
    run()
    seconds = time.perf_counter() - t0
    rejected = {k.split(":", 1)[1]: v for k, v in results.items() if k.startswith("rejected:")}
    return {"examples": sum(results.values()), "ran": results["ran"], "rejected": sum(rejected.values()),
            "by_rule": dict(sorted(rejected.items())), "hangs": results["hang"],
            "failed": results["property failed"], "problems": problems, "seconds": seconds}


def multirank() -> Dict[str, Any]:
    import test_multirank as tm

    session = tm.run_ranks(["order", "order_unordered", "uneven", "fail", "uneven_raw"])
    ranks = session["ranks"]
    out: Dict[str, Any] = {"exitcodes": session["exitcodes"], "killed": session["killed"],
                           "seconds": session["seconds"], "gloo_timeout_s": tm.GLOO_TIMEOUT_S}
    crash = [r.get("crash") for r in ranks if r.get("crash")]
    if crash:
        out["crash"] = crash[0]
        return out
    a, b = ranks[0]["order"], ranks[1]["order"]
    out["order"] = {"iterations": a["retired"], "collectives": len(a["sequence"]),
                    "identical": a["sequence"] == b["sequence"],
                    "mispaired": len(a["mispaired"]) + len(b["mispaired"]), "seconds": max(a["seconds"], b["seconds"])}
    ua, ub = ranks[0]["order_unordered"], ranks[1]["order_unordered"]
    out["unordered"] = {"iterations": ua["retired"], "collectives": len(ua["sequence"]),
                        "identical": ua["sequence"] == ub["sequence"],
                        "mispaired": len(ua["mispaired"]) + len(ub["mispaired"])}
    out["uneven"] = {r: ranks[r]["uneven"] for r in range(len(ranks))}
    out["fail"] = {r: ranks[r]["fail"] for r in range(len(ranks))}
    out["uneven_raw"] = {r: ranks[r]["uneven_raw"] for r in range(len(ranks))}
    out["uneven_sizes"] = dict(tm.UNEVEN)
    return out


def leaks(cycles: int, iterations: int) -> Dict[str, Any]:
    import test_long_runs as tl

    return {"cycles": tl.fill_drain_cycles(cycles), "run": tl.long_run(iterations)}


def stress(pairs: int, chaos_rounds: int) -> Dict[str, Any]:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import test_stress as ts

    cfg = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    stats: Counter = Counter()
    problems: List[str] = []

    @settings(max_examples=pairs, **cfg)
    @given(plan=ts.valid_plans(), n_iters=st.integers(30, 60), seed=st.integers(0, 2**16))
    def timelines(plan, n_iters, seed):
        try:
            stats["events"] += ts.check_timeline(plan, n_iters, seed)
            stats["plans"] += 1
        except BaseException as exc:
            problems.append(f"{type(exc).__name__}: {_short(str(exc), 200)}")

    @settings(max_examples=chaos_rounds, **cfg)
    @given(plan=ts.valid_plans(max_tasks=6), seed=st.integers(0, 2**16))
    def chaos(plan, seed):
        try:
            stats["chaos:" + ts.chaos_round(plan, random.Random(seed))] += 1
        except BaseException as exc:
            problems.append(f"chaos {type(exc).__name__}: {_short(str(exc), 200)}")

    t0 = time.perf_counter()
    timelines()
    chaos()
    return {"stats": dict(stats), "problems": problems, "seconds": time.perf_counter() - t0}


def cuda_fault_matrix(with_peer: bool = True) -> Dict[str, Any]:
    """The fault matrix on CUDA pipelines, on ``swpipe.testing.FakeCuda`` (``tests/test_cuda_faults.py``).

    Each row runs with the engine's own teardown wait (5 s); ``with_peer``
    adds the two-rank row (two spawned processes).
    """
    import test_cuda_faults as tc

    outcomes = []
    for fault in tc.CUDA_FAULTS:
        out = tc.measure(fault)
        outcomes.append((fault, out, tc.problems(fault, out)))
    session = None
    if with_peer:
        session = tc.run_peer_ranks()
        outcomes.append((tc.PEER_FAULT, tc.peer_outcome(session), tc.peer_problems(session)))
    rows = []
    for fault, out, found in outcomes:
        if not found:
            verdict = "yes"
        elif fault.defect:
            verdict = "NO: engine defect (below)"
        else:
            verdict = "NO: " + _short("; ".join(found), 200)
        usable = "n/a (only close() ends hang())" if out.usable is None else ("yes" if out.usable else
                                                                              f"NO ({_short(out.rerun_error, 80)})")
        rows.append([fault.name, fault.where, out.surfaced, _short(out.message, 230) or "(no message)",
                     _fmt_s(out.seconds), fault.timeouts, f"{len(out.threads_at_raise)} / {len(out.threads_after)}",
                     f"{out.kept_at_raise} / {out.kept_after}", usable, verdict])
    return {
        "rows": rows,
        "tried": len(outcomes),
        "as_expected": sum(1 for _, _, found in outcomes if not found),
        "defects": [(f.name, f.defect) for f, _, found in outcomes if found and f.defect],
        "fixed_defects": [f.name for f, _, found in outcomes if not found and f.defect],
        "unexpected": [(f.name, found) for f, _, found in outcomes if found and not f.defect],
        "hangs": sum(1 for _, o, _ in outcomes if o.error_type == "no error"),
        "left": sum(len(o.threads_after) for _, o, _ in outcomes),
        "usable": sum(1 for _, o, _ in outcomes if o.usable),
        "checkable": sum(1 for _, o, _ in outcomes if o.usable is not None),
        "races": sum(o.races for _, o, _ in outcomes),
        "peer": None if session is None else {"exitcodes": session["exitcodes"], "killed": session["killed"],
                                              "seconds": session["seconds"]},
    }


# ----------------------------------------------------------------------------- report

def _kib(n: int) -> str:
    return f"{n / 1024:+.1f} KiB"


CUDA_HEADING = "## 7. CUDA pipelines on the fake device"


def render_cuda(cm: Dict[str, Any], seconds: float) -> str:
    """Section 7: the CUDA fault matrix on the fake device, with how to reproduce it and what it shows."""
    import test_cuda_faults as tc

    peer = cm["peer"]
    lines = [
        CUDA_HEADING,
        "",
        f"Produced by `python benchmarks/reliability.py --device fake` on {datetime.date.today().isoformat()} "
        f"({seconds:.0f} s); machine: {platform.machine()} {os.cpu_count()}-core CPU VM shared with other jobs, "
        f"Python {platform.python_version()}, torch {torch.__version__}, no GPU: the engine's CUDA path runs on "
        "`swpipe.testing.FakeCuda` (an executor thread per stream, a caching allocator that reuses a freed block at "
        "once, a sticky error after a failing kernel). The same rows are the tests of `tests/test_cuda_faults.py` "
        "(`cuda`-marked), which assert the behaviour and not the seconds.",
        "",
        _table(["check", "result"], [
            ["faults tried", cm["tried"]],
            ["surfaced as the contract says, no thread left, usable after recovery",
             f"{cm['as_expected']} / {cm['tried']}"],
            ["hangs (fault never surfaced)", cm["hangs"]],
            ["`swpipe-*` threads left after recovery (sum over faults)", cm["left"]],
            ["pipeline usable after recovery (12 batches, every device value exact)",
             f"{cm['usable']} / {cm['checkable']} (the fake's `hang()` row cannot be: only `close()` ends it)"],
            ["races in the fake's happens-before check (failed runs and reruns)", cm["races"]],
            ["known engine defects shown by a row", len(cm["defects"])],
        ]),
        "",
        f"The plan (`tests/test_cuda_faults.py`): the fault matrix's seven tasks, now with kernels, one stream per "
        f"stage: io (stage 0, stream memcpy): Load (pinned host batch), H2D (copy to the device); dist (stage 1, "
        f"data_dist): DistStart* (device copy), DistWait (a spin kernel, then `del ctx.x` while the copy may not "
        f"have read it); compute (stage 2, default stream): Fwd (sum), Bwd (add), Opt* (Fwd(i) waits Opt(i-1)); "
        f"* globally ordered. Iteration i leaves the device scalar 2 * {tc.N} * i. *Surfaced as*: the caller's "
        "exception, with the task and iteration a `PipelineTaskError` names. *Seconds*: from the fault firing (the "
        "raise, the hung kernel starting, the failing kernel's launch, the signal, the peer's death) to the "
        "caller's exception; it includes the failed run's bounded wait for the device "
        "(`Timeouts.teardown_s`, 5 s) and, for a worker blocked on the device, the bounded join "
        "(`Timeouts.join_s`, 5 s). *Threads*: `swpipe-*` threads alive at the raise / after recovery and a join. "
        "*Kept*: iteration contexts the engine keeps alive for the device (`SWPipeline.kept_for_device`) at the raise / after the "
        "rerun. *Recovery*, then *usable*: a hung kernel is released (the device finishes, as when an aborted "
        "communicator or a slow peer lets it), a sticky error is forgotten with `FakeCuda.clear_error()`, Ctrl-C "
        "and a task error need nothing; then `drain()` and the same `SWPipeline` runs 12 batches: every task once "
        "per iteration, every device value exact, no race.",
        "",
        _table(["fault", "covers", "surfaced as", "message (cause after <-)", "seconds", "timeouts",
                "threads at raise / left", "kept at raise / after", "usable after", "as expected"], cm["rows"]),
        "",
        "- **A task that raises after enqueuing kernels** (on a worker, and inline on the caller's thread): the "
        "caller gets the task's `PipelineTaskError` once the kernels the task queued have run (0.2 s of spin "
        "here): the contexts are freed only when the device is done with them, so nothing is kept afterwards.",
        "- **A kernel that never completes**: no host call waits on it, so the caller notices it only through the "
        "device-lag bound (`max_device_lag`, the depth by default): `progress()` waits `Timeouts.progress_s` for the "
        "device work of iteration r - lag and raises a `RuntimeError` naming the iteration and the tasks whose "
        "device work has not completed; the teardown's fence then waits 5 s and keeps every context of the run "
        "alive (`SWPipeline.kept_for_device`), because a stream may still read them. With the fake's own `hang()` nothing more can "
        "happen: it ends only with `FakeCuda.close()`, after which the fake runs nothing. With a hang the device "
        "gets over, the contexts stay kept through a `drain()` (which raises after its bounded wait while the "
        "device is still hung) and the next run's fill frees them; the run's values are exact.",
        "- **A task blocked on a hung kernel** (`.item()` behind it, as DLRM's dedup or a blocking collective): "
        "on a GPU the call blocks forever, so the fake's own limit (60 s) is set far beyond the engine's; the "
        "caller's `Timeouts.progress_s` reports the iteration and its unfinished tasks, after the 5 s join of the "
        "stuck worker and the 5 s teardown wait; the worker is listed at the raise and exits by itself once the "
        "device finishes.",
        "- **A sticky device error** is reported by whichever call touches the device next, as on CUDA: when "
        "the failing task reads a value on the host, its own `PipelineTaskError` (`__cause__`: the device "
        "error); otherwise a later task's, or, when the caller's own device query in `progress()` comes first, "
        "the device error itself, unchanged. Only the fake's message names the kernel that failed (`kernel "
        "'Bwd(5)'`: the engine labels kernels by task and iteration); a GPU's does not (rerun with "
        "`CUDA_LAUNCH_BLOCKING=1` to find it). The teardown's fence raises too, so the contexts are kept "
        "(never freed into a broken device).",
        "- **Ctrl-C**: a `KeyboardInterrupt` in the caller, whether it lands while `progress()` waits for the "
        "device (`max_device_lag=0`, the signal sent by a host function queued behind a kernel) or inside an "
        "inline task of the caller's group, surfaces unchanged after the workers are joined and the queued "
        "kernels have run (bounded by the teardown wait).",
    ]
    if peer is not None:
        lines.append(
            f"- **A peer rank that dies**: two ranks (gloo on loopback, {tc.PEER_GLOO_TIMEOUT_S:g} s group timeout, "
            "spawned by the script), each running Load (io, memcpy) -> Sync* (comm stream: a kernel, then a "
            "host-side `all_reduce` that waits on the peer) -> Step (compute, default) on a FakeCuda device of its "
            f"own. Rank 1 SIGKILLs itself inside Sync({tc.PEER_ITER}); rank 0's `all_reduce` fails at once "
            "(gloo: connection closed or reset by peer), not after a timeout, as the `PipelineTaskError` of "
            f"Sync({tc.PEER_ITER}); rank 0 then destroys the group, forms a world of one on a new store, and the "
            f"same pipeline runs 12 batches with exact values. Exit codes {peer['exitcodes']} (-9: the killed "
            f"rank), killed by the deadline: {peer['killed'] or 'none'}; {peer['seconds']:.0f} s with the two "
            "processes' start. A NCCL collective is asynchronous instead: its kernel hangs on the device when the "
            "peer dies, which is the hung-kernel rows above.")
    if cm["defects"]:
        lines += ["", "**Engine defects these rows show** (reported, not fixed here; the tests are expected "
                  "failures, `xfail(strict=True)`, until they are):", ""]
        lines += [f"- *{name}*: {defect}." for name, defect in cm["defects"]]
        lines.append(
            "- *every sticky-error row*: the contexts the failed teardown kept (its fence raised, so it has no "
            "events) stay kept (`kept_for_device`) for the pipeline's lifetime, even after `clear_error()` and a clean rerun "
            "(*kept after* above): `Limbo.prune` never fences such an entry again. Harmless on a GPU, where a "
            "sticky error ends the process, but the memory is never given back "
            "(`test_after_clear_error_the_contexts_kept_by_the_failed_teardown_are_freed`).")
    if cm["fixed_defects"]:
        lines += ["", f"Rows whose defect no longer shows (update the tests' `defect`): {cm['fixed_defects']}."]
    if cm["unexpected"]:
        lines += ["", "Unexpected results:", ""] + [f"- {n}: {_short('; '.join(f), 300)}" for n, f in cm["unexpected"]]
    lines.append("")
    return "\n".join(lines)


def splice_section(doc: str, section: str, heading: str = CUDA_HEADING) -> str:
    """``doc`` with its ``heading`` section (up to the next ``## ``) replaced by ``section``, or inserted
    before ``## Limits`` (at the end if there is none)."""
    body = doc.rstrip("\n")
    tail = doc[len(body):] or "\n"  # the document's own trailing newlines, kept
    lines = body.split("\n")
    new = section.rstrip("\n").split("\n") + [""]
    if heading in lines:
        start = lines.index(heading)
        end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
        lines[start:end] = new
    else:
        at = next((j for j, line in enumerate(lines) if line.startswith("## Limits")), len(lines))
        lines[at:at] = new
    return "\n".join(lines).rstrip("\n") + tail


def existing_section(doc: str, heading: str = CUDA_HEADING) -> str:
    """The ``heading`` section of ``doc`` (empty if it has none)."""
    lines = doc.split("\n")
    if heading not in lines:
        return ""
    start = lines.index(heading)
    end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
    return "\n".join(lines[start:end])


def render(res: Dict[str, Any], args: argparse.Namespace, seconds: float) -> str:
    fm, bi, fz, lk = res["faults"], res["bad_input"], res["fuzz"], res["leaks"]
    mr = res.get("multirank")
    st_ = res["stress"]
    cyc, run = lk["cycles"], lk["run"]
    lines = [
        "# Reliability: faults, bad input, fuzzed plans, multi-rank ordering, leaks",
        "",
        f"Produced by `python benchmarks/reliability.py` on {datetime.date.today().isoformat()}; "
        f"machine: {platform.machine()} {os.cpu_count()}-core CPU shared with other jobs, Python "
        f"{platform.python_version()}, torch {torch.__version__}, device cpu. Whole script: {seconds:.0f} s. "
        "Every number below comes from that run; rerun the script to refresh it.",
        "",
        "## Summary",
        "",
        _table(["check", "result"], [
            ["faults tried", fm["tried"]],
            ["faults surfaced to the caller with the expected type and message", f"{fm['surfaced']} / {fm['tried']}"],
            ["max seconds from fault to caller (all / non-blocking faults)",
             f"{fm['max_s']:.2f} / {fm['max_s_non_blocking']:.2f}"],
            ["hangs (fault never surfaced)", fm["hangs"]],
            ["`swpipe-*` threads leaked after drain (sum over faults)", fm["leaked"]],
            ["pipeline usable after drain", f"{fm['usable']} / {fm['tried']}"],
            ["invalid inputs tried / rejected naming the field and the fix", f"{bi['tried']} / {bi['rejected']}"],
            ["fuzzed plans (valid + invalid)", fz["examples"]],
            ["fuzz: invalid plans rejected at construction", fz["rejected"]],
            ["fuzz: valid plans run 10 iterations to completion", fz["ran"]],
            ["fuzz: hangs / property failures", f"{fz['hangs']} / {fz['failed']}"],
            ["multi-rank iterations compared (2 gloo ranks, globally ordered)",
             "not run" if mr is None or "order" not in mr else
             f"{mr['order']['iterations']} ({mr['order']['collectives']} collectives per rank), identical: "
             f"{'yes' if mr['order']['identical'] else 'NO'}, mispaired reductions: {mr['order']['mispaired']}"],
            ["fill/drain cycles: threads during / after, live contexts / tensors after",
             f"{cyc['cycles']}: {cyc['threads_during']} / {cyc['threads_after']} (before {cyc['threads_before']}), "
             f"{cyc['live_contexts_after']} / {cyc['live_tensors_after']}"],
            ["fill/drain cycles: Python heap / RSS change over the last "
             f"{cyc['measured_cycles']} cycles", f"{_kib(cyc['heap_delta_bytes'])} / {_kib(cyc['rss_delta_bytes'])}"],
            [f"{run['iterations']}-iteration run: max live contexts / tensors (depth 3)",
             f"{run['max_live_contexts']} / {run['max_live_tensors']}; after: "
             f"{run['live_contexts_after']} / {run['live_tensors_after']}"],
            [f"{run['iterations']}-iteration run: Python heap / RSS change over the last "
             f"{run['measured_iterations']} iterations", f"{_kib(run['heap_delta_bytes'])} / {_kib(run['rss_delta_bytes'])}"],
            ["stress: random plans run concurrently in pairs, timeline events checked",
             f"{st_['stats'].get('plans', 0)} plans, {st_['stats'].get('events', 0)} events, problems: "
             f"{len(st_['problems'])}"],
        ]),
        "",
        "## 1. Fault matrix",
        "",
        "The plan (`tests/test_faults.py`): seven tasks in a chain over three thread groups and three stages "
        "(io: Load, H2D at stage 0; dist: DistStart*, DistWait at stage 1; compute: Fwd, Bwd, Opt* at stage 2; "
        "* globally ordered; Fwd(i) waits Opt(i-1)). *Seconds*: from the moment the fault fired (the raise, the "
        "start of the block, the signal) to the exception in the caller. *Threads at raise*: `swpipe-*` threads "
        "alive when the caller got it (a worker stuck in user code cannot be killed; it is listed until the test "
        "releases it). *Leaked*: alive after release, `drain()` and a join. *Usable*: the same `SWPipeline` then "
        "runs 12 clean batches with every task exactly once per iteration.",
        "",
        _table(["fault", "covers", "error", "message (cause after <-)", "seconds", "timeout", "threads at raise",
                "leaked", "usable after drain"], fm["rows"]),
        "",
        "Blocking faults surface after their timeout plus the engine's bounded wait for the stuck worker "
        "(`Timeouts.join_s`, 5 s): the worker cannot be interrupted, so the caller gets the error once "
        "that wait expires, and the thread exits by itself when the task returns. Before the fix to "
        "`Workers.stop` (`src/swpipe_core/engine/workers.py`: the wait is now a budget per thread over all calls) it happened "
        "twice (once when the failure was reported, once in the reset), so a 0.5 s timeout surfaced after 10.5 s. The data iterator's own exception leaves the pipeline filled "
        "by design (call `progress` again or `drain()`), hence its threads at raise.",
        "",
        "## 2. Bad input",
        "",
        _table(["input", "tried", "rejected naming field + fix"],
               [[k, v[0], v[1]] for k, v in bi["counts"].items()]),
        "",
    ]
    if bi["failures"]:
        lines += ["Not rejected as required:", ""] + [f"- {f}" for f in bi["failures"]] + [""]
    lines += [
        "Each validation rule's own message (rule, tasks, fix) is tested in `tests/test_validate.py`; here every "
        "bad plan goes through `SWPipeline(plan)` and no thread starts. File errors must name the file path, the "
        "field (e.g. `tasks[0]`, `inter_iter_deps[0]`, `tasks.A.host_s`) and a `Fix:`; a well-formed file whose "
        "plan breaks a rule raises the `PlanError` of that rule.",
        "",
        "## 3. Fuzzed plans",
        "",
        f"{fz['examples']} hypothesis examples in {fz['seconds']:.1f} s (`tests/test_fuzz_plans.py`): a valid "
        "random plan, then 0-2 random mutations. An independent reference (written from the rules in docs/semantics.md, not "
        "calling `validate`) decides validity. Invalid: `SWPipeline(plan)` must raise `PlanError` with one of "
        "the rules the reference found. Valid: 10 pipelined iterations, every task exactly once per iteration, "
        "with 10 s / 15 s signal / progress timeouts so that a hang becomes a counted failure.",
        "",
        _table(["rejected by rule", "plans"], [[k, v] for k, v in fz["by_rule"].items()]),
        "",
    ]
    if fz["problems"]:
        lines += ["Problems:", ""] + [f"- {p}" for p in fz["problems"][:20]] + [""]
    lines += ["## 4. Multi-rank ordering (torch.distributed, gloo on loopback, world size 2)", ""]
    if mr is None:
        lines += ["Not run (`--skip-multirank`).", ""]
    elif "crash" in mr:
        lines += ["A rank crashed:", "", "```", mr["crash"], "```", ""]
    else:
        f0, f1 = mr["fail"][0], mr["fail"][1]
        r0, r1 = mr["uneven_raw"][0], mr["uneven_raw"][1]
        u0, u1 = mr["uneven"][0], mr["uneven"][1]
        lines += [
            "Each rank runs Load (io) -> SyncA (comm_a) + SyncB (comm_b) -> Step (compute); SyncA and SyncB each "
            "`all_reduce` a tensor encoding (task, iteration, rank), so a collective paired with the wrong one "
            "on the other rank gives a wrong sum (*mispaired*). Ranks are spawned by the script (FileStore "
            f"rendezvous, gloo timeout {mr['gloo_timeout_s']:g} s); exit codes "
            f"{mr['exitcodes']}, killed by the deadline: {mr['killed'] or 'none'}; {mr['seconds']:.0f} s in all.",
            "",
            _table(["run", "iterations", "collectives per rank", "sequences identical", "mispaired reductions (both ranks)"], [
                ["globally_ordered=True", mr["order"]["iterations"], mr["order"]["collectives"],
                 "yes" if mr["order"]["identical"] else "NO", mr["order"]["mispaired"]],
                ["control: globally_ordered=False", mr["unordered"]["iterations"], mr["unordered"]["collectives"],
                 "yes" if mr["unordered"]["identical"] else "no", mr["unordered"]["mispaired"]],
            ]),
            "",
            "The control shows what the sequencer prevents: without it the two worker threads race to issue "
            "their collectives and the ranks pair different ones.",
            "",
            f"**Uneven data** (rank 0: {len(u0['retired']) + len(u0['rest'])} batches, rank 1: "
            f"{len(u1['retired']) + len(u1['rest'])}) through `swpipe_core.distributed.agree_on_end`: rank 0 "
            f"retired {len(u0['retired'])} iterations, rank 1 {len(u1['retired'])}; no hang; ranks whose data "
            f"ended: {u0['ended_ranks']}. Rank 0's untrained batches are kept, not lost: `leftover` = "
            f"{u0['leftover']}, `rest()` = {u0['rest']}.",
            "",
            f"**A failing rank**: rank 1's SyncA raises at iteration {f1.get('iteration')} and rank 1 then stays "
            f"alive without issuing collectives. Rank 0: {f0.get('error')} naming {f0.get('task')!s} iteration "
            f"{f0.get('iteration')} after {f0.get('seconds', float('nan')):.1f} s (cause: "
            f"{_short(f0.get('message', '').split('] ')[-1], 160)}). Threads left: rank 0 {f0.get('threads_after')}, rank 1 "
            f"{f1.get('threads_after')}; both processes exited by themselves.",
            "",
            f"**Uneven data without `agree_on_end`** (the hang of hand-written pipelines): rank 1 retires "
            f"{len(r1['retired'])} iterations and finishes; rank 0 waits in the all_reduce of iteration "
            f"{r0.get('iteration')} for a peer that is done and fails after {r0.get('seconds', float('nan')):.1f} s "
            f"with {r0.get('error')} naming {r0.get('task')} iteration {r0.get('iteration')} (gloo timeout) instead "
            "of hanging; both processes exit. It is an error, not a clean stop: use `agree_on_end`.",
            "",
        ]
    lines += [
        "## 5. Long runs and leaks",
        "",
        "Small plan (Load on io; Forward*, Step on compute; depth 3; each iteration makes two 1 KiB tensors). "
        "Live contexts and tensors counted with `weakref.WeakSet` after `gc.collect()`; Python heap with "
        "`tracemalloc` from after a warm-up; RSS from `/proc/self/statm`.",
        "",
        _table(["workload", "seconds", "threads before / during / after", "live contexts / tensors",
                "heap change", "RSS change"], [
            [f"{cyc['cycles']} x (fill_pipeline, progress, drain)", f"{cyc['seconds']:.1f}",
             f"{cyc['threads_before']} / {cyc['threads_during']} / {cyc['threads_after']}",
             f"after: {cyc['live_contexts_after']} / {cyc['live_tensors_after']}",
             f"{_kib(cyc['heap_delta_bytes'])} over {cyc['measured_cycles']} cycles",
             _kib(cyc['rss_delta_bytes'])],
            [f"{run['iterations']} pipelined iterations", f"{run['seconds']:.1f}",
             f"{run['threads_before']} / {run['threads_during']} / {run['threads_after']}",
             f"max during: {run['max_live_contexts']} / {run['max_live_tensors']}; after: "
             f"{run['live_contexts_after']} / {run['live_tensors_after']}",
             f"{_kib(run['heap_delta_bytes'])} over {run['measured_iterations']} iterations",
             _kib(run['rss_delta_bytes'])],
        ]),
        "",
        _table(["iteration", "live contexts", "live tensors", "threads", "heap (KiB)", "RSS (MiB)"],
               [[s["iteration"], s["contexts"], s["tensors"], s["threads"], f"{s['heap'] / 1024:.1f}",
                 f"{s['rss'] / 2**20:.1f}"] for s in run["samples"]]),
        "",
        "## 6. Stress",
        "",
        f"{st_['stats'].get('plans', 0)} random valid plans (up to 8 tasks, 4 thread groups, inter deps of "
        "distance 1-3, globally ordered tasks), 30-60 iterations each with random 0-300 us sleeps as workloads; "
        f"{st_['stats'].get('events', 0)} timeline events checked: per thread group no overlap and the enqueue "
        "order, every dependency, at most `depth` iterations in flight, globally ordered tasks in ticket order "
        "(the pytest version runs two pipelines at once). Chaos rounds (random progress / progress(None) / drain / "
        "close with random injected failures): "
        + ", ".join(f"{k.split(':', 1)[1]} {v}" for k, v in sorted(st_["stats"].items()) if k.startswith("chaos:"))
        + f"; problems: {len(st_['problems'])}; {st_['seconds']:.0f} s.",
        "",
    ]
    if st_["problems"]:
        lines += [f"- {p}" for p in st_["problems"][:20]] + [""]
    lines += [
        "## Limits (what the engine cannot do, and what to do instead)",
        "",
        "- A task blocked in user code (or in a C++ collective) cannot be interrupted from Python. The engine "
        "reports it after the timeout that detects it plus its bounded wait for the worker (5 s), and the worker "
        "thread (a daemon) exits when the call returns.",
        "- So give every process group a timeout no longer than the engine's: `torch.distributed.new_group` does "
        "not inherit `init_process_group(timeout=...)` (its default is 30 minutes). Measured while building these "
        "tests: with a default-timeout group, the rank whose peer failed got the engine's sequencer-timeout error "
        "after 20 s, but its worker stayed blocked in gloo and the process aborted at exit (`terminate called "
        "without an active exception`, exit code -6). With a 5 s group timeout, both ranks exit 0 (table above). "
        "`agree_on_end(..., timeout=...)` passes it to the group it creates.",
        "- The data iterator runs on the caller's thread: a loader that blocks inside `next()` blocks the caller "
        "and no engine timeout applies (use the loader's own, e.g. `DataLoader(timeout=...)`). Driven by "
        "`progress()`, a loader that raises leaves the pipeline filled so that the caller may go on; "
        "`drain()`/`close()` or `with SWPipeline(...) as pipe:` stops the workers (`run()` does it itself).",
        "",
    ]
    return "\n".join(lines)


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts (smoke run); writes nothing unless --out")
    parser.add_argument("--skip-multirank", action="store_true",
                        help="do not spawn the two gloo ranks (nor the CUDA matrix's two fake-device ranks)")
    parser.add_argument("--device", choices=("all", "cpu", "fake"), default="all",
                        help="cpu: sections 1-6; fake: section 7 alone, the fault matrix on CUDA pipelines on "
                             "swpipe.testing.FakeCuda (replaces that section of an existing file); all: both")
    parser.add_argument("--out", default=None, help="markdown output (default benchmarks/RELIABILITY.md)")
    args = parser.parse_args(argv)
    out_path = args.out or (None if args.quick else str(ROOT / "benchmarks" / "RELIABILITY.md"))
    n_fuzz, n_cycles, n_iters, n_pairs, n_chaos = (100, 200, 2000, 20, 30) if args.quick else (1000, 1000, 10_000, 200, 300)

    t0 = time.perf_counter()
    res: Dict[str, Any] = {}
    steps = [("faults", fault_matrix), ("bad_input", bad_input), ("fuzz", lambda: fuzz(n_fuzz)),
             ("multirank", None if args.skip_multirank else multirank),
             ("leaks", lambda: leaks(n_cycles, n_iters)), ("stress", lambda: stress(n_pairs, n_chaos))]
    if args.device == "fake":
        steps = []
    if args.device in ("fake", "all"):
        steps.append(("cuda", lambda: cuda_fault_matrix(with_peer=not args.skip_multirank)))
    seconds: Dict[str, float] = {}
    # the Ctrl-C faults send SIGINT: it raises KeyboardInterrupt as in an interactive Python, also when this script
    # was started with SIGINT ignored (a background job of a shell script, nohup), as tests/conftest.py's ctrl_c does
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name, fn in steps:
        if fn is None:
            res[name] = None
            continue
        t = time.perf_counter()
        print(f"[reliability] {name} ...", flush=True)
        try:
            res[name] = fn()
        except Exception:
            traceback.print_exc()
            raise
        seconds[name] = time.perf_counter() - t
        print(f"[reliability] {name} done in {seconds[name]:.1f} s", flush=True)
    old = Path(out_path).read_text(encoding="utf-8") if out_path and Path(out_path).exists() else ""
    cuda_text = render_cuda(res["cuda"], seconds["cuda"]) if "cuda" in res else ""
    if args.device == "fake":
        print(cuda_text)
        text = splice_section(old, cuda_text) if old else cuda_text + "\n"
    else:
        text = render(res, args, time.perf_counter() - t0)
        section = cuda_text or existing_section(old)  # a CPU-only run keeps the recorded CUDA section
        if section:
            text = splice_section(text, section)
        print(text)
    if out_path:
        Path(out_path).write_text(text if args.device == "fake" else text + "\n", encoding="utf-8")
        print(f"[reliability] wrote {out_path}")
    bad = False
    if "faults" in res:
        bad = bool(res["faults"]["surfaced"] != res["faults"]["tried"] or res["faults"]["leaked"]
                   or res["faults"]["hangs"] or res["bad_input"]["tried"] != res["bad_input"]["rejected"]
                   or res["fuzz"]["hangs"] or res["fuzz"]["failed"] or res["stress"]["problems"])
    if "cuda" in res:  # a known engine defect is reported in the table; anything else fails the run
        bad = bad or bool(res["cuda"]["unexpected"] or res["cuda"]["fixed_defects"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
