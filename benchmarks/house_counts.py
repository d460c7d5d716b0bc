"""The house counts of issue 40: what a reader of the tests and the public API trips over, counted.

Each count is read from the source (``ast``) or from the imported package, never from a list kept by hand:

=============================  =========================================================================  =====
count                          what is counted                                                            limit
=============================  =========================================================================  =====
``prose_matches``              checks in ``tests/`` that compare a multi-word string: an ``assert``       20
                               comparing with (``in``, ``==``, ``startswith``) a string literal of two
                               or more words, and a ``pytest.raises``/``pytest.warns(match=...)`` whose
                               pattern holds two or more words
``private_accesses``           lines in ``tests/`` that read a private attribute (``obj._x``,           11
                               ``getattr(obj, "_x")``) or import a private name or module
                               (``from x import _y``, ``from x._y import z``), outside comments
``multi_base_classes``         classes under ``src/`` with more than one base defined in the project      0
``wide_public_functions``      functions and methods of ``swpipe.__all__`` with more than 8 parameters    0
                               (``self`` not counted; a dataclass's generated ``__init__`` is its fields,
                               not a function, and is not counted)
``any_parameters``             parameters under ``src/`` annotated exactly ``Any``                        -
``single_letter_options``      signatures under ``src/`` with a one-letter parameter annotated with an     0
                               options class (``Constraints``, ``SolverOptions``, ``VerifyOptions``, ...)
``workloads_imports``          modules of the library (``swpipe_core``, ``autosched``, ``swpipe.*`` but   0
                               the demo's ``workloads``, ``commands`` and ``cli``) importing
                               ``swpipe.workloads`` or ``examples``
``dir_not_all``                names ``dir(swpipe)`` and ``sorted(swpipe.__all__)`` do not share          0
``unmarked_sleeps``            ``sleep`` calls in ``tests/`` (``time.sleep``, ``sleep``, a clock's)       0
                               with no comment saying ``workload`` on their line or the three above: a
                               sleep is a task's work, never a way to order threads (events do that)
``timed_asserts``              ``assert`` statements in ``tests/`` that read the wall clock: a call of    0
                               ``perf_counter``, ``monotonic``, ``time`` or ``thread_time``, or a name
                               the same function assigned from one (a duration compared in a unit test
                               fails on a loaded machine: a ``FakeClock`` or a benchmark instead)
=============================  =========================================================================  =====

Run it from the repository root (``PYTHONPATH=src``)::

    python benchmarks/house_counts.py            # the counts, one line each, the limit beside
    python benchmarks/house_counts.py --list     # and every place counted, as path:line
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import inspect
import pathlib
import re
import sys
from dataclasses import is_dataclass
from typing import Dict, Iterator, List, Optional, Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
TESTS = ROOT / "tests"
PACKAGES = ("swpipe", "swpipe_core", "autosched")
OPTION_CLASSES = {"Constraints", "SolverOptions", "VerifyOptions", "DropInOptions", "AutoOptions"}
DEMO_MODULES = ("swpipe/workloads/", "swpipe/commands/", "swpipe/cli.py", "swpipe/__main__.py")
LIMITS = {"prose_matches": 20, "private_accesses": 11, "multi_base_classes": 0, "wide_public_functions": 0,
          "single_letter_options": 0, "workloads_imports": 0, "dir_not_all": 0, "unmarked_sleeps": 0,
          "timed_asserts": 0}
ARITHMETIC = {"abs", "max", "min", "sum", "round", "float", "int", "approx", "fsum", "median", "mean", "fmean"}
CLOCK_READS = {"perf_counter", "monotonic", "time", "thread_time", "process_time", "perf_counter_ns", "monotonic_ns"}
MAX_PARAMETERS = 8
# a word: letters (an apostrophe or hyphen inside), once punctuation around it is stripped; a quoted name is no word
_WORD = re.compile(r"[A-Za-z]+(?:['-][A-Za-z]+)*")
_AROUND = "()[]{}.,:;!?|<>*+"


class Count:
    """One count: its name, its limit (``None``: reported only) and every place it was found.

    (A plain class: the script is loaded by path, outside ``sys.modules``, where a dataclass cannot be made.)
    """

    def __init__(self, name: str, places: Optional[List[str]] = None) -> None:
        self.name, self.places = name, list(places or [])

    @property
    def value(self) -> int:
        return len(self.places)

    @property
    def limit(self) -> Optional[int]:
        return LIMITS.get(self.name)


def python_files(folder: pathlib.Path) -> List[pathlib.Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


@functools.lru_cache(maxsize=None)
def _parse(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _where(path: pathlib.Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{node.lineno}"


def _literal_text(node: ast.AST) -> str:
    """The literal text of a string expression: constants joined, an f-string's values as ``{}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return _literal_text(node.left) + " " + _literal_text(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "escape" \
            and node.args:  # re.escape("...")
        return _literal_text(node.args[0])
    return ""


def _is_word(token: str) -> bool:
    core = token.strip(_AROUND)
    return len(core) > 1 and _WORD.fullmatch(core) is not None


def is_prose(text: str) -> bool:
    """Two words in a row: what reads as a sentence rather than a name, a number, a repr or a symbol.

    >>> is_prose("drain"), is_prose("corollary-1"), is_prose("not callable"), is_prose("('A', 'B', 1)")
    (False, False, True, False)
    >>> is_prose("LDS = 1"), is_prose(r"\\['A'\\] is not"), is_prose("TorchRec's pipeline")
    (False, True, True)
    """
    tokens = re.sub(r"\{\}", " 0 ", re.sub(r"\\.", " ", text)).split()  # an escape or a placeholder is no word
    words = [_is_word(t) for t in tokens]
    return any(a and b for a, b in zip(words, words[1:]))


def _is_pytest_call(node: ast.Call, names: Sequence[str]) -> bool:
    func = node.func
    return isinstance(func, ast.Attribute) and func.attr in names and isinstance(func.value, ast.Name) \
        and func.value.id == "pytest"


def _prose_in_assert(test: ast.AST) -> bool:
    for node in ast.walk(test):
        if isinstance(node, ast.Compare):
            if any(is_prose(_literal_text(side)) for side in [node.left, *node.comparators]):
                return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "endswith", "count", "find", "index", "search", "match"):
            if any(is_prose(_literal_text(a)) for a in node.args[:1]):
                return True
    return False


def prose_matches(files: Sequence[pathlib.Path]) -> Count:
    count = Count("prose_matches")
    for path in files:
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Assert) and _prose_in_assert(node.test):
                count.places.append(_where(path, node))
            elif isinstance(node, ast.Call) and _is_pytest_call(node, ("raises", "warns")):
                for kw in node.keywords:
                    if kw.arg == "match" and is_prose(_literal_text(kw.value)):
                        count.places.append(_where(path, node))
    return count


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_accesses(files: Sequence[pathlib.Path]) -> Count:
    """Private attribute reads (not the test's own ``self._x``) and private imports."""
    count = Count("private_accesses")
    for path in files:
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Attribute) and _private(node.attr) \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                count.places.append(_where(path, node))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                    and _private(node.args[1].value):
                count.places.append(_where(path, node))
            elif isinstance(node, ast.ImportFrom) and node.module:
                module_private = any(_private(part) for part in node.module.split("."))
                name_private = any(_private(a.name) for a in node.names)
                if (module_private or name_private) and node.module != "conftest":
                    count.places.append(_where(path, node))
            elif isinstance(node, ast.Import):
                if any(_private(part) for a in node.names for part in a.name.split(".")):
                    count.places.append(_where(path, node))
    count.places = sorted(set(count.places), key=count.places.index)  # a line counts once
    return count


def _classes(files: Sequence[pathlib.Path]) -> Iterator[tuple]:
    for path in files:
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.ClassDef):
                yield path, node


def _base_name(base: ast.AST) -> str:
    if isinstance(base, ast.Subscript):
        base = base.value
    if isinstance(base, ast.Attribute):
        return base.attr
    return base.id if isinstance(base, ast.Name) else ""


def multi_base_classes(files: Sequence[pathlib.Path]) -> Count:
    count = Count("multi_base_classes")
    project = {node.name for _, node in _classes(files)}
    for path, node in _classes(files):
        own = [_base_name(b) for b in node.bases if _base_name(b) in project]
        if len(own) > 1:
            count.places.append(f"{_where(path, node)} {node.name}({', '.join(own)})")
    return count


def _parameters(fn) -> Optional[int]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return sum(1 for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


def _members(cls) -> Iterator[tuple]:
    """A class's public methods (and ``__init__`` unless a dataclass made it) as ``(name, parameters)``."""
    for name, raw in vars(cls).items():
        if name.startswith("_") and not (name == "__init__" and not is_dataclass(cls)):
            continue
        fn = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
        n = _parameters(fn) if inspect.isfunction(fn) else None
        if n is not None:
            yield name, n - (0 if isinstance(raw, staticmethod) else 1)


def wide_public_functions() -> Count:
    import swpipe

    count = Count("wide_public_functions")
    for name in swpipe.__all__:
        obj = getattr(swpipe, name)
        found = [(f"{name}.{m}", n) for m, n in _members(obj)] if inspect.isclass(obj) \
            else [(name, _parameters(obj))] if inspect.isfunction(obj) else []
        count.places += [f"{label} ({n} parameters)" for label, n in found if n is not None and n > MAX_PARAMETERS]
    return count


def _signatures(files: Sequence[pathlib.Path]) -> Iterator[tuple]:
    for path in files:
        for node in ast.walk(_parse(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                yield path, node, [*a.posonlyargs, *a.args, *a.kwonlyargs]


def _annotation(arg: ast.arg) -> str:
    return ast.unparse(arg.annotation) if arg.annotation is not None else ""


def any_parameters(files: Sequence[pathlib.Path]) -> Count:
    count = Count("any_parameters")
    for path, node, args in _signatures(files):
        count.places += [f"{_where(path, node)} {node.name}({a.arg})" for a in args
                         if _annotation(a).strip("'\"") in ("Any", "typing.Any")]
    return count


def single_letter_options(files: Sequence[pathlib.Path]) -> Count:
    count = Count("single_letter_options")
    for path, node, args in _signatures(files):
        short = [a.arg for a in args if len(a.arg) == 1
                 and set(re.findall(r"[A-Za-z_]+", _annotation(a))) & OPTION_CLASSES]
        if short:
            count.places.append(f"{_where(path, node)} {node.name}({', '.join(short)})")
    return count


def _library(files: Sequence[pathlib.Path]) -> List[pathlib.Path]:
    return [p for p in files if not str(p.relative_to(SRC)).startswith(DEMO_MODULES)]


def workloads_imports(files: Sequence[pathlib.Path]) -> Count:
    count = Count("workloads_imports")
    for path in _library(files):
        for node in ast.walk(_parse(path)):
            modules = []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            if any(m == "swpipe.workloads" or m.startswith(("swpipe.workloads.", "examples")) for m in modules):
                count.places.append(_where(path, node))
    return count


def _comment_says(path: pathlib.Path, line: int, word: str) -> bool:
    """Whether a comment on ``line`` or the three lines above it holds ``word``."""
    lines = path.read_text().splitlines()
    return any("#" in text and word in text.split("#", 1)[1] for text in lines[max(0, line - 4):line])


def unmarked_sleeps(files: Sequence[pathlib.Path]) -> Count:
    count = Count("unmarked_sleeps")
    for path in files:
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Call) and ((isinstance(node.func, ast.Attribute) and node.func.attr == "sleep")
                                               or (isinstance(node.func, ast.Name) and node.func.id == "sleep")) \
                    and not _comment_says(path, node.lineno, "workload"):
                count.places.append(_where(path, node))
    return count


def _reads_clock(node: ast.AST, names: Sequence[str] = ()) -> bool:
    """Whether the value of ``node`` is a clock reading or arithmetic on one: a call of a wall or CPU clock
    (``time.perf_counter()``, ``perf_counter()``, ...) or one of ``names``, outside the arguments of other calls
    than arithmetic ones (``f(time.perf_counter())`` is whatever ``f`` returns, ``abs(t1 - t0)`` a duration)."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in CLOCK_READS and not node.args:
            return True
        return name in ARITHMETIC and any(_reads_clock(a, names) for a in node.args)
    if isinstance(node, ast.Name):
        return node.id in names
    return any(_reads_clock(child, names) for child in ast.iter_child_nodes(node))


def timed_asserts(files: Sequence[pathlib.Path]) -> Count:
    count = Count("timed_asserts")
    for path in files:
        for fn in ast.walk(_parse(path)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            timed: List[str] = []  # names assigned from a clock read, or from arithmetic on one (t0 -> elapsed)
            assigns = [node for node in ast.walk(fn) if isinstance(node, ast.Assign)]
            for _ in range(len(assigns)):  # to a fixed point: a chain of assignments in any order
                more = [t.id for node in assigns if _reads_clock(node.value, timed)
                        for t in node.targets if isinstance(t, ast.Name) and t.id not in timed]
                if not more:
                    break
                timed += more
            for node in ast.walk(fn):
                if isinstance(node, ast.Assert) and _reads_clock(node.test, timed):
                    count.places.append(_where(path, node))
    count.places = sorted(set(count.places), key=count.places.index)
    return count


def dir_not_all() -> Count:
    import swpipe

    listed, public = set(dir(swpipe)), set(swpipe.__all__)
    return Count("dir_not_all", [f"only in dir(swpipe): {n}" for n in sorted(listed - public)]
                 + [f"only in swpipe.__all__: {n}" for n in sorted(public - listed)])


def counts() -> Dict[str, Count]:
    """Every count of the module docstring's table, by name."""
    tests, src = python_files(TESTS), python_files(SRC)
    found = [prose_matches(tests), private_accesses(tests), multi_base_classes(src), wide_public_functions(),
             any_parameters(src), single_letter_options(src), workloads_imports(src), dir_not_all(),
             unmarked_sleeps(tests), timed_asserts(tests)]
    return {c.name: c for c in found}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Count]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every place counted")
    args = parser.parse_args(argv)
    found = counts()
    width = max(map(len, found))
    for name, c in found.items():
        limit = "-" if c.limit is None else c.limit
        verdict = "" if c.limit is None else ("ok" if c.value <= c.limit else "over")
        print(f"{name:<{width}}  {c.value:>4}  limit {limit:>3}  {verdict}")
        if args.list:
            for place in c.places:
                print(f"    {place}")
    return found


if __name__ == "__main__":
    sys.path.insert(0, str(SRC))
    importlib.invalidate_caches()
    main()
