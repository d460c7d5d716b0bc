"""``swpipe list``: the pipeline plans ``swpipe show`` knows, one line each."""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``swpipe list`` takes no arguments."""


def run(args: argparse.Namespace) -> int:
    """Print ``name  description`` for every pipeline."""
    from swpipe_core import pipelines

    width = max(len(name) for name in pipelines.PIPELINES)
    for name in pipelines.PIPELINES:
        print(f"{name:<{width}}  {pipelines.describe(name)}")
    return 0
