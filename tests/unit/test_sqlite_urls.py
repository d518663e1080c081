"""One reading of SQLite URLs (``values.sqlite_target``, ``sqlite_in_memory``, ``sqlite_file``) for
every place that asks: the engine (one shared connection for an in-memory database, a private file
otherwise), the database's serve lock, and serve's refusal of an in-memory database for its API
processes. Before, each read the URL its own way, so a query string (``?timeout=5``) made the same
in-memory database a file to one of them and memory to another."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest
from sqlalchemy import text

from tpufleet.api.serving import lock_database
from tpufleet.control.store.database import make_engine
from tpufleet.control.store.values import sqlite_file, sqlite_in_memory, sqlite_target


@pytest.mark.parametrize(
    ("url", "target", "memory", "file"),
    [
        ("sqlite://", "", True, None),
        ("sqlite:///:memory:", ":memory:", True, None),
        ("sqlite:///:memory:?timeout=5", ":memory:", True, None),
        ("sqlite:///fleet.db", "fleet.db", False, "fleet.db"),
        ("sqlite:///fleet.db?timeout=5", "fleet.db", False, "fleet.db"),
        ("sqlite:////srv/fleet.db", "/srv/fleet.db", False, "/srv/fleet.db"),
        ("sqlite:///file:fleet.db?mode=ro&uri=true", "file:fleet.db", False, None),
        ("postgresql+psycopg://u@127.0.0.1/fleet", "u@127.0.0.1/fleet", False, None),
    ],
)
def test_one_reading_of_a_sqlite_url(url: str, target: str, memory: bool, file: str | None) -> None:
    assert sqlite_target(url) == target
    assert sqlite_in_memory(url) is memory
    assert sqlite_file(url) == file


def test_an_in_memory_database_with_a_query_is_one_database_for_every_connection() -> None:
    engine = make_engine("sqlite:///:memory:?timeout=5")  # was a new, empty database per thread
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
            conn.execute(text("INSERT INTO t VALUES (7)"))
        seen: list[int] = []

        def read() -> None:  # another thread, as the API's and the loop's are
            with engine.connect() as conn:
                seen.append(conn.execute(text("SELECT x FROM t")).scalar_one())

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(10)
        assert seen == [7]
    finally:
        engine.dispose()


def test_a_database_file_is_made_private_and_locked_and_memory_is_neither(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    engine = make_engine(f"sqlite:///{path}?timeout=5")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    finally:
        engine.dispose()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lock = lock_database(f"sqlite:///{path}?timeout=5")
    assert lock is not None and (tmp_path / "fleet.db.serve.lock").exists()
    lock.release()
    assert lock_database("sqlite:///:memory:?timeout=5") is None
    assert lock_database("sqlite://") is None
