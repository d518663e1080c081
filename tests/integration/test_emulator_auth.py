"""Ray token authentication on the emulated fleet: a process that finds the Ray address (as a
tenant's job can, in ``ps``) but not the token gets nothing; the token is nowhere a job can read."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import ray

from tpufleet.emulator import EmulatedFleet, auth
from tpufleet.emulator import state as store
from tpufleet.emulator.raynodes import read_nodes

pytestmark = pytest.mark.integration

# A client that connects, asks the GCS for the cluster's resources and prints them.
CLIENT = """
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print("CONNECTED", sorted(ray.cluster_resources()))
"""


def _client(address: str, extra_env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["RAY_gcs_server_port_wait_time_s"] = "2"  # give up after ~2 s instead of Ray's 20 s
    t0 = time.monotonic()
    argv = [sys.executable, "-c", CLIENT, address]
    run = subprocess.run(argv, env=env | extra_env, capture_output=True, text=True, timeout=120)
    return run, time.monotonic() - t0


def test_a_client_without_the_right_token_is_refused_and_one_with_it_connects(
    fleet: EmulatedFleet, tmp_path: Path
) -> None:
    run, took = _client(fleet.ray_address, {})
    assert run.returncode != 0 and "CONNECTED" not in run.stdout
    assert "Authentication token is missing or incorrect" in run.stderr
    assert took < 30, f"refusal took {took:.0f}s"

    wrong = tmp_path / "wrong-token"
    auth.write_token(wrong, auth.new_token())
    run, _ = _client(fleet.ray_address, auth.client_env(wrong))
    assert run.returncode != 0 and "CONNECTED" not in run.stdout
    assert "Authentication token is missing or incorrect" in run.stderr

    run, _ = _client(fleet.ray_address, fleet.client_env())
    assert run.returncode == 0, run.stderr[-2000:]
    assert "CONNECTED" in run.stdout and "TPU" in run.stdout


def _agent_urls(fleet: EmulatedFleet) -> list[str]:
    """The HTTP API of every node's dashboard agent that has one: the head's. An emulated host runs
    a stand-in instead (emulator/rayhost.py) and advertises port -1, as Ray does for an agent whose
    HTTP service is off, so it has no API to protect."""
    nodes = [n for n in read_nodes(fleet.ray_address) if n["Alive"]]
    hosts = [n for n in nodes if "ray.io/tpu-slice-name" in (n.get("Labels") or {})]
    assert hosts and {n["DashboardAgentListenPort"] for n in hosts} == {-1}
    return [
        f"http://{n['NodeManagerAddress']}:{n['DashboardAgentListenPort']}" for n in nodes if n not in hosts
    ]


def _status(url: str, token: str | None, method: str = "GET", body: bytes | None = None) -> int:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_job_submission_needs_the_token_on_the_heads_dashboard_and_agent(fleet: EmulatedFleet) -> None:
    st = store.load(fleet.state_dir)
    assert st is not None
    token = fleet.auth_token_path.read_text()
    # The head's dashboard (Ray jobs go through its job API, docs/ray-jobs.md) listens on loopback
    # only and refuses a submission without the cluster's token or with another one.
    with pytest.raises(OSError):
        socket.create_connection((st.address, st.dashboard_port), timeout=2).close()
    jobs = f"http://127.0.0.1:{st.dashboard_port}/api/jobs/"
    body = b'{"entrypoint": "cat /etc/hostname", "submission_id": "tenant-escape-head"}'
    assert _status(jobs, None, "POST", body) == 401
    assert _status(jobs, auth.new_token(), "POST", body) == 403
    assert _status(jobs, token, "GET") == 200  # the token opens it, so the check is real

    urls = _agent_urls(fleet)
    assert len(urls) == 1  # the head's
    for base in urls:  # a dashboard agent serves Ray's job agent API
        submit = f"{base}/api/job_agent/jobs/"
        body = b'{"entrypoint": "cat /etc/hostname", "submission_id": "tenant-escape"}'
        assert _status(submit, None, "POST", body) == 401
        assert _status(submit, auth.new_token(), "POST", body) == 403
        logs = f"{base}/api/job_agent/jobs/no-such-job/logs"
        assert _status(logs, None) == 401
        assert _status(logs, token) not in (401, 403)  # the token opens it, so the check is real


def _cmdlines() -> dict[int, bytes]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes()
            except OSError:
                continue
    return found


def _files_holding(root: Path, needle: bytes, skip: Path) -> list[Path]:
    hits = []
    for path in root.rglob("*"):
        try:
            if path == skip or not path.is_file() or path.is_symlink() or path.stat().st_size > 8 << 20:
                continue
            if needle in path.read_bytes():
                hits.append(path)
        except OSError:
            continue
    return hits


def test_the_token_is_a_0600_file_on_no_command_line_and_workers_get_only_its_path(
    fleet: EmulatedFleet, ray_client: Any
) -> None:
    path = fleet.auth_token_path
    assert path == fleet.state_dir.absolute() / auth.TOKEN_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    token = path.read_text()
    assert len(token) == 64 and int(token, 16) >= 0

    needle = token.encode()
    assert [pid for pid, cmd in _cmdlines().items() if needle in cmd] == []
    st = store.load(fleet.state_dir)
    assert st is not None
    assert _files_holding(fleet.state_dir, needle, skip=path) == []
    assert _files_holding(Path(st.temp_dir), needle, skip=path) == []  # Ray's session dirs and logs

    @ray.remote(num_cpus=0)
    def auth_env() -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if "AUTH" in k or v == token}

    # What a task on a host inherits from its raylet, so what a job runner must strip.
    assert ray.get(auth_env.remote()) == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def test_the_cli_finds_the_token_itself_and_doctor_without_it_fails_in_one_line(fleet: EmulatedFleet) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}

    def tpufleet(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "tpufleet", *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

    run = tpufleet("doctor", "--no-probe", "--json", "--state-dir", str(fleet.state_dir))
    assert run.returncode in (0, 1) and '"slices"' in run.stdout, run.stderr[-2000:]
    run = tpufleet("doctor", "--no-probe", "--ray-address", fleet.ray_address)  # no token given
    assert run.returncode != 0 and "Traceback" not in run.stderr and '"slices"' not in run.stdout
    assert "RAY_AUTH_TOKEN_PATH=" in run.stderr
