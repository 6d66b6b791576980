"""GPUs say where their utilisation came from.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-16

`gpus.util_source` names the metric or reader a card's utilisation was taken from:
`DCGM_FI_DEV_GPU_UTIL`, `DCGM_FI_PROF_GR_ENGINE_ACTIVE` x 100 (dcgm-exporter exports only
that for a MIG instance), `nvml` or `nvidia-smi`. Existing GPUs get NULL (not said): the
next import of a card fills it in.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gpus") as batch:
        batch.add_column(sa.Column("util_source", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpus") as batch:
        batch.drop_column("util_source")
