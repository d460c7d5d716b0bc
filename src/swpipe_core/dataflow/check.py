"""Check a plan against the dataflow its tasks really have.

``check_dataflow(plan, batches)`` records a few serial iterations of the
plan's tasks (:mod:`.record`), derives every hazard (:mod:`.infer`) and asks
the plan's happens-before order (:mod:`._happens`) whether it keeps each one:

* **missing** (error): a hazard the plan leaves unordered or reverses — the
  two tasks, the kind, what they share, and the exact tuple to add;
* **stale** (warning): a read-after-write the plan deliberately reverses in a
  fixed way (semi-sync training), reported as "reads X k iteration(s) stale";
* **redundant** (info): a declared dependency with no observed dataflow
  between its two tasks, and whether other hazards still need it;
* **mutates the batch** (error): a task writes the batch in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from swpipe_core.plan import PipelinePlan
from swpipe_core.validate import validate
from swpipe_core.dataflow._happens import PlanOrder
from swpipe_core.dataflow._names import State
from swpipe_core.dataflow.infer import Hazard, find_hazards
from swpipe_core.dataflow.record import DataflowRecord, record_dataflow

__all__ = ["Finding", "DataflowReport", "DataflowError", "check_dataflow"]

_VERB = {"RAW": ("reads", "written by"), "WAR": ("overwrites", "read by"), "WAW": ("overwrites", "also written by")}


@dataclass
class Finding:
    """One result of the check: ``level`` is ``"error"``, ``"stale"`` or ``"info"``.

    ``fix`` is the dependency tuple to add (missing), ``stale_by`` the number
    of iterations a stale read lags.
    """

    level: str
    kind: str
    message: str
    tasks: Tuple[str, ...] = ()
    fix: Optional[tuple] = None
    stale_by: int = 0

    def __str__(self) -> str:
        return f"[{self.level}] {self.message}"


class DataflowError(RuntimeError):
    """A plan misses dependencies its tasks' dataflow needs; ``findings`` lists them."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings = list(findings)
        super().__init__("\n".join(str(f) for f in self.findings))


@dataclass
class DataflowReport:
    """The result of :func:`check_dataflow`; ``str()`` is the readable report."""

    missing: List[Finding] = field(default_factory=list)
    stale: List[Finding] = field(default_factory=list)
    redundant: List[Finding] = field(default_factory=list)
    notes: List[Finding] = field(default_factory=list)
    hazards: List[Hazard] = field(default_factory=list)
    record: Optional[DataflowRecord] = None

    @property
    def ok(self) -> bool:
        """No error: every observed hazard is ordered (staleness aside) and no task mutates the batch."""
        return not self.missing

    def raise_if_missing(self) -> None:
        """Raise :class:`DataflowError` listing the errors, if any."""
        if self.missing:
            raise DataflowError(self.missing)

    def __str__(self) -> str:
        head = (f"dataflow check: {len(self.hazards)} hazard(s) observed; {len(self.missing)} error(s), "
                f"{len(self.stale)} stale read(s), {len(self.redundant)} declared dependency(ies) without dataflow")
        return "\n".join([head] + [f"  {f}" for f in self.missing + self.stale + self.redundant + self.notes])


def _fix_text(plan: PipelinePlan, h: Hazard) -> str:
    where = "intra_iter_deps" if h.distance == 0 else "inter_iter_deps"
    text = f"add {h.edge!r} to {where}"
    gap = plan.stage(h.first) - plan.stage(h.second) - h.distance
    if gap > 0:  # corollary 1 / 3: a dependency may not wait on a later period
        text += f" and move {h.second} to stage >= {plan.stage(h.second) + gap} (or {h.first} earlier)"
    return text


def _verdict(order: PlanOrder, h: Hazard) -> Tuple[str, int]:
    """``("ok", 0)``, ``("stale", k)`` or ``("race"|"reversed", 0)`` over the unrolled window."""
    worst, stale = "ok", 0
    for i in range(h.distance, order.window):
        first, second = (h.first, i - h.distance), (h.second, i)
        if order.before(first, second):
            continue
        if not order.before(second, first):
            return "race", 0
        if h.kind != "RAW" or h.distance == 0:
            worst = "reversed"
            continue
        m = h.distance + 1
        while i - m >= 0 and order.before(second, (h.first, i - m)):
            m += 1
        if i - m >= 0 and not order.before((h.first, i - m), second):
            return "race", 0
        stale = max(stale, m - h.distance)
        worst = "stale" if worst == "ok" else worst
    return worst, stale


def _missing(plan: PipelinePlan, h: Hazard, how: str) -> Finding:
    verb, other = _VERB[h.kind]
    when = "in the same iteration" if h.distance == 0 else f"of iteration i-{h.distance}"
    state = "they may run concurrently" if how == "race" else f"the plan runs {h.second} first"
    return Finding("error", "missing",
                   f"missing dependency ({h.kind}): {h.second}(i) {verb} {h.what()} {other} {h.first} {when}, "
                   f"but the plan does not order them ({state}). Fix: {_fix_text(plan, h)}",
                   (h.second, h.first), h.edge)


def _stale(h: Hazard, k: int) -> Finding:
    return Finding("stale", "stale",
                   f"{h.second} reads {h.what()} {k} iteration(s) stale: {h.second}(i) sees what {h.first}"
                   f"(i-{h.distance + k}) wrote, not {h.first}(i-{h.distance}) (the plan runs it first on purpose "
                   f"or by its enqueue order; add {h.edge!r} for fresh values)", (h.second, h.first), stale_by=k)


def _with_edges(plan: PipelinePlan, edges: List[tuple]) -> PipelinePlan:
    intra = [e for e in edges if len(e) == 2]
    inter = [e for e in edges if len(e) == 3]
    return plan.replace(intra_iter_deps=plan.intra_iter_deps + intra, inter_iter_deps=plan.inter_iter_deps + inter,
                        pipeline_depth=plan.pipeline_depth)


def _fold_missing(plan: PipelinePlan, missing: List[Tuple[Hazard, str]], device: str) -> List[Finding]:
    """One error per fix to make: a hazard an earlier fix already orders is named in that fix's message."""
    out: List[Finding] = []
    for h, how in missing:
        covering = None
        for f in out:
            if f.fix is not None and _verdict(PlanOrder(_with_edges(plan, [f.fix]), None, device), h)[0] in ("ok", "stale"):
                covering = f
                break
        if covering is None:
            out.append(_missing(plan, h, how))
        else:
            covering.message += f" (this also orders {h.second}/{h.first}: {h.kind} {h.what(2)})"
    return out


def _classify(plan: PipelinePlan, hazards: List[Hazard], device: str, window: Optional[int]):
    order = PlanOrder(plan, window, device)
    return [(h,) + _verdict(order, h) for h in hazards]


def _redundant(plan: PipelinePlan, hazards: List[Hazard], verdicts: list, device: str) -> List[Finding]:
    out = []
    good = {id(h) for h, v, _ in verdicts if v in ("ok", "stale")}
    declared = [(e, "intra_iter_deps") for e in plan.intra_edges()] + [(e, "inter_iter_deps") for e in plan.inter_edges()]
    for edge, where in declared:
        inter = len(edge) > 2
        if any((h.second, h.first) == edge[:2] and (h.distance > 0) == inter for h in hazards):
            continue
        rest = [d for d in (plan.intra_edges() if not inter else plan.inter_edges()) if d != edge]
        trimmed = plan.replace(**{where: rest}, pipeline_depth=plan.pipeline_depth,
                               enqueue_order=plan.enqueue_order or None)
        needed = [h for h, v, _ in _classify(trimmed, hazards, device, None) if id(h) in good and v not in ("ok", "stale")]
        carry = ("it still orders " + ", ".join(f"{h.edge!r} ({h.kind} {h.what(1)})" for h in needed[:3])
                 + "; keep it or declare those directly") if needed else "removing it keeps every observed hazard ordered"
        out.append(Finding("info", "redundant",
                           f"declared {edge!r}: no observed dataflow between {edge[0]} and {edge[1]}; {carry}",
                           tuple(edge[:2])))
    return out


def check_dataflow(plan: PipelinePlan, batches: Iterable[Any] = (), *, state: State = None,
                   record: Optional[DataflowRecord] = None, device: str = "cpu",
                   order: Optional[Sequence[str]] = None, rng: Optional[str] = None) -> DataflowReport:
    """Record the plan's tasks on ``batches`` and check the plan orders every observed hazard.

    Parameters
    ----------
    plan : PipelinePlan
        Bound tasks (they run serially while recording: the model trains).
    batches : iterable
        Two or more batches (inter-iteration dataflow needs two).
    state : modules/optimizers, optional
        Names parameters, gradients and optimizer state in the report.
    record : DataflowRecord, optional
        A record made before (then ``batches`` is not used).
    device : {"cpu", "cuda"}
        ``"cuda"`` credits a thread group's FIFO only between tasks on one
        stream and drops the host-only retire barrier.
    order : list of str, optional
        Serial order for recording (default: the plan's, see :func:`~.record.serial_order`).
    rng : {None, "per_task"}
        How the pipeline will run random ops (``SWPipeline(rng=...)``): with
        ``None``, tasks drawing from one of torch's default generators must be
        ordered, as for any shared state, or their numbers differ from the
        serial loop's; ``"per_task"`` needs no order.

    Returns
    -------
    DataflowReport

    Raises
    ------
    PlanError
        The plan breaks a rule of :func:`~swpipe_core.validate.validate`.
    DataflowRecordError
        A task raised while recording.

    Examples
    --------
    >>> import torch
    >>> from swpipe import PipelinePlan, PipelineTask, TaskSchedule, check_dataflow
    >>> def load(ctx): ctx.x = ctx.batch + 1
    >>> def use(ctx): ctx.y = ctx.x * 2
    >>> plan = PipelinePlan({PipelineTask("Load", load): TaskSchedule(0, thread_group="io"),
    ...                      PipelineTask("Use", use): TaskSchedule(1)})
    >>> report = check_dataflow(plan, [torch.ones(1)] * 2)
    >>> report.ok, report.missing[0].fix
    (False, ('Use', 'Load'))
    """
    validate(plan)  # a plan outside the engine's rules has no order to check against
    if record is None:
        record = record_dataflow(plan, batches, state=state, order=order, rng=rng)
    hazards = find_hazards(record)
    verdicts = _classify(plan, hazards, device, None)
    report = DataflowReport(hazards=hazards, record=record)
    report.missing = _fold_missing(plan, [(h, v) for h, v, _ in verdicts if v in ("race", "reversed")], device)
    report.stale = [_stale(h, k) for h, v, k in verdicts if v == "stale"]
    mutated = {}
    for a in record.accesses:
        if a.via == "batch" and a.mode == "write":
            mutated.setdefault(a.task, []).append(a.name)
    for task, names in mutated.items():
        report.missing.append(Finding(
            "error", "mutates_batch",
            f"{task} mutates the batch in place ({', '.join(sorted(set(names)))}): the batch belongs to the data "
            "iterator, a pipeline holds several at once and the profiler replays one; work on a copy "
            "(e.g. x = ctx.batch[0].clone())", (task,)))
    report.redundant = _redundant(plan, hazards, verdicts, device)
    report.notes = [Finding("info", "note", n) for n in record.notes]
    return report
