"""``tpufleet events``: the audit log (who changed which tenant or token, cancels, drains,
preemptions), oldest first; ``--job ID``: everything that happened to one job."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from tpufleet.cli._app import app, console, print_json
from tpufleet.cli.common import ERRORS, JsonOpt, ServerOpt, TokenOpt, cell, make_client, safe, when
from tpufleet.client.http import DEFAULT_SERVER
from tpufleet.errors import SpecError


@app.command("events", epilog=ERRORS)
def events_cmd(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's events.")] = None,
    job: Annotated[
        str | None,
        typer.Option(
            "--job",
            metavar="ID",
            help="Everything that happened to one job instead: submitted, admitted, launched, running, "
            "each attempt's end, cancels, preemptions.",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Show the newest N events.")] = 100,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """The audit log: who changed which tenant or token, cancels, drains, preemptions.

    Oldest first, the newest --limit events; each says who did it (admin, a token id, or the
    scheduler) and the tenant. A tenant's token reads only its own tenant's events.
    With --job ID: that job's own history (its tenant's token or the admin's)."""
    if job is not None and tenant is not None:
        raise SpecError("give --job ID or --tenant NAME, not both (a job's events are its tenant's)")
    client = make_client(ctx, server, token)
    rows = client.events(job)[-limit:] if job is not None else client.audit(tenant, last=limit)
    if as_json:
        print_json(rows)
        return
    console.print(events_table(rows) if job is None else job_events_table(job, rows))


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


def job_events_table(job_id: str, rows: list[dict[str, Any]]) -> Table:
    """One job's events, oldest first: when, what kind, what happened (the message names slices)."""
    title = f"events of job {escape(safe(job_id))} ({len(rows)})"
    table = Table("at (UTC)", "kind", "what", title=title, title_justify="left")
    for e in rows:
        table.add_row(when(e["at"]), cell(e["kind"]), cell(e["message"]))
    return table
