"""The control plane's database: the engine, its transactions, the leader's fence, and the journal.

SQLite (a file in the state dir) by default, PostgreSQL by URL (``postgresql+psycopg://...``).
:class:`Database` is what every part of the store writes through (``tx``); the parts themselves
(jobs, tenants, tokens, packages, slices, Ray submissions) are composed by
:class:`~tpufleet.control.store.facade.Store`, and the scheduling loop's writes are in
``control/store/loopwrites.py`` on the same engine. Every write is one transaction, so bad input
never leaves half a change behind; state changes that race with the loop are compare-and-set
updates (``UPDATE ... WHERE state = ...``), which are atomic on both databases. The journal (events,
and the audit log: those someone caused) is written by every part, so it lives here.
"""

from __future__ import annotations

import copy
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Self

from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    event,
    insert,
    select,
    text,
)
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from tpufleet.control.store import migrations
from tpufleet.control.store import values as r
from tpufleet.control.store.tables import EventRow
from tpufleet.errors import ClusterError, SpecError

__all__ = [
    "Clock",
    "Database",
    "FenceStamp",
    "claim_write_lock",
    "make_engine",
    "new_job_id",
    "stamp_of",
    "term_of",
]

Clock = r.Clock  # where callers have always imported it from
_STAMP = "tpufleet.fence"  # a session's ``info`` key: the FenceStamp its transaction passed with
BUSY_TIMEOUT_S = 30.0  # SQLite: how long a write waits for the database's write lock before it fails
_BUSY_MS = int(BUSY_TIMEOUT_S * 1000)  # the same, as SQLite's PRAGMA busy_timeout takes it
CLAIM_POLL_S = 0.00025  # Database.tx(claim=True) on SQLite: how often it asks for the write lock


@dataclass(frozen=True)
class FenceStamp:
    """What a fenced transaction passed the fence with: the fencing token of the leader's term and
    the database's clock at the check (seconds since the epoch). Every event that transaction
    writes carries both (``events.term``, ``events.fenced_at``), and an attempt it launches or
    ends its term (``attempts.launch_term``, ``end_term``), so who wrote what, when, can be read
    back from the store alone (``tpufleet chaos --replicas``, ``chaos/fencing.py``)."""

    term: int
    at: float


def stamp_of(s: Session) -> FenceStamp | None:
    """The fence stamp of ``s``'s transaction; None on an unfenced store (the API, a lone SQLite serve)."""
    stamp = s.info.get(_STAMP)
    return stamp if isinstance(stamp, FenceStamp) else None


def _fence_columns(stamp: FenceStamp | None) -> dict[str, Any]:
    """An event's ``term`` and ``fenced_at`` from the stamp its transaction passed the fence with."""
    return {"term": None, "fenced_at": None} if stamp is None else {"term": stamp.term, "fenced_at": stamp.at}


def term_of(s: Session) -> int | None:
    """The fencing token ``s``'s transaction writes under (None: unfenced)."""
    stamp = stamp_of(s)
    return None if stamp is None else stamp.term


def new_job_id() -> str:
    """Eight hex digits: short enough to type, random enough for a fleet's lifetime (ids are
    checked for collisions on insert)."""
    return secrets.token_hex(4)


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and foreign keys, so the API thread
    and the scheduling loop can write concurrently. No I/O: the database is first touched when a
    connection is made, and a SQLite file is created mode 0600 right before that."""
    r.check_db_url(url)
    if url.startswith("sqlite"):
        memory = r.sqlite_in_memory(url)
        path = r.sqlite_file(url)
        engine = _engine(
            url,
            connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_S},
            poolclass=StaticPool if memory else None,
            **({} if memory else {"pool_size": 48, "max_overflow": 16}),
        )

        @event.listens_for(engine, "do_connect")
        def _private(_dialect: Any, _record: Any, _cargs: Any, _cparams: Any) -> None:
            _private_file(path)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            if not memory:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={_BUSY_MS}")
            cur.close()

        return engine
    # PostgreSQL: 20 kept (10 more on demand) instead of 5 (+10), so the API's 40 threads do not open
    # and close a server process per request past 15 at once; 30 a replica keeps three replicas
    # under the server's default max_connections (100). Past that, a request waits for a connection.
    return _engine(url, pool_pre_ping=True, pool_size=20, max_overflow=10)


def _engine(url: str, **kwargs: Any) -> Engine:
    """``create_engine``, whose complaints about the URL's settings (``?timeout=abc``, a host
    where SQLite wants a path) are the user's input: a SpecError, not a traceback."""
    try:
        return create_engine(url, **kwargs)
    except (ArgumentError, ValueError, TypeError) as err:
        raise SpecError(f"--db: the database URL's settings are not valid: {err}") from None


def claim_write_lock(conn: Connection, wait_s: float = BUSY_TIMEOUT_S) -> None:
    """SQLite: begin ``conn``'s transaction holding the database's write lock (``BEGIN IMMEDIATE``),
    asking for it every ``CLAIM_POLL_S`` for at most ``wait_s`` (then SQLite's own "database is
    locked"); nothing when the transaction already began, or on PostgreSQL (row locks there).

    SQLite's busy handler, which every other write waits in, sleeps in growing steps (1, 2, 5 ... up
    to 100 ms between tries), so under a stream of submits a writer that has waited a while sleeps
    through the moments the lock is free while the submits take it. The scheduling loop's writes
    (``loopwrites.Transitions``) claim it this way instead: they end attempts and admit jobs, so
    each millisecond they wait is a millisecond every chip they free stays idle, and the loop makes
    a few a cycle where the API makes one a submit. Under an overload this puts the loop first and
    the submits' pace second, which is the order a queue wants: the waiting jobs are already safe."""
    if conn.dialect.name != "sqlite":
        return
    raw: Any = conn.connection.dbapi_connection  # sqlite3.Connection
    if raw.in_transaction:
        return
    deadline = time.monotonic() + wait_s
    raw.execute("PRAGMA busy_timeout=0")
    try:
        while True:
            try:
                raw.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as err:
                if err.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                    raise OperationalError("BEGIN IMMEDIATE", None, err) from err
            time.sleep(CLAIM_POLL_S)
    finally:
        raw.execute(f"PRAGMA busy_timeout={_BUSY_MS}")


def _private_file(path: str | None) -> None:
    """Create the SQLite file (and chmod its -wal/-shm) mode 0600: it holds token hashes and every
    tenant's jobs. SQLite gives the -wal and -shm files it creates the database file's mode.
    ``path``: ``values.sqlite_file``'s (None: no file of ours to make private)."""
    if path is None:
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    for p in (path, path + "-wal", path + "-shm", path + "-journal"):
        if os.path.exists(p):
            os.chmod(p, 0o600)


class Database:
    """One database: its engine, a transaction per call (thread-safe), the fence a leader's
    writes pass, and the journal. The constructor does no I/O: ``Database(url)`` builds an
    engine that connects on first use and assumes the schema is there. :meth:`open` is the usual
    way in: it checks (and by default upgrades) the schema first, so what it returns is ready."""

    def __init__(
        self,
        url: str,
        *,
        clock: Clock = time.time,
        new_id: Callable[[], str] = new_job_id,
        limits: r.Limits = r.DEFAULT_LIMITS,
    ) -> None:
        self.url = url
        self.clock = clock
        self.new_id = new_id
        self.limits = limits
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._fence: Callable[[Connection], FenceStamp] | None = None
        self.lock_wait_s = BUSY_TIMEOUT_S  # tx(claim=True): how long to ask for SQLite's write lock
        self._compose()

    @classmethod
    def open(
        cls,
        url: str,
        *,
        upgrade: bool = True,
        clock: Clock = time.time,
        new_id: Callable[[], str] = new_job_id,
        limits: r.Limits = r.DEFAULT_LIMITS,
    ) -> Self:
        """A store on ``url`` whose schema is the one this code needs: created when the database
        is empty, upgraded when older (``upgrade=False``: refused instead, naming
        ``tpufleet db upgrade``). A ``SchemaError`` for a newer or foreign schema, a
        ``ClusterError`` when the database cannot be reached."""
        store = cls(url, clock=clock, new_id=new_id, limits=limits)
        try:
            if upgrade:
                store.upgrade()
            else:
                store.check_schema()
        except BaseException:
            store.close()
            raise
        return store

    def upgrade(self) -> migrations.Migration:
        """Bring the schema to this code's head revision (see ``control/store/migrations``)."""
        with self._reaching():
            return migrations.upgrade(self.engine, _safe_url(self.url))

    def schema_revision(self) -> str | None:
        """The schema revision recorded in the database (None: none, e.g. an empty database)."""
        with self._reaching(), self.engine.connect() as conn:
            return migrations.current(conn)

    def check_schema(self) -> None:
        """Raise ``SchemaError`` unless the database is at this code's head revision."""
        with self._reaching(), self.engine.connect() as conn:
            migrations.check(conn, _safe_url(self.url))

    @contextmanager
    def _reaching(self) -> Iterator[None]:
        try:
            yield
        except OperationalError as err:
            why = "; ".join(line.strip() for line in str(err.orig).splitlines() if line.strip())
            raise ClusterError(f"cannot open the database {_safe_url(self.url)}: {why}") from err

    def fenced(self, check: Callable[[Connection], FenceStamp]) -> Self:
        """This store (the same engine and connections) with ``check`` run first in every
        transaction it begins: the loop's store on a replica (``control/store/lease.py``), whose
        check raises ``FencedError`` once another replica leads, so that transaction rolls back
        having written nothing. What the check returns stamps the transaction's writes (the one
        place they are stamped: :meth:`tx` keeps it in the session, :meth:`add_event` and the
        loop's attempt writes read it: :func:`stamp_of`). The API's store stays unfenced: every
        replica serves the API."""
        view = copy.copy(self)
        view._fence = check
        view._compose()
        return view

    def _compose(self) -> None:
        """Build what reads and writes through this database (a subclass's parts: ``Store``'s);
        called by the constructor, and again on a :meth:`fenced` view so they pass its fence."""

    def check_fence(self) -> None:
        """Run the fence now, in a transaction of its own (``FencedError`` once another replica
        leads); nothing on an unfenced store. Before an action on the cluster that no write
        covers (a launch), so a deposed leader does not start what the new one will."""
        if self._fence is not None:
            with self.tx():
                pass

    @contextmanager
    def tx(self, *, claim: bool = False) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any exception (the fence's
        included: see :meth:`fenced`). ``claim``: it begins holding SQLite's write lock, asked for
        as soon as it is free (:func:`claim_write_lock`; the scheduling loop's writes)."""
        with self._sessions.begin() as session:
            if claim:
                claim_write_lock(session.connection(), self.lock_wait_s)
            if self._fence is not None:
                session.info[_STAMP] = self._fence(session.connection())
            yield session

    @contextmanager
    def tx_unsynced(self, *, claim: bool = False) -> Iterator[Connection]:
        """A transaction whose commit does not wait for the disk, for writes the loop makes again
        anyway (wait reasons). A power loss may lose the last such commits, never consistency and
        never a commit made with ``tx``: each of those syncs all that was written before it.
        PostgreSQL: ``synchronous_commit = off`` for this transaction; SQLite (WAL): ``synchronous
        = NORMAL`` for its commit, then the connection's own setting again. ``claim``: as
        :meth:`tx`'s."""
        with self.engine.connect() as conn:
            if conn.dialect.name != "sqlite":
                with conn.begin():
                    conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
                    if self._fence is not None:
                        self._fence(conn)
                    yield conn
                return
            level = int(conn.exec_driver_sql("PRAGMA synchronous").scalar_one())  # 0 to 3
            conn.exec_driver_sql("PRAGMA synchronous = NORMAL")
            conn.commit()  # ends the transaction SQLAlchemy began for the pragma (no BEGIN was sent)
            try:
                with conn.begin():
                    if claim:
                        claim_write_lock(conn, self.lock_wait_s)
                    if self._fence is not None:
                        self._fence(conn)
                    yield conn
            finally:  # the pragma belongs to the pooled connection, which others get next
                conn.exec_driver_sql(f"PRAGMA synchronous = {level}")
                conn.commit()

    def ping(self) -> None:
        """Ask the database one trivial question; raises what the driver raises when it cannot answer
        (``/healthz`` says ``stalled`` then)."""
        with self.tx() as s:
            s.execute(text("SELECT 1"))

    def close(self) -> None:
        self.engine.dispose()

    # -- the journal ------------------------------------------------------------
    def events(self, job_id: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        query = select(EventRow).order_by(EventRow.id.desc()).limit(limit)
        if job_id is not None:
            query = query.where(EventRow.job_id == job_id)
        with self.tx() as s:
            rows = list(s.scalars(query))
        return [
            {"at": e.at, "job_id": e.job_id, "slice": e.slice, "kind": e.kind, "message": e.message}
            for e in reversed(rows)
        ]

    def add_event(
        self,
        s: Session,
        message: str,
        *,
        job_id: str | None = None,
        slice: str | None = None,
        kind: str = "info",
        tenant: str | None = None,
        actor: str | None = None,
        stamp: FenceStamp | None = None,
    ) -> None:
        """An event in ``s``'s transaction; with ``actor`` (who did it) it is in the audit log.
        Stamped with the fence stamp of ``s``'s transaction (:meth:`fenced`), else ``stamp``."""
        fence = _fence_columns(stamp_of(s) or stamp)
        s.add(
            EventRow(
                job_id=job_id,
                slice=slice,
                at=self.clock(),
                kind=kind,
                message=message,
                tenant=tenant,
                actor=actor,
                **fence,
            )
        )

    def add_events(self, s: Session, events: Sequence[dict[str, Any]]) -> None:
        """Many events in ``s``'s transaction, one statement (the loop's grouped writes): each a
        dict of :meth:`add_event`'s keywords and its ``message``, stamped as it stamps them."""
        if not events:
            return
        fence = _fence_columns(stamp_of(s))
        blank = {"job_id": None, "slice": None, "kind": "info", "tenant": None, "actor": None}
        at = self.clock()
        s.connection().execute(insert(EventRow), [{**blank, **e, "at": at, **fence} for e in events])

    def audit_events(
        self, tenant: str | None = None, *, limit: int = r.PAGE_DEFAULT, after: int = 0
    ) -> tuple[list[r.EventRecord], int | None]:
        """Events someone caused (tenant and token changes, cancels, preemptions, drains), oldest
        first, ``limit`` after event id ``after``; and the id to continue after (None: last page)."""
        query = select(EventRow).where(EventRow.actor.is_not(None), EventRow.id > after)
        if tenant is not None:
            query = query.where(EventRow.tenant == tenant)
        with self.tx() as s:
            rows = list(s.scalars(query.order_by(EventRow.id).limit(limit + 1)))
        more = len(rows) > limit
        rows = rows[:limit]
        return [_event(e) for e in rows], (rows[-1].id if more else None)


def key_like(value: object) -> bool:
    """Could ``value`` be a stored id or name? (A string, short, and no NUL, which PostgreSQL
    refuses in text.) Looked up only when it could: anything else is "not found" at once."""
    return isinstance(value, str) and 0 < len(value) <= 128 and "\0" not in value


def _event(e: EventRow) -> r.EventRecord:
    return r.EventRecord(
        id=e.id,
        at=e.at,
        kind=e.kind,
        tenant=e.tenant,
        actor=e.actor,
        job_id=e.job_id,
        slice=e.slice,
        message=e.message,
    )


def _safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return url
