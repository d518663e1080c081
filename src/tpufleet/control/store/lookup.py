"""Finding a stored tenant or job by the name a caller typed, inside a transaction: the row, or
an error that says what is not there and names the nearest names. A value that could not be a
stored key (:func:`~tpufleet.control.store.database.key_like`) is "not found" without a query."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tpufleet.control.store import values as r
from tpufleet.control.store.database import key_like
from tpufleet.control.store.tables import JobRow, TenantRow
from tpufleet.errors import ConflictError, NotFoundError, closest, suggest


def tenant_row(s: Session, name: str) -> TenantRow:
    """A tenant, live or deleted; NotFoundError naming the nearest live tenants otherwise."""
    row = s.get(TenantRow, name) if isinstance(name, str) and r.TENANT_NAME.fullmatch(name) else None
    if row is None:
        names = s.scalars(select(TenantRow.name).where(TenantRow.deleted_at.is_(None))).all()
        raise NotFoundError(f"tenant {str(name)[:70]!r} not found{suggest(closest(str(name), names))}")
    return row


def live_tenant_row(s: Session, name: str) -> TenantRow:
    """A tenant that is not deleted (ConflictError for a deleted one)."""
    row = tenant_row(s, name)
    if row.deleted_at is not None:
        raise ConflictError(f"tenant {name!r} was deleted; it takes no jobs, tokens or changes")
    return row


def job_row(s: Session, job_id: str, tenant: str | None) -> JobRow:
    """A job; ``tenant`` set means a tenant's token asks (another tenant's job is "not found",
    exactly like a job that does not exist)."""
    query = select(JobRow).where(JobRow.id == job_id)
    if tenant is not None:
        query = query.where(JobRow.tenant == tenant)
    row = s.scalar(query) if key_like(job_id) else None
    if row is None:
        shown = job_id if len(job_id) <= 40 else job_id[:37] + "..."
        raise NotFoundError(f"job {shown!r} not found; list jobs with `tpufleet jobs`")
    return row
