"""The Typer application and the two consoles every command module shares.

Help pages stay readable at 80 columns (``tests/unit/test_cli_help.py`` walks every command):

- A docstring's lines are joined into paragraphs (a blank line between paragraphs, as everywhere
  in this code base) when the command tree is built (``_ReadableGroup``): Typer's ``rich`` markup
  mode would keep each source line break, breaking sentences mid-line.
- The options panel is drawn with its own columns (``_options_panel``, in place of Typer's): the
  option names never wrap or shrink (Typer's table cut them, ``--allow-working-dir-u…``), the type
  column is narrow, and the help column takes the rest and folds what does not fit.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from typer import rich_utils
from typer.core import TyperArgument, TyperGroup

TYPE_COLUMN = 14  # the widest the options panel's type column gets (``TYPE:COUNT,...`` fits)


def unwrap(text: str | None) -> str | None:
    """``text`` with the line breaks inside each paragraph joined (paragraphs stay apart; one that
    starts with ``\\b`` is kept verbatim, as Click does)."""
    if not text:
        return text
    paragraphs = re.split(r"\n\s*\n", text.strip())
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


def _unwrap_tree(command: Any) -> None:  # a Click command (Typer vendors Click: typer._click)
    command.help = unwrap(command.help)
    command.epilog = unwrap(command.epilog)
    for sub in getattr(command, "commands", {}).values():
        _unwrap_tree(sub)


class _ReadableGroup(TyperGroup):
    """The root group: every command's help and epilog as paragraphs (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _unwrap_tree(self)


def _names(param: Any) -> Text:
    if isinstance(param, TyperArgument):
        return Text(param.display_name_raw + ("..." if param.metavar is None and param.nargs != 1 else ""))
    longs = [o for o in param.opts if o.startswith("--")]
    shorts = [o for o in param.opts if not o.startswith("--")]
    names = "/".join([",".join(longs), *param.secondary_opts]) if param.secondary_opts else ",".join(longs)
    return rich_utils.highlighter(", ".join(n for n in (names, ",".join(shorts)) if n))


def _options_panel(
    *,
    name: str,
    params: list[Any],
    ctx: Any,
    markup_mode: rich_utils.MarkupModeStrict,
    console: Console,
) -> None:
    """Typer's options panel, with columns that keep option names whole (see the module docstring)."""
    if not params:
        return
    table = Table(highlight=True, show_header=False, expand=True, box=None, padding=(0, 1), pad_edge=False)
    required = any(p.required for p in params)
    if required:
        table.add_column(no_wrap=True, width=1)
    table.add_column(no_wrap=True)  # the names: never wrapped, never cut
    table.add_column(max_width=TYPE_COLUMN, overflow="fold")
    table.add_column(ratio=1, overflow="fold")
    for param in params:
        types = Text(style=rich_utils.STYLE_TYPES, overflow="fold")
        types.append(param.display_type_rich(ctx=ctx) or "")
        range_str = param._get_number_range_help_str()
        if range_str:
            types.append(rich_utils.RANGE_STRING.format(range_str))
        help_ = rich_utils._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)
        for part in help_.renderables:  # a word wider than the column (a URL) folds, never cut
            if isinstance(part, Text):
                part.overflow = "fold"
        star = Text(
            rich_utils.REQUIRED_SHORT_STRING if param.required else "", style=rich_utils.STYLE_REQUIRED_SHORT
        )
        row: list[Any] = [_names(param), rich_utils.types_highlighter(types), help_]
        table.add_row(*([star, *row] if required else row))
    border, align = rich_utils.STYLE_OPTIONS_PANEL_BORDER, rich_utils.ALIGN_OPTIONS_PANEL
    console.print(Panel(table, border_style=border, title=name, title_align=align))


rich_utils._print_options_panel = _options_panel  # Typer has no setting for these columns

app = typer.Typer(
    name="tpufleet",
    help="Run a shared fleet of Google Cloud TPU slices on Ray: emulate, configure, queue, observe.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    cls=_ReadableGroup,
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
