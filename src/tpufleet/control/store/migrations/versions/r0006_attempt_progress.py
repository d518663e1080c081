"""Goodput and cost (issue 11): each attempt's first and newest reported step with their times,
and indexes on ``attempts.admitted_at``/``ended_at`` so ``GET /metrics`` reads only the attempts
admitted or ended since its last scrape.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Columns and indexes already there are skipped: a pre-migration database stamped as the
    # baseline may have been made by a create_all that knew them.
    inspect = sa.inspect(op.get_bind())
    have = {c["name"] for c in inspect.get_columns("attempts")}
    for name, kind in (
        ("first_step", sa.Integer()),
        ("first_step_at", sa.Double()),
        ("last_step", sa.Integer()),
        ("last_step_at", sa.Double()),
    ):
        if name not in have:
            op.add_column("attempts", sa.Column(name, kind, nullable=True))
    indexes = {i["name"] for i in inspect.get_indexes("attempts")}
    for name, column in (("ix_attempts_admitted_at", "admitted_at"), ("ix_attempts_ended_at", "ended_at")):
        if name not in indexes:
            op.create_index(name, "attempts", [column])


def downgrade() -> None:
    op.drop_index("ix_attempts_ended_at", table_name="attempts")
    op.drop_index("ix_attempts_admitted_at", table_name="attempts")
    with op.batch_alter_table("attempts") as batch:
        for column in ("last_step_at", "last_step", "first_step_at", "first_step"):
            batch.drop_column(column)
