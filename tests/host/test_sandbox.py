"""Sandbox mode (issue 9, item 5): ``MemoryCluster.sandbox``, the in-memory cluster on the wall clock, and
``tpufleet serve --sandbox SLICES [--job-seconds S]``; the proof that a batch of mixed shapes from
two tenants all succeed exactly once through the whole control plane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import planes
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from guards import HANG_GUARD_S
from sqlalchemy import select

from tpufleet.api.server import ControlPlane
from tpufleet.cli import command
from tpufleet.control.cluster.memory import (
    EXIT_VAR,
    SECONDS_VAR,
    SIGTERM_EXIT,
    FakeClock,
    MemoryCluster,
    fleet_slices,
)
from tpufleet.control.cluster.protocol import AttemptSpec, HostState
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.store.tables import AttemptRow
from tpufleet.errors import ClusterError, NotFoundError, SpecError


def spec(job: str, *slices: str, attempt: int = 1, **env: str) -> AttemptSpec:
    return AttemptSpec(job, attempt, slices, "v4-16", ("python", "t.py"), env=dict(env))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fleet(clock: FakeClock) -> MemoryCluster:
    return MemoryCluster.sandbox("v4-16:2,v6e-16", job_seconds=2.0, clock=clock)


# -- the cluster -------------------------------------------------------------------------------
def test_slices_are_named_per_type_and_a_bad_list_is_a_spec_error() -> None:
    names = [s.name for s in fleet_slices("v4-16:2,v4-32,v4-16")]
    assert names == ["tpu-v4-16-0", "tpu-v4-16-1", "tpu-v4-32-0", "tpu-v4-16-2"]
    assert all(s.intact and len(s.hosts) == s.expected_hosts for s in fleet_slices("v4-32:3"))
    with pytest.raises(SpecError, match="closest"):
        fleet_slices("v4-17")
    with pytest.raises(SpecError, match="hosts"):
        fleet_slices("v4-16:60000")


def test_every_host_runs_for_the_job_seconds_then_exits_0(fleet: MemoryCluster, clock: FakeClock) -> None:
    fleet.launch(spec("j1", "tpu-v4-16-0"))
    assert fleet.poll("j1", 1).all_running
    clock.advance(1.9)
    assert fleet.poll("j1", 1).all_running
    clock.advance(0.1)
    done = fleet.poll("j1", 1)
    assert done.succeeded and [h.worker_id for h in done.hosts] == [0, 1]
    log = fleet.read_logs("j1", 1, "tpu-v4-16-0", 1, 0)
    assert log.data == "sandbox: tpu-v4-16-0/1 running 2 s\nsandbox: exit 0\n" and log.complete
    assert fleet.read_logs("j1", 1, "tpu-v4-16-0", 1, log.next_offset).data == ""


def test_a_launched_attempt_holds_its_slices_until_stopped(fleet: MemoryCluster, clock: FakeClock) -> None:
    fleet.launch(spec("j1", "tpu-v4-16-0"))
    fleet.launch(spec("j1", "tpu-v4-16-0"))  # a second launch of a live attempt changes nothing
    clock.advance(5)
    assert fleet.poll("j1", 1).succeeded
    with pytest.raises(ClusterError, match="held by job j1"):
        fleet.launch(spec("j2", "tpu-v4-16-0"))
    assert fleet.running_attempts() == [("j1", 1)]
    fleet.stop("j1", 1)
    fleet.stop("j1", 1)
    assert fleet.running_attempts() == [] and fleet.poll("j1", 1).succeeded  # ended before the stop
    fleet.launch(spec("j2", "tpu-v4-16-0"))
    with pytest.raises(ClusterError, match="is not in the cluster"):
        fleet.launch(spec("j3", "tpu-v4-16-9"))


def test_a_stop_ends_live_hosts_as_sigterm(fleet: MemoryCluster) -> None:
    fleet.launch(spec("j1", "tpu-v4-16-0"))
    fleet.stop("j1", 1)
    status = fleet.poll("j1", 1)
    assert {(h.state, h.exit_code) for h in status.hosts} == {(HostState.EXITED, SIGTERM_EXIT)}
    assert fleet.read_logs("j1", 1, "tpu-v4-16-0", 0, 0).data.endswith("sandbox: stopped (SIGTERM)\n")
    with pytest.raises(NotFoundError):  # an attempt it never launched, as on Ray
        fleet.poll("nope", 1)


@pytest.mark.parametrize(
    ("env", "after", "code", "line"),
    [
        ({SECONDS_VAR: "0.5"}, 0.5, 0, "exit 0"),
        ({EXIT_VAR: "3"}, 2.0, 3, "exit 3"),
        ({SECONDS_VAR: "0", EXIT_VAR: "-9"}, 0.0, -9, "exit -9"),
        ({SECONDS_VAR: "soon"}, 0.0, 2, f"{SECONDS_VAR} must be seconds"),
        ({SECONDS_VAR: "-1"}, 0.0, 2, f"{SECONDS_VAR} must be seconds"),
        ({SECONDS_VAR: "nan"}, 0.0, 2, f"{SECONDS_VAR} must be seconds"),  # float() takes it; never ends
        ({SECONDS_VAR: "inf"}, 0.0, 2, f"{SECONDS_VAR} must be seconds"),
        ({SECONDS_VAR: "1e309"}, 0.0, 2, f"{SECONDS_VAR} must be seconds"),  # inf, spelt as a number
        ({EXIT_VAR: "1.5"}, 0.0, 2, f"{EXIT_VAR} a whole number"),
    ],
)
def test_a_jobs_env_sets_its_seconds_and_exit_code(
    fleet: MemoryCluster, clock: FakeClock, env: dict[str, str], after: float, code: int, line: str
) -> None:
    fleet.launch(spec("j1", "tpu-v4-16-0", **env))
    if after:
        clock.advance(after - 0.01)
        assert fleet.poll("j1", 1).all_running
        clock.advance(0.01)
    status = fleet.poll("j1", 1)
    assert {h.exit_code for h in status.hosts} == {code}
    assert line in fleet.read_logs("j1", 1, "tpu-v4-16-0", 0, 0).data


def test_hosts_get_the_host_contract(fleet: MemoryCluster) -> None:
    fleet.launch(spec("j1", "tpu-v4-16-0", "tpu-v4-16-1", attempt=2, MY_VAR="1"))
    envs = fleet.host_envs("j1", 2)
    assert [(e["TPU_NAME"], e["TPU_WORKER_ID"], e["MEGASCALE_SLICE_ID"]) for e in envs] == [
        ("tpu-v4-16-0", "0", "0"),
        ("tpu-v4-16-0", "1", "0"),
        ("tpu-v4-16-1", "0", "1"),
        ("tpu-v4-16-1", "1", "1"),
    ]
    assert {e["TPUFLEET_ATTEMPT"] for e in envs} == {"2"} and {e["MY_VAR"] for e in envs} == {"1"}
    assert {e["MEGASCALE_NUM_SLICES"] for e in envs} == {"2"}


# -- the proof: the whole control plane over the sandbox --------------------------------------
SHAPES = [("v4-16", 1), ("v4-32", 1), ("v4-16", 2), ("v6e-16", 1), ("v4-16", 1), ("v4-32", 2)]


@pytest.fixture
def sandbox_plane(tmp_path: Path) -> Iterator[ControlPlane]:
    cluster = MemoryCluster.sandbox("v4-16:8,v4-32:4,v6e-16:4", job_seconds=0.05)
    config = ServiceConfig(interval_s=0.02, busy_interval_s=0.005, log_budget_s=0.05)
    cp = ControlPlane(cluster, state_dir=tmp_path / "state", config=config)
    yield cp
    cp.close()


def test_a_batch_of_mixed_shapes_from_two_tenants_all_succeed_exactly_once(
    sandbox_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TPUFLEET_CONFIG", str(tmp_path / "config.json"))
    cp = sandbox_plane
    http = TestClient(cp.app)
    admin = {"Authorization": f"Bearer {cp.admin_token}"}
    # Each quota covers the whole fleet (quotas may sum to more than it): nobody borrows, and no
    # tenant preempts its own lower-priority jobs, so every job needs exactly one attempt; fair
    # share orders the two, priorities order each tenant's jobs.
    for name, weight in (("team-a", 2.0), ("team-b", 1.0)):
        body = {"name": name, "quota": {"v4": 128, "v6e": 64}, "weight": weight, "preemption": "never"}
        assert http.post("/api/v1/tenants", json=body, headers=admin).is_success
    jobs: list[dict[str, Any]] = [
        {
            "command": ["python", "train.py", str(i)],
            "accelerator_type": SHAPES[i % len(SHAPES)][0],
            "num_slices": SHAPES[i % len(SHAPES)][1],
            "priority": i % 3,
            "tenant": "team-a" if (i // len(SHAPES)) % 2 else "team-b",
        }
        for i in range(300)
    ]
    resp = http.post("/api/v1/jobs/batch", json={"jobs": jobs}, headers=admin)
    assert resp.status_code == 201, resp.text
    ids = resp.json()["ids"]
    cp.start()
    deadline = time.monotonic() + 120
    while cp.store.counts()["queued"] or cp.store.counts()["running"]:
        assert time.monotonic() < deadline, cp.store.counts()
        time.sleep(0.1)
    done = {j.id: j for j in cp.store.jobs.all()}
    assert sorted(done) == sorted(ids)
    assert {(j.state, j.attempt, j.failures) for j in done.values()} == {("SUCCEEDED", 1, 0)}
    assert {(j.tenant, j.accelerator_type, j.num_slices) for j in done.values()} == {
        (t, a, n) for t in ("team-a", "team-b") for a, n in SHAPES
    }
    with cp.store.tx() as s:
        attempts = [(a.job_id, a.attempt, a.state) for a in s.scalars(select(AttemptRow))]
    assert sorted(attempts) == sorted((i, 1, "SUCCEEDED") for i in ids)  # one attempt each
    status = http.get("/api/v1/status", headers=admin).json()
    assert status["cycles"] > 0 and status["queued"] == status["running"] == 0
    assert status["cycle_ms_last"] > 0 and status["cycle_ms_p50"] > 0
    assert status["slices"] == {"FREE": 16}
    shown = CliRunner().invoke(
        command(), ["status", "--json", "--token", cp.admin_token, "--server", "http://testserver"], obj=http
    )
    assert shown.exit_code == 0, shown.output
    assert {"cycles", "cycle_ms_last", "cycle_ms_p50"} <= set(json.loads(shown.stdout))
    http.close()


def test_at_scale_urgent_work_preempts_its_own_tenants_low_priority_work(tmp_path: Path) -> None:
    """Issue 14 in sandbox mode: 64 long low-priority jobs fill a tenant's quota (the whole fleet);
    40 short urgent ones of the same tenant preempt them. Every job ends SUCCEEDED, no retry is
    used, each urgent job runs once, and every preempted attempt names the urgent job it made room
    for; the other tenant's in-quota job is never touched."""
    cluster = MemoryCluster.sandbox("v4-16:16", job_seconds=0.05)
    config = ServiceConfig(interval_s=0.02, busy_interval_s=0.005, log_budget_s=0.05, preempt_grace_s=0.2)
    cp = ControlPlane(cluster, state_dir=tmp_path / "state", config=config)
    try:
        http = TestClient(cp.app)
        admin = {"Authorization": f"Bearer {cp.admin_token}"}
        for name, quota in (("team-a", 120), ("team-b", 8)):
            body = {"name": name, "quota": {"v4": quota}}
            assert http.post("/api/v1/tenants", json=body, headers=admin).is_success

        def batch(tenant: str, n: int, priority: int, seconds: float) -> list[str]:
            bodies = [
                {"command": ["train"], "accelerator_type": "v4-16", "tenant": tenant, "priority": priority,
                 "env": {SECONDS_VAR: str(seconds)}, "max_retries": 0}
                for _ in range(n)
            ]  # fmt: skip
            resp = http.post("/api/v1/jobs/batch", json={"jobs": bodies}, headers=admin)
            assert resp.status_code == 201, resp.text
            return list(resp.json()["ids"])

        other = batch("team-b", 1, 0, 1.5)
        low = batch("team-a", 64, 0, 1.0)
        cp.start()
        deadline = time.monotonic() + 60
        while cp.store.counts()["running"] < 16:
            assert time.monotonic() < deadline, cp.store.counts()
            time.sleep(0.02)
        urgent = batch("team-a", 40, 9, 0.1)
        while cp.store.counts()["queued"] or cp.store.counts()["running"]:
            assert time.monotonic() < deadline, cp.store.counts()
            time.sleep(0.05)
        done = {j.id: j for j in cp.store.jobs.all()}
        assert {(j.state, j.failures) for j in done.values()} == {("SUCCEEDED", 0)}  # no retry used
        assert {done[i].attempt for i in urgent} == {1}
        assert done[other[0]].attempt == 1  # never preempted: another tenant, in quota
        with cp.store.tx() as s:
            preempted = [
                (a.job_id, a.message) for a in s.scalars(select(AttemptRow)) if a.state == "PREEMPTED"
            ]
        assert preempted, "the urgent jobs preempted nothing"
        assert {job for job, _ in preempted} <= set(low)
        assert all(any(f"preempted for job {u}" in (m or "") for u in urgent) for _, m in preempted)
        http.close()
    finally:
        cp.close()


# -- tpufleet serve --sandbox ------------------------------------------------------------------
def _env(tmp_path: Path) -> dict[str, str]:
    """No Ray importable (a package named ray that refuses), a private CLI context and state dir."""
    fake = tmp_path / "noray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('sandbox mode must not import ray')\n")
    path = os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")]))
    return os.environ | {
        "PYTHONPATH": path,
        "TPUFLEET_CONFIG": str(tmp_path / "config.json"),
        "TPUFLEET_STATE_DIR": str(tmp_path / "home"),
    }


def test_serve_sandbox_answers_healthz_without_ray(tmp_path: Path) -> None:
    serve = planes.ServeProcess(tmp_path, "--sandbox", "v4-16:2", env=_env(tmp_path))
    try:
        health = httpx.get(f"{serve.url}/healthz", timeout=2)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        token = (tmp_path / "home" / "sandbox" / "admin-token").read_text().strip()
        slices = httpx.get(f"{serve.url}/api/v1/slices", headers={"Authorization": f"Bearer {token}"}).json()
        assert [s["name"] for s in slices] == ["tpu-v4-16-0", "tpu-v4-16-1"]
    finally:
        out = serve.stop()
    assert "sandbox fleet (v4-16:2" in out and "Traceback" not in out


@pytest.mark.parametrize(
    "flags",
    [("--ray-address", "127.0.0.1:6379"), ("--emulator",), ("--emulator-dir", "/tmp/x")],
)
def test_sandbox_and_ray_exclude_each_other(flags: tuple[str, ...]) -> None:
    result = CliRunner().invoke(command(), ["serve", "--sandbox", "v4-16:2", *flags])
    assert isinstance(result.exception, SpecError) and result.exception.exit_code == 2
    assert "not both" in str(result.exception) and "\n" not in str(result.exception)


def test_the_exclusion_is_one_line_and_exit_2(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tpufleet", "serve", "--sandbox", "v4-16", "--ray-address", "10.0.0.1:6379"]
    out = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "error: --sandbox runs without Ray: give --sandbox or --ray-address/--emulator, not both"
    ]


def test_job_seconds_goes_with_sandbox() -> None:
    result = CliRunner().invoke(command(), ["serve", "--job-seconds", "2"])
    assert isinstance(result.exception, SpecError) and "--sandbox" in str(result.exception)


def test_a_job_submitted_with_a_sandbox_exit_code_fails(sandbox_plane: ControlPlane) -> None:
    cp = sandbox_plane
    cp.store.tenants.create("team-a", {"v4": 16})
    from tpufleet.control.store.values import JobRequest

    req = JobRequest.build(
        command=["x"], accelerator_type="v4-16", max_retries=0, env={EXIT_VAR: "3", SECONDS_VAR: "0"}
    )
    job = cp.store.jobs.submit("team-a", req)
    for _ in range(50):
        cp.service.run_once()
    assert cp.store.jobs.get(job.id).state == "FAILED" and cp.store.jobs.get(job.id).exit_code == 3
