"""What two Python threads of torch work gain on this machine, by op size, and what it does to a plan's tasks.

    python benchmarks/gil_retakes.py           # both parts (about 40 s)
    python benchmarks/gil_retakes.py --quick   # small sizes, a few iterations (the test's smoke run)
    python benchmarks/gil_retakes.py --torchrec   # also (c), with the [peer] extra installed

Every torch call from Python releases the GIL for the kernel and takes it
back after. With a second busy thread, each take-back may wait for that
thread to let go and for a wake-up across cores, so what two threads gain
depends on how fine their ops are, not only on how many cores are free.

(a) **Parallelism by op size**: the same GIL-free work (``torch.mm`` of
``n x n``, and ``hashlib.sha256`` of 1 MiB, the probe of
``swpipe_core.measure.calibrate.measure_cores``) on two threads at once against one
after another: ``speedup = (time of both in turn) / (time together)``; 2 on
two idle cores, below 1 when the hand-offs cost more than the overlap gains.
Then a chain of matmuls beside a pure-Python thread, with the default switch
interval and with 0.1 ms: the chain waits up to one switch interval at every
take-back.

(b) **A DLRM plan's tasks, one thread against one thread per stream**: the
demo's workload under ``sparse_dist`` and ``fused_sparse_dist``, each task's
median host time from the engine's timeline (iterations after a warm-up),
with the plan's thread groups as TorchRec threads them and with
``with_thread_map(plan, "by_stream")``, beside each task's torch calls per
iteration (counted by a ``TorchFunctionMode`` in serial iterations). Tasks
moved to their own thread slow while they overlap the main thread's. A line
per plan then weighs what the split gains against what it costs on the
caller's thread (:func:`caller_balance`): the work moved off it, and how much
slower the tasks left on it ran. While that thread is busy the whole period,
one thread per stream wins only if the second is smaller than the first.

(c) ``--torchrec``: the same for our ``sparse_dist`` plan driving TorchRec's
own model (``benchmarks/vs_torchrec.py``'s), one thread against by stream
(its side threads handed off first, and after ``Forward``),
with the same balance line per run: what bounds ``sparse_dist+by_stream``
against TorchRec's one-thread pipeline there.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode

from swpipe.commands._args import add_keep_freed_memory, apply_keep_freed_memory


def _mm_work(n: int, reps: int) -> Callable[[], None]:
    x = torch.randn(n, n)

    def work() -> None:
        for _ in range(reps):
            torch.mm(x, x)
    return work


def _sha_work(reps: int) -> Callable[[], None]:
    data = b"x" * (1 << 20)

    def work() -> None:
        for _ in range(reps):
            hashlib.sha256(data).digest()
    return work


def two_thread_speedup(work: Callable[[], None]) -> float:
    """``(work(); work())`` time over the time of ``work`` on two threads at once."""
    t0 = time.perf_counter()
    work()
    work()
    in_turn = time.perf_counter() - t0
    threads = [threading.Thread(target=work, name=f"gil-retakes-{k}") for k in range(2)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return in_turn / (time.perf_counter() - t0)


def beside_python(chain: Callable[[], None]) -> float:
    """How many times slower ``chain`` runs while a pure-Python thread spins beside it."""
    t0 = time.perf_counter()
    chain()
    alone = time.perf_counter() - t0
    stop = threading.Event()

    def spin() -> None:
        d: Dict[int, int] = {}
        while not stop.is_set():
            for i in range(200):
                d[i] = i * 2

    side = threading.Thread(target=spin, name="gil-retakes-python")
    side.start()
    try:
        t0 = time.perf_counter()
        chain()
        beside = time.perf_counter() - t0
    finally:
        stop.set()
        side.join()
    return beside / alone


def part_a(quick: bool, repeats: int) -> Dict[str, List[float]]:
    sizes = [(64, 2000), (256, 40)] if quick else [(64, 20000), (256, 400), (1024, 8)]
    works = [(f"mm {n}x{n}", _mm_work(n, reps)) for n, reps in sizes] + [("sha256 1 MiB", _sha_work(4 if quick else 40))]
    out: Dict[str, List[float]] = {}
    print("(a) two threads of the same work, together against one after another (2 = two free cores)")
    for name, work in works:
        work()  # warm
        out[name] = [two_thread_speedup(work) for _ in range(repeats)]
        print(f"    {name:14s} " + " ".join(f"{s:.2f}x" for s in out[name]))
    chain = _mm_work(256, 20 if quick else 200)
    chain()
    before = sys.getswitchinterval()
    try:
        slow_default = beside_python(chain)
        sys.setswitchinterval(1e-4)
        slow_short = beside_python(chain)
    finally:
        sys.setswitchinterval(before)
    out["beside python"] = [slow_default, slow_short]
    print(f"    a chain of 256x256 matmuls beside a pure-Python thread: x{slow_default:.1f} slower "
          f"(switch interval {before * 1e3:g} ms), x{slow_short:.1f} (0.1 ms)")
    return out


class _CallCounter(TorchFunctionMode):
    """Counts torch calls made from Python (each one releases and retakes the GIL)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Optional[dict] = None) -> Any:
        self.calls += 1
        return func(*args, **(kwargs or {}))


def _calls_per_task(plan: Any, batches: Sequence[Any], n: int) -> Dict[str, float]:
    from swpipe_core.engine.pipeline import SWPipeline

    counts: Dict[str, List[int]] = {}

    def counted(run: Any, task: Any, ctx: Any) -> None:
        with _CallCounter() as counter:
            run(task, ctx)
        counts.setdefault(task.name, []).append(counter.calls)

    pipe = SWPipeline(plan, device="cpu")
    with pipe.instrument(counted):
        for i in range(n):
            pipe.run_one_serial_iter(batches[i % len(batches)], iter_idx=i)
    return {k: statistics.median(v) for k, v in counts.items()}


def _host_times(plan: Any, batches: Sequence[Any], skip: int) -> Dict[str, Any]:
    from swpipe_core.engine.pipeline import SWPipeline

    with SWPipeline(plan, device="cpu", record_timeline=True) as pipe:
        seconds = pipe.run(iter(batches))
        events = [e for e in pipe.timeline if e.iteration >= skip and e.kind == "host"]
    per: Dict[str, List[float]] = {}
    for e in events:
        per.setdefault(e.task, []).append(e.end - e.start)
    return {"period": seconds / len(batches), "tasks": {k: statistics.median(v) for k, v in per.items()}}


def caller_balance(one: Dict[str, float], split: Dict[str, float], split_plan: Any,
                   period_s: float) -> Dict[str, float]:
    """What moving tasks off the caller's thread gained and cost there, from two runs' host times per task.

    Parameters
    ----------
    one, split : dict
        Host seconds per task per iteration with the plan's threads as
        TorchRec's (every task on the caller's thread) and split
        (``split_plan``, e.g. one thread per stream).
    split_plan : PipelinePlan
        The split plan: its ``caller_group`` is the caller's thread.
    period_s : float
        The split run's seconds per iteration.

    Returns
    -------
    dict
        ``moved_s`` (one-thread time of the tasks moved off the caller's
        thread), ``moved_there_s`` (their time on the other threads),
        ``left_one_s`` / ``left_split_s`` (the tasks left on the caller's
        thread, one thread and split), ``caller_busy`` (``left_split_s`` over
        the period) and ``net_s`` (``left_split_s - left_one_s - moved_s``:
        above 0, the caller's thread lost more than it shed).

    Examples
    --------
    >>> from swpipe_core.plan import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"Copy": TaskSchedule(0, thread_group="memcpy"), "Fwd": TaskSchedule(1)})
    >>> b = caller_balance({"Copy": 1.0, "Fwd": 8.0}, {"Copy": 3.0, "Fwd": 8.5}, plan, period_s=8.6)
    >>> b["moved_s"], b["left_split_s"] - b["left_one_s"], b["net_s"], round(b["caller_busy"], 2)
    (1.0, 0.5, -0.5, 0.99)
    """
    moved = [t for t in split_plan.task_names if split_plan.sched(t).thread_group != split_plan.caller_group]
    left = [t for t in split_plan.task_names if t not in moved]
    out = {"moved_s": sum(one.get(t, 0.0) for t in moved), "moved_there_s": sum(split.get(t, 0.0) for t in moved),
           "left_one_s": sum(one.get(t, 0.0) for t in left), "left_split_s": sum(split.get(t, 0.0) for t in left)}
    out["caller_busy"] = out["left_split_s"] / period_s if period_s > 0 else 0.0
    out["net_s"] = out["left_split_s"] - out["left_one_s"] - out["moved_s"]
    return out


def _balance_line(b: Dict[str, float], caller: Optional[str]) -> str:
    return (f"caller's thread ({caller}) busy {b['caller_busy']:.0%} of the period; moved off it "
            f"{b['moved_s'] * 1e3:.3f} ms/it (one-thread time), {b['moved_there_s'] * 1e3:.3f} there; "
            f"its own tasks {b['left_one_s'] * 1e3:.3f} -> {b['left_split_s'] * 1e3:.3f} ms/it: "
            f"net {b['net_s'] * 1e3:+.3f} ms/it on the caller's thread")


def part_b(quick: bool) -> Dict[str, Any]:
    from swpipe.workloads.dlrm import DLRMConfig, DLRMWorkload, SyntheticData, init_distributed
    from swpipe.workloads.tasks import plan_for
    from swpipe_core.engine.workers import with_thread_map

    config = DLRMConfig.preset("test" if quick else "demo")
    iters, skip = (8, 2) if quick else (40, 10)
    out: Dict[str, Any] = {}
    print("\n(b) host time per task (median, ms), the plan's threads as TorchRec's / one thread per stream "
          f"({config.batch_size} per batch, {iters} iterations, the first {skip} left out)")
    with init_distributed() as env:
        batches = SyntheticData(config, env.world_size, env.rank).batches(iters)
        for name in ("sparse_dist", "fused_sparse_dist"):
            calls = _calls_per_task(plan_for(name, DLRMWorkload(config, env)), batches, 3 if quick else 5)
            one = _host_times(plan_for(name, DLRMWorkload(config, env)), batches, skip)
            by_stream_plan = with_thread_map(plan_for(name, DLRMWorkload(config, env)), "by_stream")
            split = _host_times(by_stream_plan, batches, skip)
            out[name] = {"calls": calls, "as_torchrec": one, "by_stream": split}
            print(f"  {name}: {one['period'] * 1e3:.2f} ms/it as TorchRec threads it, "
                  f"{split['period'] * 1e3:.2f} ms/it by stream")
            print(f"    {'task':16s} {'thread (by stream)':>18s} {'torch calls':>11s} {'one thread':>10s} "
                  f"{'by stream':>9s} {'ratio':>6s}")
            for task in by_stream_plan.task_names:
                a, b = one["tasks"].get(task, 0.0), split["tasks"].get(task, 0.0)
                ratio = f"{b / a:.2f}" if a > 0 else "-"
                print(f"    {task:16s} {by_stream_plan.sched(task).thread_group:>18s} {calls.get(task, 0):>11.0f} "
                      f"{a * 1e3:>10.3f} {b * 1e3:>9.3f} {ratio:>6s}")
            out[name]["balance"] = caller_balance(one["tasks"], split["tasks"], by_stream_plan, split["period"])
            print("    " + _balance_line(out[name]["balance"], by_stream_plan.caller_group))
    return out


def part_c(quick: bool, rounds: int) -> Dict[str, Any]:
    import logging
    import warnings

    from swpipe.workloads.dlrm import DLRMConfig, init_distributed
    from swpipe.workloads.torchrec_peer import build_model, peer_available, swpipe_plan, to_torchrec_batches

    if not peer_available():
        print("\n(c) skipped: TorchRec is not importable here (install the [peer] extra)")
        return {}
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    config = DLRMConfig.preset("test" if quick else "demo")
    iters, skip = (8, 2) if quick else (60, 10)
    late = "by_stream, after Forward"  # the side threads handed off after Forward (swpipe_core.order.hand_off_after)
    out: Dict[str, Any] = {None: [], "by_stream": [], late: [], "balance": [], "balance late": []}
    with init_distributed():
        batches = to_torchrec_batches(config, iters)
        for _ in range(rounds):
            one = _host_times(swpipe_plan("sparse_dist", build_model(config), {}), batches, skip)
            out[None].append(one)
            for key, after in (("by_stream", None), (late, "Forward")):
                split_plan = swpipe_plan("sparse_dist", build_model(config), {}, "by_stream", after)
                split = _host_times(split_plan, batches, skip)
                out[key].append(split)
                out["balance" if after is None else "balance late"].append(
                    caller_balance(one["tasks"], split["tasks"], split_plan, split["period"]))
    print(f"\n(c) our sparse_dist plan on TorchRec's model, host time per task (median, ms), {rounds} runs each: "
          "one thread / by stream / by stream, handed off after Forward")
    for task in out[None][0]["tasks"]:
        cols = [" ".join(f"{r['tasks'][task] * 1e3:.3f}" for r in out[k]) for k in (None, "by_stream", late)]
        print(f"    {task:16s} " + " / ".join(cols))
    print("    per iteration       " + " / ".join(" ".join(f"{r['period'] * 1e3:.2f}" for r in out[k])
                                                 for k in (None, "by_stream", late)))
    for key in ("balance", "balance late"):
        print(f"  {'handed off first' if key == 'balance' else 'handed off after Forward'}:")
        for b in out[key]:
            print("    " + _balance_line(b, split_plan.caller_group))
    return out


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few iterations (smoke run)")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, as the demo)")
    parser.add_argument("--torchrec", action="store_true", help="also part (c): TorchRec's model (the [peer] extra)")
    add_keep_freed_memory(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(apply_keep_freed_memory(args))
    print(f"gil_retakes: {len(os.sched_getaffinity(0))} CPU(s), torch {torch.__version__}, "
          f"{torch.get_num_threads()} intra-op thread(s), load average {os.getloadavg()[0]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    got = {"a": part_a(args.quick, 1 if args.quick else args.repeats), "b": part_b(args.quick)}
    if args.torchrec:
        got["c"] = part_c(args.quick, 1 if args.quick else 3)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return got


if __name__ == "__main__":
    main()
