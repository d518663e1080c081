"""``tpufleet emulate up|status|kill-host|preempt|restore|add|down`` and ``tpufleet doctor``.

The fleet outlives ``emulate up``: its processes run in the background and its state (PIDs,
ports, the Ray address) lives in ``--state-dir`` (default ``$TPUFLEET_EMULATOR_DIR``, else the
directory the last ``emulate up`` recorded in the CLI context, else ``~/.cache/tpufleet/emulator``),
which the other commands read.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from tpufleet.cli import context
from tpufleet.cli._app import app, console, print_json
from tpufleet.cli.common import finite, safe
from tpufleet.errors import NotFoundError, SpecError

if TYPE_CHECKING:
    from rich.console import Console

    from tpufleet import doctor

emulate_app = typer.Typer(
    help="A local Ray cluster whose hosts look like TPU slices to Ray, Ray Train and JAX.",
    no_args_is_help=True,
)
app.add_typer(emulate_app, name="emulate")

DEFAULT_STATE_DIR = Path("~/.cache/tpufleet/emulator").expanduser()

StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        envvar="TPUFLEET_EMULATOR_DIR",
        help="Where the fleet's state (PIDs, ports, Ray address) and launcher logs live "
        "(default: the one `emulate up` last recorded, see `tpufleet context`, else "
        "~/.cache/tpufleet/emulator).",
        show_default=False,
    ),
]


def state_dir_of(state_dir: Path | None) -> Path:
    """--state-dir / $TPUFLEET_EMULATOR_DIR, else the remembered context, else the default."""
    if state_dir is not None:
        return state_dir
    remembered = context.load().emulator_state_dir
    return Path(remembered) if remembered else DEFAULT_STATE_DIR


AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _fleet(state_dir: Path | None) -> Any:
    from tpufleet.emulator import EmulatedFleet

    return EmulatedFleet.attach(state_dir_of(state_dir))


def _show(status: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(status)
        return
    table = Table(title=f"emulated TPU fleet at {status['ray_address']}", title_justify="left")
    for col in ("slice", "type", "topology", "worker", "node", "alive"):
        table.add_column(col)
    for s in status["slices"]:
        for h in s["hosts"]:
            node = (h["node_id"] or "-")[:12]
            alive = "[green]yes[/]" if h["alive"] else "[red]no[/]"
            table.add_row(s["name"], s["accelerator_type"], s["topology"], str(h["worker_id"]), node, alive)
    console.print(table)


@emulate_app.command("up")
def up_cmd(
    slices: Annotated[str, typer.Option(help="Slice types and counts, e.g. v4-16:2,v6e-4.")] = "v4-16:2",
    cpus_per_host: Annotated[
        int,
        typer.Option(
            help="Logical CPUs each host offers Ray: its machine type's vCPUs (a v4 host has 240), capped "
            "at this, since every emulated host shares this machine (2+ for Ray Train with Ray Data)."
        ),
    ] = 1,
    state_dir: StateDir = None,
    as_json: AsJson = False,
) -> None:
    """Start the fleet in the background; return once every host has joined."""
    from tpufleet.emulator import EmulatedFleet

    if not slices.strip():
        raise SpecError("--slices is empty; give slice types and counts, e.g. v4-16:2,v6e-4")
    where = state_dir_of(state_dir).resolve()
    fleet = EmulatedFleet(slices, cpus_per_host=cpus_per_host, state_dir=where).up()
    context.remember(emulator_state_dir=str(where), ray_address=fleet.ray_address)
    _show(fleet.status(), as_json)


@emulate_app.command("status")
def status_cmd(state_dir: StateDir = None, as_json: AsJson = False) -> None:
    """Every slice and host of the running fleet, as Ray sees them."""
    _show(_fleet(state_dir).status(), as_json)


@emulate_app.command("kill-host")
def kill_host_cmd(
    slice_name: Annotated[str, typer.Argument(metavar="SLICE", help="e.g. tpu-v4-16-0")],
    worker_id: Annotated[int, typer.Argument(help="The host's TPU_WORKER_ID.")],
    wait: Annotated[bool, typer.Option(help="Return once Ray has declared the node dead.")] = True,
    state_dir: StateDir = None,
) -> None:
    """SIGKILL every process of one host at once, the way a crashed VM disappears."""
    _fleet(state_dir).kill_host(slice_name, worker_id, wait=wait)
    console.print(f"killed {slice_name} worker {worker_id}")


@emulate_app.command("preempt")
def preempt_cmd(
    slice_name: Annotated[str, typer.Argument(metavar="SLICE")],
    wait: Annotated[bool, typer.Option(help="Return once Ray has declared the nodes dead.")] = True,
    notice: Annotated[
        float,
        typer.Option(
            "--notice",
            callback=finite,
            help="Seconds of preemption notice first (GCE gives spot VMs 30): the hosts are drained "
            "for preemption in Ray with that deadline, providers report it, and this command waits "
            "it out before the hosts die together. 0: no notice.",
        ),
    ] = 0.0,
    state_dir: StateDir = None,
) -> None:
    """Remove every host of a slice at once, as a spot preemption does (with --notice, after a notice).

    With --notice, a slice that the control plane deleted before the deadline (reacting to the
    notice, as it should) has nothing left to preempt: that is said in one line, exit 0."""
    if notice < 0:
        raise SpecError(f"--notice must be >= 0 seconds, got {notice:g}")
    fleet = _fleet(state_dir)
    if notice:
        from tpufleet.emulator import spot

        deadline = spot.announce(fleet.state_dir, slice_name, notice)
        console.print(f"{slice_name}: preemption notice, the hosts die in {notice:g}s")
        if not spot.wait_out(fleet.state_dir, slice_name, deadline):
            console.print(
                f"{slice_name} was deleted before its deadline (the notice was acted on): nothing to preempt"
            )
            return
        if wait:  # killed, then maybe deleted by the control plane meanwhile: gone all the same
            with contextlib.suppress(NotFoundError):
                fleet.await_gone(slice_name)
    else:
        fleet.preempt(slice_name, wait=wait)
    console.print(f"preempted {slice_name}")


@emulate_app.command("restore")
def restore_cmd(
    slice_name: Annotated[str, typer.Argument(metavar="SLICE")],
    state_dir: StateDir = None,
) -> None:
    """Bring back the missing hosts of a slice with the same name and worker ids."""
    workers = _fleet(state_dir).restore(slice_name)
    done = ", ".join(map(str, workers)) if workers else "none were missing"
    console.print(f"restored {slice_name} workers: {done}")


@emulate_app.command("kill-head")
def kill_head_cmd(state_dir: StateDir = None) -> None:
    """SIGKILL the head (its GCS) the way a crashed head VM disappears: the Ray cluster is gone."""
    _fleet(state_dir).kill_head()
    console.print("killed the head; `tpufleet emulate restart` brings the fleet back")


@emulate_app.command("restart")
def restart_cmd(state_dir: StateDir = None) -> None:
    """Bring back a fleet whose head died: the head at the same address, every slice with the same names."""
    fleet = _fleet(state_dir)
    fleet.restart()
    console.print(
        f"restarted the fleet (Ray at {fleet.ray_address}; a new cluster, the old one's work is gone)"
    )


@emulate_app.command("add")
def add_cmd(
    accelerator_type: Annotated[str, typer.Argument(metavar="TYPE", help="e.g. v4-16 or v6e-4")],
    state_dir: StateDir = None,
) -> None:
    """Add one slice; prints its name."""
    console.print(_fleet(state_dir).add(accelerator_type))


@emulate_app.command("down")
def down_cmd(state_dir: StateDir = None) -> None:
    """Stop every process the fleet started, by PID; leaves nothing behind."""
    from tpufleet.emulator import EmulatedFleet

    where = state_dir_of(state_dir)
    EmulatedFleet("", state_dir=where).down()
    ctx = context.load()
    if ctx.emulator_state_dir and Path(ctx.emulator_state_dir) == where.resolve():
        context.forget("ray_address")  # the directory stays remembered for the next `emulate up`
    console.print(f"emulated fleet in {where} is down")


def _doctor_address(ray_address: str | None, state_dir: Path | None) -> str | None:
    """--ray-address, else the emulated fleet in ``state_dir``, else None: ``RAY_ADDRESS``."""
    if ray_address:
        return ray_address
    from tpufleet.emulator import EmulatedFleet

    state_dir = state_dir_of(state_dir)
    fleet = EmulatedFleet("", state_dir=state_dir)
    if fleet.head_alive():
        fleet.authenticate()  # Ray token auth: this process (and its ray.init) uses the fleet's token
        return str(fleet.ray_address)
    if os.environ.get("RAY_ADDRESS"):
        return None  # doctor.check reads it (and names it in errors)
    raise NotFoundError(
        f"no cluster to check: no emulated fleet runs from {state_dir}; "
        "give --ray-address, set RAY_ADDRESS or run `tpufleet emulate up`"
    )


@app.command("doctor")
def doctor_cmd(
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            help="GCS address host:port of any Ray cluster "
            "(default: the emulated fleet in --state-dir, else $RAY_ADDRESS).",
        ),
    ] = None,
    probe: Annotated[bool, typer.Option(help="Run one probe task per host (JAX devices, env).")] = True,
    state_dir: StateDir = None,
    as_json: AsJson = False,
) -> None:
    """Check a Ray cluster's TPU slices; exit 1 when anything is wrong."""
    from tpufleet import doctor

    report = doctor.check(_doctor_address(ray_address, state_dir), probe=probe)
    if as_json:
        print_json(report.to_dict())
    else:
        print_report(report, console)
    if not report.healthy:
        raise typer.Exit(1)


def print_report(report: doctor.Report, out: Console) -> None:
    """``doctor``'s report as text. Slice names and messages come from the cluster (a node's
    label, a drain's message, which any client of the GCS may write): shown, never obeyed."""
    out.print(f"TPU health of the Ray cluster at {escape(safe(report.ray_address))}", highlight=False)
    for accel, counts in report.by_type().items():
        intact = f"{counts['intact']} of {counts['slices']} slices intact"
        out.print(f"  {escape(safe(accel))}: {intact}", highlight=False)
    if not report.slices:
        out.print("  no TPU slices found")
    for f in report.findings:
        out.print(f"[red]  {escape(safe(f.slice))}:[/] {escape(safe(f.message))}", highlight=False)
    for name, why in report.gone:  # both from the cluster: a node's label, a drain's message
        out.print(f"  {safe(name)}: gone ({safe(why)}); not checked", highlight=False, markup=False)
    out.print("[green]healthy[/]" if report.healthy else f"[red]{len(report.findings)} finding(s)[/]")


def running_fleet_address(
    state_dir: Path | None, *, wait: bool = False, fleet: Any = None
) -> tuple[Path, str]:
    """``(state dir, Ray address)`` of the emulated fleet running from ``state_dir`` (default: the
    remembered or default one), for ``tpufleet serve``; a NotFoundError naming the directory if none
    (with ``wait``, after a lost head: wait for the fleet's head to run again, however long).
    ``fleet``: the ``EmulatedFleet`` of that directory (made here by default; tests give a stand-in)."""
    from tpufleet.control.ray.headwatch import await_head
    from tpufleet.emulator import EmulatedFleet

    where = state_dir_of(state_dir)
    fleet = fleet or EmulatedFleet("", state_dir=where)
    if wait:
        await_head(fleet.head_alive)
    if not fleet.head_alive():
        raise NotFoundError(
            f"no emulated fleet runs from {where}; start one with `tpufleet emulate up` "
            "or give --ray-address HOST:PORT"
        )
    fleet.authenticate()  # Ray token auth: this process's ray.init uses the fleet's token
    return where, str(fleet.ray_address)
