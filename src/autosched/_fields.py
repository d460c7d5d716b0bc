"""Checks of options' fields at construction: a wrong value fails at once, naming the field and what it takes.

Without them ``Constraints(max_depth="3")`` failed deep inside the search with
a raw ``TypeError``. Each options dataclass calls :func:`check_fields` from
``__post_init__`` with one rule per field.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

__all__ = ["OptionError", "check_fields", "integer", "number", "one_of", "flag", "optional", "names", "mapping"]

Rule = Tuple[Callable[[Any], bool], str]


class OptionError(TypeError, ValueError):
    """An option with a value of the wrong type or out of range (a ``TypeError`` and a ``ValueError``).

    Attributes
    ----------
    owner : str
        The options class (``"Constraints"``, ``"SolverOptions"``, ...).
    fields : list of str
        The fields at fault; ``field`` is the first.
    value : object
        The first field's value.
    expected : str
        What the field takes (a wrong value), ``""`` otherwise.
    home : str
        The options class the fields belong to (fields given to the wrong one), ``""`` otherwise.
    """

    def __init__(self, message: str, *, owner: str = "", fields: Sequence[str] = (), value: object = None,
                 expected: str = "", home: str = "") -> None:
        self.owner, self.fields, self.value, self.expected, self.home = owner, list(fields), value, expected, home
        super().__init__(message)

    @property
    def field(self) -> Optional[str]:
        """The first field at fault."""
        return self.fields[0] if self.fields else None


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
    autosched._fields.OptionError: Opts(depth='3'): expected an integer >= 1
    """
    for name, (ok, expected) in rules.items():
        value = getattr(owner, name)
        if not ok(value):
            raise OptionError(f"{type(owner).__name__}({name}={value!r}): expected {expected}",
                              owner=type(owner).__name__, fields=[name], value=value, expected=expected)


def integer(low: int) -> Rule:
    """An ``int`` (not a bool) ``>= low``."""
    return (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= low,
            f"an integer >= {low}")


def number(low: float, strict: bool = False) -> Rule:
    """A real number ``>= low`` (``> low`` when ``strict``), not a bool."""
    def ok(v: Any) -> bool:
        return (isinstance(v, numbers.Real) and not isinstance(v, bool)
                and (v > low if strict else v >= low))
    return ok, f"a number {'>' if strict else '>='} {low:g}"


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
