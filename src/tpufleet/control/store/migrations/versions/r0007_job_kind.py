"""A job's kind (issue 12): ``spmd`` (the command on every host) or ``ray`` (one Ray driver through
Ray's job submission, docs/ray-jobs.md).

Existing rows are SPMD jobs: they get ``kind = 'spmd'`` through a server default that is dropped
again, so the schema ends as ``control/store/tables.py`` describes it (no server default).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A database that create_all made before migrations existed has every column already.
    if "kind" in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("jobs")}:
        return
    if op.get_bind().dialect.name == "sqlite":
        # SQLite rebuilds ``jobs`` to drop the default; check foreign keys at commit, not at DROP.
        op.execute("PRAGMA defer_foreign_keys = ON")
    op.add_column("jobs", sa.Column("kind", sa.String(length=8), nullable=False, server_default="spmd"))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("kind", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("kind")
