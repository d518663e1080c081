"""A stored log says when it is not the whole output: ``log_cursors.truncated`` and ``note``
(commit 203ccd7).

Existing rows get ``truncated = false`` (their logs were kept whole) through a server default that
is dropped again, so the schema ends as ``control/store/tables.py`` describes it (no server default).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A pre-migration database written by a tpufleet of this round may have the columns already.
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("log_cursors")}
    if "truncated" not in have:
        op.add_column(
            "log_cursors",
            sa.Column("truncated", sa.Boolean(), nullable=False, server_default=sa.false()),
        )
        with op.batch_alter_table("log_cursors") as batch:
            batch.alter_column("truncated", server_default=None)
    if "note" not in have:
        op.add_column("log_cursors", sa.Column("note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("log_cursors") as batch:
        batch.drop_column("note")
        batch.drop_column("truncated")
