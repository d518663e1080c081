"""``tpufleet status``: the scheduler's figures (admin token)."""

from __future__ import annotations

import typer
from rich.markup import escape

from tpufleet.cli._app import app, console, print_json
from tpufleet.cli.common import ERRORS, JsonOpt, ServerOpt, TokenOpt, make_client, safe, when
from tpufleet.client.http import DEFAULT_SERVER


@app.command("status", epilog=ERRORS)
def status_cmd(
    ctx: typer.Context, as_json: JsonOpt = False, server: ServerOpt = DEFAULT_SERVER, token: TokenOpt = None
) -> None:
    """The scheduler's figures (admin token): queued and running jobs, cycles, cycle times, slices,
    and which replica leads (runs the loop) when several serve one database."""
    got = make_client(ctx, server, token).status()
    if as_json:
        print_json(got)
        return
    rows = [
        ("state", _state(got)),
        ("queued", str(got.get("queued", 0))),
        ("running", str(got.get("running", 0))),
        ("cycles", str(got.get("cycles", 0))),
        ("cycle", f"last {_ms(got.get('cycle_ms_last'))}, p50 {_ms(got.get('cycle_ms_p50'))}"),
        ("slices", ", ".join(f"{k} {v}" for k, v in sorted((got.get("slices") or {}).items())) or "-"),
    ]
    rows.insert(1, ("leader", _leader(got)))
    if got.get("last_error"):
        rows.append(("last error", str(got["last_error"])))
    for key, value in rows:
        console.print(f"[bold]{key:>10}[/]  {escape(safe(value))}", highlight=False)


def _state(got: dict[str, object]) -> str:
    if got.get("stalled"):
        return "stalled"
    return "cycling" if got.get("leader", True) else "standing by (another replica runs the loop)"


def _leader(got: dict[str, object]) -> str:
    """``this replica (<id>) since <time>`` or ``standby; <id> leads``."""
    if got.get("leader", True):
        since = got.get("leader_since")
        at = f" since {when(since)} UTC" if isinstance(since, int | float) else ""
        return f"this replica ({got.get('replica') or '-'}){at}"
    other = got.get("leader_replica")
    return f"standby; {other} leads" if other else "standby; no replica holds the lease now"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"
