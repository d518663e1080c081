"""Tokens from the command line (admin token): ``tokens`` (the list) and ``token create|revoke|
rotate-admin``. A secret is printed once, when it is made (``rotate-admin`` writes it to a file
instead); the server keeps only its hash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tpufleet.cli._app import app, console, console_err, print_json
from tpufleet.cli.common import (
    ERRORS,
    JsonOpt,
    ServerOpt,
    TokenOpt,
    cell,
    make_client,
    safe,
    when,
)
from tpufleet.client.http import DEFAULT_SERVER
from tpufleet.control.store.values import TOKEN_SCOPES
from tpufleet.errors import SpecError

token_app = typer.Typer(help="Create, revoke and rotate tokens (admin token).", no_args_is_help=True)
app.add_typer(token_app, name="token")


@token_app.command("create", epilog=ERRORS)
def token_create(
    ctx: typer.Context,
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant the token is for.", show_default=False)],
    scope: Annotated[
        str,
        typer.Option(
            "--scope",
            metavar="jobs|metrics",
            help="jobs: the tenant's jobs; metrics: only GET /metrics (a Prometheus scraper).",
        ),
    ] = "jobs",
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Create a token and print it (shown once; only its hash is stored). --json: {"id", "token"}."""
    if scope not in TOKEN_SCOPES:
        raise SpecError(
            f"{scope[:40]!r} is not a token scope; use {' or '.join(TOKEN_SCOPES)}", field="--scope"
        )
    out = make_client(ctx, server, token).create_token(tenant, scope)
    if as_json:
        print_json({"id": out["id"], "token": out["token"]})
        return
    console_err.print(
        safe(f"token {out['id']} ({out['scope']}) for tenant {out['tenant']} (shown once):"), highlight=False
    )
    typer.echo(out["token"])


@app.command("tokens", epilog=ERRORS)
def tokens_cmd(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's tokens.")] = None,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """List the tokens that work (admin token): ids, scopes, created and last-used times.

    Times are UTC; last use is written at most once a minute. Never the secrets."""
    rows = make_client(ctx, server, token).tokens(tenant)
    if as_json:
        print_json(rows)
        return
    table = Table(
        "id", "tenant", "scope", "created", "last used", title=f"tokens ({len(rows)})", title_justify="left"
    )
    for t in rows:
        table.add_row(
            cell(t["id"]),
            cell(t["tenant"] or "(admin)"),
            cell(t["scope"]),
            when(t["created_at"]),
            when(t["last_used_at"]),
        )
    console.print(table)


@token_app.command("revoke", epilog=ERRORS)
def token_revoke(
    ctx: typer.Context,
    token_id: Annotated[str, typer.Argument(metavar="ID", help="The token's id (tpufleet tokens).")],
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Revoke a token: every request with it is refused (401) from now on."""
    out = make_client(ctx, server, token).revoke_token(token_id)
    typer.echo(safe(f"token {out['id']} ({out['scope']}) revoked"))


@token_app.command("rotate-admin", epilog=ERRORS)
def token_rotate_admin(
    ctx: typer.Context,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            help="Where to write the new admin token too (default: the local server's state dir, as "
            "`tpufleet serve` recorded it, else ~/.tpufleet).",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Replace the admin token: a new one is written to <state-dir>/admin-token (mode 0600) and every
    other admin token is revoked at once. The server writes its own state dir's file; this command
    writes the local one too when it is another file. The secret is never printed."""
    client = make_client(ctx, server, token)
    out = client.rotate_admin()
    path = _admin_token_target(state_dir, client.server)
    _write_if_other(path, out["token"])
    done = {"id": out["id"], "path": str(path), "server_path": out.get("path"), "revoked": out["revoked"]}
    if as_json:
        print_json(done)
        return
    typer.echo(
        safe(
            f"admin token rotated: {out['id']} written to {path} (mode 0600); "
            f"{out['revoked']} old admin token(s) revoked"
        )
    )


def _admin_token_target(state_dir: Path | None, server: str) -> Path:
    """The admin-token file client commands read: --state-dir's, the one `serve` recorded for this
    server, else the default state dir's."""
    from tpufleet.api.serving import ADMIN_TOKEN_FILE, default_state_dir
    from tpufleet.cli import context

    if state_dir is not None:
        return state_dir / ADMIN_TOKEN_FILE
    remembered = context.load()
    if remembered.admin_token_path and remembered.server == server:
        return Path(remembered.admin_token_path)
    return default_state_dir() / ADMIN_TOKEN_FILE


def _write_if_other(path: Path, token: str) -> None:
    """Write ``token`` to ``path`` (0600) unless the server already put it there."""
    from tpufleet.api.auth import write_token_file

    try:
        if path.read_text().strip() == token:
            return
    except OSError:
        pass
    write_token_file(path, token)
