"""``swpipe plan``: auto-schedule a task graph with a cost model; print the plan and report, save the plan.

::

    swpipe plan --tasks GRAPH.json --costs COSTS.json [--max-depth 3 --max-threads 2 --time-limit 30] [--out PLAN.json]
    swpipe plan --pipeline sparse_dist --costs cost_models/sparse_dist.json --device cuda

``--tasks`` takes a task graph (``autosched.model.graph.save_task_graph``) or a saved
plan (``save_plan``; its schedule is then a starting point and a baseline);
``--pipeline`` takes one of TorchRec's pipelines (``swpipe list``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List

from swpipe.commands._args import int_at_least, positive_float

__all__ = ["add_arguments", "run", "parse_freeze", "load_input"]


def _message(exc: BaseException) -> str:
    """An exception as one line (a KeyError's text without its quotes, a file error with its path)."""
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc)


def _stream(text: str) -> Any:
    return None if text in ("default", "None", "none", "") else text


def parse_freeze(items: List[str]) -> Dict[str, Dict[str, Any]]:
    """``["Forward:stream=default,stage=2", ...]`` -> ``{"Forward": {"stream": None, "stage": 2}}``.

    Parameters
    ----------
    items : list of str
        ``TASK:field=value[,field=value...]`` with fields ``stage``, ``stream``
        (``default`` = the default stream) and ``thread_group``.

    Returns
    -------
    dict

    Raises
    ------
    ValueError
        For a malformed item or an unknown field.

    Examples
    --------
    >>> parse_freeze(["Forward:stream=default,stage=2", "H2D:thread_group=io"])
    {'Forward': {'stream': None, 'stage': 2}, 'H2D': {'thread_group': 'io'}}
    """
    out: Dict[str, Dict[str, Any]] = {}
    for item in items:
        task, sep, rest = item.partition(":")
        if not sep or not task or not rest:
            raise ValueError(f"--freeze {item!r}: use TASK:field=value[,field=value], e.g. Forward:stream=default,stage=2")
        fields = out.setdefault(task, {})
        for part in rest.split(","):
            key, eq, val = part.partition("=")
            if not eq or key not in ("stage", "stream", "thread_group"):
                raise ValueError(f"--freeze {item!r}: fields are stage=N, stream=NAME|default, thread_group=NAME")
            fields[key] = int(val) if key == "stage" else _stream(val) if key == "stream" else val
    return out


def load_input(args: argparse.Namespace) -> Any:
    """The task graph or plan named by ``--tasks`` / ``--pipeline``."""
    if args.pipeline:
        from swpipe_core import pipelines

        return pipelines.get(args.pipeline)
    from autosched.model.graph import load_plan, load_task_graph

    with open(args.tasks, encoding="utf-8") as fh:
        try:
            fmt = json.load(fh).get("format")
        except (json.JSONDecodeError, AttributeError) as exc:
            raise ValueError(f"{args.tasks}: not a JSON task graph or plan ({exc})") from exc
    return load_plan(args.tasks) if fmt == "swpipe-plan" else load_task_graph(args.tasks)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``swpipe plan``."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--tasks", metavar="GRAPH.json", help="task graph (or saved plan) JSON")
    src.add_argument("--pipeline", metavar="NAME", help="one of TorchRec's pipelines (see 'swpipe list')")
    parser.add_argument("--costs", required=True, metavar="COSTS.json", help="cost model JSON (cost_models/)")
    parser.add_argument("--max-depth", type=int_at_least(1), default=3, help="most iterations in flight (default 3)")
    parser.add_argument("--max-threads", type=int_at_least(1), default=2, help="most CPU thread groups (default 2)")
    parser.add_argument("--time-limit", type=positive_float, default=30.0, help="search budget in seconds (default 30)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="semantics to optimise for")
    parser.add_argument("--method", choices=("auto", "cpsat", "beam"), default="auto")
    parser.add_argument("--streams", default=None, metavar="A,B,...",
                        help="streams available (CUDA), e.g. default,memcpy,data_dist")
    parser.add_argument("--freeze", action="append", default=[], metavar="TASK:field=value",
                        help="pin a task, e.g. Forward:stream=default,stage=2 (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="plan.json", metavar="PLAN.json", help="where to write the plan (default plan.json)")
    parser.add_argument("--progress", action="store_true", help="progress bar over beam rounds")
    parser.add_argument("--calibrated", action=argparse.BooleanOptionalAction, default=True,
                        help="search with the cost model's machine calibration folded in when it has one "
                             "(engine cost per task, per hand-off and per period, free cores; default on)")


def run(args: argparse.Namespace) -> int:
    """Search, print the report and its explanation, write the plan; 2 on bad input."""
    from autosched.model.costs import CostModel
    from autosched.model.graph import save_plan
    from autosched.search.options import Constraints, SolverOptions
    from autosched.search.entry import auto_schedule

    try:
        graph = load_input(args)
        costs = CostModel.load(args.costs)
        streams = None if args.streams is None else [_stream(s.strip()) for s in args.streams.split(",")]
        constraints = Constraints(max_depth=args.max_depth, max_threads=args.max_threads, streams=streams,
                                  frozen=parse_freeze(args.freeze), device=args.device)
        solver = SolverOptions(time_limit_s=args.time_limit, seed=args.seed, method=args.method, progress=args.progress)
        plan, report = auto_schedule(graph, costs, constraints, solver=solver, calibrated=args.calibrated)
    except (OSError, KeyError, ValueError) as exc:
        print(f"swpipe plan: {_message(exc)}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"swpipe plan: {exc}", file=sys.stderr)
        return 1
    print(report.format(num_iterations=max(5, plan.pipeline_depth + 2)))
    print()
    print(report.explain())
    save_plan(plan, args.out)
    print(f"\nplan written to {args.out}")
    return 0
