"""Replicas of ``tpufleet serve`` on one PostgreSQL database over the emulated Ray fleet (issue 34):
the leader killed (SIGKILL, at a failpoint) right after a launch returned and before it was recorded,
and right after a stop returned and before the attempt's end was written; the leader paused past its
lease (SIGSTOP) and woken (SIGCONT): its writes are refused; a SIGTERM hands the lease over. The job
whose launch and stop both lost their leader runs once, in one attempt, on the runners the first
leader started: the next leader adopts them, and the one after issues the recorded stop again.
Every job SUCCEEDED exactly once, and every request to a replica that was alive and not stopped was
answered (the standbys serve the API throughout).

``serve --sandbox`` replicas (``tests/host/test_chaos_replicas.py``'s soak) lose what their fleet
ran with their memory; here the runners are Ray's detached actors, so a takeover adopts them.
"""

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

from tpufleet.chaos import fencing
from tpufleet.control.ray.client import RayExecutor

pytestmark = pytest.mark.integration

LEASE = "3"  # seconds: a standby takes over within 3.6 s of the leader's last renewal
DEADLINE_S = 120.0  # generous: a loaded 2-core machine; nothing here measures time
PY = "python"
# runs until the test creates <checkpoint-root>/<tenant>/<argv[1]>
WAIT_FOR_FILE = (
    "import os, sys, time\n"
    "flag = os.path.join(os.path.dirname(os.environ['TPUFLEET_CHECKPOINT_DIR']), sys.argv[1])\n"
    "print('attempt', os.environ['TPUFLEET_ATTEMPT'], flush=True)\n"
    "while not os.path.exists(flag): time.sleep(0.05)\n"
)


def wait(what: str, ok: Callable[[], bool], show: Callable[[], object] = lambda: "") -> None:
    """Until ``ok()``; past the deadline, fail saying ``what`` and what ``show()`` returns then."""
    deadline = time.monotonic() + DEADLINE_S
    while not ok():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S:g} s: {what} {show()}"
        time.sleep(0.1)


class Replica:
    """One ``serve`` replica over the shared fleet on ``db``: its own state dir and port, the
    checkpoint root all replicas share (where a job's files are, whichever replica launched it)."""

    def __init__(self, tmp: Path, name: str, db: str, fleet_dir: Path, failpoints: str = "") -> None:
        self.dir = tmp / name
        self.dir.mkdir()
        state = self.dir / "state"
        env = dict(os.environ, TPUFLEET_FAILPOINTS=failpoints)
        self.serve = planes.ServeProcess(
            self.dir, "--emulator-dir", str(fleet_dir), "--db", db, "--state-dir", str(state),
            "--lease-seconds", LEASE, "--checkpoint-root", str(tmp / "checkpoints"), env=env, timeout_s=120,
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

    def leads(self) -> bool:
        return bool(self.get("/healthz")["leader"])

    def me(self) -> str:
        return str(self.get("/api/v1/status")["replica"])

    def submit(self, tenant_token: str, flag: str) -> str:
        body = {"command": [PY, "-c", WAIT_FOR_FILE, flag], "accelerator_type": "v4-16", "max_retries": 0}
        return str(self.post("/api/v1/jobs", body, tenant_token)["id"])

    def job(self, job: str, tenant_token: str) -> dict[str, Any]:
        got: dict[str, Any] = self.get(f"/api/v1/jobs/{job}", tenant_token)
        return got

    def wait_job(self, what: str, job: str, tenant_token: str, state: str) -> None:
        """Until ``job`` is in ``state``, asking this replica; past the deadline, fail showing the
        job, the last events and this replica's output."""
        wait(
            what,
            lambda: self.job(job, tenant_token)["state"] == state,
            lambda: (
                self.job(job, tenant_token),
                self.get("/api/v1/events?limit=1000")["items"][-30:],
                self.serve.output(),
            ),
        )

    def died(self) -> int | None:
        """The exit status once the process ended (a failpoint's SIGKILL: -9), else None."""
        code = self.serve.proc.poll()
        if code is not None and not self.serve.log.closed:
            self.serve.log.close()
        return code


class Replicas:
    """The replicas a test started on one fresh database."""

    def __init__(self, tmp: Path, db: str, fleet_dir: Path) -> None:
        self.tmp, self.db, self.fleet_dir = tmp, db, fleet_dir
        self.started: list[Replica] = []

    def start(self, name: str, failpoints: str = "") -> Replica:
        self.started.append(Replica(self.tmp, name, self.db, self.fleet_dir, failpoints))
        return self.started[-1]


@pytest.fixture
def replicas(
    tmp_path: Path, postgres_server: PostgresServer, fleet: Any, ray_client: object
) -> Iterator[Replicas]:
    made = Replicas(tmp_path, postgres_server.new_database(migrated=True), fleet.state_dir)
    yield made
    for r in made.started:
        if r.serve.proc.poll() is None:
            r.serve.proc.send_signal(signal.SIGCONT)
            r.serve.stop()
    # The leaders left their warm reservations (detached, for a restart to adopt): give them back
    # to Ray by name, as every module on the shared fleet does (later ones reserve slices with
    # ray.util.tpu). Nothing waits for a reservation to be placed first: one a leader asked for
    # just before it stopped may never be, while slices are busy.
    RayExecutor().release_all()


def flag(tmp: Path, tenant: str, name: str) -> None:
    (tmp / "checkpoints" / tenant / name).touch()


def test_leaders_die_mid_launch_and_mid_stop_pause_and_hand_over_and_every_job_runs_once(
    replicas: Replicas, tmp_path: Path
) -> None:
    a = replicas.start("a", failpoints="after-launch")
    wait("a leads", a.leads)
    said = "TPUFLEET_FAILPOINTS is set: this process kills itself (SIGKILL) at after-launch"
    assert said in a.serve.output()  # loudly: nobody runs a fleet with one by mistake
    b = replicas.start("b", failpoints="after-stop")
    assert not b.leads() and b.get("/api/v1/status")["leader_since"] is None
    assert b.get("/healthz")["leader_replica"] == a.me()
    metrics = httpx.get(f"{b.url}/metrics", headers={"Authorization": f"Bearer {b.token}"}, timeout=60).text
    assert f'tpufleet_leader{{replica="{b.me()}"}} 0.0' in metrics  # each replica's own gauge

    team = b.post("/api/v1/tenants", {"name": "team", "quota": {"v4": 16}})["token"]  # a standby serves
    first = b.submit(team, "first")

    # a launches the job, then dies before recording the launch; b adopts a's runners: attempt 1 runs
    wait("a dies at its failpoint after the launch", lambda: a.died() is not None, a.serve.output)
    assert a.died() == -signal.SIGKILL
    wait("b leads", b.leads)
    b.wait_job("b adopts the launch: attempt 1 runs", first, team, "RUNNING")
    assert b.job(first, team)["attempt"] == 1

    # the job ends; b stops it (every process ended), then dies before writing its end; c issues
    # the recorded stop again and ends attempt 1 SUCCEEDED
    c = replicas.start("c")
    flag(tmp_path, "team", "first")
    wait("b dies at its failpoint after the stop", lambda: b.died() is not None, b.serve.output)
    assert b.died() == -signal.SIGKILL
    wait("c leads", c.leads)
    c.wait_job("c ends the job", first, team, "SUCCEEDED")
    attempts = c.job(first, team)["attempts"]
    assert [t["state"] for t in attempts] == ["SUCCEEDED"], attempts  # one attempt: nothing ran twice

    # SIGSTOP the leader past its lease: d takes over; SIGCONT: c finds it was deposed, its writes refused
    d = replicas.start("d")
    jobs = [first, d.submit(team, "second")]
    d.wait_job("c runs the second job", jobs[-1], team, "RUNNING")
    c.serve.proc.send_signal(signal.SIGSTOP)
    wait("d leads once c's lease expired", d.leads)
    flag(tmp_path, "team", "second")
    d.wait_job("d ends the second job", jobs[-1], team, "SUCCEEDED")
    c.serve.proc.send_signal(signal.SIGCONT)
    wait("the woken c stands by", lambda: not c.leads())
    assert c.get("/healthz")["leader_replica"] == d.me()

    # SIGTERM: d hands the lease over to c at once, and c runs the next job
    d_id = d.me()
    d.serve.stop()
    wait("c leads after d's SIGTERM", c.leads)
    jobs.append(c.submit(team, "third"))
    flag(tmp_path, "team", "third")
    c.wait_job("c runs the third job", jobs[-1], team, "SUCCEEDED")

    for job in jobs:  # each job SUCCEEDED exactly once, whichever replica ran it
        attempts = c.job(job, team)["attempts"]
        assert [t["state"] for t in attempts].count("SUCCEEDED") == 1, attempts
    said = [e["message"] for e in c.get("/api/v1/events?limit=1000")["items"] if e["kind"] == "leader"]
    assert said[0].endswith("leads (fencing token 1)"), said
    c_name = c.me()
    assert any(m.startswith(f"replica {c_name} stopped leading") and "writes refused" in m for m in said), (
        said
    )
    assert any(m.startswith(f"replica {d_id} hands over the lease") for m in said), said
    assert said[-1].startswith(f"replica {c_name} leads (fencing token "), said
    tokens = [int(m.rsplit(" ", 1)[1].rstrip(")")) for m in said if " leads (fencing token " in m]
    assert tokens == sorted(set(tokens)) and len(tokens) >= 5, said  # a, b, c, d, c: each a larger token
    assert a.failed == b.failed == c.failed == d.failed == 0  # every live replica answered
    # from the store's own records: no write of a term came after a later term began (the woken
    # c's loop wrote nothing of its old term: the fence refused it), and no attempt was ended by a
    # term older than the one that launched it
    verdict = fencing.judge(replicas.db, after_event=0)
    assert verdict["overlapping_leaders"] == [] and verdict["terms"] >= 5, verdict
