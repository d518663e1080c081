"""Operating tenants against a real `tpufleet serve --sandbox` process, with the real CLI in
subprocesses: a quota lowered below what a tenant holds stops nothing and makes the excess
reclaimable (another tenant's in-quota job then preempts it, and the audit log says who did what);
a revoked token is refused at once; `tenant delete` refuses while jobs run and `--force` cancels
them and deletes; `token rotate-admin` replaces the admin token file and the old token stops.

No Ray: the sandbox runs every host of a job for --job-seconds."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import planes
import pytest


class Plane(planes.ServeProcess):
    """A `serve --sandbox` process and the CLI pointed at it."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path, "--sandbox", "v4-16:2", "--job-seconds", "600")
        self.token_file = tmp_path / "home" / "sandbox" / "admin-token"

    @property
    def admin(self) -> str:
        return self.token_file.read_text().strip()

    def tf(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        """`tpufleet ARGS --server URL --token T` (options before a `--`)."""
        extra = ["--server", self.url, "--token", token or self.admin]
        argv = list(args)
        at = argv.index("--") if "--" in argv else len(argv)
        argv[at:at] = extra
        return subprocess.run(
            [sys.executable, "-m", "tpufleet", *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def ok(self, *args: str, token: str | None = None) -> str:
        got = self.tf(*args, token=token)
        assert got.returncode == 0, (args, got.stdout, got.stderr)
        return got.stdout

    def refused(self, *args: str, token: str | None = None) -> str:
        """A command that must fail as a user error: exit 2, one line, no traceback; that line."""
        got = self.tf(*args, token=token)
        err = got.stderr.strip()
        assert got.returncode == 2 and "\n" not in err and "Traceback" not in err, (args, got.stderr)
        return err

    def job(self, job_id: str) -> dict[str, Any]:
        """A job through the API (polled often: cheaper than a CLI process each time)."""
        resp = httpx.get(
            f"{self.url}/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {self.admin}"}, timeout=60
        )
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    @staticmethod
    def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    p = Plane(tmp_path)
    try:
        yield p
    finally:
        out = p.stop()
        assert "Traceback" not in out, out[-3000:]


def test_update_revoke_delete_and_rotate_against_a_serving_process(plane: Plane) -> None:
    token_a = json.loads(plane.ok("tenant", "create", "team-a", "--quota", "v4=16", "--json"))["token"]
    token_b = json.loads(plane.ok("tenant", "create", "team-b", "--quota", "v4=8", "--json"))["token"]
    jobs = [
        plane.ok("submit", "--type", "v4-16", "--", "python", "t.py", token=token_a).strip() for _ in range(2)
    ]
    plane.wait_for(lambda: all(plane.job(j)["state"] == "RUNNING" for j in jobs), "team-a's jobs to run")

    # a quota below what team-a holds stops nothing; the most recent job now counts as borrowing
    plane.ok("tenant", "update", "team-a", "--quota", "v4=8", "--preemption", "never")
    shown = {j: plane.job(j) for j in jobs}
    assert [shown[j]["state"] for j in jobs] == ["RUNNING", "RUNNING"]
    assert sorted(shown[j]["borrowing"] for j in jobs) == [False, True]
    borrower = next(j for j in jobs if shown[j]["borrowing"])
    # team-b's in-quota job reclaims that slice: the borrower is preempted and requeued
    wanted = plane.ok("submit", "--type", "v4-16", "--", "python", "t.py", token=token_b).strip()
    plane.wait_for(lambda: plane.job(wanted)["state"] == "RUNNING", "team-b's job to run")
    assert plane.job(borrower)["state"] == "QUEUED" and plane.job(borrower)["attempt"] == 2
    events = json.loads(plane.ok("events", "--tenant", "team-a", "--json"))
    audit = [(e["kind"], e["actor"], e["job_id"]) for e in events]
    assert ("tenant", "admin", None) in audit and ("borrowing", "admin", borrower) in audit
    assert ("preempt", "scheduler", borrower) in audit
    assert any(wanted in e["message"] for e in events if e["kind"] == "preempt")

    # a revoked token is refused at once
    extra = json.loads(plane.ok("token", "create", "--tenant", "team-b", "--json"))
    assert plane.ok("jobs", "--json", token=extra["token"])
    plane.ok("token", "revoke", extra["id"])
    assert "revoked" in plane.refused("jobs", token=extra["token"])
    assert "'root' is not a token scope" in plane.refused(
        "token", "create", "--tenant", "team-b", "--scope", "root"
    )

    # delete: refused while team-a has work; --force cancels it and deletes the tenant
    refused = plane.refused("tenant", "delete", "team-a")
    assert "tenant team-a has 1 queued and 1 running jobs" in refused
    assert plane.ok("tenant", "delete", "team-a", "--force").strip() == "tenant team-a deleted"
    assert {plane.job(j)["state"] for j in jobs} == {"CANCELLED"}
    assert "revoked" in plane.refused("jobs", token=token_a)
    listed = json.loads(plane.ok("tenants", "--all", "--json"))
    assert [(t["name"], t["state"]) for t in listed] == [("team-a", "deleted"), ("team-b", "active")]
    assert "choose another name" in plane.refused("tenant", "create", "team-a")

    # rotate the admin token: the server's file holds the new one (0600); the old one stops
    old = plane.admin
    out = json.loads(plane.ok("token", "rotate-admin", "--json", token=old))
    assert out["revoked"] == 1 and Path(out["path"]) == plane.token_file
    new = plane.admin
    assert new != old and stat.S_IMODE(plane.token_file.stat().st_mode) == 0o600
    assert "revoked" in plane.refused("tenants", token=old)
    kinds = [(e["kind"], e["actor"]) for e in json.loads(plane.ok("events", "--json", token=new))]
    assert kinds[-1] == ("token", "admin") and ("tenant", "admin") in kinds
