"""The search's options, split by what they are: ``Constraints`` (what the plan may be) and ``SolverOptions`` (how
the search runs), each field checked when it is built.

Verification on the engine has its own options (:class:`autosched.verify.loop.VerifyOptions`). An option given to
the wrong class, or to ``auto_schedule`` itself, fails at once with an :class:`~swpipe_core.engine.options.OptionError`
naming the class it belongs to (``.home``) and the ``auto_schedule`` argument that takes it (``.argument``).
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, Optional, Sequence, TypeVar

from autosched._fields import (OptionError, byte_cap, check_fields, flag, fraction, integer, mapping, names, number,
                               one_of, optional, time_limit)
from autosched.verify.measure import VerifyOptions  # the third options class (the step after the search)

__all__ = ["Constraints", "SolverOptions", "OptionError", "misplaced_option", "naming_homes"]


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
        Cap on the predicted peak bytes in flight, a finite number > 0 (the rule every
        memory cap takes; needs memory figures in the cost model): the search returns
        the fastest plan whose peak fits, trying every depth up to ``max_depth``, or raises
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
    swpipe_core.engine.options.OptionError: Constraints(time_limit_s=5): time_limit_s is a solver option, not a plan constraint; pass auto_schedule(..., solver=SolverOptions(time_limit_s=5))

    The error's fields say the same (:class:`~swpipe_core.engine.options.OptionError`): ``.field`` is
    ``"time_limit_s"``, ``.home`` ``"SolverOptions"``, ``.argument`` ``"solver"``.
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
            "max_memory_bytes": optional(byte_cap()),
        })


@dataclass
class SolverOptions:
    """How the search runs: its time budget, seed, searchers and their settings.

    What the plan may be (depth, threads, streams, ...) is :class:`Constraints`'s.

    Parameters
    ----------
    time_limit_s : float
        Wall-clock budget of the whole search: a finite number > 0, the rule every search's time limit
        takes (``pp_search`` too).
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
    beam_share : float
        The beam search's share of ``time_limit_s`` when CP-SAT runs after it.
    beam_only_share : float
        The beam search's share of ``time_limit_s`` when it runs alone; the rest is for judging its plan
        (a quick search one iteration shallower says why the depth is what it is).
    cpsat_share : float
        CP-SAT runs until this share of ``time_limit_s`` has passed (at least one second, whatever the beam left
        of it); its last solve, which minimises depth and latency at the best period, may add up to a fifth of
        CP-SAT's own budget.

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
    swpipe_core.engine.options.OptionError: SolverOptions(beam_width='6'): expected an integer >= 1
    >>> SolverOptions().beam_share, SolverOptions().cpsat_share
    (0.3, 0.7)
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
    beam_share: float = 0.3
    beam_only_share: float = 0.85
    cpsat_share: float = 0.7

    def __post_init__(self) -> None:
        check_fields(self, {
            "time_limit_s": time_limit(), "seed": integer(0), "method": one_of(("auto", "cpsat", "beam")),
            "cpsat_max_tasks": integer(0), "beam_width": integer(1), "beam_rounds": integer(1),
            "num_workers": integer(1), "num_iterations": integer(2), "time_unit_s": optional(number(0, strict=True)),
            "progress": flag(), "beam_share": fraction(), "beam_only_share": fraction(), "cpsat_share": fraction(),
        })


#: what an option of each class is called in an error, and the auto_schedule argument that takes the class
_WHAT = {"Constraints": ("plan constraint", "constraints"), "SolverOptions": ("solver option", "solver"),
         "VerifyOptions": ("verification option", "verify")}


def _option_classes() -> List[type]:
    return [Constraints, SolverOptions, VerifyOptions]


def misplaced_option(given_to: str, name: str, value: Any) -> OptionError:
    """The error for an option ``name=value`` given to ``given_to``, which does not take it.

    It names the options class the option belongs to and the ``auto_schedule`` argument that takes that class
    (``.home``, ``.argument``), or, for a name no options class has, the closest one.

    Examples
    --------
    >>> e = misplaced_option("auto_schedule", "max_depth", 2)
    >>> e.field, e.home, e.argument
    ('max_depth', 'Constraints', 'constraints')
    >>> print(e)
    auto_schedule(max_depth=2): max_depth is a plan constraint; pass auto_schedule(..., constraints=Constraints(max_depth=2))
    >>> misplaced_option("SolverOptions", "max_dept", 2).home is None
    True
    """
    given = f"{given_to}({name}={value!r})"
    for cls in _option_classes():
        if name in {f.name for f in fields(cls)}:
            what, argument = _WHAT[cls.__name__]
            not_what = f", not a {_WHAT[given_to][0]}" if given_to in _WHAT else ""
            return OptionError(given_to, name, value, home=cls.__name__, argument=argument,
                               message=f"{given}: {name} is a {what}{not_what}; pass auto_schedule(..., "
                                       f"{argument}={cls.__name__}({name}={value!r}))")
    known = sorted({f.name for cls in _option_classes() for f in fields(cls)})
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]}?" if close else f"; the options are {', '.join(known)}"
    return OptionError(given_to, name, value, message=f"{given}: no option is called {name}{hint}")


_Function = TypeVar("_Function", bound=Callable[..., Any])


def naming_homes(function: _Function) -> _Function:
    """Wrap ``function`` so that a keyword it does not take raises :func:`misplaced_option`'s error.

    Python's own error would say only "unexpected keyword argument"; this one names the options class the keyword
    belongs to and the argument that takes it. The wrapper keeps ``function``'s signature (``functools.wraps``)
    for ``help()``, ``inspect.signature`` and the API reference.
    """
    import inspect

    takes = set(inspect.signature(function).parameters)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        foreign = next((k for k in kwargs if k not in takes), None)
        if foreign is not None:
            raise misplaced_option(function.__name__, foreign, kwargs[foreign])
        return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _refusing_the_others(cls: type) -> None:
    """Wrap ``cls.__init__``: a keyword that is not one of its fields raises :func:`misplaced_option`'s error.

    The generated ``__init__`` would reject it as a bare unexpected keyword; several at once are named together
    (``.field`` is the first). The wrapper keeps its signature (``functools.wraps``) for ``help()`` and the API
    reference.
    """
    init, mine = cls.__init__, {f.name for f in fields(cls)}

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        foreign = [k for k in kwargs if k not in mine]
        if len(foreign) == 1:
            raise misplaced_option(cls.__name__, foreign[0], kwargs[foreign[0]])
        if foreign:
            first = misplaced_option(cls.__name__, foreign[0], kwargs[foreign[0]])
            homes = {misplaced_option(cls.__name__, k, kwargs[k]).home for k in foreign}
            given = ", ".join(f"{k}={kwargs[k]!r}" for k in foreign)
            if len(homes) == 1 and first.home is not None:
                what = _WHAT[first.home][0]
                raise OptionError(cls.__name__, first.field, first.value, home=first.home, argument=first.argument,
                                  message=f"{cls.__name__}({given}): {', '.join(foreign)} are {what}s, not "
                                          f"{_WHAT[cls.__name__][0]}s; pass auto_schedule(..., {first.argument}="
                                          f"{first.home}({given}))")
            raise first
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]


_refusing_the_others(Constraints)
_refusing_the_others(SolverOptions)
