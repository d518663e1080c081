"""The scheduling loop's writes: slice inventory, snapshots, decisions and attempt transitions.

Each method is one transaction, committed before the service acts on it (write, then act), and
each state change is a compare-and-set on the job's state, so a change the API made meanwhile (a
cancel) is never overwritten and a decision that no longer applies is dropped, not half-applied.

The loop's decisions are written in groups, one transaction per cycle and kind (``admit_all``,
``begin_stops``, ``launched_all``, ``running_all``, ``finish_all``, ``placed_all``): a group keeps
each member's compare-and-set and answers per member, in order (a member that no longer applies
is dropped alone; the others are written). Every grouped write of the loop is here. The
one-member methods (``admit``, ``begin_stop``, ...) are groups of one.

On a replica the store is fenced (``Store.fenced``): each transaction here passed the fence, and
what it writes carries its fencing token: every event (``Store.add_event``), and the attempt rows it
launches (``launch_term``) and ends (``end_term``), read from the transaction (``term_of``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from itertools import groupby, repeat
from operator import attrgetter
from types import SimpleNamespace
from typing import Any, TypeVar, cast

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    Table,
    bindparam,
    delete,
    false,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session

from tpufleet.control.cluster.protocol import AttemptStatus, SliceInfo
from tpufleet.control.store import logs
from tpufleet.control.store import values as r
from tpufleet.control.store.database import Database, term_of
from tpufleet.control.store.jobs import columns, life_of
from tpufleet.control.store.slices import state_of
from tpufleet.control.store.tables import AttemptRow, EventRow, JobRow, LogCursorRow, SliceRow, TenantRow
from tpufleet.errors import NotFoundError
from tpufleet.runtime import StepProgress
from tpufleet.scheduler import lifecycle as lc
from tpufleet.scheduler.model import (
    Admit,
    JobId,
    JobState,
    JobView,
    NotFit,
    Preempt,
    RunDecision,
    SliceName,
    SliceState,
    SliceView,
    Snapshot,
    TenantName,
    TenantView,
    Wait,
    Waits,
)

MISSING = "not in the cluster's inventory"
FULL_SYNC_S = 5.0  # an unchanged inventory is still synced whole this often (sync_slices)
LEFT = "left the fleet: its slice group was deleted"
ENDED = "left the fleet: every host ended on purpose"  # + Ray's why (SliceInfo.gone)
Stored = tuple[str | None, str | None, bool]  # a queued job's reason code, message, head of line
_Chunk = tuple[list[str], Stored]  # job ids that get one stored reason
_ID = attrgetter("id")
_JOBS = cast(Table, JobRow.__table__)
_SLICES = cast(Table, SliceRow.__table__)
_ATTEMPTS = cast(Table, AttemptRow.__table__)
# The columns a grouped compare-and-set finds as read: the row, what a transition reads of it, when.
_AS_READ = ("seq", "state", "attempt", "stop_kind", "cancel_requested", "preempting", "updated_at")
_TAKE = (  # an admission takes a slice only while it is free
    update(_SLICES)
    .where(_SLICES.c.name == bindparam("b_name"), _SLICES.c.state == r.FREE, _SLICES.c.holder.is_(None))
    .values(holder=bindparam("holder"), state=r.HELD, updated_at=bindparam("updated_at"))
)
_FREE = (  # an ended attempt gives its slices back
    update(_SLICES)
    .where(_SLICES.c.name == bindparam("b_name"))
    .values(holder=None, state=bindparam("state"), updated_at=bindparam("updated_at"))
)
_M = TypeVar("_M")
_A = TypeVar("_A")
_SYNCED = ("accelerator_type", "topology", "expected_hosts", "hosts", "problems", "updated_at", "state")
_IN_LIST = 500  # job ids per UPDATE of wait reasons (SQLite takes up to 32,766 parameters)


@dataclass(frozen=True)
class ActiveJob:
    """A job that holds slices (ADMITTED, STARTING or RUNNING), as the loop needs it."""

    id: str
    attempt: int
    state: str
    slices: tuple[str, ...]
    stop_kind: lc.StopKind | None
    cancel_requested: bool
    accelerator_type: str
    command: tuple[str, ...]
    env: dict[str, str]
    working_dir: str | None
    tenant: str = "default"
    admitted_at: float | None = None  # the current attempt's admission (the start timeout counts from it)
    kind: lc.JobKind = lc.JobKind.SPMD


@dataclass(frozen=True)
class FinalOutput:
    """The output read last from an attempt's hosts after its stop, stored with its end
    (``finish_all``): what was read, the streams that stay incomplete ``(job id, attempt, host,
    why)``, and the per-host cap."""

    outputs: tuple[logs.HostOutput, ...] = ()
    notes: tuple[tuple[str, int, int, str], ...] = ()
    cap: int | None = None


class Transitions:
    def __init__(self, store: Database) -> None:
        self.store = store
        self.clock = store.clock
        self._wording_turn = 0
        # One tuple object per distinct stored reason, so that an unchanged reason is the same
        # object as last cycle's and ``wait_reasons`` compares 100,000 of them by identity.
        self._canonical: dict[Stored, Stored] = {}
        # The stored tuple of each NotFit object seen (kept with it, so a reused id is not mistaken).
        self._said: dict[tuple[int, bool], tuple[NotFit, Stored]] = {}
        # The last sync_slices: what the cluster said (and the retired slices), the slices it
        # left, when (monotonic).
        self._synced: (
            tuple[tuple[tuple[SliceInfo, ...], frozenset[str]], dict[str, r.SliceRecord], float] | None
        ) = None

    @contextmanager
    def _group(self) -> Iterator[Session]:
        """The transaction of one grouped write: flushed once, at its commit (each member's
        statements would otherwise flush the events and rows the members before it added). It
        claims SQLite's write lock as soon as it is free, as every write of the loop does
        (``database.claim_write_lock``: the loop's writes free chips, the submits only queue)."""
        with self.store.tx(claim=True) as s, s.no_autoflush:
            yield s

    def _grouped(
        self, members: Sequence[_M], write: Callable[[Session, Sequence[_M], bool], list[_A]], *, unique: bool
    ) -> list[_A]:
        """One grouped write: ``write(s, members, alone=False)`` in one transaction, each kind's
        statements one executemany for all members; answers per member, in order. When a member
        changed since it was read (``_Raced``), or a job (or a slice) appears twice, the group is
        written again in one transaction a member at a time (``alone=True``: a member that no
        longer applies is dropped alone), each member's read seeing the ones before it."""
        if not members:
            return []
        if unique:
            try:
                with self._group() as s:
                    return write(s, members, False)
            except _Raced:
                pass
        with self._group() as s:
            return [write(s, [m], True)[0] for m in members]

    # -- inventory ---------------------------------------------------------------------------
    def sync_slices(
        self, infos: Iterable[SliceInfo], retired: Collection[str] = frozenset()
    ) -> list[r.SliceRecord]:
        """Make the slices table match the cluster: new slices appear FREE, a slice that is not
        intact (or vanished) turns BROKEN and stays so until it is whole again.

        A slice is discovered only from an alive host: Ray's node table keeps dead nodes long after
        their hosts went. ``retired``: the slices of deleted slice groups; whatever Ray still lists
        of one (hosts dying or dead), it is never discovered again, and its row leaves the table
        as soon as no attempt holds it. So does the row of a slice every host of which ended on
        purpose (``SliceInfo.gone``: drained as idle by an autoscaler's scale-in, drained for a
        preemption, stopped): it left, it is not broken, and it is discovered again only when a
        host of that name is alive again. Returns every slice as it is now, by name (what the
        loop reads next, without reading it again).

        While the cluster says exactly what it said at the last sync (and no slice is retired or
        gone with its row still here), nothing here would change: only what the admissions, the
        ends and the drains change (holder, state, draining) is read, for at most ``FULL_SYNC_S``
        before a whole sync."""
        infos = tuple(infos)
        last = self._synced
        if (
            not retired
            and last is not None
            and last[0] == (infos, frozenset())
            and not any(i.gone and i.name in last[1] for i in infos)  # its row is to leave
        ):
            kept = self._kept_slices(last[1])
            if kept is not None:
                return kept
        now = self.clock()
        changed: list[dict[str, Any]] = []
        records: list[r.SliceRecord] = []
        gone = {i.name: i.gone for i in infos if i.gone}
        with self.store.tx() as s:
            conn = s.connection()
            rows = {x.name: x for x in conn.execute(select(_SLICES))}  # columns, no ORM objects
            left = [n for n, x in rows.items() if (n in retired or n in gone) and x.holder is None]
            if left:
                conn.execute(delete(_SLICES).where(_SLICES.c.name.in_(left)))
            for name in left:
                del rows[name]
                why = LEFT if name in retired else f"{ENDED} ({gone[name]})"
                self.store.add_event(s, why, slice=name, kind="slice")
            for info in infos:
                row: Any = rows.pop(info.name, None)
                if row is None and (info.name in retired or not any(h.alive for h in info.hosts)):
                    continue
                hosts = [
                    {"worker_id": h.worker_id, "node_id": h.node_id, "address": h.address, "alive": h.alive}
                    for h in info.hosts
                ]
                if row is None:
                    new = {
                        "name": info.name,
                        "accelerator_type": info.accelerator_type,
                        "topology": info.topology,
                        "expected_hosts": info.expected_hosts,
                        "state": r.FREE,
                        "holder": None,
                        "hosts": hosts,
                        "problems": [],
                        "draining": False,
                        "updated_at": now,
                    }
                    conn.execute(insert(_SLICES).values(new))
                    self.store.add_event(
                        s, f"discovered {info.accelerator_type}", slice=info.name, kind="slice"
                    )
                    row = SimpleNamespace(**new)  # the row as inserted
                shape = (info.accelerator_type, info.topology, info.expected_hosts, hosts)
                records.append(self._sync_row(s, row, shape, list(info.problems), now, changed))
            for row in rows.values():
                shape = (row.accelerator_type, row.topology, row.expected_hosts, row.hosts)
                records.append(self._sync_row(s, row, shape, [MISSING], now, changed))
            if changed:  # only the slices that changed are written
                conn.execute(
                    update(_SLICES)
                    .where(_SLICES.c.name == bindparam("b_name"))
                    .values({k: bindparam(k) for k in _SYNCED}),
                    changed,
                )
        records.sort(key=attrgetter("name"))
        self._synced = ((infos, frozenset(retired)), {x.name: x for x in records}, time.monotonic())
        return records

    def _kept_slices(self, last: dict[str, r.SliceRecord]) -> list[r.SliceRecord] | None:
        """The slices of the last sync with their holder, state and draining read again; None when
        a whole sync is due (``FULL_SYNC_S``) or the table holds other slices than it left."""
        assert self._synced is not None
        if time.monotonic() - self._synced[2] > FULL_SYNC_S:
            return None
        return self._reread(last)

    def slices_again(self, slices: Sequence[r.SliceRecord]) -> list[r.SliceRecord]:
        """``slices`` (as ``sync_slices`` just returned them) with their holder, state and draining
        read again: what the endings and drains written since changed. Only the loop adds and
        removes slices, so the table holds the same ones (else they are synced again whole)."""
        last = {x.name: x for x in slices}
        kept = self._reread(last)
        if kept is not None:
            return kept
        assert self._synced is not None  # set by the sync that returned ``slices``
        infos, retired = self._synced[0]
        return self.sync_slices(infos, retired)

    def _reread(self, last: dict[str, r.SliceRecord]) -> list[r.SliceRecord] | None:
        query = select(_SLICES.c.name, _SLICES.c.state, _SLICES.c.holder, _SLICES.c.draining)
        with self.store.tx() as s:
            rows = s.connection().execute(query.order_by(_SLICES.c.name)).all()
        if len(rows) != len(last) or any(x.name not in last for x in rows):
            return None
        return [replace(last[x.name], state=x.state, holder=x.holder, draining=x.draining) for x in rows]

    def _sync_row(
        self,
        s: Session,
        row: Any,
        shape: tuple[str, str, int, list[Any]],
        problems: list[str],
        now: float,
        changed: list[dict[str, Any]],
    ) -> r.SliceRecord:
        """One slice's new shape and problems: an event when its problems changed, and its new
        columns into ``changed`` when any of them did; the slice as it is now."""
        updated_at = row.updated_at
        if row.problems != problems:
            updated_at = now
            what = "broken: " + "; ".join(problems) if problems else "intact again"
            self.store.add_event(s, what, slice=row.name, job_id=row.holder, kind="slice")
        state = state_of(problems, row.draining, row.holder)
        new = (*shape, problems, updated_at, state)
        old = (
            row.accelerator_type,
            row.topology,
            row.expected_hosts,
            row.hosts,
            row.problems,
            row.updated_at,
            row.state,
        )
        if new != old:
            changed.append({"b_name": row.name, **dict(zip(_SYNCED, new, strict=True))})
        accelerator_type, topology, _, hosts = shape
        return r.SliceRecord(
            name=row.name,
            accelerator_type=accelerator_type,
            topology=topology,
            state=state,
            holder=row.holder,
            hosts=tuple(hosts or ()),
            problems=tuple(problems),
            draining=row.draining,
        )

    # -- snapshot and decisions --------------------------------------------------------------
    def snapshot(self, slices: Sequence[r.SliceRecord] | None = None) -> tuple[Snapshot, dict[str, Stored]]:
        """The policy's view read whole from the store, and each queued job's stored wait reason
        and head-of-line flag (the first cycle, and the reference ``SchedState`` is checked against).
        ``slices``: the slices as ``sync_slices`` just left them (else read)."""
        views, reasons = self.job_views()
        return Snapshot(self.tenant_views(), self.slice_views(slices), views), reasons

    def tenant_views(self) -> list[TenantView]:
        """Every live tenant, read whole each cycle: a change (``tenant update``) counts from the
        next cycle; a deleted tenant is gone (its cancelled jobs still stopping hold their slices)."""
        query = select(TenantRow).where(TenantRow.deleted_at.is_(None))
        with self.store.tx() as s:
            rows = s.scalars(query)
            return [TenantView(TenantName(t.name), dict(t.quota), t.weight, t.preemption) for t in rows]

    def slice_views(self, slices: Sequence[r.SliceRecord] | None = None) -> list[SliceView]:
        """Every slice as the policy sees it, by name; from ``slices`` (by name) when given."""
        if slices is not None:
            return [
                SliceView(SliceName(x.name), x.accelerator_type, SliceState(x.state), _jid(x.holder))
                for x in slices
            ]
        query = select(SliceRow.name, SliceRow.accelerator_type, SliceRow.state, SliceRow.holder)
        with self.store.tx() as s:
            return [
                SliceView(SliceName(x.name), x.accelerator_type, SliceState(x.state), _jid(x.holder))
                for x in s.execute(query.order_by(SliceRow.name))
            ]

    def job_views(self, ids: Iterable[str] | None = None) -> tuple[list[JobView], dict[str, Stored]]:
        """Every job that is queued or holds slices (only those of ``ids`` when given), in
        submission order, as the policy sees it; and the queued ones' stored reasons."""
        query = select(*_VIEW_COLUMNS).where(JobRow.state.in_((r.QUEUED, *r.ACTIVE)))
        jobs: list[JobView] = []
        reasons: dict[str, Stored] = {}
        chunks = [None] if ids is None else _chunks(sorted(set(ids)), 2000)
        with self.store.tx() as s:
            for chunk in chunks:
                q = query if chunk is None else query.where(JobRow.id.in_(chunk))
                for j in s.execute(q.order_by(JobRow.seq)):
                    jobs.append(_view(j))
                    if j.state == r.QUEUED:
                        reasons[j.id] = self._canon((j.reason_code, j.reason_message, bool(j.head_of_line)))
        if ids is not None:
            jobs.sort(key=lambda v: v.seq)
        return jobs, reasons

    def last_event(self) -> int:
        with self.store.tx() as s:
            return int(s.scalar(select(func.max(EventRow.id))) or 0)

    def events_since(self, after: int, also: Iterable[int] = ()) -> list[tuple[int, str | None]]:
        """(event id, job id) of every event after ``after`` (and of the ids in ``also``)."""
        cond = EventRow.id > after
        extra = sorted(set(also))
        if extra:
            cond = or_(cond, EventRow.id.in_(extra))
        with self.store.tx() as s:
            return [
                (int(e.id), e.job_id) for e in s.execute(select(EventRow.id, EventRow.job_id).where(cond))
            ]

    def admit(self, d: Admit) -> bool:
        """QUEUED -> ADMITTED with the slices HELD; all or nothing. False when it no longer applies."""
        return self.admit_all([d])[0]

    def admit_all(self, decisions: Sequence[Admit]) -> list[bool]:
        """Every admission of a cycle in one transaction: each QUEUED -> ADMITTED with its slices
        HELD, all or nothing per admission (one that no longer applies is dropped alone, False)."""
        names = [n for d in decisions for n in d.slices]
        return self._grouped(
            decisions,
            self._admit,
            unique=len(set(names)) == len(names) and _distinct(d.job for d in decisions),
        )

    def _admit(self, s: Session, decisions: Sequence[Admit], alone: bool) -> list[bool]:
        """Admissions inside a group's transaction (``_grouped``). Written only when one applies
        whole: the slices are taken first (FREE -> HELD); when not all of them were free or the job
        changed since it was read, a lone admission gives them back in this transaction (no
        savepoint: SQLite's driver has none to offer inside a transaction it began itself) and a
        group raises ``_Raced``."""
        now = self.clock()
        conn = s.connection()
        jobs = _read_jobs(conn, [d.job for d in decisions])
        out: list[bool] = []
        todo: list[tuple[Admit, Any, lc.Life]] = []
        for d in decisions:
            job = jobs.get(d.job)
            life = _step(lc.admit, job)
            if life is not None:
                todo.append((d, job, life))
            out.append(life is not None)
        if not todo:
            return out
        taken = [{"b_name": n, "holder": d.job} for d, _, _ in todo for n in dict.fromkeys(d.slices)]
        got = _rowcount(conn.execute(_TAKE, [{**x, "updated_at": now} for x in taken]))
        admit_seq = s.scalar(select(func.max(JobRow.admit_seq))) or 0
        cas = [
            (
                job,
                {
                    **columns(life),
                    "slices": list(d.slices),
                    "borrowing": d.borrowing,
                    "admit_seq": admit_seq + i + 1,
                    "head_of_line": False,
                    "admitted_at": now,
                    "exit_code": None,
                    "updated_at": now,
                },
            )
            for i, (d, job, life) in enumerate(todo)
        ]
        if got != len(taken) and not alone:
            raise _Raced
        if got != len(taken) or not _cas_all(conn, cas, alone):
            d = todo[0][0]  # give back what this admission took: they were FREE a moment ago
            conn.execute(
                update(_SLICES)
                .where(_SLICES.c.name.in_(d.slices), _SLICES.c.holder == d.job, _SLICES.c.state == r.HELD)
                .values(holder=None, state=r.FREE)
            )
            return [False]
        conn.execute(
            insert(_ATTEMPTS),
            [
                {
                    "job_id": d.job,
                    "attempt": job.attempt,
                    "slices": list(d.slices),
                    "state": lc.AttemptState.ADMITTED,
                    "exit_codes": [],
                    "admitted_at": now,
                }
                for d, job, _ in todo
            ],
        )
        self.store.add_events(
            s,
            [
                {
                    "message": f"attempt {job.attempt} admitted on {', '.join(d.slices)}"
                    + (" (borrowing)" if d.borrowing else ""),
                    "job_id": d.job,
                    "kind": "admit",
                }
                for d, job, _ in todo
            ],
        )
        return out

    def wait_reasons(
        self, decisions: Sequence[RunDecision], stored: dict[str, Stored], *, refresh: int | None = None
    ) -> list[tuple[str, Stored]]:
        """Store why each waiting job waits (the ``Wait`` and ``Waits`` among ``decisions``); only
        reasons that changed are written (and returned).

        A job's first reason and any head-of-line flag (the policy reads it back next cycle) are
        always written at once. With ``refresh`` set, other changes are bounded: at most that many
        per call, new codes before new wordings of the same code (the numbers in a message move as
        the fleet does); half of the budget goes to the front of the queue (``decisions`` come in the
        policy's order), the other half in turn over the rest, so a long queue costs a bounded write
        and every stored reason catches up within a few calls.

        A run of waits (``Waits``) is compared a stretch at a time: its jobs' stored reasons are
        canonical tuples, mostly alike along the run, so one verdict covers each stretch of equal
        ones and no Python code runs per job.
        """
        now: list[_Chunk] = []
        codes: list[_Chunk] = []
        wordings: list[_Chunk] = []
        get = stored.get
        for d in decisions:
            if isinstance(d, Waits):
                ids: list[str] = list(map(_ID, d.jobs))
                new = self._stored_of(d.reason, False)
            elif isinstance(d, Wait):
                ids = [d.job]
                new = self._stored_of(d.reason, d.head_of_line)
            else:
                continue
            olds = list(map(get, ids))
            if olds.count(new) == len(olds):  # `is` first, then ==: all stored as they are now
                continue
            at = 0
            for old, stretch in groupby(olds):  # consecutive equal stored reasons: one verdict each
                size = _length(stretch)
                if old is not None and old != new:
                    if refresh is None or old[0] is None or old[2] != new[2]:
                        into = now
                    else:
                        into = codes if old[0] != new[0] else wordings
                    into.append((ids[at : at + size], new))
                at += size
        changes = _take(now, 0, None)
        if refresh is not None:  # the front of the rest, then a window over the others, in turn
            rest = codes + wordings
            total = sum(len(ids) for ids, _ in rest)
            front = min(refresh // 2, total)
            changes += _take(rest, 0, front)
            others = total - front
            if others:
                budget, start = refresh - front, self._wording_turn % others
                first = _take(rest, front + start, min(budget, others - start))
                changes += first + _take(rest, front, min(budget - len(first), start))
                self._wording_turn += budget
        if changes:
            self._write_reasons(changes)
        return changes

    def _write_reasons(self, changes: list[tuple[str, Stored]]) -> None:
        """One transaction, one statement per reason (most jobs share theirs with many others) and
        per ``_IN_LIST`` of its jobs, sent straight to the driver: per row, SQLAlchemy's parameter
        processing, and PostgreSQL's work on a statement per row, cost more than the rows do."""
        jobs: dict[Stored, list[str]] = {}
        for job, stored in changes:
            jobs.setdefault(stored, []).append(job)
        with self.store.tx_unsynced(claim=True) as conn:  # the loop writes them again if they are lost
            mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
            queued = str(r.QUEUED)
            for (code, message, head), ids in jobs.items():
                for first in range(0, len(ids), _IN_LIST):
                    some = ids[first : first + _IN_LIST]
                    # ``state || ''``: a test no index serves, so that SQLite finds the rows by id
                    # (it would otherwise read every queued job through the index on state).
                    statement = (
                        f"UPDATE jobs SET reason_code = {mark}, reason_message = {mark}, "
                        f"head_of_line = {mark} WHERE id IN ({', '.join([mark] * len(some))}) "
                        f"AND state || '' = {mark}"
                    )
                    conn.exec_driver_sql(statement, (code, message, head, *some, queued))

    def _stored_of(self, reason: NotFit, head_of_line: bool) -> Stored:
        """The canonical stored tuple of a reason (one object per reason and flag, so that most
        comparisons with what is stored are ``is``)."""
        found = self._said.get((id(reason), head_of_line))
        if found is None or found[0] is not reason:
            stored = self._canon((reason.code.value, reason.message, head_of_line))
            found = self._said[(id(reason), head_of_line)] = (reason, stored)
        return found[1]

    def _canon(self, stored: Stored) -> Stored:
        """The one tuple kept for this reason (the table is emptied once it holds 100,000)."""
        found = self._canonical.get(stored)
        if found is None:
            if len(self._canonical) >= 100_000:  # old wordings; equal tuples still compare equal
                self._canonical.clear()
                self._said.clear()
            found = self._canonical[stored] = stored
        return found

    def preempt(self, d: Preempt) -> bool:
        return self.preempt_all([d])[0]

    def preempt_all(self, decisions: Sequence[Preempt]) -> list[bool]:
        """Every preemption of a cycle, one transaction (``begin_stops``)."""
        return self.begin_stops([_preemption(d) for d in decisions])

    def begin_stop(self, job_id: str, kind: lc.StopKind, message: str) -> bool:
        """Decide to end the current attempt (``lifecycle.request_stop``: the first decision stands,
        a cancel overrides a preemption or failure under way). False when it changes nothing."""
        return self.begin_stops([(job_id, kind, message)])[0]

    def begin_stops(self, stops: Sequence[tuple[str, lc.StopKind, str]]) -> list[bool]:
        """Each ``(job id, kind, message)`` as ``begin_stop``, all in one transaction, in order:
        True for each stop written, False for each that changed nothing (one on record won)."""
        return self._grouped(stops, self._begin_stops, unique=_distinct(job for job, _, _ in stops))

    def _begin_stops(
        self, s: Session, stops: Sequence[tuple[str, lc.StopKind, str]], alone: bool
    ) -> list[bool]:
        now = self.clock()
        conn = s.connection()
        jobs = _read_jobs(conn, [job_id for job_id, _, _ in stops])
        out: list[bool] = []
        cas: list[tuple[Any, dict[str, Any]]] = []
        events: list[dict[str, Any]] = []
        for job_id, kind, message in stops:
            job: Any = jobs.get(job_id)
            life = _step(lc.request_stop, job, kind, message)
            out.append(life is not None)
            if life is None:
                continue
            cas.append((job, {**columns(life), "updated_at": now}))
            events.append(
                {
                    "message": f"attempt {job.attempt}: {message}",
                    "job_id": job_id,
                    "kind": str(kind),
                    "tenant": job.tenant,
                    # preemptions are audited
                    "actor": "scheduler" if kind in (lc.StopKind.PREEMPT, lc.StopKind.PRIORITY) else None,
                }
            )
        if not _cas_all(conn, cas, alone):
            return [False]
        self.store.add_events(s, events)
        return out

    # -- attempt transitions -----------------------------------------------------------------
    def active_jobs(
        self, *, cancelling_or: Collection[str] | None = None, only: Collection[str] | None = None
    ) -> list[ActiveJob]:
        """Every job that holds slices, in submission order (read as columns: no ORM objects).
        ``cancelling_or``: only those whose cancel was asked for, and those of these ids;
        ``only``: only those of these ids."""
        query = select(*_ACTIVE_COLUMNS).where(JobRow.state.in_(r.ACTIVE)).order_by(JobRow.seq)
        if cancelling_or is not None or only is not None:
            wanted: ColumnElement[bool] = (
                JobRow.cancel_requested.is_(True) if cancelling_or is not None else false()
            )
            for chunk in _chunks(sorted({*(cancelling_or or ()), *(only or ())}), _IN_LIST):
                wanted = or_(wanted, JobRow.id.in_(chunk))
            query = query.where(wanted)
        with self.store.tx() as s:
            return [
                ActiveJob(
                    j.id,
                    j.attempt,
                    j.state,
                    tuple(j.slices or ()),
                    lc.StopKind(j.stop_kind) if j.stop_kind else None,
                    j.cancel_requested,
                    j.accelerator_type,
                    tuple(j.command),
                    dict(j.env or {}),
                    j.working_dir,
                    j.tenant,
                    j.admitted_at,
                    lc.JobKind(j.kind or lc.JobKind.SPMD),
                )
                for j in s.execute(query)
            ]

    def launched(self, job_id: str, attempt: int) -> None:
        """ADMITTED -> STARTING; opens one log stream per host (slice order, then worker id)."""
        self.launched_all([(job_id, attempt)])

    def launched_all(
        self, keys: Sequence[tuple[str, int]], running: Collection[tuple[str, int]] = frozenset()
    ) -> list[bool]:
        """Each attempt's ``launched``, all in one transaction; True for each that moved. Those of
        ``running`` (every host already ran when the launch was first looked at) move on to
        RUNNING in that same transaction, as ``running_all`` would move them."""
        return self._grouped(
            keys,
            lambda s, members, alone: self._launched(s, members, alone, running),
            unique=_distinct(job for job, _ in keys),
        )

    def _launched(
        self, s: Session, keys: Sequence[tuple[str, int]], alone: bool, running: Collection[tuple[str, int]]
    ) -> list[bool]:
        conn = s.connection()
        now = self.clock()
        # a launch whose hosts all ran at its first look goes on to RUNNING (True), the rest STARTING
        mark = {
            False: {"state": r.STARTING, "updated_at": now},
            True: {"state": r.RUNNING, "started_at": now, "updated_at": now},
        }
        moving = _move(conn, keys, alone, r.ADMITTED, lambda job: mark[(job.id, job.attempt) in running])
        if not moving:
            return [False] * len(keys)
        runs = {job.id for job in moving if (job.id, job.attempt) in running}
        names = {n for job in moving for n in job.slices}
        query = select(_SLICES.c.name, _SLICES.c.expected_hosts).where(_SLICES.c.name.in_(names))
        sizes = {name: hosts for name, hosts in conn.execute(query)}
        layouts = {
            job.id: [(name, worker) for name in job.slices for worker in range(sizes.get(name, 1))]
            for job in moving
        }
        logs.open_streams_of(conn, [(job.id, job.attempt, layouts[job.id]) for job in moving])
        term = term_of(s)
        _update_attempts(
            conn,
            [
                (job.id, job.attempt, {"state": r.RUNNING, "launch_term": term, "started_at": now})
                if job.id in runs
                else (job.id, job.attempt, {"state": r.STARTING, "launch_term": term})
                for job in moving
            ],
        )
        events = [
            {
                "message": f"attempt {job.attempt} launched on {len(layouts[job.id])} hosts",
                "job_id": job.id,
                "kind": "launch",
            }
            for job in moving
        ]
        events += [_run_event(job) for job in moving if job.id in runs]
        self.store.add_events(s, events)
        moved = {job.id for job in moving}
        return [j in moved for j, _ in keys]

    def running(self, job_id: str, attempt: int) -> None:
        self.running_all([(job_id, attempt)])

    def running_all(self, keys: Sequence[tuple[str, int]]) -> list[bool]:
        """STARTING -> RUNNING for each attempt (every host runs), in one transaction."""
        return self._grouped(keys, self._running, unique=_distinct(job for job, _ in keys))

    def _running(self, s: Session, keys: Sequence[tuple[str, int]], alone: bool) -> list[bool]:
        now = self.clock()
        conn = s.connection()
        moving = _move(
            conn, keys, alone, r.STARTING, {"state": r.RUNNING, "started_at": now, "updated_at": now}
        )
        if not moving:
            return [False] * len(keys)
        _update_attempts(
            conn, [(job.id, job.attempt, {"state": r.RUNNING, "started_at": now}) for job in moving]
        )
        self.store.add_events(s, [_run_event(job) for job in moving])
        moved = {job.id for job in moving}
        return [j in moved for j, _ in keys]

    def finish(self, job_id: str, attempt: int, status: AttemptStatus | None) -> str | None:
        """End the current attempt after its processes ended (``lifecycle.end_attempt``: SUCCEEDED,
        or what its stop kind says). Frees the job's slices. Returns the job's new state."""
        return self.finish_all([(job_id, attempt, status)])[0]

    def finish_all(
        self,
        ends: Sequence[tuple[str, int, AttemptStatus | None]],
        output: Mapping[tuple[str, int], FinalOutput] | None = None,
    ) -> list[str | None]:
        """Each ``(job id, attempt, final status)`` as ``finish``, all in one transaction, with the
        final ``output`` of each attempt that ends (``FinalOutput``); each job's new state, None
        for one that changed nothing (its output is not stored: its stop is issued again)."""
        write = partial(self._finish, output=output or {})
        return self._grouped(ends, write, unique=_distinct(job for job, _, _ in ends))

    def _finish(
        self,
        s: Session,
        ends: Sequence[tuple[str, int, AttemptStatus | None]],
        alone: bool,
        *,
        output: Mapping[tuple[str, int], FinalOutput],
    ) -> list[str | None]:
        now = self.clock()
        conn = s.connection()
        jobs = _read_jobs(conn, [job_id for job_id, _, _ in ends])
        out: list[str | None] = []
        cas: list[tuple[Any, dict[str, Any]]] = []
        ended: list[tuple[Any, int, AttemptStatus | None, lc.Life, lc.AttemptState]] = []
        for job_id, attempt, status in ends:
            job: Any = jobs.get(job_id)
            step = _step(lc.end_attempt, job) if job is not None and job.attempt == attempt else None
            out.append(None if step is None else str(step[0].state))
            if step is None:
                continue
            life, recorded = step
            ended.append((job, attempt, status, life, recorded))
            cas.append(
                (
                    job,
                    {
                        **columns(life),
                        "slices": [] if life.state == r.QUEUED else list(job.slices),
                        "borrowing": job.borrowing and life.terminal,  # a finished job keeps its last facts
                        "finished_at": now if life.terminal else None,
                        "exit_code": _exit_code(status),
                        "updated_at": now,
                    },
                )
            )
        if not _cas_all(conn, cas, alone):
            return [None]
        if not ended:
            return out
        final = [output[(job.id, attempt)] for job, attempt, *_ in ended if (job.id, attempt) in output]
        for cap, run in groupby(final, key=attrgetter("cap")):
            logs.append_many(conn, [o for f in run for o in f.outputs], cap)
        logs.close_many(conn, [note for f in final for note in f.notes])
        held = conn.execute(
            select(_SLICES.c.name, _SLICES.c.problems, _SLICES.c.draining).where(
                _SLICES.c.holder.in_([job.id for job, *_ in ended])
            )
        ).all()
        if held:
            conn.execute(
                _FREE,
                [
                    {"b_name": x.name, "state": state_of(x.problems, x.draining, None), "updated_at": now}
                    for x in held
                ],
            )
        term = term_of(s)
        _update_attempts(
            conn,
            [
                (
                    job.id,
                    attempt,
                    {
                        "state": recorded,
                        "message": job.stop_message,
                        "ended_at": now,
                        "end_term": term,
                        "exit_codes": _host_codes(status),
                        **progress_columns(status.progress if status else None),
                    },
                )
                for job, attempt, status, _, recorded in ended
            ],
        )
        self.store.add_events(
            s,
            [
                {
                    "message": f"attempt {attempt} {recorded.lower()}; job {life.state}",
                    "job_id": job.id,
                    "kind": "end",
                }
                for job, attempt, _, life, recorded in ended
            ],
        )
        return out

    def placed(self, job_id: str, attempt: int, where: Sequence[str]) -> None:
        """A Ray job's trainer is placed: say where, as an event on the job."""
        self.placed_all([(job_id, attempt, where)])

    def placed_all(self, placements: Sequence[tuple[str, int, Sequence[str]]]) -> None:
        """Each ``placed``, as events in one transaction."""
        if not placements:
            return
        with self._group() as s:
            for job_id, attempt, where in placements:
                what = (
                    f"attempt {attempt}: Ray Train's placement groups are on {', '.join(where)}, as admitted"
                )
                self.store.add_event(s, what, job_id=job_id, kind="placed")

    def record_progress(self, reports: Sequence[tuple[str, int, StepProgress]]) -> None:
        """Store the steps process 0 of each attempt reported (one statement for all of them)."""
        if not reports:
            return
        table = cast(Table, AttemptRow.__table__)
        statement = (
            update(table)
            .where(table.c.job_id == bindparam("jid"), table.c.attempt == bindparam("att"))
            .values(
                first_step=bindparam("fs"),
                first_step_at=bindparam("fa"),
                last_step=bindparam("ls"),
                last_step_at=bindparam("la"),
            )
        )
        rows = [
            {"jid": j, "att": a, "fs": p.first_step, "fa": p.first_at, "ls": p.step, "la": p.at}
            for j, a, p in reports
        ]
        with self.store.tx() as s:
            s.connection().execute(statement, rows)

    # -- logs ----------------------------------------------------------------------------------
    def cursors(self, job_id: str, attempt: int) -> list[logs.Cursor]:
        with self.store.tx() as s:
            return logs.cursors(s, job_id, attempt)

    def cursors_of(self, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], list[logs.Cursor]]:
        """The log streams of many attempts, in one query."""
        wanted = set(keys)
        out: dict[tuple[str, int], list[logs.Cursor]] = {key: [] for key in wanted}
        streams = cast(Table, LogCursorRow.__table__)
        with self.store.tx() as s:
            for chunk in _chunks(sorted({job for job, _ in wanted}), _IN_LIST):
                query = select(*streams.c).where(streams.c.job_id.in_(chunk))
                for row in s.connection().execute(
                    query.order_by(streams.c.job_id, streams.c.attempt, streams.c.host)
                ):
                    if (row.job_id, row.attempt) in wanted:
                        out[(row.job_id, row.attempt)].append(logs.cursor_of(row))
        return out

    def append_log(
        self,
        job_id: str,
        attempt: int,
        host: int,
        data: str,
        offset: int,
        complete: bool,
        cap: int | None = None,
        from_offset: int | None = None,
    ) -> logs.Cursor:
        return self.append_logs(
            [logs.HostOutput(job_id, attempt, host, data, offset, complete, from_offset)], cap
        )[0]

    def append_logs(self, outputs: Sequence[logs.HostOutput], cap: int | None = None) -> list[logs.Cursor]:
        """Hosts' output read from the cluster, each as ``logs.append``, in one transaction; the
        cursor after each."""
        with self.store.tx(claim=True) as s:
            cursors = logs.append_many(s.connection(), outputs, cap)
        missing = [o for o, c in zip(outputs, cursors, strict=True) if c is None]
        if missing:
            o = missing[0]
            raise NotFoundError(f"job {o.job_id} attempt {o.attempt} has no log stream {o.host}")
        return [c for c in cursors if c is not None]

    def close_log(self, job_id: str, attempt: int, host: int, note: str) -> None:
        self.close_logs([(job_id, attempt, host, note)])

    def close_logs(self, notes: Sequence[tuple[str, int, int, str]]) -> None:
        """Streams that will not be read to their end, ``(job id, attempt, host, why)``: complete."""
        if notes:
            with self.store.tx() as s:
                logs.close_many(s.connection(), notes)


def _preemption(d: Preempt) -> tuple[str, lc.StopKind, str]:
    kind = lc.StopKind.PRIORITY if d.within_tenant else lc.StopKind.PREEMPT
    return d.job, kind, f"preempted for job {d.for_job}: {d.reason}"


_WRITE_COLUMNS = (
    JobRow.seq,
    JobRow.id,
    JobRow.tenant,
    JobRow.attempt,
    JobRow.state,
    JobRow.updated_at,
    JobRow.failures,
    JobRow.max_retries,
    JobRow.stop_kind,
    JobRow.stop_message,
    JobRow.cancel_requested,
    JobRow.preempting,
    JobRow.reason_code,
    JobRow.reason_message,
    JobRow.slices,
    JobRow.borrowing,
)
_ACTIVE_COLUMNS = (
    JobRow.id,
    JobRow.attempt,
    JobRow.state,
    JobRow.slices,
    JobRow.stop_kind,
    JobRow.cancel_requested,
    JobRow.accelerator_type,
    JobRow.command,
    JobRow.env,
    JobRow.working_dir,
    JobRow.tenant,
    JobRow.admitted_at,
    JobRow.kind,
)
_VIEW_COLUMNS = (
    JobRow.id,
    JobRow.tenant,
    JobRow.accelerator_type,
    JobRow.num_slices,
    JobRow.priority,
    JobRow.seq,
    JobRow.state,
    JobRow.slices,
    JobRow.borrowing,
    JobRow.stop_kind,
    JobRow.admit_seq,
    JobRow.reason_code,
    JobRow.reason_message,
    JobRow.head_of_line,
)


def _view(j: Any) -> JobView:
    """A job row (the ``_VIEW_COLUMNS``) as the policy sees it."""
    return JobView(
        JobId(j.id),
        TenantName(j.tenant),
        j.accelerator_type,
        j.num_slices,
        j.priority,
        j.seq,
        JobState(j.state),
        tuple(SliceName(n) for n in j.slices or ()),
        j.borrowing,
        j.stop_kind is not None,
        j.admit_seq,
        bool(j.head_of_line),
        j.stop_kind == lc.StopKind.PRIORITY,
    )


def _length(items: Iterator[object]) -> int:
    """How many items an iterator yields (consumes it, in C)."""
    return len(list(items))


def _take(chunks: list[_Chunk], start: int, count: int | None) -> list[tuple[str, Stored]]:
    """(job id, stored reason) for the jobs ``[start, start + count)`` of the chunks, in order
    (to the end when ``count`` is None); the chunks before ``start`` are skipped whole."""
    out: list[tuple[str, Stored]] = []
    for ids, new in chunks:
        if count is not None and count <= 0:
            break
        if start >= len(ids):
            start -= len(ids)
            continue
        part = ids[start:] if count is None else ids[start : start + count]
        out += zip(part, repeat(new))
        start = 0
        if count is not None:
            count -= len(part)
    return out


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _jid(holder: str | None) -> JobId | None:
    return JobId(holder) if holder else None


class _Raced(Exception):
    """A grouped write found a member changed since its read (another writer came between): the
    group's transaction is rolled back and written again a member at a time (``_grouped``)."""


def _distinct(job_ids: Iterable[str]) -> bool:
    ids = list(job_ids)
    return len(set(ids)) == len(ids)


def _step(transition: Callable[..., Any], job: Any, *args: Any) -> Any:
    """``transition`` (a ``lifecycle`` function) applied to a read job; None when there is no
    job, the transition is illegal, or (``request_stop``) it changes nothing."""
    if job is None:
        return None
    try:
        return transition(life_of(job), *args)
    except lc.IllegalTransition:
        return None


def _read_jobs(conn: Connection, job_ids: Sequence[str]) -> dict[str, Any]:
    """The columns a grouped write needs of each job (its lifecycle, what it holds, and the row's
    version: ``seq``, ``state``, ``updated_at``), by id, in one query per 500."""
    out: dict[str, Any] = {}
    for chunk in _chunks(list(dict.fromkeys(job_ids)), _IN_LIST):
        out.update((j.id, j) for j in conn.execute(select(*_WRITE_COLUMNS).where(JobRow.id.in_(chunk))))
    return out


def _cas_all(conn: Connection, members: Sequence[tuple[Any, dict[str, Any]]], alone: bool) -> bool:
    """Compare-and-set each job (read by ``_read_jobs``) to its values, in one executemany: each
    row is updated only while it is as read (``_AS_READ``: what its transition was computed from,
    and ``updated_at``), so a cancel or any other write that came between wins. True when every
    member's row was updated; else a group raises ``_Raced`` (``_grouped`` writes it again a member
    at a time) and a lone member answers False. Members are written in runs of equal columns."""
    done = 0
    for keys, run in groupby(members, key=lambda m: tuple(m[1])):
        rows = [{**{f"b_{c}": getattr(job, c) for c in _AS_READ}, **values} for job, values in run]
        statement = update(_JOBS).where(*(_same(c) for c in _AS_READ)).values({k: bindparam(k) for k in keys})
        done += _rowcount(conn.execute(statement, rows))
    if done != len(members) and not alone:
        raise _Raced
    return done == len(members)


def _move(
    conn: Connection,
    keys: Sequence[tuple[str, int]],
    alone: bool,
    state: str,
    values: dict[str, Any] | Callable[[Any], dict[str, Any]],
) -> list[Any] | None:
    """The jobs of ``keys`` (id, attempt) that are at that attempt in ``state``, each set to
    ``values`` (or ``values(job)``, a job's own; ``_cas_all`` writes one statement per set of
    columns, the members ordered by it); None when a lone member's row changed since it was read."""
    jobs = _read_jobs(conn, [job_id for job_id, _ in keys])
    moving = [jobs[j] for j, a in keys if j in jobs and jobs[j].attempt == a and jobs[j].state == state]
    members = [(job, values(job) if callable(values) else values) for job in moving]
    members.sort(key=lambda member: tuple(member[1]))  # stable: one set of columns keeps its order
    return moving if _cas_all(conn, members, alone) else None


def _run_event(job: Any) -> dict[str, Any]:
    return {"message": f"attempt {job.attempt}: every host is running", "job_id": job.id, "kind": "run"}


def _same(column: str) -> ColumnElement[bool]:
    """``column`` as read: ``=`` (the row is found by its primary key's index), ``IS NOT DISTINCT
    FROM`` for the one that may be NULL."""
    read: BindParameter[Any] = bindparam(f"b_{column}")
    return _JOBS.c[column].is_not_distinct_from(read) if column == "stop_kind" else _JOBS.c[column] == read


def _rowcount(result: Any) -> int:
    return int(result.rowcount)


def _update_attempts(conn: Connection, rows: Sequence[tuple[str, int, dict[str, Any]]]) -> None:
    """Set columns of attempt rows (a missing row is left alone), an executemany per run of rows
    that set the same columns."""
    for keys, run in groupby(rows, key=lambda x: tuple(x[2])):
        statement = (
            update(_ATTEMPTS)
            .where(_ATTEMPTS.c.job_id == bindparam("b_job"), _ATTEMPTS.c.attempt == bindparam("b_attempt"))
            .values({k: bindparam(k) for k in keys})
        )
        conn.execute(statement, [{"b_job": j, "b_attempt": a, **values} for j, a, values in run])


def _exit_code(status: AttemptStatus | None) -> int | None:
    codes = [h.exit_code for h in (status.hosts if status else ()) if h.exit_code is not None]
    bad = [c for c in codes if c != 0]
    return bad[0] if bad else (0 if codes else None)


def progress_columns(progress: StepProgress | None) -> dict[str, Any]:
    """An attempt's progress columns; nothing when there is no report (the stored one stays)."""
    if progress is None:
        return {}
    return {
        "first_step": progress.first_step,
        "first_step_at": progress.first_at,
        "last_step": progress.step,
        "last_step_at": progress.at,
    }


def _host_codes(status: AttemptStatus | None) -> list[dict[str, Any]]:
    return [
        {"slice": h.slice, "worker_id": h.worker_id, "state": str(h.state), "exit_code": h.exit_code}
        for h in (status.hosts if status else ())
    ]
