"""Every code block of README.md after its first runs (or, for commands, parses) as written, and the two
first commands can run.

The README's first code block holds the commands a newcomer types first (install and run the main job,
install and run the tests); they are checked in form (the packages, extras, commands and modules they name
exist), not run. So are the install commands of later blocks (torch's CPU build, the docs' extra), and the
block that builds the docs installs what ``docs/conf.py`` imports.

Every later ``python`` block runs, in document order, in one fresh interpreter, in one namespace (a block
may use what an earlier one defined), in a scratch folder with ``cost_models/`` linked in; tracebacks name
README.md line numbers. A later ``bash`` block lists ``swpipe ...`` commands: each line must parse with the
``swpipe`` command's own parser (the sub-command and every option exist), without running it; its ``pip
install`` and ``python -m`` lines are checked as the first block's are. A ``text``
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
    return _bash_commands(code)


def _bash_commands(code: str) -> List[List[str]]:
    """Each line's commands, split into words (``a && b`` is two)."""
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


def _extras() -> dict:
    """``{extra: [Requirement, ...]}`` of setup.cfg."""
    from packaging.requirements import Requirement

    section = _setup_cfg()["options.extras_require"]
    return {name: [Requirement(r) for r in section[name].splitlines() if r.strip() and not r.strip().startswith("#")]
            for name in section}


def _pip_install_args(cmd: List[str]) -> List[str]:
    """The targets of ``pip install [-e] [--index-url URL | --extra-index-url URL] TARGET...``; any other option
    fails (a README command must be one a user can type as written)."""
    targets, words = [], iter(cmd[2:])
    for arg in words:
        if arg == "-e":
            continue
        if arg in ("--index-url", "--extra-index-url"):
            url = next(words, "")
            assert re.fullmatch(r"https://\S+", url), f"{cmd}: {arg} takes an https URL, got {url!r}"
            continue
        assert not arg.startswith("-"), f"{cmd}: option {arg} is not one a README install uses"
        targets.append(arg)
    return targets


def check_command(cmd: List[str]) -> None:
    """A README command could run here: a package ``pip install`` names is one setup.cfg requires, at a version
    setup.cfg accepts; ``.`` installs this folder with extras it declares; ``swpipe`` is its console script and
    takes the sub-command; ``python -m`` names an importable module."""
    from packaging.requirements import Requirement

    from swpipe.cli import main

    cfg = _setup_cfg()
    requires = [Requirement(r) for r in cfg["options"]["install_requires"].splitlines() if r.strip()]
    assert "swpipe = swpipe.cli:main" in cfg["options.entry_points"]["console_scripts"]
    if cmd[:2] == ["pip", "install"]:
        for arg in _pip_install_args(cmd):
            if arg.startswith("."):
                m = re.fullmatch(r"\.(?:\[([\w,]+)\])?", arg)
                assert m is not None, cmd
                assert set((m.group(1) or "").split(",")) - {""} <= set(_extras()), f"{cmd}: extras not in setup.cfg"
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
        pytest.fail(f"README.md runs {cmd}, which this test does not know how to check")


def test_the_first_commands_name_what_exists():
    for cmd in first_commands(README.read_text(encoding="utf-8")):
        check_command(cmd)


def test_every_torch_the_readme_installs_is_one_version_the_package_accepts():
    """The first block's torch and the CPU-only alternative's are the same version: only the build differs."""
    text = README.read_text(encoding="utf-8")
    later = [c for kind, _, code in readme_blocks(text) if kind == "bash" for c in _bash_commands(code)]
    installs = [c for c in first_commands(text) + later if c[:2] == ["pip", "install"]]
    torches = {t for c in installs for t in _pip_install_args(c) if t.startswith("torch")}
    assert len(torches) == 1, torches
    assert any("--index-url" in c and any(t.startswith("torch") for t in c) for c in installs), \
        "the README says how to install torch's CPU build from another index"
    for cmd in installs:
        check_command(cmd)


def test_the_readmes_docs_command_installs_what_docs_conf_py_imports():
    """The block that runs Sphinx first installs an extra that holds every distribution docs/conf.py imports
    (its imports and its Sphinx extensions; the standard library and swpipe itself aside), and [test] holds
    them too (tests/test_docs.py builds the docs)."""
    import ast
    from importlib.metadata import packages_distributions

    from packaging.utils import canonicalize_name

    conf = ast.parse((ROOT / "docs" / "conf.py").read_text(encoding="utf-8"))
    modules = {a.name for node in ast.walk(conf) if isinstance(node, ast.Import) for a in node.names}
    modules |= {node.module for node in ast.walk(conf) if isinstance(node, ast.ImportFrom) and node.level == 0}
    for node in ast.walk(conf):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "extensions" for t in node.targets):
            modules |= set(ast.literal_eval(node.value))
    tops = {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names) - {"__future__", "swpipe"}
    assert {"sphinx", "numpydoc", "myst_parser"} <= tops
    owners = packages_distributions()
    needed = {canonicalize_name(owners[top][0]) for top in tops}
    extras = {name: {canonicalize_name(r.name) for r in reqs} for name, reqs in _extras().items()}

    blocks = [_bash_commands(code) for kind, _, code in readme_blocks(README.read_text(encoding="utf-8"))
              if kind == "bash"]
    sphinx_block = next(b for b in blocks if any(c[:3] == ["python", "-m", "sphinx"] for c in b))
    installed = set()
    for cmd in sphinx_block:
        if cmd[:3] == ["python", "-m", "sphinx"]:
            break
        for target in (_pip_install_args(cmd) if cmd[:2] == ["pip", "install"] else []):
            m = re.fullmatch(r"\.\[([\w,]+)\]", target)
            installed |= {n for extra in (m.group(1).split(",") if m else []) for n in extras[extra]}
    assert needed <= installed, f"the README's docs block installs {sorted(installed)}; conf.py needs {sorted(needed)}"
    assert needed <= extras["test"]


def test_the_blocks_after_the_first_are_parsed_in_order_with_line_numbers():
    text = README.read_text(encoding="utf-8")
    blocks = readme_blocks(text)
    assert any(kind == "python" for kind, _, _ in blocks), "README.md has no python block after its first block"
    lines = text.splitlines()
    for kind, line, code in blocks:
        assert kind in ("python", "bash", "text"), f"README.md:{line}: untested block language {kind!r}"
        assert lines[line - 1] == code.splitlines()[0]  # line numbers point at the code


def test_every_later_bash_line_is_a_command_that_could_run_here(capsys):
    """A ``swpipe ...`` line parses with the command's own parser; an install or ``python -m`` line is checked as
    the first block's are."""
    from swpipe.cli import build_parser

    for kind, line, code in readme_blocks(README.read_text(encoding="utf-8")):
        if kind != "bash":
            continue
        for offset, cmd in enumerate(code.splitlines()):
            argv = shlex.split(cmd, comments=True)
            if not argv:
                continue
            where = f"README.md:{line + offset}"
            if argv[0] != "swpipe":
                for part in _bash_commands(cmd):
                    check_command(part)
                continue
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


README_MAX_LINES = 180


def test_the_readme_speaks_to_each_user_within_its_length():
    """Three users (TorchRec, torchgpipe, PyTorch's pipelining) each find their one-line switch, and the README
    stays short enough to read (issue 46: within 180 lines)."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    for user in ("TorchRec users", "torchgpipe users", "PyTorch pipelining users"):
        assert user in headings
    for switch in ("swpipe.torchrec.TrainPipeline", "from swpipe.gpipe import GPipe", "swpipe pp"):
        assert switch in text
