"""``tpufleet chaos``: a seeded soak that breaks an emulated fleet and its control plane while jobs run,
then checks nothing was lost, ran twice or leaked (docs/reliability.md; the logic is tpufleet.chaos)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from tpufleet.cli._app import app, console, console_err, print_json


def result_table(result: dict[str, Any]) -> Table:
    table = Table(box=box.SIMPLE, title=f"chaos soak, seed {result['seed']} on {result['slices']}")
    table.add_column("check")
    table.add_column("result", justify="right")
    table.add_column("detail")
    faults = ", ".join(f"{k} {v}" for k, v in result["faults"].items()) or "none"
    rows: list[tuple[str, Any, str]] = [
        ("jobs", result["jobs"], ""),
        ("succeeded", result["succeeded"], ""),
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
        ("seconds", result["seconds"], ""),
    ]
    for name, value, detail in rows:
        table.add_row(name, str(value), detail)
    return table


@app.command("chaos")
def chaos_cmd(
    seed: Annotated[int, typer.Option(help="Seeds the job stream, the fault times and their targets.")] = 0,
    jobs: Annotated[int, typer.Option(min=1, help="Jobs to submit, over the first half of the window.")] = 20,
    minutes: Annotated[
        float, typer.Option(min=0.05, help="The fault window; then every job gets --drain-timeout to end.")
    ] = 5.0,
    slices: Annotated[
        str, typer.Option(help="The emulated fleet to start, e.g. v4-8:2,v4-16:1 (what jobs ask for).")
    ] = "v4-8:2,v4-16:1",
    cpus_per_host: Annotated[int, typer.Option("--cpus-per-host", min=0, help="Logical CPUs per host.")] = 1,
    drain_timeout: Annotated[
        float, typer.Option("--drain-timeout", min=1, help="Seconds after the window for every job to end.")
    ] = 300.0,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            help="Keep the fleet's and control plane's files (logs, store, markers) here.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object instead of the table.")] = False,
) -> None:
    """Soak an emulated fleet: seeded jobs of mixed shapes, tenants and priorities while hosts are
    killed, slices preempted (with and without notice) and restored, and the control plane is
    SIGKILLed and restarted on the same store. Exits 0 only when no job was lost or ran twice, no
    placement group or job process leaked and every job ended (docs/reliability.md)."""
    from tpufleet.chaos import ChaosConfig, Soak, passed

    cfg = ChaosConfig(
        seed=seed,
        jobs=jobs,
        minutes=minutes,
        slices=slices,
        cpus_per_host=cpus_per_host,
        drain_timeout_s=drain_timeout,
        state_dir=state_dir,
    )
    soak = Soak(cfg, say=lambda m: console_err.print(m, highlight=False, markup=False))
    result = soak.run()
    if as_json:
        print_json(result)
    else:
        console.print(result_table(result))
    raise typer.Exit(0 if passed(result) else 1)
