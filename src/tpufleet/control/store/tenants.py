"""Operating tenants: create, update, soft-delete; tokens (ids, scopes, revocation, admin rotation);
the audit log. Part of :class:`~tpufleet.control.store.facade.Store` (a base class of it), kept apart so
neither module grows past what one reads at once.

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
- Tokens are stored only hashed. A revoked token is refused from the next request on. Last use is
  written at most once a minute per token, never a write per request.
- Every change is an event with ``actor`` (``admin``, a token id, ``scheduler`` for preemptions)
  and ``tenant``: the audit log (:meth:`TenantOps.audit_events`).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tpufleet import catalog
from tpufleet.control.store import checkpoints
from tpufleet.control.store import values as r
from tpufleet.control.store.tables import EventRow, JobRow, TenantRow, TokenRow
from tpufleet.errors import AuthError, ConflictError, NotFoundError, SpecError, closest, suggest
from tpufleet.scheduler import lifecycle as lc

LAST_USE_EVERY_S = 60.0  # a token's last_used_at is written at most this often
_DELETE_CHUNK = 5000  # queued jobs cancelled per statement by a forced delete


def new_token() -> str:
    return "tf_" + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token_id() -> str:
    """Twelve hex digits: how listings, events and ``token revoke`` name a token."""
    return secrets.token_hex(6)


class TenantOps:
    """Tenants, tokens and the audit log (a base of ``Store``; uses its ``tx``, ``clock``,
    ``add_event`` and ``request_cancel``)."""

    if TYPE_CHECKING:
        clock: r.Clock
        limits: r.Limits

        def tx(self) -> AbstractContextManager[Session]: ...

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
        ) -> None: ...

        def request_cancel(
            self, job_id: str, tenant: str | None = None, *, actor: str | None = None
        ) -> r.JobRecord: ...

    # -- tokens ------------------------------------------------------------------------------
    def issue_token(self, tenant: str | None = None, scope: str | None = None) -> str:
        """A new token for ``tenant`` (None: admin); only its hash is stored. No event (the
        control plane's own first admin token); :meth:`create_token` is the audited way."""
        with self.tx() as s:
            _, token = self._add_token(s, tenant, scope or _default_scope(tenant))
        return token

    def _add_token(self, s: Session, tenant: str | None, scope: str) -> tuple[TokenRow, str]:
        token = new_token()
        token_id = new_token_id()
        while s.scalar(select(TokenRow.id).where(TokenRow.id == token_id)) is not None:
            token_id = new_token_id()
        row = TokenRow(
            token_hash=token_hash(token),
            id=token_id,
            tenant=tenant,
            scope=scope,
            created_at=self.clock(),
            last_used_at=None,
            revoked_at=None,
        )
        s.add(row)
        s.flush()
        return row, token

    def create_token(
        self, tenant: str, scope: str = r.JOBS_SCOPE, *, actor: str = "admin"
    ) -> tuple[r.TokenRecord, str]:
        """A new ``jobs`` or ``metrics`` token for a live tenant: its record and the secret (shown once)."""
        if scope not in r.TOKEN_SCOPES:
            raise SpecError(
                f"{str(scope)[:40]!r} is not a token scope; use {' or '.join(r.TOKEN_SCOPES)}", field="scope"
            )
        with self.tx() as s:
            self._live_tenant_row(s, tenant)
            row, token = self._add_token(s, tenant, scope)
            self.add_event(s, f"token {row.id} ({scope}) created", kind="token", tenant=tenant, actor=actor)
            return _token(row), token

    def authenticate(self, token: str | None) -> r.Principal:
        if not token:
            raise AuthError("missing bearer token; pass --token or set TPUFLEET_TOKEN", reason="missing")
        with self.tx() as s:
            row = s.get(TokenRow, token_hash(token))
            if row is None:
                raise AuthError("unknown token; ask the admin for a tenant token (tpufleet tenant create)")
            if row.revoked_at is not None:
                raise AuthError(
                    "this token was revoked; ask the admin for a new one (tpufleet token create)",
                    reason="revoked",
                )
            now = self.clock()
            if row.last_used_at is None or now - row.last_used_at >= LAST_USE_EVERY_S:
                row.last_used_at = now
            return r.Principal(tenant=row.tenant, scope=row.scope, token_id=row.id)

    def tokens(self, tenant: str | None = None) -> list[r.TokenRecord]:
        """The tokens that work (revoked ones are left out), oldest first; ``tenant``: only its."""
        query = select(TokenRow).where(TokenRow.revoked_at.is_(None))
        with self.tx() as s:
            if tenant is not None:
                self._tenant_row(s, tenant)
                query = query.where(TokenRow.tenant == tenant)
            rows = s.scalars(query.order_by(TokenRow.created_at, TokenRow.id))
            return [_token(t) for t in rows]

    def revoke_token(self, token_id: str, *, actor: str = "admin") -> r.TokenRecord:
        """Revoke a token by id: refused from the next request on. The last admin token is not
        revoked (``rotate_admin`` replaces it); revoking a revoked token changes nothing."""
        with self.tx() as s:
            row = s.scalar(select(TokenRow).where(TokenRow.id == token_id)) if _short(token_id) else None
            if row is None:
                shown = token_id if len(token_id) <= 40 else token_id[:37] + "..."
                raise NotFoundError(f"token {shown!r} not found; list tokens with `tpufleet tokens`")
            if row.revoked_at is not None:
                return _token(row)
            if row.scope == r.ADMIN_SCOPE and self._live_admin_tokens(s) <= 1:
                raise ConflictError(
                    f"token {row.id} is the last admin token; replace it with `tpufleet token rotate-admin`"
                )
            row.revoked_at = self.clock()
            self.add_event(
                s, f"token {row.id} ({row.scope}) revoked", kind="token", tenant=row.tenant, actor=actor
            )
            return _token(row)

    def rotate_admin(self, *, actor: str = "admin") -> tuple[r.TokenRecord, str, int]:
        """A new admin token; every other admin token is revoked in the same transaction.
        Returns the new token's record, its secret and how many were revoked."""
        with self.tx() as s:
            now = self.clock()
            old = list(
                s.scalars(
                    select(TokenRow).where(TokenRow.scope == r.ADMIN_SCOPE, TokenRow.revoked_at.is_(None))
                )
            )
            row, token = self._add_token(s, None, r.ADMIN_SCOPE)
            for t in old:
                t.revoked_at = now
            revoked = ", ".join(t.id for t in old) or "none"
            self.add_event(
                s, f"admin token rotated: {row.id} created, revoked {revoked}", kind="token", actor=actor
            )
            return _token(row), token, len(old)

    def _live_admin_tokens(self, s: Session) -> int:
        query = select(func.count()).where(TokenRow.scope == r.ADMIN_SCOPE, TokenRow.revoked_at.is_(None))
        return int(s.scalar(query.select_from(TokenRow)) or 0)

    # -- tenants -----------------------------------------------------------------------------
    def create_tenant(
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
            with self.tx() as s:
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
                    created_at=self.clock(),
                    deleted_at=None,
                )
                s.add(row)
                s.flush()
                token_row, token = self._add_token(s, name, r.JOBS_SCOPE)
                self.add_event(
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

    def tenants(self, *, include_deleted: bool = False) -> list[r.TenantRecord]:
        """Live tenants by name; with ``include_deleted`` the deleted ones too (state ``deleting``
        while jobs of theirs still stop, then ``deleted``)."""
        query = select(TenantRow).order_by(TenantRow.name)
        if not include_deleted:
            query = query.where(TenantRow.deleted_at.is_(None))
        with self.tx() as s:
            rows = list(s.scalars(query))
            busy = self._busy_deleted(s) if include_deleted else set()
            usage = checkpoints.usage_of(s, [t.name for t in rows], self.limits.checkpoint_quota_bytes)
            return [_tenant(t, t.name in busy, usage[t.name]) for t in rows]

    def tenant(self, name: str) -> r.TenantRecord:
        """A tenant, live or deleted (``state`` says which)."""
        with self.tx() as s:
            row = self._tenant_row(s, name)
            usage = checkpoints.usage_of(s, [row.name], self.limits.checkpoint_quota_bytes)[row.name]
            return _tenant(row, row.deleted_at is not None and row.name in self._busy_deleted(s, name), usage)

    def _tenant_row(self, s: Session, name: str) -> TenantRow:
        row = s.get(TenantRow, name) if isinstance(name, str) and r.TENANT_NAME.fullmatch(name) else None
        if row is None:
            names = s.scalars(select(TenantRow.name).where(TenantRow.deleted_at.is_(None))).all()
            raise NotFoundError(f"tenant {str(name)[:70]!r} not found{suggest(closest(str(name), names))}")
        return row

    def _live_tenant_row(self, s: Session, name: str) -> TenantRow:
        row = self._tenant_row(s, name)
        if row.deleted_at is not None:
            raise ConflictError(f"tenant {name!r} was deleted; it takes no jobs, tokens or changes")
        return row

    def check_live_tenant(self, s: Session, name: str) -> None:
        """Inside a submit's transaction, before its queued caps are counted: the tenant is not
        deleted, and no other submit of this tenant counts until this transaction ends, so a cap's
        check and the insert are one step. PostgreSQL: the tenant's row locked ``FOR NO KEY
        UPDATE`` (its jobs' foreign keys are not blocked; a concurrent delete either sees this job
        and cancels it, or refuses it); SQLite: the database's write lock (``BEGIN IMMEDIATE``)."""
        _write_lock(s)
        deleted = s.execute(
            select(TenantRow.deleted_at).where(TenantRow.name == name).with_for_update(key_share=True)
        ).first()
        if deleted is None:
            self._tenant_row(s, name)  # raises: no such tenant (with the nearest names)
        if deleted is None or deleted[0] is not None:
            raise ConflictError(f"tenant {name!r} was deleted; it takes no jobs")

    def _busy_deleted(self, s: Session, name: str | None = None) -> set[str]:
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

    def update_tenant(
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
        with self.tx() as s:
            row = self._live_tenant_row(s, name)
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
            self.add_event(
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
                .values(borrowing=True, updated_at=self.clock())
                .execution_options(synchronize_session=False)
            )
            held[gen] -= chips
            self.add_event(
                s,
                f"now borrowing: {tenant}'s {gen} quota is {quota.get(gen, 0)} chips; another tenant's "
                "in-quota job may reclaim its slices",
                job_id=job_id,
                kind="borrowing",
                tenant=tenant,
                actor=actor,
            )

    def delete_tenant(
        self, name: str, *, force: bool = False, actor: str = "admin"
    ) -> tuple[r.TenantRecord, int]:
        """Soft-delete a tenant. Refused (ConflictError naming the counts) while it has queued or
        running jobs, unless ``force``: then they are cancelled. Returns the tenant (``deleting``
        until its cancelled jobs ended) and how many jobs this call cancelled. Deleting a deleted
        tenant again (with ``force``) cancels whatever of it is left."""
        with self.tx() as s:
            row = self._tenant_row(s, name)
            s.refresh(row, with_for_update=True)  # PostgreSQL: one delete at a time, after any submit
            queued, active = self._job_counts(s, name)
            if (queued or active) and not force:
                raise ConflictError(
                    f"tenant {name} has {_jobs_text(queued, active)}; cancel them first, or delete with "
                    "--force (cancels them: checkpoint signal, grace period, then delete)"
                )
            if row.deleted_at is None:
                now = self.clock()
                row.deleted_at = now
                tokens = list(
                    s.scalars(select(TokenRow).where(TokenRow.tenant == name, TokenRow.revoked_at.is_(None)))
                )
                for t in tokens:
                    t.revoked_at = now
                cancelling = f"; cancelling {_jobs_text(queued, active)}" if queued or active else ""
                self.add_event(
                    s,
                    f"tenant {name} deleted; {len(tokens)} token(s) revoked{cancelling}",
                    kind="tenant",
                    tenant=name,
                    actor=actor,
                )
        cancelled = self._cancel_queued(name, actor) if force else 0
        if force:
            with self.tx() as s:
                live = list(
                    s.scalars(select(JobRow.id).where(JobRow.tenant == name, JobRow.state.in_(r.ACTIVE)))
                )
            for job_id in live:
                try:
                    job = self.request_cancel(job_id, actor=actor)
                except (ConflictError, NotFoundError):  # ended meanwhile
                    continue
                cancelled += job.cancel_requested
        return self.tenant(name), cancelled

    def _job_counts(self, s: Session, tenant: str) -> tuple[int, int]:
        counted = dict(
            s.execute(
                select(JobRow.state, func.count())
                .where(JobRow.tenant == tenant, JobRow.state.in_((r.QUEUED, *r.ACTIVE)))
                .group_by(JobRow.state)
            ).all()
        )
        return int(counted.get(r.QUEUED, 0)), sum(int(counted.get(st, 0)) for st in r.ACTIVE)

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
            now = self.clock()
            with self.tx() as s:
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

    # -- the audit log -----------------------------------------------------------------------
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


def _default_scope(tenant: str | None) -> str:
    return r.ADMIN_SCOPE if tenant is None else r.JOBS_SCOPE


def _short(value: str) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 16 and "\0" not in value


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


def _token(t: TokenRow) -> r.TokenRecord:
    return r.TokenRecord(
        id=t.id, tenant=t.tenant, scope=t.scope, created_at=t.created_at, last_used_at=t.last_used_at
    )


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
