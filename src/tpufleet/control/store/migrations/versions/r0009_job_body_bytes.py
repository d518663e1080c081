"""A job's stored size (issue 28): ``jobs.body_bytes`` (``JobRequest.body_bytes``: the UTF-8 bytes of
its command, env, name and working_dir), summed over a tenant's queued jobs for the cap
``Limits.max_queued_bytes_per_tenant``, from the index ``ix_jobs_tenant_state_bytes`` alone.

Existing rows get their size computed from the stored JSON text (a few bytes of JSON syntax more
than the request's own count: an upper bound), through a server default of 0 that is dropped again.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    if "body_bytes" not in {c["name"] for c in inspector.get_columns("jobs")}:
        if bind.dialect.name == "sqlite":
            op.execute("PRAGMA defer_foreign_keys = ON")  # the rebuild below drops and renames jobs
        op.add_column("jobs", sa.Column("body_bytes", sa.Integer(), nullable=False, server_default="0"))
        if bind.dialect.name == "sqlite":
            size = "length(CAST(command AS BLOB)) + length(CAST(env AS BLOB)) + length(CAST(name AS BLOB))"
        else:
            size = (
                "octet_length(CAST(command AS TEXT)) + octet_length(CAST(env AS TEXT)) + octet_length(name)"
            )
        op.execute(f"UPDATE jobs SET body_bytes = {size} + coalesce(length(working_dir), 0)")
        with op.batch_alter_table("jobs") as batch:
            batch.alter_column("body_bytes", server_default=None)
    if "ix_jobs_tenant_state_bytes" not in {i["name"] for i in sa.inspect(bind).get_indexes("jobs")}:
        op.create_index("ix_jobs_tenant_state_bytes", "jobs", ["tenant", "state", "body_bytes"])


def downgrade() -> None:
    op.drop_index("ix_jobs_tenant_state_bytes", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("body_bytes")
