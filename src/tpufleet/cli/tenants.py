"""Tenants from the command line: ``tenants`` (the list) and ``tenant create|update|show|delete``
(admin token; ``tenant show`` the tenant's own token too).

Thin, like the rest of the client side (``cli/common.py``: ``--server``, ``--token``, the local
admin token): parse, call the API, print. Rules and examples: docs/control-plane.md, "Operating
tenants". Bad input is one line and exit 2, checked here before anything is sent where it can be.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

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
from tpufleet.control.store.values import PREEMPTION_MODES, check_weight
from tpufleet.errors import SpecError

tenant_app = typer.Typer(help="Manage tenants (admin token).", no_args_is_help=True)
app.add_typer(tenant_app, name="tenant")

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
        text = value.strip()
        if text.startswith("-") and text[1:].isdigit():
            raise SpecError(f"{gen}={text}: chips must be >= 0, e.g. v4=32", field="--quota")
        if not text.isdigit():
            raise SpecError(
                f"{gen}={value!r}: chips must be a whole number >= 0, e.g. v4=32", field="--quota"
            )
        chips[gen.strip()] = int(value)
    return chips


def check_preemption(value: str | None) -> str | None:
    if value is not None and value not in PREEMPTION_MODES:
        raise SpecError(
            f"{value[:40]!r} is not a preemption setting; use {' or '.join(PREEMPTION_MODES)}",
            field="--preemption",
        )
    return value


def checkpoint_text(usage: dict[str, Any]) -> str:
    """``1.2/5.0 GiB``: what a host last measured of the tenant's checkpoint directory, of its quota
    (``none``: no limit; ``-`` not measured yet; ``>=`` a walk that stopped at its bound)."""
    from tpufleet.host.jobfiles import size_text

    used, quota = usage.get("used_bytes"), usage.get("quota_bytes")
    shown = "-" if not isinstance(used, int) else size_text(used)
    if isinstance(used, int) and usage.get("complete") is False:
        shown = ">=" + shown
    return f"{shown}/{size_text(quota) if isinstance(quota, int) else 'none'}"


def _quota_text(quota: dict[str, int]) -> str:
    return ", ".join(f"{g}={c}" for g, c in quota.items()) or "-"


@app.command("tenants", epilog=ERRORS)
def tenants_cmd(
    ctx: typer.Context,
    all_: Annotated[
        bool, typer.Option("--all", help="Deleted tenants too (state deleting or deleted).")
    ] = False,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """List tenants with their quotas, weights and preemption settings (admin token).

    ckpt: the tenant's checkpoint directory as a host last measured it, of the quota (serve
    --checkpoint-quota-gib; "none": no limit; "-": no run has reported yet). Deleted tenants are
    left out unless --all: then they show with their state, deleting (its cancelled jobs still
    stop) or deleted."""
    rows = make_client(ctx, server, token).tenants(include_deleted=all_)
    if as_json:
        print_json(rows)
        return
    columns = ["name", "quota (chips)", "weight", "preemption", "ckpt"] + (["state"] if all_ else [])
    table = Table(*columns, title=f"tenants ({len(rows)})", title_justify="left")
    for t in rows:
        cells: list[Text | str] = [cell(t["name"]), cell(_quota_text(t["quota"])), f"{t['weight']:g}"]
        cells += [cell(t.get("preemption", "-")), checkpoint_text(t.get("checkpoints") or {})]
        table.add_row(*cells, *([cell(t.get("state", "active"))] if all_ else []))
    console.print(table)


@tenant_app.command("create", epilog=ERRORS)
def tenant_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Tenant name: lowercase letters, digits, '-'.")],
    quota: Annotated[list[str], typer.Option("--quota", help="Nominal chips per generation: v4=32.")] = [],  # noqa: B006
    weight: Annotated[float, typer.Option(help="Fair-share weight.")] = 1.0,
    preemption: Annotated[
        str,
        typer.Option(
            "--preemption",
            metavar="never|lower_priority",
            help="lower_priority: its higher-priority jobs may preempt its own lower-priority ones; never.",
        ),
    ] = "lower_priority",
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Create a tenant and print its token (shown once). --quota v4=32,v6e=16 (or repeated)."""
    chips = parse_quota(quota)
    check_preemption(preemption)
    check_weight(weight)  # here: nan or inf cannot even be sent as JSON
    out = make_client(ctx, server, token).create_tenant(name, chips, weight, preemption)
    if as_json:
        print_json({"name": out["name"], "token": out["token"]})
        return
    console_err.print(f"tenant {out['name']} created; its token (shown once):", highlight=False)
    typer.echo(out["token"])


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
    if weight is not None:
        check_weight(weight)
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
