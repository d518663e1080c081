"""``tpufleet chaos``: a seeded soak that breaks an emulated fleet and its control plane while jobs run,
then checks nothing was lost, ran twice or leaked (docs/reliability.md; the logic is tpufleet.chaos)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from tpufleet.cli._app import app, console, console_err, print_json
from tpufleet.cli.common import finite
from tpufleet.control.store.values import check_db_url
from tpufleet.errors import SpecError


def result_table(result: dict[str, Any]) -> Table:
    table = Table(box=box.SIMPLE, title=f"chaos soak, seed {result['seed']} on {result['slices']}")
    table.add_column("check")
    table.add_column("result", justify="right")
    table.add_column("detail")
    faults = ", ".join(f"{k} {v}" for k, v in result["faults"].items()) or "none"
    rows: list[tuple[str, Any, str]] = [
        ("jobs", result["jobs"], f"{result.get('ray_jobs', 0)} of them Ray jobs"),
        ("succeeded", result["succeeded"], f"{result.get('ray_succeeded', 0)} of them Ray jobs"),
        ("failed", len(result["failed"]), "; ".join(f"{f['name']}: {f['reason']}" for f in result["failed"])),
        ("lost", len(result["lost"]), "; ".join(f"{x['name']}: {x['why']}" for x in result["lost"])),
        (
            "double_runs",
            len(result["double_runs"]),
            "; ".join(f"{d['name']}: {', '.join(d['why'])}" for d in result["double_runs"]),
        ),
        (
            "leaked_placement_groups",
            len(result["leaked_placement_groups"]),
            ", ".join(p["name"] or p["id"] for p in result["leaked_placement_groups"]),
        ),
        ("leaked_processes", len(result["leaked_processes"]), " ".join(map(str, result["leaked_processes"]))),
        ("faults", sum(v for k, v in result["faults"].items() if k != "skipped"), faults),
    ]
    if "overlapping_leaders" in result:
        terms = (
            f"{result['terms']} terms, {result['stamped_writes']} writes with a fencing token, "
            f"{result.get('refused_writes', 0)} refused by the fence"
        )
        why = "; ".join(o["why"] for o in result["overlapping_leaders"])
        rows.append(("overlapping_leaders", len(result["overlapping_leaders"]), why or terms))
    rows += [
        ("seconds", result["seconds"], ""),
    ]
    for name, value, detail in rows:
        table.add_row(name, str(value), detail)
    return table


def _running_fleet(address: str | None, emulator_dir: Path | None) -> tuple[Path, str]:
    """The state directory of the emulated fleet to soak, and its slices as ``--slices`` spells them."""
    from collections import Counter

    from tpufleet.cli.emulate import state_dir_of
    from tpufleet.emulator import EmulatedFleet

    where = state_dir_of(emulator_dir)
    fleet = EmulatedFleet("", state_dir=where)
    if not fleet.head_alive():
        raise SpecError(
            f"no emulated fleet runs from {where}: the soak breaks hosts through the emulator, so give "
            "--emulator-dir of a running one (`tpufleet emulate up`)",
            field="--emulator-dir",
        )
    if address is not None and fleet.ray_address != address:
        raise SpecError(
            f"the emulated fleet in {where} runs at {fleet.ray_address}, not {address}; give --emulator-dir "
            "of the fleet at that address",
            field="--ray-address",
        )
    counts = Counter(s["accelerator_type"] for s in fleet.status()["slices"])
    if not counts:
        raise SpecError(f"the emulated fleet in {where} has no slices to run jobs on", field="--emulator-dir")
    return where, ",".join(f"{t}:{n}" for t, n in sorted(counts.items()))


def _server_access(server: str, token: str | None, state_dir: Path | None) -> tuple[str, Path]:
    """The admin token and state directory of ``server``: given, else what its `serve` remembered."""
    from tpufleet.cli import context
    from tpufleet.cli.common import read_token

    remembered = context.load()
    same = remembered.server is not None and remembered.server.rstrip("/") == server.rstrip("/")
    if token is None and same and remembered.admin_token_path:
        token = read_token(Path(remembered.admin_token_path))  # None when it is gone: asked for below
    if state_dir is None and same and remembered.server_state_dir:
        state_dir = Path(remembered.server_state_dir)
    if not token:
        raise SpecError(f"--server {server}: give its admin token with --token", field="--token")
    if state_dir is None:
        raise SpecError(
            f"--server {server}: give its --state-dir with --server-state-dir", field="--server-state-dir"
        )
    return token, state_dir


def _check_replicas(
    ctx: typer.Context, replicas: int, db: str | None, server: str | None, sandbox: str | None, given: Any
) -> None:
    """--replicas, --db, --lease-seconds and --sandbox go together, on PostgreSQL (SpecError)."""
    if not replicas:
        for name, value in (("--db", db), ("--sandbox", sandbox)):
            if value is not None:
                raise SpecError(f"{name} goes with --replicas N", field=name)
        if ctx.get_parameter_source("lease_seconds").name == "COMMANDLINE":  # type: ignore[union-attr]
            raise SpecError("--lease-seconds goes with --replicas N", field="--lease-seconds")
        return
    if db is not None:
        check_db_url(db)
    if db is None or not db.startswith("postgresql"):
        raise SpecError(
            f"--replicas {replicas} runs replicas on one PostgreSQL database: give --db "
            "postgresql+psycopg://USER@HOST/DB (SQLite takes one serve)",
            field="--db",
        )
    if server is not None:
        raise SpecError("--replicas starts replicas of the soak's own: not with --server", field="--server")
    if sandbox is not None and (given or ctx.get_parameter_source("slices").name == "COMMANDLINE"):  # type: ignore[union-attr]
        raise SpecError(
            "--sandbox SLICES is the replicas' fleet: not with --slices, --ray-address or --emulator-dir",
            field="--sandbox",
        )
    if sandbox is not None:
        from tpufleet.control.cluster.memory import fleet_slices

        fleet_slices(sandbox)  # a bad spec fails here, in one line


@app.command("chaos")
def chaos_cmd(
    ctx: typer.Context,
    seed: Annotated[int, typer.Option(help="Seeds the job stream, the fault times and their targets.")] = 0,
    jobs: Annotated[int, typer.Option(min=1, help="Jobs to submit, over the first half of the window.")] = 20,
    minutes: Annotated[
        float,
        typer.Option(
            min=0.05, callback=finite, help="The fault window; then every job gets --drain-timeout to end."
        ),
    ] = 5.0,
    slices: Annotated[
        str, typer.Option(help="The emulated fleet to start, e.g. v4-8:2,v4-16:1 (what jobs ask for).")
    ] = "v4-8:2,v4-16:1",
    cpus_per_host: Annotated[int, typer.Option("--cpus-per-host", min=0, help="Logical CPUs per host.")] = 1,
    ray_jobs: Annotated[
        float,
        typer.Option(
            "--ray-jobs",
            callback=finite,
            min=0.0,
            max=1.0,
            help="The share of the jobs that are Ray jobs (a driver reserving its slices with "
            "SlicePlacementGroup, one task per host); 0 for a --server without --allow-ray-jobs.",
        ),
    ] = 0.25,
    drain_timeout: Annotated[
        float,
        typer.Option(
            "--drain-timeout", callback=finite, min=1, help="Seconds after the window for every job to end."
        ),
    ] = 300.0,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            help="Keep the fleet's and control plane's files (logs, store, markers) here.",
            show_default=False,
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            metavar="HOST:PORT",
            help="Soak an emulated fleet that already runs at this address (found in --emulator-dir): "
            "its slices are what jobs ask for; it is broken, repaired and left running.",
            show_default=False,
        ),
    ] = None,
    emulator_dir: Annotated[
        Path | None,
        typer.Option(
            "--emulator-dir",
            help="Where that fleet's state is (default: the remembered or default emulator directory).",
            show_default=False,
        ),
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            metavar="URL",
            help="Soak a control plane that already serves that fleet on this machine: it is SIGKILLed "
            "and started again as it ran, and left running. Needs --ray-address or --emulator-dir.",
            show_default=False,
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="TPUFLEET_TOKEN",
            help="--server's admin token (default: remembered).",
            show_default=False,
        ),
    ] = None,
    server_state_dir: Annotated[
        Path | None,
        typer.Option(
            "--server-state-dir",
            help="--server's --state-dir, where its jobs' checkpoint directories (and the markers) are "
            "(default: remembered by its `tpufleet serve`).",
            show_default=False,
        ),
    ] = None,
    replicas: Annotated[
        int,
        typer.Option(
            "--replicas",
            min=0,
            help="Run N `serve` replicas of the soak's own on --db (PostgreSQL) and add leader faults: "
            "the leader SIGKILLed, SIGSTOPped past its lease, SIGTERMed, every replica killed at once; "
            "the verdict adds overlapping_leaders (from the store's fencing tokens).",
        ),
    ] = 0,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="URL",
            help="With --replicas: the PostgreSQL database the replicas share (postgresql+psycopg://...).",
            show_default=False,
        ),
    ] = None,
    lease_seconds: Annotated[
        float,
        typer.Option(
            "--lease-seconds", callback=finite, min=0.5, help="With --replicas: the replicas' lease."
        ),
    ] = 3.0,
    sandbox: Annotated[
        str | None,
        typer.Option(
            "--sandbox",
            metavar="SLICES",
            help="With --replicas: the replicas serve this in-memory fleet (`serve --sandbox`, no Ray, "
            "nothing executed), and the faults are the leader faults only.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object instead of the table.")] = False,
) -> None:
    """Soak an emulated fleet: seeded jobs of mixed shapes, tenants and priorities while hosts are
    killed, slices preempted (with and without notice) and restored, the control plane is
    SIGKILLed and restarted on the same store, and once the Ray head is killed and the fleet
    restarted in place. With --replicas N (PostgreSQL --db), N replicas and leader faults instead
    of the control plane's kill; with --sandbox too, on in-memory fleets, leader faults only.
    Exits 0 only when no job was lost or ran twice, no placement group or job process leaked,
    every job ended and, with replicas, no two leaders acted at once (docs/reliability.md)."""
    from tpufleet.chaos import ChaosConfig, Soak, passed

    fleet_dir, server_dir = None, None
    _check_replicas(ctx, replicas, db, server, sandbox, ray_address or emulator_dir)
    if sandbox is not None:
        slices, ray_jobs = sandbox, 0.0
    if ray_address or emulator_dir:
        if ctx.get_parameter_source("slices").name == "COMMANDLINE":  # type: ignore[union-attr]
            raise SpecError(
                "--slices starts a fleet of the soak's own: not with --ray-address/--emulator-dir"
            )
        fleet_dir, slices = _running_fleet(ray_address, emulator_dir)
    if server is not None:
        if fleet_dir is None:
            raise SpecError(
                "--server: give --ray-address (or --emulator-dir) of the emulated fleet it serves"
            )
        token, server_dir = _server_access(server, token, server_state_dir)
    cfg = ChaosConfig(
        seed=seed,
        jobs=jobs,
        minutes=minutes,
        slices=slices,
        cpus_per_host=cpus_per_host,
        ray_jobs=ray_jobs,
        drain_timeout_s=drain_timeout,
        state_dir=state_dir,
        fleet_dir=fleet_dir,
        server=server,
        token=token,
        server_state_dir=server_dir,
        replicas=replicas,
        db=db,
        lease_s=lease_seconds,
        sandbox=sandbox,
    )
    soak = Soak(cfg, say=lambda m: console_err.print(m, highlight=False, markup=False))
    result = soak.run()
    if as_json:
        print_json(result)
    else:
        console.print(result_table(result))
    raise typer.Exit(0 if passed(result) else 1)
