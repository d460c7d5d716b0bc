"""``swpipe show <pipeline>``: the schedule table and stage analysis of a TorchRec plan, and a legend in words."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List

from swpipe.commands._args import int_at_least
from swpipe.commands._text import format_legend

__all__ = ["add_arguments", "run", "parse_options"]


def _value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        pass
    if "," in text:
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


def parse_options(items: List[str]) -> Dict[str, Any]:
    """Turn ``["k=v", ...]`` into factory options (ints, booleans and comma lists parsed).

    Parameters
    ----------
    items : list of str

    Returns
    -------
    dict

    Raises
    ------
    ValueError
        For an item without ``=``.

    Examples
    --------
    >>> parse_options(["emb_lookup=data_dist", "stages=3"])
    {'emb_lookup': 'data_dist', 'stages': 3}
    >>> parse_options(["stages=load,post"])
    {'stages': ['load', 'post']}
    """
    out: Dict[str, Any] = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"option {item!r} is not key=value (e.g. --option emb_lookup=data_dist)")
        out[key.strip()] = _value(val)
    return out


def _order_line(plan: Any) -> str:
    """Which enqueue order the table's rows follow, and how to get the other ones."""
    from swpipe_core.order import enqueue_order
    from swpipe_core.pipelines.orders import order_label

    label = "TorchRec's CPU submission order" if plan.enqueue_order is not None else order_label(plan)
    return (f"{label}: {', '.join(enqueue_order(plan))} "
            f"(the stage analysis below is for this order; --order torchrec|ready_first|stage_descending "
            f"picks another)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``swpipe show``."""
    parser.add_argument("pipeline", help="pipeline name (see 'swpipe list')")
    parser.add_argument("--periods", "-n", type=int_at_least(1), default=None,
                        help="periods (columns) in the schedule table; default max(5, depth + 2)")
    parser.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                        help="factory option, e.g. emb_lookup=data_dist or stages=3 (repeatable)")
    parser.add_argument("--order", choices=("torchrec", "ready_first", "stage_descending"), default=None,
                        help="per-period enqueue order: TorchRec's own CPU submission order, or one of "
                             "swpipe's policies (default ready_first)")


def run(args: argparse.Namespace) -> int:
    """Print the table and analysis; 2 on a bad pipeline name or option."""
    from swpipe_core import pipelines
    from swpipe_core.analysis import LEGEND, format_schedule, format_stage_analysis

    try:
        options = parse_options(args.option)
        if args.order is not None:
            options["order"] = args.order
        plan = pipelines.get(args.pipeline, **options)
    except (KeyError, ValueError) as exc:
        print(f"swpipe show: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    periods = args.periods if args.periods is not None else max(5, plan.pipeline_depth + 2)
    if periods < 1:
        print(f"swpipe show: --periods must be >= 1, got {periods}", file=sys.stderr)
        return 2
    print(f"{args.pipeline}: {pipelines.describe(args.pipeline)}")
    print(f"enqueue order: {_order_line(plan)}")
    print()
    print(format_schedule(plan, periods))
    print()
    print(format_stage_analysis(plan))
    print()
    print(format_legend(LEGEND, width=120))
    return 0
