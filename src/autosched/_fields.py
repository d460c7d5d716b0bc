"""Checks of options' fields at construction: a wrong value fails at once, naming the field and what it takes.

Without them ``Constraints(max_depth="3")`` failed deep inside the search with
a raw ``TypeError``. Each options dataclass calls :func:`check_fields` from
``__post_init__`` with one rule per field.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from swpipe_core.engine.options import OptionError

__all__ = ["OptionError", "check_fields", "check_arguments", "integer", "number", "fraction", "one_of", "flag",
           "optional", "names", "mapping", "time_limit", "byte_cap", "memory_cap", "renamed", "schedule_name"]

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


def renamed(given_to: str, old: str, new: str, value: Any, stacklevel: int = 3) -> Any:
    """``value`` of a keyword renamed ``new``, with a ``FutureWarning`` naming the new one (kept one release).

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as seen:
    ...     warnings.simplefilter("always")
    ...     renamed("pp_what_if", "memory_cap_bytes", "max_memory_bytes", 300)
    300
    >>> seen[0].category.__name__, str(seen[0].message)
    ('FutureWarning', 'pp_what_if(memory_cap_bytes=...) is renamed max_memory_bytes=: pass max_memory_bytes=300')
    """
    warnings.warn(f"{given_to}({old}=...) is renamed {new}=: pass {new}={value!r}", FutureWarning,
                  stacklevel=stacklevel)  # the caller of the function that took the old keyword
    return value


def memory_cap(given_to: str, max_memory_bytes: Optional[float], old: str,
               old_value: Optional[float]) -> Optional[float]:
    """The one memory cap, ``max_memory_bytes``, checked by :func:`byte_cap`'s rule; an old keyword's value warns.

    Both given is an :class:`OptionError` (which one wins would be a guess).

    Examples
    --------
    >>> memory_cap("pp_compare", 2e9, "memory_cap_bytes", None)
    2000000000.0
    >>> memory_cap("pp_compare", 2e9, "memory_cap_bytes", 1e9)
    Traceback (most recent call last):
    ...
    swpipe_core.engine.options.OptionError: pp_compare(memory_cap_bytes=1000000000.0): give max_memory_bytes only (memory_cap_bytes is its old name)
    """
    if old_value is not None:
        if max_memory_bytes is not None:
            raise OptionError(given_to, old, old_value,
                              message=f"{given_to}({old}={old_value!r}): give max_memory_bytes only ({old} is its "
                                      "old name)")
        max_memory_bytes = renamed(given_to, old, "max_memory_bytes", old_value, stacklevel=4)
    check_arguments(given_to, {"max_memory_bytes": (max_memory_bytes, optional(byte_cap()))})
    return max_memory_bytes


def schedule_name(name: Any, known: Sequence[str]) -> Optional[str]:
    """``name`` spelt as in ``known`` (PyTorch's spelling: ``"GPipe"``, ``"1F1B"``, ...), case-insensitive; None when
    it is none of them. The one rule of a schedule's name: ``pp_program``, ``GPipe(schedule=)`` and ``swpipe pp``
    read names through it.

    Examples
    --------
    >>> [schedule_name(name, ("GPipe", "1F1B")) for name in ("1f1b", "gpipe", "x")]
    ['1F1B', 'GPipe', None]
    """
    return {k.lower(): k for k in known}.get(str(name).lower())
