"""Revision 0004 (operating tenants) on SQLite and PostgreSQL: a database at 0003 with tenants,
tokens, a job and events upgrades to head, and every row stays usable (tokens keep working and get
ids and scopes; tenants are live with the default preemption setting); 0004 also downgrades."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Engine, inspect, text

from tpufleet.control.store import migrations
from tpufleet.control.store.database import make_engine
from tpufleet.control.store.facade import Store
from tpufleet.control.store.tokens import token_hash

NOW = 1_700_000_000.0
ROWS = [
    "INSERT INTO tenants (name, quota, weight, created_at) VALUES ('team-a', '{\"v4\": 16}', 1.0, :now)",
    "INSERT INTO tokens (token_hash, tenant, created_at) VALUES (:tenant_hash, 'team-a', :now)",
    "INSERT INTO tokens (token_hash, tenant, created_at) VALUES (:admin_hash, NULL, :now)",
    "INSERT INTO jobs (id, tenant, name, command, accelerator_type, num_slices, priority, max_retries, env, "
    "state, attempt, failures, slices, borrowing, preempting, head_of_line, cancel_requested, submitted_at, "
    "updated_at) VALUES ('0000abcd', 'team-a', 'train', '[\"python\"]', 'v4-16', 1, 0, 2, '{}', 'QUEUED', 1, "
    "0, '[]', false, false, false, false, :now, :now)",
    "INSERT INTO events (job_id, at, kind, message) "
    "VALUES ('0000abcd', :now, 'submit', 'submitted by team-a')",
]


@pytest.fixture
def engine(empty_db_url: str) -> Iterator[Engine]:
    e = make_engine(empty_db_url)
    yield e
    e.dispose()


def at_0003_with_rows(engine: Engine, empty_db_url: str) -> dict[str, str]:
    migrations.upgrade(engine, empty_db_url, to="0003")
    made = {"tenant": "tf_tenant-before-0004", "admin": "tf_admin-before-0004"}
    params = {"now": NOW, "tenant_hash": token_hash(made["tenant"]), "admin_hash": token_hash(made["admin"])}
    with engine.begin() as conn:
        for statement in ROWS:
            conn.execute(text(statement), params)
    return made


def test_a_database_at_0003_upgrades_and_its_rows_keep_working(engine: Engine, empty_db_url: str) -> None:
    made = at_0003_with_rows(engine, empty_db_url)
    store = Store(empty_db_url)
    try:
        done = store.upgrade()
        assert (done.before, done.after) == ("0003", migrations.head())
        tenant = store.tokens.authenticate(made["tenant"])
        assert (tenant.tenant, tenant.scope, tenant.token_id) == (
            "team-a",
            "jobs",
            token_hash(made["tenant"])[:12],
        )
        admin = store.tokens.authenticate(made["admin"])
        assert admin.admin and admin.scope == "admin"
        assert [(t.name, t.preemption, t.state) for t in store.tenants.all()] == [
            ("team-a", "lower_priority", "active")
        ]
        assert sorted(t.scope for t in store.tokens.all()) == ["admin", "jobs"]
        assert store.audit_events()[0] == []  # old events carry no actor: they are not audit events
        assert [e["kind"] for e in store.events("0000abcd")] == ["submit"]
        # the new columns work on the upgraded rows
        store.tenants.update("team-a", preemption="never")
        store.tokens.revoke(tenant.token_id or "")
        assert store.tenants.get("team-a").preemption == "never" and store.tokens.all("team-a") == []
        _, cancelled = store.tenants.delete("team-a", force=True)
        assert cancelled == 1 and store.tenants.get("team-a").state == "deleted"
    finally:
        store.close()


def test_0004_downgrades_to_0003(engine: Engine, empty_db_url: str) -> None:
    at_0003_with_rows(engine, empty_db_url)
    migrations.upgrade(engine, empty_db_url, to="0004")
    script = migrations.script_directory()
    with engine.begin() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"fn": lambda rev, _ctx: script._downgrade_revs("0003", rev)}
        )
        with Operations.context(ctx):
            ctx.run_migrations()
    with engine.connect() as conn:
        assert migrations.current(conn) == "0003"
        columns = {
            t: {c["name"] for c in inspect(conn).get_columns(t)} for t in ("tenants", "tokens", "events")
        }
        assert columns["tenants"] == {"name", "quota", "weight", "created_at"}
        assert columns["tokens"] == {"token_hash", "tenant", "created_at"}
        assert "actor" not in columns["events"] and "tenant" not in columns["events"]
        assert conn.execute(text("SELECT count(*) FROM tokens")).scalar() == 2
