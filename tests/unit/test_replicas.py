"""Two replicas of the control plane on one database and one cluster (``Plane.build`` with
``Replicas``), driven turn by turn, on SQLite and PostgreSQL: only the lease holder's loop acts; a
takeover reconciles as a restart does and the job succeeds once; the deposed leader's cycle is
refused by the fence, changes nothing and leaves it standing by."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from cli_inproc import tpufleet
from prometheus_client import generate_latest
from sqlalchemy import create_engine, select, text
from typer.testing import CliRunner

from tpufleet.api.server import ControlPlane
from tpufleet.api.serving import lock_database
from tpufleet.cli import app, main
from tpufleet.control.cluster.memory import MemoryCluster
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.plane import Plane, PlaneOptions, Replicas
from tpufleet.control.store.facade import Store
from tpufleet.control.store.lease import LEASE_S, Lease
from tpufleet.control.store.tables import AttemptRow
from tpufleet.control.store.values import JobRequest

CONFIG = ServiceConfig(stop_threads=0, log_budget_s=60)


def replica(db_url: str, cluster: MemoryCluster, state_dir: Path, name: str) -> Plane:
    options = PlaneOptions(state_dir=state_dir, db_url=db_url, config=CONFIG, replicas=Replicas(replica=name))
    return Plane.build(cluster, options)


def expire(plane: Plane) -> None:
    """What the lease length does to a leader that stopped renewing (without waiting for it)."""
    with plane.store.tx() as s:
        s.execute(text("UPDATE leader_lease SET expires_at = 0"))


def test_only_the_leader_acts_and_a_takeover_finishes_the_job_once(db_url: str, tmp_path: Path) -> None:
    cluster = MemoryCluster.of("v4-16")
    a = replica(db_url, cluster, tmp_path / "a", "host:1:a")
    b = replica(db_url, cluster, tmp_path / "b", "host:2:b")
    try:
        assert a.leadership and b.leadership
        a.leadership.step()
        b.leadership.step()
        assert (a.leadership.term, b.leadership.term) == (1, None)
        a.store.tenants.create("t", {"v4": 8})
        job = a.store.jobs.submit(
            "t", JobRequest.build(command=["python", "t.py"], accelerator_type="v4-16")
        ).id
        assert not b.service.turn() and b.store.jobs.get(job).state == "QUEUED"  # a standby acts on nothing
        assert a.service.turn() and a.store.jobs.get(job).state == "STARTING"
        cluster.start(job)
        assert a.service.turn() and a.store.jobs.get(job).state == "RUNNING"
        assert a.service.leads and not b.service.leads

        expire(a)  # a paused past its lease; b takes over
        b.leadership.step()
        assert b.leadership.term == 2
        assert b.service.turn()  # reconcile: the running attempt is adopted, not relaunched
        assert b.store.jobs.get(job).state == "RUNNING" and len(cluster.launches) == 1

        cluster.exit(job, 0)
        assert not a.service.turn()  # a woke up: its cycle is refused by the fence...
        assert a.store.jobs.get(job).state == "RUNNING"  # ...and changed nothing
        assert a.leadership.refused >= 1 and not a.service.leads and a.leadership.term is None
        assert not a.service.turn()  # it stands by from now on

        b.service.turn()
        b.service.turn()
        assert b.store.jobs.get(job).state == "SUCCEEDED"
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
    cluster = MemoryCluster.of("v4-16")
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


# -- serve: SQLite takes one replica; a newer schema is refused ----------------------------------
def serve(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--sandbox", "v4-16", "--port", "0", *args])
    return int(exit_.value.code or 0), capsys.readouterr().err.strip()


def test_a_second_serve_on_one_sqlite_file_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    first = lock_database(url)  # what the first serve on that file holds while it runs
    assert first is not None
    first.note("http://127.0.0.1:8600")
    code, err = serve(capsys, "--db", url, "--state-dir", str(tmp_path / "other"))
    assert code == 2 and "\n" not in err and "Traceback" not in err
    assert err.startswith(
        f"error: another tpufleet serve (PID {os.getpid()}, http://127.0.0.1:8600) already uses"
    )
    assert "SQLite takes one serve" in err and "--db postgresql+psycopg://" in err
    assert not (tmp_path / "fleet.db").exists()  # refused before the database was touched
    first.release()


def test_lease_seconds_go_with_postgresql(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = serve(capsys, "--lease-seconds", "3", "--state-dir", str(tmp_path))
    assert code == 2 and err == (
        "error: --lease-seconds goes with a PostgreSQL --db (replicas); SQLite serves one replica only"
    )
    assert LEASE_S == 5.0 and "default: 5.0" in CliRunner().invoke(app, ["serve", "--help"]).stdout


def test_serve_refuses_a_database_a_newer_tpufleet_wrote_in_one_line(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Store.open(db_url).close()
    with create_engine(db_url).begin() as conn:  # what an upgraded replica left behind
        conn.execute(text("UPDATE alembic_version SET version_num = '0999'"))
    code, err = serve(capsys, "--db", db_url, "--state-dir", str(tmp_path / "s"))
    assert code == 2 and "\n" not in err and "Traceback" not in err
    assert "schema revision 0999, which this tpufleet does not know" in err
    with create_engine(db_url).connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0999"


def test_the_leader_gauge_is_each_replicas_own(db_url: str, tmp_path: Path) -> None:
    def gauge(cp: ControlPlane) -> str:
        text = generate_latest(cp.metrics).decode()
        return next(line for line in text.splitlines() if line.startswith("tpufleet_leader{"))

    alone = ControlPlane(MemoryCluster.of("v4-16"), state_dir=tmp_path / "alone")
    shared = ControlPlane(
        MemoryCluster.of("v4-16"), state_dir=tmp_path / "r", db_url=db_url, replicas=Replicas(replica="h:1:r")
    )
    try:
        assert gauge(alone) == f'tpufleet_leader{{replica="{alone.replica}"}} 1.0'  # one process leads
        assert gauge(shared) == 'tpufleet_leader{replica="h:1:r"} 0.0'  # not leading before its term
        assert shared.status()["leader"] is False and shared.status()["leader_replica"] is None
        assert shared.leadership is not None
        shared.leadership.step()
        shared.service.turn()
        assert gauge(shared) == 'tpufleet_leader{replica="h:1:r"} 1.0'
        status = shared.status()
        assert (status["leader"], status["leader_replica"], status["replica"]) == (True, "h:1:r", "h:1:r")
        assert status["leader_since"] is not None
    finally:
        alone.close()
        shared.close()


def test_a_standby_serves_the_api_and_says_who_leads(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store.open(db_url)
    other = Lease(store, "h:9:other", lease_s=600)  # live for the whole test, however slow
    assert other.acquire()  # another replica leads
    cp = ControlPlane(
        MemoryCluster.of("v4-16"), state_dir=tmp_path / "r", db_url=db_url, replicas=Replicas(replica="h:1:r")
    )
    try:
        url = cp.start_http()
        health = httpx.get(f"{url}/healthz").json()
        assert (health["status"], health["leader"], health["leader_replica"]) == ("ok", False, "h:9:other")
        code, out, _ = tpufleet(capsys, "status", "--server", url, "--token", cp.admin_token)
        assert code == 0 and "standby; h:9:other leads" in out and "standing by" in out
        code, out, _ = tpufleet(
            capsys, "tenant", "create", "t", "--quota", "v4=8", "--server", url, "--token", cp.admin_token
        )
        assert code == 0 and cp.store.tenants.get("t") is not None  # the standby's API writes
    finally:
        cp.close()
        other.release()
        store.close()


def test_a_leader_deposed_while_launching_launches_nothing_more(db_url: str, tmp_path: Path) -> None:
    """A launch is no write: the fence is checked before it, so a leader deposed while it launched
    one job (its own turn already read the jobs) does not launch the next one."""
    cluster = MemoryCluster.of("v4-16:2")
    a = replica(db_url, cluster, tmp_path / "a", "host:1:a")
    b = replica(db_url, cluster, tmp_path / "b", "host:2:b")
    try:
        assert a.leadership and b.leadership
        a.leadership.step()
        a.store.tenants.create("t", {"v4": 16})
        first, second = (
            a.store.jobs.submit(
                "t", JobRequest.build(command=["python", "t.py"], accelerator_type="v4-16")
            ).id
            for _ in range(2)
        )

        def taken_over() -> None:  # a pauses in the middle of its first launch; b takes over
            cluster.fault("launch", None, first)
            expire(a)
            b.leadership.step()

        cluster.fault("launch", taken_over, first)
        assert not a.service.turn()
        assert [s.job_id for s in cluster.launches] == [first]  # under way when it was deposed
        assert a.store.jobs.get(second).state == "ADMITTED" and not a.service.leads
        assert b.leadership.term == 2 and b.service.turn()  # b adopts the first, launches the second
        assert [s.job_id for s in cluster.launches] == [first, second]
    finally:
        a.store.close()
        b.store.close()
