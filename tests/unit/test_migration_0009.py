"""Revision 0009 (a job's stored size) on SQLite and PostgreSQL: the jobs of a database at 0008
get their ``body_bytes`` from the stored JSON (an upper bound of what the request counted), so
the queued-bytes cap counts them from the first submit after the upgrade."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, inspect, select, text

from tpufleet.control.store import migrations
from tpufleet.control.store.database import make_engine
from tpufleet.control.store.facade import Store
from tpufleet.control.store.tables import JobRow
from tpufleet.control.store.values import JobRequest, Limits
from tpufleet.errors import ConflictError

NOW = 1_700_000_000.0
ENV = "y" * 3000
ROWS = [
    "INSERT INTO tenants (name, quota, weight, created_at, preemption) "
    "VALUES ('team-a', '{\"v4\": 16}', 1.0, :now, 'lower_priority')",
    "INSERT INTO jobs (id, tenant, name, command, accelerator_type, num_slices, priority, max_retries, env, "
    "kind, state, attempt, failures, slices, borrowing, preempting, head_of_line, cancel_requested, "
    "submitted_at, updated_at) VALUES ('0000abcd', 'team-a', 'train', '[\"python\", \"t.py\"]', 'v4-16', "
    "1, 0, 2, :env, 'spmd', 'QUEUED', 1, 0, '[]', false, false, false, false, :now, :now)",
]


@pytest.fixture
def engine(empty_db_url: str) -> Iterator[Engine]:
    e = make_engine(empty_db_url)
    yield e
    e.dispose()


def test_jobs_of_a_database_at_0008_get_their_size_and_count_against_the_cap(
    engine: Engine, empty_db_url: str
) -> None:
    migrations.upgrade(engine, empty_db_url, to="0008")
    with engine.begin() as conn:
        for statement in ROWS:
            conn.execute(text(statement), {"now": NOW, "env": '{"A": "' + ENV + '"}'})
    store = Store(empty_db_url, limits=Limits(max_queued_bytes_per_tenant=4000))
    try:
        assert store.upgrade().after == migrations.head()
        with store.tx() as s:
            stored = s.scalar(select(JobRow.body_bytes).where(JobRow.id == "0000abcd"))
        whole = len("python") + len("t.py") + len("A") + len(ENV) + len("train")
        assert stored is not None and whole <= stored < whole + 40
        with pytest.raises(ConflictError, match="max-queued-mib-per-tenant"):
            store.jobs.submit(
                "team-a", JobRequest.build(command=["python", "x" * 1000], accelerator_type="v4-16")
            )
        store.jobs.submit("team-a", JobRequest.build(command=["python", "t.py"], accelerator_type="v4-16"))
    finally:
        store.close()
    indexes = {i["name"] for i in inspect(engine).get_indexes("jobs")}
    assert "ix_jobs_tenant_state_bytes" in indexes
