"""What a pipeline-parallel step costs: per-stage F/I/W/B times and bytes, and the point-to-point link.

:class:`StageCost` holds one stage's times and memory for one micro-batch, measured by
:func:`measure_stage_costs` on the stage modules in one process, with the runtime's own
backward functions (``stage_backward``, ``stage_backward_input``, ``stage_backward_weight``;
the first stage's I does nothing and its W runs the whole backward, as in the runtime).
:class:`P2PCost` is the link between two ranks, measured once by :func:`measure_p2p` with
``torch.distributed`` on the backend in use. :meth:`P2PCost.seconds` is the one formula of
a transfer's time; the simulator, the bounds and the search all call it.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from autosched._fields import check_fields, integer, number
from autosched.pp.program import PPError

__all__ = ["StageCost", "P2PCost", "PPCosts", "measure_stage_costs", "measure_p2p", "split_module"]


@dataclass(frozen=True)
class StageCost:
    """One stage's cost for one micro-batch.

    Attributes
    ----------
    forward_s, backward_s, backward_input_s, backward_weight_s : float
        F, B (input and weight gradients at once), I and W, in seconds.
    loss_s : float
        The loss after the last stage's forward (0 for the other stages).
    reduce_grad_s : float
        The stage's ``REDUCE_GRAD`` at the end of a step: its weight gradients divided by
        the micro-batch count (the runtime's ``scale_grads``); a cost per step, not per
        micro-batch or sample.
    activation_bytes : int
        Bytes a forward leaves alive until its backward (saved tensors, the output the
        stage caches, the last stage's loss): the runtime caches every stage's output,
        the last stage's logits too, which cross-entropy does not save.
    weight_keep_bytes : int
        What is alive between I and W: what W still needs of the activations, and the
        gradients of the intermediate tensors I keeps for W (the runtime's
        ``stage_backward_input`` keeps them in its parameter groups). It can exceed
        ``activation_bytes``.
    output_bytes : int
        The activation sent to the next stage (its gradient comes back the same size).
    grad_input_bytes : int
        The gradient of the stage's input a backward produces and holds until it is sent
        (0 for the first stage).
    loss_keep_bytes : int
        Of ``activation_bytes``, what the loss still holds after the backward (the last
        stage: the schedule keeps every micro-batch's loss to the end of the step).
    forward_peak_bytes, backward_peak_bytes, backward_input_peak_bytes, backward_weight_peak_bytes : int
        The most each action has alive above what was alive when it started.

    Raises
    ------
    OptionError
        A time that is not a finite number >= 0 (NaN, infinite, negative) or a byte count
        that is not an integer >= 0, naming the field (``.field``, ``.value``).

    Examples
    --------
    >>> cost = StageCost(forward_s=0.002, backward_s=0.004, reduce_grad_s=0.0005)
    >>> cost.action_s("F"), cost.action_s("REDUCE_GRAD"), cost.action_s("SEND_F")  # a transfer is the link's
    (0.002, 0.0005, 0.0)
    """

    forward_s: float
    backward_s: float
    backward_input_s: float = 0.0
    backward_weight_s: float = 0.0
    loss_s: float = 0.0
    activation_bytes: int = 0
    weight_keep_bytes: int = 0
    output_bytes: int = 0
    grad_input_bytes: int = 0
    loss_keep_bytes: int = 0
    forward_peak_bytes: int = 0
    backward_peak_bytes: int = 0
    backward_input_peak_bytes: int = 0
    backward_weight_peak_bytes: int = 0
    reduce_grad_s: float = 0.0

    def __post_init__(self) -> None:
        check_fields(self, {f.name: (number(0, finite=True) if f.name.endswith("_s") else integer(0))
                            for f in fields(self)})

    def action_s(self, kind: str) -> float:
        """The time of action ``kind`` (``F``, ``I``, ``W``, ``B``, ``LOSS``, ``REDUCE_GRAD``; others 0)."""
        return {"F": self.forward_s, "B": self.backward_s, "I": self.backward_input_s,
                "W": self.backward_weight_s, "LOSS": self.loss_s, "REDUCE_GRAD": self.reduce_grad_s}.get(kind, 0.0)

    def scaled(self, time_factor: float = 1.0, bytes_factor: float = 1.0) -> "StageCost":
        """Times multiplied by ``time_factor``, bytes by ``bytes_factor``."""
        times = {k: getattr(self, k) * time_factor for k in
                 ("forward_s", "backward_s", "backward_input_s", "backward_weight_s", "loss_s", "reduce_grad_s")}
        sizes = {k: int(round(getattr(self, k) * bytes_factor)) for k in
                 ("activation_bytes", "weight_keep_bytes", "output_bytes", "grad_input_bytes", "loss_keep_bytes",
                  "forward_peak_bytes",
                  "backward_peak_bytes", "backward_input_peak_bytes", "backward_weight_peak_bytes")}
        return replace(self, **times, **sizes)


@dataclass(frozen=True)
class P2PCost:
    """A point-to-point transfer between two ranks: ``latency_s + nbytes * seconds_per_byte``.

    A transfer starts when both its send and its receive are posted (gloo and NCCL both
    match a send with its receive) and both complete when it ends.

    ``post_s`` is what each posted send or receive costs the thread that posts it while
    the ranks compute. On the CPU it is not zero: gloo moves the bytes with the CPU and
    every transfer wakes gloo's and the waiting rank's threads, which take a core from
    the computation (on a machine with no core to spare, a time slice). A ping-pong
    between idle ranks cannot see it; :func:`measure_p2p` measures it by exchanging
    while both ranks compute.

    Examples
    --------
    >>> P2PCost(latency_s=50e-6, seconds_per_byte=1e-9).seconds(1_000_000)
    0.00105
    """

    latency_s: float = 0.0
    seconds_per_byte: float = 0.0
    backend: str = ""
    post_s: float = 0.0

    def __post_init__(self) -> None:
        time = number(0, finite=True)
        check_fields(self, {"latency_s": time, "seconds_per_byte": time, "post_s": time,
                            "backend": (lambda v: isinstance(v, str), "a string")})

    def seconds(self, nbytes: int) -> float:
        """How long one transfer of ``nbytes`` takes."""
        return self.latency_s + max(0, nbytes) * self.seconds_per_byte


@dataclass(frozen=True)
class PPCosts:
    """The costs of one stage split: every stage's :class:`StageCost`, the link, and what was measured.

    Attributes
    ----------
    stages : tuple of StageCost
        Indexed by stage.
    p2p : P2PCost
    samples_per_microbatch : int
        The micro-batch the stage costs were measured with (0: not said).
    machine : str
        Where and how they were measured.
    action_overhead_s : float
        What the runtime adds to each compute action (its Python around the stage's
        module: receive buffers, caches, validation, the profiler range), already
        included in ``stages``' times (:meth:`with_action_overhead`); 0 if not measured.
    custom_overhead_s : float
        What a custom order's path adds to each compute action beyond PyTorch's own schedule classes, on top of
        ``action_overhead_s``: :func:`~autosched.pp.program.schedule_for` runs an order that is not one of
        PyTorch's with ``_PipelineScheduleRuntime``, and the same order costs more that way than by PyTorch's
        class (``swpipe pp`` measures 1F1B's order both ways). The prediction of a program that is not one of
        PyTorch's (``source != "pytorch"``) adds it to every F, I, W and B (:meth:`for_program`), so a search
        compares like with like; 0 if not measured.

    Raises
    ------
    OptionError
        ``stages`` not a non-empty sequence of :class:`StageCost`, ``p2p`` not a
        :class:`P2PCost`, or a field out of range (``action_overhead_s`` a finite number
        >= 0, ``samples_per_microbatch`` an integer >= 0).
    """

    stages: Tuple[StageCost, ...]
    p2p: P2PCost = field(default_factory=P2PCost)
    samples_per_microbatch: int = 0
    machine: str = ""
    action_overhead_s: float = 0.0
    custom_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        check_fields(self, {
            "stages": (lambda v: isinstance(v, (tuple, list)) and len(v) > 0
                       and all(isinstance(c, StageCost) for c in v), "a non-empty tuple of StageCost, one per stage"),
            "p2p": (lambda v: isinstance(v, P2PCost), "a P2PCost"),
            "samples_per_microbatch": integer(0), "machine": (lambda v: isinstance(v, str), "a string"),
            "action_overhead_s": number(0, finite=True), "custom_overhead_s": number(0, finite=True)})

    def with_action_overhead(self, overhead_s: float) -> "PPCosts":
        """Every F, I, W and B made ``overhead_s`` longer (replacing an overhead added before)."""
        delta = overhead_s - self.action_overhead_s

        def shifted(c: StageCost) -> StageCost:
            return replace(c, forward_s=c.forward_s + delta, backward_s=c.backward_s + delta,
                           backward_input_s=c.backward_input_s + delta, backward_weight_s=c.backward_weight_s + delta)
        return replace(self, stages=tuple(shifted(c) for c in self.stages), action_overhead_s=overhead_s)

    def for_program(self, program: Any) -> "PPCosts":
        """The costs ``program`` runs on: these for one of PyTorch's schedules (``program.source == "pytorch"``),
        else :meth:`custom_path`.

        Examples
        --------
        >>> from autosched.pp.program import pp_program, program_from_order
        >>> costs = PPCosts((StageCost(1.0, 2.0),) * 2, custom_overhead_s=0.5)
        >>> builtin = pp_program("1F1B", 2, 2)
        >>> custom = program_from_order(builtin.compute, 2, builtin.stage_to_rank)
        >>> costs.for_program(builtin).stages[0].forward_s, costs.for_program(custom).stages[0].forward_s
        (1.0, 1.5)
        """
        return self if program.source == "pytorch" else self.custom_path()

    def custom_path(self) -> "PPCosts":
        """The costs a custom order runs on: :attr:`custom_overhead_s` added to every F, I, W and B (and counted in
        ``action_overhead_s``, 0 left in ``custom_overhead_s``)."""
        if not self.custom_overhead_s:
            return self
        return replace(self.with_action_overhead(self.action_overhead_s + self.custom_overhead_s),
                       custom_overhead_s=0.0)

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    def stage(self, index: int) -> StageCost:
        if not 0 <= index < len(self.stages):
            raise PPError("missing_cost", "stage", index, detail=f"the costs cover stages 0..{len(self.stages) - 1}")
        return self.stages[index]

    def with_stage_factor(self, factors: Dict[int, float]) -> "PPCosts":
        """Stage ``s``'s times multiplied by ``factors[s]`` (0.5: "twice as fast")."""
        for s, f in factors.items():
            self.stage(s)
            if not f > 0:
                raise PPError("bad_value", f"stage_factor[{s}]", f, detail="a factor > 0")
        return replace(self, stages=tuple(c.scaled(time_factor=factors.get(i, 1.0)) for i, c in enumerate(self.stages)))

    def rescaled(self, samples_per_microbatch: int) -> "PPCosts":
        """The same costs for another micro-batch size, assuming times and bytes linear in it.

        The runtime's ``action_overhead_s`` and each stage's ``reduce_grad_s`` are kept as
        they are (costs per action and per step, not per sample); the rest is a first-order
        model: a module's own fixed cost per call makes small micro-batches dearer than this
        says. Measure again where it matters.
        """
        if self.samples_per_microbatch <= 0:
            raise PPError("missing_cost", "samples_per_microbatch", self.samples_per_microbatch,
                          detail="costs measured without their micro-batch size cannot be rescaled")
        f = samples_per_microbatch / self.samples_per_microbatch
        base = self.with_action_overhead(0.0)
        scaled = replace(base, stages=tuple(replace(c.scaled(f, f), reduce_grad_s=c.reduce_grad_s) for c in base.stages),
                         samples_per_microbatch=samples_per_microbatch)
        return scaled.with_action_overhead(self.action_overhead_s)

    def to_dict(self) -> Dict[str, Any]:
        return {"stages": [asdict(c) for c in self.stages], "p2p": asdict(self.p2p),
                "samples_per_microbatch": self.samples_per_microbatch, "machine": self.machine,
                "action_overhead_s": self.action_overhead_s, "custom_overhead_s": self.custom_overhead_s}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "PPCosts":
        return cls(tuple(StageCost(**c) for c in data["stages"]), P2PCost(**data.get("p2p", {})),
                   int(data.get("samples_per_microbatch", 0)), str(data.get("machine", "")),
                   float(data.get("action_overhead_s", 0.0)), float(data.get("custom_overhead_s", 0.0)))

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str) -> "PPCosts":
        with open(path) as f:
            return cls.from_dict(json.load(f))


def split_module(layers: Sequence[Any], n_stages: int) -> List[Any]:
    """``layers`` (a ``torch.nn.Sequential`` or list of modules) cut into ``n_stages`` contiguous stages.

    Earlier stages get one layer more when the count does not divide.
    """
    import torch

    layers = list(layers)
    if not 1 <= n_stages <= len(layers):
        raise PPError("bad_value", "n_stages", n_stages, detail=f"between 1 and the {len(layers)} layers")
    base, extra = divmod(len(layers), n_stages)
    out, start = [], 0
    for s in range(n_stages):
        n = base + (1 if s < extra else 0)
        out.append(torch.nn.Sequential(*layers[start:start + n]))
        start += n
    return out


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


class _Chain:
    """One micro-batch through every stage, with the runtime's own backward functions.

    It holds what the runtime holds: each stage's input and output from its forward
    (``PipelineStage.fwd_cache``), and the last stage's loss apart from its output. The
    last stage's output is let go after its B or I (the runtime pops ``fwd_cache`` there
    and keeps only the loss for W); until then it is alive even when the loss does not
    save it (cross-entropy saves its ``log_softmax``, not the logits).
    """

    def __init__(self, stages: Sequence[Any], microbatch: Any, target: Any, loss_fn: Callable[..., Any]) -> None:
        self.stages, self.microbatch, self.target, self.loss_fn = list(stages), microbatch, target, loss_fn
        self.inputs: List[Any] = []
        self.outputs: List[Any] = []
        self.loss_value: Any = None

    def forward(self, s: int) -> float:
        x = self.microbatch if s == 0 else self.outputs[s - 1].detach().requires_grad_(True)
        t0 = time.perf_counter()
        out = self.stages[s](x)
        dt = time.perf_counter() - t0
        self.inputs.append(x)
        self.outputs.append(out)
        return dt

    def loss(self) -> float:
        t0 = time.perf_counter()
        self.loss_value = self.loss_fn(self.outputs[-1], self.target)
        return time.perf_counter() - t0

    def _args(self, s: int, grad: Any) -> Tuple[Any, Any, List[Any]]:
        """What the runtime passes its backward: the loss (last stage) or the outputs and their gradients."""
        if s == len(self.stages) - 1:
            return self.loss_value, None, [self.inputs[s]]
        return (self.outputs[s],), (grad,), [self.inputs[s]]

    def _let_go_of_output(self, s: int) -> None:
        """After the last stage's B or I: the runtime has popped its ``fwd_cache`` and keeps only the loss."""
        if s == len(self.stages) - 1:
            self.outputs[s] = None

    def backward(self, s: int, grad: Any) -> Tuple[float, Any]:
        from autosched.pp import _torch

        outs, grads, inputs = self._args(s, grad)
        t0 = time.perf_counter()
        g = _torch.backward_full(outs, grads, inputs)
        dt = time.perf_counter() - t0
        self._let_go_of_output(s)
        return dt, (g[0] if s > 0 else None)

    def backward_input(self, s: int, grad: Any) -> Tuple[float, Any, Any]:
        from autosched.pp import _torch

        if s == 0:  # the runtime skips the first stage's I: its W runs the whole backward
            return 0.0, None, None
        outs, grads, inputs = self._args(s, grad)
        t0 = time.perf_counter()
        outs = (outs,) if s == len(self.stages) - 1 else outs
        g, groups = _torch.backward_input(outs, grads, inputs, self.stages[s].parameters())
        dt = time.perf_counter() - t0
        self._let_go_of_output(s)
        return dt, g[0], groups

    def backward_weight(self, s: int, groups: Any, grad: Any) -> float:
        from autosched.pp import _torch

        t0 = time.perf_counter()
        if s == 0:
            outs, grads, inputs = self._args(s, grad)
            _torch.backward_full(outs, grads, inputs)
        else:
            _torch.backward_weight(self.stages[s].parameters(), groups)
        return time.perf_counter() - t0


def _timed_pass(stages: Sequence[Any], microbatch: Any, target: Any, loss_fn: Callable[..., Any], split: bool
                ) -> Dict[str, List[float]]:
    chain = _Chain(stages, microbatch, target, loss_fn)
    n = len(stages)
    t: Dict[str, List[float]] = {"F": [], "LOSS": [], "B": [0.0] * n, "I": [0.0] * n, "W": [0.0] * n}
    for s in range(n):
        t["F"].append(chain.forward(s))
    t["LOSS"].append(chain.loss())
    grad = None
    groups: Dict[int, Any] = {}
    grads_in: Dict[int, Any] = {}
    for s in reversed(range(n)):
        if split:
            t["I"][s], g, groups[s] = chain.backward_input(s, grad)
            grads_in[s] = grad
        else:
            t["B"][s], g = chain.backward(s, grad)
        grad = g
    if split:
        for s in reversed(range(n)):
            t["W"][s] = chain.backward_weight(s, groups[s], grads_in[s])
    return t


def _memory_pass(stages: Sequence[Any], microbatch: Any, target: Any, loss_fn: Callable[..., Any]
                 ) -> Dict[str, List[int]]:
    from autosched.pp.memory import LiveTensorBytes

    n = len(stages)
    m: Dict[str, List[int]] = {k: [0] * n for k in ("act", "keep", "out", "gin", "lkeep", "pF", "pB", "pI", "pW")}
    for split in (False, True):
        chain = _Chain(stages, microbatch, target, loss_fn)
        with LiveTensorBytes() as mem:
            start_of: Dict[int, int] = {}
            for s in range(n):
                before = start_of[s] = mem.reset_peak()
                chain.forward(s)
                if s == n - 1:
                    chain.loss()
                if not split:
                    m["pF"][s] = mem.peak_bytes - before
                    m["act"][s] = mem.live_bytes - before
                    m["out"][s] = _nbytes(chain.outputs[s]) if s < n - 1 else 0
            grad = None
            groups: Dict[int, Any] = {}
            grads_in: Dict[int, Any] = {}
            for s in reversed(range(n)):
                before = mem.reset_peak()
                if split:
                    _, g, groups[s] = chain.backward_input(s, grad)
                    grads_in[s] = grad
                    m["pI"][s] = mem.peak_bytes - before
                    gin = _nbytes(g) if g is not None else 0
                    # alive after I: what W still needs, with the intermediates' gradients I keeps for it (not
                    # capped at the activations: they can exceed them); less what the simulator holds apart for
                    # as long as the runtime holds it: the input gradient, the output sent on, the loss
                    held_apart = gin + m["out"][s] + m["lkeep"][s]
                    m["keep"][s] = max(0, m["act"][s] + (mem.live_bytes - before) - held_apart)
                else:
                    _, g = chain.backward(s, grad)
                    m["pB"][s] = mem.peak_bytes - before
                    m["gin"][s] = _nbytes(g) if g is not None else 0
                    if s == n - 1:  # the chain still holds the loss, as the schedule does until the step ends
                        m["lkeep"][s] = max(0, mem.live_bytes - start_of[s] - m["gin"][s])
                grad = g
            if split:
                for s in reversed(range(n)):
                    before = mem.reset_peak()
                    chain.backward_weight(s, groups[s], grads_in[s])
                    m["pW"][s] = mem.peak_bytes - before
            del chain, grad, groups, grads_in
    return m


def _timed_reduce_grad(stage: Any) -> float:
    """One ``REDUCE_GRAD``: every weight gradient of ``stage`` divided in place, as the runtime's ``scale_grads`` does."""
    t0 = time.perf_counter()
    for p in stage.parameters():
        if p.grad is not None:
            p.grad.div_(2)
    return time.perf_counter() - t0


def measure_stage_costs(stages: Sequence[Any], microbatch: Any, target: Any, loss_fn: Callable[..., Any],
                        repeats: int = 5, warmup: int = 1) -> Tuple[StageCost, ...]:
    """Each stage's :class:`StageCost` for one micro-batch, measured in this process.

    Parameters
    ----------
    stages : sequence of torch.nn.Module
        The stage modules in order (e.g. :func:`split_module`, or the submodules
        ``torch.distributed.pipelining.pipeline`` splits).
    microbatch, target : torch.Tensor
        One micro-batch of input and its target.
    loss_fn : callable
        ``loss_fn(output, target)``, as given to the schedule.
    repeats, warmup : int
        Timed passes (the median is kept) and untimed ones before them.

    Returns
    -------
    tuple of StageCost

    Notes
    -----
    Times are wall-clock on this thread with this process's ``torch.get_num_threads()``;
    ``reduce_grad_s`` divides the gradients the passes made, as the runtime's ``scale_grads``.
    Memory is :class:`~autosched.pp.memory.LiveTensorBytes` over one pass; the weights'
    gradients are made first and zeroed in place, so they are not counted (as in a
    training loop whose ``zero_grad(set_to_none=False)`` keeps them).

    Examples
    --------
    >>> import torch
    >>> stages = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)]
    >>> first, last = measure_stage_costs(stages, torch.randn(4, 8), torch.randn(4, 2), torch.nn.functional.mse_loss,
    ...                                   repeats=1, warmup=0)
    >>> first.loss_s == 0.0 < last.loss_s, first.output_bytes, last.grad_input_bytes  # 4 x 8 float32 each way
    (True, 128, 128)
    """
    if repeats < 1 or warmup < 0:
        raise PPError("bad_value", "repeats", repeats, detail="repeats >= 1 and warmup >= 0")
    runs: Dict[str, List[Dict[str, List[float]]]] = {"full": [], "split": []}
    for i in range(warmup + repeats):
        for mode in ("full", "split"):
            t = _timed_pass(stages, microbatch, target, loss_fn, split=(mode == "split"))
            if i >= warmup:
                runs[mode].append(t)
    reduce = [statistics.median(_timed_reduce_grad(st) for _ in range(warmup + repeats)) for st in stages]
    for st in stages:  # the gradients exist (made above): zeroed in place, they stay out of the memory figures
        for p in st.parameters():
            if p.grad is not None:
                p.grad.zero_()
    mem = _memory_pass(stages, microbatch, target, loss_fn)
    n = len(stages)

    def med(mode: str, kind: str, s: int) -> float:
        return statistics.median(r[kind][s] for r in runs[mode])

    out = []
    for s in range(n):
        last = s == n - 1
        out.append(StageCost(
            forward_s=med("full", "F", s), backward_s=med("full", "B", s), backward_input_s=med("split", "I", s),
            backward_weight_s=med("split", "W", s), loss_s=med("full", "LOSS", 0) if last else 0.0,
            activation_bytes=mem["act"][s], weight_keep_bytes=mem["keep"][s],
            output_bytes=mem["out"][s], grad_input_bytes=mem["gin"][s],
            loss_keep_bytes=min(mem["lkeep"][s], mem["act"][s]), forward_peak_bytes=mem["pF"][s],
            backward_peak_bytes=mem["pB"][s], backward_input_peak_bytes=mem["pI"][s],
            backward_weight_peak_bytes=mem["pW"][s], reduce_grad_s=reduce[s]))
    for st in stages:
        for p in st.parameters():
            if p.grad is not None:
                p.grad.zero_()
    return tuple(out)


def _trimmed_mean(values: Sequence[float], cut: float = 0.1) -> float:
    """The mean without the ``cut`` share of values at each end: a sum's expectation, robust to a stray outlier."""
    v = sorted(values)
    k = int(len(v) * cut)
    v = v[k:len(v) - k] or v
    return sum(v) / len(v)


def _busy_work(rank: int, target_s: float) -> Callable[[], Any]:
    """A computation of about ``target_s`` on this thread (matmuls, as a stage runs)."""
    import torch

    g = torch.Generator().manual_seed(rank)
    w, x = torch.randn(256, 256, generator=g), torch.randn(64, 256, generator=g)

    def chunk(k: int) -> Any:
        y = x
        for _ in range(k):
            y = torch.tanh(y @ w)
        return y

    chunk(4)
    t0 = time.perf_counter()
    chunk(16)
    per = max(1e-7, (time.perf_counter() - t0) / 16)
    k = max(1, int(round(target_s / per)))
    return lambda: chunk(k)


def measure_p2p(group: Any = None, sizes: Sequence[int] = (4, 1 << 20), repeats: int = 20,
                busy_s: float = 1e-3, busy_bytes: int = 1 << 17) -> P2PCost:
    """The link's :class:`P2PCost`, measured by ranks 0 and 1 of ``group``.

    Every rank of the group calls it (the others wait); every rank gets the same figures.

    * ``latency_s`` and ``seconds_per_byte``: one-way time is half a ping-pong's round
      trip between otherwise idle ranks, fitted as ``latency + bytes * seconds_per_byte``
      over ``sizes`` (medians of ``repeats``).
    * ``post_s``: both ranks compute ``2 * busy_s`` seconds, once alone and once while they
      exchange ``busy_bytes`` each way (receive posted, ``busy_s`` of compute, send posted,
      ``busy_s`` of compute, both waited), aligned by a round trip. What the exchange adds,
      halved (a send and a receive each), is the cost of one post while the ranks compute:
      a trimmed mean over ``repeats`` and both ranks, since a step adds up every post's.
      Pass the size of the activations the pipeline sends.
    """
    import torch
    import torch.distributed as dist

    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    fit = [0.0, 0.0, 0.0]
    if world >= 2 and rank in (0, 1):
        peer = dist.get_global_rank(group, 1 - rank) if group is not None else 1 - rank
        one_way = []
        for n in sizes:
            buf = torch.zeros(max(1, n // 4), dtype=torch.float32)
            times = []
            for i in range(repeats + 2):
                t0 = time.perf_counter()
                if rank == 0:
                    dist.send(buf, peer, group=group)
                    dist.recv(buf, peer, group=group)
                else:
                    dist.recv(buf, peer, group=group)
                    dist.send(buf, peer, group=group)
                if i >= 2:
                    times.append((time.perf_counter() - t0) / 2)
            one_way.append((buf.numel() * 4, statistics.median(times)))
        (b0, t0_), (b1, t1) = one_way[0], one_way[-1]
        per_byte = max(0.0, (t1 - t0_) / (b1 - b0)) if b1 > b0 else 0.0
        fit = [max(0.0, t0_ - b0 * per_byte), per_byte, _busy_post_s(group, peer, busy_bytes, repeats, busy_s)]
    post = torch.tensor([fit[2]], dtype=torch.float64)
    dist.all_reduce(post, group=group)  # ranks 0 and 1 each measured theirs; the others add 0
    fit_t = torch.tensor(fit[:2], dtype=torch.float64)
    dist.broadcast(fit_t, dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return P2PCost(float(fit_t[0]), float(fit_t[1]), dist.get_backend(group), max(0.0, float(post[0]) / 2))


def _busy_post_s(group: Any, peer: int, nbytes: int, repeats: int, busy_s: float) -> float:
    """:func:`measure_p2p`'s ``post_s`` on this rank (see there)."""
    import torch
    import torch.distributed as dist

    work = _busy_work(dist.get_rank(group), busy_s)
    token = torch.zeros(1)

    def align() -> None:  # a blocking round trip: both ranks leave it within a one-way latency
        if dist.get_rank(group) == 0:
            dist.send(token, peer, group=group)
            dist.recv(token, peer, group=group)
        else:
            dist.recv(token, peer, group=group)
            dist.send(token, peer, group=group)

    added = []
    out, into = torch.ones(max(1, nbytes // 4)), torch.zeros(max(1, nbytes // 4))
    for i in range(repeats + 2):
        align()
        t0 = time.perf_counter()
        work()
        work()
        alone = time.perf_counter() - t0
        align()
        t0 = time.perf_counter()
        recv = dist.irecv(into, peer, group=group)
        work()
        send = dist.isend(out, peer, group=group)
        work()
        send.wait()
        recv.wait()
        if i >= 2:
            added.append((time.perf_counter() - t0 - alone) / 2)
    return _trimmed_mean(added)
