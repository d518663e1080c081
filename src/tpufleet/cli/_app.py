"""The Typer application and the two consoles every command module shares.

Help pages stay readable at 80 columns (``tests/unit/test_cli_help.py`` walks every command):

- A docstring's lines are joined into paragraphs (a blank line between paragraphs, as everywhere
  in this code base) when the command tree is built (``_ReadableGroup``): Typer's ``rich`` markup
  mode would keep each source line break, breaking sentences mid-line.
- The options panel is drawn with its own columns (``_options_panel``, in place of Typer's): the
  option names never wrap or shrink (Typer's table cut them, ``--allow-working-dir-u…``), the type
  column is narrow, and the help column takes the rest and folds what does not fit.

A command's options may also come before its name (``tpufleet --json jobs``, ``tpufleet --server
URL slice drain NAME``): the root group moves them after the name, where Click reads them
(:func:`options_after_command`); ``tpufleet`` itself has no options but ``--help``.
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
    """The root group: every command's help and epilog as paragraphs, and a command's options
    accepted before its name (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _unwrap_tree(self)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # Any: the Context of typer's Click
        return super().parse_args(ctx, options_after_command(self, ctx, args))


def option_names(command: Any, ctx: Any) -> dict[str, bool]:
    """Each option name of a Click ``command`` (``--json``, ``-f``, ``--no-wait``), True for one
    that takes no value (a flag or a count)."""
    return {
        name: bool(getattr(p, "is_flag", False) or getattr(p, "count", False))
        for p in command.get_params(ctx)
        if p.param_type_name == "option"
        for name in (*p.opts, *p.secondary_opts)
    }


def options_after_command(group: Any, ctx: Any, args: list[str]) -> list[str]:
    """``args`` with the options given before the command's name moved after it (``--json jobs``
    -> ``jobs --json``; ``--token T slice drain X`` -> ``slice drain --token T X``), when every one
    of them is an option of that command (a subcommand's, for a group) and none is ``group``'s own;
    ``args`` unchanged otherwise (no option first, no command, an option of no one: Click's own
    message)."""
    if not args or not args[0].startswith("-") or args[0] == "--":
        return args
    own = option_names(group, ctx)
    for at, word in enumerate(args):
        if word == "--":
            break
        command = None if word.startswith("-") else group.get_command(ctx, word)
        if command is None:
            continue
        end = at + 1
        while hasattr(command, "commands") and end < len(args):  # a group: down to the subcommand
            sub = command.get_command(ctx, args[end])
            if sub is None:
                break
            command, end = sub, end + 1
        lead = args[:at]
        if _only_options(lead, option_names(command, ctx), own):
            return [*args[at:end], *lead, *args[end:]]
    return args


def _only_options(tokens: list[str], known: dict[str, bool], own: dict[str, bool]) -> bool:
    """``tokens`` are options of ``known`` with their values, none of them in ``own``."""
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name = token.partition("=")[0] if token.startswith("--") else token[:2]
        if not token.startswith("-") or name not in known or name in own:
            return False
        takes_value = not known[name] and name == token
        i += 2 if takes_value else 1
    return i == len(tokens)


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
