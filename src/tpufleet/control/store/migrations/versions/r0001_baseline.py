"""Baseline: the schema tpufleet created before migrations existed (commit f6094b2).

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("quota", sa.JSON(), nullable=False),
        sa.Column("weight", sa.Double(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "tokens",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["tenant"], ["tenants.name"]),
        sa.PrimaryKeyConstraint("token_hash"),
    )
    op.create_index("ix_tokens_tenant", "tokens", ["tenant"], unique=False)
    op.create_table(
        "jobs",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("accelerator_type", sa.String(length=32), nullable=False),
        sa.Column("num_slices", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("max_retries", sa.Integer(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("working_dir", sa.Text(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("reason_code", sa.String(length=64), nullable=True),
        sa.Column("reason_message", sa.Text(), nullable=True),
        sa.Column("slices", sa.JSON(), nullable=False),
        sa.Column("borrowing", sa.Boolean(), nullable=False),
        sa.Column("preempting", sa.Boolean(), nullable=False),
        sa.Column("head_of_line", sa.Boolean(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("stop_kind", sa.String(length=16), nullable=True),
        sa.Column("stop_message", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("submitted_at", sa.Double(), nullable=False),
        sa.Column("admit_seq", sa.Integer(), nullable=True),
        sa.Column("admitted_at", sa.Double(), nullable=True),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["tenant"], ["tenants.name"]),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("id"),
    )
    op.create_index("ix_jobs_admit_seq", "jobs", ["admit_seq"], unique=False)
    op.create_index("ix_jobs_state", "jobs", ["state"], unique=False)
    op.create_index("ix_jobs_tenant_state", "jobs", ["tenant", "state"], unique=False)
    op.create_table(
        "slices",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("accelerator_type", sa.String(length=32), nullable=False),
        sa.Column("topology", sa.String(length=32), nullable=False),
        sa.Column("expected_hosts", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("holder", sa.String(length=16), nullable=True),
        sa.Column("hosts", sa.JSON(), nullable=False),
        sa.Column("problems", sa.JSON(), nullable=False),
        sa.Column("draining", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "attempts",
        sa.Column("job_id", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("slices", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("exit_codes", sa.JSON(), nullable=False),
        sa.Column("admitted_at", sa.Double(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("ended_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "attempt"),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=16), nullable=True),
        sa.Column("slice", sa.String(length=128), nullable=True),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_events_job_id", "events", ["job_id"], unique=False)
    op.create_table(
        "log_cursors",
        sa.Column("job_id", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("host", sa.Integer(), nullable=False),
        sa.Column("slice", sa.String(length=128), nullable=False),
        sa.Column("worker_id", sa.Integer(), nullable=False),
        sa.Column("cluster_offset", sa.Integer(), nullable=False),
        sa.Column("stored", sa.Integer(), nullable=False),
        sa.Column("complete", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", "host"),
    )
    op.create_table(
        "log_chunks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("host", sa.Integer(), nullable=False),
        sa.Column("start", sa.Integer(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_log_chunks_stream", "log_chunks", ["job_id", "attempt", "host", "start"], unique=False
    )


def downgrade() -> None:
    for table in ("log_chunks", "log_cursors", "events", "attempts", "slices", "jobs", "tokens", "tenants"):
        op.drop_table(table)
