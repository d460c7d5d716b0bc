"""Every code block of README.md's Usage section runs as written.

The blocks run in document order in one fresh interpreter, in a scratch folder
(with ``cost_models/`` linked in): ``python`` blocks share one namespace, and each
line of a ``bash`` block is a ``swpipe ...`` command run through the console
script's entry point (``python -m swpipe.cli``, the same ``swpipe.cli:main``).
A ``text`` block shows output: every one of its lines must appear in what the
blocks before it printed. Tracebacks name README.md line numbers.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
from typing import List, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

_FENCE = re.compile(r"^```(\w*)\s*$")

# Runs in the child: executes the blocks in order, echoing a marker before each one.
_DRIVER = r'''
import json, shlex, subprocess, sys
blocks = json.load(open(sys.argv[1], encoding="utf-8"))
ns = {"__name__": "__readme__"}
for kind, line, code in blocks:
    print(f"@@block {kind} README.md:{line}", flush=True)
    if kind == "python":
        exec(compile("\n" * (line - 1) + code, "README.md", "exec"), ns)
    elif kind == "bash":
        for cmd in code.splitlines():
            argv = shlex.split(cmd, comments=True)
            if not argv:
                continue
            print(f"@@cmd {cmd}", flush=True)
            sys.stdout.flush()
            rc = subprocess.run([sys.executable, "-m", "swpipe.cli", *argv[1:]], stderr=subprocess.STDOUT).returncode
            if rc != 0:
                print(f"@@failed rc={rc}: {cmd}", flush=True)
                sys.exit(1)
    sys.stdout.flush()
print("@@done", flush=True)
'''


def usage_blocks(text: str) -> List[Tuple[str, int, str]]:
    """``(language, first code line number, code)`` of each fenced block under ``## Usage``.

    Raises AssertionError when the section is missing or a fence is unclosed.
    """
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.strip() == "## Usage"]
    assert len(starts) == 1, "README.md needs exactly one '## Usage' section"
    start = starts[0]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    blocks, i = [], start + 1
    while i < end:
        m = _FENCE.match(lines[i])
        if m:
            close = next((j for j in range(i + 1, end) if lines[j].strip() == "```"), None)
            assert close is not None, f"README.md:{i + 1}: unclosed code fence in Usage"
            blocks.append((m.group(1), i + 2, "\n".join(lines[i + 1:close]) + "\n"))
            i = close + 1
        else:
            i += 1
    return blocks


def _printed_before(out: str, line: int) -> str:
    """What the blocks above README line ``line`` printed (the driver marks each block's start)."""
    for m in re.finditer(r"^@@block \w+ README\.md:(\d+)$", out, re.M):
        if int(m.group(1)) > line:
            return out[:m.start()]
    return out


def test_usage_section_comes_after_the_two_first_commands():
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0] == "# swpipe"
    first_block = text.split("```")[1]
    assert "pip install -e ." in first_block and "python -m pytest" in first_block
    assert text.index("```bash") < text.index("## Usage")


def test_usage_blocks_are_parsed_in_order_with_line_numbers():
    blocks = usage_blocks(README.read_text(encoding="utf-8"))
    kinds = [k for k, _, _ in blocks]
    assert kinds.count("python") >= 4 and "bash" in kinds
    lines = README.read_text(encoding="utf-8").splitlines()
    for kind, line, code in blocks:
        assert kind in ("python", "bash", "text"), f"README.md:{line}: untested block language {kind!r}"
        assert lines[line - 1] == code.splitlines()[0]  # line numbers point at the code


def test_usage_bash_blocks_only_run_swpipe_commands():
    for kind, line, code in usage_blocks(README.read_text(encoding="utf-8")):
        if kind != "bash":
            continue
        for offset, cmd in enumerate(code.splitlines()):
            if cmd.strip():
                assert cmd.split()[0] == "swpipe", f"README.md:{line + offset}: only `swpipe ...` lines are tested"


def test_usage_section_names_every_step_of_the_users_path():
    code = "".join(c for k, _, c in usage_blocks(README.read_text(encoding="utf-8")) if k in ("python", "bash"))
    for name in ("PipelinePlan(", "SWPipeline(", "print_schedule(", "TaskProfiler(", "print_report()",
                 "CostModel.from_profile(", "auto_schedule(", "simulate(", "what_if(", "swpipe plan",
                 "swpipe simulate", "swpipe show", "swpipe demo"):
        assert name in code, f"README Usage lacks {name}"


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_every_usage_code_block_runs(tmp_path):
    blocks = usage_blocks(README.read_text(encoding="utf-8"))
    runnable = [b for b in blocks if b[0] in ("python", "bash")]
    (tmp_path / "blocks.json").write_text(json.dumps(runnable), encoding="utf-8")
    (tmp_path / "driver.py").write_text(_DRIVER, encoding="utf-8")
    (tmp_path / "cost_models").symlink_to(ROOT / "cost_models", target_is_directory=True)
    proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "blocks.json")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=400)
    out = proc.stdout
    assert proc.returncode == 0 and "@@done" in out, f"a README block failed:\n{out[-6000:]}\n{proc.stderr[-6000:]}"

    # every shown output appears in what the blocks before it printed
    for kind, line, code in blocks:
        if kind != "text":
            continue
        before = _printed_before(out, line)
        for ln in code.splitlines():
            assert ln.rstrip() in before, f"README.md:{line}: shown output line not printed: {ln!r}"

    # what the snippets claim they produce
    assert "Baseline serial iteration:" in out and "auto_schedule (" in out
    assert "simulated 50 iterations on cpu: period" in out and "lower bound" in out
    for name in ("costs.json", "graph.json", "plan.json", "sweep_load.png", "auto.sim.trace.json"):
        assert (tmp_path / name).stat().st_size > 0, f"{name} was not written"
    from autosched.costs import CostModel
    from autosched.graph import load_plan
    from swpipe_core.validate import validate

    plan = load_plan(tmp_path / "plan.json")
    validate(plan)
    assert sorted(plan.task_names) == ["Backward", "Forward", "Load", "Step"]
    assert ("Forward", "Step", 1) in plan.inter_edges()
    assert set(CostModel.load(tmp_path / "costs.json").tasks) == {"Load", "Forward", "Backward", "Step"}
    assert "reproduce the serial loop bit for bit" in out


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_links_only_to_files_in_the_repository():
    text = README.read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in _LINK.findall(text)]
    local = [t for t in targets if not re.match(r"^[a-z]+://", t)]
    assert local, "README.md links to no file of the repository"
    for target in local:
        assert not target.startswith(("/", "..")), f"README.md links outside the repository: {target}"
        if target.startswith("docs/") and not (ROOT / "docs").is_dir():
            continue  # docs/ comes from another branch of this merge; once it is there, every link is checked
        assert (ROOT / target).exists(), f"README.md links to {target}, which is not in the repository"
    assert "notebooks/figures/measured_vs_simulated.png" in local, "the README's picture is not linked"


def test_readme_figures_cite_benchmarks_results():
    text = README.read_text(encoding="utf-8")
    head = text[:text.index("## Usage")]
    assert "benchmarks/RESULTS.md" in head and "2-core x86_64 CPU" in head
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    for figure in ("2.9%", "7.6%", "1.19x", "1.032x", "1.88x", "1.97x"):
        assert figure in results, f"README cites {figure}, which benchmarks/RESULTS.md does not record"


def test_readme_example_benchmark_measures_the_readmes_own_plan():
    """``benchmarks/readme_example.py`` runs the README's first Usage block, so its figure is about that plan."""
    from conftest import load_benchmark

    bench = load_benchmark("readme_example")
    plan, batches = bench.readme_plan()
    assert sorted(plan.task_names) == ["Backward", "Forward", "Load", "Step"]
    assert plan.sched("Load").thread_group == "io" and plan.stage("Load") == 0 and len(batches) == 30
