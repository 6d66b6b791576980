"""Outputs, latency histograms and SM activity per audit (SPEC §8).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03

`outputs` holds useful output per pod and interval (counter increases from Prometheus, rows
of an outputs CSV) with an optional quality figure; `latency_buckets` the increases of a
latency histogram's cumulative buckets per pod and interval; `audit_sm` each audit run's SM
activity per card and pod. Downgrading drops the three tables and what they hold.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_sm",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("pod_uid", sa.String(length=64), nullable=True),
        sa.Column("sm_active_seconds", sa.Float(), nullable=False),
        sa.Column("sm_busy_seconds", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["audit_runs.id"],
            name=op.f("fk_audit_sm_run_id_audit_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name=op.f("fk_audit_sm_gpu_id_gpus"), ondelete="CASCADE"
        ),
    )
    op.create_index("ix_audit_sm_run", "audit_sm", ["run_id"])
    op.create_table(
        "outputs",
        sa.Column("pod_uid", sa.String(length=64), nullable=False),
        sa.Column("metric", sa.String(length=200), nullable=False),
        sa.Column("start_ms", sa.BigInteger(), nullable=False),
        sa.Column("end_ms", sa.BigInteger(), nullable=False),
        sa.Column("outputs", sa.Float(), nullable=False),
        sa.Column("unit", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("quality", sa.Float(), nullable=True),
        sa.Column("quality_better", sa.String(length=8), nullable=True),
        sa.PrimaryKeyConstraint("pod_uid", "metric", "start_ms", name=op.f("pk_outputs")),
    )
    op.create_index("ix_outputs_start", "outputs", ["start_ms"])
    op.create_table(
        "latency_buckets",
        sa.Column("pod_uid", sa.String(length=64), nullable=False),
        sa.Column("metric", sa.String(length=200), nullable=False),
        sa.Column("start_ms", sa.BigInteger(), nullable=False),
        sa.Column("le", sa.Float(), nullable=False),
        sa.Column("end_ms", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint(
            "pod_uid", "metric", "start_ms", "le", name=op.f("pk_latency_buckets")
        ),
    )


def downgrade() -> None:
    op.drop_table("latency_buckets")
    op.drop_index("ix_outputs_start", table_name="outputs")
    op.drop_table("outputs")
    op.drop_index("ix_audit_sm_run", table_name="audit_sm")
    op.drop_table("audit_sm")
