"""SubmissionSequencer: one global order for ``globally_ordered`` tasks (collectives).

Collectives (NCCL/gloo) deadlock when two ranks issue them in different
orders. With several worker threads per rank, the order in which threads
reach their collectives is a race, so each globally ordered task takes a
*ticket* (a sequence number) when the engine enqueues it. The engine's main
thread enqueues in one deterministic order (the plan's enqueue order, period
after period), identical on every rank, so the tickets are too; a worker then
runs the task only when the counter reaches its ticket.

Because tickets follow the enqueue order, which is also the FIFO order of every
worker queue and a topological order of the dependencies, waiting for a
ticket never closes a cycle of waits. A failure elsewhere calls
:meth:`SubmissionSequencer.abort`, which wakes every waiter with an error,
so no thread is left waiting for a ticket that will never come (a ticket lock
with ``abort()``; docs/semantics.md, "Thread groups", step 2).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, TypeVar

__all__ = ["SubmissionSequencer", "SequencerAborted", "SequencerTimeout"]

T = TypeVar("T")


class SequencerAborted(RuntimeError):
    """Raised in a waiter when the sequencer was aborted because something else failed.

    Attributes
    ----------
    sequence : int
        The waiter's sequence number (its turn, which never came).
    reason : str
        Why the sequencer was aborted.
    failed_sequence : int or None
        The sequence whose task raised, when that is why.
    """

    def __init__(self, sequence: int, reason: str, failed_sequence: Optional[int] = None) -> None:
        self.sequence, self.reason, self.failed_sequence = sequence, reason, failed_sequence
        super().__init__(f"sequencer aborted before sequence {sequence} could run: {reason}")

    def __reduce__(self):
        return (type(self), (self.sequence, self.reason, self.failed_sequence))


class SequencerTimeout(RuntimeError):
    """A globally ordered task waited past the timeout for its turn.

    Attributes
    ----------
    sequence : int
        The waiting task's sequence number.
    task : str
        The waiting task's label (``""`` when it has none).
    waiting_for : str
        The label of the turn the sequencer is at (the task not yet submitted).
    next_sequence : int
        The sequence the sequencer is at.
    timeout_s : float
    """

    def __init__(self, sequence: int, task: str, next_sequence: int, waiting_for: str, timeout_s: float) -> None:
        self.sequence, self.task, self.next_sequence = sequence, task, next_sequence
        self.waiting_for, self.timeout_s = waiting_for, timeout_s
        who = f"{task} " if task else ""
        super().__init__(
            f"globally ordered task {who}with sequence {sequence} waited {timeout_s:g} s for its turn; "
            f"the sequencer is at {next_sequence}, waiting for {waiting_for} to be submitted. "
            "Every rank must enqueue the same globally ordered tasks in the same order; check that "
            "the task holding that turn is not blocked (raise Timeouts(sequencer_s=...) if it is just slow)")

    def __reduce__(self):
        return (type(self), (self.sequence, self.task, self.next_sequence, self.waiting_for, self.timeout_s))


class SubmissionSequencer:
    """Deterministic cross-thread submission order by sequence number.

    Parameters
    ----------
    timeout : float
        Seconds a task waits for its turn before :meth:`execute_ordered`
        raises :class:`SequencerTimeout` (default 30 s: a generous guard, far above any
        collective's normal wait).

    Examples
    --------
    >>> seq = SubmissionSequencer()
    >>> a, b = seq.ticket("AllToAll(iter 0)"), seq.ticket("AllReduce(iter 0)")
    >>> a, b
    (0, 1)
    >>> seq.execute_ordered(a, lambda: "first"), seq.next_seq
    ('first', 1)
    >>> seq.execute_ordered(3, lambda: None, timeout=0.01)
    Traceback (most recent call last):
    ...
    swpipe_core.engine.sequencer.SequencerTimeout: globally ordered task with sequence 3 waited 0.01 s for its turn; the sequencer is at 1, waiting for AllReduce(iter 0) ...
    """

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._cond = threading.Condition(threading.Lock())
        self._next_seq = 0
        self._issued = 0
        self._labels: Dict[int, Any] = {}
        self._aborted: Optional[str] = None
        self._failed: Optional[int] = None  # the sequence whose task raised, when that aborted the sequencer

    @property
    def next_seq(self) -> int:
        """The sequence number whose turn it is."""
        return self._next_seq

    @property
    def aborted(self) -> Optional[str]:
        """The abort reason, or ``None`` while the sequencer is usable."""
        return self._aborted

    def ticket(self, label: Any = None) -> int:
        """Issue the next sequence number; ``label`` names its task in timeout messages.

        Call from one thread, in the deterministic enqueue order.
        """
        with self._cond:
            seq = self._issued
            self._issued += 1
            if label is not None:
                self._labels[seq] = label
            return seq

    def execute_ordered(self, seq: int, fn: Callable[[], T], what: Any = None,
                        timeout: Optional[float] = None) -> T:
        """Wait until it is ``seq``'s turn, run ``fn()``, then pass the turn on.

        Parameters
        ----------
        seq : int
            A number from :meth:`ticket` (or any number when the caller
            assigns them itself, starting at 0 with no gaps).
        fn : callable
            Runs while holding the turn (other waiters keep waiting).
        what : optional
            Names the waiting task in errors; defaults to the ticket's label.
        timeout : float, optional
            Overrides the sequencer's timeout for this wait.

        Returns
        -------
        The result of ``fn()``.

        Raises
        ------
        SequencerAborted
            The sequencer was aborted (another task failed) before or while waiting.
        SequencerTimeout
            The turn did not come within the timeout; it names the waiting task,
            its sequence number and the task the sequencer waits for.
        Exception
            Whatever ``fn`` raises; the sequencer is then aborted so that no
            later ticket waits forever.
        """
        limit = self.timeout if timeout is None else timeout
        with self._cond:
            if not self._cond.wait_for(lambda: self._aborted is not None or self._next_seq == seq, limit):
                waiting_for = self._labels.get(self._next_seq, f"sequence {self._next_seq}")
                who = what if what is not None else self._labels.get(seq, "")
                raise SequencerTimeout(seq, str(who) if who else "", self._next_seq, str(waiting_for), limit)
            if self._aborted is not None:
                raise SequencerAborted(seq, self._aborted, self._failed)
        try:
            result = fn()
        except BaseException as exc:
            self.abort(f"the task holding sequence {seq} raised {type(exc).__name__}", failed=seq)
            raise
        with self._cond:
            self._labels.pop(seq, None)
            self._next_seq += 1
            self._cond.notify_all()
        return result

    def abort(self, reason: str = "aborted", failed: Optional[int] = None) -> None:
        """Wake every waiter with :class:`SequencerAborted`; later waits fail at once until :meth:`reset`.

        Examples
        --------
        >>> seq = SubmissionSequencer(); seq.abort("task X failed")
        >>> seq.execute_ordered(0, lambda: None)
        Traceback (most recent call last):
        ...
        swpipe_core.engine.sequencer.SequencerAborted: sequencer aborted before sequence 0 could run: task X failed
        """
        with self._cond:
            if self._aborted is None:
                self._aborted, self._failed = reason, failed
            self._cond.notify_all()

    def reset(self) -> None:
        """Back to sequence 0 with no tickets issued and no abort.

        Examples
        --------
        >>> seq = SubmissionSequencer(); seq.abort(); seq.reset()
        >>> seq.ticket(), seq.execute_ordered(0, lambda: 7)
        (0, 7)
        """
        with self._cond:
            self._next_seq = 0
            self._issued = 0
            self._labels.clear()
            self._aborted, self._failed = None, None
            self._cond.notify_all()
