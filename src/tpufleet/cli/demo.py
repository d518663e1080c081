"""``tpufleet demo``: the main job, end to end on one machine.

It starts an emulated fleet (two v4-16 slices and one v6e-16 by default), the control plane
around the real Ray executor, two tenants, and submits ``examples/train_mlp.py``: a one-slice job
for ``research`` on the v6e-16, a two-slice (multi-slice) job for ``prod`` on both v4-16s, and a
third job for ``research`` that has to wait for a v4-16, and a Ray job for ``research``
(``examples/train_jaxtrainer.py``: Ray Train's JaxTrainer over a Ray Data pipeline, submitted with
``kind=ray``) that waits for a v4-16 too. With ``--chaos`` it also kills one host of
the multi-slice job half-way, so the attempt ends on every host, the slice is quarantined and the
job resumes from its checkpoint when the host is back. It shows live progress, then a summary of
every job, and tears everything down on completion or Ctrl-C.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from tpufleet.cli._app import app, console
from tpufleet.cli.common import finite
from tpufleet.cli.cost import money, ratio
from tpufleet.errors import InputError
from tpufleet.scheduler.lifecycle import TERMINAL_STATES

DEMO_SLICES = "v4-16:2,v6e-16:1"
TERMINAL = tuple(TERMINAL_STATES)  # the lifecycle's, as plain strings for comparisons with JSON
STATE_STYLE = {
    "QUEUED": "yellow", "ADMITTED": "cyan", "STARTING": "cyan", "RUNNING": "bold green",
    "SUCCEEDED": "green", "FAILED": "bold red", "CANCELLED": "dim",
    "FREE": "green", "HELD": "cyan", "BROKEN": "bold red", "DRAINING": "yellow",
}  # fmt: skip
LOSS = re.compile(r"step (\d+) loss ([0-9.]+)")
CHECKPOINT = re.compile(r"step-(\d+)\.pkl")  # train_mlp's checkpoint files


def _package(script: Path) -> bytes:
    """A zip holding just ``script``, as ``tpufleet submit --working-dir`` would upload it."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.write(script, script.name)
    return buf.getvalue()


# With --chaos, the multi-slice job's steps take this long and it checkpoints this often; its host
# is killed once the job's first checkpoint is on disk (the demo's own emulated hosts share its
# disk). Not on the step its output shows: output reaches the demo through the loop's copy, which on
# a loaded machine lags seconds behind, and CI runs ended the job before the kill three times so.
CHAOS_STEP_S = 1.5
CHAOS_CHECKPOINT_EVERY = 2


def _chaos_every(steps: int) -> int:
    """How often the chaos job checkpoints: a run of 2 steps at step 1, so it has a checkpoint
    before its last step to be killed after and resume from."""
    return min(CHAOS_CHECKPOINT_EVERY, steps - 1)


def _paced(cmd: list[str], step_s: float, checkpoint_every: int) -> list[str]:
    """``cmd`` with its ``--step-time`` and ``--checkpoint-every`` set."""
    out = list(cmd)
    out[out.index("--step-time") + 1] = str(step_s)
    out[out.index("--checkpoint-every") + 1] = str(checkpoint_every)
    return out


def _ray_job(client: Any, script: Path, steps: int) -> dict[str, Any]:
    """The Ray job: examples/train_jaxtrainer.py as a Ray driver (JaxTrainer over a Ray Data
    pipeline) on a v4-16 that tpufleet admits, beside the SPMD jobs."""
    cmd = [sys.executable, script.name, "--steps", str(steps), "--checkpoint-every", "5"]
    cmd += ["--step-time", "0.2"]
    code = client.upload_package(_package(script))
    return dict(client.submit(cmd, "v4-16", name="jaxtrainer-ray", working_dir=code, kind="ray"))


def _train_script() -> Path:
    """examples/train_mlp.py of this checkout (the demo runs from the repository, like `make demo`)."""
    for root in (Path.cwd(), *Path(__file__).resolve().parents):
        candidate = root / "examples" / "train_mlp.py"
        if candidate.is_file():
            return candidate
    raise InputError("examples/train_mlp.py not found; run the demo from the tpufleet repository (make demo)")


@dataclass
class Progress_:
    """What the live view knows about one job: its record and the newest loss line of host 0."""

    job: dict[str, Any]
    offset: int = 0
    attempt: int = 0
    step: int | None = None
    loss: float | None = None
    losses: list[float] = field(default_factory=list)


def _styled(state: str) -> str:
    return f"[{STATE_STYLE.get(state, 'white')}]{state}[/]"


def _jobs_table(tracked: dict[str, Progress_], steps: int) -> Table:
    table = Table(title="jobs", title_justify="left", expand=True)
    for col in ("job", "tenant", "name", "type", "state", "attempt", "slices", "step", "loss", "why"):
        table.add_column(col, overflow="fold")
    for jid, p in tracked.items():
        j = p.job
        why = j.get("reason") or "" if j["state"] in ("QUEUED", "FAILED") else ""
        table.add_row(
            jid, j["tenant"], j["name"], f"{j['accelerator_type']} x{j['num_slices']}", _styled(j["state"]),
            str(j["attempt"]), ", ".join(j["slices"]) or "-",
            f"{p.step}/{steps}" if p.step is not None else "-",
            f"{p.loss:.4f}" if p.loss is not None else "-", why,
        )  # fmt: skip
    return table


def _slices_table(slices: list[dict[str, Any]]) -> Table:
    table = Table(title="slices (one square per chip)", title_justify="left", expand=True)
    for col in ("slice", "type", "state", "holder", "chips"):
        table.add_column(col)
    for s in slices:
        chips = _chip_count(s["accelerator_type"])
        square = f"[{STATE_STYLE.get(s['state'], 'white')}]■[/]"
        table.add_row(
            s["name"], s["accelerator_type"], _styled(s["state"]), s.get("holder") or "-", square * chips
        )
    return table


def _chip_count(accelerator_type: str) -> int:
    from tpufleet.catalog import slice_type

    return slice_type(accelerator_type).chips


def _follow(client: Any, p: Progress_) -> None:
    """Read new output of host 0 of the job's current attempt and keep the newest step and loss."""
    if p.job["attempt"] != p.attempt:
        p.attempt, p.offset = p.job["attempt"], 0
    if p.job["state"] == "QUEUED":
        return
    read = client.logs(p.job["id"], host=0, offset=p.offset)
    for host in read.get("hosts", []):
        p.offset = host["next_offset"]
        for step, loss in LOSS.findall(host["data"]):
            p.step, p.loss = int(step), float(loss)
            p.losses.append(float(loss))


@contextmanager
def _spinner(text: str) -> Iterator[None]:
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
    ) as bar:
        bar.add_task(text, total=None)
        yield
    console.print(f"[green]✓[/] {text}")


@app.command("demo")
def demo_cmd(
    slices: Annotated[str, typer.Option(help="The emulated fleet, as TYPE:COUNT,...")] = DEMO_SLICES,
    steps: Annotated[int, typer.Option(min=2, help="Training steps per job.")] = 30,
    chaos: Annotated[
        bool, typer.Option(help="Kill a host of the multi-slice job after its first checkpoint.")
    ] = False,
    state_dir: Annotated[
        Path | None,
        typer.Option(help="Where the fleet, database and checkpoints live (default: a temp dir)."),
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=1, callback=finite, help="Give up after this many seconds.")
    ] = 900.0,
    autoscale: Annotated[
        bool,
        typer.Option(
            "--autoscale",
            help="Instead: slices that come and go. No slice at first; one job makes the autoscaler ask "
            "the emulator provider for a spot slice, a spot notice half-way moves it to a replacement "
            "(no retry used), and the idle slice is deleted afterwards (docs/provisioning.md).",
        ),
    ] = False,
) -> None:
    """The main job: an emulated TPU fleet, the control plane, two tenants and three training jobs."""
    if autoscale:
        from tpufleet.cli import demo_autoscale

        script = _train_script()
        if not demo_autoscale.run(script, _package(script), steps, state_dir, timeout):
            raise typer.Exit(1)
        return
    from tpufleet.api.server import ControlPlane
    from tpufleet.client.http import Client
    from tpufleet.control.ray.client import RayExecutor
    from tpufleet.control.store.values import Limits
    from tpufleet.emulator import EmulatedFleet

    script = _train_script()
    own_dir = state_dir is None
    root = Path(tempfile.mkdtemp(prefix="tpufleet-demo-")) if state_dir is None else state_dir
    with ExitStack() as stack:
        if own_dir:
            stack.callback(shutil.rmtree, root, ignore_errors=True)
        # 2 logical CPUs per host: Ray Train's workers and Ray Data's tasks of the Ray job need both
        fleet = EmulatedFleet(slices, cpus_per_host=2, state_dir=root / "fleet")
        stack.callback(fleet.down)
        with _spinner(f"emulated fleet {slices} up"):
            fleet.up()
        cluster = RayExecutor.connect(fleet.ray_address)
        stack.callback(cluster.release_all)
        limits = Limits(ray_jobs=True)  # the demo's tenants may run Ray jobs (docs/ray-jobs.md)
        cp = stack.enter_context(ControlPlane(cluster, state_dir=root / "control", limits=limits))
        with _spinner("control plane serving"):
            url = cp.start_http()
        console.print(f"  API {url}/api/v1 (schema {url}/openapi.json); admin token in {cp.admin_token_path}")
        console.print(f"  fleet page {url}/ (sign in with that admin token)")
        admin = stack.enter_context(Client(url, cp.admin_token))
        research = admin.create_tenant("research", {"v6e": 16, "v4": 8}, weight=2)
        prod = admin.create_tenant("prod", {"v4": 16})
        console.print("  tenants: research (quota v6e=16, v4=8 chips, weight 2), prod (quota v4=16 chips)")
        rc = stack.enter_context(Client(url, research["token"]))
        pc = stack.enter_context(Client(url, prod["token"]))
        # Each tenant uploads the training script as its job's code (its working directory on
        # every host): the control plane never reads a path of its own disk for a job.
        code = {"rc": rc.upload_package(_package(script)), "pc": pc.upload_package(_package(script))}
        cmd = [
            sys.executable,
            script.name,
            "--steps",
            str(steps),
            "--checkpoint-every",
            "5",
            "--step-time",
            "0.2",
        ]
        started = time.monotonic()  # the summary's window: utilization and cost since the first submit
        submitted = [
            rc.submit(cmd, "v6e-16", name="mlp-v6e", working_dir=code["rc"]),
            pc.submit(
                _paced(cmd, CHAOS_STEP_S, _chaos_every(steps)) if chaos else cmd,
                "v4-16",
                num_slices=2,
                name="mlp-multislice",
                max_retries=3,
                working_dir=code["pc"],
            ),
            rc.submit(cmd, "v4-16", name="mlp-v4-waits", working_dir=code["rc"]),
            _ray_job(rc, script.with_name("train_jaxtrainer.py"), steps),
        ]
        tracked = {s["id"]: Progress_(job=admin.job(s["id"])) for s in submitted}
        multislice = submitted[1]["id"]
        chaos_at = (multislice, _checkpoints(cp, tracked[multislice].job)) if chaos else None
        _watch(admin, fleet, tracked, steps, timeout, chaos_at)
        rows = _summary(admin, tracked, time.monotonic() - started)
        (root / "summary.json").write_text(json.dumps(rows, indent=2))
        failed = [jid for jid, p in tracked.items() if p.job["state"] != "SUCCEEDED"]
        console.print("tearing down: control plane, warm reservations, emulated fleet")
    if failed:
        raise typer.Exit(1)


def _checkpoints(cp: Any, job: dict[str, Any]) -> Path:
    """The job's TPUFLEET_CHECKPOINT_DIR, as its hosts see it (the emulated hosts share this disk)."""
    from tpufleet.host.jobfiles import run_paths

    return run_paths(cp.service.job_root, job["tenant"], job["id"], 1, "-").checkpoint


def _watch(
    admin: Any,
    fleet: Any,
    tracked: dict[str, Progress_],
    steps: int,
    timeout: float,
    chaos_at: tuple[str, Path] | None,
) -> None:
    deadline = time.monotonic() + timeout
    killed: str | None = None
    with Live(console=console, refresh_per_second=4) as live:
        while True:
            for jid, p in tracked.items():
                p.job = admin.job(jid)
                _follow(admin, p)
            if chaos_at and killed is None:
                killed = _maybe_kill(fleet, tracked[chaos_at[0]], chaos_at[1], steps)
            if killed and _broken_seen(admin, killed):
                fleet.restore(killed)  # the host comes back; the job resumes from its checkpoint
                console.print(f"[green]restored[/] {killed}; the job resumes from its last checkpoint")
                killed = ""
            live.update(Group(_jobs_table(tracked, steps), _slices_table(admin.slices())))
            if all(p.job["state"] in TERMINAL for p in tracked.values()):
                return
            if time.monotonic() > deadline:
                for jid in tracked:
                    admin.cancel(jid)
                raise InputError(f"the demo did not finish in {timeout:.0f} s; jobs cancelled")
            time.sleep(0.5)


def _maybe_kill(fleet: Any, p: Progress_, checkpoints: Path, steps: int) -> str | None:
    """Kill host 1 of the job's last slice once its first checkpoint is written (so there is one
    to resume from) and while it runs its first attempt; the slice's name, or None (not yet)."""
    if p.job["state"] != "RUNNING" or p.job["attempt"] != 1:
        return None
    # train_mlp writes step-<N>.pkl atomically (see _chaos_every); the last step's ends the job. A
    # directory not made yet (the job has not started) or not readable globs to nothing.
    found = (CHECKPOINT.fullmatch(f.name) for f in checkpoints.glob("step-*.pkl"))
    saved = [step for m in found if m and (step := int(m[1])) < steps]
    if not saved:
        return None
    victim = p.job["slices"][-1]
    fleet.kill_host(victim, 1, wait=False)
    console.print(
        f"[bold red]chaos:[/] killed host 1 of {victim} after job {p.job['id']} wrote its checkpoint "
        f"at step {max(saved)}"
    )
    return str(victim)


def _broken_seen(admin: Any, slice_name: str) -> bool:
    return any(s["name"] == slice_name and s["state"] == "BROKEN" for s in admin.slices())


def _summary(admin: Any, tracked: dict[str, Progress_], window_s: float) -> list[dict[str, Any]]:
    """Print the summary table, the fleet's utilization and the cost over the demo's ``window_s``;
    return the rows (also written to <state-dir>/summary.json)."""
    cost = admin.request("GET", "/api/v1/cost", params={"since": f"{window_s + 1:.0f}"})
    priced = {c["job_id"]: c for c in cost["jobs"]}
    rows: list[dict[str, Any]] = []
    table = Table(title="summary", title_justify="left")
    columns = ("job", "tenant", "name", "state", "attempts", "waited s", "ran s", "first loss", "last loss")
    for col in (*columns, "goodput", "cost"):
        table.add_column(col)
    for jid, p in tracked.items():
        j = admin.job(jid)
        waited = (j["started_at"] or j["finished_at"] or 0) - j["submitted_at"]
        ran = (j["finished_at"] or 0) - (j["started_at"] or j["finished_at"] or 0)
        good, paid = j["goodput"]["ratio"], priced.get(jid, {}).get("dollars")
        table.add_row(
            jid, j["tenant"], j["name"], _styled(j["state"]), str(j["attempt"]), f"{max(waited, 0):.1f}",
            f"{max(ran, 0):.1f}", f"{p.losses[0]:.4f}" if p.losses else "-",
            f"{p.losses[-1]:.4f}" if p.losses else "-", ratio(good), money(paid),
        )  # fmt: skip
        keys = ("id", "tenant", "name", "state", "attempt", "slices", "num_slices")
        rows.append({k: j[k] for k in keys} | {"losses": p.losses, "goodput": j["goodput"], "dollars": paid})
    console.print(
        Panel(Group(table, *_fleet_lines(admin, cost, window_s)), title="tpufleet demo", expand=False)
    )
    return rows


def _fleet_lines(admin: Any, cost: dict[str, Any], window_s: float) -> list[str]:
    """Utilization (chip-time held by jobs over the fleet's chip-time) and cost of the window."""
    chips = sum(_chip_count(s["accelerator_type"]) for s in admin.slices())
    held_h = sum(t["chip_hours"] for t in cost["tenants"])
    used = held_h * 3600 / (chips * window_s) if chips and window_s > 0 else 0.0
    each = ", ".join(
        f"{t['tenant']} {money(t['dollars'], t['unpriced_chip_hours'])}" for t in cost["tenants"]
    )
    total = sum(t["dollars"] or 0.0 for t in cost["tenants"])
    lost = sum(t["badput_dollars"] or 0.0 for t in cost["tenants"])
    return [
        f"utilization: {used * 100:.0f}% of the fleet's {chips} chips held by jobs over {window_s:.0f} s "
        f"({held_h:.2f} chip-hours)",
        f"cost at list prices: {money(total)} ({each or 'nothing ran'}); lost to badput {money(lost)} "
        "(tpufleet cost; docs/observability.md)",
    ]
