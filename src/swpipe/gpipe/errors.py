"""What goes wrong in swpipe.gpipe, as exception classes whose facts are fields.

Each class subclasses the built-in exception torchgpipe raised in the same
situation (``ValueError``, ``TypeError``, ``IndexError``, ``RuntimeError``), so
code written against torchgpipe's contract catches them unchanged; the
fields say which argument, layer, partition or skip name is at fault, and
``fix`` says what to do.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

__all__ = ["GPipeArgumentError", "ModuleTypeError", "ModuleStructureError", "TooFewDevicesError", "InputTypeError",
           "OutputTypeError", "SkipDeclarationError", "SkipLayoutError", "ProfilingError"]


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
