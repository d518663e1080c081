"""Working-directory packages in the store: upload, fetch, collect; composed into
:class:`~tpufleet.control.store.facade.Store` as ``store.packages``. What a package may hold, and
the client's side, are in ``control/store/packages.py``; a package no queued or running job names
is deleted ``packages.UNUSED_KEEP_S`` after its upload or its last job's end (:meth:`PackageStore.collect`).
"""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tpufleet.control.store import packages
from tpufleet.control.store import values as r
from tpufleet.control.store.database import Database
from tpufleet.control.store.lookup import tenant_row
from tpufleet.control.store.tables import JobRow, PackageRow
from tpufleet.errors import ConflictError, NotFoundError

__all__ = ["PackageStore", "check_named"]


class PackageStore:
    """The tenants' packages in the database ``db``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def put(self, tenant: str, data: bytes) -> str:
        """Store a working-directory zip for ``tenant`` after :func:`packages.check_zip` (SpecError
        otherwise); returns its id ``sha256:<hex>``. Uploading the same bytes again is a no-op.
        The tenant's unused packages are collected first (:meth:`collect`); what stays
        and this one must fit its package quota (ConflictError, naming ``serve --package-quota-mib``)."""
        packages.check_zip(data, self._db.limits)
        pid = packages.package_id(data)
        digest = pid.removeprefix("sha256:")
        try:
            with self._db.tx() as s:
                tenant_row(s, tenant)
                if s.get(PackageRow, (tenant, digest)) is None:
                    self._collect(s, tenant)
                    self._check_quota(s, tenant, len(data))
                    s.add(
                        PackageRow(
                            tenant=tenant,
                            sha256=digest,
                            data=data,
                            size=len(data),
                            created_at=self._db.clock(),
                        )
                    )
        except IntegrityError:  # the same upload raced with this one; it is stored
            pass
        return pid

    def _check_quota(self, s: Session, tenant: str, adding: int) -> None:
        quota = self._db.limits.package_quota_bytes
        used = int(s.scalar(select(func.sum(PackageRow.size)).where(PackageRow.tenant == tenant)) or 0)
        if used + adding > quota:
            raise ConflictError(
                f"tenant {tenant} stores {used:,} bytes of packages and this one has {adding:,}: over the "
                f"package quota of {quota:,} bytes (serve --package-quota-mib {quota // r.MiB}); a package "
                f"no queued or running job names is deleted {packages.UNUSED_KEEP_S / 3600:g} h after its "
                "last use"
            )

    def collect(self, tenant: str | None = None) -> int:
        """Delete the packages (of ``tenant``, or everyone's) that no queued or running job names and
        that were neither uploaded nor used by a job that ended in the last ``packages.UNUSED_KEEP_S``;
        returns how many went. Run at every upload, for the uploading tenant, and by the loop for everyone
        every ``ServiceConfig.retention_check_s`` (``loop/tenantfiles.py``)."""
        with self._db.tx() as s:
            return self._collect(s, tenant)

    def _collect(self, s: Session, tenant: str | None) -> int:
        since = self._db.clock() - packages.UNUSED_KEEP_S
        named = (JobRow.tenant == PackageRow.tenant) & (JobRow.working_dir == "sha256:" + PackageRow.sha256)
        in_use = select(JobRow.seq).where(
            named, JobRow.state.not_in(r.TERMINAL) | (func.coalesce(JobRow.finished_at, since) >= since)
        )
        query = delete(PackageRow).where(PackageRow.created_at < since, ~in_use.exists())
        if tenant is not None:
            query = query.where(PackageRow.tenant == tenant)
        done = s.execute(query.execution_options(synchronize_session=False))
        return int(getattr(done, "rowcount", 0) or 0)

    def get(self, tenant: str, package_id: str) -> bytes:
        """The zip ``tenant`` uploaded as ``package_id``; NotFoundError for a malformed id, an unknown
        one or another tenant's (the same message for all three)."""
        data = None
        if isinstance(package_id, str) and r.PACKAGE_ID.fullmatch(package_id):
            with self._db.tx() as s:
                row = s.get(PackageRow, (tenant, package_id.removeprefix("sha256:")))
                data = None if row is None else bytes(row.data)
        if data is None:
            raise NotFoundError(f"package {str(package_id)[:80]!r} not found for tenant {tenant!r}")
        return data


def check_named(s: Session, tenant: str, wd: str) -> None:
    """A working_dir that is a package id must name a package ``tenant`` uploaded."""
    if r.PACKAGE_ID.fullmatch(wd):
        key = (tenant, wd.removeprefix("sha256:"))
        if (
            s.scalar(select(PackageRow.size).where(PackageRow.tenant == key[0], PackageRow.sha256 == key[1]))
            is None
        ):
            raise NotFoundError(
                f"working_dir: package {wd} not found; upload it first (POST /api/v1/packages, "
                "or tpufleet submit --working-dir DIR)"
            )
