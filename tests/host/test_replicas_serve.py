"""Replicas of ``tpufleet serve --sandbox`` on one PostgreSQL database (issue 34): one leads at a
time; SIGSTOP of the leader past its lease, then SIGCONT: the standby has taken over and the woken
replica stands by, having changed nothing; kill -9 of the leader: the standby takes over; SIGTERM:
the lease is handed over at once. Every job SUCCEEDED once, and every request to a replica that was
not stopped or killed was answered.

A sandbox fleet lives in its replica's memory: an attempt the dead (or paused) leader was running is
lost to the new leader's reconcile and runs again there (the first attempt ends LOST, never
SUCCEEDED), as a job on hosts that died with their control plane would."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import planes
import pytest
from dbserver import PostgresServer

LEASE = "3"  # seconds: a standby takes over within 3.6 s of the leader's last renewal
DEADLINE_S = 90.0  # generous: a loaded 2-core machine; no test here measures time


def wait(what: str, ok: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ok():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S:g} s: {what}"
        time.sleep(0.1)


class Replica:
    """One ``serve --sandbox`` replica on ``db`` with its own state dir (its admin token there)."""

    def __init__(self, tmp: Path, name: str, db: str) -> None:
        self.dir = tmp / name
        self.dir.mkdir()
        state = self.dir / "state"
        self.serve = planes.ServeProcess(
            self.dir, "--sandbox", "v4-16:2", "--job-seconds", "0.3", "--db", db,
            "--state-dir", str(state), "--lease-seconds", LEASE,
        )  # fmt: skip
        self.url = self.serve.url
        self.token = (state / "admin-token").read_text().strip()
        self.answered = self.failed = 0

    def get(self, path: str, token: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        try:
            resp = httpx.get(f"{self.url}{path}", headers=headers, timeout=10)
            resp.raise_for_status()
        except httpx.HTTPError:
            self.failed += 1
            raise
        self.answered += 1
        return resp.json()

    def post(self, path: str, body: dict[str, Any], token: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        resp = httpx.post(f"{self.url}{path}", json=body, headers=headers, timeout=10)
        resp.raise_for_status()
        return resp.json()

    def health(self) -> dict[str, Any]:
        got: dict[str, Any] = self.get("/healthz")
        return got

    def leads(self) -> bool:
        return bool(self.health()["leader"])

    def submit(self, tenant_token: str) -> str:
        body = {"command": ["python", "t.py"], "accelerator_type": "v4-16", "max_retries": 3}
        return str(self.post("/api/v1/jobs", body, tenant_token)["id"])

    def state(self, job: str, tenant_token: str) -> str:
        return str(self.get(f"/api/v1/jobs/{job}", tenant_token)["state"])

    def signal(self, sig: int) -> None:
        os.kill(self.serve.proc.pid, sig)

    def kill(self) -> None:
        self.serve.proc.kill()
        self.serve.proc.wait(timeout=30)
        self.serve.log.close()


@pytest.fixture
def replicas(tmp_path: Path, postgres_server: PostgresServer) -> Iterator[Callable[[str], Replica]]:
    db = postgres_server.new_database(migrated=True)
    started: list[Replica] = []

    def start(name: str) -> Replica:
        started.append(Replica(tmp_path, name, db))
        return started[-1]

    yield start
    for r in started:
        if r.serve.proc.poll() is None:
            r.signal(signal.SIGCONT)
            r.serve.stop()


def test_one_leader_takeovers_fencing_and_handover_lose_no_job(replicas: Callable[[str], Replica]) -> None:
    a, b = replicas("a"), replicas("b")
    wait("one replica leads", lambda: a.leads() != b.leads())
    x, y = (a, b) if a.leads() else (b, a)  # a, started first, unless a slow machine made it flap
    hx, hy = x.health(), y.health()
    assert hx["leader_replica"] == hy["leader_replica"] == x.get("/api/v1/status")["replica"]
    assert y.get("/api/v1/status")["leader_since"] is None
    metrics = httpx.get(f"{y.url}/metrics", headers={"Authorization": f"Bearer {y.token}"}).text
    assert 'tpufleet_leader{replica="' in metrics and "} 0.0" in metrics.split("tpufleet_leader{")[1]

    team = y.post("/api/v1/tenants", {"name": "team", "quota": {"v4": 16}})["token"]  # the standby serves
    jobs = [y.submit(team)]
    wait("x runs the job submitted to y", lambda: y.state(jobs[0], team) == "SUCCEEDED")

    # SIGSTOP the leader past its lease: y takes over; SIGCONT: x finds it was deposed
    jobs.append(x.submit(team))
    x.signal(signal.SIGSTOP)
    wait("y leads once x's lease expired", y.leads)
    jobs.append(y.submit(team))
    wait("y runs every job", lambda: all(y.state(j, team) == "SUCCEEDED" for j in jobs))
    x.signal(signal.SIGCONT)
    wait("the woken x stands by", lambda: not x.leads())
    y_id = y.get("/api/v1/status")["replica"]
    assert x.health()["leader_replica"] == y_id
    assert all(x.state(j, team) == "SUCCEEDED" for j in jobs)

    # kill -9 the leader: x takes over within the lease
    y.kill()
    wait("x leads after y died", x.leads)
    jobs.append(x.submit(team))
    wait("x runs the job", lambda: x.state(jobs[-1], team) == "SUCCEEDED")

    # SIGTERM: x hands the lease over to c at once
    c = replicas("c")  # a standby: x leads
    x_id = x.get("/api/v1/status")["replica"]
    x.serve.stop()
    wait("c leads after x's SIGTERM", c.leads)
    jobs.append(c.submit(team))
    wait("c runs the job", lambda: c.state(jobs[-1], team) == "SUCCEEDED")

    for job in jobs:  # each job SUCCEEDED exactly once, whichever replica ran it
        attempts = c.get(f"/api/v1/jobs/{job}", team)["attempts"]
        assert [t["state"] for t in attempts].count("SUCCEEDED") == 1, attempts
    said = [e["message"] for e in c.get("/api/v1/events?limit=1000")["items"] if e["kind"] == "leader"]
    assert said[0].endswith("leads (fencing token 1)")
    assert said[-1].startswith(f"replica {c.get('/api/v1/status')['replica']} leads (fencing token ")
    assert any(m.startswith(f"replica {x_id} stopped leading") for m in said)  # woken after SIGCONT
    assert any(m.startswith(f"replica {x_id} hands over the lease") for m in said)  # its SIGTERM
    tokens = [int(m.rsplit(" ", 1)[1].rstrip(")")) for m in said if " leads (fencing token " in m]
    assert tokens == sorted(set(tokens))  # every term a larger token
    assert a.failed == b.failed == c.failed == 0  # every request to a live replica was answered
