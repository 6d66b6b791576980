"""Shared and partitioned GPUs (SPEC §7): shares per pod, MIG profiles, per-tenant activity.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

Pods say how they ask for a share of a card (`share_kind`, `gpu_share`, `gpu_mem_mib`,
`gpu_mem_share`); GPUs name their MIG profile; an exact assignment may carry the
time-slicing replicas and the exact share a source gave; `gpu_tenant_util` holds each
pod's own utilisation of a card; audit results mark time whose per-tenant activity was
estimated by share. Every new column is NULL (or false) for existing rows: what was
stored before is read as whole cards, as it was.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pods") as batch:
        batch.add_column(sa.Column("share_kind", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("gpu_share", sa.Float(), nullable=True))
        batch.add_column(sa.Column("gpu_mem_mib", sa.Float(), nullable=True))
        batch.add_column(sa.Column("gpu_mem_share", sa.Float(), nullable=True))
    with op.batch_alter_table("gpus") as batch:
        batch.add_column(sa.Column("mig_profile", sa.String(length=32), nullable=True))
    with op.batch_alter_table("gpu_assignments") as batch:
        batch.add_column(sa.Column("replicas", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("share", sa.Float(), nullable=True))
    with op.batch_alter_table("audit_results") as batch:
        batch.add_column(
            sa.Column("estimated", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("share", sa.Float(), nullable=True))
    op.create_table(
        "gpu_tenant_util",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("pod_uid", sa.String(length=64), nullable=False),
        sa.Column("ts_ms", sa.BigInteger(), nullable=False),
        sa.Column("util", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("gpu_id", "pod_uid", "ts_ms", name=op.f("pk_gpu_tenant_util")),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("gpu_tenant_util")
    with op.batch_alter_table("audit_results") as batch:
        batch.drop_column("share")
        batch.drop_column("estimated")
    with op.batch_alter_table("gpu_assignments") as batch:
        batch.drop_column("share")
        batch.drop_column("replicas")
    with op.batch_alter_table("gpus") as batch:
        batch.drop_column("mig_profile")
    with op.batch_alter_table("pods") as batch:
        batch.drop_column("gpu_mem_share")
        batch.drop_column("gpu_mem_mib")
        batch.drop_column("gpu_share")
        batch.drop_column("share_kind")
