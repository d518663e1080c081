"""Uploaded working-directory packages (the API trust boundary, commit 23eeec5).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A pre-migration database written by a tpufleet of this round may have the table already.
    if "packages" in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        "packages",
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["tenant"], ["tenants.name"]),
        sa.PrimaryKeyConstraint("tenant", "sha256"),
    )


def downgrade() -> None:
    op.drop_table("packages")
