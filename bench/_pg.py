"""A throwaway PostgreSQL server for the benchmarks, started the way the tests start one
(tests/support/dbserver.py's ``PostgresServer``: its own data dir and port, stopped by PID)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def postgres_server() -> Iterator[Any | None]:
    """A running server (``new_database()`` gives a URL), or None when PostgreSQL is not installed."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.support.dbserver import PostgresServer, pg_bindir

    bindir = pg_bindir()
    if bindir is None:
        print("postgresql: skipped (initdb not found)")
        yield None
        return
    server = PostgresServer(bindir)
    try:
        yield server
    finally:
        server.stop()
