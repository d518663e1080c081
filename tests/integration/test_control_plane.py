"""The whole control plane on the shared emulated fleet: ``ControlPlane(RayExecutor.connect(...))``
served over HTTP, driven only through ``Client`` (the API a user has), as issue 5's "Done when" asks.

One control plane for the module; every test makes its own tenants and ends its own jobs, so the
next test finds every slice FREE. The teardown cancels what is left, closes the control plane and
gives every warm reservation back to Ray (later modules use ``ray.util.tpu`` on the same fleet).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import planes
import pytest
from _executor_helpers import pid_alive, procs_with, token, wait_for
from planes import wait_state

from tpufleet.client.http import Client
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.ray.client import RayExecutor
from tpufleet.control.store.values import Limits
from tpufleet.errors import AuthError, ConflictError, ForbiddenError, NotFoundError

pytestmark = pytest.mark.integration


PY = sys.executable
CONFIG = ServiceConfig(
    interval_s=0.5,
    preempt_grace_s=3.0,
    cancel_grace_s=1.0,
    fail_grace_s=1.0,
    start_timeout_s=30.0,
    checkpoint_check_s=0.5,
    progress_write_s=0.5,
)
# A URL prefix the operator allows for working_dir, where nothing answers (port 9, discard).
DEAD_URL = "http://127.0.0.1:9/"
CKPT_QUOTA = 32 << 20  # serve --checkpoint-quota-gib 0.03125: per tenant, checked on the hosts
LIMITS = Limits(working_dir_url_prefixes=(DEAD_URL,), checkpoint_quota_bytes=CKPT_QUOTA)
# Prints the host contract (TPU_*, MEGASCALE_*, TPUFLEET_*) as one JSON line.
PRINT_CONTRACT = (
    "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith(('TPU_', 'MEGASCALE_', 'TPUFLEET_'))}), flush=True)"
)
# Says it runs, then waits until the flag file named by argv[1] exists in its tenant's directory
# (the only place a jailed job shares with the test: Plane.flag creates it). argv[2] is a token the
# test finds the job's processes by (from the host's /proc: inside its jail a job has its own pids).
WAIT_FOR_FILE = (
    "import os, sys, time\n"
    "flag = os.path.join(os.path.dirname(os.environ['TPUFLEET_CHECKPOINT_DIR']), sys.argv[1])\n"
    "print('PID', os.getpid(), 'attempt', os.environ['TPUFLEET_ATTEMPT'], flush=True)\n"
    "while not os.path.exists(flag): time.sleep(0.05)\n"
)
LOWER = "LOWER_PRIORITY_THAN_HEAD"


@dataclass
class Plane(planes.Served):
    def tenant(self, preemption: str | None = None, **quota: int) -> tuple[str, Client]:
        return self.tenant_client("team", preemption, **quota)

    def slices(self, names: list[str]) -> list[dict[str, Any]]:
        return [s for s in self.admin.slices() if s["name"] in names]

    def flag(self, tenant: str, name: str) -> None:
        """Create the flag file ``name`` that WAIT_FOR_FILE jobs of ``tenant`` wait for."""
        (self.cp.state_dir / "checkpoints" / tenant / name).touch()


@pytest.fixture(scope="module")
def plane(ray_client: object, fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    cluster = RayExecutor.connect(fleet.ray_address)
    state_dir = tmp_path_factory.mktemp("control-plane")
    warm = [s.name for s in cluster.inventory() if s.intact]
    with planes.served(cluster, state_dir, kind=Plane, warm=warm, config=CONFIG, limits=LIMITS) as p:
        yield p


@pytest.fixture(autouse=True)
def _no_job_left_behind(plane: Plane) -> Iterator[None]:
    """A test that failed half-way must not leave the next one without free slices."""
    yield
    plane.cancel_all()


def logged(client: Client, job_id: str, text: str, attempt: int | None = None) -> list[dict[str, Any]]:
    """Every host's stored log of the attempt, once each one contains ``text``."""

    def probe() -> list[dict[str, Any]] | None:
        hosts: list[dict[str, Any]] = client.logs(job_id, attempt=attempt)["hosts"]
        return hosts if hosts and all(text in h["data"] for h in hosts) else None

    return wait_for(f"{text!r} in every host's log of job {job_id}", probe)


# -- a one-slice and a two-slice job: the contract on every host ---------------------------------
@pytest.mark.parametrize("num_slices", [1, 2])
def test_job_succeeds_with_the_contract_on_every_host(plane: Plane, num_slices: int) -> None:
    tenant, client = plane.tenant(v4=16)
    job = client.submit([PY, "-c", PRINT_CONTRACT], "v4-16", num_slices=num_slices, env={"FOO": "1"})
    done = wait_state(client, job["id"], "SUCCEEDED")
    assert (done["attempt"], done["exit_code"], len(done["slices"])) == (1, 0, num_slices)
    hosts = client.logs(job["id"])["hosts"]
    assert [(h["slice"], h["worker_id"]) for h in hosts] == [(s, w) for s in done["slices"] for w in (0, 1)]
    envs = [json.loads(h["data"]) for h in hosts]
    for h, env in zip(hosts, envs, strict=True):
        assert h["complete"]
        assert (env["TPU_NAME"], env["TPU_WORKER_ID"]) == (h["slice"], str(h["worker_id"]))
        assert (env["TPU_ACCELERATOR_TYPE"], env["TPU_TOPOLOGY"]) == ("v4-16", "2x2x2")
        assert len(env["TPU_WORKER_HOSTNAMES"].split(",")) == 2
        assert (env["TPUFLEET_JOB_ID"], env["TPUFLEET_ATTEMPT"]) == (job["id"], "1")
        assert env["TPUFLEET_CHECKPOINT_DIR"] == str(plane.cp.state_dir / "checkpoints" / tenant / job["id"])
        if num_slices == 1:
            assert not [k for k in env if k.startswith("MEGASCALE_")]
        else:
            assert env["MEGASCALE_NUM_SLICES"] == "2"
            assert env["MEGASCALE_SLICE_ID"] == str(done["slices"].index(h["slice"]))
    if num_slices == 2:
        assert sorted({e["MEGASCALE_SLICE_ID"] for e in envs}) == ["0", "1"]
        assert len({(e["MEGASCALE_COORDINATOR_ADDRESS"], e["MEGASCALE_PORT"]) for e in envs}) == 1
    assert plane.all_free(done["slices"])


# -- logs ----------------------------------------------------------------------------------------
def test_logs_are_readable_while_running_and_complete_after(plane: Plane) -> None:
    tenant, client = plane.tenant(v4=8)
    n = 3000
    code = WAIT_FOR_FILE + f"for i in range({n}): print(os.environ['TPU_WORKER_ID'], 'line', i)\n"
    job = client.submit([PY, "-c", code, "go"], "v4-16")
    running = logged(client, job["id"], "PID")
    assert [h["complete"] for h in running] == [False, False]
    plane.flag(tenant, "go")
    wait_state(client, job["id"], "SUCCEEDED")
    for h in client.logs(job["id"])["hosts"]:
        lines = h["data"].splitlines()
        assert h["complete"] and lines[0].startswith("PID")
        assert lines[1:] == [f"{h['worker_id']} line {i}" for i in range(n)]
        tail = client.logs(job["id"], host=h["host"], offset=h["next_offset"] - 10)["hosts"][0]
        assert tail["data"] == h["data"][-10:] and tail["next_offset"] == h["next_offset"]


# -- cancel --------------------------------------------------------------------------------------
def test_cancel_ends_every_process_and_frees_the_slices(plane: Plane) -> None:
    _, client = plane.tenant(v4=16)
    tok = token()
    job = client.submit([PY, "-c", WAIT_FOR_FILE, "never", tok], "v4-16", num_slices=2)
    running = wait_state(client, job["id"], "RUNNING")
    logged(client, job["id"], "PID")
    procs = procs_with(tok)
    assert len(procs) == 4 and all(pid_alive(p) for p in procs)
    assert [s["holder"] for s in plane.slices(running["slices"])] == [job["id"]] * 2
    client.cancel(job["id"])
    done = wait_state(client, job["id"], "CANCELLED", timeout_s=30)
    assert done["reason_code"] == "CANCELLED"
    assert [p for p in procs if pid_alive(p)] == []
    assert plane.all_free(running["slices"])


# -- auth ----------------------------------------------------------------------------------------
def test_the_api_rejects_other_tenants_and_bad_tokens(plane: Plane) -> None:
    a_name, a = plane.tenant(v4=8)
    _, b = plane.tenant(v4=8)
    job = a.submit([PY, "-c", "print('mine')"], "v4-16")
    jid = job["id"]
    for call in (b.job, b.logs, b.events, b.cancel):  # another tenant's job reads as not existing
        with pytest.raises(NotFoundError, match=f"job '{jid}' not found"):
            call(jid)
    with pytest.raises(ForbiddenError):
        b.submit([PY, "-c", "pass"], "v4-16", tenant=a_name)
    with pytest.raises(ForbiddenError):
        b.create_tenant("sneaky", {"v4": 64})
    assert jid not in {j["id"] for j in b.jobs()}
    for bad in ("tf_not-a-token", None):
        with Client(plane.url, bad) as stranger, pytest.raises(AuthError):
            stranger.jobs()
    with httpx.Client(base_url=plane.url) as raw:
        assert (
            raw.get(f"/api/v1/jobs/{jid}", headers={"Authorization": f"Bearer {b.token}"}).status_code == 404
        )
        assert (
            raw.post(f"/api/v1/jobs/{jid}/cancel", headers={"Authorization": "Bearer x"}).status_code == 401
        )
        assert raw.get("/api/v1/jobs").status_code == 401
    assert wait_state(a, jid, "SUCCEEDED")["cancel_requested"] is False
    assert a.logs(jid)["hosts"][0]["data"] == "mine\n"


# -- policy: priority, quota and preemption ------------------------------------------------------
def test_a_higher_priority_job_is_admitted_first(plane: Plane) -> None:
    tenant, client = plane.tenant(preemption="never", v4=48)  # it waits instead of preempting its own
    go, hold = "go", "hold"
    blocker = client.submit([PY, "-c", WAIT_FOR_FILE, go], "v4-16", num_slices=2, name="blocker")
    wait_state(client, blocker["id"], "RUNNING")
    low = client.submit([PY, "-c", WAIT_FOR_FILE, hold], "v4-16", num_slices=2, name="low")
    high = client.submit([PY, "-c", WAIT_FOR_FILE, hold], "v4-16", num_slices=2, priority=10, name="high")
    waiting = wait_for(
        "the low job's reason", lambda: (j := client.job(low["id"]))["reason_code"] == LOWER and j
    )
    assert high["id"] in waiting["reason"] and "priority 10" in waiting["reason"], waiting["reason"]
    assert client.job(high["id"])["state"] == "QUEUED"
    plane.flag(tenant, go)
    running = wait_state(client, high["id"], "RUNNING")
    # A waiting job's reason is rewritten as the fleet moves, at the loop's next turns: once the
    # high job runs, the low one's reason comes to name it (seen once under load on 2026-12-06: a
    # read right at RUNNING still named the blocker, the job that held the slices before).
    low_now = wait_for(
        "the low job's reason to name the running one",
        lambda: (
            (j := client.job(low["id"]))["reason_code"] == "WAITING_FOR_FREE_SLICES"
            and high["id"] in j["reason"]
            and j
        ),
        timeout_s=30,
    )
    assert low_now["state"] == "QUEUED", low_now
    plane.flag(tenant, hold)
    low_done = wait_state(client, low["id"], "SUCCEEDED")
    assert running["admitted_at"] < low_done["admitted_at"]
    assert client.job(blocker["id"])["finished_at"] <= running["admitted_at"]


# The borrower prints its attempt, then on SIGTERM (the checkpoint signal) says so and exits.
TRAP = (
    "import os, signal, sys, time\n"
    "attempt = os.environ['TPUFLEET_ATTEMPT']\n"
    "def bye(*_):\n"
    "    print('SIGTERM on attempt', attempt, flush=True); sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "print('running attempt', attempt, flush=True)\n"
    "time.sleep(300)\n"
)


def test_an_in_quota_job_preempts_a_borrower(plane: Plane) -> None:
    a_name, a = plane.tenant(v4=8)  # one v4-16 slice in quota
    _, b = plane.tenant()  # no quota: only borrows idle slices
    first = b.submit([PY, "-c", TRAP], "v4-16", max_retries=0, name="borrow-1")
    assert wait_state(b, first["id"], "RUNNING")["borrowing"] is True
    second = b.submit([PY, "-c", TRAP], "v4-16", max_retries=0, name="borrow-2")
    assert wait_state(b, second["id"], "RUNNING")["borrowing"] is True
    logged(b, second["id"], "running attempt 1")  # the SIGTERM handler is in place
    mine = a.submit([PY, "-c", WAIT_FOR_FILE, "go"], "v4-16", name="in-quota")
    running = wait_state(a, mine["id"], "RUNNING")
    assert running["borrowing"] is False
    # The most recently admitted borrower is the victim: SIGTERM, requeued with attempt + 1.
    requeued = wait_state(b, second["id"], "QUEUED")
    assert requeued["attempt"] == 2 and requeued["failures"] == 0
    assert requeued["attempts"][0]["state"] == "PREEMPTED"
    assert f"preempted for job {mine['id']}" in requeued["attempts"][0]["message"]
    assert running["slices"] == requeued["attempts"][0]["slices"]
    for h in b.logs(second["id"], attempt=1)["hosts"]:
        assert h["complete"] and "SIGTERM on attempt 1" in h["data"], h
    assert b.job(first["id"])["state"] == "RUNNING" and b.job(first["id"])["attempt"] == 1
    waiting = wait_for(
        "the borrower's reason",
        lambda: (j := b.job(second["id"]))["reason_code"] == "QUOTA_EXCEEDED_NO_BORROWING" and j,
    )
    assert "beyond its quota of 0" in waiting["reason"], waiting["reason"]
    plane.flag(a_name, "go")  # the in-quota job ends; the borrower takes the idle slice again
    wait_state(a, mine["id"], "SUCCEEDED")
    again = wait_state(b, second["id"], "RUNNING")
    assert again["attempt"] == 2 and again["borrowing"] is True
    logged(b, second["id"], "running attempt 2", attempt=2)
    for job in (first, second):
        b.cancel(job["id"])
        wait_state(b, job["id"], "CANCELLED", timeout_s=30)


# On SIGTERM (the checkpoint signal) it writes a checkpoint and exits; a later attempt reads it back.
CHECKPOINTED = (
    "import os, signal, sys, time\n"
    "attempt = os.environ['TPUFLEET_ATTEMPT']\n"
    "ckpt = os.path.join(os.environ['TPUFLEET_CHECKPOINT_DIR'], 'step-' + os.environ['TPU_WORKER_ID'])\n"
    "if os.path.exists(ckpt): print('resumed from', open(ckpt).read(), 'on attempt', attempt, flush=True)\n"
    "def bye(*_):\n"
    "    open(ckpt, 'w').write('step-42'); print('SIGTERM on attempt', attempt, flush=True); sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "print('running attempt', attempt, flush=True)\n"
    "time.sleep(300)\n"
)


def test_a_higher_priority_job_preempts_its_own_tenants_lower_priority_job(plane: Plane) -> None:
    tenant, client = plane.tenant(v4=16)  # two v4-16 slices' worth of chips; preemption: lower_priority
    low = client.submit([PY, "-c", CHECKPOINTED], "v4-16", num_slices=2, name="low", max_retries=0)
    wait_state(client, low["id"], "RUNNING")
    logged(client, low["id"], "running attempt 1")  # the SIGTERM handler is in place
    urgent = client.submit([PY, "-c", WAIT_FOR_FILE, "go"], "v4-16", priority=10, name="urgent")
    running = wait_state(client, urgent["id"], "RUNNING")
    requeued = client.job(low["id"])
    assert requeued["state"] == "QUEUED" and requeued["attempt"] == 2 and requeued["failures"] == 0
    assert requeued["attempts"][0]["state"] == "PREEMPTED"
    assert f"preempted for job {urgent['id']}" in requeued["attempts"][0]["message"]
    assert running["slices"][0] in requeued["attempts"][0]["slices"]
    for h in client.logs(low["id"], attempt=1)["hosts"]:
        assert h["complete"] and "SIGTERM on attempt 1" in h["data"], h
    events = plane.admin.events(low["id"])
    assert any(e["kind"] == "priority" and urgent["id"] in e["message"] for e in events), events
    plane.flag(tenant, "go")  # the urgent job ends; the preempted one resumes from its checkpoint
    wait_state(client, urgent["id"], "SUCCEEDED")
    again = wait_state(client, low["id"], "RUNNING")
    assert again["attempt"] == 2
    logged(client, low["id"], "resumed from step-42 on attempt 2", attempt=2)
    client.cancel(low["id"])
    wait_state(client, low["id"], "CANCELLED", timeout_s=30)


# -- operating a tenant on a live fleet (issue 14) -----------------------------------------------
def test_operating_a_tenant_on_a_live_fleet(plane: Plane) -> None:
    name, client = plane.tenant(v4=16)
    job = client.submit([PY, "-c", TRAP], "v4-16", max_retries=0, name="lives-through-changes")
    wait_state(client, job["id"], "RUNNING")
    logged(client, job["id"], "running attempt 1")  # the SIGTERM handler is in place
    # A quota lowered below what the tenant holds stops nothing: the job now borrows (reclaimable).
    assert plane.admin.update_tenant(name, quota={"v4": 0})["quota"].get("v4", 0) == 0
    wait_for("the job to count as borrowing", lambda: client.job(job["id"])["borrowing"] is True, 30)
    assert client.job(job["id"])["state"] == "RUNNING" and client.job(job["id"])["attempt"] == 1
    # A second token of the tenant works until it is revoked, then gets 401 at once.
    made = plane.admin.create_token(name)
    with Client(plane.url, made["token"]) as second:
        assert [j["id"] for j in second.jobs()] == [job["id"]]
        plane.admin.revoke_token(made["id"])
        with pytest.raises(AuthError):
            second.jobs()
    # Delete refuses while the tenant has work; --force cancels it (SIGTERM, grace) and deletes.
    with pytest.raises(ConflictError, match="running"):
        plane.admin.delete_tenant(name)
    plane.admin.delete_tenant(name, force=True)
    wait_state(plane.admin, job["id"], "CANCELLED", timeout_s=60)
    for h in plane.admin.logs(job["id"], attempt=1)["hosts"]:
        assert "SIGTERM on attempt 1" in h["data"], h
    wait_for("the tenant to be deleted", lambda: plane.admin.tenant(name).get("state") == "deleted", 30)
    with pytest.raises(AuthError):
        client.jobs()  # its tokens went with it
    assert plane.admin.job(job["id"])["tenant"] == name  # its records stay readable to the admin
    said = [(e["kind"], e["actor"], e["message"]) for e in plane.admin.audit(name)]
    for kind, words in (
        ("tenant", f"tenant {name} updated"),
        ("borrowing", "now borrowing"),
        ("token", "created"),
        ("token", "revoked"),
        ("tenant", f"tenant {name} deleted"),
    ):
        assert any(k == kind and a == "admin" and words in m for k, a, m in said), (kind, words, said)


# -- a lost host ---------------------------------------------------------------------------------
def test_a_lost_host_ends_the_attempt_and_the_job_resumes_elsewhere(plane: Plane, fleet: Any) -> None:
    _, client = plane.tenant(v4=8)
    code = (
        "import os, time\n"
        "print('PID', os.getpid(), 'attempt', os.environ['TPUFLEET_ATTEMPT'], flush=True)\n"
        "if os.environ['TPUFLEET_ATTEMPT'] == '1': time.sleep(300)\n"
    )
    tok = token()
    job = client.submit([PY, "-c", code, tok], "v4-16", max_retries=2)
    running = wait_state(client, job["id"], "RUNNING")
    (victim,) = running["slices"]
    logged(client, job["id"], "PID")
    procs = procs_with(tok)
    assert len(procs) == 2
    fleet.kill_host(victim, 1)
    done = wait_state(client, job["id"], "SUCCEEDED", timeout_s=120)
    first, second = done["attempts"]
    assert (first["state"], done["attempt"], done["failures"]) == ("FAILED", 2, 1)
    hosts = {h["worker_id"]: h["state"] for h in first["exit_codes"]}
    assert hosts[1] == "LOST", first  # the killed host is recorded as lost, not as running
    assert "lost" in first["message"] or "broken" in first["message"], first
    assert second["slices"] != [victim] and second["state"] == "SUCCEEDED"
    wait_for("every process of the lost attempt to end", lambda: not procs_with(tok), 30)
    (broken,) = plane.slices([victim])
    assert broken["state"] == "BROKEN" and any("worker 1" in p for p in broken["problems"]), broken
    assert "attempt 2" in client.logs(job["id"])["hosts"][0]["data"]
    fleet.restore(victim)
    wait_for("the restored slice to be FREE", lambda: plane.all_free([victim]), 120, every_s=0.5)
    plane.cluster.wait_warm([victim], timeout_s=120)


# -- a hostile tenant (issue 8): what a job sends or does stays with that job ---------------------
PROBE = """
import json, os, pathlib, sys
def can_read(p):
    try:
        pathlib.Path(p).read_bytes(); return True
    except OSError:
        return False
print(json.dumps({"files": sorted(os.listdir(".")), "admin": can_read(sys.argv[1]),
                  "db": can_read(sys.argv[2]), "other": can_read(sys.argv[3]),
                  "ray_token": any("RAY_AUTH" in k for k in os.environ)}), flush=True)
"""


def test_a_job_runs_its_uploaded_code_and_reaches_no_secret_and_no_other_tenant(
    plane: Plane, tmp_path: Path
) -> None:
    a_name, a = plane.tenant(v4=8)
    _, b = plane.tenant(v4=8)
    secret = a.submit([PY, "-c", "import os, pathlib; pathlib.Path(os.environ['TPUFLEET_CHECKPOINT_DIR'], "
                       "'weights').write_text('a')"], "v4-16")  # fmt: skip
    wait_state(a, secret["id"], "SUCCEEDED")
    other = plane.cp.state_dir / "checkpoints" / a_name / secret["id"] / "weights"
    assert other.read_text() == "a"
    code = tmp_path / "code"
    code.mkdir()
    (code / "probe.py").write_text(PROBE)
    (code / "data.txt").write_text("shipped")
    package = b.upload_package(code)
    state = plane.cp.state_dir
    job = b.submit(
        [PY, "probe.py", str(state / "admin-token"), str(state / "tpufleet.db"), str(other)],
        "v4-16",
        working_dir=package,
    )
    done = wait_state(b, job["id"], "SUCCEEDED")
    seen = json.loads(b.logs(done["id"])["hosts"][0]["data"])
    assert seen["files"] == ["data.txt", "probe.py"]  # its own code is its working directory
    assert seen == {**seen, "admin": False, "db": False, "other": False, "ray_token": False}


def test_a_working_dir_url_that_cannot_be_fetched_fails_the_attempt_and_frees_the_slice(
    plane: Plane,
) -> None:
    _, client = plane.tenant(v4=8)
    job = client.submit([PY, "-c", "pass"], "v4-16", working_dir=DEAD_URL + "code.zip", max_retries=0)
    done = wait_state(client, job["id"], "FAILED", timeout_s=120)
    assert done["reason_code"] == "FAILED" and "working_dir could not be set up" in done["reason"], done
    assert plane.all_free(done["slices"])


ESCAPE = (  # leaves the job's process group and session, as `setsid sleep 90 &` does
    "import subprocess, sys\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(90)', sys.argv[1]],"
    " start_new_session=True)\n"
    "print('detached', flush=True)\n"
    "import time; time.sleep(300)\n"
)


def test_cancel_ends_processes_that_left_the_jobs_session(plane: Plane) -> None:
    _, client = plane.tenant(v4=8)
    tok = token()
    job = client.submit([PY, "-c", ESCAPE, tok], "v4-16")
    wait_state(client, job["id"], "RUNNING")
    logged(client, job["id"], "detached")
    assert len(procs_with(tok)) == 4  # the job and its daemon, on each of the two hosts
    client.cancel(job["id"])
    wait_state(client, job["id"], "CANCELLED", timeout_s=30)
    assert procs_with(tok) == []


def test_a_slice_whose_runner_died_heals_before_it_is_offered_again(plane: Plane) -> None:
    import ray

    from tpufleet.host.runner import NAMESPACE, pool_runner_name

    _, client = plane.tenant(v4=8)
    job = client.submit([PY, "-c", WAIT_FOR_FILE, "never"], "v4-16", max_retries=0)
    running = wait_state(client, job["id"], "RUNNING")
    (victim,) = running["slices"]
    runner = ray.get_actor(pool_runner_name(victim, 1), namespace=NAMESPACE)
    os.kill(ray.get(runner.ping.remote())["pid"], 9)  # as `kill -9 $PPID` from an unjailed job
    failed = wait_state(client, job["id"], "FAILED", timeout_s=60)
    assert "lost" in failed["reason"], failed["reason"]
    # the slice comes back FREE with a new runner, and the next jobs there run
    wait_for("the slice to heal", lambda: plane.all_free([victim]), 60, every_s=0.5)
    for _ in range(2):
        again = client.submit([PY, "-c", "print('fine')"], "v4-16", max_retries=0)
        assert wait_state(client, again["id"], "SUCCEEDED")["attempt"] == 1


# Writes 1 MiB a step into its checkpoint directory (worker 0), up to 256 MiB.
FILL_CHECKPOINTS = (
    "import os, time\n"
    "ckpt = os.environ['TPUFLEET_CHECKPOINT_DIR']\n"
    "for i in range(256 if os.environ['TPU_WORKER_ID'] == '0' else 0):\n"
    "    open(os.path.join(ckpt, f'shard-{i}'), 'wb').write(os.urandom(1 << 20)); time.sleep(0.05)\n"
    "time.sleep(120)\n"
)


def test_a_job_past_its_tenants_checkpoint_quota_fails_saying_so_and_the_usage_is_shown(
    plane: Plane,
) -> None:
    name, client = plane.tenant(v4=8)
    job = client.submit([PY, "-c", FILL_CHECKPOINTS], "v4-16", max_retries=0)
    done = wait_state(client, job["id"], "FAILED", timeout_s=120)
    assert f"checkpoint quota exceeded: tenant '{name}' uses " in done["reason"], done
    assert "of its 32.0 MiB (serve --checkpoint-quota-gib)" in done["reason"]
    ckpt = plane.cp.state_dir / "checkpoints" / name
    assert sum(f.stat().st_size for f in (ckpt / job["id"]).iterdir()) < 128 << 20  # stopped early
    assert not (ckpt / ".runs" / job["id"]).exists()  # no empty run directories left
    usage = wait_for(  # the measurement over the quota (an earlier one may be stored first)
        "the hosts' measurement in the store",
        lambda: ((u := plane.admin.tenant(name)["checkpoints"])["used_bytes"] or 0) > CKPT_QUOTA and u,
        timeout_s=30,
    )
    assert usage["quota_bytes"] == CKPT_QUOTA and usage["measured_at"] is not None
    assert plane.all_free(done["slices"])
