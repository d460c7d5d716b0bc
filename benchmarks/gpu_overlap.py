"""Copy/compute overlap on a GPU, the engine's CUDA-path cost, and whether the simulator predicts both.

What a GPU session runs first (with ``python -m pytest -m cuda``), measured side by side in one run:

(a) Overlap. A two-task plan: ``Copy`` moves a pinned host batch to the device on the
    ``memcpy`` stream (stage 0, thread group ``io``), ``Compute`` runs a chain of
    matmuls on it on the default stream (stage 1, the caller's group). The chain is
    sized so that compute takes about as long as the copy. Interleaved rounds of
    ``run_serial`` (copy, then compute) and ``run`` (pipelined); the ideal pipelined
    period is ``max(copy, compute)`` on the device, so the ideal speedup is
    ``(copy + compute) / max(copy, compute)``, ~2x here. The pipelined results must
    equal the serial ones (the device events order every read after its copy).
(b) Prediction. ``TaskProfiler`` measures each task's host and device time,
    ``CostModel.from_profile`` turns them into a cost model and ``simulate(...,
    device=...)`` predicts both periods; printed beside the measured ones with the error.
(c) Engine cost on CUDA. A chain of ``n`` tasks, each launching one tiny kernel, on one
    thread group (run inline: no worker) against a plain loop launching the same
    kernels; per period and per task, in microseconds. On CUDA each task also records
    a device event and enters its stream, which a CPU run does not pay.

    python benchmarks/gpu_overlap.py                          # needs a CUDA device
    python benchmarks/gpu_overlap.py --device cpu --quick     # smoke run on a CPU (no overlap to expect)

Targets (what a user expects; none is a unit test): pipelined speedup >= 0.9 x the
ideal; predicted periods within 10 % of the measured ones; engine cost per task on
CUDA within a few microseconds of the CPU figure (``engine_overhead.py``).
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time
from typing import Any, Callable, Dict, List, Tuple

import torch

from swpipe_core.engine import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.profiler import TaskProfiler


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def overlap_plan(device: torch.device, weight: torch.Tensor, matmuls: int, n: int, out: List[Any]) -> PipelinePlan:
    """Copy (stage 0, ``memcpy`` stream, ``io`` thread) -> Compute (stage 1, default stream, caller's thread)."""

    def copy(ctx) -> None:  # on a CPU ``.to`` would return the batch itself: copy it
        ctx.x = ctx.batch.to(device, non_blocking=True) if device.type == "cuda" else ctx.batch.clone()

    def compute(ctx) -> None:
        y = ctx.x[: n * n].view(n, n)
        for _ in range(matmuls):
            y = torch.tanh(y @ weight)  # tanh keeps the values bounded over a long chain
        out.append(y.sum())

    return PipelinePlan({PipelineTask("Copy", copy): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Compute", compute): TaskSchedule(1, None, "default")},
                        intra_iter_deps=[("Compute", "Copy")], caller_group="default")


def _size_compute(device: torch.device, host: torch.Tensor, weight: torch.Tensor, n: int) -> Tuple[int, float, float]:
    """Matmuls per Compute so that it takes about as long as the copy; (matmuls, copy s, one matmul s)."""
    move = (lambda: host.to(device, non_blocking=True)) if device.type == "cuda" else host.clone
    host_copy = min(_timed(move, device) for _ in range(5))
    x = torch.randn(n, n, device=device)
    one = min(_timed(lambda: torch.tanh(x @ weight), device) for _ in range(5))
    return max(1, round(host_copy / max(one, 1e-7))), host_copy, one


def measure_overlap(device: torch.device, mib: int, n: int, iters: int, rounds: int) -> Dict[str, Any]:
    """Serial vs pipelined over interleaved rounds, the tasks' profile and the simulator's prediction."""
    from autosched.costs import CostModel
    from autosched.simulate import simulate
    from autosched.verify import serial_plan, turned

    pin = device.type == "cuda"
    elems = max(mib * (1 << 20) // 4, n * n)
    hosts = [torch.randn(elems, pin_memory=pin) for _ in range(2)]  # two, so consecutive batches differ
    weight = torch.randn(n, n, device=device) / n ** 0.5
    matmuls, copy_s, one_s = _size_compute(device, hosts[0], weight, n)
    batches = [hosts[i % len(hosts)] for i in range(iters)]
    results: Dict[str, List[Any]] = {"serial": [], "pipelined": []}
    times: Dict[str, List[float]] = {"serial": [], "pipelined": []}
    for r in range(rounds):
        for mode in turned(("serial", "pipelined"), r):
            out: List[Any] = []
            with SWPipeline(overlap_plan(device, weight, matmuls, n, out), device=device) as pipe:
                runner = pipe.run_serial if mode == "serial" else pipe.run
                times[mode].append(_timed(lambda: runner(iter(batches)), device) / iters)
            results[mode] = [float(v) for v in out]
    out = []
    plan = overlap_plan(device, weight, matmuls, n, out)
    with SWPipeline(plan, device=device) as pipe:
        profile = TaskProfiler(pipe).profile(batches[0], num_warmup=2, num_measure=5, num_rounds=2)
    costs = CostModel.from_profile(profile, machine=_machine(device))
    sim_device = "cuda" if device.type == "cuda" else "cpu"
    predicted = {"pipelined": float(simulate(plan, costs, num_iterations=iters, device=sim_device).period),
                 "serial": float(simulate(serial_plan(plan), costs, num_iterations=iters, device=sim_device).period)}
    return dict(matmuls=matmuls, copy_s=copy_s, matmul_s=one_s, times=times, predicted=predicted, costs=costs,
                equal=len(results["serial"]) == len(results["pipelined"]) == iters
                and all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)  # a read before its copy is far off
                        for a, b in zip(results["serial"], results["pipelined"])))


def measure_engine_cost(device: torch.device, tasks: int, iters: int, rounds: int) -> Tuple[float, float]:
    """Microseconds per period and per task of a one-group chain of one-kernel tasks over a plain loop."""
    x = torch.zeros(16, device=device)

    def kernel(ctx) -> None:
        x.add_(1.0)

    def plain() -> None:
        for _ in range(iters):
            for _ in range(tasks):
                x.add_(1.0)

    sched = {PipelineTask(f"K{k}", kernel): TaskSchedule(0, None, "default") for k in range(tasks)}
    plan = PipelinePlan(sched, intra_iter_deps=[(f"K{k}", f"K{k - 1}") for k in range(1, tasks)])
    extra: List[float] = []
    with SWPipeline(plan, device=device) as pipe:
        for _ in range(rounds):
            loop = _timed(plain, device)
            engine = _timed(lambda: pipe.run(iter(range(iters))), device)
            extra.append((engine - loop) / iters)
    per_period = statistics.median(extra)  # may read below 0 when the difference is inside the noise
    return per_period * 1e6, per_period * 1e6 / tasks


def _machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"{platform.machine()} CPU, torch {torch.__version__}"


def main(argv: Any = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke run)")
    parser.add_argument("--mib", type=int, default=256, help="MiB copied per iteration (default 256)")
    parser.add_argument("--n", type=int, default=4096, help="matmul size (default 4096)")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_overlap.py: no CUDA device here; run it on a GPU, or pass --device cpu for a smoke run")
    if args.quick:
        args.mib, args.n, args.iters, args.rounds = 4, 128, 8, 2
    print(f"machine: {_machine(device)}; {args.mib} MiB copied and {args.n}x{args.n} matmuls per iteration, "
          f"{args.iters} iterations x {args.rounds} interleaved rounds")

    ov = measure_overlap(device, args.mib, args.n, args.iters, args.rounds)
    serial, piped = statistics.median(ov["times"]["serial"]), statistics.median(ov["times"]["pipelined"])
    copy_dev = ov["costs"]["Copy"].device_s or ov["costs"]["Copy"].host_s
    comp_dev = ov["costs"]["Compute"].device_s or ov["costs"]["Compute"].host_s
    ideal = (copy_dev + comp_dev) / max(copy_dev, comp_dev)
    print(f"(a) overlap: Copy {copy_dev * 1e3:.3f} ms, Compute {comp_dev * 1e3:.3f} ms ({ov['matmuls']} matmuls); "
          f"serial {serial * 1e3:.3f} ms/it, pipelined {piped * 1e3:.3f} ms/it: speedup {serial / piped:.2f}x "
          f"(ideal {ideal:.2f}x, {serial / piped / ideal:.0%} of it); pipelined results equal serial (rtol 1e-5): {ov['equal']}")
    for mode, measured in (("serial", serial), ("pipelined", piped)):
        pred = ov["predicted"][mode]
        print(f"(b) {mode}: predicted {pred * 1e3:.3f} ms/it, measured {measured * 1e3:.3f} ms/it, "
              f"error {100 * (pred / measured - 1):+.1f} %")
    per_period, per_task = measure_engine_cost(device, tasks=8, iters=200 if args.quick else 1000,
                                               rounds=2 if args.quick else 5)
    print(f"(c) engine over a plain loop, 8 one-kernel tasks on one group: {per_period:.1f} us/period, "
          f"{per_task:.2f} us/task")
    return dict(overlap=ov, serial_s=serial, pipelined_s=piped, ideal=ideal, engine_us=(per_period, per_task))


if __name__ == "__main__":
    main()
