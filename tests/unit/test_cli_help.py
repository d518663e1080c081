"""Every help page at 80 columns: option names whole (Typer's own table cut them to
``--allow-working-dir-u…``), nothing past the 80th column, and each description wrapped as the
paragraph it is, not at its source line breaks (``Ray): try quotas and`` / ``priorities, ...``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from click.testing import CliRunner  # runs the command tree built once (Typer's runner rebuilds it)

from tpufleet.cli import app
from tpufleet.cli._app import unwrap

WIDTH = 80


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from commands(sub, (*path, name))


ROOT = typer.main.get_command(app)
ALL = list(commands(ROOT))


def help_page(path: tuple[str, ...]) -> str:
    """The page as ``COLUMNS=80 tpufleet PATH --help`` prints it (the command tree built once)."""
    result = CliRunner().invoke(ROOT, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    return result.output


def description(page: str) -> list[list[str]]:
    """The paragraphs above the first panel, each as its printed lines (without the margin)."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    paragraphs: list[list[str]] = [[]]
    for line in lines[start:]:
        if line.lstrip().startswith("╭"):
            break
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


def test_the_walk_sees_every_command() -> None:
    names = {" ".join(path) for path, _ in ALL}
    assert {
        "",
        "serve",
        "submit",
        "lint",
        "slice create",
        "emulate up",
        "tenant update",
        "db upgrade",
    } <= names


@pytest.mark.parametrize(("path", "command"), ALL, ids=[" ".join(p) or "tpufleet" for p, _ in ALL])
def test_a_help_page_at_80_columns_keeps_every_option_name_whole(path: tuple[str, ...], command: Any) -> None:
    page = help_page(path)
    assert "…" not in page, page  # Rich cuts a cell that does not fit with an ellipsis
    assert [line for line in page.splitlines() if len(line) > WIDTH] == []
    for param in command.params:
        for name in (*param.opts, *param.secondary_opts):
            if name.startswith("-"):
                assert name in page, (name, page)
    for paragraph in description(page):  # greedy: no line ends while the next one's word fits
        for line, after in itertools.pairwise(paragraph):
            assert len(line) + 1 + len(after.split()[0]) > WIDTH - 2, (line, after)


def test_descriptions_are_paragraphs_not_source_lines() -> None:
    for _, command in ALL:
        assert "\n" not in (command.help or "").replace("\n\n", ""), command.name
    assert unwrap("one\ntwo\n\nthree\n  four") == "one two\n\nthree four"
    assert unwrap("\b\nkept\nas is") == "\b\nkept\nas is"
