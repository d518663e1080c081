"""A frozen copy of ``src/tpufleet/control/store/tables.py`` at commit f6094b2: the schema tpufleet
created (``metadata.create_all``) before it had migrations. ``test_migrations.py`` builds
pre-migration databases from it and checks the baseline revision against it. Never edit it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class TenantRow(Base):
    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    quota: Mapped[dict[str, Any]]  # generation name -> nominal chips
    weight: Mapped[float]
    created_at: Mapped[float]


class TokenRow(Base):
    """A bearer token, stored only as its SHA-256; ``tenant`` is None for an admin token."""

    __tablename__ = "tokens"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str | None] = mapped_column(ForeignKey("tenants.name"), index=True)
    created_at: Mapped[float]


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_tenant_state", "tenant", "state"),)

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
    __tablename__ = "attempts"

    job_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    attempt: Mapped[int] = mapped_column(primary_key=True)
    slices: Mapped[list[Any]]
    state: Mapped[str] = mapped_column(String(16))  # ADMITTED STARTING RUNNING SUCCEEDED FAILED ...
    message: Mapped[str | None] = mapped_column(Text)
    exit_codes: Mapped[list[Any]] = mapped_column(default=list)  # [{slice, worker_id, state, exit_code}]
    admitted_at: Mapped[float]
    started_at: Mapped[float | None]
    ended_at: Mapped[float | None]


class EventRow(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str | None] = mapped_column(String(16), index=True)
    slice: Mapped[str | None] = mapped_column(String(128))
    at: Mapped[float]
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)


class LogCursorRow(Base):
    """One host's output stream of one attempt: where the cluster's stream was read up to, and how
    many characters the store holds. ``host`` is the host's index within the attempt (slice order,
    then worker id)."""

    __tablename__ = "log_cursors"

    job_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    attempt: Mapped[int] = mapped_column(primary_key=True)
    host: Mapped[int] = mapped_column(primary_key=True)
    slice: Mapped[str] = mapped_column(String(128))
    worker_id: Mapped[int]
    cluster_offset: Mapped[int] = mapped_column(default=0)
    stored: Mapped[int] = mapped_column(default=0)
    complete: Mapped[bool] = mapped_column(default=False)


class LogChunkRow(Base):
    __tablename__ = "log_chunks"
    __table_args__ = (Index("ix_log_chunks_stream", "job_id", "attempt", "host", "start"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int]
    host: Mapped[int]
    start: Mapped[int]  # character offset of ``data`` within the host's stored stream
    data: Mapped[str] = mapped_column(Text)
