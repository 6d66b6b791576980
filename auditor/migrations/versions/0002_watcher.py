"""The pod watcher: nodes, watch cursors, and pods whose deletion time is an estimate.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02

`pods.deleted_estimated` is true where a relist found a pod gone without seeing its
deletion, so its `deleted_ms` is the relist time. Existing rows get false (a server
default), which batch mode on SQLite copies over.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("gpu_model", sa.String(length=128), nullable=True),
        sa.Column("gpu_capacity", sa.Integer(), nullable=False),
        sa.Column("gpu_allocatable", sa.Integer(), nullable=False),
        sa.Column("unschedulable", sa.Boolean(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("resource_version", sa.String(length=64), nullable=True),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nodes")),
    )
    op.create_table(
        "watch_cursors",
        sa.Column("scope", sa.String(length=600), nullable=False),
        sa.Column("resource_version", sa.String(length=64), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("scope", name=op.f("pk_watch_cursors")),
    )
    with op.batch_alter_table("pods") as batch:
        batch.add_column(
            sa.Column("deleted_estimated", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("pods") as batch:
        batch.drop_column("deleted_estimated")
    op.drop_table("watch_cursors")
    op.drop_table("nodes")
