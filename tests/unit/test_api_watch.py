"""Long-polled job reads (``GET /api/v1/jobs/{id}?while_state=...&wait_s=...``, ``api/watch.py``)
on a live sandbox control plane serving HTTP: the answer comes when the loop (or a cancel) moves
the job, not at the next look at the store (``recheck_s`` is set far beyond the waits here, so
only a wake-up can answer in time); a wait that nothing ends answers the job as it is; waits are
capped per tenant; bad parameters are one line; another tenant's job is a 404 as without a wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import planes
import pytest
from _executor_helpers import wait_for

from tpufleet.api.watch import JobChanges
from tpufleet.client.http import Client
from tpufleet.control.cluster.memory import MemoryCluster
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.errors import ConflictError

BEFORE_RUNNING = ("QUEUED", "ADMITTED", "STARTING")


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[planes.Served]:
    cluster = MemoryCluster.sandbox("v4-16:1", job_seconds=300)  # one slice: a second job waits
    config = ServiceConfig(interval_s=0.05, busy_interval_s=0.01)
    with planes.served(cluster, tmp_path / "state", config=config) as served:
        served.cp.app.state.job_changes.recheck_s = 120.0  # only a wake-up answers within the waits
        yield served


def _changes(plane: planes.Served) -> JobChanges:
    changes: JobChanges = plane.cp.app.state.job_changes
    return changes


def _waiting(
    plane: planes.Served, pool: ThreadPoolExecutor, client: Client, job_id: str, **kw: Any
) -> Future[Any]:
    """A long-polled read of ``job_id`` under way in ``pool``, once the server holds it."""
    before = _changes(plane).waiting
    future = pool.submit(client.job, job_id, **kw)
    wait_for("the read to wait", lambda: _changes(plane).waiting > before or future.done(), 10)
    assert not future.done(), future.result()
    return future


def test_a_waiting_read_answers_when_the_loop_admits_the_job(plane: planes.Served) -> None:
    _, client = plane.tenant_client(v4=16)
    first = client.submit(["train"], "v4-16")["id"]
    planes.wait_state(client, first, "RUNNING")
    second = client.submit(["train"], "v4-16")["id"]  # waits for the only slice
    with ThreadPoolExecutor(1) as pool:
        read = _waiting(plane, pool, client, second, while_state="QUEUED", wait_s=30)
        client.cancel(first)  # the loop ends it, then admits the second job on its slice
        job = read.result(timeout=20)  # well within wait_s: the loop's write woke the read
    assert job["id"] == second and job["state"] in ("ADMITTED", "STARTING", "RUNNING")
    # several states at once: the answer comes once the job is in none of them
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(client.job, second, while_state=list(BEFORE_RUNNING), wait_s=30).result(timeout=20)
    assert job["state"] == "RUNNING"
    assert _changes(plane).waiting == 0


def test_a_cancel_wakes_a_read_waiting_on_the_queued_job(plane: planes.Served) -> None:
    _, client = plane.tenant_client(v4=16)
    first = client.submit(["train"], "v4-16")["id"]
    planes.wait_state(client, first, "RUNNING")
    second = client.submit(["train"], "v4-16")["id"]
    with ThreadPoolExecutor(1) as pool:
        read = _waiting(plane, pool, client, second, while_state="queued", wait_s=30)  # any case
        client.cancel(second)
        assert read.result(timeout=20)["state"] == "CANCELLED"  # woken, not at the end of wait_s


def test_a_wait_nothing_ends_answers_the_job_as_it_is(plane: planes.Served) -> None:
    _, client = plane.tenant_client(v4=16)
    first = client.submit(["train"], "v4-16")["id"]
    planes.wait_state(client, first, "RUNNING")
    second = client.submit(["train"], "v4-16")["id"]
    started = time.monotonic()
    job = client.job(second, while_state="QUEUED", wait_s=0.4)
    assert job["state"] == "QUEUED" and time.monotonic() - started >= 0.4
    assert client.job(first, while_state="QUEUED", wait_s=30)["state"] == "RUNNING"  # not in it: at once


def test_waits_are_capped_per_tenant_and_the_cap_frees_as_they_answer(plane: planes.Served) -> None:
    _changes(plane).per_tenant = 1
    _, client = plane.tenant_client(v4=16)
    _, other = plane.tenant_client(v4=16)
    first = client.submit(["train"], "v4-16")["id"]
    planes.wait_state(client, first, "RUNNING")
    second = client.submit(["train"], "v4-16")["id"]
    third = other.submit(["train"], "v4-16")["id"]
    with ThreadPoolExecutor(2) as pool:
        held = _waiting(plane, pool, client, second, while_state="QUEUED", wait_s=30)
        with pytest.raises(ConflictError, match=r"too many waiting reads at once \(1 per tenant"):
            client.job(second, while_state="QUEUED", wait_s=30)
        assert client.job(second)["state"] == "QUEUED"  # a read without a wait is never refused
        theirs = _waiting(
            plane, pool, other, third, while_state="QUEUED", wait_s=30
        )  # another tenant's own cap
        client.cancel(second)
        other.cancel(third)
        assert held.result(timeout=20)["state"] == theirs.result(timeout=20)["state"] == "CANCELLED"
    assert _changes(plane).waiting == 0
    assert client.job(first, while_state="QUEUED", wait_s=1)["state"] == "RUNNING"


def test_waits_are_capped_in_all_whatever_the_tenants(plane: planes.Served) -> None:
    """Each wait holds one of the API's worker threads: two tenants within their own caps still
    stop at the cap in all, and the admin's reads count too."""
    changes = _changes(plane)
    changes.per_tenant, changes.total = 2, 3
    tenants = [plane.tenant_client(v4=16)[1] for _ in range(2)]
    first = tenants[0].submit(["train"], "v4-16")["id"]
    planes.wait_state(tenants[0], first, "RUNNING")
    queued = [c.submit(["train"], "v4-16")["id"] for c in tenants]
    with ThreadPoolExecutor(3) as pool:
        held = [
            _waiting(plane, pool, tenants[0], queued[0], while_state="QUEUED", wait_s=30),
            _waiting(plane, pool, tenants[0], queued[0], while_state="QUEUED", wait_s=30),
            _waiting(plane, pool, tenants[1], queued[1], while_state="QUEUED", wait_s=30),
        ]
        with pytest.raises(ConflictError, match=r"\(2 per tenant, 3 in all\)"):
            tenants[1].job(queued[1], while_state="QUEUED", wait_s=30)  # within its own 2, over the 3
        with pytest.raises(ConflictError, match="too many waiting reads"):
            plane.admin.job(queued[1], while_state="QUEUED", wait_s=30)
        for c, job_id in zip(tenants, queued, strict=True):
            c.cancel(job_id)
        assert [f.result(timeout=20)["state"] for f in held] == ["CANCELLED"] * 3
    assert changes.waiting == 0


@pytest.mark.parametrize(
    ("query", "status", "says"),
    [
        ("while_state=RUNNNING&wait_s=1", 400, "while_state='RUNNNING' is not a job state; valid: QUEUED"),
        ("wait_s=1", 400, "wait_s needs while_state"),
        ("while_state=QUEUED&wait_s=31", 422, "wait_s: Input should be less than or equal to 30"),
        ("while_state=QUEUED&wait_s=-1", 422, "wait_s: Input should be greater than or equal to 0"),
        ("while_state=QUEUED&wait_s=nan", 422, "wait_s"),
    ],
)
def test_bad_wait_parameters_are_one_line(plane: planes.Served, query: str, status: int, says: str) -> None:
    _, client = plane.tenant_client(v4=16)
    job_id = client.submit(["train"], "v4-16")["id"]
    resp = httpx.get(
        f"{plane.url}/api/v1/jobs/{job_id}?{query}", headers={"Authorization": f"Bearer {client.token}"}
    )
    assert resp.status_code == status and says in resp.json()["error"] and "\n" not in resp.json()["error"]


def test_another_tenants_job_is_not_found_without_waiting(plane: planes.Served) -> None:
    _, mine = plane.tenant_client(v4=16)
    _, theirs = plane.tenant_client(v4=16)
    job_id = theirs.submit(["train"], "v4-16")["id"]
    started = time.monotonic()
    resp = httpx.get(
        f"{plane.url}/api/v1/jobs/{job_id}",
        params={"while_state": ["QUEUED", "ADMITTED", "STARTING", "RUNNING"], "wait_s": 30},
        headers={"Authorization": f"Bearer {mine.token}"},
    )
    assert resp.status_code == 404 and time.monotonic() - started < 25
    assert _changes(plane).waiting == 0


def test_job_changes_wake_only_the_reads_of_the_jobs_that_changed() -> None:
    changes = JobChanges(recheck_s=120.0)
    states = {"a": "QUEUED", "b": "QUEUED"}
    answers: dict[str, str] = {}

    def wait(job_id: str) -> None:
        answers[job_id] = changes.wait("t", job_id, lambda: states[job_id], lambda s: s == "QUEUED", 20)

    threads = [threading.Thread(target=wait, args=(j,)) for j in states]
    for t in threads:
        t.start()
    wait_for("both reads to wait", lambda: changes.waiting == 2, 10)
    states["a"] = states["b"] = "ADMITTED"
    changes.changed(["a"])  # b changed too, but nothing said so: its read waits on
    threads[0].join(10)
    assert answers == {"a": "ADMITTED"} and changes.waiting == 1
    changes.changed(["b", "zzz"])
    threads[1].join(10)
    assert answers == {"a": "ADMITTED", "b": "ADMITTED"} and changes.waiting == 0
