"""Import rules: ``import swpipe_core`` stays light (no pandas, matplotlib, ortools, autosched or swpipe), and the
library (``swpipe_core``, ``autosched``, ``swpipe.torchrec``, ``swpipe.gpipe``) never imports the demo
(``swpipe.workloads``) or ``examples``, read from the source."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

HEAVY = ["pandas", "matplotlib", "ortools", "autosched", "swpipe"]

_PROBE = """
import json, sys
import swpipe_core
{extra}
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _loaded_after(extra: str = "") -> list:
    code = _PROBE.format(extra=extra, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_swpipe_core_loads_no_heavy_modules():
    assert _loaded_after() == []


def test_analysis_and_pipelines_load_no_heavy_modules():
    extra = ("from swpipe_core import pipelines, format_stage_analysis, format_schedule\n"
             "p = pipelines.get('fused_sparse_dist'); format_schedule(p); format_stage_analysis(p)")
    assert _loaded_after(extra) == []


def test_probe_detects_a_heavy_import():
    # the check can fail: importing pandas is seen
    assert _loaded_after("import pandas") == ["pandas"]


# ------------------------------------------------------------------- the library stands without the demo (issue 40.4)

SRC = Path(__file__).resolve().parents[1] / "src"
LIBRARY = ["swpipe_core", "autosched", "swpipe/torchrec", "swpipe/gpipe"]  # what a user installs and calls
DEMO = ("swpipe.workloads", "examples")  # the DLRM demo and the example scripts: they may import the library


def import_statements(source: str, module: str) -> list:
    """Every import in ``source`` (the text of ``module``, ``pkg.__init__`` for a package), at any depth (lazy
    imports in functions and ``if TYPE_CHECKING:`` blocks too), as ``(base, names)``: ``import a.b`` is
    ``("a.b", [])``, ``from a import b, c`` is ``("a", ["b", "c"])`` with a relative ``a`` resolved, and
    ``importlib.import_module("a.b")`` with a literal name is ``("a.b", [])``."""
    package = module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            out.append((base, [alias.name for alias in node.names]))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.args[0].value, []))
    return out


def imported_modules(source: str, module: str) -> list:
    """Every module ``source`` (the text of ``module``) imports, at any depth (lazy imports in functions too), as
    absolute dotted names: ``import a.b``, ``from a import b`` (both ``a`` and ``a.b``), relative imports
    resolved, and ``importlib.import_module("a.b")`` with a literal name (:func:`import_statements`)."""
    return [name for base, names in import_statements(source, module)
            for name in [base] + [f"{base}.{n}" for n in names]]


def demo_imports(source: str, module: str) -> list:
    """The imports of ``source`` that reach into the demo (:data:`DEMO`)."""
    return sorted({m for m in imported_modules(source, module)
                   if any(m == d or m.startswith(d + ".") for d in DEMO)})


def _library_files() -> list:
    return [p for folder in LIBRARY if (SRC / folder).is_dir() for p in sorted((SRC / folder).rglob("*.py"))]


def test_nothing_in_the_library_imports_the_demo():
    files = _library_files()
    assert len(files) > 50  # the walk found the library
    reached = {}
    for path in files:
        module = ".".join(path.relative_to(SRC).with_suffix("").parts)
        found = demo_imports(path.read_text(encoding="utf-8"), module)
        if found:
            reached[str(path.relative_to(SRC))] = found
    assert reached == {}


def test_the_import_check_sees_every_way_of_importing_the_demo():
    lazy = "def f():\n    from swpipe.workloads.agree import combine_slowest\n"
    assert demo_imports(lazy, "swpipe.torchrec.auto") == ["swpipe.workloads.agree",
                                                          "swpipe.workloads.agree.combine_slowest"]
    assert demo_imports("from swpipe import workloads", "autosched.x") == ["swpipe.workloads"]
    assert demo_imports("from ..workloads import dlrm", "swpipe.torchrec.models") == ["swpipe.workloads",
                                                                                      "swpipe.workloads.dlrm"]
    assert demo_imports("import importlib\nimportlib.import_module('examples.custom_plan')", "autosched.x") == [
        "examples.custom_plan"]
    assert demo_imports("import swpipe_core.plan\nfrom autosched.model import costs", "swpipe.torchrec.x") == []


def test_the_library_holds_no_benchmark_job():
    """swpipe pp's torchrun job (issue 46 item 5) lives with the command: no library module starts torchrun or
    imports a command."""
    files = _library_files()
    starts = [str(p.relative_to(SRC)) for p in files if "torch.distributed.run" in p.read_text(encoding="utf-8")]
    commands = {str(p.relative_to(SRC)): [m for m in imported_modules(p.read_text(encoding="utf-8"),
                                                                       ".".join(p.relative_to(SRC).with_suffix("").parts))
                                          if m == "swpipe.commands" or m.startswith("swpipe.commands.")]
                for p in files}
    assert starts == [] and {k: v for k, v in commands.items() if v} == {}
