"""docs/architecture.md is true of the tree: every module under src/ is listed in its rooms, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Set

ROOT = Path(__file__).resolve().parents[1]
_ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[\w./-]+)(?:\s{2,}|$)")


def listed_paths(page: str) -> Set[str]:
    """The paths the rooms' tree names under src/ (a folder line opens a level, a file line is a module)."""
    block = page.split("## Rooms", 1)[1].split("```", 2)[1]
    listed: Set[str] = set()
    stack: List[str] = []
    for line in block.splitlines():
        found = _ENTRY.match(line)
        if not found or not found.group("name"):
            continue
        name, depth = found.group("name"), len(found.group("indent")) // 2
        if depth == 0 and not name.startswith("src/"):
            stack = []
            continue
        if depth == 0:
            stack = [name.rstrip("/")]
            continue
        if not stack or depth > len(stack):  # a continuation line of a description
            continue
        stack = stack[:depth]
        if name.endswith("/"):
            stack.append(stack[-1] + "/" + name.rstrip("/"))
            listed.add(stack[-1] + "/")
        elif name.endswith(".py"):
            listed.add(stack[-1] + "/" + name)
    return listed


def modules_in_tree() -> Set[str]:
    """Every module under src/ but the packages' __init__ and __main__ (a folder stands for its package)."""
    found: Set[str] = set()
    for path in (ROOT / "src").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if path.name in ("__init__.py", "__main__.py"):
            continue
        found.add(rel)
    return found


def test_every_module_under_src_is_in_the_architecture_page_and_every_listed_one_exists():
    listed = listed_paths((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    folders = {p.rstrip("/") for p in listed if p.endswith("/")}
    files = {p for p in listed if p.endswith(".py")}
    in_tree = modules_in_tree()
    # a module is listed by name, or its folder is listed with no file of its own (one room, e.g. gpipe/skip/)
    whole = {f for f in folders if not any(x.startswith(f + "/") for x in files)}
    unlisted = sorted(m for m in in_tree if m not in files and Path(m).parent.as_posix() not in whole)
    assert unlisted == []
    assert sorted(files - in_tree) == []  # listed, but not in the tree
    assert sorted(f for f in folders if not (ROOT / f).is_dir()) == []
