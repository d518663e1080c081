"""``tpufleet serve --fleet SPEC --provider emulator`` as a process: it starts its own emulated fleet in
``<state-dir>/fleet``; a pool with ``min_slices: 0`` gets a job -> the job waits PROVISIONING -> a
slice appears -> the job runs on it and succeeds -> the slice is deleted after the idle timeout;
a spot slice preempted with notice mid-job (``tpufleet emulate preempt --notice``) -> SIGTERM seen
by the job, attempt 2 resumes from its checkpoint on a replacement slice, no retry used. On SIGTERM
the emulated fleet goes down with the control plane. Everything stopped by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tpufleet.client.http import Client
from tpufleet.emulator import EmulatedFleet, procs

pytestmark = pytest.mark.integration

NO_CLOUD = {"NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}
SPEC = """\
name: auto
autoscaling:
  enabled: true
  idle_timeout_s: 5
pools:
  - name: small
    type: v4-8
    slices: 0
    min_slices: 0
    max_slices: 1
tenants:
  - name: team-a
    quota: {v4: 8}
"""


def _free_port() -> int:
    return procs.free_port()  # below the ephemeral range: nobody takes it meanwhile


SPOT_SPEC = SPEC.replace("max_slices: 1", "max_slices: 2\n    spot: true")
TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


def _until(what: Callable[[], Any], timeout_s: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = what()
        if got:
            return got
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.3)


@contextmanager
def _serve(tmp_path: Path, spec: str) -> Iterator[tuple[Client, Path, Path]]:
    """serve --provider emulator on ``spec``; yields the admin client, its state dir and its log."""
    (tmp_path / "fleet.yaml").write_text(spec)
    port = _free_port()
    state = tmp_path / "cp"
    env = {**os.environ, **NO_CLOUD, "TPUFLEET_CONFIG": str(tmp_path / "ctx.yaml")}
    cmd = [sys.executable, "-m", "tpufleet", "serve", "--fleet", str(tmp_path / "fleet.yaml")]
    cmd += ["--provider", "emulator", "--state-dir", str(state), "--port", str(port)]
    log_path = tmp_path / "serve.log"
    log = open(log_path, "w")  # noqa: SIM115  closed below
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert proc.poll() is None, log_path.read_text()
            try:
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        _until(up, 180, log_path)
        yield Client(url, (state / "admin-token").read_text().strip()), state, log_path
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        fleet = EmulatedFleet("", state_dir=state / "fleet")
        alive = fleet.head_alive()
        if alive:
            fleet.down()
    assert not alive, "serve --provider emulator left its emulated fleet running"
    assert "Traceback" not in log_path.read_text(), log_path.read_text()[-3000:]


def test_serve_provider_emulator_autoscales_from_zero_and_back(tmp_path: Path) -> None:
    with _serve(tmp_path, SPEC) as (admin, state, log_path):
        code = "import os; print('ran on', os.environ['TPU_NAME'])"
        job = admin.submit([sys.executable, "-c", code], "v4-8", tenant="team-a")["id"]
        waiting = _until(lambda: (j := admin.job(job))["reason_code"] == "PROVISIONING" and j, 60, log_path)
        assert "emulator provider is making" in waiting["reason"]
        done = _until(lambda: (j := admin.job(job))["state"] in ("SUCCEEDED", "FAILED") and j, 240, log_path)
        assert done["state"] == "SUCCEEDED", done
        assert done["slices"] == ["small-1-0"]
        logs = admin.logs(job)
        assert "ran on small-1-0" in "".join(h["data"] for h in logs["hosts"])
        groups = admin.request("GET", "/api/v1/slice-groups")
        assert [g["name"] for g in groups] == ["small-1"] and groups[0]["for_job"] == job
        _until(lambda: not admin.request("GET", "/api/v1/slice-groups"), 120, log_path)  # idle 5 s
        _until(lambda: not [s for s in admin.slices() if s["name"] == "small-1-0"], 60, log_path)
        # A scale-in, not a crash: the control plane gave the warm slice back (its runners and
        # reservation) before the delete, so Ray drained the idle host and doctor calls it gone.
        fleet = state / "fleet"
        report = _until(lambda: ((d := _doctor(fleet))["gone"] or d["findings"]) and d, 60, log_path)
        assert report["findings"] == [], report
        (gone,) = report["gone"]
        assert gone["slice"] == "small-1-0" and gone["why"].startswith("drained as idle: "), report


def _doctor(fleet_dir: Path) -> dict[str, Any]:
    """``tpufleet doctor --no-probe --json`` on the emulated fleet in ``fleet_dir`` (a subprocess:
    this process may hold another fleet's Ray token)."""
    env = {**os.environ, **NO_CLOUD, **EmulatedFleet.attach(fleet_dir).client_env()}
    cmd = [sys.executable, "-m", "tpufleet", "doctor", "--state-dir", str(fleet_dir), "--no-probe", "--json"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_spot_notice_mid_job_resumes_attempt_2_on_a_replacement_without_a_retry(tmp_path: Path) -> None:
    zipped = tmp_path / "code.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        z.write(TRAIN, TRAIN.name)
    with _serve(tmp_path, SPOT_SPEC) as (admin, state, log_path):
        package = admin.upload_package(zipped.read_bytes(), tenant="team-a")
        cmd = [sys.executable, TRAIN.name, "--steps", "80", "--checkpoint-every", "5", "--step-time", "0.3"]
        job = admin.submit(cmd, "v4-8", tenant="team-a", working_dir=package, max_retries=0)["id"]

        def text(attempt: int) -> str:
            return "".join(h["data"] for h in admin.logs(job, attempt=attempt)["hosts"])

        _until(lambda: admin.job(job)["state"] == "RUNNING" and "step 8 " in text(1), 240, log_path)
        (first,) = admin.job(job)["slices"]
        assert admin.request("GET", "/api/v1/slice-groups")[0]["spot"] is True
        env = {**os.environ, **NO_CLOUD}
        preempt = [sys.executable, "-m", "tpufleet", "emulate", "preempt", first, "--notice", "15"]
        preempt += ["--state-dir", str(state / "fleet")]
        killer = subprocess.Popen(preempt, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            # The notice's 15 s, then a replacement slice made: 60 s were once too few on a loaded CI runner.
            _until(lambda: admin.job(job)["attempt"] == 2, 150, log_path)
            done = _until(
                lambda: (j := admin.job(job))["state"] in ("SUCCEEDED", "FAILED") and j, 300, log_path
            )
        finally:
            out = killer.communicate(timeout=120)[0].decode()
        # The notice is carried out at the deadline unless the autoscaler deleted the slice first (it
        # does once no attempt holds it: the slice dies anyway, and deleting it frees the quota).
        assert killer.returncode == 0 or f"no slice {first!r}" in out, out
        assert done["state"] == "SUCCEEDED", done
        assert done["failures"] == 0  # max_retries=0: a retry used would have failed the job
        a1, a2 = done["attempts"]
        assert a1["state"] == "PREEMPTED" and "preempts spot slice" in a1["message"]
        assert "on SIGTERM" in text(1)  # the checkpoint signal reached the job
        assert "resumed from step-" in text(2)
        assert a2["slices"] != a1["slices"]
