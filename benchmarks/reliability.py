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
   jittered workloads, timeline checks; chaos rounds.

Run: ``python benchmarks/reliability.py`` (about 3-5 minutes on two shared
cores), ``--quick`` for a smaller smoke run (not written unless ``--out`` is
given), ``--skip-multirank`` where processes cannot be spawned.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
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
    from swpipe_core.engine import SWPipeline
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
    for case, (kwargs, exc, parts) in sorted(tb.BAD_ARGUMENTS.items()):
        plan = PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule()})
        try:
            SWPipeline(plan, **{"device": "cpu", **kwargs})
            tally("engine arguments", False, f"{case} accepted")
        except exc as err:
            tally("engine arguments", all(p in str(err) for p in parts), case)
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


# ----------------------------------------------------------------------------- report

def _kib(n: int) -> str:
    return f"{n / 1024:+.1f} KiB"


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
        "(`SWPipeline._join_timeout`, 5 s): the worker cannot be interrupted, so the caller gets the error once "
        "that wait expires, and the thread exits by itself when the task returns. Before the fix to "
        "`_Workers.stop` (`swpipe_core/workers.py`: the wait is now a budget per thread over all calls) it happened "
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
    parser.add_argument("--skip-multirank", action="store_true", help="do not spawn the two gloo ranks")
    parser.add_argument("--out", default=None, help="markdown output (default benchmarks/RELIABILITY.md)")
    args = parser.parse_args(argv)
    out_path = args.out or (None if args.quick else str(ROOT / "benchmarks" / "RELIABILITY.md"))
    n_fuzz, n_cycles, n_iters, n_pairs, n_chaos = (100, 200, 2000, 20, 30) if args.quick else (1000, 1000, 10_000, 200, 300)

    t0 = time.perf_counter()
    res: Dict[str, Any] = {}
    steps = [("faults", fault_matrix), ("bad_input", bad_input), ("fuzz", lambda: fuzz(n_fuzz)),
             ("multirank", None if args.skip_multirank else multirank),
             ("leaks", lambda: leaks(n_cycles, n_iters)), ("stress", lambda: stress(n_pairs, n_chaos))]
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
        print(f"[reliability] {name} done in {time.perf_counter() - t:.1f} s", flush=True)
    text = render(res, args, time.perf_counter() - t0)
    print(text)
    if out_path:
        Path(out_path).write_text(text + "\n", encoding="utf-8")
        print(f"[reliability] wrote {out_path}")
    bad = (res["faults"]["surfaced"] != res["faults"]["tried"] or res["faults"]["leaked"] or res["faults"]["hangs"]
           or res["bad_input"]["tried"] != res["bad_input"]["rejected"] or res["fuzz"]["hangs"]
           or res["fuzz"]["failed"] or res["stress"]["problems"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
