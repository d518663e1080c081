"""The scheduling loop's writes claim SQLite's write lock (``Database.tx(claim=True)``,
``database.claim_write_lock``): they begin holding it, asking for it until it is free instead of
sleeping in SQLite's busy handler, and give up as SQLite would past their wait. A real SQLite file
and a second connection that holds the lock; on PostgreSQL a claim is a plain transaction. What
the claim is for, the loop's writes going in ahead of submits that sleep in the busy handler, is a
matter of milliseconds under load: bench/kueue.py measures it (docs/benchmarks.md)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from tpufleet.control.store.database import BUSY_TIMEOUT_S, Database, claim_write_lock


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    store = Database.open(f"sqlite:///{tmp_path / 'tpufleet.db'}")
    yield store
    store.close()


@pytest.fixture
def holder(db: Database) -> Iterator[sqlite3.Connection]:
    """Another connection to the same file, holding the write lock until the test commits it."""
    conn = sqlite3.connect(db.engine.url.database or "", isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    yield conn
    if conn.in_transaction:
        conn.rollback()
    conn.close()


def events(db: Database) -> list[str]:
    with db.tx() as s:
        return [row[0] for row in s.execute(text("SELECT message FROM events ORDER BY id"))]


def test_a_claiming_write_waits_for_the_lock_and_commits_once_it_is_free(
    db: Database, holder: sqlite3.Connection
) -> None:
    errors: list[BaseException] = []

    def write() -> None:
        try:
            with db.tx(claim=True) as s:
                db.add_event(s, "written by the claim")
        except BaseException as err:
            errors.append(err)

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(0.5)
    assert writer.is_alive(), "the claim did not wait for the lock another connection holds"
    holder.execute("INSERT INTO events (at, kind, message) VALUES (0, 'info', 'written by the holder')")
    holder.commit()
    writer.join(30)
    assert not writer.is_alive() and not errors
    assert events(db) == ["written by the holder", "written by the claim"]


def test_a_claim_gives_up_past_its_wait_with_sqlites_own_error_and_writes_nothing(
    db: Database, holder: sqlite3.Connection
) -> None:
    db.lock_wait_s = 0.3
    release = threading.Timer(5.0, holder.rollback)  # a claim that waited longer than asked gets in
    release.start()
    try:
        locked = pytest.raises(OperationalError, match="database is locked")
        with locked, db.tx(claim=True) as s:
            db.add_event(s, "never written")
        with locked, db.tx_unsynced(claim=True) as conn:
            conn.execute(text("INSERT INTO events (at, kind, message) VALUES (0, 'info', 'nor this')"))
    finally:
        release.cancel()
    if holder.in_transaction:
        holder.rollback()
    assert events(db) == []


def test_a_claim_leaves_the_connections_busy_timeout_as_it_found_it(
    db: Database, holder: sqlite3.Connection
) -> None:
    with db.engine.connect() as conn:
        with pytest.raises(OperationalError):
            claim_write_lock(conn, wait_s=0.05)  # refused: the holder has it
        conn.rollback()
        holder.rollback()
        claim_write_lock(conn, wait_s=5)  # granted
        conn.rollback()
        timeout_ms = conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one()
    assert timeout_ms == int(BUSY_TIMEOUT_S * 1000)  # every other write still waits as long as before


def test_a_claim_on_postgresql_or_inside_a_begun_transaction_is_a_plain_transaction(db_url: str) -> None:
    store = Database.open(db_url)
    try:
        with store.tx(claim=True) as s:
            store.add_event(s, "one")
            claim_write_lock(s.connection())  # already holds it (SQLite) or needs none (PostgreSQL)
            store.add_event(s, "two")
        assert events(store)[-2:] == ["one", "two"]
    finally:
        store.close()
