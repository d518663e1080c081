"""Operating tenants (issue 14): a tenant's ``preemption`` setting and soft delete, token ids,
scopes and use times, and the audit columns of events (``tenant``, ``actor``).

Existing rows: tenants get ``preemption = 'lower_priority'`` (the default, also the column's
server default) and stay live; a token gets the first 12 hex digits of its hash as its id (the hash
of a random secret: reveals nothing), scope ``admin`` without a tenant and ``jobs`` with one.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # tenants keeps its server default: SQLite would have to rebuild the table to drop it, and
    # other tables' foreign keys point at it (a rebuild inside the upgrade's transaction breaks them).
    # Columns already there are skipped: a pre-migration database stamped as the baseline may have
    # been made by a create_all that knew them.
    _add(
        "tenants",
        sa.Column("preemption", sa.String(length=16), nullable=False, server_default="lower_priority"),
    )
    _add("tenants", sa.Column("deleted_at", sa.Double(), nullable=True))

    fresh = _add("tokens", sa.Column("id", sa.String(length=16), nullable=True))
    _add("tokens", sa.Column("scope", sa.String(length=16), nullable=True))
    _add("tokens", sa.Column("last_used_at", sa.Double(), nullable=True))
    _add("tokens", sa.Column("revoked_at", sa.Double(), nullable=True))
    if fresh:
        op.execute(
            "UPDATE tokens SET id = substr(token_hash, 1, 12), "
            "scope = CASE WHEN tenant IS NULL THEN 'admin' ELSE 'jobs' END"
        )
        with op.batch_alter_table("tokens") as batch:  # nothing refers to tokens: a rebuild is safe
            batch.alter_column("id", existing_type=sa.String(length=16), nullable=False)
            batch.alter_column("scope", existing_type=sa.String(length=16), nullable=False)
            batch.create_unique_constraint("tokens_id_key", ["id"])

    _add("events", sa.Column("tenant", sa.String(length=63), nullable=True))
    _add("events", sa.Column("actor", sa.String(length=80), nullable=True))
    if "ix_events_tenant_id" not in {i["name"] for i in sa.inspect(op.get_bind()).get_indexes("events")}:
        op.create_index("ix_events_tenant_id", "events", ["tenant", "id"], unique=False)


def _add(table: str, column: sa.Column[object]) -> bool:
    """Add ``column`` unless the table has it; whether it was added."""
    if column.name in {c["name"] for c in sa.inspect(op.get_bind()).get_columns(table)}:
        return False
    op.add_column(table, column)
    return True


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35+) for tenants and events: rebuilding tenants would break the
    # foreign keys that point at it. tokens is rebuilt (its id has a unique constraint); nothing
    # refers to tokens.
    op.drop_index("ix_events_tenant_id", table_name="events")
    op.drop_column("events", "actor")
    op.drop_column("events", "tenant")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_constraint("tokens_id_key", type_="unique")
        batch.drop_column("revoked_at")
        batch.drop_column("last_used_at")
        batch.drop_column("scope")
        batch.drop_column("id")
    op.drop_column("tenants", "deleted_at")
    op.drop_column("tenants", "preemption")
