"""Every code block of README.md after its first runs (or, for commands, parses) as written, and the two
first commands can run.

The README's first code block holds the commands a newcomer types first (install and run the main job,
install and run the tests); they are checked in form (the packages, extras, commands and modules they name
exist), not run.

Every later ``python`` block runs, in document order, in one fresh interpreter, in one namespace (a block
may use what an earlier one defined), in a scratch folder with ``cost_models/`` linked in; tracebacks name
README.md line numbers. A later ``bash`` block lists ``swpipe ...`` commands: each line must parse with the
``swpipe`` command's own parser (the sub-command and every option exist), without running it. A ``text``
block shows output: each of its lines must appear in what the blocks before it printed.
Nothing here asserts the README's prose or figures: it is written for users.
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import pathlib
import re
import shlex
import subprocess
import sys
from typing import List, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

_FENCE = re.compile(r"^```(\w*)\s*$")

# Runs in the child: executes the python blocks in order in one namespace, echoing a marker before each one.
_DRIVER = r'''
import json, sys
blocks = json.load(open(sys.argv[1], encoding="utf-8"))
ns = {"__name__": "__readme__"}
for kind, line, code in blocks:
    print(f"@@block {kind} README.md:{line}", flush=True)
    exec(compile("\n" * (line - 1) + code, "README.md", "exec"), ns)
    sys.stdout.flush()
print("@@done", flush=True)
'''


def readme_blocks(text: str) -> List[Tuple[str, int, str]]:
    """``(language, first code line number, code)`` of each fenced block after the README's first one.

    Raises AssertionError when a fence is unclosed.
    """
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m:
            close = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
            assert close is not None, f"README.md:{i + 1}: unclosed code fence"
            blocks.append((m.group(1), i + 2, "\n".join(lines[i + 1:close]) + "\n"))
            i = close + 1
        else:
            i += 1
    return blocks[1:]


def _printed_before(out: str, line: int) -> str:
    """What the blocks above README line ``line`` printed (the driver marks each block's start)."""
    for m in re.finditer(r"^@@block \w+ README\.md:(\d+)$", out, re.M):
        if int(m.group(1)) > line:
            return out[:m.start()]
    return out


def first_commands(text: str) -> List[List[str]]:
    """The commands of the README's first code block (a ``bash`` block), each split into its words;
    ``a && b`` is two commands."""
    language, code = text.split("```")[1].split("\n", 1)
    assert language.strip() == "bash", "README.md's first code block is not a bash block"
    commands = []
    for line in code.splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            commands.append(words[:cut])
            words = words[cut + 1:]
    return commands


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


def test_the_first_two_commands_install_and_run_the_main_job_and_the_tests():
    commands = first_commands(README.read_text(encoding="utf-8"))
    assert any(c[:3] == ["pip", "install", "-e"] for c in commands), commands
    assert ["swpipe", "demo"] in commands and ["python", "-m", "pytest"] in commands, commands


def test_the_first_commands_name_what_exists():
    """Each command of the first block could run here: a package it installs is one setup.cfg requires, at a
    version setup.cfg accepts; ``-e`` installs this folder with extras it declares; ``swpipe`` is its console
    script and takes the subcommand; ``python -m`` names an importable module."""
    from packaging.requirements import Requirement

    from swpipe.cli import main

    cfg = _setup_cfg()
    requires = [Requirement(r) for r in cfg["options"]["install_requires"].splitlines() if r.strip()]
    extras = set(cfg["options.extras_require"])
    assert "swpipe = swpipe.cli:main" in cfg["options.entry_points"]["console_scripts"]
    for cmd in first_commands(README.read_text(encoding="utf-8")):
        if cmd[:2] == ["pip", "install"]:
            for arg in cmd[2:]:
                if arg == "-e":
                    continue
                if arg.startswith("."):
                    m = re.fullmatch(r"\.(?:\[([\w,]+)\])?", arg)
                    assert m is not None, cmd
                    assert set((m.group(1) or "").split(",")) - {""} <= extras, f"{cmd}: extras not in setup.cfg"
                else:  # a package the install needs, at a version setup.cfg accepts
                    want = Requirement(arg)
                    same = [r for r in requires if r.name == want.name]
                    assert same, f"{cmd}: setup.cfg does not require {want.name}"
                    pinned = [spec.version for spec in want.specifier if spec.operator == "=="]
                    assert all(same[0].specifier.contains(v) for v in pinned), f"{cmd}: setup.cfg requires {same[0]}"
        elif cmd[0] == "swpipe":
            with pytest.raises(SystemExit) as info:
                main([*cmd[1:], "--help"])
            assert info.value.code == 0, cmd
        elif cmd[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(cmd[2]) is not None, cmd
        else:
            pytest.fail(f"README.md's first block runs {cmd}, which this test does not know how to check")


def test_the_blocks_after_the_first_are_parsed_in_order_with_line_numbers():
    text = README.read_text(encoding="utf-8")
    blocks = readme_blocks(text)
    assert any(kind == "python" for kind, _, _ in blocks), "README.md has no python block after its first block"
    lines = text.splitlines()
    for kind, line, code in blocks:
        assert kind in ("python", "bash", "text"), f"README.md:{line}: untested block language {kind!r}"
        assert lines[line - 1] == code.splitlines()[0]  # line numbers point at the code


def test_every_later_bash_line_is_a_swpipe_command_its_parser_accepts(capsys):
    from swpipe.cli import build_parser

    for kind, line, code in readme_blocks(README.read_text(encoding="utf-8")):
        if kind != "bash":
            continue
        for offset, cmd in enumerate(code.splitlines()):
            argv = shlex.split(cmd, comments=True)
            if not argv:
                continue
            where = f"README.md:{line + offset}"
            assert argv[0] == "swpipe", f"{where}: only `swpipe ...` lines are checked"
            try:
                args = build_parser().parse_args(argv[1:])
            except SystemExit as exc:
                pytest.fail(f"{where}: `{cmd}` does not parse: {capsys.readouterr().err.strip()} ({exc.code})")
            assert args.command, f"{where}: `{cmd}` names no sub-command"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_later_python_block_runs_in_order(tmp_path):
    blocks = readme_blocks(README.read_text(encoding="utf-8"))
    runnable = [b for b in blocks if b[0] == "python"]
    (tmp_path / "blocks.json").write_text(json.dumps(runnable), encoding="utf-8")
    (tmp_path / "driver.py").write_text(_DRIVER, encoding="utf-8")
    (tmp_path / "cost_models").symlink_to(ROOT / "cost_models", target_is_directory=True)
    proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "blocks.json")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=280)
    out = proc.stdout
    assert proc.returncode == 0 and "@@done" in out, f"a README block failed:\n{out[-6000:]}\n{proc.stderr[-6000:]}"
    assert out.count("@@block python") == len(runnable)

    # every shown output appears in what the blocks before it printed
    for kind, line, code in blocks:
        if kind != "text":
            continue
        before = _printed_before(out, line)
        for ln in code.splitlines():
            assert ln.rstrip() in before, f"README.md:{line}: shown output line not printed: {ln!r}"


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_links_to_files_that_exist():
    """A link into the repository resolves (files move in a redesign; the README must follow)."""
    text = README.read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in _LINK.findall(text)]
    local = [t for t in targets if t and not re.match(r"^[a-z]+:", t)]
    for target in local:
        assert not target.startswith(("/", "..")), f"README.md links outside the repository: {target}"
        assert (ROOT / target).exists(), f"README.md links to {target}, which is not in the repository"
