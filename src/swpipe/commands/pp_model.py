"""What ``swpipe pp --model pkg.module:factory`` trains: the factory's contract (:class:`PPModel`), the factory found
and checked before torchrun starts (:func:`load_model`), and the built-in model (:func:`mlp`) as one such factory.

A factory takes no arguments (the built-in takes its sizes as keywords) and returns a
:class:`PPModel`: the stage modules, or a model and where to cut it, one step's batch
and target, and the loss. It is called on every rank and once per schedule, so it must
build the same initial weights every time (seed torch inside it): :func:`load_model`
calls it twice and refuses one that does not.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["PPModel", "PPModelError", "load_model", "mlp", "BUILTIN_MODEL"]

BUILTIN_MODEL = "swpipe.commands.pp_model:mlp"  # what ``swpipe pp`` trains without --model


class PPModelError(ValueError):
    """A ``--model`` factory that cannot be used.

    Attributes
    ----------
    spec : str
        The ``pkg.module:factory`` string given.
    field : str
        What is wrong: ``"spec"`` (not ``pkg.module:factory``), ``"module"`` (cannot be
        imported), ``"factory"`` (no such name, not callable, or it raised), ``"returned"``
        (not a :class:`PPModel`), a :class:`PPModel` field's name (its value is wrong),
        ``"weights"`` (two calls built different weights).
    detail : str
        What is wrong there and how to fix it.
    """

    def __init__(self, spec: str, field: str, detail: str) -> None:
        super().__init__(f"--model {spec}: {field}: {detail}")
        self.spec, self.field, self.detail = spec, field, detail


@dataclass(frozen=True)
class PPModel:
    """What a ``swpipe pp --model`` factory returns: the model cut into stages, one step's data and the loss.

    Give either ``stages`` (the model already cut: stage ``s`` is ``stages[s]``) or
    ``model`` (a ``torch.nn.Sequential``), cut before each child index in
    ``split_points``, or, without them, into as many even stages as each schedule runs
    (ranks for GPipe and 1F1B, twice that for the others; :func:`~swpipe.pp.split_module`).
    A fixed cut runs the schedules of that many stages only.

    Attributes
    ----------
    batch : torch.Tensor
        One step's input; dimension 0 is split into the micro-batches.
    target : torch.Tensor
        One step's target, split the same way.
    loss_fn : callable
        ``loss_fn(output, target) -> scalar tensor``, per micro-batch.
    stages : sequence of torch.nn.Module, optional
    model : torch.nn.Sequential, optional
    split_points : sequence of int, optional
        With ``model``: the child indices each new stage starts at, increasing, in ``1..len(model) - 1``.
    lr : float
        SGD's learning rate (default 0.05).

    Examples
    --------
    >>> import torch
    >>> from swpipe.pp import PPModel
    >>> def factory() -> PPModel:
    ...     torch.manual_seed(0)
    ...     layers = [torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU()]
    ...     return PPModel(model=torch.nn.Sequential(*layers), split_points=[2], batch=torch.randn(16, 8),
    ...                    target=torch.randn(16, 8), loss_fn=torch.nn.functional.mse_loss)
    >>> [len(stage) for stage in factory().cut(2)]
    [2, 2]
    >>> factory().stage_counts(n_ranks=2), factory().stage_counts(n_ranks=4)
    ((2,), ())
    """

    batch: Any
    target: Any
    loss_fn: Callable[[Any, Any], Any]
    stages: Optional[Sequence[Any]] = None
    model: Optional[Any] = None
    split_points: Optional[Sequence[int]] = None
    lr: float = 0.05

    def problems(self) -> List[Tuple[str, str]]:
        """``(field, what is wrong)`` for each field that cannot be used; empty when all can."""
        import torch

        out = []
        if (self.stages is None) == (self.model is None):
            out.append(("stages", "give either stages=[module, ...] or model=torch.nn.Sequential(...), not both "
                                  "or neither"))
        if self.stages is not None and (len(self.stages) < 2 or
                                        not all(isinstance(m, torch.nn.Module) for m in self.stages)):
            out.append(("stages", "give 2 or more torch.nn.Module, one per stage"))
        if self.model is not None and not isinstance(self.model, torch.nn.Sequential):
            out.append(("model", f"a {type(self.model).__name__}: give a torch.nn.Sequential (its children run in "
                                 "order and are cut between), or the stages themselves as stages="))
        if self.split_points is not None:
            if self.model is None:
                out.append(("split_points", "they cut model=; with stages= the model is already cut: drop them"))
            elif isinstance(self.model, torch.nn.Sequential):
                points = list(self.split_points)
                if not points or points != sorted(set(points)) or points[0] < 1 or points[-1] > len(self.model) - 1:
                    out.append(("split_points", f"{points}: give increasing child indices in 1..{len(self.model) - 1}"))
        for name in ("batch", "target"):
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                out.append((name, "give a tensor whose dimension 0 holds the samples"))
        if not out and self.target.shape[0] != self.batch.shape[0]:
            out.append(("target", f"{self.target.shape[0]} samples, the batch {self.batch.shape[0]}: give one target "
                                  "per sample (both are cut into micro-batches along dimension 0)"))
        if not callable(self.loss_fn):
            out.append(("loss_fn", "give a callable loss_fn(output, target) -> scalar tensor"))
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            out.append(("lr", f"{self.lr!r}: give a number > 0"))
        return out

    @property
    def samples(self) -> int:
        """The samples in one step's batch."""
        return int(self.batch.shape[0])

    def stage_counts(self, n_ranks: int) -> Tuple[int, ...]:
        """The stage counts of PyTorch's schedules on ``n_ranks`` ranks (one or two stages per rank) this model is
        cut into: its own cut's, if it is one of them, or each one up to its children's count."""
        counts = (n_ranks, 2 * n_ranks)
        if self.stages is not None or self.split_points is not None:
            return tuple(k for k in counts if k == self._fixed())
        return tuple(k for k in counts if k <= len(self.model))

    def _fixed(self) -> int:
        return len(self.stages) if self.stages is not None else len(self.split_points or ()) + 1

    def programs(self, n_ranks: int, n_microbatches: int) -> Tuple[Dict[str, Any], Dict[str, str]]:
        """PyTorch's schedules this model runs (``{name: PPProgram}``), and why each other one does not.

        Examples
        --------
        >>> programs, refused = mlp(width=4, depth=2, batch=8).programs(n_ranks=2, n_microbatches=4)
        >>> sorted(programs), refused["Interleaved1F1B"]
        (['1F1B', 'GPipe'], 'its 4 stages: the model has 2 children to cut between')
        """
        from autosched.pp import builtin_programs

        programs, refused = builtin_programs(n_ranks, n_microbatches)
        counts = self.stage_counts(n_ranks)
        fixed = self.stages is not None or self.split_points is not None
        has = f"is cut into {self._fixed()} stages" if fixed else f"has {len(self.model)} children to cut between"
        for name in [n for n, p in programs.items() if p.n_stages not in counts]:
            refused[name] = f"its {programs.pop(name).n_stages} stages: the model {has}"
        return programs, refused

    def cut(self, n_stages: int) -> List[Any]:
        """The model as ``n_stages`` modules, in order (they share this object's parameters)."""
        import torch

        from autosched.pp import split_module  # swpipe.pp exports PPModel: its own names from below it

        if (self.stages is not None or self.split_points is not None) and n_stages != self._fixed():
            raise ValueError(f"the model is cut into {self._fixed()} stages, not {n_stages}")
        if self.stages is not None:
            return list(self.stages)
        if self.split_points is None:
            return split_module(list(self.model), n_stages)
        bounds = [0, *self.split_points, len(self.model)]
        return [torch.nn.Sequential(*list(self.model)[a:b]) for a, b in zip(bounds, bounds[1:])]

    def microbatches(self, n_microbatches: int) -> Tuple[Tuple[Any, ...], Tuple[Any, ...]]:
        """The batch and the target, each cut into ``n_microbatches`` along dimension 0."""
        return self.batch.tensor_split(n_microbatches), self.target.tensor_split(n_microbatches)


def mlp(width: int = 512, depth: int = 8, batch: int = 256, seed: int = 0) -> PPModel:
    """The built-in model: ``depth`` blocks of ``Linear(width, width) + Tanh``, an MSE loss, seeded.

    Examples
    --------
    >>> m = mlp(width=4, depth=4, batch=8)
    >>> len(m.model), m.stage_counts(n_ranks=2), tuple(m.batch.shape)
    (4, (2, 4), (8, 4))
    """
    import torch

    torch.manual_seed(seed)
    blocks = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()) for _ in range(depth)]
    g = torch.Generator().manual_seed(10_000 + seed)
    return PPModel(model=torch.nn.Sequential(*blocks), batch=torch.randn(batch, width, generator=g),
                   target=torch.randn(batch, width, generator=g), loss_fn=torch.nn.functional.mse_loss)


def _factory(spec: str) -> Callable[..., Any]:
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name.isidentifier():
        raise PPModelError(spec, "spec", "give pkg.module:factory, e.g. mymodels.pp:tiny")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `python -m mymodels` would find it there; so does --model
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any error of the user's module: named, with what it raised
        raise PPModelError(spec, "module", f"{module_name} cannot be imported ({type(exc).__name__}: {exc}): "
                                           "put its folder on PYTHONPATH or run from the folder holding it") from exc
    factory = getattr(module, name, None)
    if factory is None:
        raise PPModelError(spec, "factory", f"{module_name} has no {name}")
    if not callable(factory):
        raise PPModelError(spec, "factory", f"{module_name}.{name} is a {type(factory).__name__}, not callable: "
                                            "give a function returning a PPModel")
    return factory


def _call(spec: str, factory: Callable[..., Any], options: Dict[str, Any]) -> PPModel:
    try:
        model = factory(**options)
    except Exception as exc:  # the user's code failed: say where, with what it raised
        raise PPModelError(spec, "factory", f"calling it raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, PPModel):
        raise PPModelError(spec, "returned", f"a {type(model).__name__}: return swpipe.pp.PPModel(stages=... or "
                                             "model=..., batch=..., target=..., loss_fn=...)")
    for field, what in model.problems():
        raise PPModelError(spec, field, what)
    return model


def import_root(spec: str) -> str:
    """The ``sys.path`` folder ``spec``'s top-level package was imported from ("" for an installed one or swpipe's)."""
    top = sys.modules.get(spec.partition(":")[0].split(".")[0])
    path = getattr(top, "__file__", None)
    if not path or top is None or top.__name__ == "swpipe":
        return ""
    path = os.path.dirname(os.path.abspath(path))
    return os.path.dirname(path) if os.path.basename(path) == top.__name__ else path


def load_model(spec: str, options: Optional[Dict[str, Any]] = None, check_twice: bool = False) -> PPModel:
    """``spec`` (``"pkg.module:factory"``) imported and called with ``options``; its :class:`PPModel`.

    ``check_twice``: call it twice and refuse different weights or data (every rank and
    every schedule calls it and must start from the same weights).

    Raises
    ------
    PPModelError
        Its ``field`` says what is wrong: the string, the import, the factory, what it
        returned, a field of the :class:`PPModel`, or weights that differ between calls.

    Examples
    --------
    >>> load_model("swpipe.commands.pp_model:mlp", {"width": 4, "depth": 4, "batch": 8}).samples
    8
    >>> load_model("swpipe.commands.pp_model:nothing")
    Traceback (most recent call last):
    ...
    swpipe.commands.pp_model.PPModelError: --model swpipe.commands.pp_model:nothing: factory: swpipe.commands.pp_model has no nothing
    """
    factory = _factory(spec)
    model = _call(spec, factory, dict(options or {}))
    if check_twice:
        again = _call(spec, factory, dict(options or {}))
        if not _same(model, again):
            raise PPModelError(spec, "weights", "two calls built different weights or data: every rank and every "
                                                "schedule calls the factory, so seed torch inside it "
                                                "(torch.manual_seed) and build the batch from that seed")
    return model


def _same(a: PPModel, b: PPModel) -> bool:
    import torch

    def tensors(m: PPModel) -> List[Any]:
        parts = m.stages if m.stages is not None else [m.model]
        return [m.batch, m.target] + [t for part in parts for t in part.state_dict().values()]

    left, right = tensors(a), tensors(b)
    return len(left) == len(right) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(left, right))
