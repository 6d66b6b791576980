"""Retention: 1-minute rollups of old raw samples, and runs that say they used them.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-09

`gpu_samples_1m` holds raw samples older than the retention age rolled up per GPU and UTC
minute (`auditor rollup`). `audit_runs.rolled_up_seconds` is the GPU-seconds of a run's
window that were audited from those rollups; existing runs get 0 (a server default, which
batch mode on SQLite copies over). Downgrading drops the rollups: the raw samples they
replaced are gone already.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_samples_1m",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("minute_ms", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("covered_ms", sa.BigInteger(), nullable=False),
        sa.Column("readable_ms", sa.BigInteger(), nullable=False),
        sa.Column("util_min", sa.Float(), nullable=True),
        sa.Column("util_mean", sa.Float(), nullable=True),
        sa.Column("util_max", sa.Float(), nullable=True),
        sa.Column("covered_from_ms", sa.BigInteger(), nullable=False),
        sa.Column("covered_to_ms", sa.BigInteger(), nullable=False),
        sa.Column("memory_used_max_mib", sa.Float(), nullable=True),
        sa.Column("power_mean_w", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name=op.f("fk_gpu_samples_1m_gpu_id_gpus"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("gpu_id", "minute_ms", name=op.f("pk_gpu_samples_1m")),
    )
    with op.batch_alter_table("audit_runs") as batch:
        batch.add_column(
            sa.Column("rolled_up_seconds", sa.Float(), nullable=False, server_default=sa.text("0"))
        )


def downgrade() -> None:
    # in place on SQLite (3.35+): a batch copy of audit_runs would drop the old table, and
    # with foreign keys on that cascades to every stored result
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE audit_runs DROP COLUMN rolled_up_seconds")
    else:
        op.drop_column("audit_runs", "rolled_up_seconds")
    op.drop_table("gpu_samples_1m")
