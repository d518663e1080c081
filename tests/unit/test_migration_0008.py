"""Revision 0008 (checkpoint files) on SQLite and PostgreSQL: a database at 0007 with a finished job
upgrades to head; the job's files count as kept (a retention candidate), tenants have no measurement
until a run reports, and both new parts are written and read through the store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from tpufleet.control.store import filerecords, migrations
from tpufleet.control.store.database import make_engine
from tpufleet.control.store.facade import Store
from tpufleet.host.jobfiles import DiskUsage

NOW = 1_700_000_000.0
ROWS = [
    "INSERT INTO tenants (name, quota, weight, created_at, preemption) "
    "VALUES ('team-a', '{\"v4\": 16}', 1.0, :now, 'lower_priority')",
    "INSERT INTO jobs (id, tenant, name, command, accelerator_type, num_slices, priority, max_retries, env, "
    "kind, state, attempt, failures, slices, borrowing, preempting, head_of_line, cancel_requested, "
    "submitted_at, finished_at, updated_at) VALUES ('0000abcd', 'team-a', 'train', '[\"python\"]', 'v4-16', "
    "1, 0, 2, '{}', 'spmd', 'SUCCEEDED', 1, 0, '[]', false, false, false, false, :now, :now, :now)",
]


@pytest.fixture
def engine(empty_db_url: str) -> Iterator[Engine]:
    e = make_engine(empty_db_url)
    yield e
    e.dispose()


def test_a_database_at_0007_upgrades_and_its_finished_jobs_files_are_kept(
    engine: Engine, empty_db_url: str
) -> None:
    migrations.upgrade(engine, empty_db_url, to="0007")
    with engine.begin() as conn:
        for statement in ROWS:
            conn.execute(text(statement), {"now": NOW})
    store = Store(empty_db_url, clock=lambda: NOW + 10 * 86400)
    try:
        done = store.upgrade()
        assert (done.before, done.after) == ("0007", migrations.head())
        assert store.tenants.get("team-a").checkpoints.used_bytes is None
        assert filerecords.expired_jobs(store, 7 * 86400) == {"team-a": ["0000abcd"]}
        filerecords.files_removed(store, "team-a", {"0000abcd": 5 << 30}, DiskUsage(3 << 30, 9, True, NOW))
        assert filerecords.expired_jobs(store, 7 * 86400) == {}
        usage = store.tenants.get("team-a").checkpoints
        assert (usage.used_bytes, usage.measured_at) == (3 << 30, NOW)  # past 2**31: a big integer
        assert [e["kind"] for e in store.events("0000abcd")] == ["files"]
    finally:
        store.close()
