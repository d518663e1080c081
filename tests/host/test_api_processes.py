"""``serve --api-processes N`` (issue 30): the API in processes of its own, the loop alone in
serve's. Through a real serve: jobs submitted to the API processes run (the loop is woken and
fed back), ``/healthz``, ``/api/v1/status`` and ``/metrics`` carry the loop's own figures, a
dead API process is replaced, and none outlives serve however serve ends. The feed itself
(``api/processes.py``) over a real pipe."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import planes
import psutil
import pytest
from guards import HANG_GUARD_S

from tpufleet.api.processes import Feed, read_frames
from tpufleet.api.watch import JobChanges


def _children(pid: int) -> list[int]:
    """The API processes of the serve ``pid``: its children running ``tpufleet.api.processes``."""
    try:
        kids = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []
    found = []
    for kid in kids:
        try:
            if "tpufleet.api.processes" in " ".join(kid.cmdline()):
                found.append(kid.pid)
        except psutil.Error:  # ended meanwhile (a zombie until serve reaps it)
            continue
    return sorted(found)


def _wait(what: str, probe: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := probe()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return got


def _two(serve: Any) -> list[int]:
    """The two API processes of ``serve``, once both are up."""
    return _wait("two API processes", lambda: len(kids := _children(serve.proc.pid)) == 2 and kids)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _serve(tmp_path: Path, *flags: str) -> Any:
    # a start may take long beside the other test sessions' Ray clusters (66 s once in make test)
    args = ("--sandbox", "v5litepod-1:4", "--job-seconds", "0.2", "--api-processes", "2", *flags)
    sp = planes.ServeProcess(tmp_path, *args, timeout_s=180)
    try:
        yield sp
    finally:
        if sp.proc.poll() is None:
            sp.stop()
        for pid in _children(sp.proc.pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    yield from _serve(tmp_path)


@pytest.fixture
def serve_on(tmp_path: Path, db_url: str) -> Iterator[Any]:
    """serve with its API processes on a SQLite file or a PostgreSQL database given with --db."""
    yield from _serve(tmp_path, "--db", db_url)


def _admin(tmp_path: Path) -> dict[str, str]:
    token = (tmp_path / "home" / "sandbox" / "admin-token").read_text().strip()
    return {"Authorization": f"Bearer {token}"}


def test_jobs_submitted_to_the_api_processes_run_and_the_loops_figures_reach_them(
    serve_on: Any, tmp_path: Path
) -> None:
    serve = serve_on
    kids = _two(serve)
    assert serve.proc.pid not in kids
    with httpx.Client(base_url=serve.url, headers=_admin(tmp_path), timeout=30) as http:
        http.post("/api/v1/tenants", json={"name": "team-a", "quota": {"v5e": 4}}).raise_for_status()
        ids = []
        for i in range(6):
            body = {"command": ["true"], "name": f"j{i}", "tenant": "team-a"}
            body["accelerator_type"] = "v5litepod-1"
            ids.append(http.post("/api/v1/jobs", json=body).raise_for_status().json()["id"])
        states = {}
        for job_id in ids:
            params = {"while_state": ["QUEUED", "ADMITTED", "STARTING", "RUNNING"], "wait_s": 20}
            states[job_id] = http.get(f"/api/v1/jobs/{job_id}", params=params).json()["state"]
        assert set(states.values()) == {"SUCCEEDED"}, states
        status = http.get("/api/v1/status").json()
        assert status["cycles"] > 0 and status["leader"] is True and status["stalled"] is False
        assert status["replica"].split(":")[1] == str(serve.proc.pid)  # the loop's process answers
        metrics = http.get("/metrics").text
    health = httpx.get(f"{serve.url}/healthz", timeout=5).json()
    assert health["status"] == "ok" and health["cycles"] > 0
    count = [ln for ln in metrics.splitlines() if ln.startswith("tpufleet_scheduling_cycle_seconds_count")]
    assert count and float(count[0].split()[-1]) > 0, metrics[:2000]
    assert f'tpufleet_leader{{replica="{status["replica"]}"}} 1.0' in metrics
    assert "tpufleet_jobs" in metrics  # the store's own metrics, as one process serves them


def test_a_dead_api_process_is_replaced_and_sigterm_stops_them_all(serve: Any, tmp_path: Path) -> None:
    first = _two(serve)
    os.kill(first[0], signal.SIGKILL)
    again = _wait(
        "a new API process",
        lambda: len(kids := _children(serve.proc.pid)) == 2 and first[0] not in kids and kids,
    )
    assert first[1] in again
    assert httpx.get(f"{serve.url}/api/v1/slices", headers=_admin(tmp_path), timeout=10).status_code == 200
    assert "ended (exit -9): starting another" in serve.output()
    out = serve.stop()
    assert serve.proc.returncode == 0, out
    assert all(_gone(pid) for pid in again)  # the replacement too
    assert "Traceback" not in out


def test_no_api_process_outlives_a_killed_serve(serve: Any) -> None:
    kids = _two(serve)
    serve.proc.kill()
    serve.proc.wait(10)
    _wait("the API processes to end", lambda: all(_gone(pid) for pid in kids), timeout_s=15)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{serve.url}/healthz", timeout=2)


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Any]:
    """serve whose tenants may have 3 queued jobs each."""
    yield from _serve(tmp_path, "--max-queued-per-tenant", "3")


def test_a_cap_holds_for_submits_racing_through_both_api_processes(capped: Any, tmp_path: Path) -> None:
    """The API processes serve with serve's own limits (pickled to them), and the cap on queued jobs
    is counted in the database's transaction, not in one process's memory: twelve submits at once,
    each on a connection of its own (taken by whichever process accepts it first), leave exactly
    three queued."""
    _two(capped)
    headers = _admin(tmp_path)
    tenant = {"name": "team-a", "quota": {"v4": 16}}
    httpx.post(f"{capped.url}/api/v1/tenants", headers=headers, json=tenant, timeout=30).raise_for_status()
    # no v4 slice in this fleet: the jobs stay queued
    body = {"command": ["true"], "tenant": "team-a", "accelerator_type": "v4-16"}
    answers: list[httpx.Response] = []
    go = threading.Barrier(12)

    def submit(i: int) -> None:
        with httpx.Client(base_url=capped.url, headers=headers, timeout=60) as http:
            go.wait(30)
            answers.append(http.post("/api/v1/jobs", json={**body, "name": f"j{i}"}))

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    codes = sorted(a.status_code for a in answers)
    assert codes == [201] * 3 + [409] * 9, [(a.status_code, a.text[:200]) for a in answers]
    refused = [a.json()["error"] for a in answers if a.status_code == 409]
    assert all("the cap (serve --max-queued-per-tenant 3)" in e for e in refused), refused
    listed = httpx.get(
        f"{capped.url}/api/v1/jobs", headers=headers, params={"tenant": "team-a"}, timeout=30
    ).json()["items"]
    assert sorted(j["state"] for j in listed) == ["QUEUED"] * 3


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:?timeout=5"])
def test_an_in_memory_database_is_refused_in_one_line(tmp_path: Path, url: str) -> None:
    cmd = [sys.executable, "-m", "tpufleet", "serve", "--sandbox", "v4-16", "--db", url]
    env = os.environ | {"TPUFLEET_STATE_DIR": str(tmp_path), "TPUFLEET_CONFIG": str(tmp_path / "c.yaml")}
    out = subprocess.run(
        [*cmd, "--api-processes", "2"], env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: --api-processes needs a database the API processes can open too: a SQLite file "
        "(the default) or PostgreSQL, not an in-memory SQLite --db"
    ]


# -- the feed ----------------------------------------------------------------------------------
def _write(fd: int, *messages: object) -> None:
    for m in messages:
        data = pickle.dumps(m)
        os.write(fd, len(data).to_bytes(4, "big") + data)


def test_the_feed_keeps_the_loops_status_wakes_waiting_reads_and_ends_with_its_pipe() -> None:
    changes = JobChanges(recheck_s=60)  # no look at the job of its own while the test runs
    feed = Feed(changes)
    r, w = os.pipe()
    ended = threading.Event()
    threading.Thread(target=feed.follow, args=(r, ended.set), daemon=True).start()
    job = {"state": "QUEUED"}
    answers: list[str] = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            changes.wait("team-a", "job-1", lambda: job["state"], lambda s: s == "QUEUED", 30)
        )
    )
    waiter.start()
    _wait("the read to wait", lambda: changes.waiting == 1, timeout_s=5)
    job["state"] = "RUNNING"  # written by the loop; the feed then says which jobs it moved
    _write(w, ("status", {"cycles": 7}), ("changed", ["job-2", "job-1"]), ("slow", ({"s": 0.5}, [])))
    waiter.join(10)  # woken by the feed, long before its 30 s
    assert not waiter.is_alive() and answers == ["RUNNING"]
    _wait("the status", lambda: feed.status() == {"cycles": 7}, timeout_s=5)
    # the frames are read in order on the feed's thread: the slow one may still be on its way
    _wait("the duty cycles", lambda: feed.duty_cycles() == {"s": 0.5}, timeout_s=5)
    assert not ended.is_set()
    os.close(w)
    assert ended.wait(5)  # the parent gone: the child stops
    os.close(r)


def test_frames_are_read_whole_across_short_reads() -> None:
    r, w = os.pipe()
    big = {"x": "y" * 200_000}  # larger than a pipe's buffer: written while being read
    writer = threading.Thread(target=_write, args=(w, ("status", big), ("changed", ["a"])))
    writer.start()
    got = []
    for i, message in enumerate(read_frames(r)):
        got.append(message)
        if i == 1:
            break
    writer.join(5)
    os.close(w)
    assert got == [("status", big), ("changed", ["a"])]
    assert list(read_frames(r)) == []
    os.close(r)
