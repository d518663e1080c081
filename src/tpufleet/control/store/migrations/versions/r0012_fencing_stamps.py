"""The fencing token on the loop's writes (issue 34): ``events.term`` and ``events.fenced_at`` (the
term whose fenced transaction wrote the event, and the DATABASE's clock when that transaction passed
the fence), ``attempts.launch_term`` and ``attempts.end_term`` (the terms that launched and ended the
attempt). All nullable: written before this revision, by the API, or by a single replica on SQLite
(no lease), they stay NULL. ``tpufleet chaos --replicas`` reads them back (``chaos/fencing.py``).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_COLUMNS: dict[str, tuple[tuple[str, sa.types.TypeEngine[Any]], ...]] = {
    "events": (("term", sa.BigInteger()), ("fenced_at", sa.Double())),
    "attempts": (("launch_term", sa.BigInteger()), ("end_term", sa.BigInteger())),
}


def upgrade() -> None:
    inspect = sa.inspect(op.get_bind())
    for table, columns in _COLUMNS.items():
        have = {c["name"] for c in inspect.get_columns(table)}
        for name, kind in columns:
            if name not in have:
                op.add_column(table, sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    for table, columns in _COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            for name, _kind in reversed(columns):
                batch.drop_column(name)
