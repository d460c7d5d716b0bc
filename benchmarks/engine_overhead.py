"""Engine overhead, measured side by side in one run.

(a) Dispatch overhead of SWPipeline per task per iteration, for no-op tasks,
    against a plain Python loop calling the same functions, on several plan
    shapes. Next to it, the floor no threaded engine can beat on this
    machine: one round trip between two Python threads (queue put/get), since
    each period hands work to a worker and waits for it once.
(b) Overlap: a two-thread plan of sleep workloads (io 10 ms at stage 0 on
    thread "io", compute 10 ms at stage 1 on thread "compute"); the measured
    steady-state period against the ideal max(io, compute), and against the
    serial run.
(c) Breakdown (issue 14): what each per-period and per-task piece of the
    engine costs on its own (queue put/get, signal set/wait, a thread round
    trip, iteration state + context creation, per-task signal bookkeeping,
    the profiler check), then the fitted cost of a single-group plan (run
    inline on the caller's thread, no worker) over a plain loop, as
    ``a + b * tasks`` per period (least squares over 1..32 tasks, best of the
    rounds), and a two-group plan's period in thread round trips.
(d) Measuring while running (issue 47): the same no-op plans pipelined with
    nothing around their tasks, with a pass-through ``instrument`` wrapper
    (the dispatch alone) and with ``RollingCosts`` (a rolling window of
    every task's host time), side by side in us/task; the modes alternate
    round by round so that each sees the same machine load.

Targets: (issue 4) overhead <= 30 us per task, overlap period within 5 % of
the ideal; (issue 14) single-group plan <= 5 us per period + <= 1 us per task
over a plain loop, two-group plan <= 1.2 round trips per period, overlap
speedup >= 1.95x serial.

    python benchmarks/engine_overhead.py            # full
    python benchmarks/engine_overhead.py --quick    # fewer iterations
    python benchmarks/engine_overhead.py --only-instrument   # (d) alone
"""

from __future__ import annotations

import argparse
import platform
import queue
import statistics
import threading
import time
from typing import Callable, Dict, List, Tuple

import torch

from swpipe import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule


def noop(ctx) -> None:
    return None


def chain_plan(n_tasks: int, groups: List[str], depth: int) -> PipelinePlan:
    """n no-op tasks in a dependency chain, spread over stages 0..depth-1 and the given groups."""
    sched = {}
    for k in range(n_tasks):
        stage = k * depth // n_tasks
        sched[PipelineTask(f"T{k}", noop)] = TaskSchedule(stage, None, groups[stage % len(groups)])
    deps = [(f"T{k}", f"T{k - 1}") for k in range(1, n_tasks)]
    return PipelinePlan(sched, intra_iter_deps=deps)


def example_plan() -> PipelinePlan:
    """The two-thread H2D/Fwd/Bwd/Opt example: H2D (stage 0, io) -> Forward, Backward, Optim (stage 1, compute)."""
    t = {n: PipelineTask(n, noop) for n in ("H2D", "Forward", "Backward", "Optim")}
    return PipelinePlan(
        {t["H2D"]: TaskSchedule(0, "memcpy", "io"), t["Forward"]: TaskSchedule(1, None, "compute"),
         t["Backward"]: TaskSchedule(1, None, "compute"), t["Optim"]: TaskSchedule(1, None, "compute")},
        intra_iter_deps=[("Forward", "H2D"), ("Backward", "Forward"), ("Optim", "Backward")],
    )


def plain_loop(n_tasks: int, iters: int) -> float:
    fns = [noop] * n_tasks
    t0 = time.perf_counter()
    for i in range(iters):
        ctx = None
        for fn in fns:
            fn(ctx)
    return time.perf_counter() - t0


def thread_round_trip(n: int) -> float:
    """Seconds per put/get round trip between the main thread and one worker thread."""
    to_worker: "queue.SimpleQueue" = queue.SimpleQueue()
    back: "queue.SimpleQueue" = queue.SimpleQueue()

    def echo() -> None:
        while True:
            item = to_worker.get()
            back.put(item)
            if item is None:
                return

    t = threading.Thread(target=echo, name="bench-echo")
    t.start()
    t0 = time.perf_counter()
    for i in range(n):
        to_worker.put(i)
        back.get()
    el = time.perf_counter() - t0
    to_worker.put(None)
    back.get()
    t.join()
    return el / n


def median_of(fn: Callable[[], float], rounds: int) -> float:
    return statistics.median(fn() for _ in range(rounds))


def _per_op(fn: Callable[[int], None], n: int, rounds: int) -> float:
    """Best-of-rounds seconds per operation of ``fn(n)`` (which performs n operations)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def breakdown(n: int, rounds: int) -> List[Tuple[str, float]]:
    """Seconds per operation of each piece of the engine's per-period and per-task work."""
    from swpipe_core.engine.dispatch import profiler_active
    from swpipe_core.engine.tasks import Flag, IterState
    from swpipe_core.plan import IterContext

    q: "queue.SimpleQueue" = queue.SimpleQueue()
    lock = threading.Lock()

    def put_get(k: int) -> None:
        for i in range(k):
            q.put(i)
            q.get()

    def flag_set_wait(k: int) -> None:
        for _ in range(k):
            f = Flag()
            f.set()
            f.wait(1.0)

    def new_iteration(k: int) -> None:
        for i in range(k):
            IterState(i, IterContext(i, i), 4)

    def bookkeeping(k: int) -> None:  # what a worker task does after fn: signal under the run lock
        st = IterState(0, None, k)
        for i in range(k):
            with lock:
                st.done[i] = True
                w = st.waiters.pop(i, None)
                st.remaining -= 1
                last = st.remaining == 0
            if w is not None or last:
                pass

    def profiler_check(k: int) -> None:
        for _ in range(k):
            profiler_active()

    def noop_call(k: int) -> None:
        for _ in range(k):
            noop(None)

    rows = [("queue put + get (one thread)", _per_op(put_get, n, rounds)),
            ("signal: new flag, set, wait (uncontended)", _per_op(flag_set_wait, n, rounds)),
            ("main <-> worker thread round trip", statistics.median(thread_round_trip(n // 10) for _ in range(rounds))),
            ("new iteration: state + context (per period)", _per_op(new_iteration, n, rounds)),
            ("worker task signal bookkeeping (lock, flags)", _per_op(bookkeeping, n, rounds)),
            ("profiler-active check (per period)", _per_op(profiler_check, n, rounds)),
            ("a plain Python call (reference)", _per_op(noop_call, n, rounds))]
    return rows


def single_group_fit(iters: int, rounds: int) -> Tuple[float, float, List[Tuple[int, float]]]:
    """Per-period cost over a plain loop of single-group plans (inline, no thread) = a + b * tasks."""
    points = []
    for n in (1, 2, 4, 8, 16, 32):
        pipe = SWPipeline(chain_plan(n, ["default"], min(n, 2)), device="cpu")
        pipe.run(range(100))
        assert pipe.worker_threads == []
        pipelined = min(pipe.run(range(iters)) for _ in range(rounds))
        loop = min(plain_loop(n, iters) for _ in range(rounds))
        points.append((n, (pipelined - loop) / iters))
    xs, ys = [float(x) for x, _ in points], [y for _, y in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b, points


def two_group_periods(iters: int, rounds: int) -> List[Tuple[str, float, float]]:
    """(label, seconds per period, seconds per round trip) of the H2D/Fwd/Bwd/Opt example, one group inline or none.

    Period and round trip are each the best of ``rounds``, taken alternately
    so that both see the same machine load.
    """
    out = []
    for label, caller in (("io worker + compute inline (caller_group='compute')", "compute"),
                          ("io worker + compute worker (caller_group=None)", None)):
        pipe = SWPipeline(example_plan().replace(caller_group=caller), device="cpu")
        pipe.run(range(50))
        periods, trips = [], []
        for _ in range(rounds):
            periods.append(pipe.run(range(iters)) / iters)
            trips.append(thread_round_trip(iters))
        out.append((label, min(periods), min(trips)))
    return out


def overhead_rows(iters: int, rounds: int) -> List[Tuple[str, int, int, float, float, float, float]]:
    shapes = [
        ("1 task, 1 thread, depth 1", chain_plan(1, ["default"], 1)),
        ("4 tasks, 1 thread, depth 2", chain_plan(4, ["default"], 2)),
        ("H2D/Fwd/Bwd/Opt example, 2 threads, depth 2", example_plan()),
        ("8 tasks, 1 thread, depth 3", chain_plan(8, ["default"], 3)),
        ("8 tasks, 3 threads, depth 3", chain_plan(8, ["io", "dist", "compute"], 3)),
        ("32 tasks, 1 thread, depth 2", chain_plan(32, ["default"], 2)),
    ]
    rows = []
    for label, plan in shapes:
        n = len(plan.task_names)
        pipe = SWPipeline(plan, device="cpu")
        pipe.run(range(50))  # warm up threads, allocator, caches
        pipelined = median_of(lambda: pipe.run(range(iters)), rounds)
        serial = median_of(lambda: pipe.run_serial(range(iters)), rounds)
        loop = median_of(lambda: plain_loop(n, iters), rounds)
        per_task = (pipelined - loop) / (n * iters)
        per_task_serial = (serial - loop) / (n * iters)
        per_period = (pipelined - loop) / iters
        rows.append((label, n, len({plan.sched(x).thread_group for x in plan.task_names}),
                     loop / (n * iters), per_task, per_task_serial, per_period))
    return rows


def overlap(io_s: float, compute_s: float, iters: int) -> Dict[str, float]:
    durations: Dict[str, List[float]] = {"io": [], "compute": []}

    def sleeper(kind: str, seconds: float) -> Callable:
        def fn(ctx) -> None:
            t0 = time.perf_counter()
            time.sleep(seconds)
            durations[kind].append(time.perf_counter() - t0)
        return fn

    plan = PipelinePlan({PipelineTask("IO", sleeper("io", io_s)): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Compute", sleeper("compute", compute_s)): TaskSchedule(1, None, "compute")},
                        intra_iter_deps=[("Compute", "IO")])
    pipe = SWPipeline(plan, device="cpu")
    it = pipe.fill_pipeline(range(iters))
    stamps = []
    while True:
        try:
            pipe.progress(it)
        except StopIteration:
            break
        stamps.append(time.perf_counter())
    pipe.drain()
    steady = stamps[2:-2]  # skip fill and drain periods
    period = (steady[-1] - steady[0]) / (len(steady) - 1)
    actual_io = statistics.mean(durations["io"])
    actual_compute = statistics.mean(durations["compute"])
    serial = pipe.run_serial(range(max(10, iters // 4))) / max(10, iters // 4)
    return {
        "period": period,
        "ideal": max(io_s, compute_s),
        "ideal_actual": max(actual_io, actual_compute),
        "io_actual": actual_io,
        "compute_actual": actual_compute,
        "serial": serial,
    }


def passthrough(run_task, task, ctx) -> None:
    run_task(task, ctx)


def instrument_rows(iters: int, rounds: int) -> List[Tuple[str, int, float, float, float]]:
    """(plan, tasks, us/task bare, with a pass-through wrapper, with RollingCosts), medians over alternating rounds."""
    from swpipe_core.measure.rolling import RollingCosts

    shapes = [("4 tasks, 1 thread, depth 2", chain_plan(4, ["default"], 2)),
              ("H2D/Fwd/Bwd/Opt example, 2 threads, depth 2", example_plan()),
              ("8 tasks, 3 threads, depth 3", chain_plan(8, ["io", "dist", "compute"], 3))]
    rows = []
    for label, plan in shapes:
        n = len(plan.task_names)
        pipe = SWPipeline(plan, device="cpu")
        pipe.run(range(50))
        rolling = RollingCosts(window=256)
        times: Dict[str, List[float]] = {"bare": [], "pass": [], "rolling": []}
        for _ in range(rounds):
            times["bare"].append(pipe.run(range(iters)))
            with pipe.instrument(passthrough):
                times["pass"].append(pipe.run(range(iters)))
            with pipe.instrument(rolling):
                times["rolling"].append(pipe.run(range(iters)))
        pipe.close()
        rows.append((label, n, *(statistics.median(times[k]) / (n * iters) for k in ("bare", "pass", "rolling"))))
    return rows


def wrapper_call_costs(n: int, rounds: int) -> Tuple[float, float]:
    """Best-of-rounds seconds per call of the pass-through wrapper and of RollingCosts, in a loop, no engine."""
    from swpipe_core.measure.rolling import RollingCosts

    task = PipelineTask("T", noop)
    rolling = RollingCosts(window=256)

    def run_task(t, ctx) -> None:
        return None

    def through(k: int) -> None:
        for _ in range(k):
            passthrough(run_task, task, None)

    def timed(k: int) -> None:
        for _ in range(k):
            rolling(run_task, task, None)

    return _per_op(through, n, rounds), _per_op(timed, n, rounds)


def print_instrument_rows(iters: int, rounds: int) -> None:
    print(f"\n(d) measuring while running: pipelined us/task, {iters} iterations, median of {rounds} alternating rounds")
    header = f"{'plan':44s} {'tasks':>5s} {'bare':>8s} {'pass-through':>12s} {'RollingCosts':>12s} {'added':>8s}"
    print(header)
    print("-" * len(header))
    for label, n, bare, through, rolling in instrument_rows(iters, rounds):
        print(f"{label:44s} {n:5d} {bare * 1e6:8.2f} {through * 1e6:12.2f} {rolling * 1e6:12.2f} "
              f"{(rolling - bare) * 1e6:8.2f}")
    through, rolling = wrapper_call_costs(iters * 20, rounds)
    print(f"    the wrapper alone, called in a loop (best of {rounds}): pass-through {through * 1e6:.2f} us, "
          f"RollingCosts {rolling * 1e6:.2f} us per task execution")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    parser.add_argument("--only-instrument", action="store_true", help="only (d): the cost of measuring while running")
    args = parser.parse_args()
    iters, rounds, overlap_iters = (300, 3, 40) if args.quick else (2000, 5, 150)
    if args.only_instrument:
        print_instrument_rows(iters, rounds)
        return

    print(f"machine: {platform.processor() or platform.machine()}, {threading.active_count()} threads at start, "
          f"python {platform.python_version()}, torch {torch.__version__}")
    rt = statistics.median(thread_round_trip(2000) for _ in range(rounds))
    print(f"\n(a) dispatch overhead, no-op tasks, {iters} iterations, median of {rounds} rounds")
    print(f"    floor: one main<->worker thread round trip (queue put/get) = {rt * 1e6:.1f} us\n")
    header = f"{'plan':44s} {'tasks':>5s} {'thr':>3s} {'loop us/task':>12s} {'pipelined us/task':>17s} " \
             f"{'serial us/task':>14s} {'pipelined us/period':>19s} {'period/round trip':>17s}"
    print(header)
    print("-" * len(header))
    for label, n, groups, loop, per_task, per_serial, per_period in overhead_rows(iters, rounds):
        print(f"{label:44s} {n:5d} {groups:3d} {loop * 1e6:12.2f} {per_task * 1e6:17.1f} {per_serial * 1e6:14.2f} "
              f"{per_period * 1e6:19.1f} {per_period / rt:17.2f}")

    print(f"\n(b) overlap: io 10 ms (stage 0, thread io) | compute 10 ms (stage 1, thread compute), {overlap_iters} iterations")
    r = overlap(0.010, 0.010, overlap_iters)
    print(f"    sleep(10 ms) actually took: io {r['io_actual'] * 1e3:.3f} ms, compute {r['compute_actual'] * 1e3:.3f} ms")
    print(f"    steady-state period     {r['period'] * 1e3:8.3f} ms")
    print(f"    ideal max(io, compute)  {r['ideal'] * 1e3:8.3f} ms   -> period / ideal = {r['period'] / r['ideal']:.3f}")
    print(f"    ideal with actual sleeps{r['ideal_actual'] * 1e3:8.3f} ms   -> period / ideal = {r['period'] / r['ideal_actual']:.3f}")
    print(f"    serial per iteration    {r['serial'] * 1e3:8.3f} ms   -> speedup = {r['serial'] / r['period']:.2f}x")

    print(f"\n(c) breakdown, best of {rounds} rounds")
    for label, sec in breakdown(iters * 10, rounds):
        print(f"    {label:48s} {sec * 1e6:8.3f} us")
    a, b, points = single_group_fit(iters, rounds)
    print("    single-group plan (inline, no worker thread) over a plain loop, per period:")
    print("      " + ", ".join(f"{n} tasks {y * 1e6:.2f} us" for n, y in points))
    print(f"      fit: {a * 1e6:.2f} us per period + {b * 1e6:.3f} us per task   (target <= 5 us + <= 1 us)")
    for label, period, trip in two_group_periods(iters, rounds):
        print(f"    {label:52s} {period * 1e6:7.1f} us/period, round trip {trip * 1e6:5.1f} us -> "
              f"{period / trip:.2f} round trips per period (target <= 1.2 with one group inline)")
    print_instrument_rows(iters, rounds)


if __name__ == "__main__":
    main()
