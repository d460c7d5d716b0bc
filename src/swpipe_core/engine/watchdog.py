"""The caller's thread watched while it runs a task of the caller's group: a hang there becomes an error.

A task of the caller's group runs on the thread that calls
``fill_pipeline``/``progress``. If it blocks forever (a stuck collective, a
deadlocked queue), no timeout of the engine applies: the caller's thread is
the one that would raise it. :class:`InlineWatchdog` is a thread
(``swpipe-watchdog``) that notices when the current inline task has run longer
than ``timeout`` and then

* when the caller is the main thread and Ctrl-C is Python's own
  (``signal.default_int_handler``): sends it ``SIGINT``. The handler the
  watchdog installs for the run turns that signal into
  :class:`InlineTaskTimeout` inside the task (the engine reports it as the
  task's ``PipelineTaskError``); a real Ctrl-C still raises
  ``KeyboardInterrupt``. A task blocked in Python (a lock, an event, a queue,
  ``time.sleep``) or in a system call is interrupted; one blocked inside C
  code that retries on interruption is interrupted when that call returns;
* otherwise (a caller that is not the main thread, or a Ctrl-C handler of the
  user's): it cannot interrupt the caller, so it reports at once through
  ``on_timeout`` (the engine logs the error and cancels the run; the caller
  raises it when the task returns). Run that group on a worker thread
  (``caller_group=None``) when its tasks may block and the caller is not the
  main thread: a worker's hang is always reported within ``Timeouts.signal_s``.

The caller marks each inline task with :meth:`begin`/:meth:`end` (two
attribute writes); the watchdog looks at the mark four times per ``timeout``
(at most once a second), never touching the caller's hot path otherwise.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, Callable, Optional, Tuple

__all__ = ["InlineTaskTimeout", "InlineWatchdog"]


class InlineTaskTimeout(BaseException):
    """Raised inside a caller's-group task the watchdog interrupted (a ``BaseException``, as Ctrl-C is:
    a task's own ``except Exception`` does not swallow it)."""


Mark = Tuple[str, int, float]  # (task, iteration, started at: time.monotonic())


class InlineWatchdog:
    """Watches the inline tasks of one run (started by the engine, stopped and joined at its end).

    Parameters
    ----------
    timeout : float
        Seconds an inline task may run (the pipeline's ``Timeouts.signal_s``).
    on_timeout : callable
        ``on_timeout(task, iteration, can_interrupt)``, called on the
        watchdog's thread when a task overruns.

    Examples
    --------
    >>> fired = []
    >>> dog = InlineWatchdog(0.05, lambda task, i, interrupts: fired.append((task, i)))
    >>> dog.start()
    >>> dog.begin("Step", 3)
    >>> done = threading.Event()
    >>> try:
    ...     _ = done.wait(1.0)  # blocks past the timeout: interrupted (on the main thread, Ctrl-C Python's)
    ... except InlineTaskTimeout:
    ...     pass
    >>> dog.end(); dog.stop()
    >>> fired
    [('Step', 3)]
    """

    def __init__(self, timeout: float, on_timeout: Callable[[str, int, bool], None]) -> None:
        self.timeout = timeout
        self._on_timeout = on_timeout
        self._current: Optional[Mark] = None
        self._fired: Optional[Mark] = None
        self._pending = False  # the watchdog's own SIGINT is on its way
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="swpipe-watchdog", daemon=True)
        self._caller = threading.get_ident()
        self._previous: Any = None
        main = threading.current_thread() is threading.main_thread()
        self.interrupts = main and signal.getsignal(signal.SIGINT) is signal.default_int_handler

    def start(self) -> None:
        if self.interrupts:
            self._previous = signal.signal(signal.SIGINT, self._on_signal)
        self._thread.start()

    def begin(self, task: str, iteration: int) -> None:
        """The caller starts an inline task."""
        self._current = (task, iteration, time.monotonic())

    def end(self) -> None:
        """The caller's inline task returned (or raised)."""
        self._current = None

    def stop(self) -> None:
        """Stop watching, join the thread, give Ctrl-C back to what it was (on the caller's thread)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._previous is not None and threading.get_ident() == self._caller:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _watch(self) -> None:
        interval = min(1.0, self.timeout / 4)
        while not self._stop.wait(interval):  # a watchdog's period, not a synchronisation
            mark = self._current
            if mark is None or self._fired is not None or time.monotonic() - mark[2] <= self.timeout:
                continue
            self._fired = mark
            self._on_timeout(mark[0], mark[1], self.interrupts)
            if self.interrupts:
                self._pending = True
                signal.pthread_kill(self._caller, signal.SIGINT)
            return  # one timeout ends the run

    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self._pending:  # a real Ctrl-C
            signal.default_int_handler(signum, frame)
            return
        self._pending = False
        fired = self._fired
        if fired is not None and self._current is fired:
            raise InlineTaskTimeout(f"{fired[0]} (iteration {fired[1]}) ran longer than {self.timeout:g} s")
        # the watchdog's own signal after the task returned: nothing left to interrupt

    @property
    def fired(self) -> Optional[Mark]:
        """The task the watchdog found overrunning (``None`` if none)."""
        return self._fired
