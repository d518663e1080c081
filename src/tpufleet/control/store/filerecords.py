"""The loop's records of tenants' files: the hosts' measurements kept, finished jobs' files found and
their removal recorded (see ``checkpoints.py`` for what the rows mean). Functions of the store, beside
it: the store never calls them, the loop does (``loop/tenantfiles.py``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update

from tpufleet.control.store import values as r
from tpufleet.control.store.checkpoints import RETENTION_NOTE, put
from tpufleet.control.store.database import Database
from tpufleet.control.store.tables import JobRow
from tpufleet.host.jobfiles import DiskUsage, size_text


def record_usage(store: Database, usage: dict[str, DiskUsage]) -> None:
    """Keep each tenant's newest measurement (an older one than stored is ignored)."""
    if not usage:
        return
    with store.tx() as s:
        for tenant, disk in usage.items():
            put(s, tenant, disk)


def expired_jobs(store: Database, retention_s: float, limit: int = 200) -> dict[str, list[str]]:
    """Finished jobs whose files the retention rule removes now, by tenant (at most ``limit``, the
    longest finished first)."""
    cutoff = store.clock() - retention_s
    query = (
        select(JobRow.tenant, JobRow.id)
        .where(
            JobRow.state.in_(r.TERMINAL),
            JobRow.finished_at.is_not(None),
            JobRow.finished_at < cutoff,
            JobRow.files_removed_at.is_(None),
        )
        .order_by(JobRow.finished_at)
        .limit(limit)
    )
    out: dict[str, list[str]] = {}
    with store.tx() as s:
        for tenant, job_id in s.execute(query):
            out.setdefault(tenant, []).append(job_id)
    return out


def files_removed(store: Database, tenant: str, removed: dict[str, int], disk: DiskUsage | None) -> None:
    """Record what a host removed: each job's ``files_removed_at``, an event for each job that had
    files, and the tenant's usage as measured after."""
    now = store.clock()
    with store.tx() as s:
        for job_id, freed in removed.items():
            changed: Any = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.tenant == tenant, JobRow.state.in_(r.TERMINAL))
                .values(files_removed_at=now)
                .execution_options(synchronize_session=False)
            )
            if freed > 0 and changed.rowcount:
                what = f"checkpoint files removed ({size_text(freed)}): {RETENTION_NOTE}"
                store.add_event(s, what, job_id=job_id, kind="files", tenant=tenant)
        if disk is not None:
            put(s, tenant, disk)
