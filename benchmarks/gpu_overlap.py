"""Copy/compute overlap on a CUDA device, the engine's CUDA-path cost, and whether the simulator predicts both.

What a GPU session runs first (with ``python -m pytest -m "cuda or gpu"``), measured side by side in one run. The
pipeline is written with :func:`swpipe.testing.kernels`, so the same code runs on a GPU (``--device cuda``), on
``swpipe.testing.FakeCuda`` (``--device fake``: the engine's CUDA path on a CPU, with seeded kernel delays and
its happens-before race check) and on the CPU (``--device cpu``: a smoke run).

(a) Overlap. A two-task plan: ``Copy`` moves the iteration's pinned host batch to the device on the ``memcpy``
    stream (stage 0, thread group ``io``); ``Compute`` (stage 1, the caller's group, the default stream) sums
    *every element* copied, then runs ``n`` spin kernels so that it takes about as long as the copy. Interleaved
    rounds of ``run_serial`` (copy, then compute) and ``run`` (pipelined); the ideal pipelined period is
    ``max(copy, compute)`` on the device, so the ideal speedup is ``(copy + compute) / max(copy, compute)``,
    ~2x here.

    Correctness is checked exactly, every iteration, in both modes. Each iteration has a host batch of its own,
    every element ``i + 1`` for iteration ``i`` (float64 integers: every partial sum is an exact integer, so the
    sum is exact in any reduction order), so Compute(i) must read ``elements * (i + 1)``. A read that starts
    before its copy ended, or reads part of it, sees the block's previous contents for the rest: another
    iteration's values, the fake's poison (NaN) or uninitialised memory, and gets another number. (The script
    used to sum only the first ``n * n`` elements of the copy, which arrive first, and to alternate two host
    buffers, so data two iterations stale looked right.) On the fake, the race check also names any read the
    streams do not order after its copy, whatever the timing.
(b) Prediction. ``TaskProfiler`` measures each task's host and device time, ``CostModel.from_profile`` turns
    them into a cost model and ``simulate(..., device=...)`` predicts both periods (the serial one with every
    task on the default stream, where ``run_serial`` runs them); printed beside the measured ones with the error.
(c) Engine cost on CUDA. A chain of 8 tasks, each launching one tiny kernel, on one thread group (run inline:
    no worker) against a plain loop launching the same kernels; per period and per task, in microseconds. On
    CUDA each task also records a device event and enters its stream, which a CPU run does not pay.

    python benchmarks/gpu_overlap.py                          # needs a CUDA device
    python benchmarks/gpu_overlap.py --device fake --quick    # the CUDA path on swpipe.testing.FakeCuda
    python benchmarks/gpu_overlap.py --device cpu --quick     # smoke run on a CPU (no overlap to expect)

Host memory: one pinned batch per iteration, ``iters x mib`` (2.5 GiB at the defaults).

Targets (what a user expects; none is a unit test): pipelined speedup >= 0.9 x the ideal; predicted periods
within 10 % of the measured ones; engine cost per task on CUDA within a few microseconds of the CPU figure
(``engine_overhead.py``). Timings on the fake measure the fake (Python executor threads), not a GPU.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from swpipe.testing import kernels
from swpipe_core.engine.device import Device, as_device
from swpipe_core.engine.pipeline import SWPipeline
from swpipe_core.plan import PipelinePlan, PipelineTask, TaskSchedule
from swpipe_core.measure.profiler import TaskProfiler

# Float64 holds every integer below 2**53 exactly, so sums of integer-valued batches are exact in any order.
DTYPE = torch.float64
# --device fake: each kernel waits up to this long first (seeded), so a missing wait also shows in the values
FAKE_DELAY_S = 0.001


def _streams(dev: Device) -> List[Any]:
    """The device streams this script's work runs on: the default one and the pipeline's ``memcpy``."""
    # new_stream is one stream per device and name, the one the pipeline resolves "memcpy" to
    return [dev.default_stream(), dev.new_stream("memcpy")]


def _sync(dev: Device) -> None:
    """Wait until the device has run everything queued so far on :func:`_streams` (nothing to wait for on a CPU)."""
    if not dev.is_async:
        return
    for stream in _streams(dev):
        event = dev.event()
        dev.record(event, stream)
        event.synchronize()  # torch.cuda.Event and the fake's event both block the host until the record ran


def _timed(fn: Callable[[], Any], dev: Device) -> float:
    _sync(dev)
    t0 = time.perf_counter()
    fn()
    _sync(dev)
    return time.perf_counter() - t0


def host_batches(k: Any, dev: Device, elems: int, iters: int) -> List[torch.Tensor]:
    """One host batch per iteration, every element of batch ``i`` equal to ``i + 1``; pinned on a CUDA device.

    Pinned, since a copy from pageable memory blocks the host until it ends (on CUDA and on the fake), and
    there would be no copy/compute overlap to measure.
    """
    return [k.pin(torch.full((elems,), float(i + 1), dtype=DTYPE)) if dev.is_async
            else torch.full((elems,), float(i + 1), dtype=DTYPE) for i in range(iters)]


def expected_sum(i: int, elems: int) -> float:
    """What Compute must read for iteration ``i``: every element of its batch, ``elems * (i + 1)``, exactly."""
    return float(elems * (i + 1))


def _upload(k: Any, dev: Device, host: torch.Tensor) -> Any:
    x = k.to_device(host)
    # on the CPU ``.to`` returns the batch itself: copy it, so Copy costs what a device's copy would
    return x if dev.is_async else x.clone()


def overlap_plan(k: Any, dev: Device, spin_s: float, spins: int, out: Dict[int, Any]) -> PipelinePlan:
    """Copy (stage 0, ``memcpy`` stream, ``io`` thread) -> Compute (stage 1, default stream, caller's thread).

    Compute puts each iteration's sum (a device tensor) in ``out[iteration]``; read them after the device synced.
    """

    def copy(ctx) -> None:
        ctx.x = _upload(k, dev, ctx.batch)

    def compute(ctx) -> None:
        # the sum first: it is the read a missing wait would let run while the copy still writes
        out[ctx.iter_idx] = k.sum(ctx.x)
        for _ in range(spins):
            k.spin(spin_s)  # device work as long as the copy, so that copy and compute overlap

    return PipelinePlan({PipelineTask("Copy", copy): TaskSchedule(0, "memcpy", "io"),
                         PipelineTask("Compute", compute): TaskSchedule(1, None, "default")},
                        intra_iter_deps=[("Compute", "Copy")], caller_group="default")


def check_sums(k: Any, out: Dict[int, Any], elems: int, iters: int) -> List[Tuple[int, Optional[float], float]]:
    """``(iteration, read, expected)`` for every iteration whose sum is missing or not exactly its expected value."""
    bad = []
    for i in range(iters):
        got = k.item(out[i]) if i in out else None
        want = expected_sum(i, elems)
        if got != want:  # NaN (the fake's poison) is != too
            bad.append((i, got, want))
    return bad


def _size_compute(k: Any, dev: Device, host: torch.Tensor, spins: int) -> Tuple[float, float, float]:
    """``(spin_s, copy_s, sum_s)``: each of Compute's ``spins`` spins lasts ``spin_s``, so that its sum and spins
    take about as long as the copy (``copy_s``, measured with the sum's ``sum_s`` on the device here)."""
    k.spin(1e-4)  # on CUDA the first spin times the spin rate (one synchronisation): not inside a measured run
    copy_s = min(_timed(lambda: _upload(k, dev, host), dev) for _ in range(5))
    x = _upload(k, dev, host)
    sum_s = min(_timed(lambda: k.sum(x), dev) for _ in range(5))
    return max(copy_s - sum_s, 0.0) / spins, copy_s, sum_s


def measure_overlap(dev: Any, mib: int, spins: int, iters: int, rounds: int) -> Dict[str, Any]:
    """Serial vs pipelined over interleaved rounds, every sum checked, the tasks' profile and the prediction.

    Parameters
    ----------
    dev : Device or anything :func:`swpipe_core.engine.device.as_device` takes (a fake's device too)
    mib : int
        MiB copied per iteration.
    spins : int
        Spin kernels in each Compute, after its sum.
    iters, rounds : int

    Returns
    -------
    dict
        ``equal`` (every sum of both modes exact, so pipelined equals serial), ``mismatches`` (mode ->
        ``(round, iteration, read, expected)`` of each sum that is not), ``races`` (the fake's race reports;
        ``None`` on other devices), ``times`` (mode -> seconds per iteration, one per round), ``predicted``
        (mode -> period), ``costs`` (the profiled CostModel), ``elements``, ``spin_s``, ``copy_s``, ``sum_s``.
    """
    from autosched.model.costs import CostModel
    from autosched.model.simulate import simulate
    from autosched.verify.candidates import serial_plan
    from autosched.verify.measure import turned

    dev = as_device(dev)
    k = kernels(dev)
    elems = max(1, mib * (1 << 20) // torch.empty((), dtype=DTYPE).element_size())
    batches = host_batches(k, dev, elems, iters)
    spin_s, copy_s, sum_s = _size_compute(k, dev, batches[0], spins)
    mismatches: Dict[str, List[Tuple[int, int, Optional[float], float]]] = {"serial": [], "pipelined": []}
    times: Dict[str, List[float]] = {"serial": [], "pipelined": []}
    for r in range(rounds):
        for mode in turned(("serial", "pipelined"), r):
            out: Dict[int, Any] = {}
            with SWPipeline(overlap_plan(k, dev, spin_s, spins, out), device=dev) as pipe:
                runner = pipe.run_serial if mode == "serial" else pipe.run
                times[mode].append(_timed(lambda: runner(iter(batches)), dev) / iters)
            mismatches[mode] += [(r,) + bad for bad in check_sums(k, out, elems, iters)]
    plan = overlap_plan(k, dev, spin_s, spins, {})
    with SWPipeline(plan, device=dev) as pipe:
        profile = TaskProfiler(pipe, num_warmup=2, num_measure=5, num_rounds=2).profile(batches[0])
    _sync(dev)
    costs = CostModel.from_profile(profile, machine=_machine(dev))
    sim_device = "cuda" if dev.is_async else "cpu"
    # run_serial runs every task on the caller's thread *and on the default stream*: serial_plan keeps each
    # task's stream (the engine's stage-0 plan), whose copies would overlap the compute in the model
    serial = serial_plan(plan)
    serial = serial.replace(schedule={t: TaskSchedule(0, None, s.thread_group, s.globally_ordered)
                                      for t, s in serial.schedule.items()})
    predicted = {"pipelined": float(simulate(plan, costs, num_iterations=iters, device=sim_device).period_s),
                 "serial": float(simulate(serial, costs, num_iterations=iters, device=sim_device).period_s)}
    fake = getattr(dev, "fake", None)
    return dict(spin_s=spin_s, copy_s=copy_s, sum_s=sum_s, elements=elems, times=times, predicted=predicted,
                costs=costs, mismatches=mismatches, races=None if fake is None else [str(r) for r in fake.races],
                equal=not mismatches["serial"] and not mismatches["pipelined"])


def measure_engine_cost(dev: Any, tasks: int, iters: int, rounds: int) -> Tuple[float, float]:
    """Microseconds per period and per task of a one-group chain of one-kernel tasks over a plain loop."""
    dev = as_device(dev)
    k = kernels(dev)
    x, one = k.full(16, 0.0), k.full(16, 1.0)

    def kernel(ctx) -> None:
        k.add_(x, one)

    def plain() -> None:
        for _ in range(iters):
            for _ in range(tasks):
                k.add_(x, one)

    sched = {PipelineTask(f"K{t}", kernel): TaskSchedule(0, None, "default") for t in range(tasks)}
    plan = PipelinePlan(sched, intra_iter_deps=[(f"K{t}", f"K{t - 1}") for t in range(1, tasks)])
    extra: List[float] = []
    with SWPipeline(plan, device=dev) as pipe:
        for _ in range(rounds):
            loop = _timed(plain, dev)
            engine = _timed(lambda: pipe.run(iter(range(iters))), dev)
            extra.append((engine - loop) / iters)
    per_period = statistics.median(extra)  # may read below 0 when the difference is inside the noise
    return per_period * 1e6, per_period * 1e6 / tasks


def _machine(dev: Device) -> str:
    host = f"{platform.machine()} CPU"
    if getattr(dev, "fake", None) is not None:
        return f"{dev.describe()} on {host}, torch {torch.__version__}"
    if dev.is_async:
        return f"{dev.describe()}, torch {torch.__version__}"
    return f"{host}, torch {torch.__version__}"


def main(argv: Any = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda",
                        help="cuda (default), fake (swpipe.testing.FakeCuda: the CUDA path on a CPU) or cpu "
                             "(smoke run)")
    parser.add_argument("--mib", type=int, default=64,
                        help="MiB copied per iteration (default 64; each iteration has a pinned host batch of its own)")
    parser.add_argument("--n", type=int, default=4,
                        help="spin kernels per Compute after its sum, together as long as the copy (default 4)")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.mib, args.n, args.iters, args.rounds = 4, 2, 8, 2
    if min(args.mib, args.n, args.iters, args.rounds) < 1:
        raise SystemExit("gpu_overlap.py: --mib, --n, --iters and --rounds must be >= 1")
    fake = None
    if args.device == "fake":
        from swpipe.testing import FakeCuda

        fake = FakeCuda(num_devices=1, seed=0, max_delay_s=FAKE_DELAY_S)
        dev: Device = fake.device(0)
    else:
        if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
            raise SystemExit("gpu_overlap.py: no CUDA device here; run it on a GPU, or pass --device fake (the CUDA "
                             "path on swpipe.testing.FakeCuda) or --device cpu for a smoke run")
        dev = as_device(args.device)
    try:
        return _report(dev, args)
    finally:
        if fake is not None:
            fake.close()


def _report(dev: Device, args: argparse.Namespace) -> Dict[str, Any]:
    print(f"machine: {_machine(dev)}; {args.mib} MiB copied, summed and {args.n} spin kernels per iteration, "
          f"{args.iters} iterations x {args.rounds} interleaved rounds")
    ov = measure_overlap(dev, args.mib, args.n, args.iters, args.rounds)
    serial, piped = statistics.median(ov["times"]["serial"]), statistics.median(ov["times"]["pipelined"])
    copy_dev = ov["costs"]["Copy"].device_s or ov["costs"]["Copy"].host_s
    comp_dev = ov["costs"]["Compute"].device_s or ov["costs"]["Compute"].host_s
    ideal = (copy_dev + comp_dev) / max(copy_dev, comp_dev)
    runs = args.iters * args.rounds
    wrong = "" if ov["equal"] else " (" + ", ".join(
        f"{len(ov['mismatches'][m])} of {runs} {m} sums wrong" for m in ("serial", "pipelined")) + ")"
    races = "" if ov["races"] is None else f"; races between streams (fake's check): {len(ov['races'])}"
    print(f"(a) overlap: Copy {copy_dev * 1e3:.3f} ms, Compute {comp_dev * 1e3:.3f} ms (a sum of all "
          f"{ov['elements']} elements + {args.n} x {ov['spin_s'] * 1e3:.3f} ms spin); serial {serial * 1e3:.3f} "
          f"ms/it, pipelined {piped * 1e3:.3f} ms/it: speedup {serial / piped:.2f}x (ideal {ideal:.2f}x, "
          f"{serial / piped / ideal:.0%} of it); every sum exact, pipelined results equal serial: "
          f"{ov['equal']}{wrong}{races}")
    for mode in ("serial", "pipelined"):
        for r, i, got, want in ov["mismatches"][mode][:3]:
            print(f"    {mode} round {r}: Compute({i}) read {got}, expected {want:.0f}")
    for race in (ov["races"] or [])[:3]:
        print(f"    race: {race}")
    for mode, measured in (("serial", serial), ("pipelined", piped)):
        pred = ov["predicted"][mode]
        print(f"(b) {mode}: predicted {pred * 1e3:.3f} ms/it, measured {measured * 1e3:.3f} ms/it, "
              f"error {100 * (pred / measured - 1):+.1f} %")
    per_period, per_task = measure_engine_cost(dev, tasks=8, iters=100 if args.quick else 1000,
                                               rounds=2 if args.quick else 5)
    print(f"(c) engine over a plain loop, 8 one-kernel tasks on one group: {per_period:.1f} us/period, "
          f"{per_task:.2f} us/task")
    return dict(overlap=ov, serial_s=serial, pipelined_s=piped, ideal=ideal, engine_us=(per_period, per_task))


if __name__ == "__main__":
    main()
