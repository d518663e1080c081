"""Operating tenants: create, update, soft-delete; composed into
:class:`~tpufleet.control.store.facade.Store` as ``store.tenants``.

Rules (``docs/control-plane.md``, "Operating tenants"):

- A change to a tenant's quota, weight or preemption setting is stored at once and used from the
  scheduling loop's next cycle (the loop reads tenants whole every cycle). Lowering a quota below
  what the tenant holds stops nothing: its most recently admitted jobs beyond the new quota are
  marked as borrowing, so another tenant's in-quota job may reclaim those slices (preemption with
  checkpoint signal and grace, requeue without using a retry) - exactly as for any borrower.
- Deleting a tenant is refused while it has queued or running jobs, unless forced: then its jobs
  are cancelled (the path of ``tpufleet cancel``) and the tenant is deleted at once; it shows as
  ``deleting`` until the last of them ended, then ``deleted``. Deletion is soft: its jobs,
  attempts, logs and events stay readable to the admin, its tokens are revoked, and its name stays
  taken (a new tenant of that name is refused).
- Every change is an event with ``actor`` (``admin``, a token id, ``scheduler`` for preemptions)
  and ``tenant``: the audit log (``Database.audit_events``). A new tenant's first token is made in
  the same transaction (``tokens.add_token``).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tpufleet import catalog
from tpufleet.control.store import checkpoints
from tpufleet.control.store import values as r
from tpufleet.control.store.database import Database
from tpufleet.control.store.jobs import JobStore
from tpufleet.control.store.lookup import live_tenant_row, tenant_row
from tpufleet.control.store.tables import EventRow, JobRow, TenantRow
from tpufleet.control.store.tokens import add_token, revoke_all
from tpufleet.errors import ConflictError, NotFoundError
from tpufleet.scheduler import lifecycle as lc

__all__ = ["TenantStore"]

_DELETE_CHUNK = 5000  # queued jobs cancelled per statement by a forced delete


class TenantStore:
    """Tenants in the database ``db``; a forced delete cancels their running jobs through ``jobs``
    (the path of ``tpufleet cancel``)."""

    def __init__(self, db: Database, jobs: JobStore) -> None:
        self._db = db
        self._jobs = jobs

    # -- tenants -----------------------------------------------------------------------------
    def create(
        self,
        name: str,
        quota: Mapping[str, int],
        weight: float = 1.0,
        preemption: str = r.PREEMPTION_MODES[0],
        *,
        actor: str = "admin",
    ) -> tuple[r.TenantRecord, str]:
        """Create a tenant; returns it and its ``jobs`` token (shown once). The name of a deleted
        tenant stays taken (its jobs and events keep it)."""
        clean = r.validate_tenant(name, quota, weight)
        r.check_preemption(preemption)
        try:
            with self._db.tx() as s:
                old = s.get(TenantRow, name)
                if old is not None and old.deleted_at is not None:
                    raise ConflictError(
                        f"tenant {name!r} was deleted; its jobs and events keep the name, so it is not "
                        "reused: choose another name"
                    )
                if old is not None:
                    raise ConflictError(f"tenant {name!r} already exists")
                row = TenantRow(
                    name=name,
                    quota=clean,
                    weight=float(weight),
                    preemption=preemption,
                    created_at=self._db.clock(),
                    deleted_at=None,
                )
                s.add(row)
                s.flush()
                token_row, token = add_token(s, name, r.JOBS_SCOPE, self._db.clock())
                self._db.add_event(
                    s,
                    f"tenant {name} created: quota {_quota_text(clean)}, weight {float(weight):g}, "
                    f"preemption {preemption}; token {token_row.id}",
                    kind="tenant",
                    tenant=name,
                    actor=actor,
                )
        except IntegrityError as err:
            raise ConflictError(f"tenant {name!r} already exists") from err
        return _tenant(row), token

    def all(self, *, include_deleted: bool = False) -> list[r.TenantRecord]:
        """Live tenants by name; with ``include_deleted`` the deleted ones too (state ``deleting``
        while jobs of theirs still stop, then ``deleted``)."""
        query = select(TenantRow).order_by(TenantRow.name)
        if not include_deleted:
            query = query.where(TenantRow.deleted_at.is_(None))
        with self._db.tx() as s:
            rows = list(s.scalars(query))
            busy = _busy_deleted(s) if include_deleted else set()
            usage = checkpoints.usage_of(s, [t.name for t in rows], self._db.limits.checkpoint_quota_bytes)
            return [_tenant(t, t.name in busy, usage[t.name]) for t in rows]

    def get(self, name: str) -> r.TenantRecord:
        """A tenant, live or deleted (``state`` says which)."""
        with self._db.tx() as s:
            row = tenant_row(s, name)
            usage = checkpoints.usage_of(s, [row.name], self._db.limits.checkpoint_quota_bytes)[row.name]
            return _tenant(row, row.deleted_at is not None and row.name in _busy_deleted(s, name), usage)

    def update(
        self,
        name: str,
        *,
        quota: Mapping[str, int] | None = None,
        weight: float | None = None,
        preemption: str | None = None,
        actor: str = "admin",
    ) -> r.TenantRecord:
        """Change a live tenant. ``quota`` is merged per generation (a generation given 0 is
        removed: nominal 0 is what a missing one means); the loop uses it from its next cycle.
        Running work is never stopped by this: see the module docstring."""
        given = r.check_quota(quota) if quota is not None else {}
        if weight is not None:
            r.check_weight(weight)
        if preemption is not None:
            r.check_preemption(preemption)
        with self._db.tx() as s:
            row = live_tenant_row(s, name)
            before = (dict(row.quota), row.weight, row.preemption)
            new_quota = {g: c for g, c in {**row.quota, **given}.items() if c}
            after = (
                new_quota,
                float(weight) if weight is not None else row.weight,
                preemption or row.preemption,
            )
            changes = _changes(before, after)
            if not changes:
                return _tenant(row)
            row.quota, row.weight, row.preemption = after
            self._db.add_event(
                s, f"tenant {name} updated: {'; '.join(changes)}", kind="tenant", tenant=name, actor=actor
            )
            lowered = {g for g, c in before[0].items() if new_quota.get(g, 0) < c}
            if lowered:
                self._mark_excess_borrowed(s, name, new_quota, lowered, actor)
            return _tenant(row)

    def _mark_excess_borrowed(
        self, s: Session, tenant: str, quota: dict[str, int], gens: set[str], actor: str
    ) -> None:
        """After a quota was lowered: the tenant's in-quota active jobs beyond it, most recently
        admitted first, count as borrowing from now on (reclaimable; nothing is stopped)."""
        rows = s.execute(
            select(JobRow.seq, JobRow.id, JobRow.accelerator_type, JobRow.num_slices)
            .where(JobRow.tenant == tenant, JobRow.state.in_(r.ACTIVE), JobRow.borrowing.is_(False))
            .order_by(JobRow.admit_seq.desc(), JobRow.seq.desc())
        ).all()
        held: dict[str, int] = {}
        jobs: list[tuple[int, str, str, int]] = []
        for seq, job_id, acc, n in rows:
            gen, chips = _gen_chips(acc, n)
            if gen in gens:
                held[gen] = held.get(gen, 0) + chips
                jobs.append((seq, job_id, gen, chips))
        for seq, job_id, gen, chips in jobs:  # most recently admitted first
            if held[gen] <= quota.get(gen, 0):
                continue
            s.execute(
                update(JobRow)
                .where(JobRow.seq == seq, JobRow.state.in_(r.ACTIVE))
                .values(borrowing=True, updated_at=self._db.clock())
                .execution_options(synchronize_session=False)
            )
            held[gen] -= chips
            self._db.add_event(
                s,
                f"now borrowing: {tenant}'s {gen} quota is {quota.get(gen, 0)} chips; another tenant's "
                "in-quota job may reclaim its slices",
                job_id=job_id,
                kind="borrowing",
                tenant=tenant,
                actor=actor,
            )

    def delete(self, name: str, *, force: bool = False, actor: str = "admin") -> tuple[r.TenantRecord, int]:
        """Soft-delete a tenant. Refused (ConflictError naming the counts) while it has queued or
        running jobs, unless ``force``: then they are cancelled. Returns the tenant (``deleting``
        until its cancelled jobs ended) and how many jobs this call cancelled. Deleting a deleted
        tenant again (with ``force``) cancels whatever of it is left."""
        with self._db.tx() as s:
            row = tenant_row(s, name)
            s.refresh(row, with_for_update=True)  # PostgreSQL: one delete at a time, after any submit
            queued, active = _job_counts(s, name)
            if (queued or active) and not force:
                raise ConflictError(
                    f"tenant {name} has {_jobs_text(queued, active)}; cancel them first, or delete with "
                    "--force (cancels them: checkpoint signal, grace period, then delete)"
                )
            if row.deleted_at is None:
                now = self._db.clock()
                row.deleted_at = now
                revoked = revoke_all(s, name, now)
                cancelling = f"; cancelling {_jobs_text(queued, active)}" if queued or active else ""
                self._db.add_event(
                    s,
                    f"tenant {name} deleted; {revoked} token(s) revoked{cancelling}",
                    kind="tenant",
                    tenant=name,
                    actor=actor,
                )
        cancelled = self._cancel_queued(name, actor) if force else 0
        if force:
            with self._db.tx() as s:
                live = list(
                    s.scalars(select(JobRow.id).where(JobRow.tenant == name, JobRow.state.in_(r.ACTIVE)))
                )
            for job_id in live:
                try:
                    job = self._jobs.request_cancel(job_id, actor=actor)
                except (ConflictError, NotFoundError):  # ended meanwhile
                    continue
                cancelled += job.cancel_requested
        return self.get(name), cancelled

    def _cancel_queued(self, tenant: str, actor: str) -> int:
        """Cancel every queued job of ``tenant`` (``lifecycle.request_cancel`` of a queued job: it
        ends at once), a chunk per transaction, each with its ``cancel`` event (the loop's kept
        state reads the jobs an event names again, and drops them)."""
        ended = lc.request_cancel(lc.Life(state=lc.JobState.QUEUED))
        values = {
            "state": str(ended.state),
            "cancel_requested": ended.cancel_requested,
            "reason_code": ended.reason_code,
            "reason_message": f"{ended.reason_message} (tenant {tenant} deleted)",
        }
        total = 0
        while True:
            now = self._db.clock()
            with self._db.tx() as s:
                picked = s.execute(
                    select(JobRow.seq, JobRow.id)
                    .where(JobRow.tenant == tenant, JobRow.state == r.QUEUED)
                    .order_by(JobRow.seq)
                    .limit(_DELETE_CHUNK)
                ).all()
                if not picked:
                    return total
                s.execute(
                    update(JobRow)
                    .where(JobRow.seq.in_([seq for seq, _ in picked]), JobRow.state == r.QUEUED)
                    .values(**values, finished_at=now, updated_at=now)
                    .execution_options(synchronize_session=False)
                )
                events = [
                    {
                        "job_id": job_id,
                        "slice": None,
                        "at": now,
                        "kind": "cancel",
                        "message": f"cancel requested (tenant {tenant} deleted)",
                        "tenant": tenant,
                        "actor": actor,
                    }
                    for _, job_id in picked
                ]
                s.execute(insert(EventRow), events)
                total += len(picked)


def _job_counts(s: Session, tenant: str) -> tuple[int, int]:
    counted = dict(
        s.execute(
            select(JobRow.state, func.count())
            .where(JobRow.tenant == tenant, JobRow.state.in_((r.QUEUED, *r.ACTIVE)))
            .group_by(JobRow.state)
        ).all()
    )
    return int(counted.get(r.QUEUED, 0)), sum(int(counted.get(st, 0)) for st in r.ACTIVE)


def _busy_deleted(s: Session, name: str | None = None) -> set[str]:
    """Deleted tenants that still have queued or active jobs."""
    query = (
        select(JobRow.tenant)
        .join(TenantRow, TenantRow.name == JobRow.tenant)
        .where(TenantRow.deleted_at.is_not(None), JobRow.state.in_((r.QUEUED, *r.ACTIVE)))
        .distinct()
    )
    if name is not None:
        query = query.where(JobRow.tenant == name)
    return set(s.scalars(query))


def _gen_chips(accelerator_type: str, num_slices: int) -> tuple[str, int]:
    st = catalog.slice_type(accelerator_type)
    return st.generation.name, st.chips * num_slices


def _quota_text(quota: Mapping[str, int]) -> str:
    return ", ".join(f"{g}={c}" for g, c in sorted(quota.items())) or "none"


def _jobs_text(queued: int, active: int) -> str:
    return f"{queued} queued and {active} running job{'s' if queued + active != 1 else ''}"


def _changes(
    before: tuple[dict[str, int], float, str], after: tuple[dict[str, int], float, str]
) -> list[str]:
    out: list[str] = []
    if before[0] != after[0]:
        out.append(f"quota {_quota_text(before[0])} -> {_quota_text(after[0])}")
    if before[1] != after[1]:
        out.append(f"weight {before[1]:g} -> {after[1]:g}")
    if before[2] != after[2]:
        out.append(f"preemption {before[2]} -> {after[2]}")
    return out


def _tenant(t: TenantRow, busy: bool = False, usage: r.CheckpointUsage | None = None) -> r.TenantRecord:
    state = "active" if t.deleted_at is None else ("deleting" if busy else "deleted")
    return r.TenantRecord(
        name=t.name,
        quota=dict(t.quota),
        weight=t.weight,
        created_at=t.created_at,
        preemption=t.preemption,
        deleted_at=t.deleted_at,
        state=state,
        checkpoints=usage or r.CheckpointUsage(),
    )
