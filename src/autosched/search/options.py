"""The search's options, split by what they are: ``Constraints`` (what the plan may be) and ``SolverOptions`` (how
the search runs), each field checked when it is built.

Verification on the engine has its own options (:class:`autosched.verify.loop.VerifyOptions`). A field given to the
wrong one fails at once, naming the class it belongs to and the fix.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Optional, Sequence

from autosched._fields import (OptionError, check_fields, flag, integer, mapping, names, number, one_of,
                               optional)

__all__ = ["Constraints", "SolverOptions", "OptionError"]


@dataclass
class Constraints:
    """What the plan may be: depth, threads, streams, frozen choices, collective order, device, memory.

    How the search runs (its time budget, seed, method, ...) is :class:`SolverOptions`'s.

    Parameters
    ----------
    max_depth : int
        Most iterations in flight (memory): stages ``0 .. max_depth - 1``.
    max_threads : int
        Most CPU thread groups.
    streams : list of (str or None), optional
        Streams available (``None`` = default stream). Default: the streams the
        input plan uses (only the default stream for a bare graph). Streams are
        searched only for ``device="cuda"``; on CPU a stream is just a name.
    frozen : dict
        ``{task: {"stage": s, "stream": x, "thread_group": g}}`` (any subset),
        or ``{task: TaskSchedule}`` to freeze all three.
    globally_ordered : list of str, optional
        Collective tasks run in one global sequence. Default: the input plan's
        flags, or for a bare graph the tasks with a ``comm:`` cost tag.
    device : {"cpu", "cuda"}
        Which semantics the simulator (and the models) use.
    max_memory_bytes : float, optional
        Cap on the predicted peak bytes in flight (needs memory figures in the
        cost model): the search returns the fastest plan whose peak fits,
        trying every depth up to ``max_depth``, or raises
        :class:`autosched.search.memcap.MemoryCapError` naming the least memory a
        plan needs (:mod:`autosched.search.memcap`).

    Raises
    ------
    OptionError
        A field of the wrong type or out of range, or a solver option (``time_limit_s``, ``seed``, ...) given here.

    Examples
    --------
    >>> Constraints(max_depth=2, frozen={"Forward": {"stream": None}}).max_threads
    2
    >>> Constraints(max_depth=2, time_limit_s=5)
    Traceback (most recent call last):
    ...
    autosched._fields.OptionError: Constraints(time_limit_s=5): time_limit_s is a solver option, not a plan constraint; pass auto_schedule(..., solver=SolverOptions(time_limit_s=5))
    """

    max_depth: int = 3
    max_threads: int = 2
    streams: Optional[Sequence[Optional[str]]] = None
    frozen: Dict[Any, Any] = field(default_factory=dict)
    globally_ordered: Optional[Sequence[str]] = None
    device: str = "cpu"
    max_memory_bytes: Optional[float] = None

    def __post_init__(self) -> None:
        check_fields(self, {
            "max_depth": integer(1), "max_threads": integer(1), "streams": optional(names(allow_none=True)),
            "frozen": mapping(expected="a dict {task: {'stage'|'stream'|'thread_group': value}} or {task: TaskSchedule}"),
            "globally_ordered": optional(names()), "device": one_of(("cpu", "cuda")),
            "max_memory_bytes": optional(number(0, strict=True)),
        })


@dataclass
class SolverOptions:
    """How the search runs: its time budget, seed, searchers and their settings.

    What the plan may be (depth, threads, streams, ...) is :class:`Constraints`'s.

    Parameters
    ----------
    time_limit_s : float
        Wall-clock budget of the whole search.
    seed : int
        Makes the beam's sampling and CP-SAT's search reproducible.
    method : {"auto", "cpsat", "beam"}
        ``auto``: beam, then CP-SAT when the graph has at most
        ``cpsat_max_tasks`` tasks.
    cpsat_max_tasks : int
        Largest graph ``method="auto"`` hands to CP-SAT.
    beam_width, beam_rounds : int
        Plans kept per beam round, and the rounds.
    num_workers : int
        CP-SAT worker threads.
    num_iterations : int
        Simulated iterations for the final score.
    time_unit_s : float, optional
        The models' integer clock (default: about 1e-5 of a serial iteration).
    progress : bool
        tqdm progress bar over beam rounds.

    Raises
    ------
    OptionError
        A field of the wrong type or out of range, or a plan constraint (``max_depth``, ...) given here.

    Examples
    --------
    >>> SolverOptions(time_limit_s=5, seed=1).method
    'auto'
    >>> SolverOptions(beam_width="6")
    Traceback (most recent call last):
    ...
    autosched._fields.OptionError: SolverOptions(beam_width='6'): expected an integer >= 1
    """

    time_limit_s: float = 30.0
    seed: int = 0
    method: str = "auto"
    cpsat_max_tasks: int = 20
    beam_width: int = 6
    beam_rounds: int = 20
    num_workers: int = 2
    num_iterations: int = 60
    time_unit_s: Optional[float] = None
    progress: bool = False

    def __post_init__(self) -> None:
        check_fields(self, {
            "time_limit_s": number(0, strict=True), "seed": integer(0), "method": one_of(("auto", "cpsat", "beam")),
            "cpsat_max_tasks": integer(0), "beam_width": integer(1), "beam_rounds": integer(1),
            "num_workers": integer(1), "num_iterations": integer(2), "time_unit_s": optional(number(0, strict=True)),
            "progress": flag(),
        })


def _refusing_the_others(cls: type, other: type, argument: str, what: str, not_what: str) -> None:
    """Wrap ``cls.__init__``: a field of ``other`` given to ``cls`` raises :class:`OptionError` naming its home.

    The generated ``__init__`` would reject it as a bare unexpected keyword; the wrapper keeps its signature
    (``functools.wraps``) for ``help()`` and the API reference.
    """
    init, theirs = cls.__init__, {f.name for f in fields(other)}

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        foreign = [k for k in kwargs if k in theirs]
        if foreign:
            given = ", ".join(f"{k}={kwargs[k]!r}" for k in foreign)
            one = len(foreign) == 1
            are = f"is a {what}, not a {not_what}" if one else f"are {what}s, not {not_what}s"
            raise OptionError(f"{cls.__name__}({given}): {', '.join(foreign)} {are}; "
                              f"pass auto_schedule(..., {argument}={other.__name__}({given}))",
                              owner=cls.__name__, fields=foreign, value=kwargs[foreign[0]], home=other.__name__)
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]


_refusing_the_others(Constraints, SolverOptions, "solver", "solver option", "plan constraint")
_refusing_the_others(SolverOptions, Constraints, "constraints", "plan constraint", "solver option")
