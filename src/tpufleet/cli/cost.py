"""``tpufleet cost``: chip-hours, dollars and dollars lost to badput, per tenant and per job.

The numbers come from the control plane (``GET /api/v1/cost``: the store's attempt records at the
server's price table, ``observe/cost.py``); the admin token sees every tenant, a tenant's token its
own. An unknown price prints as ``unknown``, never as $0.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from tpufleet.cli._app import app, console, print_json
from tpufleet.cli.common import ERRORS, JsonOpt, ServerOpt, TokenOpt, cell, make_client
from tpufleet.client.http import DEFAULT_SERVER


def money(value: float | None, unpriced_hours: float = 0.0) -> str:
    """``$12.34``; ``unknown`` without a price; ``$12.34 + unknown`` when part of it had none."""
    if value is None:
        return "unknown"
    text = f"${value:,.2f}"
    return f"{text} + unknown" if unpriced_hours > 0 else text


def _hours(value: float) -> str:
    return f"{value:,.2f}"


@app.command("cost", epilog=ERRORS)
def cost_cmd(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant (a tenant's token: its own).")] = None,
    since: Annotated[
        str | None, typer.Option(help="Only chip time of the last 7d, 12h, 30m... (default: all).")
    ] = None,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Chip-hours, dollars and dollars lost to badput (start-up, wasted progress, idle), per tenant
    and per job, from the attempt records at the control plane's prices (docs/observability.md)."""
    if since is not None:
        from tpufleet.observe.cost import parse_duration  # the store's modules: only when used

        parse_duration(since, "--since")  # a bad value exits 2 here, before any request
    params = {k: v for k, v in (("tenant", tenant), ("since", since)) if v is not None}
    got: dict[str, Any] = make_client(ctx, server, token).request("GET", "/api/v1/cost", params=params)
    if as_json:
        print_json(got)
        return
    console.print(tenants_table(got["tenants"], since))
    if got["jobs"]:
        console.print(jobs_cost_table(got["jobs"]))
    unknown = [p["generation"] for p in got.get("prices", []) if p.get("on_demand") is None]
    if unknown:
        console.print(f"no price for {', '.join(unknown)} (serve --pricing FILE sets one)", highlight=False)


def tenants_table(rows: list[dict[str, Any]], since: str | None) -> Table:
    title = f"cost per tenant ({'last ' + since if since else 'all time'}, USD)"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("tenant", "jobs", "chip-hours", "dollars", "lost to badput"):
        table.add_column(col, justify="left" if col == "tenant" else "right")
    for t in rows:
        table.add_row(
            cell(t["tenant"]),
            str(t["jobs"]),
            _hours(t["chip_hours"]),
            money(t["dollars"], t["unpriced_chip_hours"]),
            _badput(t),
        )
    return table


def _badput(t: dict[str, Any]) -> str:
    """A tenant's dollars lost to badput; ``+ unknown`` where some of its jobs report no steps."""
    if t["badput_dollars"] is None:
        return "unknown" if t.get("unreported_jobs") else "-"
    return money(t["badput_dollars"], 1.0 if t.get("unreported_jobs") else 0.0)


def jobs_cost_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="cost per job", title_justify="left", box=box.SIMPLE_HEAD)
    numbers = ("chip-hours", "dollars", "lost to badput")
    for col in ("job", "name", "tenant", "type", *numbers, "goodput"):
        table.add_column(col, justify="right" if col in numbers else "left")
    for j in rows:
        table.add_row(
            cell(j["job_id"]),
            cell(j["name"], 24),
            cell(j["tenant"]),
            cell(j["accelerator_type"]),
            _hours(j["chip_hours"]),
            money(j["dollars"], j["unpriced_chip_hours"]),
            money(j["badput_dollars"]) if j["badput_dollars"] is not None else "-",
            ratio(j["goodput"]),
        )
    return table


def ratio(value: float | None) -> str:
    """A goodput ratio as a percentage; ``-`` when the job reports no steps."""
    return "-" if value is None else f"{value * 100:.0f}%"
