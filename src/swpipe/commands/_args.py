"""argparse types that reject nonsensical numbers where they are typed (``--time-limit -5``)."""

from __future__ import annotations

import argparse
import math
from typing import Callable

__all__ = ["int_at_least", "positive_number", "positive_float", "add_keep_freed_memory", "apply_keep_freed_memory"]


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type`` for an integer ``>= low``.

    Parameters
    ----------
    low : int

    Returns
    -------
    callable
        ``str -> int``; raises ``argparse.ArgumentTypeError`` naming the value and the bound.

    Examples
    --------
    >>> int_at_least(1)("3")
    3
    >>> int_at_least(2)("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 0 is too small: give an integer >= 2
    """
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer: give an integer >= {low}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is too small: give an integer >= {low}")
        return value

    parse.__name__ = f"integer >= {low}"  # argparse names the type in its messages
    return parse


def positive_number(unit: str, noun: str, example: str) -> Callable[[str], float]:
    """An argparse ``type`` for a finite number ``> 0`` of ``unit``; its errors name the unit.

    Parameters
    ----------
    unit : str
        What the number counts (``"seconds"``, ``"MiB"``).
    noun : str
        What the number is (``"time"``, ``"size"``).
    example : str
        A value to suggest.

    Returns
    -------
    callable
        ``str -> float``; raises ``argparse.ArgumentTypeError`` naming the value, the unit and an example.

    Examples
    --------
    >>> mib = positive_number("MiB", "size", "512")
    >>> mib("1.5")
    1.5
    >>> mib("-5")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: -5.0 is not a positive number of MiB: give a size > 0, e.g. 512
    """
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number: give a {noun} in {unit} > 0, "
                                             f"e.g. {example}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"{value} is not a positive number of {unit}: give a {noun} > 0, "
                                             f"e.g. {example}")
        return value

    parse.__name__ = f"number of {unit} > 0"  # argparse names the type in its messages
    return parse


positive_float = positive_number("seconds", "time", "30")
positive_float.__doc__ = """An argparse ``type`` for a finite number of seconds ``> 0``.

Examples
--------
>>> positive_float("2.5")
2.5
>>> positive_float("-5")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: -5.0 is not a positive number of seconds: give a time > 0, e.g. 30
"""


def add_keep_freed_memory(parser: argparse.ArgumentParser) -> None:
    """``--keep-freed-memory`` (default) / ``--no-keep-freed-memory``, for commands and benchmarks that time tasks.

    Examples
    --------
    >>> parser = argparse.ArgumentParser()
    >>> add_keep_freed_memory(parser)
    >>> parser.parse_args([]).keep_freed_memory, parser.parse_args(["--no-keep-freed-memory"]).keep_freed_memory
    (True, False)
    """
    parser.add_argument("--keep-freed-memory", action=argparse.BooleanOptionalAction, default=True,
                        help="keep freed host memory in the process (glibc's mallopt, "
                             "swpipe.keep_freed_memory) so that tasks do not fault their pages back "
                             "in each iteration; --no-keep-freed-memory leaves malloc as it is")


def apply_keep_freed_memory(args: argparse.Namespace) -> str:
    """Apply ``args.keep_freed_memory`` in this process; one line that says what the allocator does.

    Examples
    --------
    >>> apply_keep_freed_memory(argparse.Namespace(keep_freed_memory=False))
    'host allocator: as the system sets it (--no-keep-freed-memory)'
    """
    from swpipe_core.measure.allocator import keep_freed_memory

    if not args.keep_freed_memory:
        return "host allocator: as the system sets it (--no-keep-freed-memory)"
    if keep_freed_memory():
        return "host allocator: glibc keeps freed memory (mallopt; --no-keep-freed-memory to leave it)"
    return "host allocator: as the system sets it (not glibc: --keep-freed-memory does nothing here)"
