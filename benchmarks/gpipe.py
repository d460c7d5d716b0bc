"""swpipe.gpipe measured side by side in one run, on CPU devices: speed, balance, predictions.

(a) Step time (forward, loss, backward) of a 2-partition model of large
    matrix products (torch releases the interpreter lock in them), chunks
    1/2/4/8: the module run whole, swpipe's GPipe (forward + autograd's
    backward, torchgpipe's way; ``GPipe.step`` by GPipe's schedule, where the
    backward is pipelined too; ``GPipe.step`` by 1F1B) and torchgpipe's GPipe
    where it is installed; and the module run on the micro-batches one by one,
    serially: the work a pipeline overlaps (smaller matrix products cost more
    per sample, which the overlap must win back first). Rounds interleave the variants; medians. torch
    runs one intra-op thread (``torch.set_num_threads(1)``) so the pipeline's
    threads are what uses the cores; the module run whole is also timed with
    torch's default threads.
(b) Balance of an unbalanced model: ``swpipe.gpipe.balance.balance_by_time``
    (optimal by dynamic programming) against torchgpipe's ``balance_by_time``;
    each balance's costliest partition (by our profile) and its measured step.
(c) Predicted against measured, per checkpoint mode and for 1F1B: step time,
    bubble and peak activation bytes (``swpipe.gpipe.predict``), with the median
    absolute error of each. The prediction takes the layers' profile at the
    step's micro-batch and the partitions' co-run slowdown
    (``swpipe.gpipe.corun.profile_corun``: how much the two partitions slow each
    other when run at once, on this machine now); ``alone_err`` is the
    prediction without the slowdown. Each configuration runs ``--rounds``
    rounds, each taking the prediction's inputs and one measured step back to
    back (in turn first); medians over the rounds.

Goals (issue 39): ahead of torchgpipe on the CPU; predicted step time within
10 % (median) of the measured one; predicted bubble within 5 % (points) of the
measured; peak activation memory within 10 %. Record ``uptime``'s load: the
machine is shared.

    python benchmarks/gpipe.py            # full
    python benchmarks/gpipe.py --quick    # smaller, fewer rounds
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

from swpipe.gpipe import GPipe
from swpipe.gpipe.balance import balance_by_time, balance_cost, profile_layers
from swpipe.gpipe.corun import profile_corun
from swpipe.gpipe.measure import measure_step
from swpipe.gpipe.predict import LayerModel, format_table, predict_step


def load() -> str:
    return "load average %.2f, %.2f, %.2f" % os.getloadavg()


def mlp(width: int, layers: int, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())])


def torchgpipe_or_none() -> Optional[Any]:
    try:
        import torchgpipe
    except ImportError:
        return None
    return torchgpipe


def timed(fn: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def part_a(args: argparse.Namespace, tg: Optional[Any]) -> List[Dict[str, Any]]:
    x, target = torch.randn(args.batch, args.width), torch.randn(args.batch, args.width)
    loss_fn = nn.functional.mse_loss
    whole = mlp(args.width, args.layers)

    def clear(module: nn.Module) -> None:
        for p in module.parameters():
            p.grad = None

    def backward_of(module: nn.Module) -> Callable[[], None]:
        def step() -> None:
            clear(module)
            loss_fn(module(x), target).backward()
        return step

    def whole_default_threads() -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(os.cpu_count() or 1)
        try:
            backward_of(whole)()
        finally:
            torch.set_num_threads(threads)

    rows = []
    half = args.layers  # 2 layers (Linear, ReLU) per block: balance [L, L]
    for chunks in (1, 2, 4, 8):
        def micro_batched(chunks: int = chunks) -> None:
            clear(whole)
            for xc, tc in zip(x.chunk(chunks), target.chunk(chunks)):
                (loss_fn(whole(xc), tc) * (xc.shape[0] / len(x))).backward()

        variants: Dict[str, Callable[[], None]] = {
            "whole (1 thread)": backward_of(whole),
            "whole (default threads)": whole_default_threads,
            "whole, micro-batches one by one": micro_batched,
        }
        ours = GPipe(mlp(args.width, args.layers), [half, half], devices=["cpu", "cpu"], chunks=chunks,
                     checkpoint="never")
        variants["swpipe GPipe fwd+bwd"] = backward_of(ours)
        for sched in ("GPipe", "1F1B"):
            g = GPipe(mlp(args.width, args.layers), [half, half], devices=["cpu", "cpu"], chunks=chunks,
                      checkpoint="never", schedule=sched)
            variants[f"swpipe GPipe.step {sched}"] = (lambda g=g: (clear(g), g.step(x, target, loss_fn)))
        if tg is not None:
            theirs = tg.GPipe(mlp(args.width, args.layers), [half, half], devices=["cpu", "cpu"], chunks=chunks,
                              checkpoint="never")
            variants["torchgpipe GPipe"] = backward_of(theirs)
        samples: Dict[str, List[float]] = {k: [] for k in variants}
        for fn in variants.values():
            fn()  # warm-up
        for r in range(args.rounds):
            names = list(variants)
            names = names[r % len(names):] + names[:r % len(names)]
            for name in names:
                samples[name].append(timed(variants[name], 1))
        base = statistics.median(samples["whole (1 thread)"])
        ref = statistics.median(samples["torchgpipe GPipe"]) if tg is not None else None
        for name, values in samples.items():
            med = statistics.median(values)
            rows.append({"chunks": chunks, "variant": name, "step_ms": med * 1e3, "speedup_vs_whole": base / med,
                         "vs_torchgpipe": (ref / med) if ref else "-"})
    return rows


def part_b(args: argparse.Namespace, tg: Optional[Any]) -> List[Dict[str, Any]]:
    torch.manual_seed(1)
    widths = [args.width // 4, args.width, args.width, args.width // 2, args.width // 4, args.width // 4]
    layers: List[nn.Module] = []
    for a, b in zip(widths, widths[1:] + widths[:1]):
        layers += [nn.Linear(a, b), nn.ReLU()]

    def model() -> nn.Sequential:
        torch.manual_seed(1)
        mods: List[nn.Module] = []
        for a, b in zip(widths, widths[1:] + widths[:1]):
            mods += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*mods)

    sample = torch.randn(args.batch // 4, widths[0])
    profile = profile_layers(model(), sample, timeout=args.timeout)
    balances = {"swpipe balance_by_time": balance_by_time(2, model(), sample, timeout=args.timeout)}
    if tg is not None:
        from torchgpipe.balance import balance_by_time as tg_balance

        balances["torchgpipe balance_by_time"] = tg_balance(2, model(), sample, timeout=args.timeout, device="cpu")
    x, target = torch.randn(args.batch, widths[0]), torch.randn(args.batch, widths[0])
    rows = []
    for name, balance in balances.items():
        g = GPipe(model(), balance, devices=["cpu", "cpu"], chunks=4, checkpoint="never")
        step = measure_step(g, x, target, nn.functional.mse_loss, repeats=args.rounds).step_s
        rows.append({"balance by": name, "balance": balance, "costliest_ms (our profile)":
                     balance_cost(profile.time_s, balance) * 1e3, "measured_step_ms": step * 1e3})
    return rows


def part_c(args: argparse.Namespace) -> List[Dict[str, Any]]:
    x, target = torch.randn(args.batch, args.width), torch.randn(args.batch, args.width)
    half = args.layers
    model = mlp(args.width, args.layers)
    rows = []
    configs = [("GPipe", ck, c) for c in (4, 8) for ck in ("never", "except_last", "always")]
    configs += [("1F1B", ck, c) for c in (4, 8) for ck in ("never", "always")]
    for sched, ck, chunks in configs:
        g = GPipe(mlp(args.width, args.layers), [half, half], devices=["cpu", "cpu"], chunks=chunks,
                  checkpoint=ck, schedule=sched)
        g.step(x, target, nn.functional.mse_loss)  # warm-up
        sample = x[:args.batch // chunks]
        got: Dict[str, List[Any]] = {"pred": [], "alone": [], "meas": [], "slowdown": []}
        # rounds, each predicting and measuring back to back (in turn first), medians over the rounds: a shared
        # machine's speed drifts within a minute, so the prediction's inputs (the layers at the step's
        # micro-batch, how much the partitions slow each other now) are taken beside the step they predict
        for r in range(args.rounds):
            if r % 2:
                got["meas"].append(measure_step(g, x, target, nn.functional.mse_loss, repeats=1, warmup=0))
            layers = LayerModel.fit([profile_layers(model, sample, timeout=args.timeout / args.rounds,
                                                    num_rounds=1)])
            corun = profile_corun(model, [half, half], sample, timeout=args.timeout / args.rounds, rounds=1)
            got["pred"].append(predict_step(layers, [half, half], args.batch, chunks, ck, sched,
                                            slowdown=corun.slowdown))
            got["alone"].append(predict_step(layers, [half, half], args.batch, chunks, ck, sched))
            got["slowdown"].append(statistics.fmean(corun.slowdown.values()))
            if not r % 2:
                got["meas"].append(measure_step(g, x, target, nn.functional.mse_loss, repeats=1, warmup=0))
        pred, alone = (statistics.median(q.step_s for q in got[k]) for k in ("pred", "alone"))
        meas = statistics.median(m.step_s for m in got["meas"])
        # the peak bytes kept: the largest of the rounds' steps (which micro-batch's backward ends before which
        # forward starts on the other thread may vary from step to step)
        p, m = got["pred"][0], max(got["meas"], key=lambda q: q.activation_bytes)
        rows.append({"schedule": sched, "checkpoint": ck, "chunks": chunks,
                     "slowdown": statistics.median(got["slowdown"]), "pred_ms": pred * 1e3, "meas_ms": meas * 1e3,
                     "time_err": pred / meas - 1, "alone_err": alone / meas - 1,
                     "pred_bubble": statistics.median(q.bubble for q in got["pred"]),
                     "meas_bubble": statistics.median(q.bubble for q in got["meas"]),
                     "pred_MB": p.activation_bytes / 1e6, "meas_MB": m.activation_bytes / 1e6,
                     "mem_err": p.activation_bytes / m.activation_bytes - 1 if m.activation_bytes else 0.0})
    return rows


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model and one round")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4, help="Linear+ReLU blocks per partition")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=1.0, help="seconds per layer profile")
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.layers, args.batch, args.rounds, args.timeout = 128, 2, 64, 1, 0.05
    torch.set_num_threads(1)
    tg = torchgpipe_or_none()
    print(f"# swpipe.gpipe benchmark: width {args.width}, {2 * args.layers} Linear+ReLU blocks on 2 CPU "
          f"partitions, batch {args.batch}, {args.rounds} rounds; torchgpipe "
          f"{'installed' if tg else 'not installed'}; {os.cpu_count()} cores; {load()}")
    out = {}
    print("\n(a) step time, chunks 1/2/4/8")
    out["a"] = part_a(args, tg)
    print(format_table(out["a"]))
    print("\n(b) balance of an unbalanced model")
    out["b"] = part_b(args, tg)
    print(format_table(out["b"]))
    print("\n(c) predicted against measured")
    out["c"] = part_c(args)
    print(format_table(out["c"]))
    c = out["c"]
    summary = {"median |time error|": statistics.median(abs(r["time_err"]) for r in c),
               "... without the co-run slowdown": statistics.median(abs(r["alone_err"]) for r in c),
               "median |bubble error| (points)": statistics.median(abs(r["pred_bubble"] - r["meas_bubble"])
                                                                   for r in c),
               "median |memory error|": statistics.median(abs(r["mem_err"]) for r in c)}
    out["summary"] = summary
    print("\n" + ", ".join(f"{k}: {v:.1%}" for k, v in summary.items()))
    print(f"# done; {load()}")
    return out


if __name__ == "__main__":
    main()
