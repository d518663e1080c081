"""The control plane's SQL store: tenants, tokens, jobs, slices, attempts, events and logs.

SQLite (a file in the state dir) by default, PostgreSQL by URL (``postgresql+psycopg://...``).
This module is what the API reads and writes; the scheduling loop's transitions are in
``control/store/loopwrites.py`` on the same engine. Every write is one transaction, so bad input never
leaves half a change behind; state changes that race with the loop are compare-and-set updates
(``UPDATE ... WHERE state = ...``), which are atomic on both databases.
"""

from __future__ import annotations

import copy
import os
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    delete,
    event,
    func,
    insert,
    make_url,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from tpufleet.control.store import logs, migrations, packages
from tpufleet.control.store import values as r
from tpufleet.control.store.raysubmissions import RayOps
from tpufleet.control.store.tables import (
    AttemptRow,
    EventRow,
    JobRow,
    PackageRow,
    SliceRow,
)
from tpufleet.control.store.tenants import TenantOps, new_token, token_hash
from tpufleet.errors import (
    ClusterError,
    ConflictError,
    NotFoundError,
    closest,
    suggest,
)
from tpufleet.scheduler import lifecycle as lc

__all__ = ["Clock", "FenceStamp", "Store", "make_engine", "new_job_id", "new_token", "token_hash"]

Clock = r.Clock  # where callers have always imported it from
_STAMP = "tpufleet.fence"  # a session's ``info`` key: the FenceStamp its transaction passed with


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
    if url.startswith("sqlite"):
        memory = url in ("sqlite://", "sqlite:///:memory:")
        path = "" if memory else make_url(url).database or ""
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            poolclass=StaticPool if memory else None,
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
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def _private_file(path: str) -> None:
    """Create the SQLite file (and chmod its -wal/-shm) mode 0600: it holds token hashes and every
    tenant's jobs. SQLite gives the -wal and -shm files it creates the database file's mode."""
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    for p in (path, path + "-wal", path + "-shm", path + "-journal"):
        if os.path.exists(p):
            os.chmod(p, 0o600)


class Store(TenantOps, RayOps):
    """Tenants, tokens, jobs and slices as the API sees them. Thread-safe (one session per call).
    Tenants, tokens and the audit log: :class:`~tpufleet.control.store.tenants.TenantOps`; what came
    through Ray's job API: :class:`~tpufleet.control.store.raysubmissions.RayOps`.

    The constructor does no I/O: ``Store(url)`` builds an engine that connects on first use and
    assumes the schema is there. :meth:`open` is the usual way in: it checks (and by default
    upgrades) the schema first, so a store it returns is ready."""

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

    @classmethod
    def open(
        cls,
        url: str,
        *,
        upgrade: bool = True,
        clock: Clock = time.time,
        new_id: Callable[[], str] = new_job_id,
        limits: r.Limits = r.DEFAULT_LIMITS,
    ) -> Store:
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

    def fenced(self, check: Callable[[Connection], FenceStamp]) -> Store:
        """This store (the same engine and connections) with ``check`` run first in every
        transaction it begins: the loop's store on a replica (``control/store/lease.py``), whose
        check raises ``FencedError`` once another replica leads, so that transaction rolls back
        having written nothing. What the check returns stamps the transaction's writes (the one
        place they are stamped: :meth:`tx` keeps it in the session, :meth:`add_event` and the
        loop's attempt writes read it: :func:`stamp_of`). The API's store stays unfenced: every
        replica serves the API."""
        view = copy.copy(self)
        view._fence = check
        return view

    def check_fence(self) -> None:
        """Run the fence now, in a transaction of its own (``FencedError`` once another replica
        leads); nothing on an unfenced store. Before an action on the cluster that no write
        covers (a launch), so a deposed leader does not start what the new one will."""
        if self._fence is not None:
            with self.tx():
                pass

    @contextmanager
    def tx(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any exception (the fence's
        included: see :meth:`fenced`)."""
        with self._sessions.begin() as session:
            if self._fence is not None:
                session.info[_STAMP] = self._fence(session.connection())
            yield session

    @contextmanager
    def tx_unsynced(self) -> Iterator[Connection]:
        """A transaction whose commit does not wait for the disk, for writes the loop makes again
        anyway (wait reasons). A power loss may lose the last such commits, never consistency and
        never a commit made with ``tx``: each of those syncs all that was written before it.
        PostgreSQL: ``synchronous_commit = off`` for this transaction; SQLite (WAL): ``synchronous
        = NORMAL`` for its commit, then the connection's own setting again."""
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

    # -- jobs --------------------------------------------------------------------------------
    def submit(self, tenant: str, request: r.JobRequest) -> r.JobRecord:
        """Queue one job: one transaction (the tenant checked live and its caps counted in it)."""
        for _ in range(5):
            try:
                return self._insert_job(tenant, request)
            except IntegrityError:  # an id collision with a concurrent submit; draw again
                continue
        raise ConflictError("could not allocate a unique job id; try again")

    def _insert_job(self, tenant: str, req: r.JobRequest) -> r.JobRecord:
        with self.tx() as s:
            return self._add_job(s, tenant, req)

    def _job_from_row(self, row: JobRow) -> r.JobRecord:
        return job_record(row)

    def _add_job(self, s: Session, tenant: str, req: r.JobRequest) -> r.JobRecord:
        """Queue one job in ``s`` (the caller's transaction): the tenant's caps, its id, its event
        (Core inserts, as ``submit_many`` makes them: a submit is on the API's hot path)."""
        now = self.clock()
        self.check_live_tenant(s, tenant)
        self._check_can_queue(s, tenant, req)
        job_id = self._fresh_ids(s, 1)[0]
        values = {**_job_values(req), "id": job_id, "tenant": tenant, "submitted_at": now, "updated_at": now}
        key = s.connection().execute(insert(JobRow).values(values)).inserted_primary_key
        values["seq"] = key[0] if key else None
        message = f"submitted by {tenant}: {r.command_line(req.command)}"
        s.execute(
            insert(EventRow),
            [{"job_id": job_id, "at": now, "kind": "submit", "message": message, "tenant": tenant}],
        )
        return job_record(JobRow(**values))

    def submit_many(self, tenant: str | Sequence[str], requests: Sequence[r.JobRequest]) -> list[str]:
        """Queue ``requests`` all or none, in ONE transaction with bulk inserts (jobs and events);
        returns their ids in order. ``tenant``: one tenant for all, or one per request. The queued
        cap applies to each tenant's part of the batch as a whole. Ids are drawn together and
        checked in one query; a collision with a concurrent submit retries the whole batch."""
        owners = [tenant] * len(requests) if isinstance(tenant, str) else list(tenant)
        if len(owners) != len(requests):
            raise ValueError(f"{len(owners)} tenants for {len(requests)} requests")
        for name in dict.fromkeys(owners):
            self.tenant(name)
        for _ in range(5):
            try:
                return self._insert_jobs(owners, requests) if requests else []
            except IntegrityError:  # an id taken by a concurrent submit; draw the batch again
                continue
        raise ConflictError("could not allocate unique job ids; try again")

    def _insert_jobs(self, owners: list[str], requests: Sequence[r.JobRequest]) -> list[str]:
        now = self.clock()
        with self.tx() as s:
            for owner in sorted(set(owners)):  # one order: two batches never wait for each other
                self.check_live_tenant(s, owner)
            self._check_batch(s, owners, requests)
            ids = self._fresh_ids(s, len(requests))
            rows = [
                {
                    **_job_values(req),
                    "id": job_id,
                    "tenant": owner,
                    "submitted_at": now,
                    "updated_at": now,
                }
                for job_id, owner, req in zip(ids, owners, requests, strict=True)
            ]
            s.execute(insert(JobRow), rows)
            events = [
                {
                    "job_id": job_id,
                    "slice": None,
                    "at": now,
                    "kind": "submit",
                    "message": f"submitted by {owner}: {r.command_line(req.command)}",
                    "tenant": owner,
                    "actor": None,
                }
                for job_id, owner, req in zip(ids, owners, requests, strict=True)
            ]
            s.execute(insert(EventRow), events)
        return ids

    def _fresh_ids(self, s: Session, n: int) -> list[str]:
        """``n`` distinct new ids, none of them stored: drawn together, checked a chunk per query."""
        ids: list[str] = []
        seen: set[str] = set()
        while len(ids) < n:
            drawn = [i for i in (self.new_id() for _ in range(n - len(ids))) if i not in seen]
            drawn = list(dict.fromkeys(drawn))
            taken: set[str] = set()
            for at in range(0, len(drawn), 5000):
                chunk = drawn[at : at + 5000]
                taken.update(s.scalars(select(JobRow.id).where(JobRow.id.in_(chunk))))
            for job_id in drawn:
                seen.add(job_id)
                if job_id not in taken:
                    ids.append(job_id)
        return ids

    def _check_batch(self, s: Session, owners: list[str], requests: Sequence[r.JobRequest]) -> None:
        """The queued caps (jobs, bytes) per tenant for the batch as a whole, and every package it names."""
        cap = self.limits.max_queued_per_tenant
        adding: dict[str, int] = {}
        adding_bytes: dict[str, int] = {}
        for owner, req in zip(owners, requests, strict=True):
            adding[owner] = adding.get(owner, 0) + 1
            adding_bytes[owner] = adding_bytes.get(owner, 0) + req.body_bytes
        for owner, n in adding.items():
            have, have_bytes = self._queued(s, owner)
            if have + n > cap:
                raise ConflictError(
                    f"tenant {owner} has {have:,} queued jobs and the batch adds {n:,}: over the cap "
                    f"(serve --max-queued-per-tenant {cap}); submit fewer, or wait for some to start"
                )
            self._check_queued_bytes(owner, have_bytes, adding_bytes[owner], "the batch adds")
        named = {(o, q.working_dir) for o, q in zip(owners, requests, strict=True) if q.working_dir}
        for owner, wd in sorted(named):
            self._check_package(s, owner, wd)

    def _check_can_queue(self, s: Session, tenant: str, req: r.JobRequest) -> None:
        """The per-tenant cap on queued jobs, and a working_dir package this tenant uploaded."""
        cap = self.limits.max_queued_per_tenant
        queued, queued_bytes = self._queued(s, tenant)
        if queued >= cap:
            raise ConflictError(
                f"tenant {tenant} already has {queued:,} queued jobs, the cap (serve --max-queued-per-tenant "
                f"{cap}); wait for some to start or cancel some"
            )
        self._check_queued_bytes(tenant, queued_bytes, req.body_bytes, "this job adds")
        if req.working_dir is not None:
            self._check_package(s, tenant, req.working_dir)

    def _queued(self, s: Session, tenant: str) -> tuple[int, int]:
        """The tenant's queued jobs and their body bytes: one read of ``ix_jobs_tenant_state_bytes``
        alone (SQLite: a covering index; never a row, whose command and env come first)."""
        n, size = s.execute(
            select(func.count(), func.coalesce(func.sum(JobRow.body_bytes), 0))
            .select_from(JobRow)
            .where(JobRow.tenant == tenant, JobRow.state == r.QUEUED)
        ).one()
        return int(n or 0), int(size or 0)

    def _check_queued_bytes(self, tenant: str, have: int, adding: int, what: str) -> None:
        """The per-tenant cap on the bytes of queued job bodies (``Limits.max_queued_bytes_per_tenant``)."""
        cap = self.limits.max_queued_bytes_per_tenant
        if have + adding > cap:
            raise ConflictError(
                f"tenant {tenant} has {_mib(have)} of queued job bodies (commands, env, names) and {what} "
                f"{_mib(adding)}: over the cap of {_mib(cap)} (serve --max-queued-mib-per-tenant); "
                "wait for some to start, cancel some, or ship data in a package (--working-dir) instead"
            )

    def _check_package(self, s: Session, tenant: str, wd: str) -> None:
        """A working_dir that is a package id must name a package ``tenant`` uploaded."""
        if r.PACKAGE_ID.fullmatch(wd):
            key = (tenant, wd.removeprefix("sha256:"))
            if (
                s.scalar(
                    select(PackageRow.size).where(PackageRow.tenant == key[0], PackageRow.sha256 == key[1])
                )
                is None
            ):
                raise NotFoundError(
                    f"working_dir: package {wd} not found; upload it first (POST /api/v1/packages, "
                    "or tpufleet submit --working-dir DIR)"
                )

    def job(self, job_id: str, tenant: str | None = None) -> r.JobRecord:
        """One job with its attempts; ``tenant`` set means a tenant's token asks (another tenant's
        job is "not found", exactly like a job that does not exist)."""
        with self.tx() as s:
            row = self._job_row(s, job_id, tenant)
            attempts = s.scalars(
                select(AttemptRow).where(AttemptRow.job_id == row.id).order_by(AttemptRow.attempt)
            ).all()
            return job_record(row, tuple(_attempt(a) for a in attempts))

    def _job_row(self, s: Session, job_id: str, tenant: str | None) -> JobRow:
        query = select(JobRow).where(JobRow.id == job_id)
        if tenant is not None:
            query = query.where(JobRow.tenant == tenant)
        row = s.scalar(query) if _key_like(job_id) else None
        if row is None:
            shown = job_id if len(job_id) <= 40 else job_id[:37] + "..."
            raise NotFoundError(f"job {shown!r} not found; list jobs with `tpufleet jobs`")
        return row

    def jobs(self, tenant: str | None = None, states: tuple[str, ...] = ()) -> list[r.JobRecord]:
        query = select(JobRow).order_by(JobRow.seq)
        if tenant is not None:
            query = query.where(JobRow.tenant == tenant)
        if states:
            query = query.where(JobRow.state.in_(states))
        with self.tx() as s:
            return [job_record(j) for j in s.scalars(query)]

    def counts(self) -> dict[str, Any]:
        """Queued and running jobs, and slices by state (``GET /api/v1/status``)."""
        with self.tx() as s:
            jobs = {st: n for st, n in s.execute(select(JobRow.state, func.count()).group_by(JobRow.state))}
            slices = {
                st: n for st, n in s.execute(select(SliceRow.state, func.count()).group_by(SliceRow.state))
            }
        return {
            "queued": jobs.get(r.QUEUED, 0),
            "running": sum(jobs.get(st, 0) for st in r.ACTIVE),
            "slices": slices,
        }

    # -- packages ----------------------------------------------------------------------------
    def put_package(self, tenant: str, data: bytes) -> str:
        """Store a working-directory zip for ``tenant`` after :func:`packages.check_zip` (SpecError
        otherwise); returns its id ``sha256:<hex>``. Uploading the same bytes again is a no-op.
        The tenant's unused packages are collected first (:meth:`collect_packages`); what stays
        and this one must fit its package quota (ConflictError, naming ``serve --package-quota-mib``)."""
        packages.check_zip(data, self.limits)
        pid = packages.package_id(data)
        digest = pid.removeprefix("sha256:")
        self.tenant(tenant)
        try:
            with self.tx() as s:
                if s.get(PackageRow, (tenant, digest)) is None:
                    self._collect_packages(s, tenant)
                    self._check_package_quota(s, tenant, len(data))
                    s.add(
                        PackageRow(
                            tenant=tenant, sha256=digest, data=data, size=len(data), created_at=self.clock()
                        )
                    )
        except IntegrityError:  # the same upload raced with this one; it is stored
            pass
        return pid

    def _check_package_quota(self, s: Session, tenant: str, adding: int) -> None:
        quota = self.limits.package_quota_bytes
        used = int(s.scalar(select(func.sum(PackageRow.size)).where(PackageRow.tenant == tenant)) or 0)
        if used + adding > quota:
            raise ConflictError(
                f"tenant {tenant} stores {used:,} bytes of packages and this one has {adding:,}: over the "
                f"package quota of {quota:,} bytes (serve --package-quota-mib {quota // r.MiB}); a package "
                f"no queued or running job names is deleted {packages.UNUSED_KEEP_S / 3600:g} h after its "
                "last use"
            )

    def collect_packages(self, tenant: str | None = None) -> int:
        """Delete the packages (of ``tenant``, or everyone's) that no queued or running job names and
        that were neither uploaded nor used by a job that ended in the last ``packages.UNUSED_KEEP_S``;
        returns how many went. Run at every upload, for the uploading tenant, and by the loop for everyone
        every ``ServiceConfig.retention_check_s`` (``loop/tenantfiles.py``)."""
        with self.tx() as s:
            return self._collect_packages(s, tenant)

    def _collect_packages(self, s: Session, tenant: str | None) -> int:
        since = self.clock() - packages.UNUSED_KEEP_S
        named = (JobRow.tenant == PackageRow.tenant) & (JobRow.working_dir == "sha256:" + PackageRow.sha256)
        in_use = select(JobRow.seq).where(
            named, JobRow.state.not_in(r.TERMINAL) | (func.coalesce(JobRow.finished_at, since) >= since)
        )
        query = delete(PackageRow).where(PackageRow.created_at < since, ~in_use.exists())
        if tenant is not None:
            query = query.where(PackageRow.tenant == tenant)
        done = s.execute(query.execution_options(synchronize_session=False))
        return int(getattr(done, "rowcount", 0) or 0)

    def package(self, tenant: str, package_id: str) -> bytes:
        """The zip ``tenant`` uploaded as ``package_id``; NotFoundError for a malformed id, an unknown
        one or another tenant's (the same message for all three)."""
        data = None
        if isinstance(package_id, str) and r.PACKAGE_ID.fullmatch(package_id):
            with self.tx() as s:
                row = s.get(PackageRow, (tenant, package_id.removeprefix("sha256:")))
                data = None if row is None else bytes(row.data)
        if data is None:
            raise NotFoundError(f"package {str(package_id)[:80]!r} not found for tenant {tenant!r}")
        return data

    def request_cancel(
        self, job_id: str, tenant: str | None = None, *, actor: str | None = None
    ) -> r.JobRecord:
        """Cancel a job (``lifecycle.request_cancel``): a queued one at once; an active one is marked
        and the loop stops every process and frees its slices (the decision is written before it is
        acted on). A compare-and-set on the state: a change the loop made meanwhile is read again.
        ``actor`` (who asked: ``admin`` or a token id) puts the cancel in the audit log."""
        for _ in range(10):
            now = self.clock()
            with self.tx() as s:
                row = self._job_row(s, job_id, tenant)
                before = life_of(row)
                try:
                    after = lc.request_cancel(before)
                except lc.IllegalTransition as err:
                    raise ConflictError(f"job {job_id}: {err}") from err
                if after == before:
                    return job_record(row)
                done = {"finished_at": now} if after.terminal else {}
                changed = s.execute(
                    update(JobRow)
                    .where(JobRow.seq == row.seq, JobRow.state == row.state)
                    .values(**columns(after), **done, updated_at=now)
                    .execution_options(synchronize_session=False)
                )
                if getattr(changed, "rowcount", 0):
                    self.add_event(
                        s, "cancel requested", job_id=job_id, kind="cancel", tenant=row.tenant, actor=actor
                    )
                    s.refresh(row)
                    return job_record(row)
        raise ConflictError(f"job {job_id} kept changing state; try the cancel again")

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

    # -- slices ------------------------------------------------------------------------------
    def slices(self) -> list[r.SliceRecord]:
        with self.tx() as s:  # columns, no ORM objects: the loop reads every slice each cycle
            return [slice_record(x) for x in s.execute(select(*SliceRow.__table__.c).order_by(SliceRow.name))]

    def set_draining(self, name: str, draining: bool, *, actor: str | None = None) -> r.SliceRecord:
        """Drain a slice (no new job is placed on it; its holder runs to the end) or undrain it."""
        with self.tx() as s:
            row = s.get(SliceRow, name) if _key_like(name) else None
            if row is None:
                names = s.scalars(select(SliceRow.name)).all()
                raise NotFoundError(f"slice {name!r} not found{suggest(closest(name, names))}")
            row.draining = draining
            row.state = slice_state(row)
            row.updated_at = self.clock()
            self.add_event(s, "drain" if draining else "undrain", slice=name, kind="slice", actor=actor)
            return slice_record(row)

    # -- logs --------------------------------------------------------------------------------
    def read_logs(
        self,
        job_id: str,
        *,
        tenant: str | None = None,
        attempt: int | None = None,
        host: int | None = None,
        offset: int = 0,
    ) -> r.LogRead:
        """Stored output of an attempt (default: the latest that ran), per host, from ``offset``
        characters (``offset`` applies to each host read; pass ``host`` to follow one)."""
        with self.tx() as s:
            job = self._job_row(s, job_id, tenant)
            return logs.read(s, job, attempt=attempt, host=host, offset=offset)

    def plan_logs(
        self,
        job_id: str,
        *,
        tenant: str | None = None,
        attempt: int | None = None,
        host: int | None = None,
        offset: int = 0,
    ) -> tuple[r.LogRead, tuple[logs.Span, ...]]:
        """:meth:`read_logs` to stream: the answer without the text, and where each host's text is
        (``logs.pieces(store.tx, span)`` reads it a piece per query)."""
        with self.tx() as s:
            job = self._job_row(s, job_id, tenant)
            return logs.plan(s, job, attempt=attempt, host=host, offset=offset)


def _mib(n: int) -> str:
    return f"{n / r.MiB:,.1f} MiB"


def _key_like(value: str) -> bool:
    """Could ``value`` be a stored id or name? (No NUL, which PostgreSQL refuses in text, and short.)"""
    return isinstance(value, str) and 0 < len(value) <= 128 and "\0" not in value


def life_of(job: JobRow) -> lc.Life:
    """The lifecycle's view of a stored job."""
    return lc.Life(
        state=lc.JobState(job.state),
        attempt=job.attempt,
        failures=job.failures,
        max_retries=job.max_retries,
        stop_kind=lc.StopKind(job.stop_kind) if job.stop_kind else None,
        stop_message=job.stop_message,
        cancel_requested=job.cancel_requested,
        preempting=job.preempting,
        reason_code=job.reason_code,
        reason_message=job.reason_message,
    )


def columns(life: lc.Life) -> dict[str, Any]:
    """The job columns a ``Life`` stands for (what the store writes for a transition)."""
    return {
        "state": str(life.state),
        "attempt": life.attempt,
        "failures": life.failures,
        "stop_kind": str(life.stop_kind) if life.stop_kind else None,
        "stop_message": life.stop_message,
        "cancel_requested": life.cancel_requested,
        "preempting": life.preempting,
        "reason_code": life.reason_code,
        "reason_message": life.reason_message,
    }


def slice_state(row: SliceRow) -> str:
    """BROKEN when not intact, DRAINING when the admin drains it, HELD when an attempt holds it."""
    return state_of(row.problems, row.draining, row.holder)


def state_of(problems: Sequence[str] | None, draining: bool, holder: str | None) -> str:
    """:func:`slice_state` from a slice's columns."""
    if problems:
        return r.BROKEN
    if draining:
        return r.DRAINING
    return r.HELD if holder else r.FREE


def _job_values(req: r.JobRequest) -> dict[str, Any]:
    """The columns of a newly queued job from its request (bulk inserts)."""
    return {
        "name": req.name,
        "command": list(req.command),
        "accelerator_type": req.accelerator_type,
        "num_slices": req.num_slices,
        "priority": req.priority,
        "max_retries": req.max_retries,
        "env": dict(req.env),
        "working_dir": req.working_dir,
        "kind": req.kind,
        "body_bytes": req.body_bytes,
        "state": r.QUEUED,
        "attempt": 1,
        "failures": 0,
        "slices": [],
        "borrowing": False,
        "preempting": False,
        "head_of_line": False,
        "cancel_requested": False,
    }


def job_record(j: JobRow, attempts: tuple[r.AttemptRecord, ...] = ()) -> r.JobRecord:
    return r.JobRecord(
        id=j.id,
        name=j.name,
        tenant=j.tenant,
        state=j.state,
        attempt=j.attempt,
        slices=tuple(j.slices or ()),
        reason=j.reason_message,
        reason_code=j.reason_code,
        accelerator_type=j.accelerator_type,
        num_slices=j.num_slices,
        priority=j.priority,
        max_retries=j.max_retries,
        failures=j.failures,
        command=tuple(j.command),
        env=dict(j.env or {}),
        working_dir=j.working_dir,
        borrowing=j.borrowing,
        preempting=j.preempting,
        cancel_requested=j.cancel_requested,
        exit_code=j.exit_code,
        seq=j.seq,
        submitted_at=j.submitted_at,
        admitted_at=j.admitted_at,
        started_at=j.started_at,
        finished_at=j.finished_at,
        attempts=attempts,
        kind=lc.JobKind(j.kind or lc.JobKind.SPMD),
        stopping=j.stop_kind is not None,
    )


def slice_record(x: Any) -> r.SliceRecord:
    """A slice as the store hands it out, from its row (an ORM object or a row of its columns)."""
    return r.SliceRecord(
        name=x.name,
        accelerator_type=x.accelerator_type,
        topology=x.topology,
        state=x.state,
        holder=x.holder,
        hosts=tuple(x.hosts or ()),
        problems=tuple(x.problems or ()),
        draining=x.draining,
    )


def _attempt(a: AttemptRow) -> r.AttemptRecord:
    return r.AttemptRecord(
        attempt=a.attempt,
        slices=tuple(a.slices),
        state=a.state,
        message=a.message,
        exit_codes=tuple(a.exit_codes or ()),
        admitted_at=a.admitted_at,
        started_at=a.started_at,
        ended_at=a.ended_at,
        first_step=a.first_step,
        first_step_at=a.first_step_at,
        last_step=a.last_step,
        last_step_at=a.last_step_at,
    )


def _safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return url
