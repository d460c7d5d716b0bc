"""How stable ``balance_by_time`` is, idle and under load, on a U-Net; and what its balances cost in step time.

Issue 47.4: six runs of the old ``balance_by_time`` on the same U-Net gave six
different balances under load. This script

1. optionally loads the machine: ``--load N`` starts N busy-loop processes
   (killed at the end, also on an error);
2. runs ``balance_by_time`` ``--runs`` times (default 6) on one micro-batch of
   a U-Net (conv blocks with skip connections stashed on the way down and
   popped on the way up, as one ``nn.Sequential``), each through
   ``profile_layers`` + ``optimal_balance`` (what ``balance_by_time`` is) so the
   profile's spread is printed too; prints the balances and how often each;
3. measures, side by side in one run, the GPipe step (forward, loss,
   backward; ``chunks`` micro-batches, partitions on CPU "devices") of every
   distinct balance found and of every 2-way cut within ``--window`` layers
   of one (the candidates for the best contiguous balance):
   ``compare_balances``' rounds, each timing every candidate once in a
   rotating order, ratios within a round. Prints each found balance's step
   over the best candidate's (goal: within 5 %);
4. with ``--check-rounds R`` (default 20; 0: off), each run also judges its
   balance and those one cut away by R measured steps, as ``balance_by_steps``
   does, and the balance that returns is measured among the candidates too.

    python benchmarks/gpipe_balance.py             # idle
    python benchmarks/gpipe_balance.py --load 2    # two busy processes beside it

Record ``uptime``'s load average: the machine may be shared.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from swpipe.gpipe.balance import balance_cost, compare_balances, neighbour_balances, optimal_balance, profile_layers
from swpipe.gpipe.skip import pop, skippable, stash


def load_average() -> str:
    return "load average %.2f, %.2f, %.2f" % os.getloadavg()


def stash_layer(name: str) -> nn.Module:
    @skippable(stash=[name])
    class Stash(nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            yield stash(name, x)
            return x

    return Stash()


def concat_layer(name: str) -> nn.Module:
    @skippable(pop=[name])
    class Concat(nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            skip = yield pop(name)
            return torch.cat([x, skip], dim=1)

    return Concat()


def unet(base: int = 8, depth: int = 3, seed: int = 0) -> nn.Sequential:
    """A U-Net as one sequence: per level down two conv + ReLU, a stash, a max-pool; per level up an upsample,
    a conv + ReLU, the popped skip concatenated, a conv + ReLU; 1 + 6 depth + 4 + 6 depth layers."""
    torch.manual_seed(seed)
    layers: List[nn.Module] = []
    c_in, c = 3, base
    for d in range(depth):
        layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1), nn.ReLU(),
                   stash_layer(f"s{d}"), nn.MaxPool2d(2)]
        c_in, c = c, 2 * c
    layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1), nn.ReLU()]
    for d in reversed(range(depth)):
        half = c // 2
        layers += [nn.Upsample(scale_factor=2), nn.Conv2d(c, half, 3, padding=1), nn.ReLU(),
                   concat_layer(f"s{d}"), nn.Conv2d(2 * half, half, 3, padding=1), nn.ReLU()]
        c = half
    layers.append(nn.Conv2d(c, 3, 1))
    return nn.Sequential(*layers)


def start_load(n: int) -> List[subprocess.Popen]:
    """``n`` busy-loop processes (each keeps one core busy)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_load(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def batch(args: argparse.Namespace) -> Tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return (torch.randn(args.batch, 3, args.size, args.size), torch.randn(args.batch, 3, args.size, args.size))


def find_balances(args: argparse.Namespace, sample: torch.Tensor) -> List[Tuple[List[int], Any, float, Any]]:
    """Per run: ``balance_by_time``'s balance, its profile, the seconds it took, and (``--check-rounds``) the
    balance ``balance_by_steps`` returns (its comparison)."""
    found = []
    x, target = batch(args)
    for run in range(args.runs):
        t0 = time.perf_counter()
        profile = profile_layers(unet(args.base, args.depth), sample, timeout=args.timeout)
        balance = optimal_balance(profile.time_s, args.partitions)  # = balance_by_time(...)
        took = time.perf_counter() - t0
        checked = None
        if args.check_rounds:  # = balance_by_steps(...), on the profile just taken
            checked = compare_balances(unet(args.base, args.depth), neighbour_balances(balance), x, target,
                                       nn.functional.mse_loss, chunks=args.chunks, devices=["cpu"] * len(balance),
                                       rounds=args.check_rounds, checkpoint="never")
        found.append((balance, profile, took, checked))
        scale, spikes = getattr(profile, "round_scale", []), getattr(profile, "spikes", [])  # also older profiles
        stats = (f"{len(scale)} rounds, round scale {min(scale):.2f}-{max(scale):.2f}, spikes {sum(spikes)}, "
                 f"median spread {statistics.median(profile.spread) * 100:.1f} %, " if scale else "")
        judged = ("" if checked is None else f"; by steps {checked.fastest} ("
                  + ", ".join(f"{b} x{r:.3f}" for b, r in zip(checked.balances, checked.ratio)) + ")")
        print(f"run {run}: {balance}  {took:.1f} s, {stats}{load_average()}{judged}", flush=True)
    return found


def candidates(found: List[List[int]], layers: int, window: int) -> List[List[int]]:
    """The distinct balances found, then every 2-way cut within ``window`` layers of one of them."""
    out = []
    for b in found:
        if b not in out:
            out.append(b)
    if all(len(b) == 2 for b in found):
        for cut in sorted({b[0] + d for b in found for d in range(-window, window + 1)}):
            if 1 <= cut < layers and [cut, layers - cut] not in out:
                out.append([cut, layers - cut])
    return out


def measure(args: argparse.Namespace, balances: List[List[int]]) -> Dict[Tuple[int, ...], float]:
    """Each balance's step over the first's in the same round (median over the rounds), measured side by side."""
    x, target = batch(args)
    compared = compare_balances(unet(args.base, args.depth), balances, x, target, nn.functional.mse_loss,
                                chunks=args.chunks, devices=["cpu"] * len(balances[0]), rounds=args.rounds,
                                checkpoint="never")
    print(f"measured side by side ({args.rounds} rounds; x the first):\n{compared.summary()}", flush=True)
    return {tuple(b): r * compared.median_s[0] for b, r in zip(compared.balances, compared.ratio)}


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=6, help="balance_by_time runs")
    ap.add_argument("--load", type=int, default=0, help="busy-loop processes beside the runs")
    ap.add_argument("--timeout", type=float, default=1.0, help="balance_by_time's timeout, seconds")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="mini-batch of the measured step")
    ap.add_argument("--chunks", type=int, default=4, help="micro-batches; the profile takes one")
    ap.add_argument("--size", type=int, default=32, help="image side")
    ap.add_argument("--base", type=int, default=8, help="channels at the top level")
    ap.add_argument("--depth", type=int, default=3, help="levels")
    ap.add_argument("--window", type=int, default=2, help="cuts around each found one, measured as candidates")
    ap.add_argument("--rounds", type=int, default=15, help="measured steps per candidate")
    ap.add_argument("--check-rounds", type=int, default=20,
                    help="measured steps per balance when each run judges its neighbours (balance_by_steps); 0: off")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the partitions' threads are what uses the cores
    layers = len(unet(args.base, args.depth))
    sample = torch.randn(args.batch // args.chunks, 3, args.size, args.size)
    print(f"U-Net of {layers} layers, micro-batch {tuple(sample.shape)}, {args.runs} runs, load {args.load}; "
          f"start: {load_average()}", flush=True)
    procs = start_load(args.load)
    t0 = time.perf_counter()
    try:
        found = find_balances(args, sample)
        balances = [b for b, _, _, _ in found]
        checked = [c.fastest for _, _, _, c in found if c is not None]
        counts = collections.Counter(tuple(b) for b in balances)
        checked_counts = collections.Counter(tuple(b) for b in checked)
        print("balances found:", ", ".join(f"{list(b)} x{n}" for b, n in counts.most_common()), flush=True)
        if checked:
            print("balances by steps:", ", ".join(f"{list(b)} x{n}" for b, n in checked_counts.most_common()),
                  flush=True)
        steps = measure(args, candidates(balances + checked, layers, args.window))
    finally:
        stop_load(procs)
    best = min(steps, key=steps.get)
    # what the profiles say of each candidate: its costliest partition over the least, median over the runs
    predicted = {b: statistics.median(balance_cost(p.time_s, list(b)) / min(balance_cost(p.time_s, list(c))
                                                                            for c in steps) for _, p, _, _ in found)
                 for b in steps}
    print(f"best contiguous balance (of {len(steps)} measured side by side): {list(best)} "
          f"{steps[best] * 1e3:.1f} ms")
    for b, n in counts.most_common():
        print(f"found {list(b)} x{n}: step {steps[b] * 1e3:.1f} ms, x{steps[b] / steps[best]:.3f} of the best")
    for b, n in checked_counts.most_common():
        print(f"by steps {list(b)} x{n}: step {steps[b] * 1e3:.1f} ms, x{steps[b] / steps[best]:.3f} of the best")
    for b, s in sorted(steps.items()):
        print(f"  candidate {list(b)}: {s * 1e3:.1f} ms measured (x{s / steps[best]:.3f}), costliest partition "
              f"x{predicted[b]:.3f} of the least by the profiles")
    print(f"took {time.perf_counter() - t0:.0f} s; end: {load_average()}")
    return {"balances": balances, "counts": dict(counts), "checked": checked, "steps_s": steps, "best": list(best),
            "predicted": predicted}


if __name__ == "__main__":
    main()
