"""Checks of options' fields at construction: a wrong value fails at once, naming the field and what it takes.

Without them ``Constraints(max_depth="3")`` failed deep inside the search with
a raw ``TypeError``. Each options dataclass calls :func:`check_fields` from
``__post_init__`` with one rule per field.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from swpipe_core.engine.options import OptionError

__all__ = ["OptionError", "check_fields", "check_arguments", "integer", "number", "fraction", "one_of", "flag",
           "optional", "names", "mapping", "time_limit", "byte_cap"]

Rule = Tuple[Callable[[Any], bool], str]


def check_fields(owner: Any, rules: Dict[str, Rule]) -> None:
    """Raise :class:`OptionError` for the first field of ``owner`` its rule rejects.

    Examples
    --------
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Opts:
    ...     depth: int = 2
    ...     def __post_init__(self): check_fields(self, {"depth": integer(1)})
    >>> Opts(depth="3")
    Traceback (most recent call last):
    ...
    swpipe_core.engine.options.OptionError: Opts(depth='3'): expected an integer >= 1
    """
    check_arguments(type(owner).__name__, {name: (getattr(owner, name), rule) for name, rule in rules.items()})


def check_arguments(given_to: str, rules: Dict[str, Tuple[Any, Rule]]) -> None:
    """Raise :class:`OptionError` for the first ``name: (value, rule)`` whose rule rejects its value.

    The same check as :func:`check_fields`, for a function's arguments: ``given_to`` names the function.

    Examples
    --------
    >>> check_arguments("pp_search", {"time_limit_s": (0, time_limit())})
    Traceback (most recent call last):
    ...
    swpipe_core.engine.options.OptionError: pp_search(time_limit_s=0): expected a finite number > 0 (seconds)
    """
    for name, (value, (ok, expected)) in rules.items():
        if not ok(value):
            raise OptionError(given_to, name, value, home=given_to, expected=expected)


def integer(low: int) -> Rule:
    """An ``int`` (not a bool) ``>= low``."""
    return (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= low,
            f"an integer >= {low}")


def number(low: float, strict: bool = False, finite: bool = False) -> Rule:
    """A real number ``>= low`` (``> low`` when ``strict``; not infinite when ``finite``), not a bool; never NaN."""
    def ok(v: Any) -> bool:
        return (isinstance(v, numbers.Real) and not isinstance(v, bool)
                and (v > low if strict else v >= low) and (not finite or math.isfinite(v)))
    return ok, f"a {'finite ' if finite else ''}number {'>' if strict else '>='} {low:g}"


def time_limit() -> Rule:
    """A time budget in seconds: a finite number ``> 0``. The one rule of every ``time_limit_s`` a search takes."""
    ok, expected = number(0, strict=True, finite=True)
    return ok, f"{expected} (seconds)"


def byte_cap() -> Rule:
    """A memory cap in bytes: a finite number ``> 0``. The one rule of every memory cap a search takes."""
    ok, expected = number(0, strict=True, finite=True)
    return ok, f"{expected} (bytes)"


def fraction() -> Rule:
    """A real number in ``(0, 1]``, not a bool: a share of a budget."""
    ok, _ = number(0, strict=True)
    return (lambda v: ok(v) and v <= 1), "a number in (0, 1]"


def one_of(choices: Sequence[Any]) -> Rule:
    """One of ``choices``."""
    return (lambda v: v in choices), "one of " + ", ".join(repr(c) for c in choices)


def flag() -> Rule:
    """``True`` or ``False``."""
    return (lambda v: isinstance(v, bool)), "True or False"


def names(allow_none: bool = False) -> Rule:
    """A list or tuple of strings (``None`` items allowed with ``allow_none``)."""
    def ok(v: Any) -> bool:
        return isinstance(v, (list, tuple)) and all(isinstance(x, str) or (allow_none and x is None) for x in v)
    return ok, "a list of names" + (" (None for the default stream)" if allow_none else "")


def optional(rule: Rule) -> Rule:
    """``None`` or what ``rule`` takes."""
    ok, expected = rule
    return (lambda v: v is None or ok(v)), f"None or {expected}"


def mapping(value_ok: Optional[Callable[[Any], bool]] = None, expected: str = "a dict") -> Rule:
    """A dict (each value accepted by ``value_ok``)."""
    return (lambda v: isinstance(v, dict) and (value_ok is None or all(map(value_ok, v.values())))), expected
