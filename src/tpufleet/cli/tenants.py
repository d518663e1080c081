"""Operating tenants from the command line: ``tenant update``, ``tenant delete``, ``token create``,
``tokens``, ``token revoke``, ``token rotate-admin`` and ``events`` (the audit log).

Thin, like the rest of the client side (``cli/common.py``: ``--server``, ``--token``, the local
admin token): parse, call the API, print. Rules and examples: docs/control-plane.md, "Operating
tenants". Bad input is one line and exit 2, checked here before anything is sent where it can be.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

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
    tenant_app,
)
from tpufleet.client.http import DEFAULT_SERVER
from tpufleet.control.store.values import PREEMPTION_MODES, TOKEN_SCOPES
from tpufleet.errors import SpecError

token_app = typer.Typer(help="Create, revoke and rotate tokens (admin token).", no_args_is_help=True)
app.add_typer(token_app, name="token")

QuotaOpt = Annotated[
    list[str],
    typer.Option(
        "--quota",
        metavar="GEN=CHIPS[,GEN=CHIPS]",
        help="Nominal chips per generation, e.g. v4=32,v6e=16 (or --quota repeated).",
    ),
]
PreemptionOpt = Annotated[
    str | None,
    typer.Option(
        "--preemption",
        metavar="never|lower_priority",
        help="lower_priority: the tenant's higher-priority jobs may preempt its own lower-priority ones "
        "(the default for a new tenant); never.",
        show_default=False,
    ),
]


def parse_quota(values: list[str]) -> dict[str, int]:
    """``["v4=32,v6e=16", "v5e=8"]`` -> ``{"v4": 32, "v6e": 16, "v5e": 8}``; a SpecError naming a
    bad item (the server checks the generations)."""
    chips: dict[str, int] = {}
    for item in (part.strip() for value in values for part in value.split(",")):
        gen, sep, value = item.partition("=")
        if not item or not sep or not gen.strip():
            raise SpecError(f"{item!r} is not GEN=CHIPS; write e.g. --quota v4=32,v6e=16", field="--quota")
        if not value.strip().isdigit():
            raise SpecError(f"{gen}={value!r}: chips must be a whole number, e.g. v4=32", field="--quota")
        chips[gen.strip()] = int(value)
    return chips


def check_preemption(value: str | None) -> str | None:
    if value is not None and value not in PREEMPTION_MODES:
        raise SpecError(
            f"{value[:40]!r} is not a preemption setting; use {' or '.join(PREEMPTION_MODES)}",
            field="--preemption",
        )
    return value


def when(at: float | None) -> str:
    """An epoch time as UTC, to the second; ``-`` for none."""
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _quota_text(quota: dict[str, int]) -> str:
    return ", ".join(f"{g}={c}" for g, c in quota.items()) or "-"


@tenant_app.command("update", epilog=ERRORS)
def tenant_update(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    quota: QuotaOpt = [],  # noqa: B006
    weight: Annotated[float | None, typer.Option(help="Fair-share weight.", show_default=False)] = None,
    preemption: PreemptionOpt = None,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Change a tenant's quota, weight or preemption setting; used from the next scheduling cycle.

    --quota sets the generations it names and keeps the others (v4=0 removes v4). Lowering a quota
    below what the tenant holds stops nothing: the excess counts as borrowed, and another tenant's
    in-quota job may reclaim it (checkpoint signal, grace period, requeue)."""
    chips = parse_quota(quota) if quota else None
    check_preemption(preemption)
    if chips is None and weight is None and preemption is None:
        raise SpecError("nothing to change: give --quota, --weight or --preemption")
    out = make_client(ctx, server, token).update_tenant(
        name, quota=chips, weight=weight, preemption=preemption
    )
    if as_json:
        print_json(out)
        return
    typer.echo(
        safe(
            f"tenant {out['name']}: quota {_quota_text(out['quota'])}; weight {out['weight']:g}; "
            f"preemption {out['preemption']} (from the next scheduling cycle)"
        )
    )


@tenant_app.command("show", epilog=ERRORS)
def tenant_show(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """One tenant: quota, weight, preemption, state, and its checkpoint directory as a host last
    measured it, of the quota (serve --checkpoint-quota-gib). The admin token, or the tenant's own."""
    from tpufleet.cli.common import checkpoint_text

    out = make_client(ctx, server, token).tenant(name)
    if as_json:
        print_json(out)
        return
    usage = out.get("checkpoints") or {}
    measured = usage.get("measured_at")
    seen = f" (measured {when(measured)} UTC)" if measured else ""
    lines = [
        f"tenant {out['name']} ({out.get('state', 'active')})",
        f"  quota        {_quota_text(out['quota'])}",
        f"  weight       {out['weight']:g}; preemption {out['preemption']}",
        f"  checkpoints  {checkpoint_text(usage)}{seen}",
    ]
    for line in lines:
        typer.echo(safe(line))


@tenant_app.command("delete", epilog=ERRORS)
def tenant_delete(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Cancel its queued and running jobs (checkpoint signal, grace period) first."
        ),
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="With --force: wait until its cancelled jobs stopped.")
    ] = True,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Delete a tenant. Refused while it has queued or running jobs, unless --force.

    Deletion is soft: its jobs, attempts, logs and events stay readable to the admin, its tokens stop
    working at once, and its name stays taken. `tpufleet tenants --all` lists deleted tenants."""
    client = make_client(ctx, server, token)
    out = client.delete_tenant(name, force=force)
    if out["state"] == "deleting" and not as_json:
        console_err.print(
            safe(f"tenant {out['name']}: cancelled {out['cancelled']} job(s); waiting for them to stop"),
            highlight=False,
        )
    while wait and out["state"] == "deleting":
        time.sleep(0.5)
        out = {**client.tenant(name), "cancelled": out["cancelled"]}
    if as_json:
        print_json(out)
        return
    if out["state"] == "deleting":
        typer.echo(safe(f"tenant {out['name']} deleting: its cancelled jobs are stopping"))
    else:
        typer.echo(safe(f"tenant {out['name']} deleted"))


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
    from tpufleet.api.auth import ADMIN_TOKEN_FILE
    from tpufleet.api.server import default_state_dir
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


@app.command("events", epilog=ERRORS)
def events_cmd(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's events.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Show the newest N events.")] = 100,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """The audit log: who changed which tenant or token, cancels, drains, preemptions.

    Oldest first, the newest --limit events; each says who did it (admin, a token id, or the
    scheduler) and the tenant. A tenant's token reads only its own tenant's events."""
    rows = make_client(ctx, server, token).audit(tenant, last=limit)
    if as_json:
        print_json(rows)
        return
    console.print(events_table(rows))


def events_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(
        "at (UTC)",
        "tenant",
        "actor",
        "kind",
        "job",
        "what",
        title=f"events ({len(rows)})",
        title_justify="left",
    )
    for e in rows:
        table.add_row(
            when(e["at"]),
            cell(e["tenant"] or "-"),
            cell(e["actor"] or "-"),
            cell(e["kind"]),
            cell(e["job_id"] or "-"),
            cell(e["message"]),
        )
    return table
