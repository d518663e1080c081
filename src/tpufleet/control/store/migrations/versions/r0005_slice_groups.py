"""Slice groups (issue 10): what the slice manager and the autoscaler asked a provider for.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A database a tpufleet of this round made with create_all (stamped as the baseline) has it already.
    if "slice_groups" in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        "slice_groups",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("accelerator_type", sa.String(length=32), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("spot", sa.Boolean(), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=True),
        sa.Column("origin", sa.String(length=16), nullable=False),
        sa.Column("pool", sa.String(length=63), nullable=True),
        sa.Column("for_job", sa.String(length=16), nullable=True),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("slices", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("delete_requested_at", sa.Double(), nullable=True),
        sa.Column("force", sa.Boolean(), nullable=False),
        sa.Column("deleted_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_index("ix_slice_groups_deleted_at", "slice_groups", ["deleted_at"])


def downgrade() -> None:
    op.drop_index("ix_slice_groups_deleted_at", table_name="slice_groups")
    op.drop_table("slice_groups")
