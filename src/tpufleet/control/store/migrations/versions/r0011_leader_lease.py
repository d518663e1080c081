"""Replicas with a fenced leader (issue 34): ``leader_lease``, the one-row lease whose holder runs
the loop, and its fencing token. Starts empty; the first replica to lead inserts the row.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "leader_lease" not in sa.inspect(op.get_bind()).get_table_names():
        op.create_table(
            "leader_lease",
            sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
            sa.Column("holder", sa.String(length=200), nullable=True),
            sa.Column("token", sa.BigInteger(), nullable=False),
            sa.Column("expires_at", sa.Double(), nullable=False),
            sa.Column("since", sa.Double(), nullable=False),
            sa.PrimaryKeyConstraint("id"),
        )


def downgrade() -> None:
    op.drop_table("leader_lease")
