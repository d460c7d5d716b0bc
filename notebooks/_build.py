"""Write the notebooks of this folder from their cells, executed, with outputs a reader sees on a web page.

The cells live in ``_nb01.py``, ``_nb02.py``, ... (one module per notebook);
never edit the ``.ipynb`` files by hand. ``python notebooks/_build.py``
executes each notebook on a ``python3`` kernel (nbclient), scrubs what would
differ between machines or runs without meaning anything (absolute paths,
execution timestamps) and writes it with its outputs; it also writes the
README's picture (``notebooks/figures/``). ``--no-execute`` writes the cells
only (quick, while editing); ``--only NAME`` builds one notebook.
``tests/test_notebooks.py`` executes every notebook and checks that the
committed cells equal what this script writes.
"""

from __future__ import annotations

import argparse
import base64
import pathlib
import re
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _nb01  # noqa: E402
import _nb02  # noqa: E402
import _nb03  # noqa: E402
import _nb04  # noqa: E402
import _nb05  # noqa: E402

Cell = Tuple[str, str]  # ("md" | "code", source)

NOTEBOOKS: Dict[str, List[Cell]] = {
    "01_profile_to_plan.ipynb": _nb01.CELLS,
    "02_stage_analysis.ipynb": _nb02.CELLS,
    "03_what_if.ipynb": _nb03.CELLS,
    "04_dataflow_and_memory.ipynb": _nb04.CELLS,
    "05_gpipe.ipynb": _nb05.CELLS,
}

# The README's picture: the first image the named notebook's cell shows whose source contains the marker.
FIGURES = {"figures/measured_vs_simulated.png": ("03_what_if.ipynb", "compare_gantt(")}


def build(cells: List[Cell]) -> nbformat.NotebookNode:
    """A notebook of the given cells, without outputs, validated."""
    nb = new_notebook(cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"  # stable ids: regenerating gives the same file
    nbformat.validate(nb)
    return nb


def execute(nb: nbformat.NotebookNode, timeout_s: int = 300) -> nbformat.NotebookNode:
    """Run every cell on a ``python3`` kernel (nbclient), in this folder; outputs land in ``nb``."""
    from nbclient import NotebookClient

    NotebookClient(nb, kernel_name="python3", timeout=timeout_s, record_timing=False,
                   resources={"metadata": {"path": str(HERE)}}).execute()
    return nb


def _scrub_text(text: str) -> str:
    """Absolute paths of this machine -> placeholders a reader understands."""
    text = text.replace(str(HERE.parent), "<repo>")
    tmp = re.escape(tempfile.gettempdir().rstrip("/"))
    text = re.sub(tmp + r"/[^\s'\"]*", "<tmp>", text)
    return text.replace(str(pathlib.Path.home()), "~")


def scrub(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Remove machine paths from text outputs and per-run metadata from cells (in place)."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = _scrub_text(out["text"])
            for key in ("text/plain", "text/html", "text/markdown"):
                if key in out.get("data", {}):
                    out["data"][key] = _scrub_text(out["data"][key])
            if out.get("output_type") == "error":
                out["traceback"] = [_scrub_text(line) for line in out["traceback"]]
    return nb


def _write_figures(name: str, nb: nbformat.NotebookNode) -> None:
    for target, (source_nb, marker) in FIGURES.items():
        if source_nb != name:
            continue
        for cell in nb.cells:
            images = [o["data"]["image/png"] for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
            if cell.cell_type == "code" and marker in cell.source and images:
                path = HERE / target
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(base64.b64decode(images[0]))
                print(f"wrote {path}")
                break


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-execute", action="store_true", help="write the cells only, without outputs")
    parser.add_argument("--only", metavar="NAME", help="build only this notebook (e.g. 03_what_if)")
    args = parser.parse_args(argv)
    for name, cells in NOTEBOOKS.items():
        if args.only and not name.startswith(args.only):
            continue
        nb = build(cells)
        if not args.no_execute:
            nb = scrub(execute(nb))
            _write_figures(name, nb)
        nbformat.write(nb, HERE / name)
        print(f"wrote {HERE / name}" + ("" if args.no_execute else " (executed)"))


if __name__ == "__main__":
    main()
