"""Tenants' checkpoint files in the store: what the hosts measured, and the retention rule's records.

The hosts measure (``jobfiles.measure``, in the runner) and enforce the quota; the loop writes what
they report (``filerecords.record_usage``, through :func:`put`), one row per tenant with when it was
measured, and the tenant views read it (:func:`usage_of`, with the quota of
``Limits.checkpoint_quota_bytes``).

Retention (``serve --checkpoint-retention-days``): ``filerecords.expired_jobs`` lists finished jobs
(``SUCCEEDED``, ``FAILED``, ``CANCELLED``) whose end is older than the cutoff and whose files are
still kept; a host removes their directories (``ClusterClient.remove_job_files``) and
``filerecords.files_removed`` records it: ``jobs.files_removed_at`` and, for a job that had files, an event.
Nothing here touches a disk.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from tpufleet.control.store import values as r
from tpufleet.control.store.tables import CheckpointUsageRow
from tpufleet.host.jobfiles import DiskUsage

log = logging.getLogger(__name__)

DAY_S = 86400.0
RETENTION_NOTE = "finished longer ago than serve --checkpoint-retention-days"


def put(s: Session, tenant: str, disk: DiskUsage) -> None:
    row = s.get(CheckpointUsageRow, tenant)
    if row is None:
        s.add(
            CheckpointUsageRow(
                tenant=tenant,
                used_bytes=disk.bytes,
                entries=disk.entries,
                complete=disk.complete,
                measured_at=disk.at,
            )
        )
    elif disk.at >= row.measured_at:
        row.used_bytes, row.entries, row.complete, row.measured_at = (
            disk.bytes,
            disk.entries,
            disk.complete,
            disk.at,
        )


def usage_of(s: Session, tenants: list[str], quota_bytes: int | None) -> dict[str, r.CheckpointUsage]:
    """The stored measurement and the quota of each tenant (one without a measurement: None used)."""
    query = select(CheckpointUsageRow).where(CheckpointUsageRow.tenant.in_(tenants))
    rows = {row.tenant: row for row in s.scalars(query)}
    out = {}
    for name in tenants:
        row = rows.get(name)
        out[name] = (
            r.CheckpointUsage(row.used_bytes, row.measured_at, row.complete, quota_bytes)
            if row is not None
            else r.CheckpointUsage(quota_bytes=quota_bytes)
        )
    return out
