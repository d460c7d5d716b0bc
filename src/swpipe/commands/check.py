"""``swpipe check``: record the DLRM workload's tasks and check TorchRec's plans (or yours) against their dataflow.

For each plan the tasks run a few serial iterations under the recorder of
:mod:`swpipe_core.dataflow`; the report lists missing dependencies (errors,
with the tuple to add), stale reads (semi-sync), and declared dependencies
with no dataflow behind them. The exit status is 1 when any plan misses a
dependency. ``--plan FILE.py:FUNC`` checks a plan factory of your own over
the workload's tasks (e.g. ``examples/custom_plan.py:lookup_ahead_plan``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any, List, Optional, Tuple

from swpipe.commands._args import int_at_least

__all__ = ["add_arguments", "run", "load_plan_factory"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``swpipe check``."""
    parser.add_argument("pipelines", nargs="*", metavar="PIPELINE",
                        help="TorchRec pipeline names (default: all of 'swpipe list')")
    parser.add_argument("--plan", action="append", default=[], metavar="FILE.py:FUNC",
                        help="also check the plan FUNC() returns (unbound, over the DLRM task names)")
    parser.add_argument("--order", choices=["default", "torchrec", "both"], default="both",
                        help="enqueue order(s) to check: swpipe's policy, TorchRec's own, or both (default)")
    parser.add_argument("--enqueue-order", default=None, metavar="T1,T2,...",
                        help="check the pipeline(s) with this per-period enqueue order instead (e.g. semi-sync with "
                             "EmbLookup before EmbBackward shows its stale embedding reads)")
    parser.add_argument("--iters", type=int_at_least(2), default=3, help="recorded serial iterations (>= 2)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="ordering model: 'cuda' credits a thread's FIFO only on one stream")
    parser.add_argument("--preset", default="test", help="DLRMConfig preset of the workload (default: test)")
    parser.add_argument("--all", action="store_true", help="also print the information lines (redundant deps, notes)")


def load_plan_factory(spec: str) -> Tuple[str, Any]:
    """``"path/file.py:func"`` -> ``(label, func)``; a clear ``ValueError`` for a bad spec.

    Examples
    --------
    >>> load_plan_factory("nofile.py")
    Traceback (most recent call last):
    ...
    ValueError: --plan 'nofile.py' is not FILE.py:FUNC (e.g. examples/custom_plan.py:lookup_ahead_plan)
    """
    path, sep, func = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not func:
        raise ValueError(f"--plan {spec!r} is not FILE.py:FUNC (e.g. examples/custom_plan.py:lookup_ahead_plan)")
    if not Path(path).is_file():
        raise ValueError(f"--plan {spec!r}: no file {path!r}")
    module_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    factory = getattr(module, func, None)
    if not callable(factory):
        raise ValueError(f"--plan {spec!r}: {path} has no function {func!r}")
    return f"{Path(path).name}:{func}", factory


def _torchrec_plans(names: List[str], orders: List[Optional[str]]):
    from swpipe.workloads.tasks import STAGED_STAGES
    from swpipe_core import pipelines

    for name in names:
        opts = {"stages": list(STAGED_STAGES)} if name == "staged" else {}
        for order in orders:
            try:
                unbound = pipelines.get(name, order=order, **opts)
            except ValueError:
                continue  # no TorchRec submission order for this pipeline
            label = name + (" (torchrec order)" if order == "torchrec" else "")
            yield label, name, unbound, (lambda fns, n=name, o=order, kw=opts: pipelines.get(n, fns, order=o, **kw))


def run(args: argparse.Namespace) -> int:
    """Check each plan; print one block per plan; 1 if any plan misses a dependency."""
    from swpipe.workloads import DLRMConfig, DLRMWorkload, SyntheticData, fns_for, init_distributed, task_fns
    from swpipe_core import pipelines
    from swpipe_core.dataflow import check_dataflow

    unknown = [n for n in args.pipelines if n not in pipelines.PIPELINES]
    if unknown:
        print(f"swpipe check: unknown pipeline(s) {unknown}; known: {', '.join(pipelines.PIPELINES)}", file=sys.stderr)
        return 2
    try:
        own = [load_plan_factory(s) for s in args.plan]
    except ValueError as exc:
        print(f"swpipe check: {exc}", file=sys.stderr)
        return 2
    names = args.pipelines or ([] if own else list(pipelines.PIPELINES))
    orders = {"default": [None], "torchrec": ["torchrec"], "both": [None, "torchrec"]}[args.order]
    env = init_distributed()
    failed = 0
    try:
        config = DLRMConfig.preset(args.preset)
        batches = SyntheticData(config).batches(args.iters)
        jobs = list(_torchrec_plans(names, orders))
        for label, factory in own:
            jobs.append((label, None, factory(), None))
        for label, name, unbound, bind in jobs:
            wl = DLRMWorkload(config, env)  # recording trains: a fresh model per plan
            if name is not None:
                plan = bind(fns_for(name, wl, unbound, compile_backend=None, compiled_autograd=None))
            else:
                plan = unbound.bind(task_fns(wl, unbound.task_names))
            if args.enqueue_order:
                order = [t.strip() for t in args.enqueue_order.split(",") if t.strip()]
                if sorted(order) != sorted(plan.task_names):
                    print(f"swpipe check: --enqueue-order must list the tasks of {label} once each: "
                          f"{', '.join(plan.task_names)}", file=sys.stderr)
                    return 2
                plan = plan.replace(enqueue_order=order, pipeline_depth=plan.pipeline_depth)
                label += " (--enqueue-order)"
            report = check_dataflow(plan, batches, state=[wl.model, wl.dense_opt], device=args.device)
            failed += not report.ok
            verdict = "OK" if report.ok else "MISSING DEPENDENCIES"
            print(f"== {label}: {verdict}; {len(report.hazards)} hazards, {len(report.stale)} stale read(s), "
                  f"{len(report.redundant)} declared dep(s) without dataflow")
            shown = report.missing + report.stale + ((report.redundant + report.notes) if args.all else [])
            for finding in shown:
                print(f"  {finding}")
    finally:
        env.close()
    print(f"{len(jobs) - failed}/{len(jobs)} plan(s) order every observed hazard"
          + ("" if args.all else " (--all shows redundant deps and notes)"))
    return 1 if failed else 0
