"""Plain text for the terminal: lines wrapped rather than cut, and legends that say what a table's terms mean."""

from __future__ import annotations

import textwrap
from typing import List, Sequence, Tuple

__all__ = ["wrap", "format_legend"]


def wrap(line: str, width: int = 120, indent: str = "  ") -> List[str]:
    """``line`` as lines of at most ``width`` columns, continuation lines indented: every word kept.

    Examples
    --------
    >>> wrap("auto: kept as a known plan of 4 plans on the engine", width=24)
    ['auto: kept as a known', '  plan of 4 plans on the', '  engine']
    >>> wrap("short")
    ['short']
    """
    return textwrap.wrap(line, width=width, subsequent_indent=indent, break_on_hyphens=False) or [""]


def format_legend(legend: Sequence[Tuple[str, str]], width: int = 120) -> str:
    """``Legend:`` then one entry per term, its words wrapped under it to ``width`` columns.

    Examples
    --------
    >>> print(format_legend([("LDS", "a lower bound on the stages"), ("+", "more stages than needed")]))
    Legend:
      LDS  a lower bound on the stages
      +    more stages than needed
    """
    key_width = max(len(key) for key, _ in legend)
    lines = ["Legend:"]
    for key, words in legend:
        lead = f"  {key:<{key_width}}  "
        lines += textwrap.wrap(words, width=width, initial_indent=lead, subsequent_indent=" " * len(lead),
                               break_on_hyphens=False)
    return "\n".join(lines)
