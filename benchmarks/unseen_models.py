"""Predictions on models swpipe was not tuned on (issue 47): predicted against measured, side by side, in one run.

    python benchmarks/unseen_models.py            # the whole run (about 3 minutes on 2 cores at load 8)
    python benchmarks/unseen_models.py --quick    # tiny sizes, 1 round: a smoke run

Three models, none of which swpipe's costs or rules were tuned on:

* a conv net with skip connections (a U-Net, ``swpipe.gpipe``): ``benchmarks/gpipe_unet.py``, called;
* a small transformer LM (:func:`transformer_lm`: an embedding, 4 attention blocks, a head with
  cross-entropy) on 2 ranks, every PyTorch schedule at 4 and 8 micro-batches (``torch.distributed.pipelining``
  under torchrun, the job ``swpipe pp --model`` runs);
* an MLP of unequal stages (:func:`unequal_mlp`: an embedding first, a heavy head with the loss last), the same.

For each PP model ``benchmarks/pp.py``'s :func:`analyse` prints the rows (predicted and measured step and
peak per rank), the median |error|, whether the predicted-fastest configuration is within 5 % of the measured
fastest, and the memory errors. Then one model on 4 ranks over the machine's cores (the prediction with
``cores=`` the machine's), and item 7: on the unequal MLP, with and without a memory cap, the searched order
against the best built-in that fits, both measured by PyTorch's runtime with equal losses, and the lower bound
where the search cannot win. ``uptime``'s load is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from swpipe.pp import PPModel

_HERE = os.path.dirname(os.path.abspath(__file__))


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over every position: ``logits`` (batch, seq, vocab), ``target`` (batch, seq)."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


class Block(nn.Module):
    """A pre-norm causal self-attention block with its feed-forward (no dropout: the losses must match)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ff(self.norm2(x))


class Head(nn.Module):
    """The final norm and the projection to the vocabulary."""

    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


def transformer_lm(vocab: int = 512, dim: int = 64, heads: int = 4, seq: int = 32, batch: int = 32,
                   blocks: int = 4, seed: int = 0) -> PPModel:
    """A small decoder-only LM: an embedding, ``blocks`` attention blocks and a head, cut evenly by ``swpipe pp``.

    Six children ([embedding, 4 blocks, head]): 2 stages of 3 children, or 4 of 2, 2, 1, 1. The target is the
    input shifted by one token.
    """
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(vocab, dim), *[Block(dim, heads) for _ in range(blocks)], Head(dim, vocab))
    g = torch.Generator().manual_seed(10_000 + seed)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return PPModel(model=model, batch=tokens[:, :-1].contiguous(), target=tokens[:, 1:].contiguous(),
                   loss_fn=lm_loss)


def unequal_mlp(vocab: int = 256, dim: int = 64, hidden: int = 1024, classes: int = 512, batch: int = 128,
                seed: int = 0) -> PPModel:
    """An MLP of unequal stages: an embedding first (cheap), two small blocks, a heavy head with the loss last.

    Four children, cut evenly: 2 stages ([embedding, block], [block, head]) or 4 (one child each), the last
    stage several times the first's cost either way. The loss is cross-entropy over ``classes``.
    """
    torch.manual_seed(seed)
    head = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, classes))
    model = nn.Sequential(nn.Embedding(vocab, dim), nn.Sequential(nn.Linear(dim, dim), nn.Tanh()),
                          nn.Sequential(nn.Linear(dim, dim), nn.Tanh()), head)
    g = torch.Generator().manual_seed(10_000 + seed)
    return PPModel(model=model, batch=torch.randint(0, vocab, (batch,), generator=g),
                   target=torch.randint(0, classes, (batch,), generator=g), loss_fn=nn.functional.cross_entropy)


# --- the run ------------------------------------------------------------------------------------------------

sys.path.insert(0, _HERE)  # the sibling scripts (pp.py, gpipe_unet.py) and the factories' module for the ranks
import gpipe_unet  # noqa: E402
import pp as pp_bench  # noqa: E402

_QUICK_SIZES = {"transformer_lm": {"vocab": 64, "dim": 16, "seq": 8, "batch": 16},
                "unequal_mlp": {"vocab": 32, "dim": 16, "hidden": 64, "classes": 32, "batch": 16}}


def load() -> List[float]:
    return [round(v, 2) for v in os.getloadavg()]


def choose_cap(rows: List[Dict[str, Any]], slack: float = 0.05) -> Dict[str, Any]:
    """The memory cap of item 7: ``slack`` over the least measured peak (the busiest rank's) of PyTorch's schedules,
    so that only the most frugal of them fit and a searched order must keep to their memory to be run; and the
    schedules that fit it.

    ``rows``: one micro-batch count's rows of PyTorch's schedules (no searched one).
    """
    peaks = {r["schedule"]: max(int(v) for v in r["measured_peak_bytes"].values()) for r in rows}
    cap = int(min(peaks.values()) * (1 + slack))
    return {"cap_bytes": cap, "fits": sorted(n for n, p in peaks.items() if p <= cap)}


def pp_part(title: str, spec: str, options: Dict[str, Any], args: argparse.Namespace, ranks: int = 2,
            microbatches: Optional[List[int]] = None, search: bool = True, cap: Optional[int] = None,
            schedules: tuple = ()) -> Dict[str, Any]:
    """One ``swpipe pp --model`` job, analysed by ``benchmarks/pp.py``: its report and figures."""
    print(f"\n## {title}: {spec} {options or ''} on {ranks} ranks; load {load()}", flush=True)
    report = pp_bench.run_job(spec, options, ranks, microbatches or args.microbatches, args.steps, args.warmup,
                              args.time_limit, search=search, memory_cap_bytes=cap, schedules=schedules,
                              timeout_s=args.timeout)
    pp_bench.print_link(report)
    figures = pp_bench.analyse(report)
    return {"title": title, "ranks": ranks, "report": report, "figures": figures, "load_end": load()}


def summary_line(part: Dict[str, Any]) -> str:
    """One part's figures in one line (what docs/results.md records)."""
    f = part["figures"]
    return (f"{part['title']}: median |step error| {f['step_median_abs_error']:.1%} (every correction unchecked "
            f"{f.get('step_median_abs_error_unchecked', float('nan')):.1%}); predicted fastest "
            f"{f['predicted_fastest']} measured fastest {f['measured_fastest']} ratio {f['pick_ratio']:.3f} "
            f"within5% {'yes' if f['pick_within'] else 'no'}; memory median {f['memory_median_abs_error']:.1%} "
            f"worst {f['memory_max_abs_error']:.1%}")


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 timed step per schedule: a smoke run")
    parser.add_argument("--steps", type=int, default=12,
                        help="timed rounds per PP job (default 12: with one step spread 20-50 %%, a median of 5 "
                             "steps moves by about a tenth between runs)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=3.0, help="the search's seconds (default 3)")
    parser.add_argument("--unet-rounds", type=int, default=24,
                        help="timed rounds of the U-Net part (by thirds: fit, decide, judge)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per torchrun job")
    parser.add_argument("--skip", default="", help="parts to leave out, e.g. unet,four")
    parser.add_argument("--json", default=None, help="write every part's report and figures here")
    args = parser.parse_args(argv)
    args.microbatches = [4, 8]
    if args.quick:
        args.steps, args.warmup, args.time_limit, args.unet_rounds = 1, 1, 1.0, 2
    skip = set(filter(None, args.skip.split(",")))
    sizes = {k: (v if args.quick else {}) for k, v in _QUICK_SIZES.items()}
    torch.set_num_threads(1)
    out: Dict[str, Any] = {"load_start": load(), "cores": os.cpu_count(), "parts": []}
    print(f"# unseen models (issue 47): {os.cpu_count()} cores, load average {out['load_start']} at the start",
          flush=True)
    parts = out["parts"]
    if "lm" not in skip:
        parts.append(pp_part("transformer LM, 2 ranks", "unseen_models:transformer_lm", sizes["transformer_lm"],
                             args))
    if "mlp" not in skip:
        mlp = pp_part("unequal MLP, 2 ranks", "unseen_models:unequal_mlp", sizes["unequal_mlp"], args)
        parts.append(mlp)
        n = max(args.microbatches)  # the most micro-batches: GPipe's memory furthest above 1F1B's
        chosen = choose_cap([r for r in mlp["report"]["results"] if "refused" not in r
                             and r["schedule"] != "swpipe-searched" and r["n_microbatches"] == n])
        out["cap"] = chosen
        print(f"\n(item 7) the cap: {chosen['cap_bytes'] / 2**20:.3f} MiB per rank, 5 % over the least measured peak "
              f"at {n} micro-batches; PyTorch's schedules that fit it: {', '.join(chosen['fits'])}")
        out["capped"] = pp_part("unequal MLP under a memory cap, 2 ranks", "unseen_models:unequal_mlp",
                                sizes["unequal_mlp"], args, microbatches=[n], cap=chosen["cap_bytes"],
                                schedules=tuple(chosen["fits"]))
    if "four" not in skip:
        parts.append(pp_part(f"unequal MLP, 4 ranks on {os.cpu_count()} cores", "unseen_models:unequal_mlp",
                             sizes["unequal_mlp"], args, ranks=4, search=False))
    if "unet" not in skip:
        print(f"\n## conv net with skips (GPipe, benchmarks/gpipe_unet.py); load {load()}", flush=True)
        unet = gpipe_unet.main(["--quick"] if args.quick else ["--rounds", str(args.unet_rounds)])
        out["unet"] = {"rows": unet["rows"],
                       "step_median_abs_error": _median([abs(r["closest_err"]) for r in unet["rows"]]),
                       "step_median_abs_error_profile_corun": _median([abs(r["decided_err"]) for r in unet["rows"]]),
                       "step_median_abs_error_in_steps": _median([abs(r["instep_err"]) for r in unet["rows"]])}
    out["load_end"] = load()
    print(f"\n# summary (load average {out['load_start']} at the start, {out['load_end']} at the end, "
          f"{os.cpu_count()} cores)")
    for part in parts:
        print(summary_line(part))
    for label, part in (("no cap", next((p for p in parts if p["title"] == "unequal MLP, 2 ranks"), None)),
                        ("capped", out.get("capped"))):
        if part is not None and part["figures"].get("best_builtin"):
            f = part["figures"]
            print(f"item 7 ({label}): searched over {f['best_builtin']} {f['searched_over_best_builtin']:.3f}x, "
                  f"noise {f['searched_noise']:.0%}, bound headroom {f['bound_headroom']:.1%}: {pp_bench.VERDICTS[f['search_verdict']]}")
    if "unet" in out:
        u = out["unet"]
        chunks = ", ".join(str(r["chunks"]) for r in u["rows"])
        print(f"conv net with skips (GPipe): median |step error| {u['step_median_abs_error']:.1%} (per micro-batch the "
              f"closer checked slowdown, chunks {chunks}); with profile_corun's "
              f"alone {u['step_median_abs_error_profile_corun']:.1%}, with the slowdown read from its own steps alone "
              f"{u['step_median_abs_error_in_steps']:.1%}")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return out


def _median(values: List[float]) -> float:
    import statistics

    return statistics.median(values) if values else float("nan")


if __name__ == "__main__":
    main()
