"""Every code example of the API reference runs as written (tests/spec_examples/, one file each; see its README).

Each file is run in a fresh namespace; its ``# -- checked --`` parts assert what the reference says the code does.
A file whose header says ``# needs: ...`` is skipped where that is missing, with that line as the reason.
"""

from __future__ import annotations

import ast
import pathlib
import re
import runpy
import warnings
from typing import Callable, List

import pytest
import torch

from swpipe_core.engine.device import CpuFallbackWarning

EXAMPLES = pathlib.Path(__file__).resolve().parent / "spec_examples"
FILES = sorted(EXAMPLES.glob("*.py"))
_NEEDS = re.compile(r"^# needs: (?P<what>.+)$", re.M)


def reference_output(path: pathlib.Path) -> Callable[[str], List[str]]:
    """``reference_output(call)`` for the example at ``path``: the reference's sample output of ``call``, the comment
    lines under the line that is ``call`` (after blank lines and a heading comment ending in ':'), '# ' removed."""
    lines = path.read_text(encoding="utf-8").splitlines()

    def output(call: str) -> List[str]:
        at = [k for k, line in enumerate(lines) if line.strip() == call]
        assert at, f"{path.name} has no line {call!r}"
        rest = lines[at[0] + 1:]
        while rest and (not rest[0].strip() or rest[0].rstrip().endswith(":") and rest[0].startswith("#")):
            rest = rest[1:]
        found = []
        for line in rest:
            if not line.startswith("#"):
                break
            found.append(line[2:] if line.startswith("# ") else line[1:])
        return found

    return output


def test_every_example_has_the_three_parts_and_says_what_it_is():
    assert len(FILES) >= 20, "the reference's examples are missing from tests/spec_examples"
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        doc = ast.get_docstring(ast.parse(text)) or ""
        assert doc.split()[:3] == ["The", "API", "reference's"], path.name  # says which example it is
        parts = [m.split()[0] for m in re.findall(r"^# -- (.+) --$", text, re.M)]  # 'as' (written), 'checked'
        assert parts[0] == "as" and "checked" in parts[1:], path.name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_api_references_example_runs_as_written(path, capsys):
    needs = _NEEDS.search(path.read_text(encoding="utf-8"))
    if needs and "CUDA" in needs.group("what") and not torch.cuda.is_available():
        pytest.skip(f"{path.name} needs {needs.group('what')}")
    with warnings.catch_warnings():
        # SWPipeline(plan, device=0) as the reference writes it, on a machine without CUDA: tested where it warns
        # (tests/test_device_seam.py); the profile's "trained your model" warning is the reference's profile as is
        warnings.simplefilter("ignore", CpuFallbackWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        runpy.run_path(str(path), init_globals={"reference_output": reference_output(path)},
                       run_name="__spec_example__")
    capsys.readouterr()  # what the examples print is theirs to show, checked in the files themselves


def test_reference_output_reads_the_sample_under_a_call(tmp_path):
    example = tmp_path / "x.py"
    example.write_text("pipe.print_schedule(5)\n\n# print_schedule(5) output:\n#    #  Task\n#\n#   0  A\nx = 1\n")
    assert reference_output(example)("pipe.print_schedule(5)") == ["   #  Task", "", "  0  A"]
