"""Checkpoint files (issue 28): each tenant's measured checkpoint usage (``checkpoint_usage``), and
when a finished job's checkpoint directory was removed by the retention rule (``jobs.files_removed_at``).

Existing jobs get ``files_removed_at`` NULL (kept); no tenant has a measurement until a run reports.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if "files_removed_at" not in {c["name"] for c in inspector.get_columns("jobs")}:
        op.add_column("jobs", sa.Column("files_removed_at", sa.Double(), nullable=True))
    if "checkpoint_usage" not in inspector.get_table_names():
        op.create_table(
            "checkpoint_usage",
            sa.Column("tenant", sa.String(length=63), nullable=False),
            sa.Column("used_bytes", sa.BigInteger(), nullable=False),
            sa.Column("entries", sa.BigInteger(), nullable=False),
            sa.Column("complete", sa.Boolean(), nullable=False),
            sa.Column("measured_at", sa.Double(), nullable=False),
            sa.PrimaryKeyConstraint("tenant"),
        )


def downgrade() -> None:
    op.drop_table("checkpoint_usage")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("files_removed_at")
