"""Record what each task reads and writes during a few serial iterations.

The tasks run for real, one after another, on the given batches, while the
recorder watches

* every ``ctx`` attribute a task reads, writes or deletes (``ctx.batch``
  included), and in-place changes to Python objects held in ``ctx``;
* every tensor an op reads or writes, by storage, through the dispatcher
  (:mod:`._watch`), including what autograd does during ``backward()``,
  which counts for the task that called it;
* the user's ``state`` (modules and optimizers): parameters, gradient slots,
  buffers and optimizer state, by name, including a gradient set to ``None``;
* each task's :class:`~swpipe_core.plan.DeclaredIO`: what ``capture()``
  reads is declared external state the task writes.

The result, a :class:`DataflowRecord`, feeds :func:`~.infer.infer_deps` and
:func:`~.check.check_dataflow`. Recording trains the model on the batches
(the tasks run); record on a copy or count those steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import networkx as nx
import torch

from swpipe_core.plan import IterContext, PipelinePlan, PipelineTask
from swpipe_core.dataflow._names import State, check_state, fingerprint, named_state, storage_names, walk
from swpipe_core.dataflow._watch import StorageWatch, storage_key

__all__ = ["Access", "DataflowRecord", "DataflowRecordError", "record_dataflow"]

Tasks = Union[PipelinePlan, Sequence[PipelineTask], Mapping[str, Callable[[IterContext], None]]]
_HIDDEN = ("iter_idx",)


@dataclass(frozen=True)
class Access:
    """One observed access: task ``task`` of iteration ``iteration`` read or wrote ``name``.

    ``obj`` identifies the thing accessed across the record (a ctx attribute
    of one iteration, a named state tensor, or one storage); ``via`` says how
    it was seen: ``"ctx"``, ``"state"``, ``"batch"``, ``"tensor"`` or ``"io"``.
    """

    iteration: int
    task: str
    obj: Hashable
    name: str
    mode: str
    via: str


class DataflowRecordError(RuntimeError):
    """A task raised while being recorded; ``task`` and ``iteration`` say which (original error chained)."""

    def __init__(self, task: str, iteration: int, order: Sequence[str], exc: BaseException) -> None:
        self.task, self.iteration = task, iteration
        super().__init__(
            f"{task}({iteration}) raised {type(exc).__name__}: {exc} while recording its dataflow. The recorder "
            f"runs the tasks serially in the order {list(order)}; if {task} needs what a later task makes, pass "
            f"order=[...] in your serial loop's order, otherwise fix the task or the batch (traceback above)")


@dataclass
class DataflowRecord:
    """What each task read and wrote, in serial order, over ``iterations`` iterations.

    Attributes
    ----------
    tasks : list of str
        The serial order the tasks ran in.
    accesses : list of Access
        In serial order (iteration, then task); within a task reads first.
    notes : list of str
        Things the user should know (a task that touched nothing, an opaque
        ctx value, unnamed state written, ...).
    seconds : float
        Wall time of the recorded iterations.
    """

    tasks: List[str]
    iterations: int
    accesses: List[Access] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    seconds: float = 0.0

    def touched(self, task: str, mode: str, shared: bool = False) -> List[str]:
        """Sorted readable names ``task`` accessed with ``mode`` in any iteration.

        Parameters
        ----------
        task : str
        mode : {"read", "write"}
        shared : bool
            Only what another task accesses too (leave out a task's own temporaries).

        Returns
        -------
        list of str
        """
        users: Dict[Hashable, set] = {}
        for a in self.accesses:
            users.setdefault(a.obj, set()).add(a.task)
        return sorted({a.name for a in self.accesses if a.task == task and a.mode == mode
                       and (not shared or len(users[a.obj]) > 1)})

    def __str__(self) -> str:
        lines = [f"dataflow of {len(self.tasks)} task(s) over {self.iterations} iteration(s) "
                 "(what another task touches too):"]
        for t in self.tasks:
            for mode in ("read", "write"):
                names = self.touched(t, mode, shared=True)
                lines.append(f"  {t:<16} {mode + 's':<7} {_short(names)}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _short(names: Sequence[str], keep: int = 6) -> str:
    if not names:
        return "-"
    shown = ", ".join(names[:keep])
    return shown if len(names) <= keep else f"{shown} (+{len(names) - keep} more)"


class _RecordingContext(IterContext):
    """An :class:`IterContext` that reports attribute reads, writes and deletes to the recorder."""

    def __init__(self, batch: Any, iter_idx: int, rec: "_Recorder") -> None:
        object.__setattr__(self, "_swp_rec", rec)
        object.__setattr__(self, "batch", batch)
        object.__setattr__(self, "iter_idx", iter_idx)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_") or name in _HIDDEN:
            return object.__getattribute__(self, name)
        rec = object.__getattribute__(self, "_swp_rec")
        rec.attr(name, "read")
        return object.__getattribute__(self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__getattribute__(self, "_swp_rec").attr(name, "write")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        object.__getattribute__(self, "_swp_rec").attr(name, "write")
        object.__delattr__(self, name)


def _ctx_items(ctx: IterContext) -> Dict[str, Any]:
    return {k: v for k, v in object.__getattribute__(ctx, "__dict__").items()
            if not k.startswith("_") and k not in _HIDDEN}


class _Recorder:
    def __init__(self, state: State) -> None:
        self.state = state
        self.seen: set = set()
        self.alive: Dict[int, Any] = {}
        self.desc: Dict[int, str] = {}
        self.creator: Dict[int, str] = {}
        self.labels: Dict[int, str] = {}
        self.batch_keys: set = set()
        self.state_keys: Dict[int, str] = {}
        self.raw: List[Tuple[int, str, Any, str, str]] = []  # (iteration, task, obj, mode, via)
        self.notes: List[str] = []
        self.task: Optional[str] = None
        self.iteration = -1
        self.capturing = False
        self._ops: Dict[int, set] = {}
        self._attrs: List[Tuple[str, str]] = []
        self._io_keys: set = set()
        self._draws: set = set()
        self.shared_rng = True  # False: the tasks draw from generators of their own (SWPipeline(rng="per_task"))

    # -- sinks -------------------------------------------------------------
    def attr(self, name: str, mode: str) -> None:
        if self.task is not None:
            self._attrs.append((name, mode))

    def tensor(self, key: int, t: torch.Tensor, mode: str) -> None:
        if self.task is None:
            return
        if key not in self.alive:
            self.alive[key] = t.untyped_storage()
            self.desc[key] = f"[{', '.join(map(str, t.shape))}] {str(t.dtype).replace('torch.', '')}"
        if mode == "new":
            self.creator.setdefault(key, self.task)
        if self.capturing:  # DeclaredIO.capture reads the task's declared external state
            if mode != "read":
                return
            mode = "write"
            self._io_keys.add(key)
        self._ops.setdefault(key, set()).add("write" if mode == "new" else mode)

    def draw(self, device: str) -> None:
        """The current task drew from ``device``'s default generator: a write of that generator's state."""
        if self.task is not None:
            self._draws.add(device)

    def op_error(self, exc: BaseException, func: Any) -> None:
        note = f"the recorder could not analyse op {func} in {self.task} ({type(exc).__name__}: {exc}); its accesses are missing"
        if note not in self.notes:
            self.notes.append(note)

    # -- one task ------------------------------------------------------------
    def run_task(self, task: PipelineTask, ctx: _RecordingContext, order: Sequence[str]) -> None:
        i = ctx.iter_idx
        before = named_state(self.state)
        before_fp = {k: fingerprint(v) for k, v in _ctx_items(ctx).items()}
        before_ids = {k: id(v) for k, v in _ctx_items(ctx).items()}
        self.task, self._ops, self._attrs, self._io_keys, self._draws = task.name, {}, [], set(), set()
        try:
            with StorageWatch(self.tensor, self.seen, self.op_error, self.draw if self.shared_rng else None):
                task.fn(ctx)
                for io in task.io:
                    self.capturing = True
                    try:
                        io.capture()
                    finally:
                        self.capturing = False
        except Exception as exc:
            raise DataflowRecordError(task.name, i, order, exc) from exc
        finally:
            self.task = None
        self._finish_task(task, ctx, before, before_fp, before_ids)

    def _finish_task(self, task: PipelineTask, ctx: IterContext, before: dict, before_fp: dict, before_ids: dict) -> None:
        i, name = ctx.iter_idx, task.name
        after = named_state(self.state)
        names = {**storage_names(before), **storage_names(after)}
        for key, label in names.items():
            self.state_keys.setdefault(key, label)
        for label in sorted(set(before) | set(after)):
            kb = storage_key(before[label]) if before.get(label) is not None else None
            ka = storage_key(after[label]) if after.get(label) is not None else None
            if kb != ka:  # rebound: a new gradient, a gradient set to None, new optimizer state
                self.raw.append((i, name, ("state", label), "write", "state"))
        try:
            self._scan_ctx(ctx, before_fp, before_ids)
        except Exception as exc:  # noqa: BLE001 - an odd user object must not crash the recorder
            self.notes.append(f"after {name}({i}) the recorder could not look into ctx ({type(exc).__name__}: {exc}); "
                              "names and in-place changes of Python objects there may be missing")
        self._finish_accesses(i, name, names)

    def _scan_ctx(self, ctx: IterContext, before_fp: dict, before_ids: dict) -> None:
        items = _ctx_items(ctx)
        for attr, value in items.items():
            for path, t in walk(value, "batch" if attr == "batch" else f"ctx.{attr}"):
                key = storage_key(t)
                if key is not None:
                    self.labels.setdefault(key, path)
            fp = before_fp.get(attr)
            if attr in before_ids and before_ids[attr] == id(value) and fp is not None and fp != fingerprint(value):
                self._attrs.append((attr, "write"))
            if fingerprint(value) == "opaque":
                note = (f"ctx.{attr} holds a {type(value).__name__} the recorder cannot look into: changes made "
                        "to it in place are not seen (hold tensors, containers or plain objects in ctx)")
                if note not in self.notes:
                    self.notes.append(note)

    def _finish_accesses(self, i: int, name: str, names: Dict[int, str]) -> None:
        for attr, mode in sorted(set(self._attrs), key=lambda am: (am[1] != "read", am[0])):
            self.raw.append((i, name, ("ctx", i, attr), mode, "ctx"))
        for device in sorted(self._draws):  # a draw reads and advances the generator: a write of shared state
            self.raw.append((i, name, ("rng", device), "write", "rng"))
        for key, modes in self._ops.items():
            obj = ("state", names[key]) if key in names else ("tensor", key)
            via = "state" if key in names else ("batch" if key in self.batch_keys else "tensor")
            via = "io" if key in self._io_keys else via
            for mode in ("read", "write"):
                if mode in modes:
                    self.raw.append((i, name, obj, mode, via))

    # -- result ----------------------------------------------------------------
    def label(self, obj: Hashable) -> str:
        kind = obj[0]
        if kind == "ctx":
            return f"ctx.{obj[2]}"
        if kind == "rng":
            return f"torch's default generator ({obj[1]})"
        if kind == "state":
            return obj[1]
        key = obj[1]
        if key in self.labels:
            return self.labels[key]
        made = self.creator.get(key)
        where = f"made by {made}" if made else "from outside any task"
        return f"tensor{self.desc.get(key, '')} {where}"

    def accesses(self) -> List[Access]:
        out, seen = [], set()
        for i, task, obj, mode, via in self.raw:
            if (i, task, obj, mode) in seen:
                continue
            seen.add((i, task, obj, mode))
            out.append(Access(i, task, obj, self.label(obj), mode, via))
        return out


def serial_order(tasks: Tasks) -> List[PipelineTask]:
    """The tasks in the order they run serially.

    A plan's order is a topological order of its intra-iteration deps with
    ties in schedule order (the order the tasks were written in), so a plan
    that lost a dependency still runs in its author's order; a list or mapping
    is taken as given.

    Parameters
    ----------
    tasks : PipelinePlan, list of PipelineTask, or mapping ``{name: fn}``

    Returns
    -------
    list of PipelineTask

    Raises
    ------
    TypeError
        For a list item that is not a ``PipelineTask``.

    Examples
    --------
    >>> from swpipe import PipelinePlan, TaskSchedule
    >>> plan = PipelinePlan({"B": TaskSchedule(), "A": TaskSchedule()}, intra_iter_deps=[("B", "A")])
    >>> [t.name for t in serial_order(plan)]
    ['A', 'B']
    """
    if isinstance(tasks, PipelinePlan):
        pos = {n: k for k, n in enumerate(tasks.task_names)}
        graph = nx.DiGraph()
        graph.add_nodes_from(tasks.task_names)
        graph.add_edges_from((d, t) for t, d in tasks.intra_edges())
        by_name = {t.name: t for t in tasks.tasks}
        return [by_name[n] for n in nx.lexicographical_topological_sort(graph, key=lambda n: pos[n])]
    if isinstance(tasks, Mapping):
        return [PipelineTask(str(k), fn) for k, fn in tasks.items()]
    out = list(tasks)
    for t in out:
        if not isinstance(t, PipelineTask):
            raise TypeError(f"tasks: {t!r} is a {type(t).__name__}, not a PipelineTask; give a plan, a list of "
                            "PipelineTask or a mapping {name: fn}")
    return out


def record_dataflow(tasks: Tasks, batches: Iterable[Any], *, state: State = None,
                    order: Optional[Sequence[str]] = None, rng: Optional[str] = None) -> DataflowRecord:
    """Run a few serial iterations under the recorder and return what every task read and wrote.

    Parameters
    ----------
    tasks : PipelinePlan, list of PipelineTask, or mapping ``{name: fn}``
        The bound tasks (a plan's dependencies only decide the serial order).
    batches : iterable
        One batch per recorded iteration; two or more are needed to see
        inter-iteration dataflow (weights written by one step, read by the next).
    state : Module, Optimizer, list of them, or mapping ``{prefix: Module | Optimizer | Tensor}``
        Names parameters, gradients, buffers and optimizer state in the report.
    order : list of str, optional
        The serial order of the task names (default: see :func:`serial_order`).
    rng : {None, "per_task"}
        As ``SWPipeline(rng=...)``. ``None``: a task that draws from torch's
        default generator of a device (a random op without a generator of its
        own) writes that generator's state, which every other drawing task
        shares. ``"per_task"``: each task has its own, and draws are not
        recorded.

    Returns
    -------
    DataflowRecord

    Raises
    ------
    DataflowRecordError
        A task raised (task, iteration and the order are named; original chained).
    TypeError, ValueError
        Unbound tasks, unknown names in ``order``, no batch, or bad ``state``.

    Examples
    --------
    >>> from swpipe import PipelineTask
    >>> w = torch.zeros(2)
    >>> def load(ctx): ctx.x = ctx.batch * 2
    >>> def step(ctx): w.add_(ctx.x)
    >>> rec = record_dataflow([PipelineTask("Load", load), PipelineTask("Step", step)],
    ...                       [torch.ones(2)] * 2, state={"w": w})
    >>> rec.touched("Step", "read"), rec.touched("Step", "write")
    (['ctx.x'], ['w'])
    """
    check_state(state)
    seq = serial_order(tasks)
    unbound = [t.name for t in seq if t.fn is None]
    if unbound:
        raise TypeError(f"cannot record unbound task(s) {unbound}: bind functions first, e.g. plan.bind(fns)")
    if order is not None:
        by_name = {t.name: t for t in seq}
        unknown = [n for n in order if n not in by_name]
        if unknown or sorted(order) != sorted(by_name):
            raise ValueError(f"order must list every task once; unknown {unknown}, tasks {sorted(by_name)}")
        seq = [by_name[n] for n in order]
    names = [t.name for t in seq]
    if rng not in (None, "per_task"):
        raise ValueError(f"rng={rng!r}: use None (tasks share torch's default generators) or 'per_task'")
    rec = _Recorder(state)
    rec.shared_rng = rng is None
    rec.state_keys.update(storage_names(named_state(state)))
    n = 0
    t0 = time.perf_counter()
    for i, batch in enumerate(batches):
        for path, t in walk(batch, "batch"):
            key = storage_key(t)
            if key is not None:
                rec.batch_keys.add(key)
                rec.labels.setdefault(key, path)
        ctx = _RecordingContext(batch, i, rec)
        for task in seq:
            rec.run_task(task, ctx, names)
        n += 1
    seconds = time.perf_counter() - t0
    if n == 0:
        raise ValueError("record_dataflow needs at least one batch (two to see inter-iteration dataflow)")
    result = DataflowRecord(names, n, rec.accesses(), rec.notes, seconds)
    _add_notes(result, rec, n)
    return result


def _add_notes(result: DataflowRecord, rec: _Recorder, n: int) -> None:
    if n == 1:
        result.notes.append("one iteration recorded: dataflow across iterations (weights a step writes and the "
                            "next reads) cannot be seen; give two or more batches")
    active = {a.task for a in result.accesses}
    for t in result.tasks:
        if t not in active:
            result.notes.append(
                f"{t} read and wrote nothing the recorder sees (no ctx attribute, no tensor): no inferred "
                "dependency orders it; if it has effects outside tensors (files, Python objects, device syncs), "
                "declare them with DeclaredIO or add its dependencies by hand")
    for a in result.accesses:
        if a.mode == "write" and a.via == "tensor" and a.obj[1] not in rec.creator and a.obj[1] not in rec.labels:
            note = (f"{a.task} writes {a.name}: a tensor created outside any task that state= does not name; it is "
                    "tracked by storage (pass state={'name': tensor} or its module to name it)")
            if note not in result.notes:
                result.notes.append(note)
