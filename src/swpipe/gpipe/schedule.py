"""GPipe's schedules as plans: which task runs each partition's work, on which thread, stream and stage.

The tasks of one micro-batch (an iteration of the plan):

* ``F<j>``: partition ``j``'s forward, on its device's compute stream;
* ``C<j>``: the copy of what partition ``j`` reads from other devices (the
  previous partition's output, skips stashed elsewhere) onto its device, on
  a copy stream (only where a device boundary is crossed);
* in a training step, ``B<j>``: partition ``j``'s backward, and ``G<j>`` the
  copy of the gradients partition ``j`` receives from other devices.

Each partition's tasks share a thread group: on the CPU one per partition
(torch releases the interpreter lock in its kernels, so partitions overlap),
on CUDA one per device. Three schedules:

* :func:`forward_plan`: ``F<j>`` at stage ``j``; period ``k`` runs
  micro-batch ``k - j`` on partition ``j``: GPipe's clock cycles.
* :func:`step_plan` ``"GPipe"``: every forward, then every backward (fill,
  drain): ``B<j>`` at stage ``m + 2n - 3 - j`` for ``m`` micro-batches and
  ``n`` partitions, so on each thread the first backward follows the last
  forward.
* :func:`step_plan` ``"1F1B"``: ``F<j>`` at stage 0, ``B<j>`` at stage
  ``n - 1 - j``: after a warm-up each partition alternates one forward and
  one backward and holds the activations of at most ``n - j`` micro-batches.

The engine (:class:`~swpipe_core.engine.pipeline.SWPipeline`) runs these
plans, the simulator predicts them, and :func:`str` of a plan prints its
table of clock cycles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan, TaskSchedule

from swpipe.gpipe.skip.layout import SkipRoutes

__all__ = ["SCHEDULES", "check_schedule", "TASK_KINDS", "Placement", "placements", "GPipePlan", "forward_plan",
           "step_plan", "task_partition", "bind"]

#: The training-step schedules, spelt as PyTorch's (``torch.distributed.pipelining``); any case is taken.
SCHEDULES = ("GPipe", "1F1B")

#: What each kind of task does to its partition, in words (errors name it).
TASK_KINDS = {"F": "forward", "B": "backward", "C": "copy", "G": "gradient copy"}


@dataclass(frozen=True)
class Placement:
    """Where partition ``j`` runs.

    Attributes
    ----------
    device : str
        The device, as ``str(torch.device)`` (partitions on one device need no copy).
    group : str
        Its thread group.
    compute : stream spec
        Its compute stream (``None`` on the CPU: a stream is a name there).
    copy : stream spec
        The stream copies *onto* this device run on.
    """

    device: str
    group: str
    compute: Any = None
    copy: Any = None


@dataclass
class GPipePlan(PipelinePlan):
    """A :class:`~swpipe_core.plan.PipelinePlan` of GPipe; ``str(plan)`` is its table of clock cycles.

    Attributes
    ----------
    microbatches : int
        Micro-batches a run of it has (the table's columns).
    kind : str
        ``"forward"``, ``"GPipe"`` or ``"1F1B"``.
    """

    microbatches: int = 1
    kind: str = "forward"

    def __str__(self) -> str:
        return format_clock(self)


def format_clock(plan: "GPipePlan") -> str:
    """The table of a run of ``plan.microbatches`` micro-batches: a row per task, a column per period (clock cycle).

    A cell ``i<k>`` says the task works on micro-batch ``k`` in that period;
    periods where nothing runs are left out.

    Examples
    --------
    >>> print(forward_plan([Placement("cpu", "p0"), Placement("cpu", "p1")], microbatches=3))
    GPipe forward: 3 micro-batches, 2 partitions, 4 clock cycles
    task  thread  stream   | P0  P1  P2  P3
    ----  ------  -------  + --- --- --- ---
    F0    p0      default  | i0  i1  i2
    F1    p1      default  |     i0  i1  i2
    """
    from swpipe_core.walk import PeriodWalk

    title = {"forward": "GPipe forward", "GPipe": "GPipe training step (fill, drain)",
             "1F1B": "1F1B training step"}[plan.kind]
    cells: Dict[str, Dict[int, str]] = {name: {} for name in plan.task_names}
    periods = []
    for period, steps in PeriodWalk(plan).periods(plan.microbatches):
        if steps:
            periods.append(period)
        for step in steps:
            cells[step.task][period] = f"i{step.iteration}"
    names = plan.enqueue_order or plan.task_names
    rows = [(name, plan.sched(name).thread_group, plan.stream_of(name)) for name in names]
    w = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(("task", "thread", "stream"))]
    w_cell = max(3, *(len(f"P{p}") for p in periods), *(len(c) for row in cells.values() for c in row.values()))

    def line(parts: Sequence[str], sep: str, row: Sequence[str]) -> str:
        head = "  ".join(f"{x:<{w[k]}}" for k, x in enumerate(parts))
        return f"{head}  {sep} " + " ".join(f"{c:<{w_cell}}" for c in row)

    partitions = len({task_partition(n)[1] for n in plan.task_names})
    out = [f"{title}: {plan.microbatches} micro-batch{'es' if plan.microbatches != 1 else ''}, {partitions} "
           f"partition{'s' if partitions != 1 else ''}, {len(periods)} clock cycles",
           line(("task", "thread", "stream"), "|", [f"P{p}" for p in periods]),
           line(tuple("-" * x for x in w), "+", ["-" * w_cell] * len(periods))]
    out += [line(r, "|", [cells[r[0]].get(p, "") for p in periods]) for r in rows]
    return "\n".join(x.rstrip() for x in out)


def placements(devices: Sequence[Any]) -> List[Placement]:
    """Each partition's placement on its device (swpipe's device seam).

    A CPU partition gets a thread of its own (``p<j>``); a device with
    streams (CUDA, or a ``swpipe.testing.FakeCuda`` device) gets one thread
    for its partitions (``cuda<index>``), its default stream for compute and
    a stream ``gpipe-copy`` for the copies onto it.

    Examples
    --------
    >>> from swpipe_core.engine.device import CpuDevice
    >>> [(p.device, p.group, p.compute) for p in placements([CpuDevice(), CpuDevice()])]
    [('cpu', 'p0', None), ('cpu', 'p1', None)]
    """
    places = []
    for j, dev in enumerate(devices):
        if dev.is_async:
            places.append(Placement(str(dev.torch_device), f"{dev.type}{dev.index}", dev.default_stream(),
                                    dev.new_stream("gpipe-copy")))
        else:
            places.append(Placement(str(dev.torch_device), f"p{j}"))
    return places


def task_partition(name: str) -> Tuple[str, int]:
    """``("F", 3)`` for ``"F3"``: a task's kind and partition.

    Examples
    --------
    >>> task_partition("G12")
    ('G', 12)
    """
    return name[0], int(name[1:])


def _inputs_cross(j: int, places: Sequence[Placement], routes: SkipRoutes) -> bool:
    """Whether partition ``j`` reads anything made on another device (so it has a copy task)."""
    sources = ([j - 1] if j > 0 else []) + [src for _, src in routes.incoming(j)]
    return any(places[s].device != places[j].device for s in sources)


def _outputs_cross(j: int, places: Sequence[Placement], routes: SkipRoutes) -> bool:
    """Whether partition ``j``'s outputs are read on another device (so its gradients come by a copy)."""
    readers = ([j + 1] if j + 1 < len(places) else []) + [dst for _, dst in routes.outgoing(j)]
    return any(places[r].device != places[j].device for r in readers)


class _Builder:
    def __init__(self, places: Sequence[Placement], routes: SkipRoutes) -> None:
        self.places, self.routes = list(places), routes
        self.n = len(places)
        self.schedule: Dict[str, TaskSchedule] = {}
        self.deps: List[Tuple[str, str]] = []
        self.order: List[str] = []

    def add(self, name: str, stage: int, j: int, copy: bool = False) -> None:
        p = self.places[j]
        stream = p.compute
        if copy:  # onto a device: its copy stream (the CPU has no stream: the source's copy stream then)
            stream = p.copy if p.copy is not None else self._source_copy_stream(j, name[0] == "G")
        self.schedule[name] = TaskSchedule(stage=stage, stream=stream, thread_group=p.group)
        self.order.append(name)

    def _source_copy_stream(self, j: int, backward: bool) -> Any:
        sources = ([j + 1] + [d for _, d in self.routes.outgoing(j)] if backward
                   else [j - 1] + [s for _, s in self.routes.incoming(j)])
        streams = [self.places[s].copy for s in sources if 0 <= s < self.n and self.places[s].copy is not None]
        return streams[0] if streams else None

    def forward(self, stages: Callable[[int], int]) -> None:
        for j in range(self.n):
            reads = ([j - 1] if j > 0 else []) + [s for _, s in self.routes.incoming(j)]
            if _inputs_cross(j, self.places, self.routes):
                self.add(f"C{j}", stages(j), j, copy=True)
                self.deps += [(f"C{j}", f"F{s}") for s in dict.fromkeys(reads)]
                self.deps.append((f"F{j}", f"C{j}"))
            else:
                self.deps += [(f"F{j}", f"F{s}") for s in dict.fromkeys(reads)]
            self.add(f"F{j}", stages(j), j)

    def backward(self, stages: Callable[[int], int]) -> None:
        last = self.n - 1
        for j in range(last, -1, -1):
            readers = ([j + 1] if j < last else []) + [d for _, d in self.routes.outgoing(j)]
            if _outputs_cross(j, self.places, self.routes):
                self.add(f"G{j}", stages(j), j, copy=True)
                self.deps += [(f"G{j}", f"B{r}") for r in dict.fromkeys(readers)]
                self.deps.append((f"B{j}", f"G{j}"))
            else:
                self.deps += [(f"B{j}", f"B{r}") for r in dict.fromkeys(readers)]
            self.add(f"B{j}", stages(j), j)
        self.deps.append((f"B{last}", f"F{last}"))

    def plan(self, microbatches: int, kind: str) -> GPipePlan:
        return GPipePlan(schedule=dict(self.schedule), intra_iter_deps=list(dict.fromkeys(self.deps)),
                         enqueue_order=list(self.order), caller_group=None, microbatches=microbatches, kind=kind)


def forward_plan(places: Sequence[Placement], routes: Optional[SkipRoutes] = None,
                 microbatches: int = 1) -> GPipePlan:
    """The forward of ``len(places)`` partitions on GPipe's clock cycles.

    Examples
    --------
    >>> plan = forward_plan([Placement("cpu", "p0"), Placement("cpu", "p1")], microbatches=3)
    >>> plan.task_names, plan.pipeline_depth
    (['F0', 'F1'], 2)
    """
    b = _Builder(places, routes or SkipRoutes())
    b.forward(lambda j: j)
    return b.plan(microbatches, "forward")


def step_plan(places: Sequence[Placement], schedule: str, microbatches: int,
              routes: Optional[SkipRoutes] = None) -> GPipePlan:
    """A training step (forward, loss, backward) of ``microbatches`` micro-batches, by ``schedule``.

    Parameters
    ----------
    places : sequence of Placement
    schedule : {"GPipe", "1F1B"}
        Any case (:func:`check_schedule`).
    microbatches : int
        ``m``; the ``"GPipe"`` plan's backward stages depend on it.
    routes : SkipRoutes, optional

    Examples
    --------
    >>> two = [Placement("cpu", "p0"), Placement("cpu", "p1")]
    >>> {t: step_plan(two, "1F1B", 4).stage(t) for t in ("F0", "F1", "B1", "B0")}
    {'F0': 0, 'F1': 0, 'B1': 0, 'B0': 1}
    >>> {t: step_plan(two, "GPipe", 4).stage(t) for t in ("F0", "F1", "B1", "B0")}
    {'F0': 0, 'F1': 1, 'B1': 4, 'B0': 5}
    """
    n, m = len(places), microbatches
    b = _Builder(places, routes or SkipRoutes())
    schedule = check_schedule(schedule)
    if schedule == "GPipe":
        b.forward(lambda j: j)
        b.backward(lambda j: m + 2 * n - 3 - j)
    else:
        b.forward(lambda j: 0)
        b.backward(lambda j: n - 1 - j)
    return b.plan(m, schedule)


def check_schedule(schedule: str) -> str:
    """``schedule`` spelt as PyTorch spells it (``"GPipe"``, ``"1F1B"``), whatever its case.

    Raises
    ------
    GPipeArgumentError
        ``argument="schedule"`` for another name.

    Examples
    --------
    >>> check_schedule("1f1b"), check_schedule("gpipe")
    ('1F1B', 'GPipe')
    """
    from autosched._fields import schedule_name
    from swpipe.gpipe.errors import GPipeArgumentError

    canonical = schedule_name(schedule, SCHEDULES)
    if canonical is None:
        raise GPipeArgumentError("schedule", schedule, f"not one of {SCHEDULES}", "give 'GPipe' or '1F1B' (any case)")
    return canonical


def bind(plan: PipelinePlan, ops: Mapping[str, Callable[[int, Any], None]]) -> PipelinePlan:
    """``plan`` with each task calling ``ops[kind](partition, ctx)`` (kinds ``"F"``, ``"C"``, ``"B"``, ``"G"``)."""
    fns = {}
    for name in plan.task_names:
        kind, j = task_partition(name)
        op = ops[kind]
        fns[name] = _TaskFn(op, j, name)
    bound = plan.bind(fns)
    if isinstance(plan, GPipePlan):
        return GPipePlan(schedule=bound.schedule, intra_iter_deps=bound.intra_iter_deps,
                         enqueue_order=bound.enqueue_order, caller_group=None, microbatches=plan.microbatches,
                         kind=plan.kind)
    return bound


class _TaskFn:
    """``op(partition, ctx)`` as a task function named after the task."""

    __slots__ = ("op", "j", "__name__")

    def __init__(self, op: Callable[[int, Any], None], j: int, name: str) -> None:
        self.op, self.j, self.__name__ = op, j, name

    def __call__(self, ctx: Any) -> None:
        self.op(self.j, ctx)
