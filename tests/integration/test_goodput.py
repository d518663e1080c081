"""Goodput end to end on the shared emulated fleet: ``examples/train_mlp.py`` (real JAX, jailed)
reports its steps with ``tpufleet.runtime.report_step``; the host's runner reads them, the control
plane stores them, and the job's goodput is known, above 0 and below 1 (start-up is badput), both
on the job view and in ``GET /metrics``, and its cost is counted."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import planes
import pytest
from _executor_helpers import wait_for
from prometheus_client.parser import text_string_to_metric_families

from tpufleet.api.server import ControlPlane
from tpufleet.client.http import Client
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.ray.client import RayExecutor

pytestmark = pytest.mark.integration

CONFIG = ServiceConfig(interval_s=0.5, cancel_grace_s=1.0, fail_grace_s=1.0, progress_write_s=0.5)
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


@pytest.fixture(scope="module")
def plane(ray_client: object, fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cluster = RayExecutor.connect(fleet.ray_address)
    warm = [s.name for s in cluster.inventory() if s.intact]
    with planes.served(cluster, tmp_path_factory.mktemp("goodput-plane"), warm=warm, config=CONFIG) as p:
        yield p.cp


def metrics(cp: ControlPlane) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    # httpx's 5 s default is too short for a page on a loaded 2-core machine (a CI run timed out)
    resp = httpx.get(f"{cp.url}/metrics", headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=60)
    assert resp.status_code == 200, resp.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }


def test_train_mlp_reports_steps_and_its_goodput_is_known(plane: ControlPlane, tmp_path: Path) -> None:
    assert plane.url is not None
    with Client(plane.url, plane.admin_token) as admin:
        token = admin.create_tenant("goodput-team", {"v4": 8})["token"]
        with Client(plane.url, token) as client:
            code = tmp_path / "code"
            code.mkdir()
            (code / "train_mlp.py").write_text(SCRIPT.read_text())
            package = client.upload_package(code)
            command = [sys.executable, "train_mlp.py", "--steps", "40", "--step-time", "0.25"]
            job_id = client.submit(command, "v4-16", working_dir=package)["id"]

            def reported() -> dict[str, Any] | None:  # running, with steps stored
                job = client.job(job_id)
                assert job["state"] not in ("FAILED", "CANCELLED"), job
                attempts = job["attempts"]
                return job if attempts and (attempts[-1]["last_step"] or 0) >= 5 else None

            running = wait_for(f"job {job_id} to report steps", reported, 240)
            live = metrics(plane)
            key = ("tpufleet_job_goodput_ratio", (("job", job_id), ("tenant", "goodput-team")))
            # 40 steps of 0.25 s: seconds left after step 5. A running job is on the goodput gauge,
            # above 0 (it made progress) and below 1 (start-up: JAX starting and compiling).
            assert running["state"] == "RUNNING", running
            assert 0 < live[key] < 1

            def ended() -> dict[str, Any] | None:
                job = client.job(job_id)
                return job if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

            done = wait_for(f"job {job_id} to end", ended, 240)
    assert done["state"] == "SUCCEEDED", client_logs(plane, job_id)
    (attempt,) = done["attempts"]
    assert attempt["first_step"] == 1 and attempt["last_step"] == 40
    g = done["goodput"]
    assert 0 < g["ratio"] < 1 and g["startup_s"] > 0 and g["productive_s"] > 0
    assert g["productive_s"] + g["badput_s"] == pytest.approx(g["held_s"], abs=0.01)
    after = metrics(plane)
    assert key not in after  # a finished job leaves the goodput gauge
    labels = (("generation", "v4"), ("pricing", "on_demand"), ("tenant", "goodput-team"))
    chips = after[("tpufleet_chip_seconds_total", labels)]
    assert chips == pytest.approx(g["held_s"] * 8, rel=0.01)
    ended = after[("tpufleet_attempts_ended_total", (("reason", "succeeded"), ("tenant", "goodput-team")))]
    assert ended == 1


def client_logs(plane: ControlPlane, job_id: str) -> str:
    with Client(plane.url or "", plane.admin_token) as admin:
        return "\n".join(h["data"][-2000:] for h in admin.logs(job_id)["hosts"])
