"""What the client commands share: the --server/--token/--json options, the client they make, the
``tenant`` and ``slice`` command groups, and how user text goes into a table. Every CLI module imports
these by their public names; this module imports no other command module.

Client commands read ``--server``/``TPUFLEET_SERVER`` and ``--token``/``TPUFLEET_TOKEN``; without
a token they use the admin token that a local ``tpufleet serve`` wrote to
``<state-dir>/admin-token``, when it is readable. Tests hand an ``httpx.Client`` (e.g. FastAPI's
``TestClient``) to the commands through Click's context object (``obj=``), so the CLI runs against
the API in-process.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.text import Text

from tpufleet.client.http import DEFAULT_SERVER, Client

ServerOpt = Annotated[
    str, typer.Option("--server", envvar="TPUFLEET_SERVER", help="Control plane URL.", show_default=True)
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token", envvar="TPUFLEET_TOKEN", help="Bearer token (default: the local admin token, if readable)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
ERRORS = "Errors: bad input exits 2 with one line; an unreachable server exits 1."

tenant_app = typer.Typer(help="Manage tenants (admin token).", no_args_is_help=True)
slice_app = typer.Typer(
    help="Create, delete and measure slice groups; drain or undrain a slice (admin token).",
    no_args_is_help=True,
)


def make_client(ctx: typer.Context, server: str, token: str | None) -> Client:
    """--server/$TPUFLEET_SERVER, else the URL `tpufleet serve` remembered; --token/$TPUFLEET_TOKEN,
    else the admin token file it remembered (only for that same server), else ~/.tpufleet's."""
    from tpufleet.cli import context

    remembered = context.load()
    source = ctx.get_parameter_source("server")
    if remembered.server and (source is None or source.name == "DEFAULT"):
        server = remembered.server
    if not token and remembered.admin_token_path and server == remembered.server:
        token = read_token(Path(remembered.admin_token_path))
    if not token:
        from tpufleet.api.server import default_state_dir

        path = default_state_dir() / "admin-token"
        if path.is_file():
            try:
                token = path.read_text().strip() or None
            except OSError:
                token = None
    http = ctx.obj if isinstance(ctx.obj, httpx.Client) else None
    return Client(server or DEFAULT_SERVER, token, http=http)


def read_token(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def safe(text: object, *, keep: str = "") -> str:
    """``text`` with control and format characters (escape sequences, bidi overrides) shown as
    ``\\x1b``-style escapes, except those in ``keep``: user text never drives the terminal."""
    out = []
    for c in str(text):
        if c not in keep and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            out.append(f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out)


def cell(text: object, width: int | None = None) -> Text:
    """User text for a table cell: escaped, no markup, cut to ``width`` cells with an ellipsis."""
    cell = Text(safe(text))
    if width is not None:
        cell.truncate(width, overflow="ellipsis")
    return cell


def checkpoint_text(usage: dict[str, Any]) -> str:
    """``1.2/5.0 GiB``: what a host last measured of the tenant's checkpoint directory, of its quota
    (``none``: no limit; ``-`` not measured yet; ``>=`` a walk that stopped at its bound)."""
    from tpufleet.host.jobfiles import size_text

    used, quota = usage.get("used_bytes"), usage.get("quota_bytes")
    shown = "-" if not isinstance(used, int) else size_text(used)
    if isinstance(used, int) and usage.get("complete") is False:
        shown = ">=" + shown
    return f"{shown}/{size_text(quota) if isinstance(quota, int) else 'none'}"
