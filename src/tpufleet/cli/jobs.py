"""A job's life from the command line: ``jobs`` (the list), ``job ID`` (one job, its attempts and
why it waits), ``logs ID`` (its output, live with ``--follow``) and ``cancel ID``. User text is
escaped before it reaches the terminal (``common.safe``)."""

from __future__ import annotations

import shlex
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from tpufleet.cli._app import app, console, console_err, print_json
from tpufleet.cli.common import ERRORS, JsonOpt, ServerOpt, TokenOpt, cell, make_client, safe, seams
from tpufleet.client.http import DEFAULT_SERVER, Client
from tpufleet.scheduler.lifecycle import TERMINAL_STATES


@app.command("jobs", epilog=ERRORS)
def jobs_cmd(
    ctx: typer.Context,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Show at most N jobs.")] = None,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """List your jobs (every job with the admin token), oldest first."""
    rows = make_client(ctx, server, token).jobs(limit=limit)
    if as_json:
        print_json(rows)
        return
    console.print(jobs_table(rows))


JOB_COLUMNS = (  # (title, width): 92 cells and 8 one-cell gaps, 100 columns in all
    ("id", 8),
    ("name", 13),
    ("tenant", 10),
    ("state", 9),
    ("type", 13),
    ("slices", 14),
    ("att", 3),
    ("good", 4),  # goodput (tpufleet.runtime.report_step); "-" for a job that reports no steps
    ("reason", 18),
)


def jobs_table(rows: list[dict[str, Any]]) -> Table:
    """One line per job, readable at 100 columns: long values end in an ellipsis, and the reason is
    its code (``tpufleet job ID`` shows the whole message); a queued job holds no slices (``-``)."""
    table = Table(
        title=f"jobs ({len(rows)})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 0),
    )
    for title, width in JOB_COLUMNS:
        table.add_column(title, no_wrap=True, max_width=width)
    for j in rows:
        values = (
            *(j[k] for k in ("id", "name", "tenant", "state", "accelerator_type")),
            ",".join(j["slices"]) or "-",
            j["attempt"],
            _goodput_cell(j.get("goodput")),
            j.get("reason_code") or ("-" if not j["reason"] else "see job"),
        )
        table.add_row(*(cell(v, width) for v, (_, width) in zip(values, JOB_COLUMNS, strict=True)))
    return table


@app.command("job", epilog=ERRORS)
def job_cmd(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Show one job: state, attempt, slices, and why it waits (with a warning and its fix when it
    cannot run as the fleet is: no slice of its type, and no pool makes them)."""
    job = make_client(ctx, server, token).job(job_id)
    if as_json:
        print_json(job)
        return
    _show_job(job)


def _state_line(j: dict[str, Any]) -> str:
    """``RUNNING``; while its attempt is being ended (``stopping``: a failure, a preemption, a
    cancel) the job keeps its active state, and the line says so: the reason says why and what
    comes next (requeued, or the job's end)."""
    if not j.get("stopping") or j["state"] in TERMINAL_STATES:
        return str(j["state"])
    return f"{j['state']}, stopping attempt {j['attempt']} (the reason says why and what comes next)"


def _goodput_cell(g: dict[str, Any] | None) -> str:
    ratio = (g or {}).get("ratio")
    return "-" if ratio is None else f"{ratio * 100:.0f}%"


def _goodput_line(g: dict[str, Any] | None) -> str:
    """``72% of 1.5 h held: start-up 4 min, wasted 10 min, idle 1 min; recovery 3 min`` (goodput)."""
    if not g or not g.get("held_s"):
        return "-"
    if g.get("ratio") is None:
        return f"unknown: the job reports no steps (tpufleet.runtime.report_step); {_span(g['held_s'])} held"
    parts = ", ".join(f"{k} {_span(g[k + '_s'])}" for k in ("startup", "wasted", "idle"))
    return f"{g['ratio'] * 100:.0f}% of {_span(g['held_s'])} held: {parts}; recovery {_span(g['recovery_s'])}"


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _show_job(j: dict[str, Any]) -> None:
    rows = [
        ("id", j["id"]),
        ("name", j["name"]),
        ("tenant", j["tenant"]),
        ("state", _state_line(j)),
        ("attempt", f"{j['attempt']} (failures {j['failures']} of max_retries {j['max_retries']})"),
        ("type", f"{j['accelerator_type']} x {j['num_slices']}"),
        ("kind", "ray (one Ray driver; docs/ray-jobs.md)" if j.get("kind") == "ray" else "spmd"),
        ("slices", ", ".join(j["slices"]) or "-"),
        ("priority", str(j["priority"])),
        ("borrowing", "yes" if j["borrowing"] else "no"),
        ("reason", f"{j['reason_code']}: {j['reason']}" if j["reason"] else "-"),
        *(("warning", w) for w in j.get("warnings") or ()),
        ("exit code", "-" if j["exit_code"] is None else str(j["exit_code"])),
        ("goodput", _goodput_line(j.get("goodput"))),
        ("command", shlex.join(j["command"])),
    ]
    for key, value in rows:
        console.print(f"[bold]{key:>10}[/]  {escape(safe(value))}", highlight=False)
    for a in j.get("attempts", ()):
        msg = f" - {a['message']}" if a["message"] else ""
        line = f"attempt {a['attempt']}: {a['state']} on {', '.join(a['slices'])}{msg}"
        console.print(f"{'':>10}  {escape(safe(line))}", highlight=False)


@app.command("logs", epilog=ERRORS)
def logs_cmd(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    host: Annotated[
        int | None, typer.Option(help="Only host N of the attempt (slice order, then worker).")
    ] = None,
    attempt: Annotated[int | None, typer.Option(help="An earlier attempt (default: the latest).")] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep printing until the job ends; the exit code then says how it ended (below).",
        ),
    ] = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="Print the output unchanged (control characters included).")
    ] = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Print a job's output, every host or one (--host), live with --follow.

    With --follow the exit code says how the job ended: 0 SUCCEEDED, 4 FAILED, 5 CANCELLED.
    A finished job whose stored output is not whole (a host's output past the per-host cap, or
    output that could not be collected from a lost host) gets a warning per host on stderr and
    exit code 3 (a FAILED or CANCELLED job followed keeps its own code)."""
    client = make_client(ctx, server, token)
    offsets: dict[int, int] = {}  # host -> characters printed
    shown: int | None = None
    while True:
        got = _read_logs(client, job_id, attempt, host, offsets)
        if shown is not None and got["attempt"] != shown:
            # A new attempt started: first the end of the one shown (stored whole before the job
            # moved on), then the new one from its beginning.
            _print_hosts(_read_logs(client, job_id, shown, host, offsets), host, offsets, raw)
            offsets.clear()
            console_err.print(f"--- attempt {got['attempt']} ---", highlight=False)
            shown = got["attempt"]
            continue
        shown = got["attempt"]
        _print_hosts(got, host, offsets, raw)
        if not follow or got["job_state"] in TERMINAL_STATES:  # a finished job's logs are all stored
            incomplete = _warn_incomplete(got)
            code = FOLLOW_EXIT_CODES.get(got["job_state"], 0) if follow else 0
            if code or incomplete:
                raise typer.Exit(code or 3)
            return
        seams(ctx).pause(0.5)


def _print_hosts(got: dict[str, Any], host: int | None, offsets: dict[int, int], raw: bool) -> None:
    """Print what one read brought, each line prefixed with its host when there are several."""
    many = host is None and len(got["hosts"]) > 1
    for h in got["hosts"]:
        offsets[h["host"]] = h["next_offset"]
        prefix = safe(f"[{h['slice']}/{h['worker_id']}] " if many else "")
        for line in h["data"].splitlines(keepends=True):
            typer.echo(prefix + (line if raw else safe(line, keep="\n\t")), nl=False, color=raw or None)


#: ``logs --follow``: how the followed job ended, as the exit code (0 only for SUCCEEDED; 1 and 2
#: are the client's own errors, 3 a finished job's incomplete log).
FOLLOW_EXIT_CODES = {"SUCCEEDED": 0, "FAILED": 4, "CANCELLED": 5}


def _warn_incomplete(got: dict[str, Any]) -> bool:
    """Say so (stderr) when a finished job's stored log is not its whole output; True when it did."""
    notes = [h for h in got["hosts"] if h.get("note") or h.get("truncated")]
    if got["job_state"] not in TERMINAL_STATES or not notes:
        return False
    for h in notes:
        why = safe(h.get("note") or "truncated")
        console_err.print(
            f"warning: the log of {safe(h['slice'])}/{h['worker_id']} is incomplete: {why}", highlight=False
        )
    return True


def _read_logs(
    client: Client, job_id: str, attempt: int | None, host: int | None, offsets: dict[int, int]
) -> Any:
    """One read: every host from its offset (one call per host once their number is known)."""
    if host is not None or not offsets:
        return client.logs(
            job_id, attempt=attempt, host=host, offset=offsets.get(host, 0) if host is not None else 0
        )
    parts = [client.logs(job_id, attempt=attempt, host=h, offset=o) for h, o in sorted(offsets.items())]
    return {**parts[-1], "hosts": [h for p in parts for h in p["hosts"]]}


@app.command("cancel", epilog=ERRORS)
def cancel_cmd(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.")],
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Cancel a job: stop every process and free its slices."""
    job = make_client(ctx, server, token).cancel(job_id)
    done = job["state"] == "CANCELLED"
    typer.echo(safe(f"{job['id']} {'cancelled' if done else 'cancelling (was ' + job['state'] + ')'}"))
