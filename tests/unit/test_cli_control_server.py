"""A real control plane (uvicorn on a free port, the loop in its thread, MemoryCluster) driven by the
real CLI entry point ``tpufleet.cli.main``: exit codes, one-line errors, follow, admin token file."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import planes
import pytest
from cli_inproc import tpufleet

from tpufleet.api.server import ControlPlane
from tpufleet.client.http import Client
from tpufleet.control.cluster.memory import MemoryCluster, Script
from tpufleet.control.cluster.protocol import AttemptSpec
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.emulator import procs

SCRIPT = Script(
    run_after=1, exit_after=4, output="attempt {TPUFLEET_ATTEMPT} on {TPU_NAME}/{TPU_WORKER_ID}\n"
)
UNTIL_STOPPED = Script(run_after=1, exit_after=None)  # a job whose command is ``sleep``


def plan(spec: AttemptSpec) -> Script:
    """Every job ends after four polls of its attempt, but ``sleep ...``, which runs until stopped:
    a job to cancel must not end on its own first (a launch is polled in the turn that marks it,
    so four polls can pass before a cancel sent over HTTP reaches the loop)."""
    return UNTIL_STOPPED if spec.command[:1] == ("sleep",) else SCRIPT


@pytest.fixture
def plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ControlPlane]:
    monkeypatch.setenv("TPUFLEET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("TPUFLEET_TOKEN", raising=False)
    cluster = MemoryCluster.of("v4-16:2", script=plan)
    with planes.running(cluster, tmp_path / "state", http=True, config=ServiceConfig(interval_s=0.05)) as cp:
        yield cp


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_admin_token_file_is_private_and_kept_across_restarts(plane: ControlPlane, tmp_path: Path) -> None:
    path = tmp_path / "state" / "admin-token"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text().strip() == plane.admin_token and plane.admin_token_created
    again = ControlPlane(MemoryCluster.of("v4-16"), state_dir=tmp_path / "state")
    try:
        assert (again.admin_token, again.admin_token_created) == (plane.admin_token, False)
    finally:
        again.close()


def test_a_job_end_to_end_over_http_with_the_real_entry_point(
    plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    url = plane.url or ""
    assert Client(url).health()["status"] == "ok"
    code, out, _ = tpufleet(
        capsys, "tenant", "create", "team-a", "--quota", "v4=16", "--json", "--server", url
    )
    assert code == 0  # the admin token came from $TPUFLEET_STATE_DIR/admin-token
    token = json.loads(out)["token"]
    code, out, _ = tpufleet(
        capsys,
        "submit",
        "--type",
        "v4-16",
        "--json",
        "--server",
        url,
        "--token",
        token,
        "--",
        "python",
        "train.py",
    )
    job_id = json.loads(out)["id"]
    code, out, _ = tpufleet(capsys, "logs", job_id, "--follow", "--server", url, "--token", token)
    assert code == 0
    assert sorted(out.splitlines()) == [
        "[tpu-v4-16-0/0] attempt 1 on tpu-v4-16-0/0",
        "[tpu-v4-16-0/1] attempt 1 on tpu-v4-16-0/1",
    ]
    job = Client(url, token).job(job_id)
    assert (job["state"], job["exit_code"]) == ("SUCCEEDED", 0)


def test_cancel_over_http_stops_in_the_background_and_frees_the_slices(plane: ControlPlane) -> None:
    client = Client(plane.url or "", plane.admin_token)
    client.create_tenant("team-a", {"v4": 16})
    job_id = client.submit(["sleep", "1d"], "v4-16", num_slices=2, tenant="team-a")["id"]
    wait_for(lambda: client.job(job_id)["state"] in ("STARTING", "RUNNING", "SUCCEEDED"), "the job to start")
    client.cancel(job_id)
    wait_for(lambda: client.job(job_id)["state"] in ("CANCELLED", "SUCCEEDED"), "the job to end")
    assert client.job(job_id)["state"] == "CANCELLED"
    assert {s["state"] for s in client.slices()} == {"FREE"}


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("jobs", "--token", "tf_bogus"), 2, "error: unknown token"),
        (("job", "deadbeef"), 2, "error: job 'deadbeef' not found"),
        (("submit", "--type", "v4-15", "--tenant", "x", "--", "x"), 2, "v4-15 is not a v4 slice size"),
        (("submit", "--type", "v4-16", "--num-slices", "0", "--tenant", "x", "--", "x"), 2, "num_slices"),
    ],
)
def test_bad_input_prints_one_line_and_exits_2(
    plane: ControlPlane, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], code: int, message: str
) -> None:
    got, out, err = tpufleet(capsys, args[0], "--server", plane.url or "", *args[1:])
    assert (got, out) == (code, "")
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_an_unreachable_server_exits_1_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    port = procs.free_port()  # nothing listens there (below the ephemeral range: nobody takes it)
    code, _, err = tpufleet(capsys, "jobs", "--server", f"http://127.0.0.1:{port}", "--token", "x")
    assert code == 1 and "cannot reach the tpufleet server" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
