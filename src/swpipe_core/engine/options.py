"""What the engine and the profiler take besides a plan: :class:`Timeouts`, and :class:`OptionError` for a bad option.

An option given to the wrong call (``SWPipeline(plan, num_measure=5)``, a
timeout under its old name, a typo) raises :class:`OptionError` naming where
it belongs and the call to write instead, never a bare "unexpected keyword
argument" (:func:`keywords_checked`). The homes' keywords are listed here
(the engine and the profiler build on this module, so it cannot import them
to read their signatures); a test holds each list equal to its signature.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import threading
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

__all__ = ["Timeouts", "OptionError", "keywords_checked"]

F = TypeVar("F", bound=Callable[..., Any])


class OptionError(TypeError, ValueError):
    """An option given where it does not belong, or with a value it cannot take (a ``TypeError`` and a ``ValueError``).

    The one error of every call and options class that takes options: the engine's and the profiler's calls,
    ``Timeouts``, ``auto_schedule``, ``Constraints``, ``SolverOptions``, ``VerifyOptions``.

    Attributes
    ----------
    given_to : str
        The call or class that got it (``"SWPipeline"``, ``"Timeouts"``, ``"auto_schedule"``, ``"Constraints"``).
    field : str
        The keyword or field.
    value : Any
        The value given.
    home : str or None
        Where the option belongs when not here (``"Timeouts"``, ``"TaskProfiler"``, ``"SolverOptions"``); for a
        value out of range, the class it was given to or ``None``; ``None`` for an unknown keyword.
    expected : str or None
        What the option takes, for a value out of range.
    argument : str or None
        The ``auto_schedule`` argument that takes ``home`` (``"solver"``), when there is one.
    fix : str
        What to write instead (``""`` when the message says it).

    Examples
    --------
    >>> from swpipe import SWPipeline, PipelinePlan, TaskSchedule
    >>> try:
    ...     SWPipeline(PipelinePlan({"A": TaskSchedule()}), signal_timeout=5)
    ... except OptionError as exc:
    ...     print(exc.field, exc.home, exc.fix)
    signal_timeout Timeouts SWPipeline(plan, timeouts=Timeouts(signal_s=5))
    """

    def __init__(self, given_to: str, field: str, value: Any, *, home: Optional[str] = None,
                 expected: Optional[str] = None, argument: Optional[str] = None, fix: str = "",
                 message: Optional[str] = None) -> None:
        self.given_to, self.field, self.value, self.home, self.expected, self.argument, self.fix = (
            given_to, field, value, home, expected, argument, fix)
        if message is None:
            if expected is not None:
                what = f"expected {expected}"
            elif home is not None:
                what = f"{field} is an option of {home}, not of {given_to}"
            else:
                what = f"{given_to} has no option {field!r}"
            message = f"{given_to}({field}={value!r}): {what}" + (f"; {fix}" if fix else "")
        super().__init__(message)

    def __reduce__(self):  # keep the fields through pickling (multiprocessing)
        return (functools.partial(type(self), home=self.home, expected=self.expected, argument=self.argument,
                                  fix=self.fix, message=str(self)),
                (self.given_to, self.field, self.value))


@dataclass(frozen=True)
class Timeouts:
    """How long the engine waits before it calls something hung, in seconds (``float("inf")``: no limit).

    Every wait of the engine is bounded, so a hung task, a dead peer or a
    stuck kernel becomes an error naming what it waited for, never a hang.

    Parameters
    ----------
    signal_s : float
        A task waits this long for one dependency's CPU signal; a task of the
        caller's group may run this long before the watchdog reports it.
    sequencer_s : float
        A globally ordered task waits this long for its turn.
    progress_s : float
        ``progress`` waits this long for the oldest iteration; every wait for
        device work (the device-lag bound, the end of the data, ``drain``) too.
    join_s : float
        After a failure, the caller waits this long for each worker to stop
        (a task blocked in your code cannot be interrupted; its thread ends
        when the task returns).
    teardown_s : float
        After a failure, the caller waits this long for the failed run's
        device work (a kernel waiting for a dead peer never ends); its
        iteration contexts stay alive until a later fence completes.

    Raises
    ------
    OptionError
        A value that is not a positive number.

    Examples
    --------
    >>> from swpipe import SWPipeline, PipelinePlan, TaskSchedule
    >>> pipe = SWPipeline(PipelinePlan({"A": TaskSchedule()}), device="cpu",
    ...                   timeouts=Timeouts(signal_s=5, progress_s=20))
    >>> pipe.timeouts.signal_s, pipe.timeouts.sequencer_s
    (5.0, 30.0)
    >>> Timeouts(progress_s=0)
    Traceback (most recent call last):
    ...
    swpipe_core.engine.options.OptionError: Timeouts(progress_s=0): expected a positive number of seconds
    """

    signal_s: float = 30.0
    sequencer_s: float = 30.0
    progress_s: float = 60.0
    join_s: float = 5.0
    teardown_s: float = 5.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise OptionError("Timeouts", f.name, value, expected="a positive number of seconds")
            # lock waits accept at most TIMEOUT_MAX: inf (no limit) becomes that
            object.__setattr__(self, f.name, min(float(value), threading.TIMEOUT_MAX))


#: Where the options of the engine's and the profiler's calls live: (home, its keyword options, how it is passed).
#: The keywords are the homes' signatures written out (``Timeouts``' are its fields): reading them from the
#: signatures here would import the engine and the profiler, which build on this module;
#: tests/test_options_homes.py holds each list equal to its signature.
OPTION_HOMES: Tuple[Tuple[str, Tuple[str, ...], str], ...] = (
    ("SWPipeline", ("plan", "device", "timeouts", "record_timeline", "max_device_lag", "strict", "state", "rng"),
     "SWPipeline(plan, {kw})"),
    ("Timeouts", tuple(f.name for f in fields(Timeouts)), "SWPipeline(plan, timeouts=Timeouts({kw}))"),
    ("SWPipeline.run", ("data_iter", "verbose", "emit_nvtx", "first_iter_idx"), "pipe.run(data, {kw})"),
    ("TaskProfiler", ("pipeline", "num_warmup", "num_measure", "num_rounds", "interleave", "progress", "calibrate"),
     "TaskProfiler(pipe, {kw})"),
    ("TaskProfiler.profile", ("batch", "num_warmup", "num_measure", "num_rounds", "skip_tasks", "task_times",
                              "memory", "state"), "TaskProfiler(pipe).profile(batch, {kw})"),
)

#: Options under the names they had before they moved: old name -> (home, name there).
_RENAMED: Dict[str, Tuple[str, str]] = {
    "signal_timeout": ("Timeouts", "signal_s"),
    "sequencer_timeout": ("Timeouts", "sequencer_s"),
    "progress_timeout": ("Timeouts", "progress_s"),
}


def keyword_options(fn: Callable[..., Any]) -> List[str]:
    """The keyword options of ``fn``, from its signature (``self`` and ``*args``/``**kwargs`` left out).

    Examples
    --------
    >>> keyword_options(lambda batch, *rest, state=None, **more: None)
    ['batch', 'state']
    """
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def misplaced(given_to: str, option: str, value: Any, accepted: List[str]) -> OptionError:
    """The error for ``option`` given to ``given_to``, which takes ``accepted``: its home, or the nearest name.

    Examples
    --------
    >>> err = misplaced("TaskProfiler.profile", "num_measure", 5, ["batch", "state"])
    >>> err.home, err.fix
    ('TaskProfiler', 'TaskProfiler(pipe, num_measure=5)')
    >>> misplaced("SWPipeline", "stirct", True, ["plan", "strict"]).fix
    'did you mean strict=True?'
    """
    if option in _RENAMED:
        home, name = _RENAMED[option]
        template = next(t for h, _, t in OPTION_HOMES if h == home)
        return OptionError(given_to, option, value, home=home, fix=template.format(kw=f"{name}={value!r}"))
    for home, keywords, template in OPTION_HOMES:
        if home != given_to and option in keywords:
            return OptionError(given_to, option, value, home=home, fix=template.format(kw=f"{option}={value!r}"))
    near = difflib.get_close_matches(option, accepted, n=1)
    fix = f"did you mean {near[0]}={value!r}?" if near else f"{given_to} takes {', '.join(accepted)}"
    return OptionError(given_to, option, value, fix=fix)


def keywords_checked(given_to: str) -> Callable[[F], F]:
    """Decorate a function (or ``__init__``) so that a keyword it does not take raises :func:`misplaced`'s error.

    The signature is kept (``help()``, the API reference); only a call with
    an unknown keyword pays for the check.

    Examples
    --------
    >>> @keywords_checked("TaskProfiler.profile")
    ... def profile(batch, *, state=None):
    ...     return state
    >>> profile(1, state="s")
    's'
    >>> try:
    ...     profile(1, num_rounds=2)
    ... except OptionError as exc:
    ...     print(exc.field, "->", exc.home, "|", exc.fix)
    num_rounds -> TaskProfiler | TaskProfiler(pipe, num_rounds=2)
    """
    def decorate(fn: F) -> F:
        accepted = keyword_options(fn)

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except TypeError:
                unknown = [k for k in kwargs if k not in accepted]
                if unknown:
                    raise misplaced(given_to, unknown[0], kwargs[unknown[0]], accepted) from None
                raise

        return checked  # type: ignore[return-value]

    return decorate
