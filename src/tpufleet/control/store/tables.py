"""The control plane's tables (SQLAlchemy 2, declarative). SQLite and PostgreSQL alike.

The schema is versioned with Alembic (``control/store/migrations``): a change here needs a new revision
there, and ``tests/unit/test_migrations.py`` fails, naming the missing operations, until it has one.

Timestamps are float seconds since the epoch from the injected clock. ``jobs.seq`` is the
submission order (an autoincrementing primary key); ``jobs.id`` is the short readable id users see.
A job's ``attempt`` is the number (1-based) of its current attempt, or of the next one while it is
queued. ``stop_kind`` is set while an attempt is being ended, and says what happens when it has:
``success`` (SUCCEEDED), ``preempt`` (requeue, no retry used), ``cancel`` (CANCELLED) or ``fail``
(requeue while retries remain, else FAILED).
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class TenantRow(Base):
    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    quota: Mapped[dict[str, Any]]  # generation name -> nominal chips
    weight: Mapped[float]
    created_at: Mapped[float]
    preemption: Mapped[str] = mapped_column(  # lower_priority or never (records.PREEMPTION_MODES)
        String(16), default="lower_priority", server_default="lower_priority"
    )
    # Soft delete: set when the admin deleted it; its jobs, events and logs stay, its name stays taken.
    deleted_at: Mapped[float | None]


class TokenRow(Base):
    """A bearer token, stored only as its SHA-256; ``tenant`` is None for an admin token.

    ``id`` names it in listings, events and ``token revoke`` (never the secret); ``scope`` is
    ``admin``, ``jobs`` (a tenant's jobs) or ``metrics`` (only ``GET /metrics``). ``last_used_at``
    is written at most once a minute per token; a revoked token (``revoked_at``) is refused."""

    __tablename__ = "tokens"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    id: Mapped[str] = mapped_column(String(16), unique=True)
    tenant: Mapped[str | None] = mapped_column(ForeignKey("tenants.name"), index=True)
    scope: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float]
    last_used_at: Mapped[float | None]
    revoked_at: Mapped[float | None]


class PackageRow(Base):
    """A working-directory zip a tenant uploaded; ``sha256`` is its digest (the id jobs name)."""

    __tablename__ = "packages"

    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    size: Mapped[int]
    created_at: Mapped[float]


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_tenant_state", "tenant", "state"),
        # the queued-bytes cap sums body_bytes from this index alone (never a row of command and env)
        Index("ix_jobs_tenant_state_bytes", "tenant", "state", "body_bytes"),
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(16), unique=True)
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"))
    name: Mapped[str] = mapped_column(String(128))
    command: Mapped[list[Any]]
    accelerator_type: Mapped[str] = mapped_column(String(32))
    num_slices: Mapped[int]
    priority: Mapped[int]
    max_retries: Mapped[int]
    env: Mapped[dict[str, Any]]
    working_dir: Mapped[str | None] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(8), default="spmd")  # spmd | ray (docs/ray-jobs.md)
    body_bytes: Mapped[int] = mapped_column(default=0)  # JobRequest.body_bytes: the queued-bytes cap
    state: Mapped[str] = mapped_column(String(16), index=True)
    attempt: Mapped[int] = mapped_column(default=1)
    failures: Mapped[int] = mapped_column(default=0)  # failed attempts, counted against max_retries
    reason_code: Mapped[str | None] = mapped_column(String(64))
    reason_message: Mapped[str | None] = mapped_column(Text)
    slices: Mapped[list[Any]] = mapped_column(default=list)
    borrowing: Mapped[bool] = mapped_column(default=False)
    preempting: Mapped[bool] = mapped_column(default=False)
    head_of_line: Mapped[bool] = mapped_column(default=False)  # the policy's last Wait.head_of_line
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    stop_kind: Mapped[str | None] = mapped_column(String(16))
    stop_message: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None]
    submitted_at: Mapped[float]
    admit_seq: Mapped[int | None] = mapped_column(
        index=True
    )  # order of the current admission (victims: most recent first)
    admitted_at: Mapped[float | None]
    started_at: Mapped[float | None]
    finished_at: Mapped[float | None]
    updated_at: Mapped[float]
    # when a host removed its checkpoint directory (serve --checkpoint-retention-days); None: kept
    files_removed_at: Mapped[float | None]


class SliceRow(Base):
    __tablename__ = "slices"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    accelerator_type: Mapped[str] = mapped_column(String(32))
    topology: Mapped[str] = mapped_column(String(32))
    expected_hosts: Mapped[int]
    state: Mapped[str] = mapped_column(String(16))
    holder: Mapped[str | None] = mapped_column(String(16))  # job id
    hosts: Mapped[list[Any]] = mapped_column(default=list)  # [{worker_id, node_id, address, alive}]
    problems: Mapped[list[Any]] = mapped_column(default=list)
    draining: Mapped[bool] = mapped_column(default=False)  # the admin's intent; state shows DRAINING
    updated_at: Mapped[float]


class AttemptRow(Base):
    """One attempt of a job. ``first_step``/``last_step`` (with their times, the host's clock): the
    first and the newest step process 0 reported (``runtime.report_step``), None when it reported
    none; goodput and cost are computed from them and the admission and end times (``observe/``)."""

    __tablename__ = "attempts"
    __table_args__ = (
        Index("ix_attempts_admitted_at", "admitted_at"),
        Index("ix_attempts_ended_at", "ended_at"),
    )

    job_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    attempt: Mapped[int] = mapped_column(primary_key=True)
    slices: Mapped[list[Any]]
    state: Mapped[str] = mapped_column(String(16))  # ADMITTED STARTING RUNNING SUCCEEDED FAILED ...
    message: Mapped[str | None] = mapped_column(Text)
    exit_codes: Mapped[list[Any]] = mapped_column(default=list)  # [{slice, worker_id, state, exit_code}]
    admitted_at: Mapped[float]
    started_at: Mapped[float | None]
    ended_at: Mapped[float | None]
    first_step: Mapped[int | None]
    first_step_at: Mapped[float | None]
    last_step: Mapped[int | None]
    last_step_at: Mapped[float | None]
    # the fencing tokens of the terms that launched and ended it (replicas; NULL without a lease)
    launch_term: Mapped[int | None] = mapped_column(BigInteger)
    end_term: Mapped[int | None] = mapped_column(BigInteger)


class EventRow(Base):
    """Something that happened to a job, a slice or a tenant. ``actor`` is set on the audit log's
    events (``GET /api/v1/events``): who did it, ``admin``, a token id, or ``scheduler`` for a
    preemption; ``tenant`` is the tenant it concerns. ``term`` and ``fenced_at``: on an event the
    leader's loop wrote (replicas), the fencing token of its term and the database's clock when its
    transaction passed the fence (``Store.tx``); on a term's first event (``... leads``), the
    database's clock once it took the lease. NULL for the API's events and without a lease."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_tenant_id", "tenant", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str | None] = mapped_column(String(16), index=True)
    slice: Mapped[str | None] = mapped_column(String(128))
    at: Mapped[float]
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    tenant: Mapped[str | None] = mapped_column(String(63))
    actor: Mapped[str | None] = mapped_column(String(80))
    term: Mapped[int | None] = mapped_column(BigInteger)
    fenced_at: Mapped[float | None]


class LogCursorRow(Base):
    """One host's output stream of one attempt: where the cluster's stream was read up to, and how
    many characters the store holds. ``host`` is the host's index within the attempt (slice order,
    then worker id). ``complete``: nothing more will be stored. ``truncated``: the stream reached the
    per-host cap and the rest was not kept; ``note``: why the stored log is not the whole output
    (the cap, or a host whose output could not be read to the end)."""

    __tablename__ = "log_cursors"

    job_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    attempt: Mapped[int] = mapped_column(primary_key=True)
    host: Mapped[int] = mapped_column(primary_key=True)
    slice: Mapped[str] = mapped_column(String(128))
    worker_id: Mapped[int]
    cluster_offset: Mapped[int] = mapped_column(default=0)
    stored: Mapped[int] = mapped_column(default=0)
    complete: Mapped[bool] = mapped_column(default=False)
    truncated: Mapped[bool] = mapped_column(default=False)
    note: Mapped[str | None] = mapped_column(Text, default=None)


class LogChunkRow(Base):
    __tablename__ = "log_chunks"
    __table_args__ = (Index("ix_log_chunks_stream", "job_id", "attempt", "host", "start"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int]
    host: Mapped[int]
    start: Mapped[int]  # character offset of ``data`` within the host's stored stream
    data: Mapped[str] = mapped_column(Text)


class SliceGroupRow(Base):
    """A slice group: ``count`` slices of one type asked of the provider under one name.

    ``origin`` is ``manual`` (``tpufleet slice create``) or ``autoscaler`` (one slice per group,
    ``pool`` and ``for_job`` say why). ``tenant`` set: a private group, only that tenant's jobs run
    there. ``state`` is the provider's (``REQUESTED`` until it first answers); ``slices`` lists the
    physical slices with when each came up (``[{"name", "up_at"}]``); ``delete_requested_at`` and
    ``force`` record a delete (it drains first unless forced); ``deleted_at`` when it is gone."""

    __tablename__ = "slice_groups"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    accelerator_type: Mapped[str] = mapped_column(String(32))
    count: Mapped[int]
    spot: Mapped[bool]
    tenant: Mapped[str | None] = mapped_column(String(63))
    origin: Mapped[str] = mapped_column(String(16))
    pool: Mapped[str | None] = mapped_column(String(63))
    for_job: Mapped[str | None] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(32))
    message: Mapped[str | None] = mapped_column(Text)
    slices: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[float]
    updated_at: Mapped[float]
    delete_requested_at: Mapped[float | None]
    force: Mapped[bool] = mapped_column(default=False)
    deleted_at: Mapped[float | None] = mapped_column(index=True)


class CheckpointUsageRow(Base):
    """A tenant's checkpoint directory (``<checkpoint-root>/<tenant>``) as a host last measured it:
    ``used_bytes`` on disk, ``entries`` (files and directories), ``complete`` False when the walk
    stopped at its bound, ``measured_at`` by the host's clock. Written by the loop from what the
    runners report; one row per tenant that ever ran a job."""

    __tablename__ = "checkpoint_usage"

    tenant: Mapped[str] = mapped_column(String(63), primary_key=True)
    used_bytes: Mapped[int] = mapped_column(BigInteger)
    entries: Mapped[int] = mapped_column(BigInteger)
    complete: Mapped[bool]
    measured_at: Mapped[float]


class RaySubmissionRow(Base):
    """A job submitted through Ray's job API (``/ray``, ``api/rayjobs.py``): the submission id Ray's
    clients name it by (unique per tenant: one tenant cannot learn another's ids), the tpufleet job
    it is, and what Ray's clients read back (the entrypoint as given, the metadata, the runtime_env
    with its working_dir as the client named it). ``ray job delete`` removes this row, not the job."""

    __tablename__ = "ray_submissions"

    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), primary_key=True)
    submission_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(16), unique=True)
    entrypoint: Mapped[str] = mapped_column(Text)
    meta: Mapped[dict[str, Any]]  # the submission's metadata (Ray's JobDetails.metadata)
    runtime_env: Mapped[dict[str, Any]]
    created_at: Mapped[float]


class RayPackageRow(Base):
    """A package uploaded through Ray's package API (``PUT /ray/api/packages/gcs/_ray_pkg_<hash>.zip``):
    the URI Ray's client names it by, per tenant, and the tenant's package (``packages.sha256``) it is.
    A row whose package was collected reads as absent, so the client uploads it again."""

    __tablename__ = "ray_packages"

    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), primary_key=True)
    uri: Mapped[str] = mapped_column(String(160), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float]


class LeaderLeaseRow(Base):
    """The leader lease of the replicas on one database (``control/store/lease.py``): one row (id 1).
    ``holder`` is the replica that leads or led last (``hostname:pid:random``), ``token`` the fencing
    token (grows by one at every acquisition; every write of the loop is conditional on it),
    ``expires_at`` and ``since`` are seconds since the epoch on the DATABASE's clock, never a
    replica's, so replicas with skewed clocks agree on who leads."""

    __tablename__ = "leader_lease"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    holder: Mapped[str | None] = mapped_column(String(200))
    token: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[float]
    since: Mapped[float]
