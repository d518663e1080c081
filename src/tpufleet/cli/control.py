"""The control plane's client commands: tenants, jobs, logs, slices, status (``serve`` is ``serve.py``).

Client commands read ``--server``/``TPUFLEET_SERVER`` and ``--token``/``TPUFLEET_TOKEN``; without
a token they use the admin token that a local ``tpufleet serve`` wrote to
``<state-dir>/admin-token``, when it is readable. Tests hand an ``httpx.Client`` (e.g. FastAPI's
``TestClient``) to the commands through Click's context object (``obj=``), so the CLI runs against
the API in-process.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tpufleet.cli import serve as _serve  # noqa: F401  (registers `serve` first: the order of --help)
from tpufleet.cli._app import app, console, console_err, print_json
from tpufleet.cli.common import (
    ERRORS,
    JsonOpt,
    ServerOpt,
    TokenOpt,
    cell,
    checkpoint_text,
    make_client,
    safe,
    slice_app,
    tenant_app,
)
from tpufleet.client.http import DEFAULT_SERVER, Client
from tpufleet.control.store.values import DEFAULT_LIMITS
from tpufleet.errors import InputError, SpecError, TpufleetError
from tpufleet.scheduler.lifecycle import TERMINAL_STATES

TERMINAL = tuple(TERMINAL_STATES)  # the lifecycle's, as plain strings for comparisons with JSON

app.add_typer(tenant_app, name="tenant")  # here, not in common: the order of --help
app.add_typer(slice_app, name="slice")


def _kv(values: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"{item!r} is not KEY=VALUE", field=what)
        out[key.strip()] = value
    return out


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
    from tpufleet.cli.tenants import check_preemption, parse_quota

    chips = parse_quota(quota)
    check_preemption(preemption)
    out = make_client(ctx, server, token).create_tenant(name, chips, weight, preemption)
    if as_json:
        print_json({"name": out["name"], "token": out["token"]})
        return
    console_err.print(f"tenant {out['name']} created; its token (shown once):", highlight=False)
    typer.echo(out["token"])


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
        quota = ", ".join(f"{g}={c}" for g, c in t["quota"].items()) or "-"
        cells: list[Text | str] = [cell(t["name"]), cell(quota), f"{t['weight']:g}"]
        cells += [cell(t.get("preemption", "-")), checkpoint_text(t.get("checkpoints") or {})]
        table.add_row(*cells, *([cell(t.get("state", "active"))] if all_ else []))
    console.print(table)


@app.command("submit", epilog=ERRORS)
def submit_cmd(
    ctx: typer.Context,
    command: Annotated[
        list[str] | None, typer.Argument(help="The command run on every host, after --.", show_default=False)
    ] = None,
    accelerator_type: Annotated[
        str | None, typer.Option("--type", help="Slice type, e.g. v4-16, v6e-16.", show_default=False)
    ] = None,
    num_slices: Annotated[int, typer.Option("--num-slices", help="Slices (multi-slice when > 1).")] = 1,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    max_retries: Annotated[
        int | None, typer.Option("--max-retries", help="Retries after failures (default 2).")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Job name (default: from the command).")] = None,
    env: Annotated[list[str], typer.Option("--env", help="KEY=VALUE for every host; repeatable.")] = [],  # noqa: B006
    working_dir: Annotated[
        str | None,
        typer.Option(
            "--working-dir",
            help="A local directory, packed (without .git, __pycache__, .venv) and uploaded, or a URL "
            "the server allows; shipped to every host.",
        ),
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="With the admin token: submit for this tenant.")] = None,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="A Ray job: the command runs once, as a Ray driver through Ray's job submission; Ray "
            "Train's JaxTrainer lands on the slices admitted (docs/ray-jobs.md).",
        ),
    ] = False,
    batch: Annotated[
        Path | None,
        typer.Option(
            "--batch",
            metavar="FILE.jsonl",
            help="Queue many jobs at once, all or none: one JSON job body per line, the fields of "
            'POST /api/v1/jobs (e.g. {"command": ["python", "t.py"], "accelerator_type": "v4-16"}); '
            'at most 10,000 lines. Prints one id per line ({"ids": [...]} with --json).',
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Queue a job: `tpufleet submit --type v4-16 -- python train.py`. Prints the job id.

    Many jobs: `tpufleet submit --batch jobs.jsonl`; a bad line exits 2 naming the line."""
    if batch is not None:
        flags = (command, accelerator_type, name, working_dir, max_retries, env, ray)
        if any(flags) or (num_slices, priority) != (1, 0):
            raise SpecError("give --batch FILE.jsonl (job fields on each line) or one job's flags, not both")
        _submit_batch(make_client(ctx, server, token), batch, tenant, as_json)
        return
    if not command or not accelerator_type:
        raise SpecError(
            "give the slice type and the command, e.g. tpufleet submit --type v4-16 -- python train.py "
            "(or --batch FILE.jsonl)"
        )
    client = make_client(ctx, server, token)
    wd = _upload_working_dir(client, working_dir, tenant) if working_dir else None
    job = client.submit(
        command,
        accelerator_type,
        num_slices=num_slices,
        priority=priority,
        max_retries=max_retries,
        name=name,
        env=_kv(env, "--env"),
        working_dir=wd,
        tenant=tenant,
        kind="ray" if ray else "spmd",
    )
    if as_json:
        print_json({"id": job["id"]})
    else:
        typer.echo(job["id"])


def _submit_batch(client: Client, path: Path, tenant: str | None, as_json: bool) -> None:
    """Read the JSONL file, send it as one batch, print the ids; errors name the file and line."""
    from tpufleet.api.limits import MAX_BATCH_JOBS

    bodies, lines = read_batch(path, tenant)
    if len(bodies) > MAX_BATCH_JOBS:
        raise SpecError(f"{len(bodies):,} jobs; at most {MAX_BATCH_JOBS:,} in one batch", file=str(path))
    try:
        ids = client.submit_batch(bodies)
    except TpufleetError as err:
        found = re.match(r"jobs\[(\d+)\][.:]? ?(.*)", str(err))
        if found is None or int(found.group(1)) >= len(lines):
            raise
        line, rest = lines[int(found.group(1))], found.group(2)
        if isinstance(err, SpecError):
            raise SpecError(rest, file=str(path), line=line) from None
        raise type(err)(f"{path}:{line}: {rest}") from None
    if as_json:
        print_json({"ids": ids})
    else:
        typer.echo("\n".join(ids))


def read_batch(path: Path, tenant: str | None = None) -> tuple[list[dict[str, Any]], list[int]]:
    """The job bodies of a JSONL file (blank lines skipped) and the line number of each; ``tenant``
    fills in bodies that name none. A line that is not a JSON object is a SpecError naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read it ({err})") from None
    bodies: list[dict[str, Any]] = []
    lines: list[int] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            body = json.loads(raw)
        except ValueError as err:
            raise SpecError(f"not JSON ({err})", file=str(path), line=n) from None
        if not isinstance(body, dict):
            raise SpecError("each line is one job body, a JSON object", file=str(path), line=n)
        if tenant and "tenant" not in body:
            body["tenant"] = tenant
        bodies.append(body)
        lines.append(n)
    if not bodies:
        raise SpecError("no jobs in the file (one JSON job body per line)", file=str(path))
    return bodies, lines


def _upload_working_dir(client: Client, working_dir: str, tenant: str | None) -> str:
    """A ``scheme://`` URL as it is; a directory packed here (refused over the cap before any
    upload) and uploaded, its package id."""
    if "://" in working_dir:
        return working_dir
    path = Path(working_dir)
    if not path.is_dir():
        raise SpecError(f"{working_dir} is not a directory", field="--working-dir")
    from rich.progress import Progress

    with Progress(console=console_err, transient=True, disable=not console_err.is_terminal) as bar:
        task = bar.add_task(f"packing {path}", total=None)
        data = _pack(path, lambda done, total: bar.update(task, completed=done, total=total))
        bar.update(task, description=f"uploading {len(data):,} bytes")
        return client.upload_package(data, tenant=tenant)


def _pack(path: Path, progress: Any) -> bytes:
    from tpufleet.control.store import packages

    return packages.pack(path, DEFAULT_LIMITS, progress=progress)


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
    """Show one job: state, attempt, slices, and why it waits."""
    job = make_client(ctx, server, token).job(job_id)
    if as_json:
        print_json(job)
        return
    _show_job(job)


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
        ("state", j["state"]),
        ("attempt", f"{j['attempt']} (failures {j['failures']} of max_retries {j['max_retries']})"),
        ("type", f"{j['accelerator_type']} x {j['num_slices']}"),
        ("kind", "ray (one Ray driver; docs/ray-jobs.md)" if j.get("kind") == "ray" else "spmd"),
        ("slices", ", ".join(j["slices"]) or "-"),
        ("priority", str(j["priority"])),
        ("borrowing", "yes" if j["borrowing"] else "no"),
        ("reason", f"{j['reason_code']}: {j['reason']}" if j["reason"] else "-"),
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
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="Print the output unchanged (control characters included).")
    ] = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Print a job's output, every host or one (--host), live with --follow.

    A finished job whose stored output is not whole (a host's output past the per-host cap, or
    output that could not be collected from a lost host) gets a warning per host on stderr and
    exit code 3."""
    client = make_client(ctx, server, token)
    offsets: dict[int, int] = {}  # host -> characters printed
    shown: int | None = None
    while True:
        got = _read_logs(client, job_id, attempt, host, offsets)
        if shown is not None and got["attempt"] != shown:
            offsets.clear()  # a new attempt started: print it from its beginning
            console_err.print(f"--- attempt {got['attempt']} ---", highlight=False)
            shown = got["attempt"]
            continue
        shown = got["attempt"]
        many = host is None and len(got["hosts"]) > 1
        for h in got["hosts"]:
            offsets[h["host"]] = h["next_offset"]
            prefix = f"[{h['slice']}/{h['worker_id']}] " if many else ""
            prefix = safe(prefix)
            for line in h["data"].splitlines(keepends=True):
                typer.echo(prefix + (line if raw else safe(line, keep="\n\t")), nl=False, color=raw or None)
        if not follow or got["job_state"] in TERMINAL:  # a finished job's logs are all stored
            _warn_incomplete(got)
            return
        time.sleep(0.5)


def _warn_incomplete(got: dict[str, Any]) -> None:
    """Say so (stderr, exit 3) when a finished job's stored log is not its whole output."""
    notes = [h for h in got["hosts"] if h.get("note") or h.get("truncated")]
    if got["job_state"] not in TERMINAL or not notes:
        return
    for h in notes:
        why = safe(h.get("note") or "truncated")
        console_err.print(
            f"warning: the log of {safe(h['slice'])}/{h['worker_id']} is incomplete: {why}", highlight=False
        )
    raise typer.Exit(3)


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


@app.command("slices", epilog=ERRORS)
def slices_cmd(
    ctx: typer.Context, as_json: JsonOpt = False, server: ServerOpt = DEFAULT_SERVER, token: TokenOpt = None
) -> None:
    """List the fleet's slices: type, state (FREE, HELD, BROKEN, DRAINING), holder; with the admin
    token also the named slice groups: provider state and physical slices (`tpufleet slice create`)."""
    client = make_client(ctx, server, token)
    rows = client.slices()
    groups = _slice_groups(client)
    group_of = {s["name"]: g["name"] for g in groups for s in g["slices"]}
    if as_json:
        print_json(
            [
                {k: s[k] for k in ("name", "accelerator_type", "state", "holder", "topology", "problems")}
                | {"group": group_of.get(s["name"])}
                for s in rows
            ]
        )
        return
    table = Table(
        "name",
        "type",
        "topology",
        "hosts",
        "state",
        "holder",
        "problems",
        title=f"slices ({len(rows)})",
        title_justify="left",
    )
    for s in rows:
        table.add_row(
            cell(s["name"]),
            cell(s["accelerator_type"]),
            cell(s["topology"]),
            str(len(s["hosts"])),
            cell(s["state"]),
            cell(s["holder"] or "-"),
            cell("; ".join(s["problems"])),
        )
    console.print(table)
    if groups:
        from tpufleet.cli.slices import groups_table

        console.print(groups_table(groups))


def _slice_groups(client: Client) -> list[dict[str, Any]]:
    """The named slice groups (admin token); none for a tenant's token."""
    from tpufleet.errors import ForbiddenError

    try:
        return list(client.request("GET", "/api/v1/slice-groups"))
    except ForbiddenError:
        return []


@app.command("status", epilog=ERRORS)
def status_cmd(
    ctx: typer.Context, as_json: JsonOpt = False, server: ServerOpt = DEFAULT_SERVER, token: TokenOpt = None
) -> None:
    """The scheduler's figures (admin token): queued and running jobs, cycles, cycle times, slices."""
    got = make_client(ctx, server, token).status()
    if as_json:
        print_json(got)
        return
    rows = [
        ("state", "stalled" if got.get("stalled") else "cycling"),
        ("queued", str(got.get("queued", 0))),
        ("running", str(got.get("running", 0))),
        ("cycles", str(got.get("cycles", 0))),
        ("cycle", f"last {_ms(got.get('cycle_ms_last'))}, p50 {_ms(got.get('cycle_ms_p50'))}"),
        ("slices", ", ".join(f"{k} {v}" for k, v in sorted((got.get("slices") or {}).items())) or "-"),
    ]
    if got.get("last_error"):
        rows.append(("last error", str(got["last_error"])))
    for key, value in rows:
        console.print(f"[bold]{key:>10}[/]  {escape(safe(value))}", highlight=False)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


@slice_app.command("drain")
def drain_cmd(
    ctx: typer.Context, name: str, server: ServerOpt = DEFAULT_SERVER, token: TokenOpt = None
) -> None:
    """Place no new job on the slice; its current holder runs to the end."""
    s = make_client(ctx, server, token).drain(name, True)
    typer.echo(safe(f"{s['name']} {s['state']}"))


@slice_app.command("undrain")
def undrain_cmd(
    ctx: typer.Context, name: str, server: ServerOpt = DEFAULT_SERVER, token: TokenOpt = None
) -> None:
    """Let the scheduler place jobs on the slice again."""
    s = make_client(ctx, server, token).drain(name, False)
    typer.echo(safe(f"{s['name']} {s['state']}"))


# `slice create|delete|utilization` live in their own module and register on slice_app.
from tpufleet.cli import slices as _slices  # noqa: E402,F401  isort: skip
