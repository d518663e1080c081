"""The Typer application and the two consoles every command module shares."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console

app = typer.Typer(
    name="tpufleet",
    help="Run a shared fleet of Google Cloud TPU slices on Ray: emulate, configure, queue, observe.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

# Piped output (CI logs, `| less`) gets a wide fixed width so tables are not truncated to 80 columns.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
console_err = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 200)


def print_json(value: Any) -> None:
    """Machine-readable output: plain JSON on stdout, no colour, no wrapping."""
    typer.echo(json.dumps(value, indent=2, sort_keys=False, default=str))


@app.callback()
def _root() -> None:
    """Run a shared fleet of Google Cloud TPU slices on Ray: emulate, configure, queue, observe."""
