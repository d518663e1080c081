"""The loop's part of tenants' files (``Service.files``): the hosts' measurements stored, unused
packages collected and the retention rule run through a host, off the loop's thread."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tpufleet.control.cluster.protocol import ClusterClient
from tpufleet.control.store.facade import Store
from tpufleet.control.store.filerecords import expired_jobs, files_removed, record_usage
from tpufleet.host.jobfiles import DiskUsage

log = logging.getLogger(__name__)


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
        """Delete every tenant's packages no live job uses (``PackageStore.collect``; an upload
        collects its own tenant's too), then, with a retention, finished jobs' checkpoint files."""
        if (gone := self.store.packages.collect()) > 0:
            log.info("deleted %d package(s) no queued or running job uses", gone)
        if self.retention_s is not None:
            self._remove_expired(self.retention_s)

    def _remove_expired(self, retention_s: float) -> None:
        for tenant, jobs in expired_jobs(self.store, retention_s).items():
            done = self.cluster.remove_job_files(self.job_root, tenant, jobs)
            files_removed(self.store, tenant, done.removed, done.disk)
