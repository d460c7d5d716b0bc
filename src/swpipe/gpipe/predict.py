"""What a GPipe step will cost, predicted from per-layer profiles, and measured beside the prediction.

A step is a plan (:mod:`swpipe.gpipe.schedule`); its tasks' costs come from
the layers' profiles (:func:`swpipe.gpipe.balance.profile_layers`) summed per
partition (:func:`step_costs`), and swpipe's simulator runs the plan for the
step's micro-batches (``simulate(..., lengthen=False)``). So every question
is one call:

* the bubble: :attr:`StepPrediction.bubble`, the partitions' idle share of the step;
* "what if chunks were 8", "what if the balance were [3, 1]", "what if
  checkpointing were off", "what if the schedule were 1F1B":
  :func:`what_if`, one prediction per change;
* the activation memory of each checkpoint mode and schedule:
  :attr:`StepPrediction.activation_bytes`, from the simulated timeline;
* the balance, chunks, checkpoint mode and schedule of the fastest step
  under a memory cap: :func:`choose`.

:func:`swpipe.gpipe.measure.measure_step` runs a GPipe's step and measures
the same figures beside the prediction.

The model: a layer's time and bytes grow linearly with the micro-batch
(affine when profiles at two or more sizes are given); a partition's forward
is its layers' forwards, its backward their backwards plus, when
checkpointed, their forwards again (the share of checkpointed micro-batches
of it: one cost per task); copies cost nothing. On the CPU, partitions that
run at once slow each other (free cores, caches, memory bandwidth): given
the measured co-run slowdown of each task (:func:`swpipe.gpipe.corun.profile_corun`),
a task's time stretches by it for the share of the task that runs beside
another partition in the simulated step (:func:`corun_costs`), and the step
is simulated again with the stretched times. Given as a
:class:`CheckedSlowdown` (:func:`~swpipe.gpipe.corun.check_slowdown`),
the slowdown is applied only at the micro-batch sizes where it predicted
held-out measured steps better, and each prediction carries its decision. A partition keeps, per
micro-batch in flight, the activations its layers save (each storage counted
for the first partition that saves it, as the meter counts), or only its
input when checkpointed (until the previous partition's backward, which
needs the same tensor as its output), plus, while a checkpointed backward
runs, the recomputed activations. The loss's own saved tensors are not
counted (nor measured).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from autosched.model.corrections import CorrectionDecision, decisions_line
from swpipe.gpipe.balance.partition import optimal_balance
from swpipe.gpipe.balance.profile import LayerProfile
from swpipe.gpipe.errors import GPipeArgumentError
from swpipe.gpipe.partition import CHECKPOINT_MODES
from swpipe.gpipe.schedule import SCHEDULES, GPipePlan, Placement, check_schedule, step_plan, task_partition

__all__ = ["LayerModel", "StepPrediction", "CheckedSlowdown", "CORUN", "micro_batch", "step_costs", "overlap_shares",
           "corun_costs", "predict_step", "what_if", "choose", "format_table", "activation_peaks"]


@dataclass
class LayerModel:
    """Per-layer time and bytes as functions of the micro-batch size, fitted from one or more profiles.

    ``t(b) = fixed + per_sample * b`` for each layer's forward and backward
    time; bytes proportional to ``b``.
    """

    forward: List[Tuple[float, float]]
    backward: List[Tuple[float, float]]
    saved_per_sample: List[float]
    output_per_sample: List[float]
    device: str = "cpu"

    @classmethod
    def fit(cls, profiles: Sequence[LayerProfile]) -> "LayerModel":
        """Fit the model to profiles of one module at one or more micro-batch sizes.

        Examples
        --------
        >>> p1 = LayerProfile([0.002], [0.004], [800.0], [400.0], [0.0], batch=8, device="cpu")
        >>> p2 = LayerProfile([0.003], [0.006], [1600.0], [800.0], [0.0], batch=16, device="cpu")
        >>> model = LayerModel.fit([p1, p2])
        >>> [round(x, 6) for x in model.forward[0]], model.at(32)["forward"]
        ([0.001, 0.000125], [0.005])
        """
        if not profiles:
            raise GPipeArgumentError("profiles", [], "no profile to fit", "profile the layers first")
        sizes = [float(p.batch) for p in profiles]

        def line(values: Sequence[float]) -> Tuple[float, float]:
            if len(set(sizes)) < 2:
                return 0.0, statistics.fmean(v / s for v, s in zip(values, sizes))
            slope, intercept = statistics.linear_regression(sizes, values)
            if intercept < 0:  # time is never negative at a small batch: proportional then
                return 0.0, sum(values) / sum(sizes)
            return intercept, max(0.0, slope)

        layers = range(len(profiles[0]))
        per = sum(sizes)
        return cls(forward=[line([p.forward_s[k] for p in profiles]) for k in layers],
                   backward=[line([p.backward_s[k] for p in profiles]) for k in layers],
                   saved_per_sample=[sum(p.saved_bytes[k] for p in profiles) / per for k in layers],
                   output_per_sample=[sum(p.output_bytes[k] for p in profiles) / per for k in layers],
                   device=profiles[0].device)

    def __len__(self) -> int:
        return len(self.forward)

    def at(self, batch: float) -> Dict[str, List[float]]:
        """Per layer: ``forward``, ``backward`` seconds, ``saved``, ``output`` bytes, at micro-batches of ``batch``."""
        return {"forward": [a + b * batch for a, b in self.forward],
                "backward": [a + b * batch for a, b in self.backward],
                "saved": [s * batch for s in self.saved_per_sample],
                "output": [s * batch for s in self.output_per_sample]}


def micro_batch(batch: int, chunks: int) -> float:
    """Samples per micro-batch as the prediction takes it: ``batch / min(chunks, batch)`` (an int where whole).

    The key a :class:`CheckedSlowdown` decides by.

    Examples
    --------
    >>> micro_batch(32, 4), micro_batch(10, 4), micro_batch(2, 8)
    (8, 2.5, 1)
    """
    m = min(chunks, batch)
    return batch // m if batch % m == 0 else batch / m


#: The co-run slowdown's name in its decisions (:class:`~autosched.model.corrections.CorrectionDecision`).
CORUN = "co-run slowdown"


@dataclass
class CheckedSlowdown:
    """The co-run slowdown per micro-batch size, and where held-out measured steps say to apply it.

    Attributes
    ----------
    slowdown : dict
        ``{micro-batch size: {task: slowdown}}``: what would be applied at each size
        (:attr:`swpipe.gpipe.corun.CoRun.slowdown`).
    decisions : dict
        ``{micro-batch size: CorrectionDecision}`` (:func:`~autosched.model.corrections.decide_corrections`).

    Examples
    --------
    >>> checked = CheckedSlowdown({8: {"F0": 1.5}, 16: {"F0": 2.0}},
    ...                           {8: CorrectionDecision(CORUN, 8, True, "closer", 0.2, 0.05, 2),
    ...                            16: CorrectionDecision(CORUN, 16, False, "farther", 0.05, 0.3, 2)})
    >>> checked.at(8), checked.at(16), checked.at(4), checked.decision(4).reason
    ({'F0': 1.5}, None, None, 'no-held-out-steps')
    """

    slowdown: Dict[float, Dict[str, float]]
    decisions: Dict[float, CorrectionDecision]

    def decision(self, micro_batch: float) -> CorrectionDecision:
        """The decision at ``micro_batch`` samples; a size nothing decided is not applied ("no-held-out-steps")."""
        got = self.decisions.get(micro_batch)
        return got if got is not None else CorrectionDecision(CORUN, micro_batch, False, "no-held-out-steps")

    def at(self, micro_batch: float) -> Optional[Dict[str, float]]:
        """The slowdown to apply at ``micro_batch`` samples, or ``None`` where the decision is not to."""
        return dict(self.slowdown[micro_batch]) if self.decision(micro_batch).applied else None

    def summary(self) -> str:
        """The decisions as one line, by micro-batch size (:func:`~autosched.model.corrections.decisions_line`)."""
        return decisions_line(self.decisions[k] for k in sorted(self.decisions))


def _checkpointed(checkpoint: str, m: int) -> int:
    return {"always": m, "except_last": m - 1, "never": 0}[checkpoint]


def _partition_sums(values: Sequence[float], balance: Sequence[int]) -> List[float]:
    out, start = [], 0
    for count in balance:
        out.append(sum(values[start:start + count]))
        start += count
    return out


def step_costs(layers: LayerModel, balance: Sequence[int], batch: int, chunks: int, checkpoint: str,
               plan: GPipePlan, cores: Optional[int] = None) -> Any:
    """The :class:`~autosched.model.costs.CostModel` of ``plan``'s tasks: each partition's layers summed.

    Parameters
    ----------
    layers : LayerModel
    balance : sequence of int
    batch : int
        Samples in the mini-batch.
    chunks : int
    checkpoint : str
    plan : GPipePlan
        The step's plan (its task names are costed).
    cores : int, optional
        The machine's free cores (the simulator's core pool, docs/semantics.md); ``None``: one per thread.
    """
    from autosched.model.costs import CostModel, TaskCost

    m = min(chunks, batch)
    at = layers.at(micro_batch(batch, m))
    fwd, bwd = _partition_sums(at["forward"], balance), _partition_sums(at["backward"], balance)
    share = _checkpointed(checkpoint, m) / m
    cuda = layers.device.startswith("cuda")
    tasks = {}
    for name in plan.task_names:
        kind, j = task_partition(name)
        seconds = fwd[j] if kind == "F" else bwd[j] + share * fwd[j] if kind == "B" else 0.0
        tasks[name] = TaskCost(0.0, seconds) if cuda else TaskCost(seconds)
    return CostModel(tasks, machine=layers.device, method="swpipe.gpipe: per-layer profiles summed per partition",
                     cores=cores)


def overlap_shares(events: Iterable[Any]) -> Dict[str, float]:
    """Per task, the share of its host time during which another thread group runs a task.

    Parameters
    ----------
    events : iterable of TimelineEvent
        A simulated (``SimResult.events``) or measured (``GPipe.timeline``) step.

    Returns
    -------
    dict
        ``{task: share in 0..1}`` over all its iterations.

    Examples
    --------
    >>> from swpipe_core.measure.trace import TimelineEvent
    >>> overlap_shares([TimelineEvent("F0", 0, "p0", "default", 0.0, 2.0),
    ...                 TimelineEvent("F1", 0, "p1", "default", 1.0, 2.0)])
    {'F0': 0.5, 'F1': 1.0}
    """
    host = [e for e in events if e.kind == "host" and e.end > e.start]
    groups = {e.thread_group for e in host}
    others = {}  # per group: the merged busy intervals of every other group
    for g in groups:
        merged: List[List[float]] = []
        for e in sorted((e for e in host if e.thread_group != g), key=lambda e: e.start):
            if merged and e.start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e.end)
            else:
                merged.append([e.start, e.end])
        others[g] = merged
    busy: Dict[str, float] = {}
    beside: Dict[str, float] = {}
    for e in host:
        busy[e.task] = busy.get(e.task, 0.0) + e.end - e.start
        beside[e.task] = beside.get(e.task, 0.0) + sum(max(0.0, min(e.end, b) - max(e.start, a))
                                                       for a, b in others[e.thread_group])
    return {t: beside[t] / busy[t] for t in busy}


def corun_costs(costs: Any, events: Iterable[Any], slowdown: Mapping[str, float]) -> Any:
    """``costs`` with each task's host time stretched by its co-run slowdown, for the share of it run beside another.

    ``host_s x (1 + share x (slowdown - 1))``, the share from
    :func:`overlap_shares` of ``events`` (the step simulated with ``costs``).
    The one place the co-run slowdown enters a cost.

    Parameters
    ----------
    costs : CostModel
    events : iterable of TimelineEvent
    slowdown : mapping
        ``{task: slowdown beside another partition}`` (:attr:`swpipe.gpipe.corun.CoRun.slowdown`); a task not in
        it keeps its time.

    Returns
    -------
    CostModel

    Examples
    --------
    >>> from autosched.model.costs import CostModel, TaskCost
    >>> from swpipe_core.measure.trace import TimelineEvent
    >>> costs = CostModel({"F0": TaskCost(2.0), "F1": TaskCost(1.0)})
    >>> events = [TimelineEvent("F0", 0, "p0", "default", 0.0, 2.0), TimelineEvent("F1", 0, "p1", "default", 1.0, 2.0)]
    >>> got = corun_costs(costs, events, {"F0": 2.0, "F1": 1.5})
    >>> got["F0"].host_s, got["F1"].host_s
    (3.0, 1.5)
    """
    shares = overlap_shares(events)
    tasks = {}
    for name, c in costs.tasks.items():
        factor = 1.0 + shares.get(name, 0.0) * (max(1.0, slowdown.get(name, 1.0)) - 1.0)
        tasks[name] = dataclasses.replace(c, host_s=c.host_s * factor) if factor != 1.0 else c
    return dataclasses.replace(costs, tasks=tasks)


@dataclass
class StepPrediction:
    """A predicted training step.

    Attributes
    ----------
    schedule, balance, chunks, checkpoint, batch
        What was predicted.
    step_s : float
        Seconds from the first micro-batch's forward to the last backward (the simulated makespan).
    bound_s : float
        No step of this plan is shorter: ``(m - 1)`` x the plan's lower bound per
        micro-batch (:func:`swpipe.lower_bounds`) plus one micro-batch's work through every partition.
    bubble : float
        Share of the partitions' time idle within the step: ``1 - work / (partitions x step_s)``.
    activation_bytes : float
        Peak bytes of activations kept for backward, all partitions together.
    activation_by : list of float
        The peak of each partition alone.
    plan, costs, sim
        The plan, its cost model (co-run slowdown included) and the simulation (``sim.events`` for
        :func:`swpipe.gantt`).
    slowdown : dict, optional
        The co-run slowdown per task the prediction took (:func:`corun_costs`); ``None`` where none was
        applied.
    checked : CheckedSlowdown, optional
        The checked slowdown given (:func:`what_if` takes it again).
    decision : CorrectionDecision, optional
        Whether ``checked`` applied its slowdown at this micro-batch size, and why.
    """

    schedule: str
    balance: List[int]
    chunks: int
    checkpoint: str
    batch: int
    step_s: float
    bound_s: float
    bubble: float
    activation_bytes: float
    activation_by: List[float]
    plan: Any = field(repr=False, default=None)
    costs: Any = field(repr=False, default=None)
    sim: Any = field(repr=False, default=None)
    slowdown: Optional[Dict[str, float]] = field(repr=False, default=None)
    checked: Optional[CheckedSlowdown] = field(repr=False, default=None)
    decision: Optional[CorrectionDecision] = field(repr=False, default=None)

    @property
    def period_s(self) -> float:
        """:attr:`step_s`: a step repeats once per step (the verbs' common name, :mod:`autosched.results`)."""
        return self.step_s

    @property
    def peak_bytes_by(self) -> Any:
        """:attr:`activation_by` as the verbs' one memory type (:class:`autosched.results.PeakBytes`, per partition)."""
        from autosched.results import PeakBytes

        return PeakBytes(dict(enumerate(self.activation_by)), "partition")

    @property
    def events(self) -> List[Any]:
        """The simulated step's timeline (``sim.events``), a track per partition's thread: what ``gantt`` draws."""
        return list(self.sim.events) if self.sim is not None else []

    def summary(self) -> str:
        """One line: the step, its bound, bubble and activation bytes."""
        return (f"{self.schedule} step, balance {list(self.balance)}, {self.chunks} chunks, checkpoint "
                f"{self.checkpoint}: {self.step_s * 1e3:.3f} ms (bound {self.bound_s * 1e3:.3f}), bubble "
                f"{self.bubble:.0%}, activations {self.activation_bytes / 2**20:.2f} MiB")

    def row(self) -> Dict[str, Any]:
        """The figures as one table row."""
        return {"schedule": self.schedule, "balance": list(self.balance), "chunks": self.chunks,
                "checkpoint": self.checkpoint, "step_ms": self.step_s * 1e3, "bound_ms": self.bound_s * 1e3,
                "bubble": self.bubble, "activation_MB": self.activation_bytes / 1e6}


def _activation_curve(sim: Any, layers: LayerModel, balance: Sequence[int], batch: float, m: int,
                      checkpoint: str) -> Tuple[float, List[float]]:
    """Peak activation bytes over the simulated step, total and per partition."""
    at = layers.at(micro_batch(batch, m))
    saved = _partition_sums(at["saved"], balance)
    ends = [sum(balance[:j + 1]) - 1 for j in range(len(balance))]
    inputs = [0.0] + [at["output"][ends[j - 1]] for j in range(1, len(balance))]  # the caller's input is not counted
    return activation_peaks(sim.events, saved, inputs, _checkpointed(checkpoint, m), layers.device.startswith("cuda"))


def activation_peaks(events: Iterable[Any], saved: Sequence[float], inputs: Optional[Sequence[float]] = None,
                     checkpointed: int = 0, cuda: bool = False) -> Tuple[float, List[float]]:
    """Peak activation bytes of a simulated step, all partitions together and each alone.

    A forward ``F<j>`` keeps ``saved[j]`` from its end to the end of its backward ``B<j>``. The first
    ``checkpointed`` micro-batches are checkpointed: their forward keeps only its input ``inputs[j]``
    (also the previous partition's output: alive until the later backward, the previous partition's),
    and their backward holds ``saved[j]`` again, recomputed, while it runs. At one instant frees
    come before adds. The changes are one :class:`~autosched.model.memcurve.MemoryChanges`, a
    partition each.

    Parameters
    ----------
    events : iterable of TimelineEvent
        The step's simulated timeline (``SimResult.events``): host parts on the CPU, device parts too on CUDA.
    saved : sequence of float
        Per partition: bytes a micro-batch's forward keeps for its backward.
    inputs : sequence of float, optional
        Per partition: bytes of its input (what a checkpointed forward keeps); needed with ``checkpointed``.
    checkpointed : int
        How many micro-batches (the first ones) are checkpointed.
    cuda : bool
        Whether device parts are read too (a CUDA step's work is on its streams).

    Returns
    -------
    (float, list of float)
        The peak of all partitions together, and each partition's own.

    Examples
    --------
    >>> from swpipe_core.measure.trace import TimelineEvent
    >>> step = [TimelineEvent("F0", 0, "p0", "default", 0.0, 1.0), TimelineEvent("F0", 1, "p0", "default", 1.0, 2.0),
    ...         TimelineEvent("B0", 0, "p0", "default", 2.0, 4.0), TimelineEvent("B0", 1, "p0", "default", 4.0, 6.0)]
    >>> activation_peaks(step, [100.0])
    (200.0, [200.0])
    """
    from autosched.model.memcurve import MemoryChanges

    parts = [e for e in events if e.kind == "host" or cuda]
    backward_end = {task_partition(e.task)[1:] + (e.iteration,): e.end for e in parts if e.task.startswith("B")}
    mem = MemoryChanges()  # order 0: frees, 1: adds
    for e in parts:
        kind, j = task_partition(e.task)
        i = e.iteration
        if kind == "F" and i < checkpointed:
            if inputs is None:
                raise GPipeArgumentError("inputs", None, f"{checkpointed} micro-batch(es) checkpointed",
                                         "give each partition's input bytes")
            # a checkpointed partition keeps its input, which is also the previous partition's output:
            # alive until the later of the two backwards, the previous partition's
            mem.add(e.end, inputs[j], order=1, owner=j)
            mem.add(backward_end.get((j - 1, i), backward_end[(j, i)]), -inputs[j], order=0, owner=j)
        elif kind == "F":
            mem.add(e.end, saved[j], order=1, owner=j)
        elif kind == "B" and i < checkpointed:
            mem.add(e.start, saved[j], order=1, owner=j)  # the recomputed activations, while backward runs
            mem.add(e.end, -saved[j], order=0, owner=j)
        elif kind == "B":
            mem.add(e.end, -saved[j], order=0, owner=j)
    return float(mem.peak().bytes), [float(mem.peak(j).bytes) for j in range(len(saved))]


def predict_step(layers: LayerModel, balance: Sequence[int], batch: int, chunks: int,
                 checkpoint: str = "except_last", schedule: str = "GPipe", *,
                 places: Optional[Sequence[Placement]] = None, cores: Optional[int] = None,
                 slowdown: Union[Mapping[str, float], CheckedSlowdown, None] = None) -> StepPrediction:
    """Predict one training step: its time, bubble and activation memory.

    Parameters
    ----------
    layers : LayerModel
        Per-layer costs (:meth:`LayerModel.fit` of :func:`~swpipe.gpipe.balance.profile_layers`).
    balance : sequence of int
    batch : int
        Samples per mini-batch.
    chunks : int
    checkpoint : {"always", "except_last", "never"}
    schedule : {"GPipe", "1F1B"}
        PyTorch's spelling, any case.
    places : sequence of Placement, optional
        The partitions' placements (default: a thread per partition on the CPU).
    cores : int, optional
        Cores free for the partitions' threads (``swpipe_core.measure.calibrate.measure_cores``); ``None``: a
        core per thread.
    slowdown : mapping or CheckedSlowdown, optional
        ``{task: slowdown beside another partition}`` of CPU partitions run at once
        (:attr:`swpipe.gpipe.corun.CoRun.slowdown`): each task is stretched by it for the share of it that
        runs beside another partition (:func:`corun_costs`) and the step simulated again. A mapping is
        applied as given, unchecked; a :class:`CheckedSlowdown` only where its decision
        at this step's micro-batch size (:func:`micro_batch`) says so (the prediction's ``decision``).
        ``None``: partitions run at once as fast as alone.

    Returns
    -------
    StepPrediction

    Examples
    --------
    Two equal partitions, 4 micro-batches: the bubble is (n - 1) / (m + n - 1) = 1/5.

    >>> layers = LayerModel(forward=[(0.0, 0.001)] * 2, backward=[(0.0, 0.002)] * 2,
    ...                     saved_per_sample=[100.0] * 2, output_per_sample=[10.0] * 2)
    >>> p = predict_step(layers, [1, 1], batch=4, chunks=4, checkpoint="never")
    >>> round(p.step_s, 6), round(p.bubble, 3), p.activation_by
    (0.015, 0.2, [400.0, 400.0])
    >>> predict_step(layers, [1, 1], batch=4, chunks=4, checkpoint="never", schedule="1F1B").activation_by
    [200.0, 100.0]
    """
    from autosched.model.simulate import simulate
    from autosched.search.bounds import lower_bounds

    if sum(balance) != len(layers):
        raise GPipeArgumentError("balance", list(balance), f"sums to {sum(balance)}, the module has {len(layers)} "
                                 "layers", "give layers per partition")
    if checkpoint not in CHECKPOINT_MODES:
        raise GPipeArgumentError("checkpoint", checkpoint, f"not one of {CHECKPOINT_MODES}")
    schedule = check_schedule(schedule)
    m = min(chunks, batch)
    checked, decision = (slowdown, slowdown.decision(micro_batch(batch, m))) \
        if isinstance(slowdown, CheckedSlowdown) else (None, None)
    if checked is not None:
        slowdown = checked.at(micro_batch(batch, m))
    places = list(places) if places is not None else [Placement("cpu", f"p{j}") for j in range(len(balance))]
    plan = step_plan(places, schedule, m)
    costs = step_costs(layers, balance, batch, m, checkpoint, plan, cores)
    device = "cuda" if layers.device.startswith("cuda") else "cpu"
    sim = simulate(plan, costs, num_iterations=m, device=device, lengthen=False)
    if slowdown and device == "cpu":
        costs = corun_costs(costs, sim.events, slowdown)
        sim = simulate(plan, costs, num_iterations=m, device=device, lengthen=False)
    work = [costs[f"F{j}"].cpu_s + costs[f"B{j}"].cpu_s for j in range(len(balance))]
    step = sim.makespan
    one = sum(work)
    bound = (m - 1) * lower_bounds(plan, costs, device=device).value + one
    peak, peak_by = _activation_curve(sim, layers, balance, batch, m, checkpoint)
    bubble = 1.0 - m * sum(work) / (len(balance) * step) if step > 0 else 0.0
    return StepPrediction(schedule, list(balance), chunks, checkpoint, batch, step, bound, bubble, peak, peak_by,
                          plan=plan, costs=costs, sim=sim, slowdown=dict(slowdown) if slowdown else None,
                          checked=checked, decision=decision)


def what_if(base: StepPrediction, layers: LayerModel, changes: Iterable[Dict[str, Any]]) -> List[StepPrediction]:
    """``base`` predicted again with each change (``{"chunks": 8}``, ``{"balance": [3, 1]}``, ...).

    The co-run slowdown ``base`` took, if any, is taken again (a checked one decides again at each change's
    micro-batch size).

    Returns
    -------
    list of StepPrediction
        ``base`` first, then one per change, in order.
    """
    out = [base]
    for change in changes:
        unknown = set(change) - {"balance", "chunks", "checkpoint", "schedule", "batch"}
        if unknown:
            raise GPipeArgumentError("changes", change, f"unknown field(s) {sorted(unknown)}",
                                     "change balance, chunks, checkpoint, schedule or batch")
        cfg = {"balance": base.balance, "chunks": base.chunks, "checkpoint": base.checkpoint,
               "schedule": base.schedule, "batch": base.batch, **change}
        out.append(predict_step(layers, cfg["balance"], cfg["batch"], cfg["chunks"], cfg["checkpoint"],
                                cfg["schedule"], slowdown=base.checked if base.checked is not None
                                else base.slowdown))
    return out


def choose(layers: LayerModel, partitions: int, batch: int, max_memory_bytes: Optional[float] = None,
           chunks: Iterable[int] = (1, 2, 4, 8, 16, 32), checkpoints: Iterable[str] = CHECKPOINT_MODES,
           schedules: Iterable[str] = SCHEDULES, *,
           slowdown: Union[Mapping[str, float], CheckedSlowdown, None] = None,
           max_activation_bytes: Optional[float] = None) -> Tuple[Optional[StepPrediction], List[StepPrediction]]:
    """The fastest predicted step whose activations fit ``max_memory_bytes``: balance, chunks, checkpoint, schedule.

    ``max_memory_bytes`` caps the step's peak activation bytes, all partitions together
    (``max_activation_bytes``, its old name, is taken for one release with a ``FutureWarning``).

    The balance for each chunk count is the optimum of the layers' time at
    that micro-batch size (:func:`~swpipe.gpipe.balance.optimal_balance`);
    every combination is predicted (with the co-run ``slowdown``, if given, as
    :func:`predict_step` takes it: a checked one only at the micro-batch sizes
    its decisions apply it, each candidate's ``decision`` says).

    Returns
    -------
    (StepPrediction or None, list of StepPrediction)
        The choice (``None`` if nothing fits the cap) and every candidate, fastest first.
    """
    from autosched._fields import memory_cap

    max_memory_bytes = memory_cap("choose", max_memory_bytes, "max_activation_bytes", max_activation_bytes)
    candidates = []
    for c in sorted(set(min(int(k), batch) for k in chunks)):
        at = layers.at(micro_batch(batch, c))
        balance = optimal_balance([f + b for f, b in zip(at["forward"], at["backward"])], partitions)
        for ck in checkpoints:
            for sched in schedules:
                candidates.append(predict_step(layers, balance, batch, c, ck, sched, slowdown=slowdown))
    candidates.sort(key=lambda p: (p.step_s, p.activation_bytes))
    fits = [p for p in candidates if max_memory_bytes is None or p.activation_bytes <= max_memory_bytes]
    return (fits[0] if fits else None), candidates


def format_table(rows: Sequence[Dict[str, Any]]) -> str:
    """Rows of dicts as an aligned text table (floats with 3 digits)."""
    if not rows:
        return ""
    keys = list(rows[0])

    def cell(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    widths = {k: max(len(k), *(len(cell(r.get(k, ""))) for r in rows)) for k in keys}
    lines = ["  ".join(f"{k:>{widths[k]}}" for k in keys)]
    lines += ["  ".join(f"{cell(r.get(k, '')):>{widths[k]}}" for k in keys) for r in rows]
    return "\n".join(lines)
