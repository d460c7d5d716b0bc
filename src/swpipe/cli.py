"""The ``swpipe`` command: ``swpipe demo|show|list|plan|simulate|check``.

Each sub-command lives in ``src/swpipe/commands/<name>.py`` with
``add_arguments(parser)`` and ``run(args) -> int``; this file only wires them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import List, Optional

from swpipe._version import __version__

__all__ = ["main", "build_parser"]

# What ``swpipe --help`` prints above the sub-commands: plain text (argparse prints it as it is).
_DESCRIPTION = ("swpipe: run, explain and search software-pipelined PyTorch training loops. "
                "'swpipe COMMAND --help' describes one command's options.")

_COMMANDS = {
    "demo": "run the DLRM workload serially, with every TorchRec plan and the auto-generated plan; print a table",
    "show": "print the schedule table and stage analysis of one of TorchRec's pipelines",
    "list": "list the pipeline plans 'swpipe show' knows",
    "plan": "auto-schedule a task graph with a cost model; print and save the plan",
    "simulate": "simulate a plan with a cost model; print period, latency and the binding resource",
    "check": "record the DLRM tasks' dataflow and check TorchRec's plans (or --plan FILE.py:FUNC) for missing dependencies",
    "pp": "run PyTorch's pipeline-parallel schedules and one searched by swpipe under torchrun; predicted vs measured",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available sub-command."""
    parser = argparse.ArgumentParser(prog="swpipe", description=_DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in _COMMANDS.items():
        try:
            module = importlib.import_module(f"swpipe.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"swpipe.commands.{name}":
                raise
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``swpipe`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except BrokenPipeError:  # the reader went away (``swpipe list | head``): not an error of the command
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush does not fail again
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
