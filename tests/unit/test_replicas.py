"""Two replicas of the control plane on one database and one cluster (``Plane.build`` with
``Replicas``), driven turn by turn, on SQLite and PostgreSQL: only the lease holder's loop acts; a
takeover reconciles as a restart does and the job succeeds once; the deposed leader's cycle is
refused by the fence, changes nothing and leaves it standing by."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select, text

from tpufleet.control.cluster.fake import FakeCluster
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.plane import Plane, PlaneOptions, Replicas
from tpufleet.control.store.tables import AttemptRow
from tpufleet.control.store.values import JobRequest

CONFIG = ServiceConfig(stop_threads=0, log_budget_s=60)


def replica(db_url: str, cluster: FakeCluster, state_dir: Path, name: str) -> Plane:
    options = PlaneOptions(state_dir=state_dir, db_url=db_url, config=CONFIG, replicas=Replicas(replica=name))
    return Plane.build(cluster, options)


def expire(plane: Plane) -> None:
    """What the lease length does to a leader that stopped renewing (without waiting for it)."""
    with plane.store.tx() as s:
        s.execute(text("UPDATE leader_lease SET expires_at = 0"))


def test_only_the_leader_acts_and_a_takeover_finishes_the_job_once(db_url: str, tmp_path: Path) -> None:
    cluster = FakeCluster.of("v4-16")
    a = replica(db_url, cluster, tmp_path / "a", "host:1:a")
    b = replica(db_url, cluster, tmp_path / "b", "host:2:b")
    try:
        assert a.leadership and b.leadership
        a.leadership.step()
        b.leadership.step()
        assert (a.leadership.term, b.leadership.term) == (1, None)
        a.store.create_tenant("t", {"v4": 8})
        job = a.store.submit("t", JobRequest.build(command=["python", "t.py"], accelerator_type="v4-16")).id
        assert not b.service.turn() and b.store.job(job).state == "QUEUED"  # a standby acts on nothing
        assert a.service.turn() and a.store.job(job).state == "STARTING"
        cluster.start(job)
        assert a.service.turn() and a.store.job(job).state == "RUNNING"
        assert a.service.leads and not b.service.leads

        expire(a)  # a paused past its lease; b takes over
        b.leadership.step()
        assert b.leadership.term == 2
        assert b.service.turn()  # reconcile: the running attempt is adopted, not relaunched
        assert b.store.job(job).state == "RUNNING" and len(cluster.launches) == 1

        cluster.exit(job, 0)
        assert not a.service.turn()  # a woke up: its cycle is refused by the fence...
        assert a.store.job(job).state == "RUNNING"  # ...and changed nothing
        assert a.leadership.refused >= 1 and not a.service.leads and a.leadership.term is None
        assert not a.service.turn()  # it stands by from now on

        b.service.turn()
        b.service.turn()
        assert b.store.job(job).state == "SUCCEEDED"
        with b.store.tx() as s:
            assert [x.state for x in s.scalars(select(AttemptRow))] == ["SUCCEEDED"]  # run once
        said = [e.message for e in a.store.audit_events()[0] if e.kind == "leader"]
        assert said == [
            "replica host:1:a leads (fencing token 1)",
            "replica host:2:b leads (fencing token 2)",
            f"replica host:1:a stopped leading (fencing token 1); writes refused: {a.leadership.refused}",
        ]
    finally:
        a.store.close()
        b.store.close()


def test_a_released_lease_is_taken_at_the_standbys_next_step(db_url: str, tmp_path: Path) -> None:
    cluster = FakeCluster.of("v4-16")
    a = replica(db_url, cluster, tmp_path / "a", "host:1:a")
    b = replica(db_url, cluster, tmp_path / "b", "host:2:b")
    try:
        assert a.leadership and b.leadership
        a.leadership.start()  # takes the lease at once, then renews on its thread
        b.leadership.step()
        assert a.leadership.term == 1 and b.leadership.term is None
        a.leadership.stop()  # SIGTERM: the lease is handed over, not left to expire
        b.leadership.step()
        assert b.leadership.term == 2 and b.service.turn() and b.service.leads
    finally:
        a.store.close()
        b.store.close()
