"""``tpufleet serve`` as a process: it stops within seconds on SIGTERM, even once its Ray cluster is gone.

Starts a one-host fleet of its own (the shared session fleet must not be broken) and serve as a
subprocess; both are stopped by PID whatever happens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tpufleet.emulator import EmulatedFleet, procs

pytestmark = pytest.mark.integration

NO_CLOUD = {"NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}


def _free_port() -> int:
    return procs.free_port()  # below the ephemeral range: nobody takes it meanwhile


@pytest.fixture
def small_fleet(tmp_path: Path) -> Iterator[EmulatedFleet]:
    fleet = EmulatedFleet("v6e-4", cpus_per_host=1, state_dir=tmp_path / "fleet").up()
    try:
        yield fleet
    finally:
        fleet.down()


def test_serve_stops_within_seconds_on_sigterm_after_ray_went_away(
    small_fleet: EmulatedFleet, tmp_path: Path
) -> None:
    port = _free_port()
    env = {
        **os.environ,
        **NO_CLOUD,
        **small_fleet.client_env(),
        "TPUFLEET_CONFIG": str(tmp_path / "ctx.yaml"),
    }
    cmd = [sys.executable, "-m", "tpufleet", "serve", "--ray-address", small_fleet.ray_address]
    cmd += ["--state-dir", str(tmp_path / "cp"), "--port", str(port)]
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115  closed below
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        small_fleet.down()  # the Ray cluster goes away under the running control plane
        time.sleep(2)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - started
        assert took < 15, f"serve took {took:.1f} s to stop: {(tmp_path / 'serve.log').read_text()[-2000:]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
