"""One job's faults stay with that job; the loop says when it is stuck; logs are whole or say why not.

Each test breaks one attempt the way a hostile or broken job (or cluster) does and checks that the
attempt ends with the reason on the job, its slices come free, and another tenant's job in the
same cycles runs as if nothing happened. MemoryCluster's ``fault`` makes an operation raise or hang.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from requeues import Ends
from sqlalchemy import text
from test_service import CONFIG, World, run_to_running

from tpufleet.control.loop.service import Service, ServiceConfig
from tpufleet.control.store.facade import Store


@pytest.fixture
def world(store: Store, tmp_path: Path) -> World:
    return World(store, tmp_path / "state")


def two_tenants(world: World) -> tuple[str, str]:
    """A job of a bad tenant on tpu-v4-16-0 and a job of a good one on tpu-v4-16-1."""
    bad = world.submit(world.tenant("bad", v4=8))
    good = world.submit(world.tenant("good", v4=8))
    return bad, good


@pytest.mark.parametrize(
    "error", [ValueError("embedded null byte"), RuntimeError("boom"), KeyError("x")], ids=str
)
def test_a_launch_that_raises_anything_ends_only_that_attempt(world: World, error: Exception) -> None:
    bad, good = two_tenants(world)
    world.cluster.fault("launch", error, job_id=bad)
    world.cycle()  # both admitted; the bad launch fails, the good one is launched
    job = world.job(bad)
    assert (job.state, job.attempt, job.reason_code) == ("QUEUED", 2, "RETRYING")
    assert f"launch failed: {type(error).__name__}" in (job.reason or "")
    assert world.job(good).state == "STARTING"
    world.cluster.start(good)
    world.cycle()
    assert world.job(good).state == "RUNNING"


def test_a_poll_that_raises_ends_that_attempt_and_the_loop_goes_on(world: World) -> None:
    bad, good = two_tenants(world)
    world.cycle()
    world.cluster.fault("poll", RuntimeError("runner answered garbage"), job_id=bad)
    world.cluster.start(good)
    ends = Ends.on(world.service, world.store)
    world.cycle(2)  # the failure is written, then the attempt is stopped and requeued
    job = ends.at_end(bad)
    assert (job.state, job.attempt) == ("QUEUED", 2)
    assert "runner answered garbage" in (job.reason or "")
    assert world.job(good).state == "RUNNING"
    assert world.slices()["tpu-v4-16-1"] == ("HELD", good)


def test_a_stop_that_keeps_failing_ends_the_attempt_anyway(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=8), max_retries=0)
    run_to_running(world, job_id)
    world.cluster.fault("stop", RuntimeError("runner unreachable"), job_id=job_id)
    world.store.jobs.request_cancel(job_id)
    world.cycle(2)
    assert world.job(job_id).state == "RUNNING"  # tried again...
    world.cycle(2)
    assert world.job(job_id).state == "CANCELLED"  # ...and given up after three tries
    assert world.slices()["tpu-v4-16-0"] == ("FREE", None)


def test_an_attempt_that_never_starts_fails_after_the_start_timeout(world: World, store: Store) -> None:
    world.service = Service(store, world.cluster, state_dir=world.state_dir,
                            config=replace(CONFIG, start_timeout_s=60))  # fmt: skip
    job_id = world.submit(world.tenant("a", v4=8), max_retries=0)
    world.cycle()
    assert world.job(job_id).state == "STARTING"  # its hosts never report RUNNING
    store.clock.advance(59)  # type: ignore[attr-defined]
    world.cycle()
    assert world.job(job_id).state == "STARTING"
    store.clock.advance(2)  # type: ignore[attr-defined]
    world.cycle()
    job = world.job(job_id)
    assert job.state == "FAILED" and "did not start on every host within 60 s" in (job.reason or "")
    assert "still starting: tpu-v4-16-0/0, tpu-v4-16-0/1" in (job.reason or "")
    assert world.slices()["tpu-v4-16-0"] == ("FREE", None)


def test_a_lost_host_is_recorded_as_lost_not_running(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=8), max_retries=0)
    run_to_running(world, job_id)
    world.cluster.kill_host("tpu-v4-16-0", 1)
    world.cycle(2)
    attempt = world.job(job_id).attempts[0]
    states = {(h["worker_id"], h["state"]) for h in attempt.exit_codes}
    assert states == {(0, "EXITED"), (1, "LOST")}


def test_an_ended_attempts_log_is_stored_whole(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=8))
    run_to_running(world, job_id)
    world.cluster.log_chunk = 1000
    world.cluster.write(job_id, "x" * 99 + "\n", worker=0)
    for _ in range(500):  # 50,000 characters: fifty reads, more than one cycle's share
        world.cluster.write(job_id, "y" * 99 + "\n", worker=0)
    world.cluster.exit(job_id, 0)
    world.cycle(2)
    assert world.job(job_id).state == "SUCCEEDED"
    host0 = world.store.jobs.read_logs(job_id).hosts[0]
    assert len(host0.data) == 50_100 and host0.complete and not host0.truncated and host0.note is None


def test_past_the_cap_a_log_is_truncated_and_says_so(world: World, store: Store) -> None:
    world.service = Service(store, world.cluster, state_dir=world.state_dir,
                            config=replace(CONFIG, max_log_bytes=1000))  # fmt: skip
    job_id = world.submit(world.tenant("a", v4=8))
    run_to_running(world, job_id)
    world.cluster.write(job_id, "z" * 5000, worker=0)
    world.cluster.exit(job_id, 0)
    world.cycle(2)
    host0 = store.jobs.read_logs(job_id).hosts[0]
    assert host0.data.startswith("z" * 1000) and "output truncated at 1000 characters" in host0.data
    assert host0.truncated and host0.complete and "per-host log cap" in (host0.note or "")


def test_a_host_whose_output_cannot_be_read_is_marked_incomplete(world: World, store: Store) -> None:
    job_id = world.submit(world.tenant("a", v4=8), max_retries=0)
    run_to_running(world, job_id)
    world.cluster.write(job_id, "partial\n")
    from tpufleet.errors import ClusterError

    world.cluster.fault("read_logs", ClusterError("the host is gone"), job_id=job_id)
    world.cluster.exit(job_id, 0)
    world.cycle(2)
    for host in store.jobs.read_logs(job_id).hosts:
        assert host.complete and not host.truncated
        assert "could not be read: the host is gone" in (host.note or "")


def test_one_jobs_output_the_store_refuses_does_not_keep_the_others_from_being_copied(
    world: World, store: Store
) -> None:
    """The running attempts' new output is stored in one transaction for all of them; when the
    store refuses one job's (its streams went away under the read), the others' is still copied
    in the same cycle, each job alone, and only that job's is left out."""
    a, b = (world.submit(world.tenant(name, v4=8)) for name in ("a", "b"))
    world.cycle()
    world.cluster.start(a)
    world.cluster.start(b)
    world.cycle()
    assert (world.job(a).state, world.job(b).state) == ("RUNNING", "RUNNING")
    world.cluster.write(a, "a on {TPU_WORKER_ID}\n")
    world.cluster.write(b, "b on {TPU_WORKER_ID}\n")

    def streams_gone() -> None:  # job a's log streams leave the store while its output is read
        with store.tx() as s:
            s.execute(text("DELETE FROM log_cursors WHERE job_id = :job"), {"job": a})

    world.cluster.fault("read_logs", streams_gone, job_id=a)
    world.cycle()
    world.cluster.fault("read_logs", None, job_id=a)
    assert [h.data for h in store.jobs.read_logs(b).hosts] == ["b on 0\n", "b on 1\n"]
    assert not store.jobs.read_logs(a).hosts
    assert (world.job(a).state, world.job(b).state) == ("RUNNING", "RUNNING")


def test_a_stuck_loop_is_reported_stalled(store: Store, tmp_path: Path) -> None:
    from tpufleet.control.cluster.memory import MemoryCluster

    cluster = MemoryCluster.of("v4-16")
    gate = threading.Event()
    config = ServiceConfig(interval_s=0.01, stall_after_s=0.3, stop_threads=0)
    service = Service(store, cluster, state_dir=tmp_path, config=config)
    service.start()
    try:
        deadline = time.monotonic() + 10
        while service.stats()["cycles"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stats = service.stats()
        assert stats["stalled"] is False and stats["cycle_ms_p50"] is not None
        cluster.fault("inventory", gate.wait)  # the next cycle hangs in a call to the cluster
        time.sleep(0.6)
        assert service.stats()["stalled"] is True
        cluster.fault("inventory", None)
        gate.set()
        deadline = time.monotonic() + 10
        while service.stats()["stalled"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        gate.set()
        service.close()


def test_a_slow_launch_delays_no_other_tenant(store: Store, tmp_path: Path) -> None:
    """A launch that takes long (a large package on its way to the hosts) runs off the loop."""
    from tpufleet.control.cluster.memory import MemoryCluster

    cluster = MemoryCluster.of("v4-16:2")
    world = World(store, tmp_path)
    world.cluster = cluster
    world.service = Service(store, cluster, state_dir=tmp_path, config=replace(CONFIG, stop_threads=2))
    bad, good = two_tenants(world)
    gate = threading.Event()
    cluster.fault("launch", gate.wait, job_id=bad)
    try:
        deadline = time.monotonic() + 10
        while world.job(good).state != "STARTING":
            world.cycle()
            assert time.monotonic() < deadline
        assert world.job(bad).state == "ADMITTED"  # its launch is still under way
        cluster.start(good)
        world.cycle()
        assert world.job(good).state == "RUNNING"
    finally:
        gate.set()
    cluster.fault("launch", None, job_id=bad)
    deadline = time.monotonic() + 10
    while world.job(bad).state == "ADMITTED":
        world.cycle()
        assert time.monotonic() < deadline
    assert world.job(bad).state == "STARTING"
    world.service.close()
