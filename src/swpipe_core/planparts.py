"""The parts a plan is made of: the tasks (PipelineTask, its context and declared I/O), each task's schedule
(TaskSchedule), task and stream references (ref_name, stream_name) and the enqueue policies.

They sit below :mod:`swpipe_core.plan` (which re-exports every name here) so that what checks, orders and writes
a plan (:mod:`~swpipe_core.validate`, :mod:`~swpipe_core.order`, :mod:`~swpipe_core.planform`) can build on them
while :class:`~swpipe_core.plan.PipelinePlan` builds on those: ``str(plan)`` and ``PipelinePlan.from_text``
use the text form and the rules without an import cycle.

A task is referred to either by its :class:`PipelineTask` object or by its
name (``TaskRef``); the two are interchangeable everywhere, because a
``PipelineTask`` hashes and compares equal to its name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Union

__all__ = [
    "IterContext",
    "DeclaredIO",
    "PipelineTask",
    "TaskSchedule",
    "TaskRef",
    "StreamSpec",
    "ENQUEUE_POLICIES",
    "ref_name",
    "stream_name",
]


class IterContext:
    """Per-iteration context passed to every task function.

    ``batch`` is the raw item produced by the data iterator and ``iter_idx``
    the 0-based iteration index. Tasks pass intermediate results by setting
    attributes (``ctx.x = ...``) and free memory early with ``del ctx.x``.
    Each in-flight iteration owns its own context, so iterations never share
    intermediate state.

    Examples
    --------
    >>> from swpipe import IterContext
    >>> ctx = IterContext(batch={"x": 1}, iter_idx=3)
    >>> ctx.y = ctx.batch["x"] + 1
    >>> ctx
    IterContext(iter_idx=3, attrs=['y'])
    """

    def __init__(self, batch: Any, iter_idx: int) -> None:
        self.batch = batch
        self.iter_idx = iter_idx

    def __repr__(self) -> str:
        attrs = sorted(k for k in vars(self) if k not in ("batch", "iter_idx"))
        return f"IterContext(iter_idx={self.iter_idx}, attrs={attrs})"

    def __getattr__(self, name: str) -> Any:
        # only reached when the attribute is missing: say what that means in a pipeline
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"ctx.{name} is not set in iteration {self.__dict__.get('iter_idx', '?')}: no task that ran before this "
            f"one wrote it. Tasks pass values through ctx in the plan's order, so the task that sets ctx.{name} "
            "must be a dependency of this one (swpipe_core.dataflow.check_dataflow names a missing one)",
            name=name, obj=self)

    def keep_alive(self, *values: Any) -> None:
        """Keep ``values`` alive until this iteration's device work has completed (nothing to do on CPU).

        On CUDA, a tensor one task hands to another *outside* ``ctx`` (module
        state, a closure, a queue) and that the receiving task drops while a
        kernel on another stream may still read it, returns to the caching
        allocator too early. Call ``ctx.keep_alive(t)`` in either task: the
        engine holds ``t`` until every task of this iteration has completed on
        the device. Values reached through ``ctx`` need nothing
        (docs/semantics.md, "Lifetimes on CUDA").

        Examples
        --------
        >>> from swpipe import IterContext
        >>> IterContext(batch=None, iter_idx=0).keep_alive("anything")
        """


@dataclass
class DeclaredIO:
    """A task's read/write contract with state outside :class:`IterContext`.

    ``capture`` is called after the task runs while shortcut caching and
    returns a snapshot of the external state; ``restore`` receives a fresh
    copy of that snapshot when the task is shortcut and writes it back.
    Tensors in the snapshot are detached and cloned on capture.

    Examples
    --------
    >>> from swpipe import DeclaredIO
    >>> shared = {"step": 0}
    >>> io = DeclaredIO(capture=lambda: dict(shared), restore=shared.update)
    >>> snap = io.capture(); shared["step"] = 5; io.restore(snap); shared
    {'step': 0}
    """

    capture: Callable[[], Any]
    restore: Callable[[Any], None]


@dataclass(eq=False)
class PipelineTask:
    """One schedulable unit of computation: a name, a function and its side effects.

    The task only says *what* runs; *how* (stage, stream, thread group) is in
    :class:`PipelinePlan`. The name is the task's identity (the API
    reference: a globally unique identifier): equality and hashing use the
    name alone, and a task compares equal to its name string, so
    ``plan.schedule["Forward"]`` and ``plan.schedule[PipelineTask("Forward",
    other_fn)]`` both find the entry keyed by ``PipelineTask("Forward", ...)``.

    ``fn`` may be ``None`` for an analysis-only (unbound) task: such a plan
    can be printed, validated and simulated, but running it raises an error
    naming the unbound tasks.

    Examples
    --------
    >>> from swpipe import PipelineTask
    >>> fwd = PipelineTask("Forward", lambda ctx: None)
    >>> fwd == PipelineTask("Forward"), fwd == "Forward", hash(fwd) == hash("Forward")
    (True, True, True)
    >>> PipelineTask("Backward")
    PipelineTask('Backward', unbound)

    Two tasks with one name are one task, whatever their functions: as keys
    of one ``schedule`` dict they merge (Python keeps the first key and the
    last value), so give every task its own name. ``fn`` must be callable:

    >>> PipelineTask("Forward", print) == PipelineTask("Forward", len)
    True
    >>> len({PipelineTask("Forward", print): 0, PipelineTask("Forward", len): 1})
    1
    >>> PipelineTask("Z", 3)
    Traceback (most recent call last):
    ...
    TypeError: PipelineTask 'Z': fn is 3 (int), not callable; pass a function of the iteration context, e.g. PipelineTask('Z', lambda ctx: ...), or None for an analysis-only task
    """

    name: str
    fn: Optional[Callable[[IterContext], None]] = None
    io: List[DeclaredIO] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Checked here, not at run time: a wrong argument should fail where it was written.
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"PipelineTask name is {self.name!r}; give a non-empty string, "
                            f"e.g. PipelineTask('Forward', forward)")
        if self.fn is not None and not callable(self.fn):
            raise TypeError(f"PipelineTask {self.name!r}: fn is {self.fn!r} ({type(self.fn).__name__}), not callable; "
                            f"pass a function of the iteration context, e.g. PipelineTask({self.name!r}, lambda ctx: ...), "
                            f"or None for an analysis-only task")

    def __eq__(self, other: object) -> bool:
        # by name alone, as the API reference defines it: equal objects hash alike (the name), so a lookup by any
        # task of that name, or by the name, finds the entry; a dependency written with a same-named object whose
        # function is not the scheduled one is validate's foreign-task rule, not an inequality here
        if isinstance(other, PipelineTask):
            return self.name == other.name
        if isinstance(other, str):
            return self.name == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        bound = "unbound" if self.fn is None else getattr(self.fn, "__name__", "fn")
        return f"PipelineTask({self.name!r}, {bound})"


TaskRef = Union[str, PipelineTask]
# None is the device's default stream, a str names a stream (one per name per
# device, created on first use), or a torch stream object is used as given.
StreamSpec = Any

ENQUEUE_POLICIES = ("ready_first", "stage_descending")


@dataclass
class TaskSchedule:
    """How one task is scheduled in a plan.

    Parameters
    ----------
    stage : int
        Pipeline stage; in period ``p`` the task works on iteration ``p - stage``.
    stream : None, str or torch stream
        ``None`` is the default stream; a string names a stream.
    thread_group : str
        CPU worker thread; tasks of one group run one after another.
    globally_ordered : bool
        Run in a fixed global sequence (identical on every rank), for collectives.

    Examples
    --------
    >>> from swpipe import TaskSchedule
    >>> TaskSchedule(stage=1, stream="data_dist", globally_ordered=True)
    TaskSchedule(stage=1, stream='data_dist', thread_group='default', globally_ordered=True)
    """

    stage: int = 0
    stream: StreamSpec = None
    thread_group: str = "default"
    globally_ordered: bool = False


def ref_name(ref: TaskRef) -> str:
    """Return the task name a ``TaskRef`` refers to.

    Parameters
    ----------
    ref : str or PipelineTask

    Returns
    -------
    str

    Raises
    ------
    TypeError
        If ``ref`` is neither a string nor a ``PipelineTask``.

    Examples
    --------
    >>> from swpipe import PipelineTask
    >>> ref_name("H2D"), ref_name(PipelineTask("H2D"))
    ('H2D', 'H2D')
    """
    if isinstance(ref, PipelineTask):
        return ref.name
    if isinstance(ref, str):
        return ref
    raise TypeError(
        f"a task reference must be a task name (str) or a PipelineTask, got {type(ref).__name__}: {ref!r}"
    )


def stream_name(stream: StreamSpec) -> str:
    """Return a readable name for a stream spec.

    Parameters
    ----------
    stream : None, str or torch stream

    Returns
    -------
    str
        ``"default"`` for ``None``, the string itself for a name, and for a
        stream object its ``swpipe_name`` attribute if set, else
        ``"<device>/stream<id>"`` (e.g. ``"cuda:1/stream3"``).

    Examples
    --------
    >>> stream_name(None), stream_name("memcpy")
    ('default', 'memcpy')
    >>> import torch
    >>> stream_name(torch.Stream(stream_id=0, device_index=1, device_type=1))
    'cuda:1/stream0'
    """
    if stream is None:
        return "default"
    if isinstance(stream, str):
        return stream
    named = getattr(stream, "swpipe_name", None)
    if named:
        return str(named)
    sid = getattr(stream, "stream_id", None)
    if sid is None:
        return repr(stream)
    # device + id: unique across devices (stream ids repeat per device) and stable for the stream's life
    device = getattr(stream, "device", None)
    return f"{device}/stream{sid}" if device is not None else f"stream{sid}"
