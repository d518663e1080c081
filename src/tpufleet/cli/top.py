"""``tpufleet top``: the fleet page in the terminal, a Rich live view refreshed every second.

One read of ``GET /api/v1/fleet`` per frame (the same data as the page, through the same token
rules): every slice as a row of chips grouped by host, coloured by state and by the holding
tenant and shaded by duty cycle where one was measured; tenants' chips held against quota and
their cost (``GET /api/v1/cost``, every 10 frames; a dash where it is unknown); the head of the
queue with each job's position and why it waits; the running jobs with their goodput.
``--once`` prints one frame and exits (scripts, tests), as does ``top`` whose stdout is not a
terminal (saying so on stderr). User text (job names, reasons) is shown escaped: it never carries
markup or terminal control sequences.
"""

from __future__ import annotations

import itertools
import sys
import time
import zlib
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tpufleet.cli._app import app, console, console_err
from tpufleet.cli.common import ServerOpt, TokenOpt, cell, finite, make_client
from tpufleet.client.http import DEFAULT_SERVER, Client
from tpufleet.errors import TpufleetError

DASH = "—"
CHIP = "■"
QUEUE_ROWS = 10
COST_EVERY = 10  # frames between two reads of the cost report
_STATE_STYLE = {"FREE": "grey50", "BROKEN": "bold red", "DRAINING": "yellow", "HELD": "blue"}
_TENANT_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")


def tenant_colour(name: str) -> str:
    """A stable colour per tenant name (the same from frame to frame and run to run)."""
    return _TENANT_COLOURS[zlib.crc32(name.encode()) % len(_TENANT_COLOURS)]


def _chip_style(s: dict[str, Any], host: dict[str, Any], index: int) -> str:
    if not host.get("alive", True):
        return "bold red"
    if s.get("tenant"):
        style = tenant_colour(str(s["tenant"]))
        duty = (host.get("duty_cycle_percent") or [None] * (index + 1))[index]
        if isinstance(duty, int | float):
            style += " bold" if duty >= 50 else " dim" if duty < 10 else ""
        return style
    if s.get("held_by_other"):
        return "white dim"
    return _STATE_STYLE.get(str(s.get("state")), "white")


def _chips(s: dict[str, Any]) -> Text:
    out = Text()
    for i, host in enumerate(s.get("hosts") or ()):
        if i:
            out.append(" ")
        for c in range(int(host.get("chips") or 0)):
            out.append(CHIP, style=_chip_style(s, host, c))
    return out


def _holder(s: dict[str, Any]) -> Text:
    if s.get("tenant"):
        return Text.assemble((str(s["tenant"]), tenant_colour(str(s["tenant"]))), f" {s.get('holder') or ''}")
    if s.get("held_by_other"):
        return Text("another tenant", style="dim")
    return Text("")


def _slices(view: dict[str, Any]) -> Table:
    table = Table(title="slices", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("slice", "type", "state", "chips (by host)", "held by"):
        table.add_column(col)
    for s in view["slices"]:
        state = str(s["state"])
        table.add_row(
            cell(s["name"]),
            cell(s["accelerator_type"]),
            Text(state, style=_STATE_STYLE.get(state, "")),
            _chips(s),
            _holder(s),
        )
    return table


def _usage(t: dict[str, Any]) -> Text:
    gens = sorted(set(t.get("quota") or {}) | set(t.get("held") or {}))
    if not gens:
        return Text(DASH)
    parts = []
    for g in gens:
        held, quota = (t.get("held") or {}).get(g, 0), (t.get("quota") or {}).get(g, 0)
        parts.append(Text(f"{g} {held}/{quota}", style="yellow" if held > quota else ""))
    return Text(" ").join(parts)


def money(dollars: object) -> str:
    if not isinstance(dollars, int | float):
        return DASH
    return f"${dollars:,.{0 if dollars >= 100 else 2 if dollars >= 1 else 4}f}"


def costs_of(client: Client) -> dict[str, Any] | None:
    """``GET /api/v1/cost`` by tenant and by job, or None where the server has no cost report (an
    older server) or refuses it: shown as a dash, never as zero."""
    try:
        report = client.request("GET", "/api/v1/cost")
    except TpufleetError:
        return None
    return {
        "tenants": {t["tenant"]: t for t in report.get("tenants") or ()},
        "jobs": {j["job_id"]: j for j in report.get("jobs") or ()},
    }


def _cost(t: dict[str, Any], costs: dict[str, Any] | None) -> str:
    row = (costs or {}).get("tenants", {}).get(t["name"])
    if not row or not isinstance(row.get("dollars"), int | float):
        return DASH
    lost = row.get("badput_dollars")
    return money(row["dollars"]) + (
        f" ({money(lost)} badput)" if isinstance(lost, int | float) and lost > 0 else ""
    )


def _tenants(view: dict[str, Any], costs: dict[str, Any] | None) -> Table:
    table = Table(title="tenants", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("tenant", "held/quota chips", "borrowed", "running", "queued", "cost"):
        table.add_column(col)
    for t in view["tenants"]:
        borrowed = ", ".join(f"{g} +{n}" for g, n in (t.get("borrowing") or {}).items()) or "no"
        table.add_row(
            Text(str(t["name"]), style=tenant_colour(str(t["name"]))),
            _usage(t),
            borrowed,
            str(t.get("running", DASH)),
            str(t.get("queued", DASH)),
            _cost(t, costs),
        )
    return table


def _queue(view: dict[str, Any]) -> Table:
    shown = view["queue"][:QUEUE_ROWS]
    title = f"queue: {view['queued']} waiting" + (
        f", first {len(shown)}" if view["queued"] > len(shown) else ""
    )
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("#", "job", "name", "tenant", "shape", "prio", "why it waits"):
        table.add_column(col)
    for j in shown:
        shape = (f"{j['num_slices']} x " if j["num_slices"] > 1 else "") + str(j["accelerator_type"])
        why = Text(str(j.get("reason_code") or "waiting for the next cycle"), style="bold")
        if j.get("reason"):
            why.append(" ").append(cell(j["reason"], 70))
        table.add_row(
            str(j["position"]),
            j["id"],
            cell(j["name"], 30),
            Text(str(j["tenant"]), style=tenant_colour(str(j["tenant"]))),
            shape,
            str(j["priority"]),
            why,
        )
    return table


def _goodput(j: dict[str, Any], costs: dict[str, Any] | None) -> str:
    """The job view's goodput ratio, else the cost report's; a job that reports no steps has none."""
    g = j.get("goodput")
    ratio = g.get("ratio") if isinstance(g, dict) else None
    if ratio is None:
        ratio = ((costs or {}).get("jobs", {}).get(j["id"]) or {}).get("goodput")
    return f"{100 * ratio:.1f} %" if isinstance(ratio, int | float) else DASH


def _running(view: dict[str, Any], costs: dict[str, Any] | None) -> Table:
    table = Table(title="running", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("job", "name", "tenant", "state", "slices", "attempt", "for", "goodput"):
        table.add_column(col)
    now = float(view.get("at") or time.time())
    for j in view["active"]:
        began = j.get("started_at") or j.get("admitted_at")
        table.add_row(
            j["id"],
            cell(j["name"], 30),
            Text(str(j["tenant"]), style=tenant_colour(str(j["tenant"]))),
            str(j["state"]),
            ", ".join(j["slices"]),
            str(j["attempt"]) + (" borrowing" if j.get("borrowing") else ""),
            f"{now - began:.0f} s" if began else DASH,
            _goodput(j, costs),
        )
    return table


def frame(
    view: dict[str, Any], server: str, costs: dict[str, Any] | None = None, problem: str | None = None
) -> RenderableType:
    """One screen of ``tpufleet top`` from a ``GET /api/v1/fleet`` answer (and :func:`costs_of`)."""
    who = "admin: the whole fleet" if view["viewer"]["admin"] else f"tenant {view['viewer']['tenant']}"
    head = Text.assemble(("tpufleet top", "bold"), f"  {server}  {who}  ", (time.strftime("%H:%M:%S"), "dim"))
    if problem:
        head.append(f"  not updated: {problem}", style="red")
    legend = Text.assemble(
        "chips: ",
        (CHIP, _STATE_STYLE["FREE"]),
        " free  ",
        (CHIP, "cyan"),
        " a tenant's (colour per tenant, bold = busy, dim = idle duty cycle)  ",
        (CHIP, "white dim"),
        " another tenant's  ",
        (CHIP, _STATE_STYLE["BROKEN"]),
        " broken/host down  ",
        (CHIP, _STATE_STYLE["DRAINING"]),
        " draining",
        style="dim",
    )
    return Group(head, _slices(view), legend, _tenants(view, costs), _queue(view), _running(view, costs))


def _terminal() -> bool:
    """Whether stdout is a terminal a live view can redraw (not a pipe, a file or a test's capture)."""
    try:
        return sys.stdout.isatty()
    except ValueError:  # closed
        return False


@app.command("top")
def top_cmd(
    ctx: typer.Context,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    interval: Annotated[
        float, typer.Option("--interval", callback=finite, help="Seconds between frames.", min=0.2)
    ] = 1.0,
) -> None:
    """The fleet at a glance, live: slices as chips by state and tenant, tenants' use against quota,
    the queue head and why it waits, running jobs (what the fleet page at / shows). Ctrl-C quits.
    Not in a terminal (a pipe, a file): one frame, as --once."""
    client = make_client(ctx, server, token)
    with client:
        view = client.fleet()  # a bad token or an unreachable server: one line, its exit code
        costs = costs_of(client)
        if once or not _terminal():
            console.print(frame(view, client.server, costs))
            if not once:  # piped or redirected: a live view would print nothing worth reading
                console_err.print(
                    "tpufleet top: stdout is not a terminal, so one frame was printed (as --once)",
                    highlight=False,
                )
            return
        shown = frame(view, client.server, costs)
        with Live(shown, console=console, auto_refresh=False, screen=False) as live:
            try:
                for n in itertools.count(1):
                    time.sleep(interval)
                    problem = None
                    try:
                        view = client.fleet()
                        if n % COST_EVERY == 0:  # the cost report reads every attempt: less often
                            costs = costs_of(client)
                    except TpufleetError as err:
                        problem = str(err)
                    live.update(frame(view, client.server, costs, problem), refresh=True)
            except KeyboardInterrupt:
                pass
