"""Jobs and packages that came through Ray's job API (``/ray``, ``api/rayjobs.py``), in the store.

A Ray submission is an ordinary tpufleet job (``JobStore.submit``'s own path: the tenant's caps, its
package, its event) plus a row naming it the way Ray's clients do: the submission id (the caller's,
or a new ``raysubmit_...``), unique per tenant, so no tenant learns which ids another uses. Deleting
a submission (``ray job delete``) removes that row only: the job stays in ``tpufleet jobs``, its
cost and its logs. A package Ray's client uploads (``gcs://_ray_pkg_<hash>.zip``) is stored as the
tenant's package (``PackageStore.put``: the same checks and quota) under that URI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from tpufleet.control.store import values as r
from tpufleet.control.store.database import Database, key_like
from tpufleet.control.store.jobs import JobStore, job_record
from tpufleet.control.store.lookup import tenant_row
from tpufleet.control.store.packagestore import PackageStore
from tpufleet.control.store.tables import JobRow, PackageRow, RayPackageRow, RaySubmissionRow
from tpufleet.errors import ConflictError, NotFoundError, SpecError

__all__ = ["RAY_LIST_MAX", "RaySubmission", "RaySubmissions"]

RAY_LIST_MAX = 1000  # submissions a listing answers (Ray's list has no pages): the newest


@dataclass(frozen=True)
class RaySubmission:
    """A job as Ray's job API shows it: its submission, and the tpufleet job it is."""

    submission_id: str
    job: r.JobRecord
    entrypoint: str
    metadata: dict[str, str]
    runtime_env: dict[str, Any]
    created_at: float


class RaySubmissions:
    """Ray submissions in the database ``db``: each queued through ``jobs`` (its own path), its
    packages stored through ``packages``."""

    def __init__(self, db: Database, jobs: JobStore, packages: PackageStore) -> None:
        self._db = db
        self._jobs = jobs
        self._packages = packages

    def submit(
        self,
        tenant: str,
        submission_id: str,
        request: r.JobRequest,
        *,
        entrypoint: str,
        metadata: dict[str, str],
        runtime_env: dict[str, Any],
    ) -> RaySubmission:
        """Queue ``request`` for ``tenant`` as Ray submission ``submission_id``, in one transaction.
        An id the tenant already used is refused with Ray's own words (its clients recognise them)."""
        for _ in range(5):
            try:
                with self._db.tx() as s:
                    tenant_row(s, tenant)
                    if s.get(RaySubmissionRow, (tenant, submission_id)) is not None:
                        raise _exists(submission_id)
                    job = self._jobs.add(s, tenant, request)
                    now = self._db.clock()
                    s.add(
                        RaySubmissionRow(
                            tenant=tenant,
                            submission_id=submission_id,
                            job_id=job.id,
                            entrypoint=entrypoint,
                            meta=dict(metadata),
                            runtime_env=dict(runtime_env),
                            created_at=now,
                        )
                    )
                    return RaySubmission(submission_id, job, entrypoint, dict(metadata), runtime_env, now)
            except IntegrityError:  # a concurrent submit took the id (or the job id): look again
                continue
        raise ConflictError("could not allocate a unique job id; try again")

    def get(self, submission_id: str, tenant: str | None) -> RaySubmission:
        """The submission ``submission_id`` of ``tenant`` (None: the admin, any tenant's). Another
        tenant's is "does not exist", exactly like one that does not."""
        with self._db.tx() as s:
            query = _joined().where(RaySubmissionRow.submission_id == submission_id)
            if tenant is not None:
                query = query.where(RaySubmissionRow.tenant == tenant)
            rows = s.execute(query.limit(2)).all() if key_like(submission_id) else []
            if len(rows) > 1:
                raise ConflictError(
                    f"submission id {submission_id!r} is used by several tenants; use the tenant's token"
                )
            if not rows:
                raise NotFoundError(f"Job {submission_id[:128]} does not exist")
            return _submission(*rows[0])

    def all(self, tenant: str | None, limit: int = RAY_LIST_MAX) -> list[RaySubmission]:
        """The newest ``limit`` submissions of ``tenant`` (None: everyone's), oldest first."""
        query = _joined().order_by(JobRow.seq.desc()).limit(limit)
        if tenant is not None:
            query = query.where(RaySubmissionRow.tenant == tenant)
        with self._db.tx() as s:
            return [_submission(sub, job) for sub, job in reversed(s.execute(query).all())]

    def delete(self, submission_id: str, tenant: str | None) -> None:
        """Forget the submission (its job stays); only once its job has ended (Ray's rule)."""
        sub = self.get(submission_id, tenant)
        if sub.job.state not in r.TERMINAL:
            raise SpecError(
                f"Attempted to delete job with submission_id {submission_id}, but it is in a non-terminal "
                f"state ({sub.job.state} in tpufleet); stop it first (ray job stop {submission_id})"
            )
        with self._db.tx() as s:
            s.execute(
                delete(RaySubmissionRow).where(
                    RaySubmissionRow.tenant == sub.job.tenant, RaySubmissionRow.submission_id == submission_id
                )
            )

    def put_package(self, tenant: str, uri: str, data: bytes) -> str:
        """Store ``data`` as ``tenant``'s package (``PackageStore.put``'s checks and quota) under ``uri``."""
        package_id = self._packages.put(tenant, data)
        digest = package_id.removeprefix("sha256:")
        with self._db.tx() as s:
            row = s.get(RayPackageRow, (tenant, uri))
            if row is None:
                s.add(RayPackageRow(tenant=tenant, uri=uri, sha256=digest, created_at=self._db.clock()))
            else:
                row.sha256 = digest
        return package_id

    def package(self, tenant: str, uri: str) -> str | None:
        """The package id ``uri`` names for ``tenant``, None when it was never uploaded or was collected."""
        with self._db.tx() as s:
            digest = s.scalar(
                select(PackageRow.sha256)
                .join(
                    RayPackageRow,
                    (RayPackageRow.tenant == PackageRow.tenant) & (RayPackageRow.sha256 == PackageRow.sha256),
                )
                .where(RayPackageRow.tenant == tenant, RayPackageRow.uri == uri)
            )
        return None if digest is None else f"sha256:{digest}"


def _joined() -> Any:
    return select(RaySubmissionRow, JobRow).join(JobRow, JobRow.id == RaySubmissionRow.job_id)


def _exists(submission_id: str) -> SpecError:
    return SpecError(
        f"Job with submission_id {submission_id} already exists. Please use a different submission_id."
    )


def _submission(sub: RaySubmissionRow, job: JobRow) -> RaySubmission:
    return RaySubmission(
        sub.submission_id,
        job_record(job),
        sub.entrypoint,
        dict(sub.meta or {}),
        dict(sub.runtime_env or {}),
        sub.created_at,
    )
