"""argparse types that reject nonsensical numbers where they are typed (``--time-limit -5``)."""

from __future__ import annotations

import argparse
import math
from typing import Callable

__all__ = ["int_at_least", "positive_float"]


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


def positive_float(text: str) -> float:
    """An argparse ``type`` for a finite number of seconds ``> 0``.

    Parameters
    ----------
    text : str

    Returns
    -------
    float

    Raises
    ------
    argparse.ArgumentTypeError
        Naming the value and what to give instead.

    Examples
    --------
    >>> positive_float("2.5")
    2.5
    >>> positive_float("-5")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: -5.0 is not a positive number of seconds: give a time > 0, e.g. 30
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: give a time in seconds > 0, e.g. 30") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of seconds: give a time > 0, e.g. 30")
    return value
