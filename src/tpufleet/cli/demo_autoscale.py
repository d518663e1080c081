"""``tpufleet demo --autoscale``: slices that come and go, end to end on one machine.

An emulated fleet with no TPU slice at all, the control plane with the emulator provider and one
spot pool (``v4-8``, ``min_slices: 0``, ``max_slices: 2``, idle timeout 10 s), and one training job
(``examples/train_mlp.py``): the job waits ``PROVISIONING`` -> a slice appears -> the job runs.
Half-way the slice gets a spot preemption notice (as GCE gives, 10 s here): every process of the
attempt gets SIGTERM and checkpoints, the job is requeued without using a retry, the autoscaler
asks for a replacement and attempt 2 resumes from the checkpoint. Once it succeeded, the idle slice
is deleted after the timeout. Everything is torn down on completion or Ctrl-C.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.table import Table

from tpufleet.cli._app import console
from tpufleet.errors import InputError

__all__ = ["run"]

STEP = re.compile(r"step (\d+) loss")
NOTICE_S = 10.0


def run(script: Path, package: bytes, steps: int, state_dir: Path | None, timeout: float) -> bool:
    """The demo; True when the job succeeded and the pool went back to zero slices."""
    from tpufleet.api.server import ControlPlane
    from tpufleet.client.http import Client
    from tpufleet.control.loop.provisioner import ProvisionConfig
    from tpufleet.control.ray.client import RayExecutor
    from tpufleet.emulator import EmulatedFleet
    from tpufleet.provision.emulator import EmulatorConfig, EmulatorProvider
    from tpufleet.scheduler.autoscale import PoolView

    root = Path(tempfile.mkdtemp(prefix="tpufleet-autoscale-")) if state_dir is None else state_dir
    with ExitStack() as stack:
        if state_dir is None:
            stack.callback(shutil.rmtree, root, ignore_errors=True)
        fleet = EmulatedFleet("", cpus_per_host=1, state_dir=root / "fleet")
        stack.callback(fleet.down)
        console.print("emulated fleet: a Ray head and no TPU slice yet")
        fleet.up()
        provider = EmulatorProvider(root / "fleet", EmulatorConfig(delay_s=2.0, notice_s=NOTICE_S))
        stack.callback(provider.close)
        cluster = RayExecutor.connect(fleet.ray_address)
        stack.callback(cluster.release_all)
        pool = PoolView("spot-v4", "v4-8", min_slices=0, max_slices=2, spot=True)
        scaling = ProvisionConfig(pools=(pool,), idle_timeout_s=10.0)
        cp = stack.enter_context(
            ControlPlane(cluster, state_dir=root / "control", provider=provider, provision=scaling)
        )
        url = cp.start_http()
        console.print(
            f"control plane {url}/api/v1; pool spot-v4: v4-8 spot, 0 to 2 slices, idle timeout 10 s"
        )
        admin = stack.enter_context(Client(url, cp.admin_token))
        team = admin.create_tenant("research", {"v4": 8})
        client = stack.enter_context(Client(url, team["token"]))
        code = client.upload_package(package)
        cmd = [
            sys.executable,
            script.name,
            "--steps",
            str(steps),
            "--checkpoint-every",
            "5",
            "--step-time",
            "0.3",
        ]
        job = client.submit(cmd, "v4-8", name="mlp-autoscaled", working_dir=code)["id"]
        ok = _watch(admin, provider, job, steps, timeout)
        console.print("tearing down: control plane, emulator provider, emulated fleet")
    return ok


def _watch(admin: Any, provider: Any, job_id: str, steps: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    noticed = False
    done_at: float | None = None
    with Live(console=console, refresh_per_second=4) as live:
        while True:
            job = admin.job(job_id)
            groups = admin.request("GET", "/api/v1/slice-groups")
            step = _step(admin, job)
            line = f"{job['state']} {job.get('reason_code') or ''}".strip()
            if not seen or seen[-1] != line:
                seen.append(line)
            if not noticed and job["state"] == "RUNNING" and step is not None and step >= steps // 2:
                (victim,) = job["slices"]
                provider.preempt(victim, NOTICE_S)
                live.console.print(f"[bold red]spot notice[/] for {victim}: its hosts die in {NOTICE_S:g} s")
                noticed = True
            live.update(Group(_job_table(job, step, steps), _groups_table(groups)))
            if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                done_at = done_at or time.monotonic()
                if job["state"] != "SUCCEEDED" or not groups:
                    break
            if time.monotonic() > deadline:
                admin.cancel(job_id)
                raise InputError(f"the autoscaling demo did not finish in {timeout:.0f} s; job cancelled")
            time.sleep(0.5)
    job = admin.job(job_id)
    console.print("the job went through: " + " -> ".join(seen))
    for a in job["attempts"]:
        console.print(
            f"  attempt {a['attempt']}: {a['state']} on {', '.join(a['slices'])} {a['message'] or ''}"
        )
    console.print(f"  retries used: {job['failures']}; pool slices left: 0 (deleted after the idle timeout)")
    return bool(job["state"] == "SUCCEEDED")


def _step(admin: Any, job: dict[str, Any]) -> int | None:
    if job["state"] not in ("RUNNING", "SUCCEEDED"):
        return None
    data = "".join(h["data"] for h in admin.logs(job["id"], host=0)["hosts"])
    steps = STEP.findall(data)
    return int(steps[-1]) if steps else None


def _job_table(job: dict[str, Any], step: int | None, steps: int) -> Table:
    table = Table(title="job", title_justify="left", expand=True)
    for col in ("job", "state", "attempt", "slices", "step", "why"):
        table.add_column(col, overflow="fold")
    why = job.get("reason") or "" if job["state"] == "QUEUED" else ""
    table.add_row(
        job["id"], job["state"], str(job["attempt"]), ", ".join(job["slices"]) or "-",
        f"{step}/{steps}" if step is not None else "-", why,
    )  # fmt: skip
    return table


def _groups_table(groups: list[dict[str, Any]]) -> Table:
    table = Table(title=f"slice groups ({len(groups)})", title_justify="left", expand=True)
    for col in ("group", "type", "spot", "state", "slices", "made for"):
        table.add_column(col, overflow="fold")
    for g in groups:
        table.add_row(
            g["name"], g["accelerator_type"], "yes" if g["spot"] else "no", g["state"],
            ", ".join(s["name"] for s in g["slices"]) or "-", g.get("for_job") or "-",
        )  # fmt: skip
    return table
