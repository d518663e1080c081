"""Jobs: queue (one or a batch), read, cancel, read their logs; composed into
:class:`~tpufleet.control.store.facade.Store` as ``store.jobs``.

A submit is checked and inserted in one transaction: the tenant is checked live and locked against
a concurrent submit of its own (:func:`check_live`), its caps on queued jobs and queued bytes are
counted, the package a job names must be the tenant's, and the job and its ``submit`` event are
inserted. Submits that arrive while another's transaction commits share the next one (group
commit, :meth:`JobStore.submit`): one write lock and one synced commit for all of them. A cancel is a
compare-and-set on the job's state (``lifecycle.request_cancel``). What the scheduling loop does
to a job after that is in ``loopwrites.py``; :func:`life_of` and :func:`columns` are the two
directions between a stored job and the lifecycle's view of it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tpufleet.control.store import logs
from tpufleet.control.store import values as r
from tpufleet.control.store.database import Database
from tpufleet.control.store.lookup import job_row, tenant_row
from tpufleet.control.store.packagestore import check_named
from tpufleet.control.store.tables import AttemptRow, EventRow, JobRow, TenantRow
from tpufleet.errors import ConflictError, TpufleetError
from tpufleet.scheduler import lifecycle as lc

__all__ = ["JobStore", "check_live", "columns", "job_record", "life_of"]

GROUP_MAX = 256  # submits committed together at most: a bound on a transaction's time and size


class _Submit:
    """One submit waiting to be committed: what was asked, and once ``done`` its answer."""

    __slots__ = ("done", "error", "record", "request", "tenant", "wake")

    def __init__(self, tenant: str, request: r.JobRequest) -> None:
        self.tenant, self.request = tenant, request
        self.wake = threading.Event()  # set when done, or when this submit leads the next group
        self.done = False
        self.record: r.JobRecord | None = None
        self.error: BaseException | None = None

    def answer(self, answer: r.JobRecord | BaseException) -> None:
        if isinstance(answer, BaseException):
            self.error = answer
        else:
            self.record = answer
        self.done = True


class _SubmitGroup:
    """The submits waiting for a transaction, and whether one is under way. The submit that
    leads a group commits it; as it ends, the first submit that arrived meanwhile leads the next
    group (woken with ``done`` still False), and the group's own submits are woken done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[_Submit] = []
        self._busy = False  # a group is being committed

    def join(self, item: _Submit) -> bool:
        """Queue ``item``; True when it leads (no group was under way), else it waits to be woken."""
        with self._lock:
            self._waiting.append(item)
            if self._busy:
                return False
            self._busy = True
            return True

    def take(self) -> list[_Submit]:
        """The group to commit now: the leader, first in line, and up to ``GROUP_MAX`` in all."""
        with self._lock:
            batch, self._waiting = self._waiting[:GROUP_MAX], self._waiting[GROUP_MAX:]
            return batch

    def hand_over(self, batch: list[_Submit]) -> None:
        """After ``batch``: its submits woken (answered; or, should its leader have died
        before answering, with its error), the next group's leader woken, or none busy."""
        for item in batch:
            if not item.done:
                item.answer(ConflictError("the submit was not committed; try again"))
        with self._lock:
            if self._waiting:
                self._waiting[0].wake.set()  # leads the next group (not done)
            else:
                self._busy = False
        for item in batch:
            item.wake.set()


class JobStore:
    """The jobs in the database ``db``."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._group = _SubmitGroup()

    def submit(self, tenant: str, request: r.JobRequest) -> r.JobRecord:
        """Queue one job, with the submits that arrive while another commits (group commit).

        A submit that finds no transaction of submits under way commits its own at once; those
        that arrive meanwhile wait, and the first of them then commits all of them in ONE
        transaction (one write lock, one commit and its fsync, instead of one each; at most
        ``GROUP_MAX``). Each is checked in that transaction in arrival order as if alone (its
        tenant live, its caps counted with those before it, its package), and each gets its own
        answer: its record once the transaction has committed, or its own error, which writes
        nothing and leaves the others' jobs in. A failure of the transaction itself (the fence of
        a deposed leader, the database gone) is every one's error."""
        item = _Submit(tenant, request)
        if not self._group.join(item):
            item.wake.wait()  # done by another's transaction, or this one leads the next
        if not item.done:
            batch = self._group.take()
            try:
                self._commit(batch)
            finally:
                self._group.hand_over(batch)
        if item.error is not None:
            raise item.error
        assert item.record is not None
        return item.record

    def _commit(self, batch: list[_Submit]) -> None:
        """``batch`` in one transaction; every item's answer set (done) when this returns."""
        for _ in range(5):
            answers: list[r.JobRecord | TpufleetError | None] = []
            try:
                with self._db.tx() as s:
                    # Every tenant of the group checked and locked first, in one statement and one
                    # order, as a batch does: two groups (two replicas serving submits) never wait
                    # for each other's tenants. Then their queued jobs and bytes counted in one
                    # more: a group's time holds SQLite's one write lock, and each statement costs
                    # far more to build in Python than to run.
                    names = {item.tenant for item in batch}
                    refused = _refused_tenants(s, names)
                    queued = _queued_of(s, sorted(names - refused.keys()))
                    # Each submit checked as if alone, in arrival order, its tenant's caps
                    # counting the group's earlier submits; then the accepted ones inserted
                    # together: one statement per table, not one per submit.
                    accepted: list[tuple[str, r.JobRequest]] = []
                    for item in batch:
                        if item.tenant in refused:
                            answers.append(refused[item.tenant])
                            continue
                        try:
                            queued[item.tenant] = self._count_in(s, item.tenant, item.request, queued)
                        except TpufleetError as err:  # raised by a check, before any insert
                            answers.append(err)
                            continue
                        accepted.append((item.tenant, item.request))
                        answers.append(None)
                    records = iter(self._insert(s, accepted))
                    answers = [a if a is not None else next(records) for a in answers]
            except IntegrityError:  # an id collision with a concurrent submit; draw again
                continue
            except BaseException as err:  # the transaction's own failure is every item's
                for item in batch:
                    item.answer(err)
                raise
            for item, answer in zip(batch, answers, strict=True):
                assert answer is not None
                item.answer(answer)
            return
        for item in batch:
            item.answer(ConflictError("could not allocate a unique job id; try again"))

    def add(self, s: Session, tenant: str, req: r.JobRequest) -> r.JobRecord:
        """Queue one job in ``s`` (the caller's transaction): the tenant's caps, its id, its event
        (Core inserts, as :meth:`submit_many` makes them: a submit is on the API's hot path)."""
        check_live(s, tenant)
        return self._add_live(s, tenant, req)

    def _add_live(self, s: Session, tenant: str, req: r.JobRequest) -> r.JobRecord:
        """:meth:`add` for a tenant :func:`check_live` has passed in ``s`` already."""
        self._count_in(s, tenant, req, {})
        return self._insert(s, [(tenant, req)])[0]

    def _count_in(
        self, s: Session, tenant: str, req: r.JobRequest, queued: dict[str, tuple[int, int]]
    ) -> tuple[int, int]:
        """``req`` checked against ``tenant``'s caps with ``queued[tenant]`` (its queued jobs and
        their bytes; read from ``s`` when missing) and its package: those counts with ``req``."""
        have, have_bytes = queued[tenant] if tenant in queued else _queued_of(s, [tenant])[tenant]
        self._check_can_queue(tenant, req, have, have_bytes)
        if req.working_dir is not None:
            check_named(s, tenant, req.working_dir)
        return have + 1, have_bytes + req.body_bytes

    def _insert(self, s: Session, jobs: list[tuple[str, r.JobRequest]]) -> list[r.JobRecord]:
        """``jobs`` (tenant, request), checked already, inserted with their ``submit`` events: one
        statement per table, each compiled once for every call (the values are parameters)."""
        if not jobs:
            return []
        rows, events = _new_rows(self._fresh_ids(s, len(jobs)), jobs, self._db.clock())
        conn = s.connection()  # Core, not the ORM's bulk insert: the same statements, a third of the CPU
        seqs = conn.execute(_INSERT_JOBS, rows).scalars().all()
        conn.execute(_INSERT_EVENTS, events)
        return [job_record(cast(JobRow, _NewJob(row, seq))) for row, seq in zip(rows, seqs, strict=True)]

    def submit_many(self, tenant: str | Sequence[str], requests: Sequence[r.JobRequest]) -> list[str]:
        """Queue ``requests`` all or none, in ONE transaction with bulk inserts (jobs and events);
        returns their ids in order. ``tenant``: one tenant for all, or one per request. The queued
        cap applies to each tenant's part of the batch as a whole. Ids are drawn together and
        checked in one query; a collision with a concurrent submit retries the whole batch."""
        owners = [tenant] * len(requests) if isinstance(tenant, str) else list(tenant)
        if len(owners) != len(requests):
            raise ValueError(f"{len(owners)} tenants for {len(requests)} requests")
        with self._db.tx() as s:
            for name in dict.fromkeys(owners):
                tenant_row(s, name)
        for _ in range(5):
            try:
                return self._insert_jobs(owners, requests) if requests else []
            except IntegrityError:  # an id taken by a concurrent submit; draw the batch again
                continue
        raise ConflictError("could not allocate unique job ids; try again")

    def _insert_jobs(self, owners: list[str], requests: Sequence[r.JobRequest]) -> list[str]:
        now = self._db.clock()
        with self._db.tx() as s:
            refused = _refused_tenants(s, set(owners))  # one order: two batches never wait for each other
            if refused:
                raise refused[min(refused)]  # the first in that order, as one check at a time said
            self._check_batch(s, owners, requests)
            ids = self._fresh_ids(s, len(requests))
            rows, events = _new_rows(ids, list(zip(owners, requests, strict=True)), now)
            s.execute(insert(JobRow), rows)
            s.execute(insert(EventRow), events)
        return ids

    def _fresh_ids(self, s: Session, n: int) -> list[str]:
        """``n`` distinct new ids, none of them stored: drawn together, checked a chunk per query."""
        ids: list[str] = []
        seen: set[str] = set()
        while len(ids) < n:
            drawn = [i for i in (self._db.new_id() for _ in range(n - len(ids))) if i not in seen]
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
        cap = self._db.limits.max_queued_per_tenant
        adding: dict[str, int] = {}
        adding_bytes: dict[str, int] = {}
        for owner, req in zip(owners, requests, strict=True):
            adding[owner] = adding.get(owner, 0) + 1
            adding_bytes[owner] = adding_bytes.get(owner, 0) + req.body_bytes
        queued = _queued_of(s, sorted(adding))
        for owner, n in adding.items():
            have, have_bytes = queued[owner]
            if have + n > cap:
                raise ConflictError(
                    f"tenant {owner} has {have:,} queued jobs and the batch adds {n:,}: over the cap "
                    f"(serve --max-queued-per-tenant {cap}); submit fewer, or wait for some to start"
                )
            self._check_queued_bytes(owner, have_bytes, adding_bytes[owner], "the batch adds")
        named = {(o, q.working_dir) for o, q in zip(owners, requests, strict=True) if q.working_dir}
        for owner, wd in sorted(named):
            check_named(s, owner, wd)

    def _check_can_queue(self, tenant: str, req: r.JobRequest, queued: int, queued_bytes: int) -> None:
        """The per-tenant caps on queued jobs and their bytes, for ``req`` on top of ``queued``."""
        cap = self._db.limits.max_queued_per_tenant
        if queued >= cap:
            raise ConflictError(
                f"tenant {tenant} already has {queued:,} queued jobs, the cap (serve --max-queued-per-tenant "
                f"{cap}); wait for some to start or cancel some"
            )
        self._check_queued_bytes(tenant, queued_bytes, req.body_bytes, "this job adds")

    def _check_queued_bytes(self, tenant: str, have: int, adding: int, what: str) -> None:
        """The per-tenant cap on the bytes of queued job bodies (``Limits.max_queued_bytes_per_tenant``)."""
        cap = self._db.limits.max_queued_bytes_per_tenant
        if have + adding > cap:
            raise ConflictError(
                f"tenant {tenant} has {_mib(have)} of queued job bodies (commands, env, names) and {what} "
                f"{_mib(adding)}: over the cap of {_mib(cap)} (serve --max-queued-mib-per-tenant); "
                "wait for some to start, cancel some, or ship data in a package (--working-dir) instead"
            )

    def get(self, job_id: str, tenant: str | None = None) -> r.JobRecord:
        """One job with its attempts; ``tenant`` set means a tenant's token asks (another tenant's
        job is "not found", exactly like a job that does not exist)."""
        with self._db.tx() as s:
            row = job_row(s, job_id, tenant)
            attempts = s.scalars(
                select(AttemptRow).where(AttemptRow.job_id == row.id).order_by(AttemptRow.attempt)
            ).all()
            return job_record(row, tuple(_attempt(a) for a in attempts))

    def all(self, tenant: str | None = None, states: tuple[str, ...] = ()) -> list[r.JobRecord]:
        query = select(JobRow).order_by(JobRow.seq)
        if tenant is not None:
            query = query.where(JobRow.tenant == tenant)
        if states:
            query = query.where(JobRow.state.in_(states))
        with self._db.tx() as s:
            return [job_record(j) for j in s.scalars(query)]

    def request_cancel(
        self, job_id: str, tenant: str | None = None, *, actor: str | None = None
    ) -> r.JobRecord:
        """Cancel a job (``lifecycle.request_cancel``): a queued one at once; an active one is marked
        and the loop stops every process and frees its slices (the decision is written before it is
        acted on). A compare-and-set on the state: a change the loop made meanwhile is read again.
        ``actor`` (who asked: ``admin`` or a token id) puts the cancel in the audit log."""
        for _ in range(10):
            now = self._db.clock()
            with self._db.tx() as s:
                row = job_row(s, job_id, tenant)
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
                    self._db.add_event(
                        s, "cancel requested", job_id=job_id, kind="cancel", tenant=row.tenant, actor=actor
                    )
                    s.refresh(row)
                    return job_record(row)
        raise ConflictError(f"job {job_id} kept changing state; try the cancel again")

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
        with self._db.tx() as s:
            job = job_row(s, job_id, tenant)
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
        with self._db.tx() as s:
            job = job_row(s, job_id, tenant)
            return logs.plan(s, job, attempt=attempt, host=host, offset=offset)


def check_live(s: Session, name: str) -> None:
    """Inside a submit's transaction, before its queued caps are counted: the tenant is not
    deleted, and no other submit of this tenant counts until this transaction ends, so a cap's
    check and the insert are one step. PostgreSQL: the tenant's row locked ``FOR NO KEY
    UPDATE`` (its jobs' foreign keys are not blocked; a concurrent delete either sees this job
    and cancels it, or refuses it); SQLite: the database's write lock (``BEGIN IMMEDIATE``)."""
    refused = _refused_tenants(s, {name})
    if refused:
        raise refused[name]


_LIVE = (
    select(TenantRow.name, TenantRow.deleted_at)
    .where(TenantRow.name.in_(bindparam("names", expanding=True)))
    .order_by(TenantRow.name)
    .with_for_update(key_share=True)
)
_QUEUED = (
    select(JobRow.tenant, func.count(), func.coalesce(func.sum(JobRow.body_bytes), 0))
    .where(JobRow.tenant.in_(bindparam("names", expanding=True)), JobRow.state == r.QUEUED)
    .group_by(JobRow.tenant)
)


def _refused_tenants(s: Session, names: set[str]) -> dict[str, TpufleetError]:
    """:func:`check_live` for every tenant of ``names`` at once, in one statement (locked in name
    order): the error of each that is missing or deleted; the others are live and locked."""
    _write_lock(s)
    found = {name: deleted_at for name, deleted_at in s.execute(_LIVE, {"names": sorted(names)})}
    refused: dict[str, TpufleetError] = {}
    for name in sorted(names):
        try:
            if name not in found:
                tenant_row(s, name)  # raises: no such tenant (with the nearest names)
            if name not in found or found[name] is not None:
                raise ConflictError(f"tenant {name!r} was deleted; it takes no jobs")
        except TpufleetError as err:
            refused[name] = err
    return refused


def _queued_of(s: Session, tenants: list[str]) -> dict[str, tuple[int, int]]:
    """The queued jobs and their body bytes of each of ``tenants`` (0 and 0 for one with none), in
    one read of ``ix_jobs_tenant_state_bytes`` alone (SQLite: a covering index; never a row, whose
    command and env come first)."""
    counts = {t: (0, 0) for t in tenants}
    if tenants:
        for tenant, n, size in s.execute(_QUEUED, {"names": tenants}):
            counts[tenant] = (int(n or 0), int(size or 0))
    return counts


def _write_lock(s: Session) -> None:
    """SQLite: take the write lock now, unless this transaction holds it already. Python's sqlite3
    begins a transaction only at the first write, so a count read before it is not isolated from
    another connection's insert. PostgreSQL: nothing (row locks do it there)."""
    conn = s.connection()
    if conn.dialect.name != "sqlite":
        return
    raw: Any = conn.connection.dbapi_connection  # sqlite3.Connection
    if not raw.in_transaction:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _mib(n: int) -> str:
    return f"{n / r.MiB:,.1f} MiB"


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


def _new_rows(
    ids: Sequence[str], jobs: Sequence[tuple[str, r.JobRequest]], now: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows of newly queued ``jobs`` ((tenant, request), given ``ids``) and of their ``submit``
    events, for bulk inserts."""
    rows = [
        {**_job_values(req), "id": job_id, "tenant": tenant, "submitted_at": now, "updated_at": now}
        for job_id, (tenant, req) in zip(ids, jobs, strict=True)
    ]
    events = [
        {
            "job_id": job_id,
            "slice": None,
            "at": now,
            "kind": "submit",
            "message": f"submitted by {tenant}: {r.command_line(req.command)}",
            "tenant": tenant,
            "actor": None,
        }
        for job_id, (tenant, req) in zip(ids, jobs, strict=True)
    ]
    return rows, events


_INSERT_JOBS = insert(JobRow).returning(JobRow.seq, sort_by_parameter_order=True)
_INSERT_EVENTS = insert(EventRow)
_UNSET = (
    *("reason_code", "reason_message", "exit_code"),
    *("admitted_at", "started_at", "finished_at", "stop_kind"),
)


class _NewJob:
    """A job just inserted, as :func:`job_record` reads it (attributes only, hence read as a
    ``JobRow``): its row's values and its ``seq``, the columns a new job leaves unset None, as a
    ``JobRow`` built from them would say, without building one: the ORM's instrumented attributes
    cost more than the insert."""

    def __init__(self, row: dict[str, Any], seq: int) -> None:
        self.__dict__.update(dict.fromkeys(_UNSET), **row, seq=seq)


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
