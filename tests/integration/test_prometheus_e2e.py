"""Prometheus end to end: a real Prometheus server scrapes a running control plane with a bearer
token from a file and a tpufleet metric comes back through Prometheus' HTTP API.

Two control planes: ``tpufleet serve --sandbox`` (no Ray: the job, slice and device metrics of an
in-memory fleet), and one over the shared emulated fleet (``fleet`` fixture), whose hosts serve the
emulated TPU device plugin: a busy job's measured duty cycle reaches Prometheus as
``tpufleet_tpu_duty_cycle_percent``. Every process is stopped by PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _prometheus import free_port, prometheus_binary, start_prometheus

pytestmark = pytest.mark.integration

NO_CLOUD = {"NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}


def _serve(
    tmp_path: Path, args: list[str], env_extra: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    env = {**os.environ, **NO_CLOUD, **(env_extra or {}), "TPUFLEET_CONFIG": str(tmp_path / "ctx.yaml")}
    cmd = [
        sys.executable,
        "-m",
        "tpufleet",
        "serve",
        *args,
        "--state-dir",
        str(tmp_path / "cp"),
        "--port",
        str(port),
    ]
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    token = next(
        p
        for p in (tmp_path / "cp" / "admin-token", tmp_path / "cp" / "sandbox" / "admin-token")
        if p.exists()
    )
    return proc, port, token


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def sandbox_plane(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    prometheus_binary()  # skip (or fail) before starting anything
    proc, port, token = _serve(tmp_path, ["--sandbox", "v4-16:2", "--job-seconds", "30"])
    try:
        yield port, token
    finally:
        _stop(proc)


def test_prometheus_scrapes_the_sandbox_control_plane_with_a_token_file(
    sandbox_plane: tuple[int, Path], tmp_path: Path
) -> None:
    port, token = sandbox_plane
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-a-token\n")
    prom = start_prometheus(
        tmp_path / "prom",
        {"tpufleet": (f"127.0.0.1:{port}", token), "tpufleet-wrong-token": (f"127.0.0.1:{port}", wrong)},
    )
    try:
        free = prom.wait_for('sum(tpufleet_slices{job="tpufleet",state="FREE"})')
        assert float(free[0]["value"][1]) == 2.0
        chips = prom.wait_for('count(tpufleet_tpu_duty_cycle_percent{job="tpufleet"})')
        assert float(chips[0]["value"][1]) == 16.0  # 2 slices x 8 chips, none reporting: idle, present
        prom.wait_for('count(up{job=~"tpufleet.*"}) == 2')
        up = {r["metric"]["job"]: float(r["value"][1]) for r in prom.query('up{job=~"tpufleet.*"}')}
        assert up == {"tpufleet": 1.0, "tpufleet-wrong-token": 0.0}  # /metrics refuses a wrong token
    finally:
        prom.stop()


# -- the emulated fleet: device metrics measured on the hosts ----------------------------------------

# Busy until cancelled at the end of the test (at most 15 minutes; on a loaded machine the waits
# before the duty cycle is read can take minutes, and a burn that ended by then reads idle), at
# about 60 %: 60 ms of CPU, then 40 ms asleep. Burning a whole core would take it from the other
# tests of a 2-core machine for as long as this test waits.
BURN = (
    "import time\nend = time.time() + 900\nwhile time.time() < end:\n"
    "    t = time.process_time()\n    while time.process_time() - t < 0.06: pass\n    time.sleep(0.04)\n"
)


def test_prometheus_sees_the_measured_duty_cycle_of_a_busy_emulated_host(
    ray_client: object, fleet: Any, tmp_path: Path
) -> None:
    from tpufleet.api.server import ControlPlane
    from tpufleet.client.http import Client
    from tpufleet.control.loop.service import ServiceConfig
    from tpufleet.control.ray.client import RayExecutor

    prometheus_binary()
    cluster = RayExecutor.connect(fleet.ray_address)
    cp = ControlPlane(
        cluster, state_dir=tmp_path / "cp", config=ServiceConfig(interval_s=0.5, cancel_grace_s=1.0)
    )
    prom = None
    try:
        cluster.wait_warm([s.name for s in cluster.inventory() if s.intact], timeout_s=120)
        url = cp.start_http()
        with Client(url, cp.admin_token) as admin:
            tenant = "metrics-e2e"
            client = Client(url, admin.create_tenant(tenant, {"v6e": 4})["token"])
            job = client.submit([sys.executable, "-c", BURN], "v6e-4")
            host = url.removeprefix("http://").rstrip("/")
            prom = start_prometheus(tmp_path / "prom", {"tpufleet": (host, cp.admin_token_path)})
            src = prom.wait_for(
                'tpufleet_tpu_metrics_source_up{slice="tpu-v6e-4-0",emulated="true"} == 1', 120
            )
            assert src[0]["metric"]["source"] == "device_plugin"
            # Busy, measured: above the idle hosts' 10 % below, though on a loaded 2-core machine
            # the burning process gets only its share of a core.
            busy = prom.wait_for('tpufleet_tpu_duty_cycle_percent{slice="tpu-v6e-4-0"} > 10', 120)
            assert {r["metric"]["chip"] for r in busy} == {"0", "1", "2", "3"}
            assert {r["metric"]["tenant"] for r in busy} == {tenant}
            # Both hosts of a free slice answer (each scrape asks every host; under load one may
            # answer a scrape later than the other) ...
            idle = 'tpufleet_tpu_metrics_source_up{slice="tpu-v4-16-1",emulated="true"} == 1'
            prom.wait_for(f"count({idle}) == 2")  # the slice has two hosts: each answered one scrape
            assert prom.wait_for('max(tpufleet_tpu_duty_cycle_percent{slice="tpu-v4-16-1"}) < 10')  # ... idle
            held = prom.wait_for('tpufleet_job_slice_info{slice="tpu-v6e-4-0"}')
            assert held[0]["metric"]["job"] == job["id"]
            used = prom.wait_for('tpufleet_tpu_hbm_used_bytes{slice="tpu-v6e-4-0"} > 0')
            assert len(used) == 4
            client.cancel(job["id"])
            client.close()
    finally:
        if prom is not None:
            prom.stop()
        cp.close()
        cluster.release_all()
