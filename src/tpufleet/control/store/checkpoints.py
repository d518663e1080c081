"""Tenants' checkpoint files in the store: what the hosts measured, and the retention rule's records.

The hosts measure (``jobfiles.measure``, in the runner) and enforce the quota; the loop writes what
they report here (:func:`record_usage`), one row per tenant with when it was measured, and the
tenant views read it (:func:`usage_of`, with the quota of ``Limits.checkpoint_quota_bytes``).

Retention (``serve --checkpoint-retention-days``): :func:`expired_jobs` lists finished jobs
(``SUCCEEDED``, ``FAILED``, ``CANCELLED``) whose end is older than the cutoff and whose files are
still kept; a host removes their directories (``ClusterClient.remove_job_files``) and
:func:`files_removed` records it: ``jobs.files_removed_at`` and, for a job that had files, an event.
Nothing here touches a disk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tpufleet.control.store import values as r
from tpufleet.control.store.tables import CheckpointUsageRow, JobRow
from tpufleet.host.jobfiles import DiskUsage, size_text

if TYPE_CHECKING:
    from tpufleet.control.cluster.protocol import ClusterClient
    from tpufleet.control.store.facade import Store

log = logging.getLogger(__name__)

DAY_S = 86400.0
RETENTION_NOTE = "finished longer ago than serve --checkpoint-retention-days"


def record_usage(store: Store, usage: dict[str, DiskUsage]) -> None:
    """Keep each tenant's newest measurement (an older one than stored is ignored)."""
    if not usage:
        return
    with store.tx() as s:
        for tenant, disk in usage.items():
            _put(s, tenant, disk)


def _put(s: Session, tenant: str, disk: DiskUsage) -> None:
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


def expired_jobs(store: Store, retention_s: float, limit: int = 200) -> dict[str, list[str]]:
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


def files_removed(store: Store, tenant: str, removed: dict[str, int], disk: DiskUsage | None) -> None:
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
            _put(s, tenant, disk)


class TenantFiles:
    """The scheduling loop's part (``Service.files``): store the hosts' newest measurement of each
    tenant (at most every ``write_s`` per tenant; a newer one waits for its turn), and every
    ``check_s``, off the loop (``submit``: the service's thread pool), delete the packages no live
    job uses and run the retention rule."""

    def __init__(
        self,
        store: Store,
        cluster: ClusterClient,
        job_root: str,
        *,
        retention_s: float | None,
        check_s: float,
        write_s: float,
        submit: Callable[..., Future[Any]],
    ) -> None:
        self.store, self.cluster, self.job_root = store, cluster, job_root
        self.retention_s, self.check_s, self.write_s = retention_s, check_s, write_s
        self._submit = submit
        self._due: dict[str, DiskUsage] = {}  # tenant -> newest measurement not yet stored
        self._written: dict[str, float] = {}  # tenant -> when (monotonic) one was last stored
        self._retention: Future[Any] | None = None
        self._retained_at = float("-inf")

    def measured(self, tenant: str, disk: DiskUsage) -> None:
        self._due[tenant] = disk

    def step(self) -> None:
        """Once a cycle: store what is due, and start or collect a retention pass."""
        self._store()
        self._retain()

    def _store(self) -> None:
        now = time.monotonic()
        never = float("-inf")
        due = {t: d for t, d in self._due.items() if now - self._written.get(t, never) >= self.write_s}
        if not due:
            return
        try:
            record_usage(self.store, due)
        except Exception:  # a record, never a reason to stop the loop: the next report is stored
            log.exception("storing the checkpoint usage of %d tenants failed", len(due))
            return
        for tenant in due:
            self._written[tenant] = now
            del self._due[tenant]

    def _retain(self) -> None:
        if self._retention is None:
            if time.monotonic() - self._retained_at < self.check_s:
                return
            self._retained_at = time.monotonic()
            self._retention = self._submit(self._tidy)
        if self._retention.done():
            err, self._retention = self._retention.exception(), None
            if err is not None:
                log.warning(
                    "removing unused packages or finished jobs' files failed (next try later): %s", err
                )

    def _tidy(self) -> None:
        """Delete every tenant's packages no live job uses (``Store.collect_packages``; an upload
        collects its own tenant's too), then, with a retention, finished jobs' checkpoint files."""
        if (gone := self.store.collect_packages()) > 0:
            log.info("deleted %d package(s) no queued or running job uses", gone)
        if self.retention_s is not None:
            self._remove_expired(self.retention_s)

    def _remove_expired(self, retention_s: float) -> None:
        for tenant, jobs in expired_jobs(self.store, retention_s).items():
            done = self.cluster.remove_job_files(self.job_root, tenant, jobs)
            files_removed(self.store, tenant, done.removed, done.disk)
