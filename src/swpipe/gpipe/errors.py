"""What goes wrong in swpipe.gpipe, as exception classes whose facts are fields.

Each class subclasses the built-in exception torchgpipe raised in the same
situation (``ValueError``, ``TypeError``, ``IndexError``, ``RuntimeError``), so
code written against torchgpipe's contract catches them unchanged; the
fields say which argument, layer, partition or skip name is at fault, and
``fix`` says what to do.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

__all__ = ["GPipeArgumentError", "LossFunctionError", "StepModeError", "ModuleTypeError", "ModuleStructureError",
           "TooFewDevicesError", "InputTypeError", "OutputTypeError", "BatchDimensionError", "PartitionTimeoutError",
           "SkipDeclarationError", "SkipLayoutError", "ProfilingError"]


class GPipeArgumentError(ValueError):
    """An argument of :class:`~swpipe.gpipe.GPipe` (or of a balance function) has a value it cannot take.

    Attributes
    ----------
    argument : str
        The argument's name (``"balance"``, ``"chunks"``, ``"checkpoint"``...).
    value : Any
        What was given.
    fix : str
        What to give instead.

    Examples
    --------
    >>> err = GPipeArgumentError("chunks", 0, "number of chunks must be positive integer", "give chunks >= 1")
    >>> err.argument, err.value, isinstance(err, ValueError)
    ('chunks', 0, True)
    """

    def __init__(self, argument: str, value: Any, what: str, fix: str = "") -> None:
        self.argument, self.value, self.fix = argument, value, fix
        super().__init__(f"{argument}={value!r}: {what}" + (f"; {fix}" if fix else ""))


class LossFunctionError(GPipeArgumentError):
    """``loss_fn`` of :meth:`~swpipe.gpipe.GPipe.step` returned no scalar tensor that backward can start from.

    Attributes
    ----------
    argument : str
        ``"loss_fn"``.
    value : Any
        What it returned (a tensor as its shape).
    problem : str
        ``"not_tensor"`` (a float, a tuple...), ``"not_scalar"`` (more than
        one element: not reduced), ``"no_grad"`` (computed without the
        output's graph: nothing to back-propagate).
    microbatch : int
        The micro-batch it was called on.
    fix : str
        What to return instead.

    Examples
    --------
    >>> err = LossFunctionError("not_tensor", 0.5, 0)
    >>> err.argument, err.problem, err.microbatch, isinstance(err, ValueError)
    ('loss_fn', 'not_tensor', 0, True)
    """

    _WHAT = {"not_tensor": ("returned a {}, not a tensor",
                            "return a scalar tensor computed from the output, e.g. nn.functional.mse_loss(output, "
                            "target), not loss.item() or a Python number"),
             "not_scalar": ("returned a tensor of shape {}, not a scalar",
                            "reduce it to one number (.mean() or .sum(); step's reduction= says how micro-batches "
                            "combine)"),
             "no_grad": ("returned a tensor that does not depend on the output (requires_grad=False)",
                         "compute the loss from the output it is given, without .detach(), .item() or "
                         "torch.no_grad()")}

    def __init__(self, problem: str, returned: Any, microbatch: int) -> None:
        what, fix = self._WHAT[problem]
        shown = type(returned).__name__ if problem == "not_tensor" else tuple(getattr(returned, "shape", ()))
        super().__init__("loss_fn", shown, f"on micro-batch {microbatch} it " + what.format(shown), fix)
        self.problem, self.microbatch = problem, microbatch


class StepModeError(RuntimeError):
    """:meth:`~swpipe.gpipe.GPipe.step` was called where no gradient is wanted.

    A step computes gradients; under ``torch.no_grad()``, ``torch.inference_mode()``
    or with the GPipe in ``eval()`` mode it would compute them anyway (and
    accumulate them into ``.grad``), so it is refused.

    Attributes
    ----------
    mode : str
        ``"no_grad"``, ``"inference_mode"`` or ``"eval"``.
    fix : str
        What to do instead.

    Examples
    --------
    >>> err = StepModeError("eval")
    >>> err.mode, isinstance(err, RuntimeError)
    ('eval', True)
    """

    _FIX = {"no_grad": "call step outside torch.no_grad(); for a loss without gradients, compute "
                       "loss_fn(gpipe(input), target) under torch.no_grad()",
            "inference_mode": "call step outside torch.inference_mode(); for a loss without gradients, compute "
                              "loss_fn(gpipe(input), target) under torch.inference_mode()",
            "eval": "call gpipe.train() before step; to train with some layers in eval mode (frozen batch norm, "
                    "dropout off), call .eval() on those layers (gpipe[k].eval()), not on the GPipe"}

    def __init__(self, mode: str) -> None:
        self.mode, self.fix = mode, self._FIX[mode]
        where = "in eval() mode" if mode == "eval" else f"under torch.{mode}()"
        super().__init__(f"GPipe.step called {where}: a step computes gradients; {self.fix}")


class ModuleTypeError(TypeError):
    """The module is not an ``nn.Sequential``, so it has no layers to split.

    Attributes
    ----------
    type : type
        The module's type.
    """

    def __init__(self, found: type) -> None:
        self.type = found
        super().__init__(f"module must be nn.Sequential to be partitioned, got {found.__name__}; "
                         "write the model as nn.Sequential(layer, layer, ...)")


class ModuleStructureError(ValueError):
    """The layers cannot be split: one child appears twice, or two children share a parameter.

    Attributes
    ----------
    problem : str
        ``"duplicate_children"`` or ``"duplicate_parameters"``.
    layers : tuple of str
        The names of the layers involved.
    """

    def __init__(self, problem: str, layers: Sequence[str], message: str) -> None:
        self.problem, self.layers = problem, tuple(layers)
        super().__init__(message)


class TooFewDevicesError(IndexError):
    """Fewer devices than partitions.

    Attributes
    ----------
    partitions : int
    devices : int
    """

    def __init__(self, partitions: int, devices: int) -> None:
        self.partitions, self.devices = partitions, devices
        super().__init__(f"too few devices to hold the given partitions: {partitions} partitions, {devices} devices; "
                         f"pass devices=[...] with one device per partition (e.g. devices=['cpu'] * {partitions})")


class InputTypeError(TypeError):
    """``forward`` (or a partition) got or returned something other than a tensor or a tuple of tensors.

    Attributes
    ----------
    where : str
        ``"input"``, ``"target"`` or ``"partition <j> output"``.
    index : int or None
        The position in the tuple of the bad element (``None``: the value itself).
    type : type
        The type found.
    """

    def __init__(self, where: str, index: Optional[int], found: type, what: str = "") -> None:
        self.where, self.index, self.type = where, index, found
        at = where if index is None else f"{where}[{index}]"
        super().__init__(what or f"{at} is a {found.__name__}: expected Tensor or a tuple of tensors "
                                 "(swpipe.gpipe splits tensors into micro-batches along dimension 0)")


class OutputTypeError(InputTypeError):
    """A partition returned something other than a tensor or a tuple of tensors (``where`` names it)."""


class BatchDimensionError(RuntimeError):
    """With more than one micro-batch, a partition's output does not keep its micro-batch's size in dimension 0.

    GPipe joins the micro-batches' outputs along dimension 0, so every layer
    must keep dimension 0 the batch: a layer that sums, flattens or reshapes
    across it gives the module run whole another result than the joined
    micro-batches would. (One micro-batch is the module run whole: no check.)

    Attributes
    ----------
    partition : int
        The first partition whose output changed dimension 0 on this micro-batch.
    microbatch : int
    expected : int
        The micro-batch's size.
    got : int
        Dimension 0 of that partition's output (``-1`` for a 0-dimensional tensor).

    Examples
    --------
    >>> err = BatchDimensionError(1, 0, 2, 1)
    >>> err.partition, err.expected, err.got, isinstance(err, RuntimeError)
    (1, 2, 1, True)
    """

    def __init__(self, partition: int, microbatch: int, expected: int, got: int) -> None:
        self.partition, self.microbatch, self.expected, self.got = partition, microbatch, expected, got
        super().__init__(f"partition {partition} changed the batch dimension on micro-batch {microbatch}: its output "
                         f"has {got if got >= 0 else 'no'} rows in dimension 0 for a micro-batch of {expected} "
                         "samples, so the joined micro-batches would not be the module's output; keep dimension 0 "
                         "the batch in every layer (reduce or reshape across it after GPipe), or give chunks=1")


class PartitionTimeoutError(RuntimeError):
    """A partition ran one micro-batch longer than the GPipe's ``timeout_s``: blocked or slow; the run failed.

    The partition's thread cannot be interrupted: it ends when the layer
    returns.

    Attributes
    ----------
    partition : int
    microbatch : int
    task : str
        ``"forward"``, ``"backward"``, ``"copy"`` (of its inputs onto its
        device) or ``"gradient copy"`` (of its outputs' gradients onto it).
    device : torch.device
        The partition's device.
    timeout_s : float
        The GPipe's ``timeout_s``.

    Examples
    --------
    >>> import torch
    >>> err = PartitionTimeoutError(1, 2, "forward", torch.device("cpu"), 0.5)
    >>> err.partition, err.microbatch, err.task, err.timeout_s
    (1, 2, 'forward', 0.5)
    """

    def __init__(self, partition: int, microbatch: int, task: str, device: Any, timeout_s: float) -> None:
        self.partition, self.microbatch, self.task, self.device = partition, microbatch, task, device
        self.timeout_s = timeout_s
        super().__init__(f"the {task} of partition {partition} ({device}) on micro-batch {microbatch} did not finish "
                         f"within timeout_s={timeout_s:g} s: a layer is blocked or slow; the run was stopped (its "
                         "thread ends when the layer returns). If it is just slow, give it more seconds: "
                         "GPipe(..., timeout_s=...) or gpipe.timeout_s = ...")


class SkipDeclarationError(RuntimeError):
    """A skippable layer stashed or popped a name it did not declare, or left a declared one unused.

    Attributes
    ----------
    layer : str
        The layer's class name.
    name : str
        The skip name.
    problem : str
        ``"stash_undeclared"``, ``"pop_undeclared"``, ``"not_stashed"``, ``"not_popped"`` or
        ``"pop_missing"`` (popped before anything stashed it).
    """

    def __init__(self, layer: str, name: str, problem: str, message: str) -> None:
        self.layer, self.name, self.problem = layer, name, problem
        super().__init__(message)


class SkipLayoutError(TypeError):
    """:func:`~swpipe.gpipe.skip.verify_skippables` found skip declarations that do not pair up.

    Attributes
    ----------
    problems : list of (layer, name, kind)
        ``layer`` is the child's name in the ``nn.Sequential`` (``None`` for a
        name nothing pops), ``kind`` one of ``"both"``, ``"stash_again"``,
        ``"pop_again"``, ``"pop_unstashed"``, ``"never_popped"``.
    """

    def __init__(self, problems: List[Tuple[Optional[str], str, str]], lines: List[str]) -> None:
        self.problems = problems
        super().__init__("one or more pairs of stash and pop do not match:\n\n" + "\n".join(f"  * {l}" for l in lines))


class ProfilingError(ValueError):
    """Profiling for balance cannot run as asked.

    Attributes
    ----------
    problem : str
        ``"has_grad"`` (a parameter already has a gradient: profiling would
        change it), ``"too_few_layers"``.
    parameter : str or None
        The parameter's name for ``"has_grad"``.
    """

    def __init__(self, problem: str, message: str, parameter: Optional[str] = None) -> None:
        self.problem, self.parameter = problem, parameter
        super().__init__(message)
