"""GPipe's co-run slowdown on a U-Net, checked: measured step, plain and corrected predictions, the decision.

Issue 47: on a U-Net (torchgpipe's own benchmark model, 2 partitions, chunks
2-8) the co-run slowdown (:func:`swpipe.gpipe.corun.profile_corun`) took
the predicted step from -18 %..+5 % of the measured one to +18 %..+103 %.
This script measures, per chunks (2, 4, 8), in one run:

* the step measured (``GPipe.step``, :func:`swpipe.gpipe.measure.measure_step`);
* the plain prediction (layer profiles, :func:`swpipe.gpipe.predict.predict_step`);
* the corrected prediction: with the co-run slowdown measured at the step's
  micro-batch size (``corr``); the same from every round of the measurement,
  as before issue 47 (``corr_all``: a round where a task ran beside the other
  partition for a sliver of its time counts, its noise divided by that
  sliver, :meth:`swpipe.gpipe.corun.CoRun.slowdown_from`); and with the
  slowdown measured at the middle chunks' size reused at every size
  (``corr_one``, as one ``profile_corun`` call is used);
* the decision of :func:`swpipe.gpipe.corun.check_slowdown` (apply the
  slowdown at this micro-batch size or not) and the prediction it gives;
* the same with the slowdown read from the job's own steps instead
  (:func:`swpipe.gpipe.corun.corun_in_steps`: each task's time in a step
  against its layer profile), checked the same way (``instep``);
* per micro-batch size, the one of the two checked slowdowns that predicted
  the deciding steps best (:func:`swpipe.gpipe.corun.closest_slowdown`,
  ``closest``): what a user takes.

Rounds interleave the chunks; each round takes a layer profile, a co-run
measurement and one measured step per chunks (its inputs beside the step it
predicts). The rounds' steps go by thirds: the first of every three fit the
in-step slowdown, the second decide (held out: nothing is fitted from them),
the third judge the decisions: the errors printed are the median
``predicted / measured - 1`` over those. Also per chunks: how much
the tasks of the measured steps took over their plain predicted costs
(``meas_stretch``, the median over tasks) against what the slowdown stretches
them by (``corr_stretch``): where the second is above the first, the
slowdown overshoots.

    python benchmarks/gpipe_unet.py            # full (about 2 minutes on 2 cores under load)
    python benchmarks/gpipe_unet.py --quick    # a tiny U-Net, 3 rounds

Record ``uptime``'s load: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from swpipe.gpipe import GPipe
from swpipe.gpipe.balance import optimal_balance, profile_layers
from swpipe.gpipe.corun import CoRun, check_slowdown, closest_slowdown, corun_in_steps, profile_corun
from swpipe.gpipe.measure import measure_step
from swpipe.gpipe.predict import LayerModel, format_table, micro_batch, predict_step
from swpipe.gpipe.skip import Namespace, pop, skippable, stash


def load() -> str:
    return "load average %.2f, %.2f, %.2f" % os.getloadavg()


def block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU())


@skippable(stash=["skip"])
class Down(nn.Module):
    """An encoder level: two convolutions, their output stashed for the decoder, then pooled."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv, self.pool = block(cin, cout), nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> Any:
        x = self.conv(x)
        yield stash("skip", x)
        return self.pool(x)


@skippable(pop=["skip"])
class Up(nn.Module):
    """A decoder level: upsampled, joined with its encoder level's stashed output, two convolutions."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.up, self.conv = nn.Upsample(scale_factor=2), block(cin + cout, cout)

    def forward(self, x: torch.Tensor) -> Any:
        skip = yield pop("skip")
        return self.conv(torch.cat([self.up(x), skip], dim=1))


def unet(base: int, depth: int, seed: int = 0) -> nn.Sequential:
    """A U-Net as an ``nn.Sequential``: ``depth`` levels down, a middle convolution, ``depth`` up, skips between."""
    torch.manual_seed(seed)
    chans = [base * 2 ** k for k in range(depth + 1)]
    levels = [Namespace() for _ in range(depth)]  # each level's skip a name of its own
    layers: List[nn.Module] = []
    cin = 3
    for k in range(depth):
        layers.append(Down(cin, chans[k]).isolate(levels[k]))
        cin = chans[k]
    layers += [nn.Conv2d(cin, chans[depth], 3, padding=1), nn.ReLU()]
    cin = chans[depth]
    for k in reversed(range(depth)):
        layers.append(Up(cin, chans[k]).isolate(levels[k]))
        cin = chans[k]
    layers.append(nn.Conv2d(cin, 1, 1))
    return nn.Sequential(*layers)


def pooled(coruns: List[CoRun]) -> CoRun:
    """The rounds' co-run measurements at one size as one (its slowdown the median over all rounds)."""
    def merged(field: str) -> Dict[str, List[float]]:
        out: Dict[str, List[float]] = {}
        for c in coruns:
            for task, values in getattr(c, field).items():
                out.setdefault(task, []).extend(values)
        return out
    return CoRun(merged("alone_s"), merged("together_s"), merged("beside"), batch=coruns[0].batch)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    x = torch.randn(args.batch, 3, args.size, args.size)
    target = torch.randn(args.batch, 1, args.size, args.size)
    loss_fn = nn.functional.mse_loss
    model = unet(args.base, args.depth)
    middle = args.chunks[len(args.chunks) // 2]
    first = profile_layers(model, x[:args.batch // middle], timeout=args.timeout)
    balance = optimal_balance([f + b for f, b in zip(first.forward_s, first.backward_s)], 2)
    gpipes = {c: GPipe(unet(args.base, args.depth), balance, devices=["cpu", "cpu"], chunks=c,
                       checkpoint=args.checkpoint) for c in args.chunks}
    for c, g in gpipes.items():
        g.step(x, target, loss_fn)  # warm-up
    profiles, coruns = [first], {c: [] for c in args.chunks}
    steps: Dict[int, List[Any]] = {c: [] for c in args.chunks}
    for r in range(args.rounds):
        order = args.chunks[r % len(args.chunks):] + args.chunks[:r % len(args.chunks)]
        for c in order:
            sample = x[:args.batch // c]
            profiles.append(profile_layers(model, sample, timeout=args.timeout, num_rounds=1))
            coruns[c].append(profile_corun(model, balance, sample, timeout=args.timeout, rounds=1))
            steps[c].append(measure_step(gpipes[c], x, target, loss_fn, repeats=1, warmup=0))
    layers = LayerModel.fit(profiles)
    measured = {c: pooled(coruns[c]) for c in args.chunks}

    def config(c: int) -> Dict[str, Any]:
        return {"balance": balance, "batch": args.batch, "chunks": c, "checkpoint": args.checkpoint}

    # by thirds: the first fit the in-step slowdown, the second decide, the third judge
    decide = [(config(c), s) for c in args.chunks for s in steps[c][1::3]]
    checked = check_slowdown(layers, list(measured.values()), decide)
    in_steps = check_slowdown(layers, [corun_in_steps(layers, config(c), steps[c][0::3]) for c in args.chunks],
                              decide)
    closest = closest_slowdown({"profile_corun": checked, "its own steps": in_steps})
    rows = []
    for c in args.chunks:
        judge = statistics.median(s.step_s for s in steps[c][2::3])
        plain = predict_step(layers, **config(c))
        corr = predict_step(layers, **config(c), slowdown=measured[c].slowdown)
        every = predict_step(layers, **config(c), slowdown=measured[c].slowdown_from(0.0))
        one = predict_step(layers, **config(c), slowdown=measured[middle].slowdown)
        decided = predict_step(layers, **config(c), slowdown=checked)
        instep = predict_step(layers, **config(c), slowdown=in_steps)
        picked = predict_step(layers, **config(c), slowdown=closest)
        per: Dict[str, List[float]] = {}
        for s in steps[c]:
            for e in s.events:
                if e.kind == "host" and e.task in plain.costs.tasks:
                    per.setdefault(e.task, []).append(e.end - e.start)
        tasks = sorted(per)
        rows.append({"chunks": c, "micro": micro_batch(args.batch, c), "meas_ms": judge * 1e3,
                     "plain_ms": plain.step_s * 1e3, "corr_ms": corr.step_s * 1e3,
                     "plain_err": plain.step_s / judge - 1, "corr_err": corr.step_s / judge - 1,
                     "corr_all_err": every.step_s / judge - 1, "corr_one_err": one.step_s / judge - 1,
                     "decided_err": decided.step_s / judge - 1,
                     "applied": decided.decision.applied, "instep_err": instep.step_s / judge - 1,
                     "instep_applied": instep.decision.applied, "closest_err": picked.step_s / judge - 1,
                     "slowdown": statistics.median(measured[c].slowdown.values()),
                     "meas_stretch": statistics.median(statistics.median(per[t]) / plain.costs[t].host_s
                                                       for t in tasks),
                     "corr_stretch": statistics.median(corr.costs[t].host_s / plain.costs[t].host_s for t in tasks)})
    return {"balance": balance, "rows": rows, "checked": checked, "in_steps": in_steps, "closest": closest}


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny U-Net and 2 rounds")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=32, help="image height and width")
    parser.add_argument("--base", type=int, default=8, help="channels of the first level")
    parser.add_argument("--depth", type=int, default=3, help="levels down (and up)")
    parser.add_argument("--chunks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--checkpoint", default="except_last", choices=("always", "except_last", "never"))
    parser.add_argument("--rounds", type=int, default=6,
                        help="by thirds: one fits the in-step slowdown, one decides, one judges")
    parser.add_argument("--timeout", type=float, default=0.15, help="seconds per profile and co-run measurement")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.size, args.base, args.depth, args.rounds, args.timeout = 16, 8, 2, 2, 3, 0.0
    torch.set_num_threads(1)
    print(f"# GPipe co-run slowdown on a U-Net: depth {args.depth}, {args.base} channels at first, "
          f"{args.size}x{args.size} images, batch {args.batch}, checkpoint {args.checkpoint}, 2 CPU partitions, "
          f"{args.rounds} rounds; {os.cpu_count()} cores; {load()}")
    out = run(args)
    print(f"balance {out['balance']}")
    print(format_table(out["rows"]))
    print(out["checked"].summary())
    print("in-step " + out["in_steps"].summary())
    print("closest: " + out["closest"].summary())
    print(f"# done; {load()}")
    return out


if __name__ == "__main__":
    main()
