"""What the client commands share: the --server/--token/--json options, the client they make, how
user text goes into a table, and times as UTC; and what every command's float options share
(``finite``: nan and inf refused in one line). Every CLI module imports these by their public names;
this module imports no command module (``context`` only, to read what ``serve`` remembered).

Client commands read ``--server``/``TPUFLEET_SERVER`` and ``--token``/``TPUFLEET_TOKEN``; without
a token they use the admin token that a local ``tpufleet serve`` wrote to
``<state-dir>/admin-token``, when it is readable. Tests hand the commands their :class:`Seams`
(or just an ``httpx.Client``, e.g. FastAPI's ``TestClient``) through Click's context object
(``obj=``), so the CLI runs against the API in-process.
"""

from __future__ import annotations

import math
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.text import Text

from tpufleet.client.http import DEFAULT_SERVER, Client, server_url
from tpufleet.control.store.values import DEFAULT_LIMITS, Limits
from tpufleet.errors import SpecError

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


def finite(param: typer.CallbackParam, value: float | None) -> float | None:
    """The callback of a float option (``callback=finite``): nan and inf are refused in one line.
    Typer's ``min`` and ``max`` let inf through, and nan where an option has no minimum; a later
    ``int()``, ``sleep()`` or deadline then failed with a traceback or never came."""
    if value is None or math.isfinite(value):
        return value
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    bounds = [f"{sign} {bound:g}" for sign, bound in ((">=", low), ("<=", high)) if bound is not None]
    raise SpecError(
        f"must be a finite number{' ' + ' and '.join(bounds) if bounds else ''}, got {value}",
        field=param.opts[0],
    )


@dataclass(frozen=True)
class Seams:
    """What the commands take from their caller instead of the real thing (Click's ``obj=``):
    ``http``, the httpx client the API client sends through (None: its own); ``limits``, the caps
    a command checks on this side before it sends (``submit --working-dir`` packs to at most
    ``limits.max_package_bytes``; the server's own limits still apply); ``pause``, how a command
    that polls (``logs --follow``) waits between two reads."""

    http: httpx.Client | None = None
    limits: Limits = DEFAULT_LIMITS
    pause: Callable[[float], None] = time.sleep


def seams(ctx: typer.Context) -> Seams:
    """The context object's seams; a bare ``httpx.Client`` there is ``Seams(http=...)``."""
    obj = ctx.obj
    if isinstance(obj, Seams):
        return obj
    return Seams(http=obj if isinstance(obj, httpx.Client) else None)


def make_client(ctx: typer.Context, server: str, token: str | None) -> Client:
    """--server/$TPUFLEET_SERVER (``http://`` added when it has no scheme; a path is refused), else
    the URL `tpufleet serve` remembered; --token/$TPUFLEET_TOKEN, else the admin token file it
    remembered (only for that same server), else ~/.tpufleet's."""
    from tpufleet.cli import context

    remembered = context.load()
    source = ctx.get_parameter_source("server")
    given = {"COMMANDLINE": "--server", "ENVIRONMENT": "TPUFLEET_SERVER"}.get(source.name if source else "")
    if remembered.server and given is None:
        server = server_url(remembered.server, f"{context.config_path()}: server")
    elif server:
        server = server_url(server, given or "--server")  # 127.0.0.1:8600 is http://; a path is refused
    if not token and remembered.admin_token_path and server == remembered.server:
        token = read_token(Path(remembered.admin_token_path))
    if not token:
        from tpufleet.api.serving import ADMIN_TOKEN_FILE, default_state_dir

        path = default_state_dir() / ADMIN_TOKEN_FILE
        if path.is_file():
            token = read_token(path)
    return Client(server or DEFAULT_SERVER, token, http=seams(ctx).http)


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


def when(at: float | None) -> str:
    """An epoch time as UTC, to the second; ``-`` for none."""
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")
