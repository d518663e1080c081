"""Ray's job API on the control plane (issue 33): ``ray_submissions`` (a Ray submission id, per
tenant, and the tpufleet job it is) and ``ray_packages`` (a package URI Ray's client uploaded, per
tenant, and the tenant's package it is). Both start empty.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    tables = sa.inspect(op.get_bind()).get_table_names()
    if "ray_submissions" not in tables:
        op.create_table(
            "ray_submissions",
            sa.Column("tenant", sa.String(length=63), nullable=False),
            sa.Column("submission_id", sa.String(length=128), nullable=False),
            sa.Column("job_id", sa.String(length=16), nullable=False),
            sa.Column("entrypoint", sa.Text(), nullable=False),
            sa.Column("meta", sa.JSON(), nullable=False),
            sa.Column("runtime_env", sa.JSON(), nullable=False),
            sa.Column("created_at", sa.Double(), nullable=False),
            sa.ForeignKeyConstraint(["tenant"], ["tenants.name"]),
            sa.PrimaryKeyConstraint("tenant", "submission_id"),
            sa.UniqueConstraint("job_id"),
        )
    if "ray_packages" not in tables:
        op.create_table(
            "ray_packages",
            sa.Column("tenant", sa.String(length=63), nullable=False),
            sa.Column("uri", sa.String(length=160), nullable=False),
            sa.Column("sha256", sa.String(length=64), nullable=False),
            sa.Column("created_at", sa.Double(), nullable=False),
            sa.ForeignKeyConstraint(["tenant"], ["tenants.name"]),
            sa.PrimaryKeyConstraint("tenant", "uri"),
        )


def downgrade() -> None:
    op.drop_table("ray_packages")
    op.drop_table("ray_submissions")
