"""No import cycle among the project's modules (issue 46.6), whatever kind of import closes it.

The graph has one node per module under ``src/`` (a package is its ``__init__``) and an edge ``a -> b`` when
``a``'s code imports ``b``, read from the source with :mod:`ast` (:func:`test_imports.import_statements`):

* every ``import`` and ``from ... import``, at module level, inside functions and under ``if TYPE_CHECKING:``
  (a type-only import is still a dependency of the module that names the type);
* ``import a.b.c`` is an edge to ``a.b.c``, and ``from a.b import c`` to ``a.b.c`` when that is a module, else to
  ``a.b`` (its ``__init__``, which defines or re-exports ``c``); relative imports are resolved first. The parent
  packages Python also runs (``a``, ``a.b``) are not edges: they are how modules are found, not what is used;
* a package ``__init__`` that imports its submodules has an edge to each, like any module;
* a computed ``importlib.import_module(...)`` (the lazy ``__getattr__`` exports of ``swpipe``, ``autosched`` and
  ``swpipe_core``, the CLI's sub-commands, the ``"module:name"`` references of the options' error): an edge to
  every project module a string literal of that module names, absolute, relative to its package when the call
  is anchored to the package, or after the call's literal prefix. A lazy import is an import.

docs/architecture.md ("Import rules") states the rule.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import networkx as nx

from test_imports import import_statements

SRC = Path(__file__).resolve().parents[1] / "src"


def project_modules(src: Path = SRC) -> Dict[str, Path]:
    """Every module under ``src`` by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _owner(name: str, modules: Set[str]) -> str:
    """The project module a dotted name lives in (the longest prefix that is one), or ``""``."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _computed_imports(tree: ast.AST, package: str, modules: Set[str]) -> Set[str]:
    """The modules a computed ``import_module`` call of this source may load: the string literals of the source that
    name a project module, absolutely, relative to ``package`` when a call is anchored to it (``__name__`` or
    ``__package__`` as second argument), or after a call's literal f-string prefix; ``"module:name"`` by its module."""
    prefixes = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
                and node.args and not isinstance(node.args[0], ast.Constant)):
            continue
        arg = node.args[0]
        head = arg.values[0].value if (isinstance(arg, ast.JoinedStr) and arg.values
                                        and isinstance(arg.values[0], ast.Constant)) else ""
        if len(node.args) > 1 or head.startswith("."):
            prefixes.add(package + "." + head.lstrip("."))
        else:
            prefixes.add(head)
    found = set()
    for prefix in prefixes:
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value:
                name = prefix + node.value.partition(":")[0]
                if name in modules:
                    found.add(name)
    return found


def import_graph(src: Path = SRC) -> nx.DiGraph:
    """The project's modules and what each imports (see the module docstring)."""
    modules = project_modules(src)
    names = set(modules)
    graph = nx.DiGraph()
    for module, path in modules.items():
        graph.add_node(module)
        is_package = path.name == "__init__.py"
        package = module if is_package else module.rpartition(".")[0]
        source = path.read_text(encoding="utf-8")
        targets: List[str] = []
        for base, imported in import_statements(source, f"{module}.__init__" if is_package else module):
            if not imported:
                targets.append(base)
            targets += [f"{base}.{n}" if f"{base}.{n}" in names else base for n in imported]
        targets += sorted(_computed_imports(ast.parse(source), package, names))
        for target in targets:
            owner = _owner(target, names)
            if owner and owner != module:
                graph.add_edge(module, owner)
    return graph


def test_no_import_cycle_among_the_projects_modules():
    graph = import_graph()
    assert graph.number_of_nodes() > 150 and graph.number_of_edges() > 400  # the walk found the project
    cycles = sorted((list(c) for c in nx.simple_cycles(graph)), key=lambda c: (len(c), c))
    shown = "\n".join(" -> ".join(c + c[:1]) for c in cycles[:20])
    assert cycles == [], f"{len(cycles)} import cycle(s), the shortest first:\n{shown}"


def _graph_of(files: Dict[str, str], tmp_path: Path) -> nx.DiGraph:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return import_graph(tmp_path)


def test_the_graph_sees_every_way_a_module_imports_another(tmp_path):
    graph = _graph_of({
        "pkg/__init__.py": "from pkg import low\n",                                   # an __init__ re-exporting
        "pkg/low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .high import T\n",
        "pkg/high.py": "def f():\n    from pkg import low\n    from . import mid\n",  # lazy, relative
        "pkg/mid.py": "import pkg.sub.deep\nfrom pkg.sub import thing\n",             # a name of the sub-package
        "pkg/sub/__init__.py": "thing = 1\n",
        "pkg/sub/deep.py": "import importlib\ndef get(n):\n    return importlib.import_module(f'.{n}', __package__)\n"
                           "_LAZY = {'x': 'lazy'}\n",
        "pkg/sub/lazy.py": "",
        "pkg/cli.py": "import importlib\nfor n in ('mid',):\n    importlib.import_module(f'pkg.{n}')\n"
                      "WHERE = 'pkg.high:f'\ndef load(w):\n    return importlib.import_module(w.partition(':')[0])\n",
    }, tmp_path)
    assert sorted(graph.edges()) == [
        ("pkg", "pkg.low"), ("pkg.cli", "pkg.high"), ("pkg.cli", "pkg.mid"), ("pkg.high", "pkg.low"),
        ("pkg.high", "pkg.mid"), ("pkg.low", "pkg.high"), ("pkg.mid", "pkg.sub"), ("pkg.mid", "pkg.sub.deep"),
        ("pkg.sub.deep", "pkg.sub.lazy")]
    # a cycle's first module depends on where networkx starts: compare each cycle as its set of modules
    assert sorted(sorted(c) for c in nx.simple_cycles(graph)) == [["pkg.high", "pkg.low"]]  # the type-only import
