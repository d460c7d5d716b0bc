"""``swpipe simulate``: predict a plan's period, latency and binding resource from a cost model.

::

    swpipe simulate --plan PLAN.json --costs COSTS.json [--iterations 50 --device cpu --trace TRACE.json]
    swpipe simulate --pipeline sparse_dist --costs cost_models/sparse_dist.json --device cuda

A cost model with a machine calibration is simulated with it folded in, as ``swpipe plan`` searches with it
(:func:`autosched.model.simulate.simulate`).
"""

from __future__ import annotations

import argparse
import sys

from swpipe.commands._args import int_at_least

__all__ = ["add_arguments", "run"]


def _message(exc: BaseException) -> str:
    """An exception as one line (a KeyError's text without its quotes, a file error with its path)."""
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``swpipe simulate``."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan", metavar="PLAN.json", help="plan JSON (e.g. written by 'swpipe plan')")
    src.add_argument("--pipeline", metavar="NAME", help="one of TorchRec's pipelines (see 'swpipe list')")
    parser.add_argument("--costs", required=True, metavar="COSTS.json", help="cost model JSON (cost_models/)")
    parser.add_argument("--iterations", type=int_at_least(2), default=50, help="iterations to simulate (default 50)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--trace", default=None, metavar="TRACE.json",
                        help="also write the simulated timeline as Chrome/Perfetto trace JSON")


def run(args: argparse.Namespace) -> int:
    """Print the simulation summary; 2 on bad input."""
    from autosched.model.costs import CostModel
    from autosched.model.simulate import simulate

    try:
        if args.pipeline:
            from swpipe_core import pipelines

            plan = pipelines.get(args.pipeline)
        else:
            from autosched.model.graph import load_plan

            plan = load_plan(args.plan)
        costs = CostModel.load(args.costs)
        result = simulate(plan, costs, num_iterations=args.iterations, device=args.device)
    except (OSError, KeyError, ValueError) as exc:
        print(f"swpipe simulate: {_message(exc)}", file=sys.stderr)
        return 2
    print(result.summary())
    if args.trace:
        result.write_chrome_trace(args.trace)
        print(f"trace written to {args.trace} (open in https://ui.perfetto.dev)")
    return 0
