"""``swpipe --help`` and every ``swpipe COMMAND --help`` print plain text: no reStructuredText or Markdown markup."""

from __future__ import annotations

import re
from typing import List

import pytest

from swpipe.cli import main

# ``literal``, `code`, and Sphinx roles such as :class:`X` or :func:`f`
_MARKUP = re.compile(r"`|:(class|func|meth|mod|attr|ref|data|exc|obj|py:\w+):")


def _help(argv: List[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0, argv
    return capsys.readouterr().out


def _commands(top_help: str) -> List[str]:
    """The sub-commands ``swpipe --help`` lists (argparse indents each under COMMAND by four spaces)."""
    return re.findall(r"^    (\w+)(?:\s{2,}|$)", top_help, re.M)


def test_the_top_level_help_is_plain_text_and_lists_every_command(capsys):
    text = _help([], capsys)
    assert _MARKUP.search(text) is None, text
    assert {"demo", "show", "list", "plan", "simulate", "check"} <= set(_commands(text))


def test_every_sub_commands_help_is_plain_text(capsys):
    commands = _commands(_help([], capsys))
    assert commands
    for name in commands:
        text = _help([name], capsys)
        assert text.startswith(f"usage: swpipe {name}"), name
        found = _MARKUP.search(text)
        assert found is None, f"swpipe {name} --help shows markup {found.group(0)!r}:\n{text}"
