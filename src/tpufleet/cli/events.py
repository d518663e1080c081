"""``tpufleet events``: the audit log (who changed which tenant or token, cancels, drains,
preemptions), oldest first."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from tpufleet.cli._app import app, console, print_json
from tpufleet.cli.common import ERRORS, JsonOpt, ServerOpt, TokenOpt, cell, make_client, when
from tpufleet.client.http import DEFAULT_SERVER


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
