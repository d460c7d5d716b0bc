"""The documentation builds, and the user guide's code runs as written.

* ``python -m sphinx -W --keep-going -b html docs <out>`` (``docs/conf.py``: autodoc, numpydoc, MyST) builds
  with no warning: a docstring numpydoc cannot parse, a broken link between pages or a page missing from
  the table of contents fails here, with sphinx's own output.
* Without TorchRec, ``swpipe.torchrec`` still documents: the build runs once more with ``torchrec`` and
  ``fbgemm_gpu`` unimportable (``docs/conf.py`` then stands them in).
* Every ``python`` block of each ``docs/guide/*.md`` page runs, in page order, in one fresh interpreter
  per page, in a scratch folder, on CPU (``cost_models/`` linked in). A ``text`` block shows output:
  each of its lines must appear in what the blocks before it printed. Tracebacks name the page's line
  numbers. Other blocks (``bash``, ...) are shown, not run. A page that imports ``swpipe.torchrec`` is
  skipped where TorchRec is not installed.

Nothing here asserts the pages' prose.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
from typing import List, Tuple

import pytest
from conftest import torchrec_usable

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GUIDE = sorted((DOCS / "guide").glob("*.md"))

_FENCE = re.compile(r"^(`{3,})([^`\s]*)\s*$")
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

# Runs in the child: the page's blocks in order, a marker before each one.
_DRIVER = r'''
import json, sys
page, blocks = json.load(open(sys.argv[1], encoding="utf-8"))
ns = {"__name__": "__guide__"}
for kind, line, code in blocks:
    print(f"@@block {kind} {page}:{line}", flush=True)
    exec(compile("\n" * (line - 1) + code, page, "exec"), ns)
    sys.stdout.flush()
print("@@done", flush=True)
'''

# Makes torchrec and fbgemm_gpu unimportable, then runs sphinx: the docs of a machine without TorchRec.
_WITHOUT_TORCHREC = r'''
import importlib.abc, sys

class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torchrec", "fbgemm_gpu"):
            raise ImportError(f"{name} is hidden for this build")
        return None

sys.meta_path.insert(0, _Absent())
from sphinx.cmd.build import main
sys.exit(main(sys.argv[1:]))
'''


def code_blocks(path: pathlib.Path) -> List[Tuple[str, int, str]]:
    """``(language, first code line number, code)`` of each fenced block of a Markdown page."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m:
            fence = m.group(1)
            close = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
            assert close is not None, f"{path.name}:{i + 1}: unclosed code fence"
            blocks.append((m.group(2), i + 2, "\n".join(lines[i + 1:close]) + "\n"))
            i = close + 1
        else:
            i += 1
    return blocks


def _printed_before(out: str, page: str, line: int) -> str:
    """What the blocks above ``line`` of the page printed (the driver marks each block's start)."""
    for m in re.finditer(rf"^@@block \w+ {re.escape(page)}:(\d+)$", out, re.M):
        if int(m.group(1)) > line:
            return out[:m.start()]
    return out


def _sphinx(args: List[str], script: str = "", timeout: int = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", script, *args] if script else [sys.executable, "-m", "sphinx", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _fail_with(proc: subprocess.CompletedProcess, what: str) -> None:
    out = (proc.stdout[-4000:] + "\n" + proc.stderr[-8000:]).strip()
    pytest.fail(f"{what} (exit {proc.returncode}):\n{out}", pytrace=False)


@pytest.mark.timeout(300)
def test_the_docs_build_with_warnings_as_errors(tmp_path):
    proc = _sphinx(["-W", "--keep-going", "-j", "1", "-q", "-b", "html", str(DOCS), str(tmp_path / "html")])
    if proc.returncode != 0:
        _fail_with(proc, "sphinx -W failed")
    assert (tmp_path / "html" / "api.html").exists()
    api = (tmp_path / "html" / "api.html").read_text(encoding="utf-8")
    import swpipe

    for name in swpipe.__all__:  # every name of the face has its entry (the reference is generated)
        assert f'id="swpipe.{name}' in api, f"docs/api.rst does not document swpipe.{name}"
    for name in ("swpipe.testing.FakeCuda", "swpipe.testing.kernels", "swpipe.torchrec.TrainPipeline"):
        assert f'id="{name}"' in api, f"docs/api.rst does not document {name}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_docs_build_without_torchrec(tmp_path):
    """``-b dummy`` reads every page (autodoc runs while reading) and writes nothing."""
    proc = _sphinx(["-W", "--keep-going", "-j", "1", "-q", "-b", "dummy", str(DOCS), str(tmp_path / "out")],
                   script=_WITHOUT_TORCHREC)
    if proc.returncode != 0:
        _fail_with(proc, "sphinx -W failed with torchrec and fbgemm_gpu hidden")


def test_every_guide_code_block_names_its_language():
    assert GUIDE, "docs/guide/ has no page"
    for page in GUIDE:
        blocks = code_blocks(page)
        for kind, line, _ in blocks:
            assert kind, f"{page.name}:{line - 1}: a code block without a language (python, text, bash, ...)"


def _needs_torchrec(page: pathlib.Path) -> bool:
    return "swpipe.torchrec import" in page.read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("page", GUIDE, ids=[p.stem for p in GUIDE])
def test_every_python_block_of_a_guide_page_runs(page, tmp_path):
    if _needs_torchrec(page):
        if not torchrec_usable():
            pytest.skip("the page uses swpipe.torchrec (TorchRec not installed)")
    blocks = code_blocks(page)
    runnable = [b for b in blocks if b[0] == "python"]
    if not runnable:
        pytest.skip(f"{page.name} has no python block")
    name = f"docs/guide/{page.name}"
    (tmp_path / "blocks.json").write_text(json.dumps([name, runnable]), encoding="utf-8")
    (tmp_path / "driver.py").write_text(textwrap.dedent(_DRIVER), encoding="utf-8")
    (tmp_path / "cost_models").symlink_to(ROOT / "cost_models", target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}  # a page's job is a job of its own
    proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "blocks.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110)
    out = proc.stdout
    if proc.returncode != 0 or "@@done" not in out:
        pytest.fail(f"a block of {name} failed:\n{out[-5000:]}\n{proc.stderr[-6000:]}", pytrace=False)
    for kind, line, code in blocks:
        if kind != "text":
            continue
        before = _printed_before(out, name, line)
        for ln in code.splitlines():
            assert ln.rstrip() in before, f"{name}:{line}: shown output line not printed: {ln!r}"


def _user_code() -> List[Tuple[str, str]]:
    """``(where, code)`` of what users read and copy: the README's and the guide's python blocks, the examples,
    the notebooks' code cells (IPython's ``%`` lines left out)."""
    out = []
    for page in [ROOT / "README.md", *GUIDE]:
        out += [(f"{page.name}:{line}", code) for kind, line, code in code_blocks(page) if kind == "python"]
    out += [(f"examples/{p.name}", p.read_text(encoding="utf-8")) for p in sorted((ROOT / "examples").glob("*.py"))]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        for k, cell in enumerate(cells):
            if cell["cell_type"] == "code":
                source = "".join(cell["source"])
                out.append((f"{nb.name} cell {k}", "\n".join(ln for ln in source.splitlines()
                                                               if not ln.lstrip().startswith("%"))))
    return out


def test_examples_take_public_names_from_swpipe_and_advanced_ones_from_documented_modules():
    """A name ``import swpipe`` gives is imported from ``swpipe``; a name an example takes from ``swpipe_core`` or
    ``autosched`` is one the API reference documents under that module path (its section "Beyond import
    swpipe" says why it stays there)."""
    import ast

    import swpipe

    documented = set(re.findall(r"^\.\. auto\w+:: ([\w.]+)", (DOCS / "api.rst").read_text(encoding="utf-8"), re.M))
    inner = ("swpipe_core", "autosched")
    for where, code in _user_code():
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                bad = [a.name for a in node.names if a.name.split(".")[0] in inner]
                assert not bad, f"{where}: import {bad}: take the names from swpipe"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in inner:
                for alias in node.names:
                    assert alias.name not in swpipe.__all__, \
                        f"{where}: {alias.name} from {node.module}: it is public, import it from swpipe"
                    assert f"{node.module}.{alias.name}" in documented, \
                        f"{where}: {node.module}.{alias.name} is not in docs/api.rst's advanced names"
