"""The free time a shard keeps where pods waited (SPEC §10 `blocked`), split with every
other shard's once a window's set of shards is complete.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04

`audit_free_shares` holds, per sharded audit run, the free shares of its cards in the
(card, hour)s that a wait overlaps. Runs stored before this revision keep none: their
`blocked` seconds stay as their shard split them. Downgrading drops the table; the causes
already stored are kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_free_shares",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("hour_ms", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=128), nullable=False),
        sa.Column("start_ms", sa.BigInteger(), nullable=False),
        sa.Column("end_ms", sa.BigInteger(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("gone", sa.Float(), nullable=False),
        sa.Column("avail_w", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["audit_runs.id"],
            name=op.f("fk_audit_free_shares_run_id_audit_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["gpu_id"],
            ["gpus.id"],
            name=op.f("fk_audit_free_shares_gpu_id_gpus"),
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_audit_free_shares_run", "audit_free_shares", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_audit_free_shares_run", table_name="audit_free_shares")
    op.drop_table("audit_free_shares")
